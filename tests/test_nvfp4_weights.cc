// NVFP4 checkpoints (formats/nvfp4.h, models/h3/scaled_weights.h): cuBLAS's tiled block-scale
// layout against its definition as a reshape of the scale matrix, the dequantization rule (codes
// low nibble first, the two scales multiplied first), the block-scale layout chosen from ComfyUI's
// descriptor or the shape, the refusals, and the CLI: generate from an NVFP4 checkpoint gives the
// bits of generate from the same weights dequantized by this test in bf16, and inspect counts them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "nvfp4_test_util.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "formats/nvfp4.h"
#include "formats/safetensors.h"
#include "models/h3/scaled_weights.h"
#include "models/h3/synthetic.h"
#include "models/h3/weights.h"

namespace vortex {
namespace {

using h3::NamedTensors;
using test_util::CliRun;
using test_util::comfy_quant;
using test_util::u8_tensor;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(philox_block(seed, 0, i).v[0]);
  return bytes;
}

// e4m3 codes that are finite, positive scales (no NaN, no sign).
std::vector<uint8_t> random_scale_codes(size_t n, uint64_t seed) {
  std::vector<uint8_t> codes = random_bytes(n, seed);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(c & 0x7F) == 0x7F ? 0x7E : static_cast<uint8_t>(c & 0x7F);
  return codes;
}

// The tiled layout written the way cuBLAS's documentation and the quantizers build it: the padded
// scale matrix viewed as [row tiles, 128, column tiles, 4], tiles brought together, each tile's
// 128 rows split as [4, 32] and the two swapped. Element (r, c) of the result's flat order is
// independent of nvfp4_tiled_scale_index's closed form.
Tensor tile_by_reshapes(const Tensor& row_major_f32, int64_t rows, int64_t block_cols) {
  const Shape padded = nvfp4_tiled_scale_shape(rows, block_cols);
  Tensor m = Tensor::zeros(padded, DType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < block_cols; ++c) {
      m.data_as<float>()[r * padded[1] + c] = row_major_f32.data_as<float>()[r * block_cols + c];
    }
  }
  const int64_t row_tiles = padded[0] / 128, col_tiles = padded[1] / 4;
  Tensor tiles = (*(*m.reshape({row_tiles, 128, col_tiles, 4})).permute({0, 2, 1, 3})).contiguous();
  Tensor split = *tiles.reshape({row_tiles * col_tiles, 4, 32, 4});
  return (*split.transpose(1, 2)).contiguous();
}

TEST(Nvfp4, TheTiledIndexIsCublasLayout) {
  for (auto [rows, block_cols] : {std::pair<int64_t, int64_t>{300, 10}, {128, 4}, {5, 2}, {257, 33}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(block_cols));
    std::vector<float> ids(rows * block_cols);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>(i + 1);
    const Tensor tiled = tile_by_reshapes(Tensor::from_f32(ids, {rows, block_cols}), rows, block_cols);
    const Shape padded = nvfp4_tiled_scale_shape(rows, block_cols);
    ASSERT_EQ(tiled.numel(), padded.numel());
    std::set<int64_t> seen;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < block_cols; ++c) {
        const int64_t at = nvfp4_tiled_scale_index(r, c, block_cols);
        ASSERT_GE(at, 0);
        ASSERT_LT(at, padded.numel());
        EXPECT_EQ(tiled.data_as<float>()[at], ids[r * block_cols + c]) << r << ", " << c;
        seen.insert(at);
      }
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), rows * block_cols);
  }
  EXPECT_EQ(nvfp4_tiled_scale_shape(300, 10), Shape({384, 12}));
}

