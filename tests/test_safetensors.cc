#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/safetensors.h"
#include "fuzz_test_util.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;
using test_util::read_bytes;
using test_util::safetensors_image;
using test_util::TempDir;
using test_util::write_bytes;
using TensorList = std::vector<std::pair<std::string, Tensor>>;

constexpr DType kAllDTypes[] = {DType::kF32,    DType::kBF16,   DType::kF16, DType::kF8E4M3,
                                DType::kF8E5M2, DType::kE2M1x2, DType::kI8,  DType::kU8,
                                DType::kI32,    DType::kI64,    DType::kBool, DType::kF64};

// Random bytes, not random values: the round trip must preserve every bit pattern (NaNs too).
Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng());
  return t;
}

std::string bytes_of(const Tensor& t) {
  const Tensor dense = t.contiguous();
  return std::string(static_cast<const char*>(dense.data()), dense.nbytes());
}

// A failed status of the given code whose one-line message contains every needle.
void expect_error(const Status& status, StatusCode code, const std::vector<std::string>& needles) {
  ASSERT_FALSE(status.ok()) << "expected an error containing '" << needles.front() << "'";
  EXPECT_EQ(status.code(), code) << status.to_string();
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << status.to_string();
  for (const std::string& needle : needles) {
    EXPECT_NE(status.message().find(needle), std::string::npos) << "missing '" << needle << "' in: " << status.message();
  }
}

// ---- round trips ---------------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDtypeBitExactIncludingStridedViews) {
  TempDir dir;
  std::mt19937 rng(1);
  TensorList tensors;
  for (DType dtype : kAllDTypes) {
    const std::string name = dtype_name(dtype);
    tensors.emplace_back(name + ".dense", random_tensor({3, 5}, dtype, rng));
    const Tensor base = random_tensor({4, 6}, dtype, rng);
    tensors.emplace_back(name + ".transposed", *base.transpose(0, 1));
    tensors.emplace_back(name + ".sliced", *base.slice(1, 1, 4));
  }
  tensors.emplace_back("scalar", random_tensor(Shape(), DType::kF32, rng));
  tensors.emplace_back("empty", Tensor::zeros({0, 4}, DType::kBF16));
  ASSERT_FALSE(tensors[1].second.is_contiguous());
  const std::string path = dir.file("all.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors).ok());

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  ASSERT_EQ(file->names().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, original] = tensors[i];
    EXPECT_EQ(file->names()[i], name);
    auto info = file->info(name);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->dtype, original.dtype()) << name;
    EXPECT_EQ(info->shape, original.shape()) << name;
    EXPECT_EQ(info->nbytes(), original.nbytes()) << name;
    auto loaded = file->get(name);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    EXPECT_TRUE(loaded->is_contiguous());
    EXPECT_EQ(bytes_of(*loaded), bytes_of(original)) << name;
  }

  // The header is padded with spaces so that the data section starts 8-byte aligned.
  const std::string raw = read_bytes(path);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, raw.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  EXPECT_TRUE(raw[8 + header_bytes - 1] == ' ' || raw[8 + header_bytes - 1] == '}');
}

TEST(Safetensors, MetadataRoundTrip) {
  TempDir dir;
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"empty", ""}, {"note", "line one\nline \"two\" \xC3\xBC\xE2\x82\xAC"}};
  const std::string path = dir.file("meta.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"w", Tensor::zeros({2}, DType::kF32)}}, metadata).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->metadata(), metadata);
  EXPECT_EQ(file->names(), std::vector<std::string>{"w"});

  // No metadata written means no __metadata__ entry and an empty map back.
  ASSERT_TRUE(write_safetensors(path, {{"w", Tensor::zeros({2}, DType::kF32)}}).ok());
  EXPECT_EQ(read_bytes(path).find("__metadata__"), std::string::npos);
  EXPECT_TRUE(SafetensorsFile::open(path)->metadata().empty());
}

