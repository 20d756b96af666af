// CPU GEMM (linear, matmul_f32, PackedWeight) against a double-precision loop, and parallel_for.
//
// Bounds: an fp32 dot product of length I accumulated in one chain (FMA or not) differs from the
// exact value by at most (I + 2)·2^-24 · (Σ|x_i·w_i| + |bias|) — the classic recursive-summation
// bound, which holds whatever the rounding luck. F32 outputs must lie within it; a BF16 output
// must equal round_bf16 of some fp32 value within it, which means exactly round_bf16(exact)
// except where the exact value lies within the bound of a bf16 rounding midpoint.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "cpu/gemm.h"

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

// A [rows, cols] tensor of normal(0, 1) values stored in `dtype`, viewed through a column slice
// [col0, col0 + cols) of a wider [rows, cols + pad] buffer, so its row stride exceeds its width.
struct Matrix {
  Tensor storage;
  Tensor view;
};

Matrix random_matrix(std::mt19937& rng, int64_t rows, int64_t cols, DType dtype, int64_t pad,
                     int64_t col0) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor full = Tensor::empty({rows, cols + pad}, dtype);
  for (int64_t i = 0; i < full.numel(); ++i) {
    const float value = normal(rng);
    if (dtype == DType::kF32) {
      full.data_as<float>()[i] = value;
    } else {
      full.data_as<uint16_t>()[i] = f32_to_bf16_bits(value);
    }
  }
  auto sliced = full.slice(1, col0, col0 + cols);
  EXPECT_TRUE(sliced.ok());
  return {full, *sliced};
}

double value_at(const Tensor& t, int64_t row, int64_t col) {
  return element_as_double(t, row * t.size(1) + col);
}

// Checks y (as produced by linear) against the exact product.
void expect_linear_matches(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                           const std::string& label) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        const double term = value_at(x, r, i) * value_at(w, o, i);
        exact += term;
        magnitude += std::fabs(term);
      }
      if (bias != nullptr) {
        const double b = element_as_double(*bias, o);
        exact += b;
        magnitude += std::fabs(b);
      }
      const double bound = static_cast<double>(in + 2) * std::ldexp(1.0, -24) * magnitude;
      const double got = value_at(y, r, o);
      if (y.dtype() == DType::kF32) {
        ASSERT_LE(std::fabs(got - exact), bound) << label << " at [" << r << ", " << o << "]";
      } else {
        // round_bf16 and the double->float rounding are monotone, so round_bf16 of an fp32
        // result within the bound lies between these two; away from midpoints they coincide.
        const float lo = round_bf16(static_cast<float>(exact - bound));
        const float hi = round_bf16(static_cast<float>(exact + bound));
        ASSERT_GE(got, lo) << label << " at [" << r << ", " << o << "] exact " << exact;
        ASSERT_LE(got, hi) << label << " at [" << r << ", " << o << "] exact " << exact;
      }
    }
  }
}

const char* dtype_label(DType d) { return d == DType::kF32 ? "f32" : "bf16"; }

// y is a column slice of a zeroed [n, out + 7] buffer; the columns around it must stay zero.
void expect_untouched_margins(const Tensor& y_full, int64_t out, const std::string& label) {
  for (int64_t r = 0; r < y_full.size(0); ++r) {
    for (int64_t c : {int64_t{0}, int64_t{1}, out + 2, out + 6}) {
      ASSERT_EQ(value_at(y_full, r, c), 0.0) << label << " wrote outside y";
    }
  }
}

TEST(CpuGemm, LinearMatchesDoubleForAllDtypesAndStrides) {
  struct Size {
    int64_t n, in, out;
  };
  // Odd sizes cross every edge: the 6-row and 16-column register tiles, the 256-deep k block
  // (in = 301), the 512-column block (out = 531) and the 128-row linear tile (n = 129).
  const Size sizes[] = {{1, 1, 1}, {7, 67, 29}, {33, 301, 45}, {129, 31, 531}};
  const DType dtypes[] = {DType::kF32, DType::kBF16};
  std::mt19937 rng(1234);
  for (GemmVariant variant : available_variants()) {
    for (const Size& s : sizes) {
      for (DType xd : dtypes) {
        for (DType wd : dtypes) {
          for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {  // none, F32, BF16
            Matrix x = random_matrix(rng, s.n, s.in, xd, 5, 3);
            Matrix w = random_matrix(rng, s.out, s.in, wd, 0, 0);
            Matrix b =
                random_matrix(rng, 1, s.out, bias_kind == 2 ? DType::kBF16 : DType::kF32, 0, 0);
            Tensor bias = *b.view.reshape({s.out});
            const TensorView bias_view = bias.view();
            const TensorView* bias_arg = bias_kind == 0 ? nullptr : &bias_view;
            const std::string label =
                std::string(cpu::gemm_variant_name(variant)) + " n=" + std::to_string(s.n) +
                " in=" + std::to_string(s.in) + " out=" + std::to_string(s.out) + " x " +
                dtype_label(xd) + " w " + dtype_label(wd) + " bias " + std::to_string(bias_kind);
            Tensor y32_full = Tensor::zeros({s.n, s.out + 7}, DType::kF32);
            Tensor y16_full = Tensor::zeros({s.n, s.out + 7}, DType::kBF16);
            Tensor y32 = *y32_full.slice(1, 2, 2 + s.out);
            Tensor y16 = *y16_full.slice(1, 2, 2 + s.out);
            Status st = cpu::linear(x.view.view(), w.view.view(), bias_arg, y32.view(), variant);
            ASSERT_TRUE(st.ok()) << label << ": " << st.to_string();
            st = cpu::linear(x.view.view(), w.view.view(), bias_arg, y16.view(), variant);
            ASSERT_TRUE(st.ok()) << label << ": " << st.to_string();

            expect_linear_matches(x.view, w.view, bias_kind == 0 ? nullptr : &bias, y32,
                                  label + " y f32");
            expect_linear_matches(x.view, w.view, bias_kind == 0 ? nullptr : &bias, y16,
                                  label + " y bf16");
            // Rounded once: the BF16 output is exactly the RNE rounding of the F32 one (same
            // tiles, same sums).
            for (int64_t r = 0; r < s.n; ++r) {
              for (int64_t o = 0; o < s.out; ++o) {
                ASSERT_EQ(value_at(y16, r, o), round_bf16(static_cast<float>(value_at(y32, r, o))))
                    << label << " at [" << r << ", " << o << "]";
              }
            }
            expect_untouched_margins(y32_full, s.out, label);
            expect_untouched_margins(y16_full, s.out, label);
          }
        }
      }
    }
  }
}