// Element (o, i) is e2m1(code) · (tensor scale · e4m3(block scale)) in fp32, rounded once; the first
// element of a byte is its low nibble; both layouts give the same weight.
TEST(Nvfp4, AnElementIsItsCodeTimesBothScales) {
  const int64_t rows = 6, cols = 48, block_cols = cols / 16;
  const std::vector<uint8_t> codes = random_bytes(rows * cols / 2, 21);
  const std::vector<uint8_t> scale_codes = random_scale_codes(rows * block_cols, 22);
  const float tensor_scale = 0.0123f;
  const Tensor packed = u8_tensor(codes, {rows, cols / 2});
  const Tensor row_major = u8_tensor(scale_codes, {rows, block_cols}, DType::kF8E4M3);
  std::vector<uint8_t> tiled_codes(nvfp4_tiled_scale_shape(rows, block_cols).numel(), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < block_cols; ++b) {
      tiled_codes[nvfp4_tiled_scale_index(r, b, block_cols)] = scale_codes[r * block_cols + b];
    }
  }
  const Tensor tiled = u8_tensor(tiled_codes, nvfp4_tiled_scale_shape(rows, block_cols), DType::kF8E4M3);
  for (const DType into : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(into));
    auto a = dequantize_nvfp4(packed, row_major, Nvfp4ScaleLayout::kRowMajor, tensor_scale, into);
    auto b = dequantize_nvfp4(packed, tiled, Nvfp4ScaleLayout::kTiled, tensor_scale, into);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    ASSERT_EQ(a->shape(), Shape({rows, cols}));
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->nbytes()), 0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < cols; ++i) {
        const uint8_t byte = codes[(r * cols + i) / 2];
        const uint8_t code = i % 2 == 0 ? byte & 0xF : byte >> 4;
        const float scale = tensor_scale * e4m3_bits_to_f32(scale_codes[r * block_cols + i / 16]);
        const float want = e2m1_code_to_f32(code) * scale;
        if (into == DType::kF32) {
          ASSERT_EQ(a->data_as<float>()[r * cols + i], want) << r << ", " << i;
        } else {
          ASSERT_EQ(a->data_as<uint16_t>()[r * cols + i], f32_to_bf16_bits(want)) << r << ", " << i;
        }
      }
    }
  }
  // 0x21: first element code 1 (0.5), second code 2 (1.0).
  std::vector<uint8_t> one_row(8, 0);
  one_row[0] = 0x21;
  auto pair = dequantize_nvfp4(u8_tensor(one_row, {1, 8}), u8_tensor({0x38}, {1, 1}, DType::kF8E4M3),
                               Nvfp4ScaleLayout::kRowMajor, 2.0f, DType::kF32);  // e4m3 0x38 = 1.0
  ASSERT_TRUE(pair.ok()) << pair.status().to_string();
  EXPECT_EQ(pair->data_as<float>()[0], 1.0f);
  EXPECT_EQ(pair->data_as<float>()[1], 2.0f);

  const auto error = [&](const Tensor& p, const Tensor& s, Nvfp4ScaleLayout layout, DType into) {
    return dequantize_nvfp4(p, s, layout, 1.0f, into).status().message();
  };
  EXPECT_NE(error(packed, row_major, Nvfp4ScaleLayout::kTiled, DType::kBF16)
                .find("not F8_E4M3 [128, 4] (cuBLAS's tiled layout)"),
            std::string::npos);
  EXPECT_NE(error(u8_tensor(codes, {rows * 4, 6}), row_major, Nvfp4ScaleLayout::kRowMajor, DType::kBF16)
                .find("12 elements a row"),
            std::string::npos);
  EXPECT_NE(error(packed, row_major, Nvfp4ScaleLayout::kRowMajor, DType::kF16).find("F32 or BF16, not F16"),
            std::string::npos);
}

