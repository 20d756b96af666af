// The int8fp8 attention mode's CPU reference (cpu/attention_int8fp8.h): its quantized operands obey
// the mode's definition, and its error against the exact mode (cpu::attention, same bf16 inputs)
// stays within the mode's budget on random N(0, 1) q, k, v.
//
// Bound (the target for the mode): rel-L2 ≤ 0.04 and cosine similarity ≥ 0.999 against
// exact, per shape. Expected ~0.03: e4m3 V and e4m3 P each carry a ~2.4 % rms relative rounding
// error (3 mantissa bits) that an output, a weighted mean over many keys, keeps in relative terms;
// int8 Q/K add ~1 % to the scores. The measured values are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cpu/attention.h"
#include "cpu/attention_int8fp8.h"

namespace vortex {
namespace {

constexpr double kModeRelL2 = 0.04;
constexpr double kModeCosine = 0.999;

// A fused [N, 3·H·D] bf16 buffer of N(mean, 1) values and its q, k, v column slices as [N, H, D];
// k_bias is added to every k entry of channel c as k_bias · (c % 7 − 3) (a per-channel offset
// shared by all keys, which smoothing must remove).
struct FusedQkv {
  Tensor fused;
  TensorView q, k, v;
};

FusedQkv random_qkv(uint64_t seed, int64_t n, int64_t heads, int64_t d, float k_bias = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  FusedQkv out;
  const int64_t width = 3 * heads * d;
  out.fused = Tensor::empty({n, width}, DType::kBF16);
  uint16_t* p = out.fused.data_as<uint16_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t col = 0; col < width; ++col) {
      float x = normal(rng);
      if (col >= heads * d && col < 2 * heads * d) x += k_bias * static_cast<float>(col % d % 7 - 3);
      p[r * width + col] = f32_to_bf16_bits(x);
    }
  }
  TensorView* parts[] = {&out.q, &out.k, &out.v};
  for (int part = 0; part < 3; ++part) {
    TensorView& t = *parts[part];
    t.data = p + part * heads * d;
    t.dtype = DType::kBF16;
    t.shape = Shape({n, heads, d});
    t.strides = Shape({width, d, 1});
  }
  return out;
}

struct ModeError {
  double rel_l2, cosine;
};

ModeError mode_error(const Tensor& got, const Tensor& want) {
  double num = 0.0, den = 0.0, dot = 0.0, gg = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = element_as_double(got, i), w = element_as_double(want, i);
    num += (g - w) * (g - w);
    den += w * w;
    dot += g * w;
    gg += g * g;
  }
  return {std::sqrt(num / den), dot / std::sqrt(den * gg)};
}

ModeError run_and_compare(const FusedQkv& qkv, float scale, const std::string& label) {
  const int64_t n = qkv.q.shape[0], heads = qkv.q.shape[1], d = qkv.q.shape[2];
  Tensor exact = Tensor::empty({n, heads, d}, DType::kF32);
  Tensor got = Tensor::empty({n, heads, d}, DType::kBF16);
  EXPECT_TRUE(cpu::attention(qkv.q, qkv.k, qkv.v, exact.view(), scale).ok());
  const Status st = cpu::attention_int8fp8(qkv.q, qkv.k, qkv.v, got.view(), scale);
  EXPECT_TRUE(st.ok()) << st.to_string();
  const ModeError e = mode_error(got, exact);
  std::printf("int8fp8 vs exact %-32s rel-L2 %.4f  cosine %.6f\n", label.c_str(), e.rel_l2, e.cosine);
  return e;
}

TEST(CpuAttentionInt8Fp8, ErrorAgainstExactOnRandomInputs) {
  uint64_t seed = 1;
  double worst = 0.0;
  for (int64_t n : {1, 5, 127, 129, 1000, 4097}) {
    for (int64_t heads : {1, 3}) {
      const std::string label = "N=" + std::to_string(n) + " H=" + std::to_string(heads) + " D=128";
      const ModeError e = run_and_compare(random_qkv(seed++, n, heads, 128), 1.0f / std::sqrt(128.0f), label);
      EXPECT_LE(e.rel_l2, kModeRelL2) << label;
      EXPECT_GE(e.cosine, kModeCosine) << label;
      worst = std::max(worst, e.rel_l2);
    }
  }
  std::printf("int8fp8 vs exact, worst rel-L2 over the sweep: %.4f\n", worst);
}

TEST(CpuAttentionInt8Fp8, SmoothingRemovesASharedKeyOffset) {
  // A per-channel K offset up to ±3σ would, unsmoothed, take most of the int8 range of every K
  // block; smoothing subtracts it before quantization, so the error stays that of the plain case.
  const ModeError e = run_and_compare(random_qkv(77, 1000, 2, 128, 1.0f), 1.0f / std::sqrt(128.0f), "biased K");
  EXPECT_LE(e.rel_l2, kModeRelL2);
  EXPECT_GE(e.cosine, kModeCosine);
}

