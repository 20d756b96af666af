// The video VAE decoder on the GPU (models/vae/cuda_video_vae.h) against the CPU decoder
// (decode_video) on the same synthetic weights and random latents: one chunk and one tile, several
// chunks with several tiles on both axes (uneven overlaps, tiles of different widths and heights),
// tiling off, odd latent sizes, non-identity latent statistics; both numeric modes and two head
// dims (32: the test preset; 64: the release's, which takes the tensor-core attention in bf16).
//
// Frames are compared after subtracting the ImageNet mean of their channel (so the bound is
// relative to the decoded signal, not to the constant offset):
//   f32:  rel-L2 <= 1e-5, max-abs <= 1e-4. The same fp32 program; GEMM and attention summation
//         order, expf and rsqrt differ (expected ~1e-6). A host replay of the plan, token gather and
//         frame composition on CPU-decoded tiles reproduced decode_video bit for bit on these
//         geometries, so anything above the bound is the GPU's arithmetic, not the layout.
//   bf16: rel-L2 <= 1e-2, max-abs <= 2e-2. A CPU emulation of the bf16 program (cpu:: ops in
//         bf16 at the same rounding points) is 2.5e-3 rel-L2 / 8e-3 max-abs from the fp32 decoder
//         output on the test preset (both head dims); the frames scale that by the ImageNet std.
//
// The canonical memory plan runs on any host (no device needed) and checks the 24 GB bound.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "models/vae/cuda_video_vae.h"

