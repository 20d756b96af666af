// The audio VAE's op families (conv1d, conv_transpose1d, weight norm, snake activations, Kaiser-sinc
// filters, anti-aliased up/down sampling) against naive double loops written from the reference's
// definitions, on odd lengths and the strides, dilations and paddings the decoder uses.
//
// Bound for a sum of n fp32 products in any order: |y - exact| <= (n + 2)·2^-24·Σ|terms|.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "audio_vae_test_util.h"
#include "models/vae/activations.h"
#include "models/vae/conv1d.h"
#include "models/vae/resample.h"

namespace vortex {
namespace {

using test::Seq;

std::vector<cpu::GemmVariant> variants() {
  std::vector<cpu::GemmVariant> out;
  for (auto v : {cpu::GemmVariant::kBlas, cpu::GemmVariant::kLoops}) {
    if (cpu::gemm_variant_available(v)) out.push_back(v);
  }
  return out;
}

// Every element within the summation bound of the double reference.
void expect_within_bound(const Tensor& got, const Seq& ref, const Seq& mag, int64_t terms, const std::string& what) {
  ASSERT_EQ(got.rank(), 3) << what;
  ASSERT_EQ(got.size(0), ref.B) << what;
  ASSERT_EQ(got.size(1), ref.T) << what;
  ASSERT_EQ(got.size(2), ref.C) << what;
  const double unit = std::ldexp(1.0, -24);
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double err = std::abs(element_as_double(got, i) - ref.v[i]);
    const double bound = (terms + 2) * unit * mag.v[i] + 1e-30;
    if (err > bound && bad++ < 3) ADD_FAILURE() << what << ": element " << i << " off by " << err << " > " << bound;
  }
  EXPECT_EQ(bad, 0) << what;
}

struct ConvCase {
  int64_t B, T, C, O, K, stride, dilation, padding;
};

TEST(AudioVaeConv1d, MatchesNaiveLoops) {
  std::mt19937 rng(11);
  const std::vector<ConvCase> cases = {
      {2, 13, 5, 7, 7, 1, 1, 3},     // conv_pre / conv_post: k7, "same"
      {1, 9, 3, 4, 11, 1, 5, 25},    // AMP conv at dilation 5: the padding reaches past both ends
      {2, 37, 6, 6, 3, 1, 3, 3},     // k3 dilation 3
      {1, 300, 8, 19, 1, 1, 1, 0},   // 1x1 (dec_in_proj): GEMM on x directly, several row tiles
      {2, 17, 4, 8, 4, 2, 1, 1},     // encoder-style strided conv
      {1, 23, 5, 3, 10, 5, 1, 3},    // stride 5, kernel 2·stride
      {1, 301, 16, 40, 3, 1, 1, 1},  // row tiles and column blocks
      {1, 5, 2, 3, 7, 1, 1, 3},      // shorter than the kernel: padding only
      {1, 9, 6, 40, 3, 1, 1, 1},     // one row tile: the output columns split over threads
  };
  for (auto variant : variants()) {
    for (const ConvCase& cc : cases) {
      const std::string what = "B" + std::to_string(cc.B) + " T" + std::to_string(cc.T) + " C" + std::to_string(cc.C) +
                               " O" + std::to_string(cc.O) + " K" + std::to_string(cc.K) + " s" +
                               std::to_string(cc.stride) + " d" + std::to_string(cc.dilation) + " p" +
                               std::to_string(cc.padding) + " " + cpu::gemm_variant_name(variant);
      Tensor w = test::random_tensor(rng, {cc.O, cc.C, cc.K}, 0.3f);
      Tensor bias = test::random_tensor(rng, {cc.O}, 0.1f);
      Tensor x = test::random_tensor(rng, {cc.B, cc.T, cc.C});
      auto conv = vae::make_conv1d("w", w, bias, cc.stride, cc.dilation, cc.padding);
      ASSERT_TRUE(conv.ok()) << conv.status().to_string();
      auto y = vae::conv1d(*conv, x, variant);
      ASSERT_TRUE(y.ok()) << y.status().to_string();
      Seq mag;
      const Seq ref = test::naive_conv1d(test::seq_from(x), test::values_of(w), test::values_of(bias), cc.O, cc.K,
                                         cc.stride, cc.dilation, cc.padding, &mag);
      expect_within_bound(*y, ref, mag, cc.C * cc.K + 1, what);
    }
  }
}

TEST(AudioVaeConv1d, NoBiasAndBadInputs) {
  std::mt19937 rng(12);
  Tensor w = test::random_tensor(rng, {1, 4, 7});
  auto conv = vae::make_conv1d("decoder.conv_post.weight", w, Tensor(), 1, 1, 3);
  ASSERT_TRUE(conv.ok());
  Tensor x = test::random_tensor(rng, {2, 9, 4});
  auto y = vae::conv1d(*conv, x);
  ASSERT_TRUE(y.ok());
  Seq mag;
  const Seq ref = test::naive_conv1d(test::seq_from(x), test::values_of(w), {}, 1, 7, 1, 1, 3, &mag);
  expect_within_bound(*y, ref, mag, 29, "no bias");

  Tensor wrong_channels = test::random_tensor(rng, {2, 9, 5});
  auto bad = vae::conv1d(*conv, wrong_channels);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("channels"), std::string::npos) << bad.status().message();
  auto too_short = vae::conv1d(*vae::make_conv1d("w", w, Tensor(), 1, 1, 0), test::random_tensor(rng, {1, 6, 4}));
  ASSERT_FALSE(too_short.ok());
  auto bad_bias = vae::make_conv1d("decoder.x.weight", w, test::random_tensor(rng, {3}), 1, 1, 3);
  ASSERT_FALSE(bad_bias.ok());
  EXPECT_NE(bad_bias.status().message().find("decoder.x.weight"), std::string::npos);
}

