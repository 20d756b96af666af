// The t2va, fl2va and ref2va loops on the GPU: the same request as on the CPU gives nearby latents, and the
// GPU run is reproducible bit for bit.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <functional>

#include "h3_golden_util.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/generate.h"

namespace vortex {
namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

using Run = std::function<Result<h3::GenerateResult>(h3::StepModel&, const Tensor& text)>;

// h3_small on the GPU (room for `rows` packed rows) twice, then on the CPU in bf16; `what` names
// the request in the printed errors.
void expect_gpu_repeats_and_matches_cpu(const char* what, int64_t rows, const Run& run) {
  auto config = h3::config_from_file(test::golden_path("h3_small/config.json"));
  ASSERT_TRUE(config.ok());
  auto checkpoint = ShardedCheckpoint::open(test::golden_path("h3_small/diffusers.safetensors"));
  ASSERT_TRUE(checkpoint.ok());
  auto tensors = h3::read_all(*checkpoint);
  ASSERT_TRUE(tensors.ok());
  const Tensor text = h3::seeded_normal({12, config->text_dim}, 3, h3::kSyntheticTextStream);

  auto gpu = h3::CudaH3Transformer::create(*config, h3::host_weight_filler(*tensors, nullptr), rows);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto a = run(**gpu, text);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = run(**gpu, text);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(h3::latent_checksum(a->video_latents).sha256, h3::latent_checksum(b->video_latents).sha256);
  EXPECT_EQ(h3::latent_checksum(a->audio_latents).sha256, h3::latent_checksum(b->audio_latents).sha256);

  auto weights = h3::assemble_weights(*tensors, *config, DType::kBF16);
  ASSERT_TRUE(weights.ok());
  auto cpu = h3::H3Transformer::create(std::move(*weights));
  ASSERT_TRUE(cpu.ok());
  h3::CpuStepModel cpu_model(**cpu);
  auto c = run(cpu_model, text);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const double video = test::rel_l2(a->video_latents, c->video_latents);
  const double audio = test::rel_l2(a->audio_latents, c->audio_latents);
  std::printf("4-forward %s, GPU vs CPU (bf16): video latents rel-L2 %.3e, audio %.3e\n", what, video, audio);
  EXPECT_LE(video, 2e-2);
  EXPECT_LE(audio, 2e-2);
}

h3::GenerateOptions small_request() {
  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 5;
  options.seed = 9;
  return options;
}

TEST(GpuH3Generate, MatchesTheCpuLoopAndRepeatsBitForBit) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  expect_gpu_repeats_and_matches_cpu("t2va", 254, [](h3::StepModel& model, const Tensor& text) {
    return h3::generate_t2va(model, text, small_request());
  });
}

// fl2va: the keyframe rows ride through every forward unstepped.
TEST(GpuH3Generate, KeyframesMatchTheCpuLoopAndRepeatBitForBit) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::vector<int32_t> tags(12, h3::kTextTag);
  for (int i = 2; i < 7; ++i) tags[i] = h3::kVideoTag;
  const std::vector<h3::Keyframe> keyframes = {
      {h3::seeded_normal({24, 1, 8, 12}, 4, 9), h3::KeyframeAnchor::kFirst},
      {h3::seeded_normal({24, 1, 8, 12}, 5, 9), h3::KeyframeAnchor::kLast}};
  expect_gpu_repeats_and_matches_cpu("fl2va (2 keyframes)", 254 + 48,
                                     [&](h3::StepModel& model, const Tensor& text) {
                                       return h3::generate_fl2va(model, text, tags, keyframes, small_request());
                                     });
}

// ref2va: an image, an audio reference and a video with a soundtrack, each of its own size; the
// reference rows (video ones noised, soundtracks clean at t = 1) ride through every forward unstepped.
TEST(GpuH3Generate, ReferencesMatchTheCpuLoopAndRepeatBitForBit) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::vector<int32_t> tags(12, h3::kTextTag);
  for (int i = 2; i < 7; ++i) tags[i] = h3::kVideoTag;
  using K = h3::ReferenceKind;
  const std::vector<h3::Reference> references = {
      {K::kImage, h3::seeded_normal({24, 1, 6, 10}, 4, 9), Tensor()},
      {K::kAudio, Tensor(), h3::seeded_normal({18, 32}, 4, 10)},
      {K::kVideo, h3::seeded_normal({24, 2, 4, 6}, 5, 9), h3::seeded_normal({10, 32}, 5, 10)}};
  // 15 image rows, 18 audio-reference rows, 10 soundtrack rows and 12 video-reference rows.
  expect_gpu_repeats_and_matches_cpu("ref2va (image, audio, video with sound)", 254 + 55,
                                     [&](h3::StepModel& model, const Tensor& text) {
                                       return h3::generate_ref2va(model, text, tags, references, small_request());
                                     });
}

}  // namespace
}  // namespace vortex
