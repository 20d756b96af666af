// GemmRunner (cuBLASLt) against cpu::linear on the same inputs: odd shapes, strided x and y (a
// column slice of a wider buffer, as the QKV output is), bias or not, every dtype combination;
// the four block GEMMs at the canonical 37,810 rows on sampled rows; the plan cache.
//
// Bounds.
// - f32 y (f32→f32 and bf16→f32): rel-L2 ≤ 1e-5. Both sides sum the same fp32 products (exact
//   ones for bf16 inputs) in different orders; reordering a length-I fp32 sum moves it by about
//   2^-24·sqrt(I) relative (~1e-6 at I = 5376), so 1e-5 leaves room and catches any TF32 path
//   (2^-11 relative per product, ~1e-3).
// - bf16 y: each element within 1 bf16 ulp of the CPU's bf16 (the two fp32 sums differ by far
//   less than an ulp, so they round to the same or adjacent bf16 values), except where
//   cancellation made the result tiny: such elements may be further off in ulps but must stay
//   within 2^-8·rms(y), and there may be at most 1 + 1e-3·count of them. (A CPU model of the two
//   summation orders, an fp32 FMA chain against 64-wide blocks added in fp32, puts about 2e-5 of
//   the elements beyond 1 ulp at I = 5376..14336 and none at I = 96.)
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cpu/gemm.h"
#include "cuda/gemm.h"
#include "cuda/runtime.h"
#include "gpu/gemm_attention_test_util.h"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

using test::must;

constexpr double kF32RelL2 = 1e-5;
constexpr double kBeyondOneUlpFraction = 1e-3;

class GpuGemm : public test::GpuTest {
 protected:
  void SetUp() override {
    test::GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    runner_ = must(cuda::GemmRunner::create(arena_));
  }
  std::unique_ptr<cuda::GemmRunner> runner_;
};

struct LinearCase {
  int64_t n, in, out;
  DType in_dtype, out_dtype;
  bool bias;
  // x is columns [x_col0, x_col0 + in) of a [n, in + x_pad] buffer; y likewise.
  int64_t x_pad = 0, x_col0 = 0, y_pad = 0, y_col0 = 0;

  std::string label() const {
    return "N=" + std::to_string(n) + " I=" + std::to_string(in) + " O=" + std::to_string(out) + " " +
           dtype_name(in_dtype) + "->" + dtype_name(out_dtype) + (bias ? " bias" : "") + " x[" +
           std::to_string(x_col0) + "+" + std::to_string(in) + " of " + std::to_string(in + x_pad) + "] y[" +
           std::to_string(y_col0) + "+" + std::to_string(out) + " of " + std::to_string(out + y_pad) + "]";
  }
};

constexpr unsigned char kSentinel = 0xA5;

