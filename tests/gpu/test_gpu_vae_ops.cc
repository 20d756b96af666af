// The VAE decoders' CUDA kernels (src/cuda/vae_*) against the CPU reference on fresh random inputs
// (fixed seeds), odd sizes and strided views.
//
// Bounds:
//   conv1d_im2col, conv_transpose1d_overlap_add, gather_latent_tokens, divide_by, clamp,
//     heads_mean_pool, normalize_channels: bitwise (the CPU's gathers and fp32 operations in the
//     CPU's order).
//   gelu_tanh_gate: max-rel <= 2^-23 (the host's double operations one by one; CUDA's tanh may
//     differ from glibc's in the last double bits, which moves a float rounding only next to a tie).
//   snake: rel-L2 <= 1e-6 (sinf, as alias_free_snake).
//   layer_norm: F32 out rel-L2 <= 1e-6 and max-abs <= 1e-5; BF16 out within 1 ulp, at most 1e-3 of
//     the elements at 1 ulp. Mean and variance are summed in double on both sides, in different
//     orders, so they agree after rounding to fp32 except next to a tie.
//   attention_f32, causal_attention_f32: rel-L2 <= 1e-5, max-abs <= 1e-5. fp32 throughout;
//     summation order and expf (2 ulp on both sides) differ.
//   alias_free_snake: rel-L2 <= 1e-6, max-abs <= 1e-5. The upsampling, the snake's roundings and
//     the downsampling replay the CPU's fp32 operations (a host replay of the kernel's tiling is
//     bit-identical to the CPU); CUDA's sinf (2 ulp) against glibc's (1 ulp) is the difference.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "cpu/elementwise.h"
#include "cuda/vae_attention_f32.h"
#include "cuda/vae_conv1d.h"
#include "cuda/vae_layer_norm.h"
#include "cuda/vae_pointwise.h"
#include "cuda/vae_snake.h"
#include "cuda/vae_video_layout.h"
#include "gpu/gpu_test_util.h"
#include "models/vae/activations.h"
#include "models/vae/resample.h"
#include "models/vae/video_vae.h"

