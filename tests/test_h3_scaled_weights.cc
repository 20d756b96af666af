// fp8 checkpoints (models/h3/scaled_weights.h): the dequantization rule on every scale form the
// formats use, the side tensors read past or refused by name, the fp8 recipe getting back its own
// weights from a quantized checkpoint, per-channel scales following an original layout's rows, and
// the CLI: convert --quantize fp8, inspect, and generate giving the bits of the dequantized weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "cli_test_util.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cpu/fp8.h"
#include "formats/safetensors.h"
#include "models/h3/checkpoint_writer.h"
#include "models/h3/scaled_weights.h"
#include "models/h3/synthetic.h"
#include "models/h3/weights.h"

namespace vortex {
namespace {

using h3::NamedTensors;
using test_util::CliRun;
using test_util::expect_one_line_error;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

Tensor bytes_tensor(const std::vector<uint8_t>& codes, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  std::memcpy(t.data(), codes.data(), codes.size());
  return t;
}

std::vector<uint8_t> random_codes(size_t n, uint64_t seed) {
  std::vector<uint8_t> codes(n);
  for (size_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(philox_block(seed, 0, i).v[0]);
  return codes;
}

Tensor scale_tensor(const std::vector<float>& values, const Shape& shape, DType dtype) {
  const Tensor f32 = Tensor::from_f32(values, shape);
  return dtype == DType::kF32 ? f32 : *f32.to(dtype);
}

float as_f32(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::kF32) return t.data_as<float>()[i];
  return bf16_bits_to_f32(t.data_as<uint16_t>()[i]);
}

const Tensor& find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  static const Tensor none;
  ADD_FAILURE() << "no tensor " << name;
  return none;
}

// Each element is float(code) · float(scale of its row) in fp32, rounded once to the target dtype.
TEST(ScaledWeights, AnElementIsItsCodeTimesItsScaleRoundedOnce) {
  const int64_t rows = 5, cols = 7;
  const std::vector<uint8_t> codes = random_codes(rows * cols, 11);
  const std::vector<float> row_scales = {0.5f, 3.1e-3f, 1.7f, 2.0e-5f, 97.25f};
  struct Case {
    std::string what;
    DType weight, scale_dtype, into;
    Shape scale_shape;
    std::string scale_suffix;
  };
  const std::vector<Case> cases = {
      {"per channel [O] F32 into BF16", DType::kF8E4M3, DType::kF32, DType::kBF16, {rows}, ".weight_scale"},
      {"per channel [O, 1] BF16 into F32", DType::kF8E4M3, DType::kBF16, DType::kF32, {rows, 1}, ".weight_scale"},
      {"per tensor [] F16 into BF16", DType::kF8E4M3, DType::kF16, DType::kBF16, {}, ".scale_weight"},
      {"per tensor [1] F32 into F32, e5m2", DType::kF8E5M2, DType::kF32, DType::kF32, {1}, ".weight_scale"},
      {"no scale, e4m3 into BF16", DType::kF8E4M3, DType::kF32, DType::kBF16, {}, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const bool per_channel = c.scale_shape.numel() == rows;
    const std::vector<float> values = per_channel ? row_scales : std::vector<float>{row_scales[1]};
    NamedTensors tensors = {{"transformer_blocks.0.ff.net.2.weight", bytes_tensor(codes, {rows, cols}, c.weight)},
                            {"norm_out.norm.weight", Tensor::from_f32({1, 2}, {2})}};
    if (!c.scale_suffix.empty()) {
      tensors.emplace_back("transformer_blocks.0.ff.net.2" + c.scale_suffix,
                           scale_tensor(values, c.scale_shape, c.scale_dtype));
    }
    auto out = h3::dequantize_scaled_weights(tensors, c.into);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->size(), 2u);
    const Tensor& w = find(*out, "transformer_blocks.0.ff.net.2.weight");
    ASSERT_EQ(w.dtype(), c.into);
    ASSERT_EQ(w.shape(), Shape({rows, cols}));
    EXPECT_EQ(find(*out, "norm_out.norm.weight").data(), tensors[1].second.data()) << "passed on as it was";
    for (int64_t r = 0; r < rows; ++r) {
      float scale = c.scale_suffix.empty() ? 1.0f : values[per_channel ? r : 0];
      if (c.scale_dtype == DType::kBF16) scale = round_bf16(scale);
      if (c.scale_dtype == DType::kF16) scale = f16_bits_to_f32(f32_to_f16_bits(scale));
      for (int64_t k = 0; k < cols; ++k) {
        const uint8_t code = codes[r * cols + k];
        const float product = (c.weight == DType::kF8E4M3 ? e4m3_bits_to_f32(code) : e5m2_bits_to_f32(code)) * scale;
        const float want = c.into == DType::kF32 ? product : round_bf16(product);
        const float got = as_f32(w, r * cols + k);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << r << "," << k;
        } else {
          EXPECT_EQ(f32_bits(got), f32_bits(want)) << r << "," << k << ": code " << int(code);
        }
      }
    }
  }
}

