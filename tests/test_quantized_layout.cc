// Quantized weights through the original layout's conversion without being dequantized
// (h3::original_to_diffusers with h3::take_quantized_rows): the fused QKV and FC1 of every quantized
// form (fp8 with each kind of scale, NVFP4 with row-major and tiled block scales, each GGUF type)
// split into parts that dequantize to the bits of the dequantized weight split; GGUF blocks as the
// loaders hold them (P.weight U8 + P.ggml_type): zero-copy from a GGUF file, their schema shape,
// and malformed ones refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "formats/nvfp4.h"
#include "ggml_blocks_test_util.h"
#include "models/h3/checkpoint_writer.h"
#include "gguf_test_util.h"
#include "models/h3/model_source.h"
#include "models/h3/scaled_weights.h"
#include "models/h3/weights.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

using h3::NamedTensors;

template <typename T>
T must(Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(*r);
}

Tensor random_bytes(const Shape& shape, DType dtype, uint64_t seed, uint8_t mask = 0xFF) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint8_t b = static_cast<uint8_t>(philox_block(seed, 3, static_cast<uint64_t>(i)).v[0]) & mask;
    if ((dtype == DType::kF8E4M3 && (b & 0x7F) == 0x7F) || (dtype == DType::kF8E5M2 && (b & 0x7F) > 0x7C)) b = 0x3A;
    bytes[i] = b;
  }
  return t;
}

Tensor descriptor(const std::string& json) {
  Tensor t = Tensor::empty({static_cast<int64_t>(json.size())}, DType::kU8);
  std::memcpy(t.data(), json.data(), json.size());
  return t;
}

// A small config: QKV [3 · 2 · 8, C], FC1 [2 · 40, C], C = 256 (whole K-quant blocks a row).
h3::H3Config tiny_config() {
  h3::H3Config c;
  c.num_attention_heads = 2;
  c.attention_head_dim = 8;
  c.ffn_dim = 40;
  c.hidden_size = 256;
  return c;
}

// The weight `name` [rows, cols] quantized in `form`, with its side tensors.
NamedTensors quantized(const std::string& form, const std::string& name, int64_t rows, int64_t cols, uint64_t seed) {
  const std::string p = name.substr(0, name.size() - std::strlen(".weight"));
  std::vector<float> row_scales(rows);
  for (int64_t r = 0; r < rows; ++r) row_scales[r] = 0.01f * static_cast<float>(1 + (r * 7) % 13);
  if (form == "fp8 per row") {
    return {{name, random_bytes({rows, cols}, DType::kF8E4M3, seed)}, {p + ".weight_scale", Tensor::from_f32(row_scales, {rows})}};
  }
  if (form == "fp8 e5m2 per row [O, 1] bf16") {
    return {{name, random_bytes({rows, cols}, DType::kF8E5M2, seed)},
            {p + ".scale_weight", must(Tensor::from_f32(row_scales, {rows, 1}).to(DType::kBF16))},
            {p + ".input_scale", Tensor::from_f32({2.0f}, {})}};
  }
  if (form == "fp8 per tensor") {
    return {{name, random_bytes({rows, cols}, DType::kF8E4M3, seed)}, {p + ".weight_scale", Tensor::from_f32({0.03f}, {1})}};
  }
  if (form == "fp8 unscaled") return {{name, random_bytes({rows, cols}, DType::kF8E4M3, seed)}};
  if (form == "nvfp4 row-major" || form == "nvfp4 tiled") {
    const bool tiled = form == "nvfp4 tiled";
    const int64_t block_cols = cols / kNvfp4BlockSize;
    const Shape scale_shape = tiled ? nvfp4_tiled_scale_shape(rows, block_cols) : Shape{rows, block_cols};
    NamedTensors t = {{name, random_bytes({rows, cols / 2}, DType::kU8, seed)},
                      {p + ".weight_scale", random_bytes(scale_shape, DType::kF8E4M3, seed + 1, 0x7F)},
                      {p + ".weight_scale_2", Tensor::from_f32({0.004f}, {})}};
    if (tiled) t.emplace_back(p + ".comfy_quant", descriptor(R"({"format": "nvfp4"})"));
    return t;
  }
  const uint32_t type = static_cast<uint32_t>(std::stoi(form.substr(5)));  // "ggml N"
  return {{name, test_util::random_ggml_blocks(type, rows, cols, seed)}, {p + h3::kGgmlTypeSuffix, h3::ggml_type_tensor(type)}};
}

