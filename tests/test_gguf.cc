// GGUF (formats/gguf.h) against files ggml itself wrote (tests/golden/gguf, make_gguf_golden.sh):
// every supported type dequantized to the bits of ggml's own to_float, shapes in row-major order
// with ComfyUI-GGUF's orig_shape record, metadata of every kind; and bad files refused with the byte
// offset, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "formats/gguf.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

using test_util::TempDir;

const std::string kGolden = std::string(VORTEX_SOURCE_DIR) + "/tests/golden/gguf/";

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<float> as_f32(const Tensor& t) {
  const Tensor f = t.dtype() == DType::kF32 ? t.contiguous() : (*t.to(DType::kF32)).contiguous();
  return {f.data_as<float>(), f.data_as<float>() + f.numel()};
}

TEST(Gguf, EveryTypeDequantizesToTheBitsOfGgmlsOwnToFloat) {
  auto quants = GgufFile::open(kGolden + "quants.gguf");
  auto expected = GgufFile::open(kGolden + "expected.gguf");
  ASSERT_TRUE(quants.ok()) << quants.status().message();
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  EXPECT_EQ(quants->version(), 3u);
  const std::vector<std::string> types = {"f32",  "f16",  "bf16", "q4_0", "q4_1", "q5_0", "q5_1",
                                          "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"};
  ASSERT_EQ(expected->tensors().size(), types.size());
  for (const std::string& type : types) {
    SCOPED_TRACE(type);
    const std::string name = "t." + type;
    auto info = quants->info(name);
    ASSERT_TRUE(info.ok()) << info.status().message();
    EXPECT_EQ(info->shape, type == "f16" ? Shape({3, 2, 256}) : Shape({3, 512}));  // f16: its orig_shape record
    auto want = expected->get(name, DType::kF32);
    ASSERT_TRUE(want.ok()) << want.status().message();
    EXPECT_EQ(want->shape(), Shape({3, 512}));
    const std::vector<float> ref = as_f32(*want);
    auto f32 = quants->get(name, DType::kF32);
    ASSERT_TRUE(f32.ok()) << f32.status().message();
    const std::vector<float> got = as_f32(*f32);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
    int64_t nonzero = 0;
    for (float v : ref) nonzero += v != 0.0f;
    EXPECT_GT(nonzero, 1000) << "a golden of zeros checks nothing";
    // Into bf16: the same values, rounded once.
    auto bf16 = quants->get(name, DType::kBF16);
    ASSERT_TRUE(bf16.ok());
    if (bf16->dtype() == DType::kBF16) {
      const Tensor b = bf16->contiguous();
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_EQ(b.data_as<uint16_t>()[i], f32_to_bf16_bits(ref[i])) << i;
      }
    }
  }
  // F32 / F16 / BF16 stay as stored (views of the mapping).
  EXPECT_EQ(quants->get("t.f16", DType::kBF16)->dtype(), DType::kF16);
  EXPECT_EQ(quants->get("t.bf16", DType::kF32)->dtype(), DType::kBF16);
}

TEST(Gguf, ShapesAreRowMajorAndMetadataOfEveryKindIsRead) {
  auto file = GgufFile::open(kGolden + "quants.gguf");
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto bias = file->get("v.bias", DType::kBF16);
  ASSERT_TRUE(bias.ok());
  EXPECT_EQ(bias->shape(), Shape({5}));
  EXPECT_EQ(as_f32(*bias), (std::vector<float>{-2, -1, 0, 1, 2}));
  auto cube = file->get("v.cube", DType::kBF16);  // ggml's (4, 3, 2): the fastest dimension last here
  ASSERT_TRUE(cube.ok());
  EXPECT_EQ(cube->shape(), Shape({2, 3, 4}));
  const std::vector<float> values = as_f32(*cube);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(values[i], static_cast<float>(i));

  const auto& m = file->metadata();
  const auto text = [&](const std::string& key) {
    const auto it = m.find(key);
    return it == m.end() ? std::string("missing") : it->second.to_string();
  };
  EXPECT_EQ(text("general.architecture"), "'h3'");
  EXPECT_EQ(text("test.u8"), "200");
  EXPECT_EQ(text("test.i8"), "-7");
  EXPECT_EQ(text("test.u16"), "65000");
  EXPECT_EQ(text("test.i16"), "-300");
  EXPECT_EQ(text("test.i32"), "-123456");
  EXPECT_EQ(text("test.f32"), "0.25");
  EXPECT_EQ(text("test.u64"), "1099511627776");
  EXPECT_EQ(text("test.i64"), "-1099511627776");
  EXPECT_EQ(text("test.f64"), "-2.5");
  EXPECT_EQ(text("test.bool"), "true");
  EXPECT_EQ(text("test.strings"), "['one', 'two words', '']");
  EXPECT_EQ(text("comfy.gguf.orig_shape.t.f16"), "[3, 2, 256]");
  EXPECT_FALSE(file->info("t.nothing").ok());
  EXPECT_EQ(ggml_type_name(12), "Q4_K");
  EXPECT_EQ(ggml_type_name(16), "IQ2_XXS");
  EXPECT_EQ(ggml_type_name(999), "type 999");
  EXPECT_TRUE(is_gguf_file(kGolden + "quants.gguf"));
  EXPECT_FALSE(is_gguf_file(kGolden + "make_gguf_golden.c"));
}

