// The fp8 recipe in the CUDA model: a 2048-wide, 2-block model with the released head shape and
// the same synthetic weights under both recipes; the fp8 forward stays within the stated bound of
// the bf16 forward, repeats bit for bit, and leaves the bf16 path untouched. Widths that
// cuBLASLt's fp8 GEMMs cannot take are refused when the model is created.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "gpu/gpu_test_util.h"
#include "h3_golden_util.h"
#include "h3_test_models.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/generate.h"
#include "models/h3/synthetic.h"

namespace vortex {
namespace {

// Measured on the H200 as the rel-L2 of the velocity against bf16; the bound keeps a margin.
constexpr double kFp8VelocityBound = 0.05;

h3::H3Config wide_config() { return test::released_heads_config(16, 2048, 4096, 2); }

TEST(GpuH3Fp8, ForwardStaysNearBf16AndRepeatsBitForBit) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config c = wide_config();
  const test::H3TestRequest r = test::make_h3_request(c, 16, 4, 0.4f, 0.6f);
  const h3::PackedLayout* layout = &r.layout;
  const Tensor& text = r.text;
  const h3::StepInputs& in = r.in;

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
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
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
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
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
