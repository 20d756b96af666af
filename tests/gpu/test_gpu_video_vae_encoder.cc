// The video VAE encoder on the GPU (models/vae/cuda_video_vae_encoder.h, cuda/vae_conv3d.h)
// against the CPU program and the diffusers golden (tests/golden/video_vae_encoder_test).
//
// Bounds:
//   conv3d_gather: bitwise (a copy; checked against a host im2col written here).
//   frame_group_norm: rel-L2 <= 1e-6 and max-abs <= 1e-5 with and without SiLU; without it at most
//     1e-3 of the elements differ at all (mean and rstd are double sums in another order, equal
//     after rounding except next to a tie). SiLU's expf (2 ulp) against the CPU's exp is the rest.
//   the encoder: every intermediate and the stitched moments within 1e-5 rel-L2 of the CPU's on
//     the same weights (fp32 GEMMs in another summation order) and within the CPU's own bound
//     (1e-4) of the reference; the conditioning latents within 5e-4 of the reference, as on the
//     CPU. At the release widths on the canonical keyframe: moments within 1e-5 of the CPU's; with
//     tf32 convolutions (--vae-encode-precision tf32, approximate) within 1e-3 and farther than 1e-5
//     (so the approximate kernel ran: measured 2.4e-4 from diffusers' fp32 encode, its own TF32
//     default 2.3e-4).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda/vae_conv3d.h"
#include "formats/safetensors.h"
#include "gpu/gpu_test_util.h"
#include "h3_golden_util.h"
#include "models/vae/conv3d.h"
#include "models/vae/cuda_video_vae_encoder.h"
#include "models/vae/video_vae_encoder.h"

namespace vortex {
namespace {

using test::compare;
using test::must;
using test::random_tensor;

class GpuVideoVaeEncoder : public test::GpuTest {};

// The CPU's im2col rows (conv3d.cc) for output rows [r0, r0 + rows) of frame f, taps [a0, kt), of
// `clips` clips stacked in x (rows clip-major, as conv3d_gather numbers them).
Tensor host_gather(const Tensor& x, int64_t clips, const cuda::Conv3dTaps& g, int64_t h_out, int64_t w_out, int64_t f,
                   int64_t a0, int64_t r0, int64_t rows) {
  const int64_t T = x.size(0) / clips, H = x.size(1), W = x.size(2), C = x.size(3);
  const int64_t taps = (g.kt - a0) * g.kh * g.kw, plane = h_out * w_out;
  const auto reflect = [](int64_t i, int64_t n) { return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i); };
  Tensor out = Tensor::empty({rows, taps * C}, DType::kF32);
  float* d = out.data_as<float>();
  const float* s = x.data_as<const float>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t clip = (r0 + r) / plane, ho = (r0 + r) % plane / w_out, wo = (r0 + r) % plane % w_out;
    for (int64_t ta = a0; ta < g.kt; ++ta)
      for (int64_t b = 0; b < g.kh; ++b)
        for (int64_t q = 0; q < g.kw; ++q) {
          const int64_t t = clip * T + f * g.st + ta - g.temporal_padding;
          const int64_t hi = reflect(ho * g.sh + b - g.pad_top, H), wi = reflect(wo * g.sw + q - g.pad_left, W);
          for (int64_t c = 0; c < C; ++c) *d++ = s[((t * H + hi) * W + wi) * C + c];
        }
  }
  return out;
}