// The patch projections and the other fp32 islands are dequantized into F32 whatever the target.
TEST(ScaledWeights, AnFp32IslandIsDequantizedIntoF32) {
  const std::vector<uint8_t> codes = random_codes(12, 3);
  const NamedTensors tensors = {{"proj_out.weight", bytes_tensor(codes, {3, 4}, DType::kF8E4M3)},
                                {"proj_out.weight_scale", Tensor::from_f32({0.013f}, {})}};
  auto out = h3::dequantize_scaled_weights(tensors, DType::kBF16);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 1u);
  const Tensor& w = (*out)[0].second;
  ASSERT_EQ(w.dtype(), DType::kF32);
  for (int i = 0; i < 12; ++i) {
    if (!std::isnan(e4m3_bits_to_f32(codes[i]))) EXPECT_EQ(w.data_as<float>()[i], e4m3_bits_to_f32(codes[i]) * 0.013f);
  }
}

TEST(ScaledWeights, SideTensorsAreReadPastAndTheRestIsRefusedByName) {
  const Tensor w8 = bytes_tensor(random_codes(6, 5), {2, 3}, DType::kF8E4M3);
  const std::string p = "transformer_blocks.1.attn.to_k";
  const NamedTensors read_past = {{p + ".weight", w8},
                                  {p + ".weight_scale", Tensor::from_f32({0.5f, 0.25f}, {2, 1})},
                                  {p + ".input_scale", Tensor::from_f32({2.0f}, {})},
                                  {p + ".comfy_quant", Tensor::zeros({5}, DType::kU8)},
                                  {"scaled_fp8", Tensor::zeros({0}, DType::kF8E4M3)}};
  auto summary = h3::check_scaled_weights(read_past);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  EXPECT_EQ(summary->fp8_weights, 1);
  EXPECT_EQ(summary->per_channel, 1);
  EXPECT_EQ(summary->side_tensors_read_past, 3);
  auto out = h3::dequantize_scaled_weights(read_past, DType::kBF16);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].first, p + ".weight");

  const Tensor bf16 = Tensor::zeros({2, 3}, DType::kBF16);
  const std::vector<std::pair<NamedTensors, std::string>> refused = {
      {{{p + ".weight_scale", Tensor::from_f32({1}, {})}},
       "'" + p + ".weight_scale' scales '" + p + ".weight', which is not in the checkpoint"},
      {{{p + ".weight", bf16}, {p + ".weight_scale", Tensor::from_f32({1}, {})}},
       "'" + p + ".weight', stored BF16: only fp8 weights"},
      {{{p + ".weight", w8}, {p + ".weight_scale", Tensor::from_f32({1, 2, 3}, {3})}},
       "'" + p + ".weight_scale': shape [3] scales neither the whole of '" + p + ".weight' [2, 3]"},
      {{{p + ".weight", w8}, {p + ".weight_scale", Tensor::zeros({2}, DType::kI8)}},
       "'" + p + ".weight_scale': dtype I8 is not a scale's"},
      {{{p + ".weight", w8}, {p + ".weight_scale", Tensor::from_f32({1}, {})}, {p + ".scale_weight", Tensor::from_f32({1}, {})}},
       "'" + p + ".weight' has two scales"},
      {{{p + ".weight", Tensor::zeros({2, 8}, DType::kU8)}, {p + ".weight_scale_2", Tensor::from_f32({1}, {})}},
       "'" + p + ".weight' is stored U8, which only an NVFP4 weight is here, and it lacks '" + p + ".weight_scale'"},
      {{{p + ".weight", w8}, {p + ".weight_scale_2", Tensor::from_f32({1}, {})}},
       "'" + p + ".weight_scale_2': a second-level scale belongs to an NVFP4 weight (U8)"},
  };
  for (const auto& [tensors, needle] : refused) {
    const auto status = h3::dequantize_scaled_weights(tensors, DType::kBF16).status();
    EXPECT_FALSE(status.ok()) << needle;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status.message();
  }
  EXPECT_FALSE(h3::dequantize_scaled_weights(read_past, DType::kF16).ok());
}