std::map<std::string, Tensor> by_name(const NamedTensors& tensors) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : tensors) out[name] = t;
  return out;
}

TEST(QuantizedLayout, FusedLayersSplitStillQuantizedToTheBitsOfSplittingThemDequantized) {
  const h3::H3Config config = tiny_config();
  std::vector<std::string> forms = {"fp8 per row", "fp8 e5m2 per row [O, 1] bf16", "fp8 per tensor", "fp8 unscaled",
                                    "nvfp4 row-major", "nvfp4 tiled"};
  for (const uint32_t type : test_util::ggml_quantized_types()) forms.push_back("ggml " + std::to_string(type));
  for (const std::string& form : forms) {
    SCOPED_TRACE(form);
    NamedTensors original;
    const auto add = [&](const NamedTensors& t) { original.insert(original.end(), t.begin(), t.end()); };
    add(quantized(form, "blocks.0.attn.qkv_proj.weight", 48, 256, 1));
    add(quantized(form, "blocks.0.mlp.fc1.weight", 80, 256, 2));
    add(quantized(form, "blocks.0.attn.out_proj.weight", 24, 256, 3));  // renamed with its side tensors
    original.emplace_back("blocks.0.norm1.weight", Tensor::from_f32(std::vector<float>(256, 1.0f), {256}));

    const NamedTensors split = must(h3::original_to_diffusers(original, config));
    const std::map<std::string, Tensor> parts = by_name(split);
    for (const auto& [name, t] : split) {
      EXPECT_EQ(name.find("qkv_proj"), std::string::npos) << name;
      EXPECT_EQ(name.find("mlp.fc1"), std::string::npos) << name;
    }
    for (const char* part : {"attn.to_q", "attn.to_k", "attn.to_v", "ff.net.0.proj", "attn.to_out.0"}) {
      const std::string name = std::string("transformer_blocks.0.") + part + ".weight";
      ASSERT_TRUE(parts.count(name)) << name;
      EXPECT_EQ(parts.at(name).dtype(), original[0].second.dtype()) << name << " stays quantized";
    }
    const auto summary = must(h3::check_scaled_weights(split));
    EXPECT_EQ(summary.fp8_weights + summary.nvfp4_weights + summary.ggml_weights, 5);
    // A split part's block scales are row-major; the out projection's stay as they were.
    EXPECT_EQ(summary.nvfp4_tiled, form == "nvfp4 tiled" ? 1 : 0);

    // One weight at a time (the device loaders' way): each part with its own side tensors, the
    // bits of the whole split's.
    const h3::HostWeights weights = must(h3::HostWeights::original(original, config));
    for (const char* part : {"attn.to_q", "attn.to_k", "attn.to_v", "ff.net.0.proj", "attn.to_out.0"}) {
      const std::string name = std::string("transformer_blocks.0.") + part + ".weight";
      const NamedTensors one = must(weights.weight(name));
      ASSERT_FALSE(one.empty()) << name;
      EXPECT_EQ(one.front().first, name);
      // Its codes left as rows of the fused weight's give the same weight.
      const auto rows = weights.stored_rows(name);
      EXPECT_EQ(rows.has_value(), std::string(part) != "attn.to_out.0") << name;
      if (rows) {
        const auto q = must(h3::quantized_rows(rows->stored, rows->stored.front().first, rows->runs));
        const auto want = must(h3::stored_quantized_weight(one, name));
        EXPECT_EQ(q.logical_shape(), want.logical_shape()) << name;
        const Tensor codes = h3::gather_rows(q.codes, q.codes_rows);
        ASSERT_EQ(codes.nbytes(), want.codes.nbytes()) << name;
        EXPECT_EQ(std::memcmp(codes.data(), want.codes.data(), codes.nbytes()), 0) << name;
        for (const auto& [got, expected] : {std::pair{q.fp8_scales, want.fp8_scales},
                                            std::pair{q.nvfp4_block_scales, want.nvfp4_block_scales}}) {
          ASSERT_EQ(got.defined(), expected.defined()) << name;
          if (!got.defined()) continue;
          ASSERT_EQ(got.nbytes(), expected.nbytes()) << name;
          EXPECT_EQ(std::memcmp(got.contiguous().data(), expected.contiguous().data(), got.nbytes()), 0) << name;
        }
        EXPECT_EQ(q.nvfp4_layout, want.nvfp4_layout) << name;
        EXPECT_EQ(q.nvfp4_tensor_scale, want.nvfp4_tensor_scale) << name;
        EXPECT_EQ(q.ggml_type, want.ggml_type) << name;
      }
      int sides = 0;  // (an fp8 weight's input_scale is not read to dequantize it)
      for (const std::string& side : h3::side_tensor_names_of(name)) sides += static_cast<int>(parts.count(side));
      EXPECT_EQ(static_cast<int>(one.size()), 1 + sides) << name;
      for (const auto& [n, t] : one) {
        ASSERT_TRUE(parts.count(n)) << n;
        ASSERT_EQ(t.shape(), parts.at(n).shape()) << n;
        EXPECT_EQ(std::memcmp(t.contiguous().data(), parts.at(n).contiguous().data(), t.nbytes()), 0) << n;
      }
    }
    const auto got = by_name(must(h3::dequantize_scaled_weights(split, DType::kBF16)));
    const auto want = by_name(must(h3::original_to_diffusers(must(h3::dequantize_scaled_weights(original, DType::kBF16)),
                                                             config)));
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, w] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      const Tensor& g = got.at(name);
      ASSERT_EQ(g.shape(), w.shape()) << name;
      ASSERT_EQ(g.dtype(), w.dtype()) << name;
      EXPECT_EQ(std::memcmp(g.contiguous().data(), w.contiguous().data(), w.nbytes()), 0) << name;
    }
  }
}