namespace vortex {
namespace {

using test::compare;
using test::Comparison;
using test::head_view;
using test::must;
using test::random_tensor;

class GpuVaeOps : public test::GpuTest {};

// Equal values (NaN equals NaN: CUDA's arithmetic returns its canonical NaN, not the input's bits).
void expect_bitwise_tensor(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  test::expect_bitwise(compare(got, want), what);
}

TEST_F(GpuVaeOps, LayerNormMatchesTheCpu) {
  for (const auto [rows, channels] : {std::pair<int64_t, int64_t>{1, 1}, {37, 128}, {5, 2048}, {300, 100}}) {
    ArenaScope scope(arena_);
    const std::string what = "layer_norm [" + std::to_string(rows) + ", " + std::to_string(channels) + "]";
    // x as columns [3, 3 + C) of a wider buffer: a strided view.
    const Tensor wide = random_tensor({rows, channels + 5}, DType::kF32, 11 + rows, 1.5f, 0.3f);
    const Tensor x = must(wide.slice(1, 3, 3 + channels)).contiguous();
    const Tensor w = random_tensor({channels}, DType::kF32, 12, 0.25f, 1.0f);
    const Tensor b = random_tensor({channels}, DType::kF32, 13, 0.5f);
    const Tensor want = must(vae::video_layer_norm(x, w, b, 1e-5f));
    const Tensor wide_dev = to_device(wide), w_dev = to_device(w), b_dev = to_device(b);
    const TensorView x_view = test::columns(wide_dev, 3, channels);
    for (const DType out : {DType::kF32, DType::kBF16}) {
      const Tensor y = must(arena_.alloc({rows, channels}, out));
      VORTEX_EXPECT_OK(cuda::layer_norm(x_view, w_dev.view(), b_dev.view(), 1e-5f, y.view(), stream_));
      const Tensor got = to_host(y);
      if (out == DType::kF32) {
        const Comparison c = compare(got, want);
        EXPECT_LE(c.rel_l2, 1e-6) << what << ": " << c.summary();
        EXPECT_LE(c.max_abs, 1e-5) << what << ": " << c.summary();
      } else {
        test::expect_within_1ulp(compare(got, must(want.to(DType::kBF16))), 1e-3, what + " bf16");
      }
    }
  }
  const Tensor x = to_device(random_tensor({4, 8}, DType::kF32, 1));
  const Tensor w = to_device(random_tensor({8}, DType::kBF16, 2));
  EXPECT_EQ(cuda::layer_norm(x.view(), w.view(), w.view(), 1e-5f, x.view(), stream_).code(),
            StatusCode::kInvalidArgument);  // BF16 weights (BF16 x is the vision tower's case: test_gpu_vision_encoder.cc)
}

TEST_F(GpuVaeOps, AttentionF32MatchesTheCpu) {
  struct Case {
    int64_t n, heads, dim;
  };
  for (const bool causal : {false, true}) {
    for (const Case cs : {Case{1, 1, 8}, Case{33, 3, 32}, Case{200, 2, 64}, Case{77, 1, 100}, Case{130, 2, 128},
                          Case{207, 8, 256}, Case{45, 2, 200}}) {
      ArenaScope scope(arena_);
      const std::string what = std::string(causal ? "causal_attention_f32" : "attention_f32") + " N " +
                               std::to_string(cs.n) + " H " + std::to_string(cs.heads) + " D " + std::to_string(cs.dim);
      const int64_t inner = cs.heads * cs.dim;
      // q, k, v as column slices of one fused [N, 3·H·D] buffer, as the decoders hold them.
      const Tensor qkv = random_tensor({cs.n, 3 * inner}, DType::kF32, 21 + cs.n, 1.0f);
      Tensor want = Tensor::empty({cs.n, cs.heads, cs.dim}, DType::kF32);
      const float scale = 1.0f / std::sqrt(static_cast<float>(cs.dim));
      const auto cpu_attention = causal ? cpu::causal_attention : cpu::attention;
      VORTEX_EXPECT_OK(cpu_attention(head_view(qkv, 0, cs.heads, cs.dim), head_view(qkv, inner, cs.heads, cs.dim),
                                     head_view(qkv, 2 * inner, cs.heads, cs.dim), want.view(), scale,
                                     cpu::default_gemm_variant()));
      const Tensor qkv_dev = to_device(qkv);
      const Tensor out = must(arena_.alloc({cs.n, cs.heads, cs.dim}, DType::kF32));
      const auto gpu_attention = causal ? cuda::causal_attention_f32 : cuda::attention_f32;
      VORTEX_EXPECT_OK(gpu_attention(head_view(qkv_dev, 0, cs.heads, cs.dim), head_view(qkv_dev, inner, cs.heads, cs.dim),
                                     head_view(qkv_dev, 2 * inner, cs.heads, cs.dim), out.view(), scale, stream_));
      const Comparison c = compare(to_host(out), want);
      EXPECT_LE(c.rel_l2, 1e-5) << what << ": " << c.summary();
      EXPECT_LE(c.max_abs, 1e-5) << what << ": " << c.summary();
      EXPECT_EQ(c.nonfinite, 0) << what;
    }
  }
  const Tensor big = to_device(random_tensor({4, 1, 264}, DType::kF32, 3));
  EXPECT_EQ(cuda::attention_f32(big.view(), big.view(), big.view(), big.view(), 0.1f, stream_).code(),
            StatusCode::kInvalidArgument);
  const Tensor q = to_device(random_tensor({4, 1, 8}, DType::kF32, 4));
  const Tensor kv = to_device(random_tensor({5, 1, 8}, DType::kF32, 5));
  const Tensor o = must(arena_.alloc({4, 1, 8}, DType::kF32));
  EXPECT_EQ(cuda::causal_attention_f32(q.view(), kv.view(), kv.view(), o.view(), 0.1f, stream_).code(),
            StatusCode::kInvalidArgument);  // Nq != Nk
}

TEST_F(GpuVaeOps, AliasFreeSnakeMatchesTheCpu) {
  const std::vector<float> taps = vae::kaiser_sinc_filter(0.5 / vae::kAliasFreeRatio, 0.6 / vae::kAliasFreeRatio,
                                                          vae::kAliasFreeTaps);
  const cuda::SnakeFilters filters = must(cuda::make_snake_filters(taps, taps));
  struct Case {
    int64_t b, t, c;
  };
  for (const Case cs : {Case{2, 1, 3}, Case{1, 7, 8}, Case{2, 130, 40}, Case{2, 65, 1}, Case{1, 200, 33}}) {
    ArenaScope scope(arena_);
    const std::string what = "alias_free_snake [" + std::to_string(cs.b) + ", " + std::to_string(cs.t) + ", " +
                             std::to_string(cs.c) + "]";
    const Tensor x = random_tensor({cs.b, cs.t, cs.c}, DType::kF32, 31 + cs.t, 1.0f);
    const Tensor log_alpha = random_tensor({cs.c}, DType::kF32, 32, 0.3f);
    const Tensor log_beta = random_tensor({cs.c}, DType::kF32, 33, 0.3f);
    const vae::SnakeParams params = must(vae::snake_beta_params("act", log_alpha, log_beta));
    Tensor up = must(vae::upsample_1d(x, taps, vae::kAliasFreeRatio));
    VORTEX_EXPECT_OK(vae::apply_snake(params, up));
    const Tensor want = must(vae::lowpass_downsample_1d(up, taps, vae::kAliasFreeRatio));
    ASSERT_EQ(cuda::alias_free_snake_length(filters, cs.t), want.size(1)) << what;

    const Tensor freq = to_device(Tensor::from_f32(params.frequency, {cs.c}));
    const Tensor mag = to_device(Tensor::from_f32(params.magnitude, {cs.c}));
    const Tensor y = must(arena_.alloc(want.shape(), DType::kF32));
    VORTEX_EXPECT_OK(cuda::alias_free_snake(to_device(x).view(), freq.data_as<float>(), mag.data_as<float>(), filters,
                                            y.view(), stream_));
    const Comparison c = compare(to_host(y), want);
    EXPECT_LE(c.rel_l2, 1e-6) << what << ": " << c.summary();
    EXPECT_LE(c.max_abs, 1e-5) << what << ": " << c.summary();
  }
  EXPECT_FALSE(cuda::make_snake_filters(std::vector<float>(17, 0.1f), taps).ok());
}

TEST_F(GpuVaeOps, ConvolutionGathersAreBitwise) {
  // im2col of a strided, dilated, padded convolution, in two row blocks.
  const int64_t B = 2, T = 13, C = 5, K = 3;
  const cuda::Conv1dGeometry g{K, 2, 3, 4, (T + 2 * 4 - 3 * (K - 1) - 1) / 2 + 1};
  const Tensor x = random_tensor({B, T, C}, DType::kF32, 41);
  const Tensor x_dev = to_device(x);
  const int64_t rows = B * g.out_length, split = 5;
  Tensor want = Tensor::empty({rows, K * C}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t b = r / g.out_length, src = r % g.out_length * g.stride + k * g.dilation - g.padding;
      for (int64_t c = 0; c < C; ++c) {
        want.data_as<float>()[r * K * C + k * C + c] =
            src >= 0 && src < T ? x.data_as<float>()[(b * T + src) * C + c] : 0.0f;
      }
    }
  }
  const Tensor col = must(arena_.alloc({rows, K * C}, DType::kF32));
  VORTEX_EXPECT_OK(cuda::conv1d_im2col(x_dev.view(), g, 0, must(col.slice(0, 0, split)).view(), stream_));
  VORTEX_EXPECT_OK(cuda::conv1d_im2col(x_dev.view(), g, split, must(col.slice(0, split, rows)).view(), stream_));
  expect_bitwise_tensor(to_host(col), want, "im2col");

