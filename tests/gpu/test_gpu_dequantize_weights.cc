// Quantized weights dequantized on the device (cuda/dequantize_weights.h through
// h3::host_weight_filler) against the host's dequantization (h3::dequantize_scaled_weights), bit
// for bit: every finite e4m3 and e5m2 code, scales per tensor, per row (F32, BF16 and F16) and
// none, odd shapes, F32 and BF16 outputs (an fp32 island), NVFP4 with row-major and tiled (padded)
// block scales, every GGUF quantized type (random blocks, and ggml's own goldens against ggml's
// values); and the filler's refusal of a wrong shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "formats/gguf.h"
#include "formats/nvfp4.h"
#include "ggml_blocks_test_util.h"
#include "gpu_test_util.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/scaled_weights.h"

namespace vortex {
namespace {

using test::must;

bool is_nan_code(uint8_t code, DType dtype) {
  if (dtype == DType::kF8E4M3) return (code & 0x7F) == 0x7F;
  return (code & 0x7F) > 0x7C;  // e5m2: exponent all ones with a mantissa
}

// Random codes of `dtype` (F8 or U8) without NaNs (whose payloads the host and device multiplies
// need not keep alike; no checkpoint holds them), covering every other code.
Tensor codes(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint8_t c = static_cast<uint8_t>(i < 256 ? i : philox_block(seed, 0, static_cast<uint64_t>(i)).v[0]);
    if (dtype != DType::kU8 && is_nan_code(c, dtype)) c = 0x42;
    bytes[i] = c;
  }
  return t;
}

class GpuDequantizeWeights : public test::GpuTest {
 protected:
  // `tensors` (one quantized weight `name` with its side tensors) through host_weight_filler into
  // a device tensor of `dtype`, against the host's dequantization.
  void expect_host_bits(const h3::NamedTensors& tensors, const std::string& name, DType dtype) {
    SCOPED_TRACE(name + " into " + dtype_name(dtype));
    const h3::NamedTensors host = must(h3::dequantize_scaled_weights(tensors, dtype));
    ASSERT_EQ(host.size(), 1u);
    const Tensor& want = host[0].second;
    ArenaScope scope(arena_);
    const Tensor dst = must(arena_.alloc(want.shape(), dtype));
    must(h3::host_weight_filler(tensors, stream_)({name, want.shape(), dtype == DType::kF32}, dst));
    const Tensor got = to_host(dst);
    ASSERT_EQ(got.nbytes(), want.nbytes());
    EXPECT_EQ(std::memcmp(got.data(), want.contiguous().data(), got.nbytes()), 0);
  }
};

TEST_F(GpuDequantizeWeights, Fp8IsTheHostsDequantizationBitForBit) {
  const std::string p = "transformer_blocks.0.attn.to_q";
  const int64_t rows = 37, cols = 53;
  std::vector<float> row_scales(rows);
  for (int64_t r = 0; r < rows; ++r) row_scales[r] = std::ldexp(1.0f + 0.37f * static_cast<float>(r % 7), static_cast<int>(r % 23) - 12);
  for (const DType code_dtype : {DType::kF8E4M3, DType::kF8E5M2}) {
    const Tensor w = codes({rows, cols}, code_dtype, 5);
    const std::vector<h3::NamedTensors> cases = {
        {{p + ".weight", w}},
        {{p + ".weight", w}, {p + ".weight_scale", Tensor::from_f32({0.0173f}, {})}},
        {{p + ".weight", w}, {p + ".scale_weight", must(Tensor::from_f32({3.5f}, {1}).to(DType::kF16))}},
        {{p + ".weight", w}, {p + ".weight_scale", Tensor::from_f32(row_scales, {rows})}},
        {{p + ".weight", w}, {p + ".weight_scale", must(Tensor::from_f32(row_scales, {rows, 1}).to(DType::kBF16))},
         {p + ".input_scale", Tensor::from_f32({2.0f}, {})}},
    };
    for (const auto& tensors : cases) {
      for (const DType dtype : {DType::kBF16, DType::kF32}) expect_host_bits(tensors, p + ".weight", dtype);
    }
  }
}

TEST_F(GpuDequantizeWeights, Nvfp4IsTheHostsDequantizationBitForBit) {
  const std::string p = "transformer_blocks.1.ff.net.2";
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{5, 48}, {130, 80}, {128, 64}}) {
    const int64_t block_cols = cols / 16;
    const Tensor packed = codes({rows, cols / 2}, DType::kU8, 9);
    for (const Nvfp4ScaleLayout layout : {Nvfp4ScaleLayout::kRowMajor, Nvfp4ScaleLayout::kTiled}) {
      const Shape scale_shape =
          layout == Nvfp4ScaleLayout::kTiled ? nvfp4_tiled_scale_shape(rows, block_cols) : Shape{rows, block_cols};
      Tensor scales = codes(scale_shape, DType::kF8E4M3, 11);
      for (int64_t i = 0; i < scales.numel(); ++i) static_cast<uint8_t*>(scales.data())[i] &= 0x7F;  // positive
      h3::NamedTensors tensors = {{p + ".weight", packed},
                                  {p + ".weight_scale", scales},
                                  {p + ".weight_scale_2", Tensor::from_f32({0.0031f}, {})}};
      // Where both shapes agree, ComfyUI's descriptor says the scales are tiled.
      const bool both = scale_shape == Shape({rows, block_cols}) && scale_shape == nvfp4_tiled_scale_shape(rows, block_cols);
      if (layout == Nvfp4ScaleLayout::kTiled && both) {
        const std::string json = R"({"format": "nvfp4"})";
        Tensor descriptor = Tensor::empty({static_cast<int64_t>(json.size())}, DType::kU8);
        std::memcpy(descriptor.data(), json.data(), json.size());
        tensors.emplace_back(p + ".comfy_quant", descriptor);
      }
      for (const DType dtype : {DType::kBF16, DType::kF32}) expect_host_bits(tensors, p + ".weight", dtype);
    }
  }
}