struct ConvTCase {
  int64_t B, T, C, O, K, stride, padding;
};

TEST(AudioVaeConvTranspose1d, MatchesNaiveScatter) {
  std::mt19937 rng(13);
  const std::vector<ConvTCase> cases = {
      {2, 7, 6, 5, 9, 5, 2},   // the release's rate-5 upsampler: kernel 9, padding 2 -> 5T
      {1, 11, 8, 4, 4, 2, 1},  // rate 2: kernel 4, padding 1 -> 2T
      {2, 5, 3, 2, 5, 2, 0},   // odd kernel - rate: 2T + 3
      {1, 1, 4, 3, 9, 5, 2},   // a single input sample
      {1, 13, 3, 3, 3, 3, 0},  // kernel == stride
      {1, 9, 5, 2, 7, 2, 3},   // padding larger than the stride
  };
  for (auto variant : variants()) {
    for (const ConvTCase& cc : cases) {
      const std::string what = "T" + std::to_string(cc.T) + " K" + std::to_string(cc.K) + " s" +
                               std::to_string(cc.stride) + " p" + std::to_string(cc.padding) + " " +
                               cpu::gemm_variant_name(variant);
      Tensor w = test::random_tensor(rng, {cc.C, cc.O, cc.K}, 0.3f);
      Tensor bias = test::random_tensor(rng, {cc.O}, 0.1f);
      Tensor x = test::random_tensor(rng, {cc.B, cc.T, cc.C});
      auto conv = vae::make_conv_transpose1d("w", w, bias, cc.stride, cc.padding);
      ASSERT_TRUE(conv.ok()) << conv.status().to_string();
      auto y = vae::conv_transpose1d(*conv, x, variant);
      ASSERT_TRUE(y.ok()) << y.status().to_string();
      EXPECT_EQ(y->size(1), (cc.T - 1) * cc.stride - 2 * cc.padding + cc.K) << what;
      Seq mag;
      const Seq ref = test::naive_conv_transpose1d(test::seq_from(x), test::values_of(w), test::values_of(bias), cc.O,
                                                   cc.K, cc.stride, cc.padding, &mag);
      expect_within_bound(*y, ref, mag, cc.C * cc.K + 1, what);
    }
  }
}