TEST(CpuAttentionInt8Fp8, QuantizedOperandsFollowTheDefinition) {
  const int64_t n = 300, heads = 2, d = 128;
  const FusedQkv qkv = random_qkv(5, n, heads, d, 0.5f);
  const cpu::Int8Fp8Quantized qz = *cpu::quantize_int8fp8(qkv.q, qkv.k, qkv.v);
  ASSERT_EQ(qz.q_blocks(), 5);
  ASSERT_EQ(qz.k_blocks(), 3);
  const auto value = [&](const TensorView& t, int64_t r, int64_t h, int64_t c) {
    return bf16_bits_to_f32(static_cast<const uint16_t*>(t.data)[r * t.strides[0] + h * t.strides[1] + c]);
  };
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t c = 0; c < d; ++c) {
      double sum = 0.0;
      float amax = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        sum += value(qkv.k, j, h, c);
        amax = std::max(amax, std::fabs(value(qkv.v, j, h, c)));
      }
      EXPECT_EQ(qz.k_mean[h * d + c], static_cast<float>(sum / n));
      EXPECT_EQ(qz.v_scale[h * d + c], amax / 448.0f);
    }
    // Every block reaches ±127 somewhere (its amax), and dequantized codes are within half a step.
    for (int64_t b = 0; b < qz.q_blocks(); ++b) {
      const float s = qz.q_scale[h * qz.q_blocks() + b];
      int peak = 0;
      for (int64_t r = b * 64; r < std::min(n, (b + 1) * 64); ++r) {
        for (int64_t c = 0; c < d; ++c) {
          const int code = qz.q[(h * n + r) * d + c];
          peak = std::max(peak, std::abs(code));
          EXPECT_LE(std::fabs(code * s - value(qkv.q, r, h, c)), 0.5001f * s);
        }
      }
      EXPECT_EQ(peak, 127);
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < d; ++c) {
        const float k_smoothed = value(qkv.k, j, h, c) - qz.k_mean[h * d + c];
        const float s = qz.k_scale[h * qz.k_blocks() + j / 128];
        EXPECT_LE(std::fabs(qz.k[(h * n + j) * d + c] * s - k_smoothed), 0.5001f * s);
        const float v = value(qkv.v, j, h, c);
        const float deq = e4m3_bits_to_f32(qz.v[(h * n + j) * d + c]) * qz.v_scale[h * d + c];
        // Half a step of 3 mantissa bits, or of e4m3's subnormal spacing 2^-9 (scaled back).
        EXPECT_LE(std::fabs(deq - v), std::fabs(v) / 16.0f + std::ldexp(qz.v_scale[h * d + c], -10) * 1.0001f);
      }
    }
  }
}

TEST(CpuAttentionInt8Fp8, OneKeyGivesItsQuantizedValue) {
  // One key: its weight is e4m3(p) / p with p = exp2(log2 448 + rounding) = 448 (1 ± 1e-6) and
  // e4m3(p) = 448, so out = v8 · v_scale to within 2e-6 relative.
  const FusedQkv qkv = random_qkv(9, 1, 3, 128);
  const cpu::Int8Fp8Quantized qz = *cpu::quantize_int8fp8(qkv.q, qkv.k, qkv.v);
  Tensor out = Tensor::empty({1, 3, 128}, DType::kF32);
  ASSERT_TRUE(cpu::attention_int8fp8_quantized(qz, out.view(), 0.1f).ok());
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t c = 0; c < 128; ++c) {
      const float want = e4m3_bits_to_f32(qz.v[h * 128 + c]) * qz.v_scale[h * 128 + c];
      EXPECT_NEAR(out.data_as<float>()[h * 128 + c], want, 2e-6f * std::fabs(want)) << h << ", " << c;
    }
  }
}

TEST(CpuAttentionInt8Fp8, RowsMatchTheFullOutput) {
  const FusedQkv qkv = random_qkv(11, 200, 2, 128);
  const cpu::Int8Fp8Quantized qz = *cpu::quantize_int8fp8(qkv.q, qkv.k, qkv.v);
  Tensor full = Tensor::empty({200, 2, 128}, DType::kBF16);
  ASSERT_TRUE(cpu::attention_int8fp8_quantized(qz, full.view(), 0.09f).ok());
  const std::vector<int64_t> rows = {0, 63, 64, 199};
  Tensor some = Tensor::empty({4, 2, 128}, DType::kBF16);
  ASSERT_TRUE(cpu::attention_int8fp8_rows(qz, rows, some.view(), 0.09f).ok());
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t e = 0; e < 256; ++e) {
      EXPECT_EQ(some.data_as<uint16_t>()[i * 256 + e], full.data_as<uint16_t>()[rows[i] * 256 + e]);
    }
  }
}

TEST(CpuAttentionInt8Fp8, RejectsBadOperands) {
  const FusedQkv qkv = random_qkv(3, 4, 1, 128);
  Tensor out = Tensor::empty({4, 2, 128}, DType::kF32);
  EXPECT_EQ(cpu::attention_int8fp8(qkv.q, qkv.k, qkv.v, out.view(), 0.1f).code(), StatusCode::kInvalidArgument);
  Tensor good = Tensor::empty({4, 1, 128}, DType::kF32);
  EXPECT_EQ(cpu::attention_int8fp8(qkv.q, qkv.k, qkv.v, good.view(), 0.0f).code(), StatusCode::kInvalidArgument);
  TensorView k_short = qkv.k;
  k_short.shape = Shape({3, 1, 128});
  EXPECT_EQ(cpu::attention_int8fp8(qkv.q, k_short, qkv.v, good.view(), 0.1f).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vortex