// Checks one GPU linear against cpu::linear with the bounds above; y's padding columns must keep
// the sentinel bytes. Returns the comparison for the caller's summary.
test::Comparison check_case(cuda::GemmRunner& runner, cuda::DeviceArena& arena, cudaStream_t stream,
                            const LinearCase& c, uint64_t seed) {
  const std::string label = c.label();
  const Tensor x_full = test::random_tensor({c.n, c.in + c.x_pad}, c.in_dtype, seed);
  const Tensor w = test::random_tensor({c.out, c.in}, c.in_dtype, seed + 1, 1.0f / std::sqrt(static_cast<float>(c.in)));
  const Tensor bias = test::random_tensor({c.out}, c.out_dtype, seed + 2);
  const Tensor x = must(x_full.slice(1, c.x_col0, c.x_col0 + c.in));

  const size_t mark = arena.mark();
  const Tensor dx_full = must(cuda::upload(x_full, arena, stream));
  const Tensor dw = must(cuda::upload(w, arena, stream));
  const Tensor dbias = must(cuda::upload(bias, arena, stream));
  const Tensor dy_full = must(arena.alloc({c.n, c.out + c.y_pad}, c.out_dtype));
  EXPECT_EQ(cudaMemsetAsync(dy_full.data(), kSentinel, dy_full.nbytes(), stream), cudaSuccess);
  const Tensor dx = must(dx_full.slice(1, c.x_col0, c.x_col0 + c.in));
  const Tensor dy = must(dy_full.slice(1, c.y_col0, c.y_col0 + c.out));
  const TensorView dbias_view = dbias.view();
  const Status st = runner.linear(dx.view(), dw.view(), c.bias ? &dbias_view : nullptr, dy.view(), stream);
  const Tensor y_full = must(cuda::download(dy_full, stream));
  arena.release_to(mark);
  EXPECT_TRUE(st.ok()) << label << ": " << st.to_string();
  if (!st.ok()) return {};

  const size_t esize = dtype_size(c.out_dtype);
  const auto* bytes = static_cast<const unsigned char*>(y_full.data());
  int64_t clobbered = 0;
  for (int64_t r = 0; r < c.n; ++r) {
    for (int64_t col = 0; col < c.out + c.y_pad; ++col) {
      if (col >= c.y_col0 && col < c.y_col0 + c.out) continue;
      for (size_t b = 0; b < esize; ++b) clobbered += bytes[(r * (c.out + c.y_pad) + col) * esize + b] != kSentinel;
    }
  }
  EXPECT_EQ(clobbered, 0) << label << ": bytes written outside y";
  const Tensor y = must(y_full.slice(1, c.y_col0, c.y_col0 + c.out)).contiguous();

  Tensor ref = Tensor::empty({c.n, c.out}, c.out_dtype);
  const TensorView bias_view = bias.view();
  test::must(cpu::linear(x.view(), w.view(), c.bias ? &bias_view : nullptr, ref.view()));

  const test::Comparison cmp = test::compare(y, ref);
  EXPECT_EQ(cmp.nonfinite, 0) << label << ": " << cmp.summary();
  if (c.out_dtype == DType::kF32) {
    EXPECT_LE(cmp.rel_l2, kF32RelL2) << label << ": " << cmp.summary();
  } else {
    EXPECT_LE(static_cast<double>(cmp.beyond_1ulp), 1.0 + kBeyondOneUlpFraction * static_cast<double>(cmp.count))
        << label << ": " << cmp.summary();
    EXPECT_EQ(test::count_gross_bf16(y, ref), 0) << label << ": " << cmp.summary();
  }
  return cmp;
}

TEST_F(GpuGemm, MatchesCpuOnOddAndStridedShapes) {
  const std::pair<int64_t, int64_t> shapes[] = {{24, 48}, {48, 96}, {96, 24}, {5376, 96}, {96, 5376}};
  const std::pair<DType, DType> dtypes[] = {
      {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32}, {DType::kF32, DType::kF32}};
  double worst_f32 = 0.0, worst_bf16 = 0.0, worst_fraction = 0.0;
  uint64_t seed = 5376;
  for (int64_t n : {1, 7, 129, 1000}) {
    for (auto [in, out] : shapes) {
      for (auto [in_dtype, out_dtype] : dtypes) {
        for (bool bias : {false, true}) {
          for (bool strided : {false, true}) {
            LinearCase c{n, in, out, in_dtype, out_dtype, bias};
            if (strided) {  // 16-byte-aligned column slices, as the fused QKV buffer gives
              c.x_pad = 16, c.x_col0 = 8, c.y_pad = 40, c.y_col0 = 8;
            }
            const test::Comparison r = check_case(*runner_, arena_, stream_, c, seed += 3);
            if (out_dtype == DType::kF32) {
              worst_f32 = std::max(worst_f32, r.rel_l2);
            } else {
              worst_bf16 = std::max(worst_bf16, r.rel_l2);
              worst_fraction = std::max(worst_fraction, static_cast<double>(r.beyond_1ulp) /
                                                            static_cast<double>(std::max<int64_t>(r.count, 1)));
            }
          }
        }
      }
    }
  }
  std::printf("worst rel-L2: f32 y %.3e, bf16 y %.3e; worst fraction of bf16 elements beyond 1 ulp %.3e\n",
              worst_f32, worst_bf16, worst_fraction);
  RecordProperty("worst_f32_rel_l2", std::to_string(worst_f32));
  RecordProperty("worst_bf16_beyond_1ulp_fraction", std::to_string(worst_fraction));
}

