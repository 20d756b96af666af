// CPU attention against a double-precision softmax, on q/k/v sliced from one fused QKV tensor.
//
// Bound: |out - exact| <= 3e-5 · max|v| (per head) for an F32 out, plus half a bf16 ulp (at most
// 2^-8 · |exact|) for a BF16 out, plus 2^-9 · max|v| for a BF16 v (P is rounded to bf16). The output is a convex combination of v rows, so max|v| is its
// natural scale; 3e-5 covers the worst-case fp32 score error (D · 2^-24 · scale · Σ|q·k|, about
// 2e-5 here). The largest F32 error seen is 2e-7 · max|v|; the sweep also requires < 2e-6, so that
// a loss of accuracy (exp, summation order) shows long before the worst-case bound is reached.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "cpu/attention.h"

namespace vortex {
namespace {

using cpu::GemmVariant;

std::vector<GemmVariant> available_variants() {
  std::vector<GemmVariant> out;
  for (GemmVariant v : {GemmVariant::kBlas, GemmVariant::kLoops}) {
    if (cpu::gemm_variant_available(v)) out.push_back(v);
  }
  return out;
}

// A fused [N, 3·H·D] projection output and its q, k, v column slices viewed as [N, H, D].
struct FusedQkv {
  Tensor fused;
  TensorView q, k, v;
};

FusedQkv random_qkv(std::mt19937& rng, int64_t n, int64_t heads, int64_t d, DType dtype) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  FusedQkv out;
  out.fused = Tensor::empty({n, 3 * heads * d}, dtype);
  for (int64_t i = 0; i < out.fused.numel(); ++i) {
    const float value = normal(rng);
    if (dtype == DType::kF32) {
      out.fused.data_as<float>()[i] = value;
    } else {
      out.fused.data_as<uint16_t>()[i] = f32_to_bf16_bits(value);
    }
  }
  TensorView* parts[] = {&out.q, &out.k, &out.v};
  for (int p = 0; p < 3; ++p) {
    TensorView& t = *parts[p];
    t.data = static_cast<char*>(out.fused.data()) + p * heads * d * dtype_size(dtype);
    t.dtype = dtype;
    t.shape = Shape({n, heads, d});
    t.strides = Shape({3 * heads * d, d, 1});
  }
  return out;
}

double at(const TensorView& t, int64_t n, int64_t h, int64_t j) {
  const int64_t offset = n * t.strides[0] + h * t.strides[1] + j * t.strides[2];
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data)[offset];
  return bf16_bits_to_f32(static_cast<const uint16_t*>(t.data)[offset]);
}

// An out tensor [N, H, D] viewed inside a zeroed [N, H, D + 3] buffer (strided on N and H).
struct PaddedOut {
  Tensor full;
  Tensor view;
};

PaddedOut padded_out(int64_t n, int64_t heads, int64_t d, DType dtype) {
  PaddedOut out;
  out.full = Tensor::zeros({n, heads, d + 3}, dtype);
  out.view = *out.full.slice(2, 1, 1 + d);
  return out;
}

// Returns the largest |out - exact| / max|v| seen; fails on any element outside the bound.
// causal: query i sees keys 0 ..= i; k and v may have fewer heads than q (query head h reads
// key/value head h / (H / Hkv)).
double expect_attention_matches(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, float scale, const std::string& label,
                                bool causal = false) {
  const int64_t nq = q.shape[0], nk = k.shape[0], heads = q.shape[1], d = q.shape[2];
  const int64_t group = heads / k.shape[1];
  double worst = 0.0;
  std::vector<double> p(nk);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kh = h / group;
    double vmax = 0.0;
    for (int64_t j = 0; j < nk; ++j) {
      for (int64_t c = 0; c < d; ++c) vmax = std::max(vmax, std::fabs(at(v, j, kh, c)));
    }
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t seen = causal ? i + 1 : nk;
      double m = -INFINITY;
      for (int64_t j = 0; j < seen; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += at(q, i, h, c) * at(k, j, kh, c);
        p[j] = scale * dot;
        m = std::max(m, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < seen; ++j) sum += p[j] = std::exp(p[j] - m);
      for (int64_t c = 0; c < d; ++c) {
        double exact = 0.0;
        for (int64_t j = 0; j < seen; ++j) exact += p[j] * at(v, j, kh, c);
        exact /= sum;
        const double err = std::fabs(at(out, i, h, c) - exact);
        double bound = 3e-5 * vmax;
        if (out.dtype == DType::kBF16) bound += std::ldexp(std::fabs(exact), -8);
        // bf16 V: the weights P are rounded to bf16 (relative 2^-9 each) before the PV product,
        // which moves the convex combination by at most 2^-9 · max|v|.
        if (v.dtype == DType::kBF16) bound += std::ldexp(vmax, -9);
        if (!(err <= bound)) {
          ADD_FAILURE() << label << " at [" << i << ", " << h << ", " << c << "]: got "
                        << at(out, i, h, c) << ", exact " << exact << ", bound " << bound;
          return INFINITY;
        }
        if (out.dtype == DType::kF32 && v.dtype == DType::kF32) worst = std::max(worst, err / vmax);
      }
    }
  }
  return worst;
}