TEST_F(GpuDequantizeWeights, GgufBlocksAreTheHostsDequantizationBitForBit) {
  const std::string p = "transformer_blocks.2.attn.to_v";
  for (const uint32_t type : test_util::ggml_quantized_types()) {
    SCOPED_TRACE(ggml_type_name(type));
    // Odd row counts, one block a row and several; a whole GPU wave and a partial one.
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 256}, {37, 512}, {301, 1024}}) {
      const h3::NamedTensors tensors = {{p + ".weight", test_util::random_ggml_blocks(type, rows, cols, 17 + rows)},
                                        {p + h3::kGgmlTypeSuffix, h3::ggml_type_tensor(type)}};
      for (const DType dtype : {DType::kBF16, DType::kF32}) expect_host_bits(tensors, p + ".weight", dtype);
    }
  }
}

// The blocks ggml itself quantized (tests/golden/gguf) give ggml's own values on the device.
TEST_F(GpuDequantizeWeights, GgufGoldenBlocksGiveGgmlsValues) {
  const std::string golden = std::string(VORTEX_SOURCE_DIR) + "/tests/golden/gguf/";
  const GgufFile quants = must(GgufFile::open(golden + "quants.gguf"));
  const GgufFile expected = must(GgufFile::open(golden + "expected.gguf"));
  int checked = 0;
  for (const GgufTensorInfo& info : quants.tensors()) {
    if (ggml_type_is_float(info.ggml_type)) continue;
    SCOPED_TRACE(info.name);
    const Tensor want = must(expected.get(info.name, DType::kF32)).contiguous();
    const h3::NamedTensors tensors = {{"proj_in.weight", must(quants.blocks(info.name))},
                                      {std::string("proj_in") + h3::kGgmlTypeSuffix, h3::ggml_type_tensor(info.ggml_type)}};
    ArenaScope scope(arena_);
    const Tensor dst = must(arena_.alloc(want.shape(), DType::kF32));
    must(h3::host_weight_filler(tensors, stream_)({"proj_in.weight", want.shape(), true}, dst));
    const Tensor got = to_host(dst);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0);
    ++checked;
  }
  EXPECT_EQ(checked, 10);
}