  // Overlap-add of a transposed convolution (stride 3, kernel 7, padding 2, bias).
  const int64_t O = 4, Kt = 7, stride = 3, pad = 2, T_out = (T - 1) * stride - 2 * pad + Kt;
  const Tensor z = random_tensor({B * T, Kt * O}, DType::kF32, 42);
  const Tensor bias = random_tensor({O}, DType::kF32, 43);
  Tensor want_y = Tensor::empty({B, T_out, O}, DType::kF32);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T_out; ++t) {
      for (int64_t o = 0; o < O; ++o) {
        float acc = 0.0f;
        for (int64_t k = (t + pad) % stride; k < Kt; k += stride) {
          const int64_t i = (t + pad - k) / stride;
          if (i >= 0 && i < T) acc += z.data_as<float>()[(b * T + i) * Kt * O + k * O + o];
        }
        want_y.data_as<float>()[(b * T_out + t) * O + o] = acc + bias.data_as<float>()[o];
      }
    }
  }
  const Tensor y = must(arena_.alloc({B, T_out, O}, DType::kF32));
  VORTEX_EXPECT_OK(cuda::conv_transpose1d_overlap_add(to_device(z).view(), B, Kt, stride, pad,
                                                      to_device(bias).data_as<float>(), y.view(), stream_));
  expect_bitwise_tensor(to_host(y), want_y, "overlap-add");
  EXPECT_EQ(cuda::conv_transpose1d_overlap_add(to_device(z).view(), B, Kt + 1, stride, pad, nullptr, y.view(), stream_)
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(GpuVaeOps, LatentTokenGatherIsBitwise) {
  const Tensor z = random_tensor({3, 5, 7, 9}, DType::kF32, 51);
  const int64_t t0 = 1, y0 = 2, x0 = 3, frames = 3, h = 4, w = 5;
  Tensor want = Tensor::empty({frames * h * w, 3}, DType::kF32);
  for (int64_t n = 0; n < frames * h * w; ++n) {
    for (int64_t c = 0; c < 3; ++c) {
      const int64_t t = n / (h * w), y = n / w % h, x = n % w;
      want.data_as<float>()[n * 3 + c] = z.data_as<float>()[((c * 5 + t0 + t) * 7 + y0 + y) * 9 + x0 + x];
    }
  }
  const Tensor tokens = must(arena_.alloc(want.shape(), DType::kF32));
  const Tensor z_dev = to_device(z);
  VORTEX_EXPECT_OK(cuda::gather_latent_tokens(z_dev.view(), t0, y0, x0, h, w, tokens.view(), stream_));
  expect_bitwise_tensor(to_host(tokens), want, "gather_latent_tokens");
  EXPECT_EQ(cuda::gather_latent_tokens(z_dev.view(), 3, y0, x0, h, w, tokens.view(), stream_).code(),
            StatusCode::kInvalidArgument);  // frames [3, 6) of 5
}

TEST_F(GpuVaeOps, DivideAndClampAreBitwise) {
  Tensor x = random_tensor({1001}, DType::kF32, 61, 2.0f);
  x.data_as<float>()[5] = std::nanf("");
  x.data_as<float>()[6] = INFINITY;
  Tensor divided = x.clone(), clamped = x.clone();
  for (int64_t i = 0; i < x.numel(); ++i) {
    divided.data_as<float>()[i] = x.data_as<float>()[i] / 3.0f;
    const float v = x.data_as<float>()[i];
    clamped.data_as<float>()[i] = v < -1.0f ? -1.0f : (1.0f < v ? 1.0f : v);
  }
  const Tensor a = to_device(x), b = to_device(x);
  VORTEX_EXPECT_OK(cuda::divide_by(a.view(), 3.0f, stream_));
  VORTEX_EXPECT_OK(cuda::clamp(b.view(), -1.0f, 1.0f, stream_));
  expect_bitwise_tensor(to_host(a), divided, "divide_by");
  expect_bitwise_tensor(to_host(b), clamped, "clamp");
}

// The audio VAE encoder's plain snake, head-mean pooling, gated GELU and normalisation.
TEST_F(GpuVaeOps, AudioEncoderPointwiseOpsMatchTheCpu) {
  // snake, out of place and in place, against vae::apply_snake.
  const Tensor x = random_tensor({2, 37, 19}, DType::kF32, 61, 1.5f);
  const vae::SnakeParams params = must(vae::snake_params("snake", random_tensor({19}, DType::kF32, 62, 0.5f, 1.0f)));
  Tensor want = x.clone();
  VORTEX_EXPECT_OK(vae::apply_snake(params, want));
  const Tensor freq = to_device(Tensor::from_f32(params.frequency, {19}));
  const Tensor mag = to_device(Tensor::from_f32(params.magnitude, {19}));
  const Tensor x_dev = to_device(x);
  const Tensor y = must(arena_.alloc(x.shape(), DType::kF32));
  VORTEX_EXPECT_OK(cuda::snake(x_dev.view(), freq.data_as<float>(), mag.data_as<float>(), y.view(), stream_));
  Comparison c = compare(to_host(y), want);
  EXPECT_LE(c.rel_l2, 1e-6) << "snake: " << c.summary();
  VORTEX_EXPECT_OK(cuda::snake(x_dev.view(), freq.data_as<float>(), mag.data_as<float>(), x_dev.view(), stream_));
  expect_bitwise_tensor(to_host(x_dev), to_host(y), "snake in place");

  // heads_mean_pool: 3 heads of 11 pooled to 4 (windows of 3 and 4, overlapping).
  const int64_t rows = 9, heads = 3, width = 11, out = 4;
  const Tensor a = random_tensor({rows, heads * width}, DType::kF32, 63);
  Tensor pooled_want = Tensor::empty({rows, out}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> mean(width);
    for (int64_t w = 0; w < width; ++w) {
      float sum = 0.0f;
      for (int64_t h = 0; h < heads; ++h) sum += a.data_as<float>()[r * heads * width + h * width + w];
      mean[w] = sum / static_cast<float>(heads);
    }
    for (int64_t i = 0; i < out; ++i) {
      const int64_t start = i * width / out, end = ((i + 1) * width + out - 1) / out;
      float sum = 0.0f;
      for (int64_t w = start; w < end; ++w) sum += mean[w];
      pooled_want.data_as<float>()[r * out + i] = sum / static_cast<float>(end - start);
    }
  }
  const Tensor pooled = must(arena_.alloc({rows, out}, DType::kF32));
  VORTEX_EXPECT_OK(cuda::heads_mean_pool(to_device(a).view(), heads, pooled.view(), stream_));
  expect_bitwise_tensor(to_host(pooled), pooled_want, "heads_mean_pool");
  EXPECT_EQ(cuda::heads_mean_pool(to_device(a).view(), 4, pooled.view(), stream_).code(), StatusCode::kInvalidArgument);

  // gelu_tanh_gate against cpu::gelu and the fp32 product.
  const Tensor g = random_tensor({13, 64}, DType::kF32, 64, 2.0f);
  const Tensor v = random_tensor({13, 64}, DType::kF32, 65);
  Tensor gate_want = Tensor::empty(g.shape(), DType::kF32);
  VORTEX_EXPECT_OK(cpu::gelu(g.view(), gate_want.view(), cpu::GeluApproximation::kTanh));
  for (int64_t i = 0; i < g.numel(); ++i) gate_want.data_as<float>()[i] *= v.data_as<float>()[i];
  const Tensor g_dev = to_device(g);
  VORTEX_EXPECT_OK(cuda::gelu_tanh_gate(g_dev.view(), to_device(v).view(), stream_));
  c = compare(to_host(g_dev), gate_want);
  EXPECT_LE(c.max_rel, std::ldexp(1.0, -23)) << "gelu_tanh_gate: " << c.summary();

  // normalize_channels.
  const Tensor m = random_tensor({6, 5}, DType::kF32, 66);
  const std::vector<float> mean = {0.1f, -0.2f, 0.0f, 0.3f, 1.0f}, stddev = {0.5f, 1.5f, 0.9f, 2.0f, 0.7f};
  Tensor norm_want = m.clone();
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t ch = 0; ch < 5; ++ch) {
      float& e = norm_want.data_as<float>()[r * 5 + ch];
      e = (e - mean[ch]) / stddev[ch];
    }
  }
  const Tensor m_dev = to_device(m);
  VORTEX_EXPECT_OK(cuda::normalize_channels(m_dev.view(), to_device(Tensor::from_f32(mean, {5})).data_as<float>(),
                                            to_device(Tensor::from_f32(stddev, {5})).data_as<float>(), stream_));
  expect_bitwise_tensor(to_host(m_dev), norm_want, "normalize_channels");
}

}  // namespace
}  // namespace vortex