TEST(CpuGemm, ColumnSplitAndWideBf16WeightMatchDouble) {
  // Few rows split the columns across threads; in·out > 2^20 widens the BF16 weight in blocks.
  std::mt19937 rng(99);
  for (GemmVariant variant : available_variants()) {
    Matrix x = random_matrix(rng, 3, 2051, DType::kBF16, 0, 0);
    Matrix w = random_matrix(rng, 601, 2051, DType::kBF16, 0, 0);
    Tensor y = Tensor::empty({3, 601}, DType::kF32);
    ASSERT_TRUE(cpu::linear(x.view.view(), w.view.view(), nullptr, y.view(), variant).ok());
    expect_linear_matches(x.view, w.view, nullptr, y, cpu::gemm_variant_name(variant));
  }
}

TEST(CpuGemm, PackedWeightGivesTheSameBits) {
  std::mt19937 rng(5);
  for (DType wd : {DType::kF32, DType::kBF16}) {
    Matrix x = random_matrix(rng, 70, 99, DType::kF32, 0, 0);
    Matrix w = random_matrix(rng, 37, 99, wd, 0, 0);
    auto packed = cpu::PackedWeight::pack(w.view);
    ASSERT_TRUE(packed.ok()) << packed.status().to_string();
    EXPECT_EQ(packed->out_features(), 37);
    EXPECT_EQ(packed->in_features(), 99);
    EXPECT_EQ(packed->weight().dtype(), DType::kF32);
    Tensor a = Tensor::empty({70, 37}, DType::kBF16);
    Tensor b = Tensor::empty({70, 37}, DType::kBF16);
    ASSERT_TRUE(cpu::linear(x.view.view(), w.view.view(), nullptr, a.view()).ok());
    ASSERT_TRUE(cpu::linear(x.view.view(), *packed, nullptr, b.view()).ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << dtype_label(wd);
  }
}

TEST(CpuGemm, BlasAndLoopsAgree) {
  if (!cpu::gemm_variant_available(GemmVariant::kBlas)) GTEST_SKIP() << "built without OpenBLAS";
  std::mt19937 rng(11);
  Matrix x = random_matrix(rng, 200, 515, DType::kF32, 0, 0);
  Matrix w = random_matrix(rng, 300, 515, DType::kBF16, 0, 0);
  Tensor blas = Tensor::empty({200, 300}, DType::kF32);
  Tensor loops = Tensor::empty({200, 300}, DType::kF32);
  ASSERT_TRUE(
      cpu::linear(x.view.view(), w.view.view(), nullptr, blas.view(), GemmVariant::kBlas).ok());
  ASSERT_TRUE(
      cpu::linear(x.view.view(), w.view.view(), nullptr, loops.view(), GemmVariant::kLoops).ok());
  // Outputs are ~N(0, 515); fp32 sums of 515 terms drift ~√515·2^-24·|partial sum| ≈ 2e-5 from
  // exact, and the largest blas-loops difference seen is 9e-5. A wrong element would be O(1).
  for (int64_t i = 0; i < blas.numel(); ++i) {
    ASSERT_NEAR(blas.data_as<float>()[i], loops.data_as<float>()[i], 1e-3) << i;
  }
}

TEST(CpuGemm, MatmulF32HandlesBothLayoutsOfB) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t m = 13, n = 37, k = 300;
  std::vector<float> a(m * k), bt(n * k), b(k * n);
  for (float& e : a) e = normal(rng);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) b[kk * n + j] = bt[j * k + kk] = normal(rng);
  }
  for (GemmVariant variant : available_variants()) {
    std::vector<float> c1(m * n), c2(m * n);
    cpu::matmul_f32(variant, true, m, n, k, 0.5f, a.data(), k, bt.data(), k, c1.data(), n);
    cpu::matmul_f32(variant, false, m, n, k, 0.5f, a.data(), k, b.data(), n, c2.data(), n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0.0;
        for (int64_t kk = 0; kk < k; ++kk) exact += double(a[i * k + kk]) * b[kk * n + j];
        ASSERT_NEAR(c1[i * n + j], 0.5 * exact, 1e-4) << cpu::gemm_variant_name(variant);
        ASSERT_NEAR(c2[i * n + j], 0.5 * exact, 1e-4) << cpu::gemm_variant_name(variant);
      }
    }
  }
}