TEST(Safetensors, GetIsZeroCopyAndOutlivesTheFileObject) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"a", Tensor::from_f32({1, 2, 3}, {3})},
                                       {"b", Tensor::from_f32({4, 5, 6, 7}, {2, 2})}}).ok());
  Tensor b;
  {
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok());
    b = *file->get("b");
    const auto span = file->bytes();
    const auto* p = static_cast<const std::byte*>(b.data());
    EXPECT_GE(p, span.data());
    EXPECT_LE(p + b.nbytes(), span.data() + span.size());
    EXPECT_EQ(p, span.data() + file->info("b")->file_offset);
    EXPECT_EQ(b.storage()->keeper.get(), span.data());
  }
  // The file object is gone; the tensor's storage still holds the mapping.
  EXPECT_EQ(b.data_as<float>()[3], 7.0f);
  // Writes land in this process's copy-on-write pages, never in the file.
  b.data_as<float>()[0] = -1.0f;
  EXPECT_EQ(SafetensorsFile::open(path)->get("b")->data_as<float>()[0], 4.0f);
}

TEST(Safetensors, MissingNameIsNotFound) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"a", Tensor::from_f32({1}, {1})}}).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(file->has("a"));
  EXPECT_FALSE(file->has("nope"));
  expect_error(file->get("nope").status(), StatusCode::kNotFound, {path, "'nope'"});
  expect_error(file->info("nope").status(), StatusCode::kNotFound, {"'nope'"});
}

// Other writers do not align offsets and may leave gaps; both are legal and read as written.
TEST(Safetensors, ReadsUnalignedOffsetsAndGaps) {
  TempDir dir;
  const std::string header =
      R"({"b":{"shape":[2],"data_offsets":[3,11],"dtype":"F32"},)"
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"z":{"dtype":"I64","shape":[0],"data_offsets":[11,11]}})";
  std::string image = safetensors_image(header, 16);
  const float values[2] = {1.5f, -2.0f};
  std::memcpy(&image[8 + header.size() + 3], values, 8);
  const std::string path = dir.file("other.safetensors");
  write_bytes(path, image);
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->names(), (std::vector<std::string>{"b", "a", "z"}));
  Tensor b = *file->get("b");
  float loaded[2];
  std::memcpy(loaded, b.data(), 8);  // the data may be unaligned: memcpy, not a float load
  EXPECT_EQ(loaded[0], 1.5f);
  EXPECT_EQ(loaded[1], -2.0f);
  EXPECT_EQ(file->get("z")->numel(), 0);

  write_bytes(path, safetensors_image("{}   ", 0));
  auto empty = SafetensorsFile::open(path);
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_TRUE(empty->names().empty());
}

TEST(Safetensors, WriteIsAtomicAndLeavesNoTempFile) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"a", Tensor::from_f32({1}, {1})}}).ok());
  ASSERT_TRUE(write_safetensors(path, {{"b", Tensor::from_f32({2, 3}, {2})}}).ok());
  EXPECT_EQ(SafetensorsFile::open(path)->names(), std::vector<std::string>{"b"});

  // Rejected input: nothing is created and the previous file is untouched.
  const Tensor t = Tensor::from_f32({1}, {1});
  expect_error(write_safetensors(path, {{"x", t}, {"x", t}}), StatusCode::kInvalidArgument, {"'x'", "more than once"});
  expect_error(write_safetensors(path, {{"__metadata__", t}}), StatusCode::kInvalidArgument, {"reserved"});
  expect_error(write_safetensors(path, {{"u", Tensor()}}), StatusCode::kInvalidArgument, {"'u'", "undefined"});
  expect_error(write_safetensors(path, {{"bad\xFF", t}}), StatusCode::kInvalidArgument, {"UTF-8"});
  EXPECT_EQ(SafetensorsFile::open(path)->names(), std::vector<std::string>{"b"});

  expect_error(write_safetensors(dir.file("no/such/dir/w.safetensors"), {{"a", t}}), StatusCode::kIoError,
               {"no/such/dir/w.safetensors"});
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "w.safetensors");
  }
  EXPECT_EQ(files, 1u);
}

// ---- bad input: every error is one line naming the file, the tensor and the byte offset ----------

class SafetensorsBadInput : public ::testing::Test {
 protected:
  // Writes `image` and returns the status of opening it.
  Status open_image(const std::string& image) {
    write_bytes(path_, image);
    return SafetensorsFile::open(path_).status();
  }
  // Opens a file whose header is `header` followed by `data_bytes` bytes of data.
  Status open_header(const std::string& header, size_t data_bytes) {
    return open_image(safetensors_image(header, data_bytes));
  }
  // The file byte at which the data section of `header` starts.
  static std::string data_byte(const std::string& header, uint64_t offset) {
    return std::to_string(8 + header.size() + offset);
  }