TEST_F(GpuVideoVaeEncoder, GatherIsTheCpuIm2col) {
  struct Case {
    Shape x;  // [clips·T, H, W, C]
    int64_t clips;
    cuda::Conv3dTaps taps;
    int64_t pad_bottom, pad_right, frame, r0, rows;  // rows -1: every row from r0 on
  };
  const std::vector<Case> cases = {
      // conv_in on a keyframe: 3 channels (the scalar path), the causal taps' last only.
      {{1, 7, 9, 3}, 1, {3, 3, 3, 1, 1, 1, 1, 1, 2}, 1, 1, 0, 0, -1},
      // a resnet conv on a clip's third frame: every temporal tap real, a row block in the middle.
      {{5, 6, 10, 8}, 1, {3, 3, 3, 1, 1, 1, 1, 1, 2}, 1, 1, 2, 13, 29},
      // its second frame: the first temporal tap reads a causal zero.
      {{4, 5, 7, 12}, 1, {3, 3, 3, 1, 1, 1, 1, 1, 2}, 1, 1, 1, 0, -1},
      // a downsampler: stride (2, 2, 2), a reflected row and column at the bottom / right.
      {{5, 8, 6, 16}, 1, {3, 3, 3, 2, 2, 2, 0, 0, 2}, 1, 1, 1, 2, -1},
      // a keyframe's tiles as a batch: three single-frame clips, rows across a clip boundary.
      {{3, 5, 6, 8}, 3, {3, 3, 3, 1, 1, 1, 1, 1, 2}, 1, 1, 0, 17, 40},
      // ... through a downsampler.
      {{2, 8, 6, 4}, 2, {3, 3, 3, 2, 2, 2, 0, 0, 2}, 1, 1, 0, 0, -1},
  };
  for (const Case& k : cases) {
    ArenaScope scope(arena_);
    const cuda::Conv3dTaps& g = k.taps;
    const int64_t h_out = vae::conv3d_output_length(k.x[1], g.pad_top, k.pad_bottom, g.kh, g.sh);
    const int64_t w_out = vae::conv3d_output_length(k.x[2], g.pad_left, k.pad_right, g.kw, g.sw);
    const int64_t a0 = std::clamp<int64_t>(g.temporal_padding - k.frame * g.st, 0, g.kt);
    const int64_t rows = k.rows < 0 ? k.clips * h_out * w_out - k.r0 : k.rows;
    const std::string what = "gather x " + k.x.to_string() + " as " + std::to_string(k.clips) + " clips, frame " +
                             std::to_string(k.frame);
    const Tensor x = random_tensor(k.x, DType::kF32, 101 + k.x[3]);
    const Tensor want = host_gather(x, k.clips, g, h_out, w_out, k.frame, a0, k.r0, rows);
    const Tensor x_dev = to_device(x);
    Tensor cols = must(arena_.alloc(want.shape(), DType::kF32));
    VORTEX_EXPECT_OK(
        cuda::conv3d_gather(x_dev.view(), k.clips, g, h_out, w_out, k.frame, a0, k.r0, cols.view(), stream_));
    test::expect_bitwise(compare(to_host(cols), want), what);
  }
  // Refusals: taps that leave the clip, rows past the frames, a partial clip.
  const Tensor x_dev = to_device(random_tensor({2, 4, 4, 4}, DType::kF32, 5));
  Tensor cols = must(arena_.alloc({4, 27 * 4}, DType::kF32));
  const cuda::Conv3dTaps g{3, 3, 3, 1, 1, 1, 1, 1, 2};
  EXPECT_FALSE(cuda::conv3d_gather(x_dev.view(), 1, g, 4, 4, 2, 0, 0, cols.view(), stream_).ok());
  EXPECT_FALSE(cuda::conv3d_gather(x_dev.view(), 1, g, 4, 4, 1, 1, 0, cols.view(), stream_).ok());
  EXPECT_FALSE(cuda::conv3d_gather(x_dev.view(), 1, g, 4, 4, 1, 0, 14, cols.view(), stream_).ok());
  EXPECT_FALSE(cuda::conv3d_gather(x_dev.view(), 2, g, 4, 4, 1, 0, 0, cols.view(), stream_).ok());  // T = 1
  EXPECT_FALSE(cuda::conv3d_gather(x_dev.view(), 3, g, 4, 4, 0, 2, 0, cols.view(), stream_).ok());
}

