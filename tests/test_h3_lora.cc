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

  auto dora = to_q();
  dora.push_back({"transformer.transformer_blocks.0.attn.to_q.lora_magnitude_vector", matrix(1, 72)});
  expect_error(write(dora), "DoRA");
  auto bias = to_q();
  bias.push_back({"transformer.transformer_blocks.0.attn.to_q.lora_B.bias", matrix(1, 72)});
  expect_error(write(bias), "biases");

  auto both = to_q();
  for (auto& t : to_q("transformer_ref.")) both.push_back(t);
  expect_error(write(both), "both partitions");
  auto half = to_q();
  half.pop_back();
  expect_error(write(half), "has only its lora_A");
  auto alpha = to_q();
  alpha.push_back({"transformer.transformer_blocks.0.attn.to_q.alpha", Tensor::from_f32({4.0f}, {1})});
  expect_error(write(alpha), "neither a lora_A nor a lora_B");

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
  expect_error(write(to_q(), {{"lora_adapter_metadata", R"({"transformer.r": 2, "transformer.use_dora": true})"}}),
               "DoRA");
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
                                             ".lora_A.default.weight", ".alpha", ".weight"};
  const std::vector<Shape> shapes = {{2, 48}, {72, 2}, {216, 2}, {128, 2}, {2, 24}, {864, 2}, {96, 2}, {2, 72},
                                     {1}, {}, {3}, {2, 2, 2}};
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

}  // namespace
}  // namespace vortex
