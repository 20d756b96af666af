// LoRA adapters: bad files refused by name (one line naming the file and the tensor or field),
// the alphas a file records, and the merge's arithmetic. Parity with diffusers on every layout:
// test_h3_lora_golden.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "models/h3/lora.h"
#include "models/h3/synthetic.h"
#include "models/h3/weights.h"
#include "must.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

using test::must;

// Small files written by the tests against the "small" preset; bad ones give one error naming the
// file and the tensor or field.
class H3LoraFile : public testing::Test {
 protected:
  h3::H3Config config = must(h3::config_preset("small"));  // hidden 48, inner 72, ffn 64, 3 blocks
  test_util::TempDir dir;

  Tensor matrix(int64_t rows, int64_t cols, float value = 0.01f) {
    return Tensor::from_f32(std::vector<float>(rows * cols, value), {rows, cols});
  }
  Tensor vector(int64_t n, float value = 0.5f) { return Tensor::from_f32(std::vector<float>(n, value), {n}); }
  std::string write(const h3::NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {}) {
    const std::string path = dir.file("lora" + std::to_string(count++) + ".safetensors");
    must(write_safetensors(path, tensors, metadata));
    return path;
  }
  // A valid diffusers-named pair for block 0's to_q (in 48, out 72), rank 2.
  h3::NamedTensors to_q(const std::string& prefix = "transformer.") {
    return {{prefix + "transformer_blocks.0.attn.to_q.lora_A.weight", matrix(2, 48)},
            {prefix + "transformer_blocks.0.attn.to_q.lora_B.weight", matrix(72, 2)}};
  }
  void expect_error(const std::string& path, const std::string& needle) {
    auto read = h3::read_lora(path, config);
    ASSERT_FALSE(read.ok()) << needle;
    const std::string message = read.status().message();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << "expected '" << needle << "' in: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  int count = 0;
};

TEST_F(H3LoraFile, ValidFilesRead) {
  EXPECT_TRUE(h3::read_lora(write(to_q()), config).ok());
  EXPECT_TRUE(h3::read_lora(write(to_q("")), config).ok());  // bare diffusers names
  auto ref = h3::read_lora(write(to_q("transformer_ref.")), config);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EXPECT_EQ(ref->partition, "transformer_ref");
}

TEST_F(H3LoraFile, EachProblemIsNamed) {
  expect_error(dir.file("missing.safetensors"), "missing.safetensors");
  test_util::write_bytes(dir.file("garbage.safetensors"), "not a safetensors file");
  expect_error(dir.file("garbage.safetensors"), "garbage.safetensors");
  expect_error(write({}), "holds no tensors");

  // DoRA magnitudes and lora_B biases: vectors of the linear's width, a bias only where the linear
  // has one; kohya's dora_scale and the original layouts' magnitudes and biases refused.
  auto dora = to_q();
  dora.push_back({"transformer.transformer_blocks.0.attn.to_q.lora_magnitude_vector", matrix(1, 72)});
  expect_error(write(dora), "expected a vector");
  dora.back().second = vector(70);
  expect_error(write(dora), "its lora_magnitude_vector [70] does not fit");
  auto bias = to_q();
  bias.push_back({"transformer.transformer_blocks.0.attn.to_q.lora_B.bias", vector(72)});
  expect_error(write(bias), "has no bias in this model");
  auto kohya_dora = to_q();
  kohya_dora.push_back({"transformer.transformer_blocks.0.attn.to_q.dora_scale", matrix(72, 1)});
  expect_error(write(kohya_dora), "dora_scale");
  expect_error(write({{"blocks.0.attn.out_proj.lora_A.weight", matrix(2, 72)},
                      {"blocks.0.attn.out_proj.lora_B.weight", matrix(48, 2)},
                      {"blocks.0.attn.out_proj.lora_magnitude_vector", vector(48)}}),
               "DoRA magnitudes in the original checkpoint's names");
  expect_error(write({{"final_layer.video_out.lora_down.weight", matrix(2, 48)},
                      {"final_layer.video_out.lora_up.weight", matrix(16, 2)},
                      {"final_layer.video_out.lora_up.bias", vector(16)}}),
               "LoRA biases in the original checkpoint's names");

  auto both = to_q();
  for (auto& t : to_q("transformer_ref.")) both.push_back(t);
  expect_error(write(both), "both partitions");
  auto half = to_q();
  half.pop_back();
  expect_error(write(half), "has no lora_B weight");
  auto alpha = to_q();
  alpha.push_back({"transformer.transformer_blocks.0.attn.to_q.alpha", Tensor::from_f32({4.0f}, {1})});
  expect_error(write(alpha), "is none of a module's lora_A / lora_B weight");

  expect_error(write({{"transformer.transformer_blocks.7.attn.to_q.lora_A.weight", matrix(2, 48)},
                      {"transformer.transformer_blocks.7.attn.to_q.lora_B.weight", matrix(72, 2)}}),
               "does not have");
  expect_error(write({{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", matrix(2, 48)},
                      {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", matrix(72, 3)}}),
               "do not fit");
  expect_error(write({{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", matrix(2, 40)},
                      {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", matrix(72, 2)}}),
               "do not fit");
  expect_error(write({{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", matrix(2, 48, NAN)},
                      {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", matrix(72, 2)}}),
               "not finite");
}

TEST_F(H3LoraFile, OriginalLayoutsNameWhatTheyCannotPlace) {
  // Original names: a leftover tensor, a qkv of the wrong width, a down factor without its up.
  expect_error(write({{"blocks.0.attn.qkv_proj.lora_A.weight", matrix(2, 48)},
                      {"blocks.0.attn.qkv_proj.lora_B.weight", matrix(216, 2)},
                      {"blocks.0.attn.rope.lora_A.weight", matrix(2, 48)}}),
               "blocks.0.attn.rope.lora_A.weight");
  expect_error(write({{"diffusion_model.blocks.0.attn.qkv_proj.lora_down.weight", matrix(2, 48)},
                      {"diffusion_model.blocks.0.attn.qkv_proj.lora_up.weight", matrix(72, 2)}}),
               "fused QKV");
  expect_error(write({{"blocks.0.mlp.fc1.lora_A.weight", matrix(2, 48)}}), "has no 'blocks.0.mlp.fc1.lora_B.weight'");
  expect_error(
      write({{"blocks.0.mlp.fc1.lora_A.weight", matrix(2, 48)}, {"blocks.0.mlp.fc1.lora_B.weight", matrix(100, 2)}}),
      "SwiGLU");
  expect_error(write({{"lora_unet_blocks_0_attn_rope.lora_down.weight", matrix(2, 48)}}), "musubi");
  expect_error(write({{"blocks.0.attn.out_proj.lora_down.weight", matrix(2, 72)},
                      {"blocks.0.attn.out_proj.lora_up.weight", matrix(48, 2)},
                      {"blocks.0.attn.out_proj.alpha", Tensor::from_f32({-1.0f}, {1})}}),
               "not a positive number");
  // The refiner has no AdaLN projection.
  expect_error(write({{"token_refiner.blocks.0.adaln_proj.linear.lora_A.weight", matrix(2, 24)},
                      {"token_refiner.blocks.0.adaln_proj.linear.lora_B.weight", matrix(864, 2)}}),
               "token_refiner.blocks.0.adaln_proj.linear");
}

TEST_F(H3LoraFile, MetadataAlphas) {
  // Not a number: the reference loads it at alpha == rank with a warning; so do we.
  auto odd = h3::read_lora(write(to_q(), {{"alpha", "eight"}}), config);
  ASSERT_TRUE(odd.ok()) << odd.status().to_string();
  EXPECT_DOUBLE_EQ(odd->modules[0].scale, 1.0);
  ASSERT_EQ(odd->warnings.size(), 1u);
  EXPECT_NE(odd->warnings[0].find("'eight'"), std::string::npos);
  expect_error(write(to_q(), {{"alpha", "-2"}}), "not a positive number");
  auto half = h3::read_lora(write(to_q(), {{"alpha", "1"}}), config);
  ASSERT_TRUE(half.ok());
  EXPECT_DOUBLE_EQ(half->modules[0].scale, 0.5);

  expect_error(write(to_q(), {{"lora_adapter_metadata", "{not json"}}), "not a JSON object");
  // The config's DoRA and bias flags must describe the tensors (peft would build the adapter from it).
  expect_error(write(to_q(), {{"lora_adapter_metadata", R"({"transformer.r": 2, "transformer.use_dora": true})"}}),
               "use_dora true but module 'transformer_blocks.0.attn.to_q' has no lora_magnitude_vector");
  auto dora = to_q();
  dora.push_back({"transformer.transformer_blocks.0.attn.to_q.lora_magnitude_vector", vector(72)});
  expect_error(write(dora, {{"lora_adapter_metadata", R"({"transformer.r": 2})"}}), "use_dora false");
  EXPECT_TRUE(
      h3::read_lora(write(dora, {{"lora_adapter_metadata", R"({"transformer.r": 2, "transformer.use_dora": true})"}}),
                    config)
          .ok());
  const h3::NamedTensors biased = {{"transformer.context_embedder.lora_A.weight", matrix(2, config.text_dim)},
                                   {"transformer.context_embedder.lora_B.weight", matrix(48, 2)},
                                   {"transformer.context_embedder.lora_B.bias", vector(48)}};
  expect_error(write(biased, {{"lora_adapter_metadata", R"({"transformer.r": 2})"}}), "lora_bias false");
  auto dora_and_bias = biased;
  dora_and_bias.push_back({"transformer.context_embedder.lora_magnitude_vector", vector(48)});
  expect_error(write(dora_and_bias), "peft refuses lora_bias with use_dora");
  EXPECT_TRUE(
      h3::read_lora(write(biased, {{"lora_adapter_metadata", R"({"transformer.r": 2, "transformer.lora_bias": true})"}}),
                    config)
          .ok());
  expect_error(write(to_q(), {{"lora_adapter_metadata", R"({"transformer.r": 4, "transformer.lora_alpha": 4})"}}),
               "rank 2 but lora_adapter_metadata gives it 4");
  expect_error(write(to_q(), {{"lora_adapter_metadata", R"({"transformer.lora_alpha": 4})"}}), "transformer.r");
  expect_error(
      write(to_q(), {{"lora_adapter_metadata", R"({"transformer.r": 2, "transformer.alpha_pattern": {"to_q(": 1}})"}}),
      "not a regular expression");
  // The adapter's config is read under its partition's prefix.
  auto ref =
      h3::read_lora(write(to_q("transformer_ref."),
                          {{"lora_adapter_metadata", R"({"transformer_ref.r": 2, "transformer_ref.lora_alpha": 3})"}}),
                    config);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EXPECT_DOUBLE_EQ(ref->modules[0].scale, 1.5);
}

// An adapter given where a checkpoint goes is named as one.
TEST(H3LoraAsModel, IsRefusedAsAnAdapter) {
  for (const std::string name :
       {"blocks.0.attn.qkv_proj.lora_A.weight", "transformer.proj_out.lora_B.weight",
        "diffusion_model.blocks.0.mlp.fc1.lora_down.weight", "lora_unet_condition_proj.alpha"}) {
    auto layout = h3::detect_layout({"proj_in.weight", name});
    ASSERT_FALSE(layout.ok()) << name;
    EXPECT_NE(layout.status().message().find("with --lora"), std::string::npos) << layout.status().message();
  }
}

// Files of names from every layout's vocabulary, mixed, with shapes that fit or not (including
// vectors and scalars): each is read or refused in one line, never a crash.
TEST_F(H3LoraFile, MixedUpFilesAreReadOrRefusedNeverCrash) {
  const std::vector<std::string> prefixes = {"", "transformer.", "transformer_ref.", "diffusion_model.", "lora_unet_"};
  const std::vector<std::string> modules = {
      "transformer_blocks.0.attn.to_q", "transformer_blocks.2.ff.net.0.proj", "blocks.0.attn.qkv_proj",
      "blocks.1.mlp.fc1", "blocks.2.adaln_proj.linear", "token_refiner.blocks.1.attn.out_proj", "final_layer.video_out",
      "blocks_0_attn_qkv_proj", "time_embedder.proj_in", "proj_out", "blocks.9.mlp.fc2"};
  const std::vector<std::string> suffixes = {".lora_A.weight", ".lora_B.weight", ".lora_down.weight", ".lora_up.weight",
                                             ".lora_A.default.weight", ".alpha", ".weight", ".lora_B.bias",
                                             ".lora_magnitude_vector", ".dora_scale"};
  const std::vector<Shape> shapes = {{2, 48}, {72, 2}, {216, 2}, {128, 2}, {2, 24}, {864, 2}, {96, 2}, {2, 72},
                                     {1}, {}, {3}, {2, 2, 2}, {72}, {48}};
  std::mt19937 rng(51);
  int read = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    // Half start from a valid pair, some of them with nothing added.
    h3::NamedTensors tensors = rng() % 2 == 0 ? to_q(prefixes[rng() % 3]) : h3::NamedTensors{};
    const int count = static_cast<int>(rng() % (tensors.empty() ? 6 : 3)) + (tensors.empty() ? 1 : 0);
    for (int t = 0; t < count; ++t) {
      const std::string name = prefixes[rng() % prefixes.size()] + modules[rng() % modules.size()] +
                               suffixes[rng() % suffixes.size()];
      if (std::any_of(tensors.begin(), tensors.end(), [&](const auto& e) { return e.first == name; })) continue;
      const Shape& shape = shapes[rng() % shapes.size()];
      tensors.push_back({name, Tensor::from_f32(std::vector<float>(shape.numel(), 0.5f), shape)});
    }
    const std::map<std::string, std::string> metadata =
        rng() % 3 == 0 ? std::map<std::string, std::string>{{"alpha", "2"}} : std::map<std::string, std::string>{};
    auto lora = h3::read_lora(write(tensors, metadata), config);
    if (lora.ok()) {
      ++read;
      h3::NamedTensors weights = must(h3::synthetic_weights(config, DType::kBF16, 1));
      EXPECT_TRUE(h3::merge_loras(weights, {{&*lora, 1.0}}, DType::kBF16).ok());
    } else {
      ++refused;
      EXPECT_EQ(lora.status().message().find('\n'), std::string::npos) << lora.status().message();
    }
  }
  EXPECT_GT(read, 0);
  EXPECT_GT(refused, 0);
}

// The synthetic weights with a LoRA merged: only the targeted weight changes, by strength * B·A.
TEST_F(H3LoraFile, AMergeAddsStrengthTimesTheProduct) {
  const h3::LoraAdapter adapter = must(h3::read_lora(write(to_q()), config));
  h3::NamedTensors tensors = must(h3::synthetic_weights(config, DType::kF32, 3));
  const h3::NamedTensors base = tensors;
  must(h3::merge_loras(tensors, {{&adapter, 2.0}}, DType::kF32));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].first != "transformer_blocks.0.attn.to_q.weight") {
      EXPECT_EQ(tensors[i].second.data(), base[i].second.data()) << tensors[i].first;
      continue;
    }
    // Every element: w + 2 * (0.01 * 0.01 + 0.01 * 0.01).
    const float* w = base[i].second.data_as<const float>();
    const float* m = tensors[i].second.data_as<const float>();
    const float delta = 2.0f * std::fma(0.01f, 0.01f, 0.01f * 0.01f);
    for (int64_t k = 0; k < tensors[i].second.numel(); ++k) ASSERT_EQ(m[k], w[k] + delta) << k;
  }
}

// A plain module with a lora_B bias, then a DoRA module, on the context embedder: the merge against
// the arithmetic in lora.h done here in double (peft's forward is the golden test's).
TEST_F(H3LoraFile, DoraScalesTheSumSoFarAndBiasesAddUp) {
  h3::NamedTensors tensors = must(h3::synthetic_weights(config, DType::kF32, 4));
  const h3::NamedTensors base = tensors;
  auto find = [&](const h3::NamedTensors& from, const std::string& name) {
    return std::find_if(from.begin(), from.end(), [&](const auto& e) { return e.first == name; })->second;
  };
  const Tensor w = find(base, "context_embedder.weight"), b = find(base, "context_embedder.bias");
  const int64_t out = w.size(0), in = w.size(1);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  auto random = [&](Shape shape) {
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    for (float& x : v) x = normal(rng);
    return Tensor::from_f32(v, shape);
  };
  h3::LoraAdapter plain, dora;
  plain.modules.push_back({"context_embedder", "plain", random({2, in}), random({out, 2}), {}, random({out}), 0.5});
  Tensor magnitude = random({out});
  for (int64_t r = 0; r < out; ++r) magnitude.data_as<float>()[r] = std::abs(magnitude.data_as<float>()[r]) + 0.5f;
  dora.modules.push_back({"context_embedder", "dora", random({1, in}), random({out, 1}), magnitude, {}, 2.0});
  const double s_plain = 0.8 * 0.5, s_dora = -1.5 * 2.0;
  must(h3::merge_loras(tensors, {{&plain, 0.8}, {&dora, -1.5}}, DType::kF32));

  const h3::LoraModule &p = plain.modules[0], &d = dora.modules[0];
  auto at = [](const Tensor& t, int64_t i) { return static_cast<double>(t.data_as<const float>()[i]); };
  const Tensor merged_w = find(tensors, "context_embedder.weight"), merged_b = find(tensors, "context_embedder.bias");
  for (int64_t r = 0; r < out; ++r) {
    std::vector<double> sum(static_cast<size_t>(in)), own(sum.size());
    double norm = 0.0;
    for (int64_t c = 0; c < in; ++c) {
      double plain_delta = 0.0, dora_delta = 0.0;
      for (int64_t k = 0; k < 2; ++k) plain_delta += at(p.up, r * 2 + k) * at(p.down, k * in + c);
      dora_delta = at(d.up, r) * at(d.down, c);
      sum[c] = at(w, r * in + c) + s_plain * plain_delta;
      own[c] = s_dora * dora_delta;
      norm += (at(w, r * in + c) + own[c]) * (at(w, r * in + c) + own[c]);
    }
    const double f = at(d.magnitude, r) / std::sqrt(norm);
    for (int64_t c = 0; c < in; ++c) {
      const double want = f * (sum[c] + own[c]);
      ASSERT_NEAR(at(merged_w, r * in + c), want, 1e-5 * std::max(1.0, std::abs(want))) << r << ", " << c;
    }
    const double want_bias = at(b, r) + f * s_plain * at(p.bias, r);
    ASSERT_NEAR(at(merged_b, r), want_bias, 1e-5 * std::max(1.0, std::abs(want_bias))) << r;
  }
  // Every other tensor is untouched.
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].first.starts_with("context_embedder.")) EXPECT_EQ(tensors[i].second.data(), base[i].second.data());
  }
  // A DoRA row that cannot be scaled is an error naming the module and the row.
  h3::NamedTensors zero = base;
  for (auto& [name, t] : zero) {
    if (name == "context_embedder.weight") t = Tensor::zeros(t.shape(), DType::kF32);
  }
  h3::LoraAdapter flat;
  flat.modules.push_back({"context_embedder", "flat", Tensor::zeros({1, in}, DType::kF32), random({out, 1}),
                          magnitude, {}, 1.0});
  const Status s = h3::merge_loras(zero, {{&flat, 1.0}}, DType::kF32);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("DoRA module 'flat': row 0 of 'context_embedder.weight'"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace vortex