TEST_F(GpuVideoVaeEncoder, GroupNormMatchesTheCpu) {
  struct Case {
    Shape x;
    int groups;
  };
  // Groups of 2 and 3 channels (one value at a time), of 4 and 32 (float4s: the release's).
  for (const Case& k : {Case{{3, 5, 7, 64}, 32}, Case{{1, 33, 17, 96}, 32}, Case{{2, 4, 4, 1024}, 32},
                        Case{{1, 9, 11, 128}, 32}, Case{{1, 1, 1, 8}, 2}}) {
    for (const bool silu : {false, true}) {
      ArenaScope scope(arena_);
      const std::string what = "group_norm " + k.x.to_string() + (silu ? " + SiLU" : "");
      const int64_t C = k.x[3];
      const Tensor x = random_tensor(k.x, DType::kF32, 7 + C, 1.7f, 0.4f);
      const Tensor w = random_tensor({C}, DType::kF32, 8, 0.3f, 1.0f);
      const Tensor b = random_tensor({C}, DType::kF32, 9, 0.2f);
      Tensor want = x.clone();
      ASSERT_TRUE(vae::frame_group_norm(want, w, b, k.groups, 1e-6f, silu).ok());
      const Tensor x_dev = to_device(x), w_dev = to_device(w), b_dev = to_device(b);
      Tensor scratch = must(arena_.alloc({cuda::frame_group_norm_scratch(k.x[0], k.groups)}, DType::kF64));
      // In place, as the encoder runs its second norm of every resnet.
      VORTEX_EXPECT_OK(cuda::frame_group_norm(x_dev.view(), w_dev.view(), b_dev.view(), k.groups, 1e-6f, silu,
                                              scratch.view(), x_dev.view(), stream_));
      const test::Comparison c = compare(to_host(x_dev), want);
      EXPECT_LE(c.rel_l2, 1e-6) << what << ": " << c.summary();
      EXPECT_LE(c.max_abs, 1e-5) << what << ": " << c.summary();
      if (!silu) EXPECT_LE(c.differing, c.count / 1000) << what << ": " << c.summary();
    }
  }
  ArenaScope scope(arena_);
  const Tensor x_dev = to_device(random_tensor({1, 2, 2, 12}, DType::kF32, 3));
  const Tensor w_dev = to_device(random_tensor({12}, DType::kF32, 4));
  Tensor small = must(arena_.alloc({2}, DType::kF64));
  EXPECT_FALSE(
      cuda::frame_group_norm(x_dev.view(), w_dev.view(), w_dev.view(), 5, 1e-6f, false, small.view(), x_dev.view(),
                             stream_)
          .ok());  // 12 channels in 5 groups
  EXPECT_FALSE(
      cuda::frame_group_norm(x_dev.view(), w_dev.view(), w_dev.view(), 4, 1e-6f, false, small.view(), x_dev.view(),
                             stream_)
          .ok());  // scratch too small
}

TEST_F(GpuVideoVaeEncoder, MatchesTheCpuAndTheReference) {
  const std::string io_path = test::golden_path("video_vae_encoder_test/io_fp32.safetensors");
  auto io = must(SafetensorsFile::open(io_path));
  const auto& meta = io.metadata();
  const vae::VideoVaeConfig c = must(vae::video_vae_config_from_json_string(meta.at("config")));
  const vae::VideoVaeEncoder cpu =
      must(vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(c, std::stoull(meta.at("seed"))), c));
  const auto tj = nlohmann::json::parse(meta.at("tiling"));
  const vae::VideoTiling tiling{true, tj.at("tile_sample_min_height").get<int>(),
                                tj.at("tile_sample_min_width").get<int>(),
                                tj.at("tile_sample_min_overlap_height").get<int>(),
                                tj.at("tile_sample_min_overlap_width").get<int>()};
  const auto golden = [&](const std::string& name) { return must(io.get(name)).contiguous(); };
  auto gpu = must(vae::CudaVideoVaeEncoder::create(cpu, stream_));

  // Every intermediate of every tile, in order, on both sides.
  using Seen = std::vector<std::pair<std::string, Tensor>>;
  const auto recorder = [](Seen& seen) {
    return vae::VideoEncoderObserver([&seen](const std::string& n, const Tensor& t) { seen.emplace_back(n, t.clone()); });
  };
  Seen cpu_seen, gpu_seen;
  const vae::VideoEncoderObserver cpu_observer = recorder(cpu_seen), gpu_observer = recorder(gpu_seen);
  const Tensor pixels = must(vae::keyframe_pixels(golden("in.keyframe_rgb8")));
  const Tensor cpu_moments = must(vae::encode_video_moments(cpu, pixels, tiling, &cpu_observer));
  const Tensor gpu_moments = must(gpu->encode_moments(pixels, tiling, &gpu_observer));
  ASSERT_EQ(gpu_seen.size(), cpu_seen.size());
  std::map<std::string, int> first;
  double worst = 0.0;
  for (size_t i = 0; i < gpu_seen.size(); ++i) {
    const auto& [name, value] = gpu_seen[i];
    ASSERT_EQ(name, cpu_seen[i].first);
    ASSERT_EQ(value.shape(), cpu_seen[i].second.shape()) << name;
    const double err = test::rel_l2(value, cpu_seen[i].second);
    worst = std::max(worst, err);
    ASSERT_LE(err, 1e-5) << "intermediate " << i << " (" << name << ") against the CPU";
    if (first[name]++ == 0 && io.has("out.keyframe." + name)) {
      EXPECT_LE(test::rel_l2(value, golden("out.keyframe." + name)), 1e-4) << name << " against the reference";
    }
  }
  EXPECT_GE(first["quant_conv"], 6);  // 2 x 3 tiles
  EXPECT_LE(test::rel_l2(gpu_moments, cpu_moments), 1e-5);
  const Tensor condition = must(vae::sample_video_condition(c, gpu_moments, golden("out.keyframe.eps")));
  const double condition_err = test::rel_l2(condition, golden("out.keyframe.condition"));
  EXPECT_LE(condition_err, 5e-4);

  // The clip: two temporal clips, each tiled.
  const Tensor clip = must(gpu->encode_moments(golden("in.clip"), tiling));
  const Tensor cpu_clip = must(vae::encode_video_moments(cpu, golden("in.clip"), tiling));
  const double clip_err = test::rel_l2(clip, cpu_clip), clip_ref_err = test::rel_l2(clip, golden("out.clip.moments"));
  EXPECT_LE(clip_err, 1e-5);
  EXPECT_LE(clip_ref_err, 1e-4);
  std::printf("video VAE encoder on the GPU: %zu intermediates, worst %.2e of the CPU's; condition %.2e of the "
              "reference; clip %.2e of the CPU, %.2e of the reference\n",
              gpu_seen.size(), worst, condition_err, clip_err, clip_ref_err);

  // Bad pixels are refused by name, as on the CPU.
  const auto refused = gpu->encode_moments(Tensor::empty({3, 1, 21, 32}, DType::kF32));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("height 21"), std::string::npos) << refused.status().to_string();
}