const char* dtype_label(DType d) { return d == DType::kF32 ? "f32" : "bf16"; }

TEST(CpuAttention, MatchesDoubleSoftmaxOnFusedQkvSlices) {
  std::mt19937 rng(2024);
  double worst = 0.0;
  for (GemmVariant variant : available_variants()) {
    for (int64_t n : {1, 5, 127, 130}) {
      for (int64_t heads : {1, 3}) {
        for (int64_t d : {16, 64}) {
          for (DType in_dtype : {DType::kF32, DType::kBF16}) {
            FusedQkv qkv = random_qkv(rng, n, heads, d, in_dtype);
            const float scale = 1.0f / std::sqrt(static_cast<float>(d));
            for (DType out_dtype : {DType::kF32, DType::kBF16}) {
              PaddedOut out = padded_out(n, heads, d, out_dtype);
              const std::string label = std::string(cpu::gemm_variant_name(variant)) +
                                        " n=" + std::to_string(n) + " h=" + std::to_string(heads) +
                                        " d=" + std::to_string(d) + " in " + dtype_label(in_dtype) +
                                        " out " + dtype_label(out_dtype);
              Status st = cpu::attention(qkv.q, qkv.k, qkv.v, out.view.view(), scale, variant);
              ASSERT_TRUE(st.ok()) << label << ": " << st.to_string();
              worst = std::max(worst, expect_attention_matches(qkv.q, qkv.k, qkv.v, out.view.view(),
                                                               scale, label));
              for (int64_t i = 0; i < n; ++i) {
                for (int64_t h = 0; h < heads; ++h) {
                  for (int64_t c : {int64_t{0}, d + 1, d + 2}) {
                    ASSERT_EQ(element_as_double(out.full, (i * heads + h) * (d + 3) + c), 0.0)
                        << label << " wrote outside out";
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_LT(worst, 2e-6);
}

TEST(CpuAttention, LargeScoresAndUnequalLengths) {
  // Scores up to ~1e3 overflow exp without the max subtraction; 5 queries attend to 130 keys.
  std::mt19937 rng(8);
  FusedQkv queries = random_qkv(rng, 5, 2, 16, DType::kF32);
  FusedQkv keys = random_qkv(rng, 130, 2, 16, DType::kBF16);
  for (GemmVariant variant : available_variants()) {
    PaddedOut out = padded_out(5, 2, 16, DType::kF32);
    ASSERT_TRUE(cpu::attention(queries.q, keys.k, keys.v, out.view.view(), 40.0f, variant).ok());
    expect_attention_matches(queries.q, keys.k, keys.v, out.view.view(), 40.0f,
                             cpu::gemm_variant_name(variant));
  }
}

TEST(CpuAttention, StridesDoNotChangeTheBits) {
  std::mt19937 rng(17);
  FusedQkv qkv = random_qkv(rng, 150, 3, 64, DType::kBF16);
  Tensor q = Tensor::empty({150, 3, 64}, DType::kBF16);
  Tensor k = Tensor::empty({150, 3, 64}, DType::kBF16);
  Tensor v = Tensor::empty({150, 3, 64}, DType::kBF16);
  for (int64_t i = 0; i < 150 * 3 * 64; ++i) {
    const int64_t n = i / 192, h = i / 64 % 3, c = i % 64;
    q.data_as<uint16_t>()[i] = f32_to_bf16_bits(static_cast<float>(at(qkv.q, n, h, c)));
    k.data_as<uint16_t>()[i] = f32_to_bf16_bits(static_cast<float>(at(qkv.k, n, h, c)));
    v.data_as<uint16_t>()[i] = f32_to_bf16_bits(static_cast<float>(at(qkv.v, n, h, c)));
  }
  Tensor strided = Tensor::empty({150, 3, 64}, DType::kBF16);
  Tensor contiguous = Tensor::empty({150, 3, 64}, DType::kBF16);
  ASSERT_TRUE(cpu::attention(qkv.q, qkv.k, qkv.v, strided.view(), 0.125f).ok());
  ASSERT_TRUE(cpu::attention(q.view(), k.view(), v.view(), contiguous.view(), 0.125f).ok());
  EXPECT_EQ(std::memcmp(strided.data(), contiguous.data(), strided.nbytes()), 0);
}

TEST(CpuAttention, BlasAndLoopsAgree) {
  if (!cpu::gemm_variant_available(GemmVariant::kBlas)) GTEST_SKIP() << "built without OpenBLAS";
  std::mt19937 rng(23);
  FusedQkv qkv = random_qkv(rng, 300, 2, 64, DType::kF32);
  Tensor blas = Tensor::empty({300, 2, 64}, DType::kF32);
  Tensor loops = Tensor::empty({300, 2, 64}, DType::kF32);
  ASSERT_TRUE(cpu::attention(qkv.q, qkv.k, qkv.v, blas.view(), 0.125f, GemmVariant::kBlas).ok());
  ASSERT_TRUE(cpu::attention(qkv.q, qkv.k, qkv.v, loops.view(), 0.125f, GemmVariant::kLoops).ok());
  // Outputs are O(1); the largest difference seen is 3e-7.
  for (int64_t i = 0; i < blas.numel(); ++i) {
    ASSERT_NEAR(blas.data_as<float>()[i], loops.data_as<float>()[i], 1e-5) << i;
  }
}

// The text encoder's attention: causal, with 2 or 4 query heads per key/value head, on strided
// q/k/v columns of one fused projection.
TEST(CpuAttention, CausalGroupedMatchesDoubleSoftmax) {
  std::mt19937 rng(31);
  for (GemmVariant variant : available_variants()) {
    for (int64_t n : {1, 2, 63, 64, 65, 130}) {
      for (const auto& [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 2}, {4, 1}, {3, 3}}) {
        for (DType dtype : {DType::kF32, DType::kBF16}) {
          FusedQkv qkv = random_qkv(rng, n, heads, 32, dtype);
          TensorView k = qkv.k, v = qkv.v;  // the first kv_heads heads of k and v
          k.shape = v.shape = Shape({n, kv_heads, 32});
          PaddedOut out = padded_out(n, heads, 32, dtype);
          const std::string label = std::string(cpu::gemm_variant_name(variant)) + " causal n=" + std::to_string(n) +
                                    " h=" + std::to_string(heads) + "/" + std::to_string(kv_heads) + " " +
                                    dtype_label(dtype);
          Status st = cpu::causal_attention(qkv.q, k, v, out.view.view(), 0.2f, variant);
          ASSERT_TRUE(st.ok()) << label << ": " << st.to_string();
          expect_attention_matches(qkv.q, k, v, out.view.view(), 0.2f, label, /*causal=*/true);
        }
      }
    }
  }
  // The first query sees only the first key: its output is that key's value row, exactly.
  FusedQkv qkv = random_qkv(rng, 9, 2, 16, DType::kF32);
  Tensor out = Tensor::empty({9, 2, 16}, DType::kF32);
  ASSERT_TRUE(cpu::causal_attention(qkv.q, qkv.k, qkv.v, out.view(), 0.25f).ok());
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(out.data_as<float>()[h * 16 + c], at(qkv.v, 0, h, c));
  }
  // Unequal lengths and heads that do not group are refused.
  FusedQkv keys = random_qkv(rng, 10, 2, 16, DType::kF32);
  EXPECT_FALSE(cpu::causal_attention(qkv.q, keys.k, keys.v, out.view(), 0.25f).ok());
  FusedQkv three = random_qkv(rng, 9, 3, 16, DType::kF32);
  Tensor out3 = Tensor::empty({9, 3, 16}, DType::kF32);
  TensorView k2 = three.k, v2 = three.v;
  k2.shape = v2.shape = Shape({9, 2, 16});
  EXPECT_FALSE(cpu::causal_attention(three.q, k2, v2, out3.view(), 0.25f).ok());
}

TEST(CpuAttention, BadOperandsAreNamedInTheError) {
  Tensor q = Tensor::zeros({4, 2, 8}, DType::kF32);
  Tensor k = Tensor::zeros({6, 2, 8}, DType::kBF16);
  Tensor out = Tensor::zeros({4, 2, 8}, DType::kF32);
  auto expect_error = [](Status st, const std::string& needle) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  Tensor k_bad = Tensor::zeros({6, 3, 8}, DType::kF32);
  expect_error(cpu::attention(q.view(), k_bad.view(), k.view(), out.view(), 1.0f),
               "k F32[6, 3, 8]");
  Tensor v_bad = Tensor::zeros({5, 2, 8}, DType::kF32);
  expect_error(cpu::attention(q.view(), k.view(), v_bad.view(), out.view(), 1.0f),
               "v F32[5, 2, 8]");
  Tensor out_bad = Tensor::zeros({4, 2, 9}, DType::kF32);
  expect_error(cpu::attention(q.view(), k.view(), k.view(), out_bad.view(), 1.0f),
               "out F32[4, 2, 9]");
  Tensor q_t = *Tensor::zeros({8, 2, 4}, DType::kF32).permute({2, 1, 0});
  expect_error(cpu::attention(q_t.view(), k.view(), k.view(), out.view(), 1.0f), "unit stride");
  Tensor no_keys = Tensor::zeros({0, 2, 8}, DType::kF32);
  expect_error(cpu::attention(q.view(), no_keys.view(), no_keys.view(), out.view(), 1.0f),
               "no keys");
}

}  // namespace
}  // namespace vortex