  TempDir dir_;
  std::string path_ = dir_.file("bad.safetensors");
};

TEST_F(SafetensorsBadInput, MissingFile) {
  expect_error(SafetensorsFile::open(dir_.file("absent.safetensors")).status(), StatusCode::kNotFound,
               {"absent.safetensors"});
}

TEST_F(SafetensorsBadInput, NotARegularFile) {
  expect_error(SafetensorsFile::open(dir_.path().string()).status(), StatusCode::kInvalidArgument,
               {dir_.path().string(), "not a regular file"});
}

TEST_F(SafetensorsBadInput, EmptyFile) {
  expect_error(open_image(""), StatusCode::kCorruptData, {path_, "0 bytes"});
  expect_error(open_image(std::string("\x05\0\0", 3)), StatusCode::kCorruptData, {"3 bytes"});
}

TEST_F(SafetensorsBadInput, TruncatedInTheDataSection) {
  ASSERT_TRUE(write_safetensors(path_, {{"first", Tensor::zeros({4}, DType::kF32)},
                                        {"second", Tensor::zeros({4}, DType::kF32)}}).ok());
  std::string image = read_bytes(path_);
  image.resize(image.size() - 5);
  expect_error(open_image(image), StatusCode::kCorruptData,
               {path_, "'second'", "data_offsets [16, 32)", "end past the data section (27 bytes"});
}

TEST_F(SafetensorsBadInput, HeaderLengthPastEndOfFile) {
  std::string image = safetensors_image("{}", 0);
  image[0] = 100;
  expect_error(open_image(image), StatusCode::kCorruptData, {path_, "header length 100", "10-byte file", "file byte 108"});
  image[5] = 1;  // 2^40 + 100: absurd, rejected before anything is read
  expect_error(open_image(image), StatusCode::kCorruptData, {"header length 1099511627876", "limit"});
}

TEST_F(SafetensorsBadInput, InvalidJson) {
  // The stray 'x' is header byte 5, file byte 13.
  expect_error(open_header(R"({"w":x})", 0), StatusCode::kCorruptData, {path_, "not valid JSON", "file byte 13"});
  expect_error(open_header(R"({"w":{"dtype":"F32")", 0), StatusCode::kCorruptData, {"not valid JSON"});
  expect_error(open_header("{\"\xFF\":1}", 0), StatusCode::kCorruptData, {"not valid JSON"});
}

TEST_F(SafetensorsBadInput, HeaderNotAnObject) {
  expect_error(open_header("[1, 2]", 0), StatusCode::kCorruptData, {path_, "header is a JSON array, not an object"});
  expect_error(open_header(R"({"w": 3})", 0), StatusCode::kCorruptData, {"'w'", "entry is 3, not an object"});
}

TEST_F(SafetensorsBadInput, MissingFields) {
  expect_error(open_header(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), StatusCode::kCorruptData,
               {"'w'", "missing \"dtype\""});
  expect_error(open_header(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4), StatusCode::kCorruptData,
               {"'w'", "missing \"shape\""});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1]}})", 4), StatusCode::kCorruptData,
               {"'w'", "missing \"data_offsets\""});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), StatusCode::kCorruptData,
               {"'w'", "[begin, end]"});
}

TEST_F(SafetensorsBadInput, UnknownDtype) {
  expect_error(open_header(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1), StatusCode::kCorruptData,
               {path_, "'w'", "unknown dtype 'Q7'"});
  expect_error(open_header(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1), StatusCode::kCorruptData,
               {"'w'", "\"dtype\" is 7"});
}