// The release encoder on the canonical 768 x 1344 keyframe: its time on the GPU (28 tiles of
// 256 x 256) against one CPU encode on this host, and the moments against the CPU's.
TEST_F(GpuVideoVaeEncoder, ReleaseWidthsOnTheCanonicalKeyframe) {
  const vae::VideoVaeConfig c = must(vae::video_vae_config_preset("h3"));
  const vae::VideoVaeEncoder cpu = must(vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(c, 0), c));
  auto gpu = must(vae::CudaVideoVaeEncoder::create(cpu, stream_));
  const Tensor pixels = random_tensor({3, 1, 768, 1344}, DType::kF32, 77, 0.9f);
  const auto seconds_of = [](const auto& run) {
    const auto start = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  Tensor gpu_moments;
  const double cold = seconds_of([&] { gpu_moments = must(gpu->encode_moments(pixels)); });
  std::vector<double> warm;
  for (int i = 0; i < 5; ++i) warm.push_back(seconds_of([&] { must(gpu->encode_moments(pixels)); }));
  std::sort(warm.begin(), warm.end());
  Tensor cpu_moments;
  const double cpu_seconds = seconds_of([&] { cpu_moments = must(vae::encode_video_moments(cpu, pixels)); });
  ASSERT_EQ(gpu_moments.shape(), (Shape{48, 1, 48, 84}));
  const double err = test::rel_l2(gpu_moments, cpu_moments);
  EXPECT_LE(err, 1e-5);
  std::printf("video VAE encoder, release widths, 768 x 1344 keyframe: GPU %.1f ms (median of 5; first %.1f ms), "
              "CPU %.2f s on this host (%.0fx); moments %.2e rel-L2 from the CPU's; weights %.3f GB, activations "
              "%.3f GB\n",
              warm[2] * 1e3, cold * 1e3, cpu_seconds, cpu_seconds / warm[2], err, gpu->weight_bytes() / 1e9,
              gpu->activation_bytes() / 1e9);
  gpu.reset();

  auto tf32 = must(vae::CudaVideoVaeEncoder::create(cpu, stream_, cuda::VaeConvVariant::kTf32));
  Tensor tf32_moments = must(tf32->encode_moments(pixels));
  std::vector<double> tf32_warm;
  for (int i = 0; i < 5; ++i) {
    tf32_warm.push_back(seconds_of([&] { tf32_moments = must(tf32->encode_moments(pixels)); }));
  }
  std::sort(tf32_warm.begin(), tf32_warm.end());
  const double tf32_err = test::rel_l2(tf32_moments, cpu_moments);
  EXPECT_LE(tf32_err, 1e-3);
  EXPECT_GT(tf32_err, 1e-5);
  std::printf("  with tf32 convolutions: GPU %.1f ms (median of 5); moments %.2e rel-L2 from the CPU's; weights %.3f GB\n",
              tf32_warm[2] * 1e3, tf32_err, tf32->weight_bytes() / 1e9);
}

}  // namespace
}  // namespace vortex