TEST_F(GpuGemm, ElementAlignedViews) {
  // Slices starting at odd columns: pointers only 2- or 4-byte aligned, odd leading dimensions.
  // The plan cache keys on alignment, so these get kernels that accept it.
  uint64_t seed = 11;
  for (auto [in_dtype, out_dtype] : {std::pair{DType::kBF16, DType::kBF16}, std::pair{DType::kBF16, DType::kF32},
                                     std::pair{DType::kF32, DType::kF32}}) {
    for (bool bias : {false, true}) {
      const LinearCase c{129, 96, 48, in_dtype, out_dtype, bias, 3, 1, 5, 3};
      if (bias && out_dtype == DType::kBF16) {
        // cuBLASLt computes wrong values for this combination (see gemm.cc): it must be refused.
        const Tensor x = must(must(arena_.alloc({c.n, c.in + c.x_pad}, in_dtype)).slice(1, c.x_col0, c.x_col0 + c.in));
        const Tensor w = must(arena_.alloc({c.out, c.in}, in_dtype));
        const Tensor b = must(arena_.alloc({c.out}, out_dtype));
        const Tensor y = must(must(arena_.alloc({c.n, c.out + c.y_pad}, out_dtype)).slice(1, c.y_col0, c.y_col0 + c.out));
        const TensorView bv = b.view();
        EXPECT_EQ(runner_->linear(x.view(), w.view(), &bv, y.view(), stream_).code(), StatusCode::kInvalidArgument);
        continue;
      }
      check_case(*runner_, arena_, stream_, c, seed += 3);
    }
  }
}