// Which layout the loader reads the block scales in: ComfyUI's descriptor says tiled; without one
// the shape decides, and where both shapes agree (O a multiple of 128, I/16 of 4) row-major, as
// ModelOpt writes them.
TEST(Nvfp4Weights, TheBlockScaleLayoutComesFromTheDescriptorOrTheShape) {
  const std::string p = "transformer_blocks.0.ff.net.2";
  struct Case {
    std::string what;
    int64_t rows, cols;
    bool descriptor, tiled;
  };
  const std::vector<Case> cases = {
      {"shapes agree, no descriptor: row-major", 128, 64, false, false},
      {"shapes agree, descriptor: tiled", 128, 64, true, true},
      {"only the tiled shape fits", 5, 32, false, true},
      {"only the row-major shape fits", 5, 32, false, false},
      {"descriptor and the tiled shape", 5, 32, true, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int64_t block_cols = c.cols / 16;
    const Tensor packed = u8_tensor(random_bytes(c.rows * c.cols / 2, 31), {c.rows, c.cols / 2});
    const Shape scale_shape = c.tiled ? nvfp4_tiled_scale_shape(c.rows, block_cols) : Shape{c.rows, block_cols};
    const Tensor scales = u8_tensor(random_scale_codes(scale_shape.numel(), 32), scale_shape, DType::kF8E4M3);
    NamedTensors tensors = {{p + ".weight", packed},
                            {p + ".weight_scale", scales},
                            {p + ".weight_scale_2", *Tensor::from_f32({0.75f}, {}).to(DType::kBF16)},
                            {p + ".input_scale", Tensor::from_f32({3.0f}, {})}};
    if (c.descriptor) tensors.emplace_back(p + ".comfy_quant", comfy_quant(R"({"format": "nvfp4"})"));
    auto summary = h3::check_scaled_weights(tensors);
    ASSERT_TRUE(summary.ok()) << summary.status().to_string();
    EXPECT_EQ(summary->nvfp4_weights, 1);
    EXPECT_EQ(summary->nvfp4_tiled, c.tiled ? 1 : 0);
    EXPECT_EQ(summary->fp8_weights, 0);
    EXPECT_EQ(summary->side_tensors_read_past, 1);  // the input scale
    auto loaded = h3::dequantize_scaled_weights(tensors, DType::kBF16);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    ASSERT_EQ(loaded->size(), 1u);
    auto want = dequantize_nvfp4(packed, scales, c.tiled ? Nvfp4ScaleLayout::kTiled : Nvfp4ScaleLayout::kRowMajor,
                                 0.75f, DType::kBF16);
    ASSERT_TRUE(want.ok());
    const Tensor& got = (*loaded)[0].second;
    ASSERT_EQ(got.shape(), Shape({c.rows, c.cols}));
    EXPECT_EQ(std::memcmp(got.data(), want->data(), want->nbytes()), 0);
    EXPECT_EQ(h3::logical_weight_shape(packed), Shape({c.rows, c.cols}));
  }
  // Where the shapes agree the choice matters: the same bytes read the other way differ.
  const Tensor packed = u8_tensor(random_bytes(128 * 32, 33), {128, 32});
  const Tensor scales = u8_tensor(random_scale_codes(128 * 4, 34), {128, 4}, DType::kF8E4M3);
  auto row_major = dequantize_nvfp4(packed, scales, Nvfp4ScaleLayout::kRowMajor, 1.0f, DType::kBF16);
  auto tiled = dequantize_nvfp4(packed, scales, Nvfp4ScaleLayout::kTiled, 1.0f, DType::kBF16);
  ASSERT_TRUE(row_major.ok() && tiled.ok());
  EXPECT_NE(std::memcmp(row_major->data(), tiled->data(), tiled->nbytes()), 0);
}

TEST(Nvfp4Weights, AnFp32IslandIsDequantizedIntoF32AndBadScalesAreRefusedByName) {
  const NamedTensors island = {{"proj_out.weight", u8_tensor(random_bytes(3 * 8, 41), {3, 8})},
                               {"proj_out.weight_scale", u8_tensor({0x30, 0x38, 0x40}, {3, 1}, DType::kF8E4M3)},
                               {"proj_out.weight_scale_2", Tensor::from_f32({0.5f}, {1})}};
  auto out = h3::dequantize_scaled_weights(island, DType::kBF16);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].second.dtype(), DType::kF32);

  const std::string p = "transformer_blocks.1.attn.to_q";
  const Tensor packed = u8_tensor(random_bytes(4 * 16, 42), {4, 16});  // [4, 32] logical, two blocks a row
  const Tensor scales = u8_tensor(random_scale_codes(8, 43), {4, 2}, DType::kF8E4M3);
  const Tensor ts = Tensor::from_f32({1.0f}, {});
  const std::vector<std::pair<NamedTensors, std::string>> refused = {
      {{{p + ".weight", packed}, {p + ".weight_scale", scales}},
       "'" + p + ".weight' is stored U8, which only an NVFP4 weight is here, and it lacks '" + p + ".weight_scale_2'"},
      {{{p + ".weight", packed}},
       "'" + p + ".weight' is stored U8, which only an NVFP4 weight is here, and it lacks '" + p + ".weight_scale'"},
      {{{p + ".weight", packed}, {p + ".weight_scale", Tensor::from_f32(std::vector<float>(8, 1.0f), {4, 2})},
        {p + ".weight_scale_2", ts}},
       "'" + p + ".weight_scale': F32 [4, 2] is not the block scales of '" + p + ".weight' [4, 16]"},
      {{{p + ".weight", packed}, {p + ".weight_scale", scales}, {p + ".weight_scale_2", ts},
        {p + ".comfy_quant", comfy_quant(R"({"format": "nvfp4"})")}},
       "which ComfyUI's descriptor says it is"},
      {{{p + ".weight", packed}, {p + ".weight_scale", scales}, {p + ".weight_scale_2", Tensor::from_f32({1, 2}, {2})}},
       "'" + p + ".weight_scale_2': F32 [2] is not one scale for the tensor"},
      {{{p + ".weight", packed}, {p + ".weight_scale", scales}, {p + ".weight_scale_2", ts},
        {p + ".comfy_quant", comfy_quant(R"({"format": "int8_blockwise"})")}},
       "'" + p + ".comfy_quant': format 'int8_blockwise' of a U8 weight is not supported"},
      {{{p + ".weight", packed}, {p + ".weight_scale", scales}, {p + ".weight_scale_2", ts},
        {p + ".comfy_quant", comfy_quant("nvfp4")}},
       "'" + p + ".comfy_quant': a comfy_quant descriptor is a JSON object"},
      {{{p + ".weight", u8_tensor(random_bytes(8, 44), {2, 4})}, {p + ".weight_scale", scales}, {p + ".weight_scale_2", ts}},
       "an NVFP4 weight is U8 [O, I/2] with I a multiple of 16, not [2, 4]"},
  };
  for (const auto& [tensors, needle] : refused) {
    const auto status = h3::dequantize_scaled_weights(tensors, DType::kBF16).status();
    EXPECT_FALSE(status.ok()) << needle;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status.message();
  }
}