TEST(AudioVaeWeightNorm, FusesPerFirstDim) {
  std::mt19937 rng(14);
  for (const Shape& shape : {Shape{5, 3, 7}, Shape{8, 4, 9}, Shape{1, 6, 7}}) {
    Tensor v = test::random_tensor(rng, shape);
    Tensor g = test::random_tensor(rng, {shape[0], 1, 1}, 0.2f, 1.0f);
    auto w = vae::fuse_weight_norm("conv", g, v);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_EQ(w->shape(), shape);
    const std::vector<double> ref = test::naive_weight_norm(test::values_of(g), test::values_of(v));
    for (int64_t i = 0; i < w->numel(); ++i) {
      EXPECT_NEAR(element_as_double(*w, i), ref[i], 4e-7 * (std::abs(ref[i]) + 1e-3)) << shape.to_string() << " " << i;
    }
  }
  auto bad = vae::fuse_weight_norm("decoder.conv_pre", Tensor::zeros({4, 1, 1}, DType::kF32),
                                   Tensor::zeros({5, 3, 7}, DType::kF32));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("decoder.conv_pre"), std::string::npos);
}

TEST(AudioVaeSnake, SnakeBetaAndSnakeMatchTheFormula) {
  std::mt19937 rng(15);
  const int64_t C = 7;
  Tensor alpha = test::random_tensor(rng, {C}, 0.3f);
  Tensor beta = test::random_tensor(rng, {C}, 0.3f);
  Tensor x = test::random_tensor(rng, {2, 13, C}, 2.0f);
  auto params = vae::snake_beta_params("act", alpha, beta);
  ASSERT_TRUE(params.ok());
  std::vector<double> f, m;
  for (int64_t c = 0; c < C; ++c) {
    f.push_back(std::exp(element_as_double(alpha, c)));
    m.push_back(1.0 / (std::exp(element_as_double(beta, c)) + 1e-9));
  }
  const Seq ref = test::naive_snake(test::seq_from(x), f, m);
  Tensor y = x.clone();
  ASSERT_TRUE(vae::apply_snake(*params, y).ok());
  for (int64_t i = 0; i < y.numel(); ++i)
    EXPECT_NEAR(element_as_double(y, i), ref.v[i], 2e-6 * (1 + std::abs(ref.v[i])));

  // The encoder's Snake: linear-space alpha stored [1, C, 1].
  Tensor a = test::random_tensor(rng, {1, C, 1}, 0.2f, 1.0f);
  auto snake = vae::snake_params("enc", a);
  ASSERT_TRUE(snake.ok());
  std::vector<double> f2, m2;
  for (int64_t c = 0; c < C; ++c) {
    f2.push_back(element_as_double(a, c));
    m2.push_back(1.0 / (element_as_double(a, c) + 1e-9));
  }
  const Seq ref2 = test::naive_snake(test::seq_from(x), f2, m2);
  Tensor y2 = x.clone();
  ASSERT_TRUE(vae::apply_snake(*snake, y2).ok());
  for (int64_t i = 0; i < y2.numel(); ++i) {
    EXPECT_NEAR(element_as_double(y2, i), ref2.v[i], 2e-6 * (1 + std::abs(ref2.v[i])));
  }
  Tensor wrong = test::random_tensor(rng, {1, 3, C + 1});
  EXPECT_FALSE(vae::apply_snake(*params, wrong).ok());
}

TEST(AudioVaeResample, KaiserSincFilterIsANormalisedSymmetricLowPass) {
  for (int taps : {12, 13, 8}) {
    const std::vector<float> f = vae::kaiser_sinc_filter(0.25, 0.3, taps);
    ASSERT_EQ(static_cast<int>(f.size()), taps);
    double sum = 0;
    for (float v : f) sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-6) << taps;
    for (int i = 0; i < taps; ++i) EXPECT_FLOAT_EQ(f[i], f[taps - 1 - i]) << taps << " tap " << i;
    // The centre taps carry the most weight, the outer ones little.
    EXPECT_GT(f[taps / 2], 0.4f);
    EXPECT_LT(std::abs(f[0]), 0.02f);
  }
  // beta: attenuation 2.285·5·π·1.2 + 7.95 = 51.02 dB > 50 -> 0.1102·(A - 8.7); the centre taps of
  // the 12-tap decoder filter, computed independently with that beta.
  const double attenuation = 2.285 * 5 * M_PI * 1.2 + 7.95, beta = 0.1102 * (attenuation - 8.7);
  auto i0 = [](double x) {
    double s = 1, t = 1;
    for (int k = 1; k < 60; ++k) s += (t *= (x / 2) * (x / 2) / (k * k));
    return s;
  };
  std::vector<double> ref(12);
  double sum = 0;
  for (int n = 0; n < 12; ++n) {
    const double r = (n - 5.5) / 5.5, time = n - 6 + 0.5;
    const double window = i0(beta * std::sqrt(1 - r * r)) / i0(beta);
    ref[n] = 0.5 * window * std::sin(M_PI * 0.5 * time) / (M_PI * 0.5 * time);
    sum += ref[n];
  }
  const std::vector<float> f = vae::kaiser_sinc_filter(0.25, 0.3, 12);
  for (int n = 0; n < 12; ++n) EXPECT_NEAR(f[n], ref[n] / sum, 1e-7) << n;
}