TEST_F(GpuGemm, PlanCacheIsHitOnRepeats) {
  const Tensor x = must(arena_.alloc({100, 64}, DType::kBF16));
  const Tensor x2 = must(arena_.alloc({100, 64}, DType::kBF16));
  const Tensor w = must(arena_.alloc({32, 64}, DType::kBF16));
  const Tensor b = must(arena_.alloc({32}, DType::kBF16));
  const Tensor y = must(arena_.alloc({100, 32}, DType::kBF16));
  for (const Tensor* t : {&x, &x2, &w, &b}) must(test::fill_uniform(*t, 1, 1.0f, stream_));
  const TensorView bias = b.view();
  must(runner_->linear(x.view(), w.view(), nullptr, y.view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 1u);
  must(runner_->linear(x.view(), w.view(), nullptr, y.view(), stream_));
  must(runner_->linear(x2.view(), w.view(), nullptr, y.view(), stream_));  // other buffers, same alignment
  EXPECT_EQ(runner_->cached_plans(), 1u);
  must(runner_->linear(x.view(), w.view(), &bias, y.view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 2u);
  must(runner_->linear(must(x.slice(0, 0, 50)).view(), w.view(), &bias, must(y.slice(0, 0, 50)).view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 3u);
  must(runner_->linear(x.view(), w.view(), &bias, y.view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 3u);
  sync();
}

TEST_F(GpuGemm, RejectsBadOperands) {
  const Tensor x = must(arena_.alloc({10, 64}, DType::kBF16));
  const Tensor xf = must(arena_.alloc({10, 64}, DType::kF32));
  const Tensor w = must(arena_.alloc({32, 64}, DType::kBF16));
  const Tensor y = must(arena_.alloc({10, 32}, DType::kBF16));
  const Tensor bf = must(arena_.alloc({32}, DType::kF32));
  const TensorView f32_bias = bf.view();
  EXPECT_EQ(runner_->linear(x.view(), w.view(), &f32_bias, y.view(), stream_).code(),
            StatusCode::kInvalidArgument);  // a bf16 y takes a bf16 bias
  EXPECT_EQ(runner_->linear(xf.view(), w.view(), nullptr, y.view(), stream_).code(),
            StatusCode::kInvalidArgument);  // mixed input dtypes
  EXPECT_EQ(runner_->linear(must(x.slice(1, 0, 32)).view(), w.view(), nullptr, y.view(), stream_).code(),
            StatusCode::kInvalidArgument);  // I disagrees
  EXPECT_EQ(runner_->linear(x.view(), w.view(), nullptr, must(y.slice(0, 0, 5)).view(), stream_).code(),
            StatusCode::kInvalidArgument);  // N disagrees
  EXPECT_EQ(runner_->cached_plans(), 0u);
}

class GpuGemmCanonical : public GpuGemm {
 protected:
  size_t arena_bytes() const override { return size_t{3300} << 20; }  // FC1: x 0.4 + w 0.3 + y 2.2 GB
};

// The four GEMMs of an H3 block at the canonical 37,810 rows, checked on 64 sampled rows.
TEST_F(GpuGemmCanonical, BlockShapesOnSampledRows) {
  constexpr int64_t kRows = 37810;
  constexpr int64_t kSampled = 64;
  struct BlockGemm {
    const char* name;
    int64_t in, out;
  };
  const BlockGemm gemms[] = {{"qkv", 5376, 3 * 7168}, {"out", 7168, 5376}, {"fc1", 5376, 2 * 14336}, {"fc2", 14336, 5376}};
  std::vector<int64_t> rows = test::random_distinct_indices(kSampled - 2, kRows - 2, 37810);
  for (int64_t& r : rows) r += 1;
  rows.push_back(0);
  rows.push_back(kRows - 1);

  uint64_t seed = 100;
  for (const BlockGemm& g : gemms) {
    Tensor x_rows = Tensor::empty({kSampled, g.in}, DType::kBF16);
    Tensor y_rows = Tensor::empty({kSampled, g.out}, DType::kBF16);
    Tensor w_host;
    {
      ArenaScope scope(arena_);
      const Tensor x = must(arena_.alloc({kRows, g.in}, DType::kBF16));
      const Tensor w = must(arena_.alloc({g.out, g.in}, DType::kBF16));
      const Tensor y = must(arena_.alloc({kRows, g.out}, DType::kBF16));
      must(test::fill_uniform(x, seed++, 1.0f, stream_));
      must(test::fill_uniform(w, seed++, std::sqrt(3.0f / static_cast<float>(g.in)), stream_));
      must(runner_->linear(x.view(), w.view(), nullptr, y.view(), stream_));
      const size_t plans = runner_->cached_plans();
      must(runner_->linear(x.view(), w.view(), nullptr, y.view(), stream_));
      EXPECT_EQ(runner_->cached_plans(), plans) << g.name << ": a repeat must reuse the plan";
      sync();
      for (int64_t i = 0; i < kSampled; ++i) {
        const Tensor xr = test::download_2d(x.data(), DType::kBF16, g.in, rows[i], 1, 0, g.in);
        const Tensor yr = test::download_2d(y.data(), DType::kBF16, g.out, rows[i], 1, 0, g.out);
        std::memcpy(x_rows.data_as<uint16_t>() + i * g.in, xr.data(), xr.nbytes());
        std::memcpy(y_rows.data_as<uint16_t>() + i * g.out, yr.data(), yr.nbytes());
      }
      w_host = to_host(w);
    }
    Tensor ref = Tensor::empty({kSampled, g.out}, DType::kBF16);
    must(cpu::linear(x_rows.view(), w_host.view(), nullptr, ref.view()));
    const test::Comparison cmp = test::compare(y_rows, ref);
    EXPECT_EQ(cmp.nonfinite, 0) << g.name << ": " << cmp.summary();
    EXPECT_LE(static_cast<double>(cmp.beyond_1ulp), 1.0 + kBeyondOneUlpFraction * static_cast<double>(cmp.count))
        << g.name << ": " << cmp.summary();
    EXPECT_EQ(test::count_gross_bf16(y_rows, ref), 0) << g.name << ": " << cmp.summary();
    std::printf("%s [%lld, %lld]·[%lld, %lld]ᵀ on %lld rows: %s\n", g.name, static_cast<long long>(kRows),
                static_cast<long long>(g.in), static_cast<long long>(g.out), static_cast<long long>(g.in),
                static_cast<long long>(kSampled), cmp.summary().c_str());
    RecordProperty(std::string(g.name) + "_beyond_1ulp", std::to_string(cmp.beyond_1ulp));
  }
}

}  // namespace
}  // namespace vortex
