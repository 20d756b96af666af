// The fp8 recipe in the CUDA model: a 2048-wide, 2-block model with the released head shape and
// the same synthetic weights under both recipes; the fp8 forward stays within the stated bound of
// the bf16 forward, repeats bit for bit, and leaves the bf16 path untouched. Widths that
// cuBLASLt's fp8 GEMMs cannot take are refused when the model is created.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "h3_golden_util.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/generate.h"
#include "models/h3/synthetic.h"

namespace vortex {
namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Measured on the H200 as the rel-L2 of the velocity against bf16; the bound keeps a margin.
constexpr double kFp8VelocityBound = 0.05;

h3::H3Config wide_config() {
  h3::H3Config c = *h3::config_preset("h3");
  c.num_attention_heads = 16;
  c.hidden_size = 2048;
  c.num_layers = 2;
  c.num_refiner_layers = 1;
  c.ffn_dim = 4096;
  c.text_dim = 64;
  c.time_embed_hidden_dim = 256;
  c.time_embed_dim = 128;
  return c;
}

TEST(GpuH3Fp8, ForwardStaysNearBf16AndRepeatsBitForBit) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config c = wide_config();
  auto geometry = h3::resolve_geometry({128, 192, 22}, c);
  ASSERT_TRUE(geometry.ok());
  auto layout = h3::build_t2va_layout(16, *geometry, c);
  ASSERT_TRUE(layout.ok());
  const Tensor text = h3::seeded_normal({16, c.text_dim}, 4, h3::kSyntheticTextStream);
  h3::StepInputs in;
  in.video_rows = h3::seeded_normal({layout->num_video, c.video_patch_dim()}, 4, h3::kVideoNoiseStream);
  in.audio_rows = h3::seeded_normal({layout->num_audio, c.audio_in_channels}, 4, h3::kAudioNoiseStream);
  in.timesteps = h3::assign_row_timesteps(*layout, 0.4f, 0.6f);

  h3::StepOutputs out[2];
  for (h3::LinearRecipe recipe : {h3::LinearRecipe::kBf16, h3::LinearRecipe::kFp8}) {
    h3::CudaModelOptions options;
    options.recipe = recipe;
    auto model = h3::CudaH3Transformer::create(c, h3::synthetic_weight_filler(7, nullptr), layout->num_rows, nullptr,
                                               options);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    ASSERT_TRUE((*model)->prepare(*layout, text).ok());
    auto first = (*model)->forward(in);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    auto again = (*model)->forward(in);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(std::memcmp(first->video_velocity.data(), again->video_velocity.data(), first->video_velocity.nbytes()), 0)
        << "recipe " << static_cast<int>(recipe) << " is not reproducible";
    out[recipe == h3::LinearRecipe::kFp8 ? 1 : 0] = std::move(*first);
  }
  const double video = test::rel_l2(out[1].video_velocity, out[0].video_velocity);
  const double audio = test::rel_l2(out[1].audio_velocity, out[0].audio_velocity);
  std::printf("fp8 recipe vs bf16, 2-block 2048-wide forward: video velocity rel-L2 %.3e, audio %.3e\n", video, audio);
  EXPECT_GT(video, 0.0);  // the recipe really ran
  EXPECT_LE(video, kFp8VelocityBound);
  EXPECT_LE(audio, kFp8VelocityBound);
}

TEST(GpuH3Fp8, WeightsTakeAboutHalfTheBytes) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config c = wide_config();
  size_t bytes[2] = {0, 0};
  for (h3::LinearRecipe recipe : {h3::LinearRecipe::kBf16, h3::LinearRecipe::kFp8}) {
    h3::CudaModelOptions options;
    options.recipe = recipe;
    auto model = h3::CudaH3Transformer::create(c, h3::synthetic_weight_filler(7, nullptr), 64, nullptr, options);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    bytes[recipe == h3::LinearRecipe::kFp8 ? 1 : 0] = (*model)->weight_bytes();
  }
  // The block linears are most of the weights; the AdaLN projections and the rest stay bf16.
  EXPECT_LT(bytes[1], bytes[0]);
  std::printf("weights: bf16 %zu bytes, fp8 %zu bytes\n", bytes[0], bytes[1]);
}

TEST(GpuH3Fp8, RefusesWidthsTheFp8GemmCannotTake) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  auto config = h3::config_from_file(test::golden_path("h3_small/config.json"));  // inner dim 72
  ASSERT_TRUE(config.ok());
  h3::CudaModelOptions options;
  options.recipe = h3::LinearRecipe::kFp8;
  auto model = h3::CudaH3Transformer::create(*config, h3::synthetic_weight_filler(7, nullptr), 64, nullptr, options);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("inner dim"), std::string::npos) << model.status().to_string();
}

}  // namespace
}  // namespace vortex