TEST(QuantizedLayout, AGgufFilesMatricesAreHeldAsTheirBlocks) {
  test_util::TempDir tmp;
  const Tensor blocks = test_util::random_ggml_blocks(kGgmlQ4_K, 6, 512, 4);
  test_util::GgufTensor q4k{"model.diffusion_model.blocks.0.mlp.fc2.weight", Shape{6, 512}, kGgmlQ4_K, {}};
  q4k.bytes.assign(static_cast<const uint8_t*>(blocks.data()), static_cast<const uint8_t*>(blocks.data()) + blocks.nbytes());
  const Tensor bias = Tensor::from_f32(std::vector<float>(6, 0.5f), {6});
  test_util::GgufTensor f32 = test_util::as_stored("model.diffusion_model.blocks.0.mlp.fc2.bias", bias, kGgmlF32, DType::kF32);
  test_util::write_gguf(tmp.file("m.gguf"), {}, {q4k, f32});
  const h3::ModelSource source = must(h3::ModelSource::open(tmp.file("m.gguf")));
  const NamedTensors tensors = must(source.tensors());
  const auto held = by_name(tensors);
  ASSERT_EQ(held.size(), 3u);
  const Tensor& w = held.at("blocks.0.mlp.fc2.weight");
  EXPECT_EQ(w.dtype(), DType::kU8);
  EXPECT_EQ(w.shape(), Shape({6, 2 * 144}));
  EXPECT_EQ(std::memcmp(w.data(), blocks.data(), blocks.nbytes()), 0);
  EXPECT_EQ(held.at("blocks.0.mlp.fc2.ggml_type").data_as<int32_t>()[0], int32_t(kGgmlQ4_K));
  // The schema sees [O, I]; dequantized, the blocks are tensor()'s values.
  for (const auto& [name, entry] : h3::shapes_of(tensors)) {
    if (name == "blocks.0.mlp.fc2.weight") EXPECT_EQ(entry.shape, Shape({6, 512}));
  }
  const auto dequantized = by_name(must(h3::dequantize_scaled_weights(tensors, DType::kBF16)));
  ASSERT_EQ(dequantized.size(), 2u);
  const Tensor want = must(source.tensor("blocks.0.mlp.fc2.weight"));
  EXPECT_EQ(std::memcmp(dequantized.at("blocks.0.mlp.fc2.weight").data(), want.data(), want.nbytes()), 0);
}