TEST(AudioVaeResample, UpsampleMatchesReplicatePadTransposedConvCrop) {
  std::mt19937 rng(16);
  struct Case {
    int64_t T, C, taps, ratio;
  };
  for (const Case& cc : {Case{1, 3, 12, 2}, Case{2, 1, 12, 2}, Case{7, 5, 12, 2}, Case{13, 4, 12, 2}, Case{9, 3, 12, 3},
                         Case{11, 2, 13, 2}, Case{6, 2, 5, 2}}) {
    std::vector<float> filter = vae::kaiser_sinc_filter(0.5 / cc.ratio, 0.6 / cc.ratio, static_cast<int>(cc.taps));
    Tensor x = test::random_tensor(rng, {2, cc.T, cc.C});
    auto y = vae::upsample_1d(x, filter, static_cast<int>(cc.ratio));
    ASSERT_TRUE(y.ok()) << y.status().to_string();
    EXPECT_EQ(y->size(1), cc.ratio * cc.T);
    const Seq ref =
        test::naive_upsample(test::seq_from(x), std::vector<double>(filter.begin(), filter.end()), cc.ratio);
    ASSERT_EQ(ref.T, y->size(1));
    for (int64_t i = 0; i < y->numel(); ++i) {
      EXPECT_NEAR(element_as_double(*y, i), ref.v[i], 2e-6) << "T" << cc.T << " taps " << cc.taps << " elem " << i;
    }
  }
}

TEST(AudioVaeResample, DownsampleMatchesReplicatePadStridedCorrelation) {
  std::mt19937 rng(17);
  struct Case {
    int64_t T, C, taps, ratio;
  };
  for (const Case& cc : {Case{2, 3, 12, 2}, Case{14, 5, 12, 2}, Case{13, 2, 12, 2}, Case{1, 2, 12, 2}, Case{9, 3, 7, 2},
                         Case{12, 2, 12, 3}}) {
    std::vector<float> filter = vae::kaiser_sinc_filter(0.5 / cc.ratio, 0.6 / cc.ratio, static_cast<int>(cc.taps));
    Tensor x = test::random_tensor(rng, {2, cc.T, cc.C});
    auto y = vae::lowpass_downsample_1d(x, filter, static_cast<int>(cc.ratio));
    ASSERT_TRUE(y.ok()) << y.status().to_string();
    const Seq ref =
        test::naive_downsample(test::seq_from(x), std::vector<double>(filter.begin(), filter.end()), cc.ratio);
    ASSERT_EQ(ref.T, y->size(1)) << "T" << cc.T;
    for (int64_t i = 0; i < y->numel(); ++i) {
      EXPECT_NEAR(element_as_double(*y, i), ref.v[i], 2e-6) << "T" << cc.T << " taps " << cc.taps << " elem " << i;
    }
  }
  // The alias-free pair keeps the length of an even signal: 2T up, then T back.
  EXPECT_EQ(vae::lowpass_downsample_length(2 * 45, 12, 2), 45);
  EXPECT_FALSE(vae::upsample_1d(test::random_tensor(rng, {1, 0, 2}), vae::kaiser_sinc_filter(.25, .3, 12), 2).ok());
  EXPECT_FALSE(vae::upsample_1d(test::random_tensor(rng, {1, 3, 2}), {1.0f}, 2).ok());
}

}  // namespace
}  // namespace vortex
