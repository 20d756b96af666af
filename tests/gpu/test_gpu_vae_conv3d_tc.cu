// The video VAE encoder's implicit-GEMM convolution on tensor cores (cuda::conv3d_implicit,
// cuda/vae_conv3d_tc.cu) against a host causal conv in double, written here from conv3d_gather's
// contract (every output frame, its real temporal taps, reflected spatial taps).
//
// Bounds: tf32x3 within 1e-6 rel-L2 of the double sums (measured 2.5e-7 to 2.9e-7 on the H100; with
// the running sum inside the tensor core instead of added by FADD per k-block, 2e-6 to 2e-5, so the
// bound catches a kernel that lost the promotion); one tf32 product (the approximate variant) must
// measure above 1e-4 (7.7e-4), so the bound would also catch a kernel that lost the low parts.
// Run to run, and the warp-specialized kernel (tf32x3-ws, the default) against the lockstep one, with
// its persistent CTAs walking one tile or several each: bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/vae_conv3d.h"
#include "gpu/gpu_test_util.h"
#include "models/vae/conv3d.h"

namespace vortex {
namespace {

using test::compare;
using test::must;
using test::random_tensor;

class GpuVaeConv3dImplicit : public test::GpuTest {};

// y [T_out·clips·h_out·w_out, O]: bias + the sum over every output frame's real taps, in double.
Tensor host_conv(const Tensor& x, int64_t clips, const cuda::Conv3dTaps& g, int64_t h_out, int64_t w_out,
                 const Tensor& weight, const Tensor& bias) {
  const int64_t T = x.size(0) / clips, H = x.size(1), W = x.size(2), C = x.size(3), O = weight.size(0);
  const int64_t t_out = (T + g.temporal_padding - g.kt) / g.st + 1, plane = h_out * w_out;
  const auto reflect = [](int64_t i, int64_t n) { return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i); };
  const float* xs = x.data_as<const float>();
  const float* ws = weight.data_as<const float>();
  Tensor y = Tensor::empty({t_out * clips * plane, O}, DType::kF32);
  float* ys = y.data_as<float>();
  std::vector<double> acc(O);
  for (int64_t f = 0; f < t_out; ++f) {
    const int64_t a0 = std::clamp<int64_t>(g.temporal_padding - f * g.st, 0, g.kt);
    for (int64_t r = 0; r < clips * plane; ++r) {
      const int64_t clip = r / plane, ho = r % plane / w_out, wo = r % plane % w_out;
      for (int64_t o = 0; o < O; ++o) acc[o] = bias.data_as<const float>()[o];
      for (int64_t ta = a0; ta < g.kt; ++ta)
        for (int64_t b = 0; b < g.kh; ++b)
          for (int64_t d = 0; d < g.kw; ++d) {
            const int64_t t = clip * T + f * g.st + ta - g.temporal_padding;
            const int64_t hi = reflect(ho * g.sh + b - g.pad_top, H), wi = reflect(wo * g.sw + d - g.pad_left, W);
            const float* src = xs + ((t * H + hi) * W + wi) * C;
            const int64_t k0 = ((ta * g.kh + b) * g.kw + d) * C;
            for (int64_t o = 0; o < O; ++o) {
              const float* wrow = ws + o * weight.size(1) + k0;
              double s = 0.0;
              for (int64_t c = 0; c < C; ++c) s += static_cast<double>(src[c]) * wrow[c];
              acc[o] += s;
            }
          }
      for (int64_t o = 0; o < O; ++o) ys[(f * clips * plane + r) * O + o] = static_cast<float>(acc[o]);
    }
  }
  return y;
}

TEST_F(GpuVaeConv3dImplicit, MatchesTheDoubleSumsOnEveryFrame) {
  struct Case {
    std::string what;
    Shape x;  // [clips·T, H, W, C]
    int64_t clips, out_channels;
    cuda::Conv3dTaps taps;
    int64_t pad_bottom, pad_right;
  };
  const std::vector<Case> cases = {
      // a resnet conv on a 5-frame clip (first real taps 2, 1, 0, 0, 0), 143 rows a frame: a tail tile.
      {"resnet conv, 5 frames", {5, 13, 11, 32}, 1, 128, {3, 3, 3, 1, 1, 1, 1, 1, 2}, 1, 1},
      // a downsampler: stride (2, 2, 2), reflected bottom row and right column, two channel tiles.
      {"downsampler", {5, 16, 12, 64}, 1, 256, {3, 3, 3, 2, 2, 2, 0, 0, 2}, 1, 1},
      // a keyframe's tiles as one batch: three single-frame clips, rows across the clip boundaries.
      {"batched keyframe tiles", {3, 9, 7, 32}, 3, 128, {3, 3, 3, 1, 1, 1, 1, 1, 2}, 1, 1},
      // several row tiles and four channel blocks per tap.
      {"wider, 3 frames", {3, 24, 20, 128}, 1, 128, {3, 3, 3, 1, 1, 1, 1, 1, 2}, 1, 1},
  };
  for (const Case& k : cases) {
    ArenaScope scope(arena_);
    const cuda::Conv3dTaps& g = k.taps;
    const int64_t h_out = vae::conv3d_output_length(k.x[1], g.pad_top, k.pad_bottom, g.kh, g.sh);
    const int64_t w_out = vae::conv3d_output_length(k.x[2], g.pad_left, k.pad_right, g.kw, g.sw);
    const int64_t C = k.x[3], K = g.kt * g.kh * g.kw * C;
    const Tensor x = random_tensor(k.x, DType::kF32, 7 + C);
    const Tensor weight = random_tensor({k.out_channels, K}, DType::kF32, 8 + C, 1.0f / std::sqrt(float(K)));
    const Tensor bias = random_tensor({k.out_channels}, DType::kF32, 9 + C, 0.1f);
    const Tensor want = host_conv(x, k.clips, g, h_out, w_out, weight, bias);
    const Tensor x_dev = to_device(x), w_dev = to_device(weight), b_dev = to_device(bias);
    Tensor y = must(arena_.alloc(want.shape(), DType::kF32));
    VORTEX_EXPECT_OK(cuda::conv3d_implicit(x_dev.view(), k.clips, g, h_out, w_out, w_dev.view(), nullptr, b_dev.view(),
                                           y.view(), cuda::VaeConvVariant::kTf32x3, stream_));
    const Tensor got = to_host(y);
    const test::Comparison c = compare(got, want);
    EXPECT_LE(c.rel_l2, 1e-6) << k.what << ": " << c.summary();
    VORTEX_EXPECT_OK(cuda::conv3d_implicit(x_dev.view(), k.clips, g, h_out, w_out, w_dev.view(), nullptr, b_dev.view(),
                                           y.view(), cuda::VaeConvVariant::kTf32x3, stream_));
    test::expect_bitwise(compare(to_host(y), got), k.what + ", run to run");
    // The warp-specialized kernel's bits are the lockstep kernel's (the same sums in the same order)
    // on the weight split at load into the parts the lockstep kernel makes in shared memory.
    const Tensor w_hi = to_device(weight);
    const Tensor w_lo = must(arena_.alloc(weight.shape(), DType::kF32));
    VORTEX_EXPECT_OK(cuda::split_conv_weight_tf32(w_hi.view(), w_lo.view(), stream_));
    const TensorView w_lo_view = w_lo.view();
    // Its CTAs walk the tiles: one an SM (each here has at most one tile), one CTA for all of them,
    // and three (tiles of different frames, so of different k-block counts, one after another).
    for (const int ctas : {0, 1, 3}) {
      VORTEX_EXPECT_OK(cuda::conv3d_implicit(x_dev.view(), k.clips, g, h_out, w_out, w_hi.view(), &w_lo_view,
                                             b_dev.view(), y.view(), cuda::VaeConvVariant::kTf32x3Ws, stream_, ctas));
      test::expect_bitwise(compare(to_host(y), got),
                           k.what + ", warp-specialized kernel, " + std::to_string(ctas) + " CTAs (0: one an SM)");
    }
    // hi is a tf32 value (its low 13 bits clear) and hi + lo the weight within lo's own rounding.
    const Tensor hi = to_host(w_hi), lo = to_host(w_lo);
    for (int64_t i = 0; i < weight.numel(); ++i) {
      const float w = weight.data_as<const float>()[i], h = hi.data_as<const float>()[i];
      const float l = lo.data_as<const float>()[i];
      uint32_t h_bits;
      std::memcpy(&h_bits, &h, sizeof h_bits);
      ASSERT_EQ(h_bits & 0x1fffu, 0u) << k.what << ", weight " << i;
      ASSERT_LE(std::fabs(static_cast<double>(h) + l - w), std::ldexp(std::fabs(w), -21)) << k.what << ", weight " << i;
    }

    VORTEX_EXPECT_OK(cuda::conv3d_implicit(x_dev.view(), k.clips, g, h_out, w_out, w_dev.view(), nullptr, b_dev.view(),
                                           y.view(), cuda::VaeConvVariant::kTf32, stream_));
    const Tensor tf32 = to_host(y);
    const test::Comparison one = compare(tf32, want);
    EXPECT_GT(one.rel_l2, 1e-4) << k.what << ", one tf32 product: " << one.summary();
    EXPECT_LE(one.rel_l2, 5e-3) << k.what << ", one tf32 product: " << one.summary();
    // Its CTAs walk the tiles too: three of them give the same bits as one an SM.
    VORTEX_EXPECT_OK(cuda::conv3d_implicit(x_dev.view(), k.clips, g, h_out, w_out, w_dev.view(), nullptr, b_dev.view(),
                                           y.view(), cuda::VaeConvVariant::kTf32, stream_, 3));
    test::expect_bitwise(compare(to_host(y), tf32), k.what + ", one tf32 product, 3 CTAs");
    std::printf("%s: tf32x3 rel-L2 %.3g, tf32 %.3g\n", k.what.c_str(), c.rel_l2, one.rel_l2);
  }
}

TEST_F(GpuVaeConv3dImplicit, RefusesWhatItDoesNotTake) {
  const cuda::Conv3dTaps g{3, 3, 3, 1, 1, 1, 1, 1, 2};
  const Tensor x = to_device(random_tensor({2, 4, 4, 32}, DType::kF32, 1));
  const Tensor w = to_device(random_tensor({128, 27 * 32}, DType::kF32, 2));
  const Tensor b = to_device(random_tensor({128}, DType::kF32, 3));
  Tensor y = must(arena_.alloc({2 * 16, 128}, DType::kF32));
  VORTEX_EXPECT_OK(
      cuda::conv3d_implicit(x.view(), 1, g, 4, 4, w.view(), nullptr, b.view(), y.view(), cuda::VaeConvVariant::kTf32x3, stream_));
  // conv_in's three channels.
  const Tensor x3 = to_device(random_tensor({2, 4, 4, 3}, DType::kF32, 4));
  const Tensor w3 = to_device(random_tensor({128, 27 * 3}, DType::kF32, 5));
  EXPECT_FALSE(
      cuda::conv3d_implicit(x3.view(), 1, g, 4, 4, w3.view(), nullptr, b.view(), y.view(), cuda::VaeConvVariant::kTf32x3, stream_)
          .ok());
  EXPECT_FALSE(cuda::conv3d_implicit_supports(3, 128));
  EXPECT_FALSE(cuda::conv3d_implicit_supports(1024, 48));
  // y of the wrong row count; the gather variant.
  Tensor short_y = must(arena_.alloc({2 * 16 - 1, 128}, DType::kF32));
  EXPECT_FALSE(cuda::conv3d_implicit(x.view(), 1, g, 4, 4, w.view(), nullptr, b.view(), short_y.view(),
                                     cuda::VaeConvVariant::kTf32x3, stream_)
                   .ok());
  EXPECT_FALSE(cuda::conv3d_implicit(x.view(), 1, g, 4, 4, w.view(), nullptr, b.view(), y.view(),
                                     cuda::VaeConvVariant::kGatherGemm, stream_)
                   .ok());
  // tf32x3-ws without the weight's low parts; the low parts given to a kernel that splits B itself.
  const TensorView w_view = w.view();
  EXPECT_FALSE(cuda::conv3d_implicit(x.view(), 1, g, 4, 4, w.view(), nullptr, b.view(), y.view(),
                                     cuda::VaeConvVariant::kTf32x3Ws, stream_)
                   .ok());
  EXPECT_FALSE(cuda::conv3d_implicit(x.view(), 1, g, 4, 4, w.view(), &w_view, b.view(), y.view(),
                                     cuda::VaeConvVariant::kTf32x3, stream_)
                   .ok());
}

}  // namespace
}  // namespace vortex