namespace vortex {
namespace {

using test::must;
using vae::CudaVideoVae;
using vae::CudaVideoVaeOptions;
using vae::VideoTiling;
using vae::VideoVaeConfig;

constexpr float kImagenetMean[3] = {0.485f, 0.456f, 0.406f};

VideoVaeConfig test_config(int head_dim) {
  VideoVaeConfig c = must(vae::video_vae_config_preset("test"));
  if (head_dim == 64) {
    c.decoder_num_attention_heads = 2;
    c.decoder_attention_head_dim = 64;
  }
  for (int i = 0; i < c.latent_channels; ++i) {
    c.latents_mean[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
    c.latents_std[i] = 0.6f + 0.03f * static_cast<float>(i % 7);
  }
  return c;
}

// Frames minus their channel's ImageNet mean.
Tensor centred(const Tensor& frames) {
  Tensor out = frames.clone();
  const int64_t per_channel = frames.numel() / frames.size(0);
  for (int64_t i = 0; i < out.numel(); ++i) out.data_as<float>()[i] -= kImagenetMean[i / per_channel % 3];
  return out;
}

VideoTiling tiles(int height, int width, int overlap_h, int overlap_w) {
  return {true, height, width, overlap_h, overlap_w};
}

VideoTiling no_tiling() {
  VideoTiling t;
  t.enabled = false;
  return t;
}

struct Geometry {
  std::string name;
  Shape latents;
  VideoTiling tiling;
};

// p = pt = 4 in the test preset: chunks of 5 latent frames + 2 overlapping, 17n + 5 output frames.
const std::vector<Geometry>& geometries() {
  static const std::vector<Geometry> kGeometries = {
      {"one chunk, one tile", {24, 7, 3, 5}, VideoTiling{}},
      {"two chunks, 2x4 tiles", {24, 12, 7, 9}, tiles(16, 12, 4, 4)},
      {"three chunks, 5x4 tiles, uneven overlaps", {24, 17, 11, 13}, tiles(16, 16, 8, 4)},
      {"three chunks, tiling off", {24, 17, 5, 6}, no_tiling()},
  };
  return kGeometries;
}

class GpuVideoVae : public testing::TestWithParam<std::tuple<int, DType>> {
 protected:
  void SetUp() override { VORTEX_REQUIRE_GPU(); }
};

TEST_P(GpuVideoVae, MatchesTheCpuDecoder) {
  const auto [head_dim, dtype] = GetParam();
  const VideoVaeConfig c = test_config(head_dim);
  const vae::VideoVae cpu = must(vae::assemble_video_vae(vae::synthetic_video_vae_tensors(c, 7), c));
  CudaVideoVaeOptions options;
  options.dtype = dtype;
  auto gpu = must(CudaVideoVae::create(cpu, options));
  const double rel_bound = dtype == DType::kF32 ? 1e-5 : 1e-2, abs_bound = dtype == DType::kF32 ? 1e-4 : 2e-2;
  uint64_t seed = 100;
  for (const Geometry& g : geometries()) {
    const std::string what = std::string(dtype_name(dtype)) + " head dim " + std::to_string(head_dim) + ", " + g.name;
    const Tensor latents = test::random_tensor(g.latents, DType::kF32, ++seed);
    const Tensor want = must(vae::decode_video(cpu, latents, g.tiling));
    const Tensor got = must(gpu->decode(latents, g.tiling));
    ASSERT_EQ(got.shape(), want.shape()) << what;
    const test::Comparison cmp = test::compare(centred(got), centred(want));
    EXPECT_EQ(cmp.nonfinite, 0) << what;
    EXPECT_LE(cmp.rel_l2, rel_bound) << what << ": " << cmp.summary();
    EXPECT_LE(cmp.max_abs, abs_bound) << what << ": " << cmp.summary();
    std::printf("video VAE %s: frames %s, rel-L2 %.3e, max-abs %.3e\n", what.c_str(), got.shape().to_string().c_str(),
                cmp.rel_l2, cmp.max_abs);
  }
}

INSTANTIATE_TEST_SUITE_P(ModesAndHeadDims, GpuVideoVae,
                         testing::Combine(testing::Values(32, 64), testing::Values(DType::kF32, DType::kBF16)),
                         [](const testing::TestParamInfo<std::tuple<int, DType>>& info) {
                           return std::string(dtype_name(std::get<1>(info.param))) + "_head_dim_" +
                                  std::to_string(std::get<0>(info.param));
                         });

TEST(GpuVideoVaeArena, RepeatedDecodesAreBitwiseAndAllocateNothing) {
  VORTEX_REQUIRE_GPU();
  const VideoVaeConfig c = test_config(32);
  const vae::VideoVae cpu = must(vae::assemble_video_vae(vae::synthetic_video_vae_tensors(c, 3), c));
  auto gpu = must(CudaVideoVae::create(cpu));
  const VideoTiling tiling = tiles(16, 12, 4, 4);
  const Tensor latents = test::random_tensor({24, 12, 7, 9}, DType::kF32, 5);
  const Tensor first = must(gpu->decode(latents, tiling));
  // The arena holds exactly the plan (up to the last buffer's rounding to the 256-byte alignment).
  const size_t peak = gpu->activation_peak_bytes();
  const size_t planned = must(vae::cuda_video_vae_memory(c, DType::kBF16, latents.shape(), tiling)).activations;
  EXPECT_LE(peak, planned);
  EXPECT_GT(peak + cuda::DeviceArena::kAlignment, planned);
  const Tensor second = must(gpu->decode(latents, tiling));
  test::expect_bitwise(test::compare(second, first), "second decode");
  // A smaller request fits the arena already made.
  must(gpu->decode(test::random_tensor({24, 7, 3, 5}, DType::kBF16, 6), tiling));
  EXPECT_EQ(gpu->activation_peak_bytes(), peak);
}

// The weights the bench hands its peer: downloaded, assembled on the host and uploaded again, they
// decode bit for bit like the synthetic model they came from (bf16 storage widens exactly).
TEST(GpuVideoVaeWeights, SyntheticWeightsRoundTripThroughTheStateDict) {
  VORTEX_REQUIRE_GPU();
  const VideoVaeConfig c = test_config(64);
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    CudaVideoVaeOptions options;
    options.dtype = dtype;
    auto synthetic = must(CudaVideoVae::create_synthetic(c, 9, options));
    const vae::NamedTensors state = must(synthetic->download_weights());
    const auto schema = vae::video_vae_decoder_schema(c);
    ASSERT_EQ(state.size(), schema.size());
    const vae::VideoVae host = must(vae::assemble_video_vae(state, c));
    auto reloaded = must(CudaVideoVae::create(host, options));
    const Tensor latents = test::random_tensor({24, 7, 4, 6}, DType::kF32, 10);
    const Tensor a = must(synthetic->decode(latents)), b = must(reloaded->decode(latents));
    test::expect_bitwise(test::compare(a, b), dtype_name(dtype));
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_TRUE(a.data_as<float>()[i] >= 0.0f && a.data_as<float>()[i] <= 1.0f);
  }
}

TEST(GpuVideoVaeInput, BadInputIsInvalidArgumentNamingTheField) {
  VORTEX_REQUIRE_GPU();
  const VideoVaeConfig c = test_config(32);
  const vae::VideoVae cpu = must(vae::assemble_video_vae(vae::synthetic_video_vae_tensors(c, 3), c));
  auto gpu = must(CudaVideoVae::create(cpu));
  const auto expect_bad = [&](const Tensor& latents, const VideoTiling& tiling, const std::string& what) {
    auto r = gpu->decode(latents, tiling);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(r.status().to_string().find(what), std::string::npos) << r.status().to_string();
    EXPECT_EQ(r.status().to_string().find('\n'), std::string::npos) << r.status().to_string();
  };
  expect_bad(test::random_tensor({24, 7, 4}, DType::kF32, 1), {}, "[C, T, H, W]");
  expect_bad(test::random_tensor({23, 7, 2, 2}, DType::kF32, 1), {}, "channels");
  expect_bad(test::random_tensor({24, 6, 2, 2}, DType::kF32, 1), {}, "frames 6");
  Tensor nan = test::random_tensor({24, 7, 2, 2}, DType::kF32, 1);
  nan.data_as<float>()[30] = std::nanf("");
  expect_bad(nan, {}, "non-finite");
  expect_bad(test::random_tensor({24, 7, 2, 2}, DType::kF32, 1), tiles(10, 16, 4, 4), "tiling");
  expect_bad(test::random_tensor({24, 7, 2, 2}, DType::kF32, 1), tiles(16, 16, 16, 4), "tiling");

  CudaVideoVaeOptions f16;
  f16.dtype = DType::kF16;
  auto refused = CudaVideoVae::create(cpu, f16);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

// No device needed: the arenas of the canonical decode (latents [24, 37, 48, 84] -> 124 frames of
// 768 x 1344, the release config and tiling) leave room for the CUDA context within 24 GB.
TEST(GpuVideoVaeMemory, CanonicalDecodeFitsIn24GB) {
  const VideoVaeConfig h3 = must(vae::video_vae_config_preset("h3"));
  constexpr double kContext = 1e9;  // CUDA context, cuBLASLt handles, allocator slack (~0.5 GB measured on H200s)
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    const vae::CudaVideoVaeMemory m = must(vae::cuda_video_vae_memory(h3, dtype, {24, 37, 48, 84}, VideoTiling{}));
    std::printf("canonical video decode, %s: weights %.3f GB, activations %.3f GB, workspace %.3f GB, total %.3f GB\n",
                dtype_name(dtype), m.weights / 1e9, m.activations / 1e9, m.workspace / 1e9, m.total() / 1e9);
    EXPECT_LE(static_cast<double>(m.total()) + kContext, 24e9) << dtype_name(dtype);
  }
  // The activations are the latents and frames plus a working set that does not depend on the
  // clip's length: 35 more latent frames add their latents and 119 frames, nothing else.
  const auto act = [&](int64_t latent_frames) {
    return must(vae::cuda_video_vae_memory(h3, DType::kBF16, {24, latent_frames, 48, 84}, VideoTiling{})).activations;
  };
  const double added = 119.0 * 3 * 768 * 1344 * 4 + 35.0 * 24 * 48 * 84 * 4;
  EXPECT_NEAR(static_cast<double>(act(72) - act(37)), added, 2.0 * cuda::DeviceArena::kAlignment);
}

}  // namespace
}  // namespace vortex