// What the CUDA loader does with a GGUF checkpoint before any weight uploads: the blocks as held,
// converted to the diffusers layout still quantized, pass the schema check at the config's shapes.
TEST(QuantizedLayout, AHeldGgufCheckpointConvertsAndPassesTheSchemaCheck) {
  test_util::TempDir tmp;
  const h3::H3Config config = *h3::config_preset("mid");
  const auto written = test_util::write_gguf_checkpoints(config, 3, tmp.file("source"), tmp.file("m.gguf"),
                                                         tmp.file("reference.safetensors"));
  ASSERT_TRUE(written.ok()) << written.status().message();
  ASSERT_GT(written->quantized, 0);
  const h3::ModelSource source = must(h3::ModelSource::open(tmp.file("m.gguf")));
  const NamedTensors diffusers = must(h3::original_to_diffusers(must(source.tensors()), config));
  // Each quantized QKV became three weights.
  int quantized_qkv = 0;
  for (const auto& t : written->tensors) quantized_qkv += t.type == kGgmlQ8_0 && t.name.ends_with(".attn.qkv_proj.weight");
  EXPECT_GT(quantized_qkv, 0);
  EXPECT_EQ(must(h3::check_scaled_weights(diffusers)).ggml_weights, written->quantized + 2 * quantized_qkv);
  const Status valid = h3::validate_checkpoint_tensors(diffusers, h3::CheckpointLayout::kDiffusers, config);
  EXPECT_TRUE(valid.ok()) << valid.message();
}

// ggml_f16_fields names every f16 field: with each set finite, random blocks dequantize finite.
TEST(QuantizedLayout, RandomBlocksWithFiniteF16FieldsDequantizeFinite) {
  for (const uint32_t type : test_util::ggml_quantized_types()) {
    const Tensor blocks = test_util::random_ggml_blocks(type, 64, 512, 6);
    std::vector<float> values(64 * 512);
    ASSERT_TRUE(dequantize_ggml(type, static_cast<const uint8_t*>(blocks.data()), 64 * 512, values.data()).ok());
    int64_t finite = 0;
    for (float v : values) finite += std::isfinite(v);
    EXPECT_EQ(finite, 64 * 512) << ggml_type_name(type);
  }
}

TEST(QuantizedLayout, MalformedGgufBlocksAreRefusedByName) {
  const std::string w = "transformer_blocks.0.ff.net.2.weight", t = "transformer_blocks.0.ff.net.2.ggml_type";
  const Tensor q8 = test_util::random_ggml_blocks(kGgmlQ8_0, 4, 64, 5);
  const auto refused = [&](const NamedTensors& tensors, const std::string& needle) {
    const auto r = h3::check_scaled_weights(tensors);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  refused({{w, q8}, {t, h3::ggml_type_tensor(kGgmlF32)}}, "tensor '" + t + "': F32 is not a quantized ggml type");
  refused({{w, q8}, {t, h3::ggml_type_tensor(99)}}, "': type 99 is not a quantized ggml type");
  refused({{w, q8}, {t, Tensor::from_i64({8}, {})}}, "a ggml type is I32 [], not I64 []");
  refused({{w, q8}, {t, h3::ggml_type_tensor(kGgmlQ4_K)}}, "is not rows of whole Q4_K blocks");
  refused({{t, h3::ggml_type_tensor(kGgmlQ8_0)}}, "types '" + w + "', which is not in the checkpoint");
  refused({{w, q8}, {t, h3::ggml_type_tensor(kGgmlQ8_0)}, {"transformer_blocks.0.ff.net.2.weight_scale",
                                                           Tensor::from_f32({1.0f}, {})}},
          "whose GGUF blocks carry their own scales");
  EXPECT_TRUE(h3::check_scaled_weights({{w, q8}, {t, h3::ggml_type_tensor(kGgmlQ8_0)}}).ok());
  // A fused layer's scales are checked before the conversion splits them off their weight.
  const Tensor bf16 = must(Tensor::from_f32(std::vector<float>(48 * 256, 0.5f), {48, 256}).to(DType::kBF16));
  const auto converted = h3::original_to_diffusers(
      {{"blocks.0.attn.qkv_proj.weight", bf16}, {"blocks.0.attn.qkv_proj.weight_scale", Tensor::from_f32({2.0f}, {})}},
      tiny_config());
  ASSERT_FALSE(converted.ok());
  EXPECT_NE(converted.status().message().find("tensor 'blocks.0.attn.qkv_proj.weight_scale' scales "
                                              "'blocks.0.attn.qkv_proj.weight', stored BF16"),
            std::string::npos)
      << converted.status().message();
}

}  // namespace
}  // namespace vortex