// The byte offset of the field `skip` bytes after tensor `name`'s name in its info.
size_t after_name(const std::vector<uint8_t>& bytes, const std::string& name, size_t skip) {
  for (size_t i = 8; i + name.size() <= bytes.size(); ++i) {
    uint64_t length;
    std::memcpy(&length, bytes.data() + i - 8, 8);
    if (length == name.size() && std::memcmp(bytes.data() + i, name.data(), name.size()) == 0) {
      return i + name.size() + skip;
    }
  }
  ADD_FAILURE() << "no tensor info for " << name;
  return 0;
}

TEST(Gguf, BadFilesAreRefusedWithTheByteOffset) {
  TempDir tmp;
  const std::vector<uint8_t> good = file_bytes(kGolden + "quants.gguf");
  ASSERT_GT(good.size(), 1000u);
  const auto refused = [&](std::vector<uint8_t> bytes, const std::string& needle) {
    write_bytes(tmp.file("bad.gguf"), bytes);
    const auto file = GgufFile::open(tmp.file("bad.gguf"));
    EXPECT_FALSE(file.ok()) << needle;
    if (!file.ok()) {
      EXPECT_NE(file.status().message().find(needle), std::string::npos) << file.status().message();
      EXPECT_EQ(file.status().message().find('\n'), std::string::npos);
    }
  };
  std::vector<uint8_t> b = good;
  b[0] = 'X';
  refused(b, "not a GGUF file");
  b = good;
  b[4] = 1;
  refused(b, "GGUF version 1; versions 2 and 3 are read (file byte 8)");
  b = good;
  b[4] = 0;
  b[7] = 3;
  refused(b, "a big-endian GGUF file");
  // The type of t.q8_0 (rank, two dims, then the type) made IQ2_XXS, then a type ggml never had.
  const size_t type_at = after_name(good, "t.q8_0", 4 + 16);
  b = good;
  b[type_at] = 16;
  refused(b, "tensor 't.q8_0' is stored IQ2_XXS, which is not read here");
  b[type_at] = 200;
  refused(b, "is stored type 200");
  b = good;
  b[type_at + 4] += 1;  // the offset, one byte off the alignment
  refused(b, "is not a multiple of the alignment 32");
  b = good;
  b[type_at + 4 + 5] = 0x10;  // the offset, far past the end
  refused(b, "run past the end of the");
  b = good;
  for (size_t k = 0; k < 8; ++k) b[after_name(good, "t.q8_0", 4) + 8 + k] = 0x7F;  // the second dim, ~2^63
  refused(b, "has a dimension of 9187201950435737471, more elements than the file can hold");
  b = good;
  b[after_name(good, "t.q8_0", 0)] = 9;  // rank 9
  refused(b, "tensor 't.q8_0' has 9 dimensions (1 to 4)");
  // Every truncation inside the header and the tensor infos fails cleanly, naming where.
  const size_t header_end = after_name(good, "v.cube", 4 + 24 + 4 + 8);
  for (size_t cut = 0; cut < header_end; cut += (cut < 64 ? 1 : 7)) {
    write_bytes(tmp.file("cut.gguf"), std::vector<uint8_t>(good.begin(), good.begin() + cut));
    EXPECT_FALSE(GgufFile::open(tmp.file("cut.gguf")).ok()) << cut;
  }
  // The data section cut short: the last tensor's bytes run past the end.
  write_bytes(tmp.file("cut.gguf"), std::vector<uint8_t>(good.begin(), good.end() - 1));
  const auto short_data = GgufFile::open(tmp.file("cut.gguf"));
  ASSERT_FALSE(short_data.ok());
  EXPECT_NE(short_data.status().message().find("'v.cube' (info at file byte "), std::string::npos)
      << short_data.status().message();
  // Random bytes over the header: opening never crashes, and what opens reads.
  for (uint64_t trial = 0; trial < 300; ++trial) {
    b = good;
    for (int k = 0; k < 4; ++k) {
      const uint32_t r = philox_block(77, trial, static_cast<uint64_t>(k)).v[0];
      b[r % header_end] = static_cast<uint8_t>(r >> 24);
    }
    write_bytes(tmp.file("fuzz.gguf"), b);
    const auto file = GgufFile::open(tmp.file("fuzz.gguf"));
    if (!file.ok()) continue;
    for (const GgufTensorInfo& info : file->tensors()) (void)file->get(info.name, DType::kBF16);
  }
}

}  // namespace
}  // namespace vortex