TEST(CpuGemm, ZeroInputFeaturesGiveTheBias) {
  Tensor x = Tensor::empty({4, 0}, DType::kF32);
  Tensor w = Tensor::empty({3, 0}, DType::kBF16);
  Tensor bias = Tensor::from_f32({1.0f, -2.0f, 0.5f}, {3});
  Tensor y = Tensor::empty({4, 3}, DType::kF32);
  const TensorView bias_view = bias.view();
  for (GemmVariant variant : available_variants()) {
    ASSERT_TRUE(cpu::linear(x.view(), w.view(), &bias_view, y.view(), variant).ok());
    for (int64_t r = 0; r < 4; ++r) {
      EXPECT_EQ(value_at(y, r, 0), 1.0);
      EXPECT_EQ(value_at(y, r, 1), -2.0);
      EXPECT_EQ(value_at(y, r, 2), 0.5);
    }
  }
}

TEST(CpuGemm, BadOperandsAreNamedInTheError) {
  Tensor x = Tensor::zeros({4, 8}, DType::kF32);
  Tensor w = Tensor::zeros({5, 8}, DType::kBF16);
  Tensor y = Tensor::zeros({4, 5}, DType::kF32);
  auto expect_error = [](Status st, const std::string& needle) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  Tensor w_bad = Tensor::zeros({5, 9}, DType::kF32);
  expect_error(cpu::linear(x.view(), w_bad.view(), nullptr, y.view()), "w F32[5, 9]");
  Tensor y_bad = Tensor::zeros({4, 6}, DType::kF32);
  expect_error(cpu::linear(x.view(), w.view(), nullptr, y_bad.view()), "y F32[4, 6]");
  Tensor bias_bad = Tensor::zeros({4}, DType::kF32);
  const TensorView bias_view = bias_bad.view();
  expect_error(cpu::linear(x.view(), w.view(), &bias_view, y.view()), "bias F32[4]");
  Tensor x_i32 = Tensor::zeros({4, 8}, DType::kI32);
  expect_error(cpu::linear(x_i32.view(), w.view(), nullptr, y.view()), "x I32[4, 8]");
  Tensor xt = *Tensor::zeros({8, 4}, DType::kF32).transpose(0, 1);
  expect_error(cpu::linear(xt.view(), w.view(), nullptr, y.view()), "unit stride");
  Tensor wt = *Tensor::zeros({8, 5}, DType::kF32).transpose(0, 1);
  expect_error(cpu::linear(x.view(), wt.view(), nullptr, y.view()), "w F32[5, 8]");
}

// ---- parallel_for -------------------------------------------------------------------------------

TEST(Parallel, CoversTheRangeExactlyOnce) {
  EXPECT_GE(num_threads(), 1);
  for (int64_t grain : {1, 7, 100000}) {
    const int64_t begin = 3, end = 1003;
    std::vector<std::atomic<int>> hits(end);
    std::atomic<int> calls{0};
    parallel_for(
        begin, end,
        [&](int64_t lo, int64_t hi) {
          EXPECT_LT(lo, hi);
          ++calls;
          for (int64_t i = lo; i < hi; ++i) ++hits[i];
        },
        grain);
    for (int64_t i = 0; i < end; ++i) ASSERT_EQ(hits[i].load(), i >= begin ? 1 : 0) << i;
    EXPECT_LE(calls.load(), num_threads());
    if (grain > end) {
      EXPECT_EQ(calls.load(), 1);
    }
  }
  int empty_calls = 0;
  parallel_for(5, 5, [&](int64_t, int64_t) { ++empty_calls; });
  parallel_for(9, 2, [&](int64_t, int64_t) { ++empty_calls; });
  EXPECT_EQ(empty_calls, 0);
}

TEST(Parallel, NestedCallsRunInline) {
  const int64_t rows = 37, cols = 53;
  std::vector<std::atomic<int>> hits(rows * cols);
  parallel_for(0, rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      parallel_for(0, cols, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) ++hits[r * cols + c];
      });
    }
  });
  for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(Parallel, CallsFromSeveralThreadsAllComplete) {
  constexpr int kCallers = 3, kRounds = 50;
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        parallel_for(0, 100, [&](int64_t lo, int64_t hi) { total += hi - lo; });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t{kCallers} * kRounds * 100);
}

}  // namespace
}  // namespace vortex