// The original layout's fused QKV and FC1 in every stored form, loaded part by part (HostWeights:
// a part's codes staged from their rows of the fused weight, its scales' rows taken on the host):
// each part the bits of the layout converted first and dequantized on the host.
TEST_F(GpuDequantizeWeights, AFusedLayersPartsLoadFromItsRowsToTheConvertedWeightsBits) {
  h3::H3Config config;
  config.num_attention_heads = 3;
  config.attention_head_dim = 8;
  config.ffn_dim = 40;
  config.hidden_size = 256;
  const auto fused = [&](const std::string& form, const std::string& name, int64_t rows, uint64_t seed) {
    const std::string p = name.substr(0, name.size() - std::strlen(".weight"));
    const int64_t cols = config.hidden_size;
    std::vector<float> row_scales(rows);
    for (int64_t r = 0; r < rows; ++r) {
      row_scales[r] = std::ldexp(1.0f + 0.25f * static_cast<float>(r % 5), -static_cast<int>(r % 9));
    }
    if (form == "bf16") {
      Tensor w = Tensor::empty({rows, cols}, DType::kBF16);
      for (int64_t i = 0; i < w.numel(); ++i) {
        w.data_as<uint16_t>()[i] = static_cast<uint16_t>(0x3C00 + (i * 37 + static_cast<int64_t>(seed)) % 1024);
      }
      return h3::NamedTensors{{name, w}};
    }
    if (form == "fp8 per row") {
      return h3::NamedTensors{{name, codes({rows, cols}, DType::kF8E4M3, seed)},
                              {p + ".weight_scale", Tensor::from_f32(row_scales, {rows})}};
    }
    if (form == "fp8 e5m2 per tensor") {
      return h3::NamedTensors{{name, codes({rows, cols}, DType::kF8E5M2, seed)},
                              {p + ".scale_weight", Tensor::from_f32({0.0173f}, {})}};
    }
    if (form == "nvfp4 row-major" || form == "nvfp4 tiled") {
      const int64_t block_cols = cols / 16;
      const Shape shape = form == "nvfp4 tiled" ? nvfp4_tiled_scale_shape(rows, block_cols) : Shape{rows, block_cols};
      Tensor scales = codes(shape, DType::kF8E4M3, seed + 1);
      for (int64_t i = 0; i < scales.numel(); ++i) static_cast<uint8_t*>(scales.data())[i] &= 0x7F;
      return h3::NamedTensors{{name, codes({rows, cols / 2}, DType::kU8, seed)},
                              {p + ".weight_scale", scales},
                              {p + ".weight_scale_2", Tensor::from_f32({0.0031f}, {})}};
    }
    const uint32_t type = form == "Q4_K" ? kGgmlQ4_K : kGgmlQ8_0;
    return h3::NamedTensors{{name, test_util::random_ggml_blocks(type, rows, cols, seed)},
                            {p + h3::kGgmlTypeSuffix, h3::ggml_type_tensor(type)}};
  };
  const int64_t inner = config.inner_dim();
  for (const std::string form : {"bf16", "fp8 per row", "fp8 e5m2 per tensor", "nvfp4 row-major", "nvfp4 tiled", "Q4_K",
                                 "Q8_0"}) {
    SCOPED_TRACE(form);
    h3::NamedTensors original = fused(form, "blocks.0.attn.qkv_proj.weight", 3 * inner, 3);
    for (auto& entry : fused(form, "blocks.0.mlp.fc1.weight", 2 * config.ffn_dim, 4)) original.push_back(entry);
    const h3::HostWeights weights = must(h3::HostWeights::original(original, config));
    const h3::NamedTensors want = must(h3::dequantize_scaled_weights(must(h3::original_to_diffusers(original, config)),
                                                                    DType::kBF16));
    const h3::WeightFiller fill = h3::host_weight_filler(weights, stream_, h3::DequantizeOn::kDevice);
    for (const auto& [name, expected] : want) {
      ASSERT_TRUE(weights.stored_rows(name).has_value()) << name;
      ArenaScope scope(arena_);
      const Tensor dst = must(arena_.alloc(expected.shape(), DType::kBF16));
      must(fill({name, expected.shape(), false}, dst));
      const Tensor got = to_host(dst);
      ASSERT_EQ(got.nbytes(), expected.nbytes()) << name;
      EXPECT_EQ(std::memcmp(got.data(), expected.contiguous().data(), got.nbytes()), 0) << name;
    }
    EXPECT_EQ(want.size(), 4u);
  }
}

TEST_F(GpuDequantizeWeights, AWrongShapeIsRefusedByName) {
  const std::string name = "transformer_blocks.0.attn.to_k.weight";
  const h3::NamedTensors tensors = {{name, codes({4, 8}, DType::kF8E4M3, 3)}};
  ArenaScope scope(arena_);
  const Tensor dst = must(arena_.alloc({4, 9}, DType::kBF16));
  const Status status = h3::host_weight_filler(tensors, stream_)({name, Shape{4, 9}, false}, dst);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("tensor '" + name + "': shape [4, 8] but the config expects [4, 9]"),
            std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace vortex
