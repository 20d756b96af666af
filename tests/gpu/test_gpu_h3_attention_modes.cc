// Attention modes in the CUDA model: int8fp8 per request matches the CPU program's int8fp8 and
// stays close to exact; asking for it on a model created without its workspace is an error.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "gpu/gpu_test_util.h"
#include "h3_golden_util.h"
#include "h3_test_models.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/generate.h"
#include "models/h3/synthetic.h"

namespace vortex {
namespace {

// The int8fp8 kernel takes head dim 128: a two-block model with the released head shape.
h3::H3Config head128_config() { return test::released_heads_config(2, 256, 512, 2); }

TEST(GpuH3AttentionModes, Int8Fp8MatchesTheCpuProgramAndStaysNearExact) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config config = head128_config();
  ASSERT_TRUE(config.validate().ok());
  auto geometry = h3::resolve_geometry({128, 192, 22}, config);
  ASSERT_TRUE(geometry.ok());
  auto layout = h3::build_t2va_layout(16, *geometry, config);
  ASSERT_TRUE(layout.ok());
  const Tensor text = h3::seeded_normal({16, config.text_dim}, 4, h3::kSyntheticTextStream);
  h3::StepInputs in;
  in.video_rows = h3::seeded_normal({layout->num_video, config.video_patch_dim()}, 4, h3::kVideoNoiseStream);
  in.audio_rows = h3::seeded_normal({layout->num_audio, config.audio_in_channels}, 4, h3::kAudioNoiseStream);
  in.timesteps = h3::assign_row_timesteps(*layout, 0.4f, 0.6f);

  h3::CudaModelOptions options;
  options.int8fp8_attention = true;
  auto gpu = h3::CudaH3Transformer::create(config, h3::synthetic_weight_filler(5, nullptr), layout->num_rows, nullptr,
                                           options);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  ASSERT_TRUE((*gpu)->prepare(*layout, text).ok());
  auto exact = (*gpu)->forward(in);
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  in.attention.mode = h3::AttentionMode::kInt8Fp8;
  auto quantized = (*gpu)->forward(in);
  ASSERT_TRUE(quantized.ok()) << quantized.status().to_string();
  const double vs_exact = test::rel_l2(quantized->video_velocity, exact->video_velocity);

  auto tensors = h3::synthetic_weights(config, DType::kBF16, 5);
  ASSERT_TRUE(tensors.ok());
  auto weights = h3::assemble_weights(*tensors, config, DType::kBF16);
  ASSERT_TRUE(weights.ok());
  auto cpu = h3::H3Transformer::create(std::move(*weights));
  ASSERT_TRUE(cpu.ok());
  auto request = (*cpu)->prepare(*layout, text);
  ASSERT_TRUE(request.ok());
  auto cpu_out = (*cpu)->forward(*request, in);
  ASSERT_TRUE(cpu_out.ok());
  const double vs_cpu = test::rel_l2(quantized->video_velocity, cpu_out->video_velocity);
  std::printf("int8fp8 model forward: vs exact %.3e, vs CPU int8fp8 %.3e\n", vs_exact, vs_cpu);
  EXPECT_GT(vs_exact, 0.0);
  EXPECT_LE(vs_exact, 0.1);
  EXPECT_LE(vs_cpu, 2e-2);
}

TEST(GpuH3AttentionModes, Int8Fp8WithoutItsWorkspaceIsAnError) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config config = head128_config();
  auto geometry = h3::resolve_geometry({128, 192, 22}, config);
  ASSERT_TRUE(geometry.ok());
  auto layout = h3::build_t2va_layout(16, *geometry, config);
  ASSERT_TRUE(layout.ok());
  auto gpu = h3::CudaH3Transformer::create(config, h3::synthetic_weight_filler(5, nullptr), layout->num_rows);
  ASSERT_TRUE(gpu.ok());
  ASSERT_TRUE((*gpu)->prepare(*layout, h3::seeded_normal({16, config.text_dim}, 4, h3::kSyntheticTextStream)).ok());
  h3::StepInputs in;
  in.video_rows = h3::seeded_normal({layout->num_video, config.video_patch_dim()}, 4, h3::kVideoNoiseStream);
  in.audio_rows = h3::seeded_normal({layout->num_audio, config.audio_in_channels}, 4, h3::kAudioNoiseStream);
  in.timesteps = h3::assign_row_timesteps(*layout, 0.4f, 0.6f);
  in.attention.mode = h3::AttentionMode::kInt8Fp8;
  auto out = (*gpu)->forward(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vortex