// What makes an fp8 checkpoint as good as its source under the fp8 recipe: its weights dequantized
// to bf16 (as generate loads them) and quantized again by the recipe are the codes and scales the
// recipe makes from the source, bit for bit, on every kind of row.
TEST(ScaledWeights, TheFp8RecipeGetsBackItsOwnWeights) {
  const int64_t rows = 96, cols = 333;
  std::vector<float> values(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r % 48) - 30);  // 2^-30 .. 2^17
    for (int64_t k = 0; k < cols; ++k) {
      float v = normal_at(7, 1, static_cast<uint64_t>(r * cols + k)) * magnitude;
      if (r % 5 == 1 && k == r % cols) v *= 900.0f;   // one outlier: most of the row in e4m3 subnormals
      if (r % 7 == 2) v = 0.0f;                        // an all-zero row
      if (r % 11 == 3 && k % 3) v = 0.0f;              // sparse
      values[r * cols + k] = v;
    }
  }
  for (const DType source_dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(source_dtype));
    Tensor source = Tensor::from_f32(values, {rows, cols});
    if (source_dtype == DType::kBF16) source = *source.to(DType::kBF16);
    const std::string name = "transformer_blocks.2.attn.to_v.weight";
    auto quantized = h3::quantize_linears_fp8({{name, source}});
    ASSERT_TRUE(quantized.ok()) << quantized.status().to_string();
    ASSERT_EQ(quantized->size(), 2u);
    EXPECT_EQ(find(*quantized, name).dtype(), DType::kF8E4M3);
    EXPECT_EQ(find(*quantized, "transformer_blocks.2.attn.to_v.weight_scale").shape(), Shape({rows}));
    auto loaded = h3::dequantize_scaled_weights(*quantized, DType::kBF16);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    auto again = cpu::quantize_weight_fp8(find(*loaded, name).view());
    auto direct = cpu::quantize_weight_fp8((*source.to(DType::kBF16)).view());
    ASSERT_TRUE(again.ok() && direct.ok());
    EXPECT_EQ(std::memcmp(again->codes.data(), direct->codes.data(), direct->codes.nbytes()), 0) << "codes";
    EXPECT_EQ(std::memcmp(again->scales.data(), direct->scales.data(), direct->scales.nbytes()), 0) << "scales";
  }
  // Only the linears the recipe quantizes per channel; its block-scaled out projection stays.
  EXPECT_TRUE(h3::is_fp8_channel_quantized_linear("transformer_blocks.0.ff.net.0.proj.weight"));
  EXPECT_FALSE(h3::is_fp8_channel_quantized_linear("transformer_blocks.0.attn.to_out.0.weight"));
  EXPECT_FALSE(h3::is_fp8_channel_quantized_linear("transformer_blocks.0.adaln_proj.linear.weight"));
  EXPECT_FALSE(h3::is_fp8_channel_quantized_linear("token_refiner.refiner_blocks.0.attn.to_q.weight"));
  // The original layout's fused QKV and FC1, and its FC2.
  EXPECT_TRUE(h3::is_fp8_channel_quantized_linear("blocks.3.attn.qkv_proj.weight"));
  EXPECT_TRUE(h3::is_fp8_channel_quantized_linear("blocks.3.mlp.fc1.weight"));
  EXPECT_TRUE(h3::is_fp8_channel_quantized_linear("blocks.3.mlp.fc2.weight"));
  EXPECT_FALSE(h3::is_fp8_channel_quantized_linear("blocks.3.attn.o_proj.weight"));
}

// An original-layout checkpoint whose fused, per-head-interleaved qkv_proj and [gate; value]
// mlp.fc1 carry one scale per stored row: the scales follow the rows through the layout conversion,
// so the model loads the weights of the same checkpoint written dequantized.
TEST(ScaledWeights, PerChannelScalesFollowTheOriginalLayoutsRows) {
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("small");
  h3::CheckpointWriteOptions options;
  options.layout = h3::CheckpointLayout::kOriginal;
  ASSERT_TRUE(h3::write_synthetic_checkpoint(tmp.file("o"), config, DType::kBF16, 4, options).ok());
  auto checkpoint = ShardedCheckpoint::open(tmp.file("o"));
  ASSERT_TRUE(checkpoint.ok());
  auto stored = h3::read_all(*checkpoint);
  ASSERT_TRUE(stored.ok());
  NamedTensors quantized, dequantized;
  int scaled = 0;
  for (const auto& [name, tensor] : *stored) {
    const bool fused = name.ends_with(".attn.qkv_proj.weight") || name.ends_with(".mlp.fc1.weight");
    if (!fused || !name.starts_with("blocks.")) {
      quantized.emplace_back(name, tensor);
      dequantized.emplace_back(name, tensor);
      continue;
    }
    auto rows = cpu::quantize_weight_fp8(tensor.view());
    ASSERT_TRUE(rows.ok());
    quantized.emplace_back(name, rows->codes);
    quantized.emplace_back(name.substr(0, name.size() - 7) + ".weight_scale", rows->scales);
    auto back = h3::dequantize_scaled_weights({{name, rows->codes}, {name + "_scale", rows->scales}}, DType::kBF16);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    dequantized.emplace_back(name, (*back)[0].second);
    ++scaled;
  }
  EXPECT_EQ(scaled, 2 * config.num_layers);
  const std::map<std::string, std::string> metadata = {{"config", config.to_json_string()}};
  ASSERT_TRUE(write_safetensors(tmp.file("q.safetensors"), quantized, metadata).ok());
  ASSERT_TRUE(write_safetensors(tmp.file("d.safetensors"), dequantized, metadata).ok());
  auto from_fp8 = h3::load_model(tmp.file("q.safetensors"), DType::kBF16);
  auto from_bf16 = h3::load_model(tmp.file("d.safetensors"), DType::kBF16);
  ASSERT_TRUE(from_fp8.ok()) << from_fp8.status().to_string();
  ASSERT_TRUE(from_bf16.ok()) << from_bf16.status().to_string();
  EXPECT_EQ(from_fp8->layout, h3::CheckpointLayout::kOriginal);
  for (int b = 0; b < config.num_layers; ++b) {
    for (auto part : {&h3::BlockWeights::qkv, &h3::BlockWeights::fc1}) {
      const Tensor& got = (from_fp8->weights.blocks[b].*part).weight;
      const Tensor& want = (from_bf16->weights.blocks[b].*part).weight;
      ASSERT_EQ(got.nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0) << "block " << b;
    }
  }
}