// The CLI end to end: the transformer block linears stored NVFP4 (the first block's in ComfyUI's
// form: tiled block scales and a descriptor; the others in ModelOpt's), inspected, generated from
// directly, with the descriptors in the header, and after convert --to original; the latents are
// those of the reference checkpoint.
TEST(CliNvfp4Checkpoint, GenerateRunsTheDequantizedWeights) {
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("small");
  auto written = test_util::write_nvfp4_checkpoints(config, 9, tmp.file("nvfp4.safetensors"),
                                                    tmp.file("reference.safetensors"));
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  const NamedTensors& nvfp4 = written->tensors;
  const int quantized = written->quantized;
  ASSERT_GE(quantized, 4 * config.num_layers);
  ASSERT_GT(written->tiled, 0);
  const std::map<std::string, std::string> metadata = {{"config", config.to_json_string()}};
  // The same file with ComfyUI's descriptors in its header instead of beside the weights.
  NamedTensors without_descriptors;
  std::string layers;
  for (const auto& [name, tensor] : nvfp4) {
    if (!name.ends_with(".comfy_quant")) {
      without_descriptors.emplace_back(name, tensor);
      continue;
    }
    layers += std::string(layers.empty() ? "" : ", ") + "\"" + name.substr(0, name.size() - 12) +
              "\": {\"format\": \"nvfp4\"}";
  }
  std::map<std::string, std::string> header = metadata;
  header["_quantization_metadata"] = "{\"format_version\": \"1.0\", \"layers\": {" + layers + "}}";
  ASSERT_TRUE(write_safetensors(tmp.file("header.safetensors"), without_descriptors, header).ok());
  auto header_checkpoint = ShardedCheckpoint::open(tmp.file("header.safetensors"));
  ASSERT_TRUE(header_checkpoint.ok());
  auto header_tensors = h3::read_all(*header_checkpoint);
  ASSERT_TRUE(header_tensors.ok()) << header_tensors.status().to_string();
  auto header_summary = h3::check_scaled_weights(*header_tensors);
  ASSERT_TRUE(header_summary.ok()) << header_summary.status().message();
  EXPECT_EQ(header_summary->nvfp4_tiled, written->tiled);
  header["_quantization_metadata"] = "[1, 2]";
  ASSERT_TRUE(write_safetensors(tmp.file("bad-header.safetensors"), without_descriptors, header).ok());
  test_util::expect_one_line_error(run_cli("inspect " + q(tmp.file("bad-header.safetensors"))),
                                   "safetensors metadata '_quantization_metadata': not a JSON object");

  const CliRun inspect = run_cli("inspect " + q(tmp.file("nvfp4.safetensors")));
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  const std::string counted = "nvfp4       " + std::to_string(quantized) + " weights (" +
                              std::to_string(written->tiled) + " with block scales in cuBLAS's tiled layout, " +
                              std::to_string(quantized - written->tiled) + " row-major)";
  EXPECT_NE(inspect.out.find(counted), std::string::npos) << inspect.out;
  const CliRun reference_inspect = run_cli("inspect --json " + q(tmp.file("reference.safetensors")));
  const CliRun nvfp4_inspect = run_cli("inspect --json " + q(tmp.file("nvfp4.safetensors")));
  const auto parameters = [](const std::string& json) {
    const size_t at = json.find("\"parameters\":");
    return at == std::string::npos ? std::string("none") : json.substr(at, json.find(',', at) - at);
  };
  EXPECT_EQ(parameters(nvfp4_inspect.out), parameters(reference_inspect.out)) << nvfp4_inspect.out;

  const CliRun to_original = run_cli("convert --in " + q(tmp.file("nvfp4.safetensors")) + " --to original --out " +
                                     q(tmp.file("original")));
  ASSERT_EQ(to_original.code, 0) << to_original.err;
  const std::string request = " --height 128 --width 192 --frames 22 --steps 2 --text-tokens 4 --seed 5 --out ";
  std::map<std::string, std::string> latents;
  for (const std::string model : {"nvfp4.safetensors", "header.safetensors", "reference.safetensors", "original"}) {
    const CliRun run = run_cli("generate --model " + q(tmp.file(model)) + request + q(tmp.file("g-" + model)));
    ASSERT_EQ(run.code, 0) << run.err;
    latents[model] = test_util::latent_checksum_lines(run);
  }
  EXPECT_EQ(latents["nvfp4.safetensors"], latents["reference.safetensors"]);
  EXPECT_EQ(latents["header.safetensors"], latents["reference.safetensors"]);
  EXPECT_EQ(latents["original"], latents["reference.safetensors"]);
}

}  // namespace
}  // namespace vortex