TEST_F(SafetensorsBadInput, NegativeOrNonIntegerShape) {
  expect_error(open_header(R"({"w":{"dtype":"U8","shape":[-1,2],"data_offsets":[0,2]}})", 2), StatusCode::kCorruptData,
               {path_, "'w'", "shape[0] is -1"});
  expect_error(open_header(R"({"w":{"dtype":"U8","shape":[2,2.5],"data_offsets":[0,5]}})", 5), StatusCode::kCorruptData,
               {"'w'", "shape[1] is 2.5"});
  expect_error(open_header(R"({"w":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2), StatusCode::kCorruptData,
               {"'w'", "shape[0] is a JSON string"});
  expect_error(open_header(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1),
               StatusCode::kCorruptData, {"'w'", "9 dims"});
  expect_error(open_header(R"({"w":{"dtype":"U8","shape":[[[1]]],"data_offsets":[0,1]}})", 1),
               StatusCode::kCorruptData, {path_, "deeper"});
}

TEST_F(SafetensorsBadInput, OffsetsEndBeforeBegin) {
  const std::string header = R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})";
  expect_error(open_header(header, 16), StatusCode::kCorruptData,
               {path_, "'w'", "data_offsets [8, 4) end before they begin", "file byte " + data_byte(header, 0)});
  expect_error(open_header(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[-8,4]}})", 16), StatusCode::kCorruptData,
               {"'w'", "non-negative"});
}

TEST_F(SafetensorsBadInput, OffsetsPastEndOfFile) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})";
  expect_error(open_header(header, 16), StatusCode::kCorruptData,
               {path_, "'w'", "data_offsets [0, 400) end past the data section (16 bytes",
                "file bytes [" + data_byte(header, 0) + ", " + data_byte(header, 16) + ")"});
  expect_error(open_header(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})", 0),
               StatusCode::kCorruptData, {"'w'", "end past the data section"});
}

TEST_F(SafetensorsBadInput, OverlappingTensors) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"c":{"dtype":"U8","shape":[4],"data_offsets":[24,28]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  expect_error(open_header(header, 32), StatusCode::kCorruptData,
               {path_, "'a' data_offsets [0, 16)", "'b' data_offsets [8, 16)",
                "overlap at file bytes [" + data_byte(header, 8) + ", " + data_byte(header, 16) + ")"});
}

TEST_F(SafetensorsBadInput, ShapeDisagreesWithByteSize) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  expect_error(open_header(header, 8), StatusCode::kCorruptData,
               {path_, "'w'", "shape [3] of F32 needs 12 bytes but data_offsets [0, 8) hold 8",
                "file bytes [" + data_byte(header, 0) + ", " + data_byte(header, 8) + ")"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,8]}})", 8),
               StatusCode::kCorruptData, {"'w'", "more than 2^64"});
}

TEST_F(SafetensorsBadInput, DuplicateNames) {
  expect_error(open_header(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                           R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2),
               StatusCode::kCorruptData, {path_, "'w' more than once"});
}

TEST_F(SafetensorsBadInput, BadMetadata) {
  expect_error(open_header(R"({"__metadata__":{"format":"pt","version":2}})", 0), StatusCode::kCorruptData,
               {path_, "__metadata__ entry 'version' is 2, not a string"});
  expect_error(open_header(R"({"__metadata__":["pt"]})", 0), StatusCode::kCorruptData,
               {"__metadata__ is a JSON array"});
}