// The CLI end to end: convert --quantize fp8 writes what inspect describes, in either layout;
// generate from it gives the bits of generate from the same weights converted back (dequantized) in
// either layout.
TEST(CliFp8Checkpoint, GenerateRunsTheDequantizedWeights) {
  TempDir tmp;
  ASSERT_EQ(run_cli("convert --synthetic --preset small --out " + q(tmp.file("src"))).code, 0);
  const CliRun quantize = run_cli("convert --in " + q(tmp.file("src")) + " --to diffusers --quantize fp8 --out " +
                                  q(tmp.file("fp8")));
  ASSERT_EQ(quantize.code, 0) << quantize.err;
  EXPECT_NE(quantize.out.find("fp8: each transformer block's to_q"), std::string::npos) << quantize.out;
  const CliRun inspect = run_cli("inspect " + q(tmp.file("fp8")));
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("fp8         15 weights (15 with one scale per output channel"), std::string::npos)
      << inspect.out;
  for (const char* layout : {"diffusers", "original"}) {
    const CliRun back = run_cli("convert --in " + q(tmp.file("fp8")) + " --to " + layout + " --out " +
                                q(tmp.file(std::string("bf16-") + layout)));
    ASSERT_EQ(back.code, 0) << back.err;
  }
  // The original layout written fp8: the fused qkv_proj and mlp.fc1 rows carry their parts' codes
  // and scales, so it loads into the same weights.
  const CliRun original = run_cli("convert --in " + q(tmp.file("src")) + " --to original --quantize fp8 --out " +
                                  q(tmp.file("fp8-original")));
  ASSERT_EQ(original.code, 0) << original.err;
  EXPECT_NE(original.out.find("ff.net.2 (qkv_proj, mlp.fc1, mlp.fc2) in e4m3"), std::string::npos) << original.out;
  const CliRun original_inspect = run_cli("inspect " + q(tmp.file("fp8-original")));
  ASSERT_EQ(original_inspect.code, 0) << original_inspect.err;
  EXPECT_NE(original_inspect.out.find("fp8         9 weights (9 with one scale per output channel"), std::string::npos)
      << original_inspect.out;
  const std::string request = " --height 128 --width 192 --frames 22 --steps 2 --text-tokens 4 --seed 5 --out ";
  std::map<std::string, std::string> latents;
  for (const std::string model : {"fp8", "fp8-original", "bf16-diffusers", "bf16-original"}) {
    const CliRun run = run_cli("generate --model " + q(tmp.file(model)) + request + q(tmp.file("g-" + model)));
    ASSERT_EQ(run.code, 0) << run.err;
    latents[model] = test_util::latent_checksum_lines(run);
  }
  EXPECT_EQ(latents["fp8"], latents["bf16-diffusers"]);
  EXPECT_EQ(latents["fp8"], latents["bf16-original"]);
  EXPECT_EQ(latents["fp8"], latents["fp8-original"]);

  const CliRun int4 = run_cli("convert --in " + q(tmp.file("src")) + " --to diffusers --quantize int4 --out " +
                              q(tmp.file("x")));
  EXPECT_NE(int4.code, 0);
  EXPECT_NE(int4.err.find("--quantize: int4 not in {fp8}"), std::string::npos) << int4.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("x")));
}

}  // namespace
}  // namespace vortex