TEST_F(SafetensorsBadInput, ControlCharactersInNamesStayOnOneLine) {
  expect_error(open_header(R"({"line\none":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1),
               StatusCode::kCorruptData, {"'line\\x0Aone'"});
}

// ---- sharded checkpoints -------------------------------------------------------------------------

TensorList sharded_fixture(std::mt19937& rng) {
  TensorList tensors;
  for (int i = 0; i < 7; ++i) {
    tensors.emplace_back("blocks." + std::to_string(i) + ".weight", random_tensor({4, 3 + i}, DType::kBF16, rng));
  }
  tensors.emplace_back("head.scale", random_tensor({5}, DType::kF32, rng));
  return tensors;
}

TEST(SafetensorsSharded, WriteShardedRoundTripMakesThreeOrMoreShards) {
  TempDir dir;
  std::mt19937 rng(7);
  const TensorList tensors = sharded_fixture(rng);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  ASSERT_TRUE(write_sharded(dir.path().string(), tensors, metadata, 64, "diffusion_pytorch_model").ok());

  const std::string index_path = dir.file("diffusion_pytorch_model.safetensors.index.json");
  const auto index = nlohmann::json::parse(read_bytes(index_path));
  uint64_t total = 0;
  for (const auto& entry : tensors) total += entry.second.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  // Greedy in order: blocks.0 + blocks.1 (24 + 32 bytes) share a shard, every later tensor would
  // push its predecessor's shard past 64 bytes.
  const std::string first = "diffusion_pytorch_model-00001-of-00007.safetensors";
  EXPECT_EQ(index["weight_map"]["blocks.0.weight"], first);
  EXPECT_EQ(index["weight_map"]["blocks.1.weight"], first);
  EXPECT_EQ(index["weight_map"]["head.scale"], "diffusion_pytorch_model-00007-of-00007.safetensors");

  for (const std::string& path : {dir.path().string(), index_path}) {
    auto ckpt = ShardedCheckpoint::open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    EXPECT_EQ(ckpt->path(), index_path);
    EXPECT_EQ(ckpt->shards().size(), 7u);
    EXPECT_EQ(ckpt->metadata(), metadata);
    ASSERT_EQ(ckpt->names().size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& [name, original] = tensors[i];
      EXPECT_EQ(ckpt->names()[i], name);
      EXPECT_TRUE(ckpt->has(name));
      EXPECT_EQ(bytes_of(*ckpt->get(name)), bytes_of(original)) << name;
      EXPECT_EQ(ckpt->info(name)->shape, original.shape());
      EXPECT_EQ(fs::path(*ckpt->source_of(name)).filename().string(), index["weight_map"][name].get<std::string>());
    }
    expect_error(ckpt->source_of("nope").status(), StatusCode::kNotFound, {"'nope'"});
  }

  // Rewriting with bigger shards replaces the index; the new one names only the new shards.
  ASSERT_TRUE(write_sharded(dir.path().string(), tensors, metadata, 1 << 20, "diffusion_pytorch_model").ok());
  auto rewritten = ShardedCheckpoint::open(dir.path().string());
  ASSERT_TRUE(rewritten.ok()) << rewritten.status().to_string();
  EXPECT_EQ(rewritten->shards().size(), 1u);
  EXPECT_EQ(rewritten->names().size(), tensors.size());

  // Input rejected up front leaves the existing checkpoint alone.
  TensorList twice = {tensors[0], tensors[0]};
  expect_error(write_sharded(dir.path().string(), twice, metadata, 64, "diffusion_pytorch_model"),
               StatusCode::kInvalidArgument, {"'blocks.0.weight'", "more than once"});
  expect_error(write_sharded(dir.path().string(), tensors, {{"k", "\xC3"}}, 64, "diffusion_pytorch_model"),
               StatusCode::kInvalidArgument, {"metadata value", "UTF-8"});
  EXPECT_TRUE(ShardedCheckpoint::open(dir.path().string()).ok());
}

TEST(SafetensorsSharded, SingleFileAndDirectoryResolution) {
  TempDir dir;
  const std::string a = dir.file("a.safetensors");
  ASSERT_TRUE(write_safetensors(a, {{"x", Tensor::from_f32({1}, {1})}}, {{"k", "v"}}).ok());
  for (const std::string& path : {a, dir.path().string()}) {
    auto ckpt = ShardedCheckpoint::open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    EXPECT_EQ(ckpt->names(), std::vector<std::string>{"x"});
    EXPECT_EQ(*ckpt->source_of("x"), a);
    EXPECT_EQ(ckpt->metadata().at("k"), "v");
  }
  ASSERT_TRUE(write_safetensors(dir.file("b.safetensors"), {{"y", Tensor::from_f32({1}, {1})}}).ok());
  expect_error(ShardedCheckpoint::open(dir.path().string()).status(), StatusCode::kInvalidArgument,
               {"'a.safetensors', 'b.safetensors'"});
  TempDir empty;
  expect_error(ShardedCheckpoint::open(empty.path().string()).status(), StatusCode::kNotFound, {empty.path().string()});
  expect_error(ShardedCheckpoint::open(dir.file("none")).status(), StatusCode::kNotFound, {"none"});
}

class SafetensorsShardedBadIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(3);
    ASSERT_TRUE(write_sharded(dir_.path().string(), sharded_fixture(rng), {}, 64).ok());
    index_ = nlohmann::json::parse(read_bytes(index_path_));
  }
  Status open_with(const nlohmann::json& index) {
    write_bytes(index_path_, index.dump());
    return ShardedCheckpoint::open(index_path_).status();
  }

  TempDir dir_;
  std::string index_path_ = dir_.file("model.safetensors.index.json");
  nlohmann::json index_;
};

TEST_F(SafetensorsShardedBadIndex, IndexNamesAMissingShard) {
  fs::remove(dir_.file("model-00002-of-00007.safetensors"));
  expect_error(ShardedCheckpoint::open(index_path_).status(), StatusCode::kNotFound,
               {index_path_, "'model-00002-of-00007.safetensors'", "does not exist"});
}

TEST_F(SafetensorsShardedBadIndex, IndexNamesATensorAbsentFromItsShard) {
  index_["weight_map"]["ghost"] = "model-00001-of-00007.safetensors";
  expect_error(open_with(index_), StatusCode::kCorruptData,
               {index_path_, "'ghost'", "'model-00001-of-00007.safetensors', which does not hold it"});
}

TEST_F(SafetensorsShardedBadIndex, ShardHoldsATensorTheIndexDoesNotList) {
  index_["weight_map"].erase("blocks.1.weight");
  expect_error(open_with(index_), StatusCode::kCorruptData,
               {"model-00001-of-00007.safetensors", "'blocks.1.weight'", "does not list"});
}

TEST_F(SafetensorsShardedBadIndex, TensorInTwoShards) {
  // A second copy of blocks.1 in another shard: the index maps it to shard 1 only.
  const Tensor t = Tensor::zeros({1}, DType::kU8);
  ASSERT_TRUE(write_safetensors(dir_.file("extra.safetensors"), {{"extra", t}, {"blocks.1.weight", t}}).ok());
  index_["weight_map"]["extra"] = "extra.safetensors";
  expect_error(open_with(index_), StatusCode::kCorruptData,
               {"extra.safetensors", "'blocks.1.weight'", "maps to shard 'model-00001-of-00007.safetensors'"});
}

TEST_F(SafetensorsShardedBadIndex, MalformedIndex) {
  index_["weight_map"]["blocks.0.weight"] = "../elsewhere.safetensors";
  expect_error(open_with(index_), StatusCode::kCorruptData, {"'blocks.0.weight'", "inside the index's folder"});
  expect_error(open_with(nlohmann::json::array()), StatusCode::kCorruptData, {"not a JSON object"});
  expect_error(open_with({{"metadata", {}}}), StatusCode::kCorruptData, {"no \"weight_map\""});
  write_bytes(index_path_, "{\"weight_map\": ");
  expect_error(ShardedCheckpoint::open(index_path_).status(), StatusCode::kCorruptData, {index_path_, "not valid JSON"});
}

// ---- fuzz: damaged files return a Status, they never crash ---------------------------------------

TEST(SafetensorsFuzz, RandomFlipsAndTruncationsNeverCrash) {
  TempDir dir;
  std::mt19937 rng(12345);
  TensorList tensors;
  for (int i = 0; i < 6; ++i) {
    tensors.emplace_back("t" + std::to_string(i), random_tensor({2, i + 1}, kAllDTypes[i * 2], rng));
  }
  const std::string good_path = dir.file("good.safetensors");
  ASSERT_TRUE(write_safetensors(good_path, tensors, {{"format", "pt"}}).ok());
  const std::string good = read_bytes(good_path);
  uint64_t header_end = 0;
  std::memcpy(&header_end, good.data(), 8);
  header_end += 8;

  // Mostly inside the header, where the parser and validator live. Whatever opened must be
  // readable in full, inside the mapping.
  test_util::fuzz_reader(good, header_end, 2000, rng, dir.file("fuzz.safetensors"), SafetensorsFile::open,
                         [](const SafetensorsFile& file) {
                           const auto span = file.bytes();
                           for (const std::string& name : file.names()) {
                             auto t = file.get(name);
                             ASSERT_TRUE(t.ok());
                             const auto* p = static_cast<const std::byte*>(t->data());
                             ASSERT_TRUE(p >= span.data() && p + t->nbytes() <= span.data() + span.size()) << name;
                           }
                         });
}

}  // namespace
}  // namespace vortex
