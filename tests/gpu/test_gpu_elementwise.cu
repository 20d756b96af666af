// CUDA elementwise and norm ops (cuda/elementwise.h) against the CPU reference on the same
// random inputs (fixed seeds): rows 1, 7, 129, 1000; channels 24, 48, 5376; F32 and BF16 and the
// mixed dtypes the block uses; column slices of wider buffers at 16-byte-aligned offsets (vector
// kernels) and at odd offsets (scalar kernels); q/k head views inside a fused [N, 3·H·D] buffer;
// modulation tables of R = 6 rows addressed by random int32 indices. Outputs are written into
// wider buffers of random bytes and the whole buffer is compared, so writes outside the view fail.
//
// Bounds, per op (see the expect_* helpers in gpu_test_util.h):
//   adaln_modulate, gated_residual, residual_add, apply_rope, scatter_rows, gather_rows, fill_zero:
//     bitwise equal. Same fp32 operations in the same order, explicitly rounded (no fma).
//   rms_norm: BF16 out <= 1 ulp everywhere, at most 1e-4 of the elements (+1) at 1 ulp; F32 out
//     max-rel <= 1e-6. The GPU sums squares in fp32 in tree order, the CPU in double: inv_rms moves
//     by a few fp32 ulps (~3e-7 relative), which flips a bf16 rounding only within a few fp32 ulps
//     of a tie (measured 3.5e-6 of the elements).
//   silu: the same with 1e-3 of the elements at 1 ulp. CUDA expf is within 2 ulp, glibc's within
//     1: silu moves by <= ~3 fp32 ulps (~4e-7 relative) and a bf16 rounding flips only next to a tie.
//   swiglu: F32 out max-rel <= 1e-6; BF16 out rounds twice, so an R(silu) flipped next to a tie can
//     move y by 2 ulps: the check is exact semantics instead (expect_swiglu_bf16).
#include <gtest/gtest-spi.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/elementwise.h"
#include "cpu/norm.h"
#include "cuda/elementwise.h"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

using test::columns;
using test::compare;
using test::Comparison;
using test::head_view;
using test::must;
using test::random_tensor;

// Fractions of bf16 elements allowed exactly 1 ulp from the CPU. rms_norm: 19 of 5.4M (3.5e-6) on
// [1000, 5376] with the kernel's summation order replayed on the host; 1e-4 keeps a 30x margin.
// silu / swiglu: CUDA's expf against glibc's, not measurable off the device; estimated ~1e-5
// (a few fp32 ulps of difference in a fraction of the elements, 2^-16 chance each of crossing a
// bf16 tie), so 1e-3.
constexpr double kNormOneUlpFraction = 1e-4;
constexpr double kExpOneUlpFraction = 1e-3;
constexpr double kF32RelBound = 1e-6;  // fp32 outputs of the same (rms_norm measured 3.5e-7)

constexpr int64_t kRows[] = {1, 7, 129, 1000};
constexpr int64_t kChannels[] = {24, 48, 5376};
constexpr DType kDtypes[] = {DType::kF32, DType::kBF16};
// Column offsets of the views inside their wider buffers: 8 keeps 16-byte alignment for both
// dtypes (the vector kernels), 3 breaks it (the scalar kernels).
constexpr int64_t kAlignedCol = 8, kOddCol = 3, kPad = 16;

std::string describe(const char* op, DType dtype, int64_t rows, int64_t channels, int64_t col) {
  return std::string(op) + " " + dtype_name(dtype) + " [" + std::to_string(rows) + ", " + std::to_string(channels) +
         "] at column " + std::to_string(col);
}

// The bound of the ops that differ from the CPU in the last fp32 bits (rms_norm, silu).
void expect_last_bits(const Comparison& c, DType out, double one_ulp_fraction, const std::string& what) {
  if (out == DType::kBF16) {
    test::expect_within_1ulp(c, one_ulp_fraction, what);
  } else {
    test::expect_max_rel(c, kF32RelBound, what);
  }
}

class GpuElementwise : public test::GpuTest {};

// ---- the checker itself ----------------------------------------------------------------------------

// The comparison and the bounds must flag a 2-ulp bf16 error, a 1-ulp error where bitwise is
// required, and a 3e-6 fp32 error; and let a 1-ulp bf16 error through the 1-ulp bound. No GPU needed.
TEST(GpuTestUtil, CheckerCatchesPerturbedOutputs) {
  const Tensor want = random_tensor({129, 48}, DType::kBF16, 7);
  Tensor got = want.clone();
  got.data_as<uint16_t>()[100] += 2;  // a normal value: +2 in the bits is 2 ulps away
  Comparison c = compare(got, want);
  EXPECT_EQ(c.differing, 1);
  EXPECT_EQ(c.beyond_1ulp, 1);
  EXPECT_EQ(c.max_ulp, 2);
  EXPECT_EQ(c.worst, 100);
  EXPECT_NONFATAL_FAILURE(test::expect_within_1ulp(c, kNormOneUlpFraction, "2-ulp"), "2-ulp");

  got.data_as<uint16_t>()[100] -= 1;
  c = compare(got, want);
  EXPECT_EQ(c.within_1ulp, 1);
  EXPECT_EQ(c.beyond_1ulp, 0);
  test::expect_within_1ulp(c, kNormOneUlpFraction, "1-ulp");
  EXPECT_NONFATAL_FAILURE(test::expect_bitwise(c, "1-ulp bitwise"), "1-ulp bitwise");

  const Tensor want32 = random_tensor({7, 24}, DType::kF32, 8);
  Tensor got32 = want32.clone();
  got32.data_as<float>()[5] *= 1.0f + 3e-6f;
  c = compare(got32, want32);
  EXPECT_GT(c.max_rel, 2e-6);
  EXPECT_NONFATAL_FAILURE(test::expect_max_rel(c, kF32RelBound, "f32"), "f32");

  got32.data_as<float>()[6] = NAN;
  got32.data_as<float>()[5] = want32.data_as<float>()[5];
  c = compare(got32, want32);
  EXPECT_EQ(c.nonfinite, 1);
  EXPECT_NONFATAL_FAILURE(test::expect_max_rel(c, kF32RelBound, "nan"), "nan");
}

// ---- rms_norm ------------------------------------------------------------------------------------

TEST_F(GpuElementwise, RmsNormMatchesCpu) {
  uint64_t seed = 1000;
  for (DType dtype : kDtypes) {
    for (int64_t c : kChannels) {
      for (int64_t n : kRows) {
        for (int64_t col : {kAlignedCol, kOddCol}) {
          ArenaScope scope(arena_);
          const std::string what = describe("rms_norm", dtype, n, c, col);
          Tensor x = random_tensor({n, c + kPad}, dtype, ++seed, 2.0f, 0.5f);
          Tensor w = random_tensor({c}, dtype, ++seed, 0.2f, 1.0f);
          Tensor y = random_tensor({n, c + kPad}, dtype, ++seed);
          const Tensor xd = to_device(x), wd = to_device(w), yd = to_device(y);
          const TensorView wdv = wd.view(), wv = w.view();
          VORTEX_EXPECT_OK(cuda::rms_norm(columns(xd, col, c), &wdv, 1e-5f, columns(yd, col, c), stream_));
          must(cpu::rms_norm(columns(x, col, c), &wv, 1e-5f, columns(y, col, c)));
          expect_last_bits(compare(to_host(yd), y), dtype, kNormOneUlpFraction, what);
        }
      }
    }
  }
}

// BF16 in, F32 out (the final norm feeding the fp32 heads), with an F32 weight or none.
TEST_F(GpuElementwise, RmsNormMixedDtypesAndNoWeight) {
  uint64_t seed = 2000;
  for (int64_t c : {48, 5376}) {
    for (int64_t n : {7, 1000}) {
      for (bool with_weight : {true, false}) {
        ArenaScope scope(arena_);
        const std::string what = describe("rms_norm bf16->f32", DType::kF32, n, c, 0) + (with_weight ? "" : " no weight");
        Tensor x = random_tensor({n, c}, DType::kBF16, ++seed, 1.5f);
        Tensor w = random_tensor({c}, DType::kF32, ++seed, 0.2f, 1.0f);
        Tensor y = Tensor::zeros({n, c}, DType::kF32);
        const Tensor xd = to_device(x), wd = to_device(w), yd = to_device(y);
        const TensorView wdv = wd.view(), wv = w.view();
        VORTEX_EXPECT_OK(cuda::rms_norm(xd.view(), with_weight ? &wdv : nullptr, 1e-5f, yd.view(), stream_));
        must(cpu::rms_norm(x.view(), with_weight ? &wv : nullptr, 1e-5f, y.view()));
        expect_last_bits(compare(to_host(yd), y), DType::kF32, kNormOneUlpFraction, what);
      }
    }
  }
}

// The per-head q/k norm of the block: in place on [N, H, D] views of a fused [N, 3·H·D] buffer.
TEST_F(GpuElementwise, RmsNormHeadsInPlaceInFusedQkv) {
  uint64_t seed = 3000;
  struct Heads {
    int64_t h, d;
  };
  for (DType dtype : kDtypes) {
    for (Heads hd : {Heads{3, 24}, Heads{56, 128}}) {
      for (int64_t n : kRows) {
        ArenaScope scope(arena_);
        const std::string what = describe("rms_norm heads", dtype, n, hd.h * hd.d, 0);
        const int64_t inner = hd.h * hd.d;
        Tensor fused = random_tensor({n, 3 * inner}, dtype, ++seed, 1.0f, 0.1f);
        Tensor wq = random_tensor({hd.d}, dtype, ++seed, 0.2f, 1.0f);
        Tensor wk = random_tensor({hd.d}, dtype, ++seed, 0.2f, 1.0f);
        const Tensor fd = to_device(fused), wqd = to_device(wq), wkd = to_device(wk);
        const TensorView wqdv = wqd.view(), wkdv = wkd.view(), wqv = wq.view(), wkv = wk.view();
        const TensorView qd = head_view(fd, 0, hd.h, hd.d), kd = head_view(fd, inner, hd.h, hd.d);
        VORTEX_EXPECT_OK(cuda::rms_norm(qd, &wqdv, 1e-5f, qd, stream_));
        VORTEX_EXPECT_OK(cuda::rms_norm(kd, &wkdv, 1e-5f, kd, stream_));
        const TensorView q = head_view(fused, 0, hd.h, hd.d), k = head_view(fused, inner, hd.h, hd.d);
        must(cpu::rms_norm(q, &wqv, 1e-5f, q));
        must(cpu::rms_norm(k, &wkv, 1e-5f, k));
        expect_last_bits(compare(to_host(fd), fused), dtype, kNormOneUlpFraction, what);
      }
    }
  }
}

// ---- adaln_modulate ------------------------------------------------------------------------------

struct ModulateDtypes {
  DType x, table, y;
};

TEST_F(GpuElementwise, AdalnModulateMatchesCpuBitwise) {
  uint64_t seed = 4000;
  constexpr int64_t kTableRows = 6;
  for (ModulateDtypes dt : {ModulateDtypes{DType::kBF16, DType::kBF16, DType::kBF16},
                            ModulateDtypes{DType::kF32, DType::kF32, DType::kF32},
                            ModulateDtypes{DType::kBF16, DType::kF32, DType::kBF16}}) {
    for (int64_t c : kChannels) {
      for (int64_t n : kRows) {
        for (int64_t col : {kAlignedCol, kOddCol}) {
          ArenaScope scope(arena_);
          const std::string what = describe("adaln_modulate", dt.y, n, c, col) + " table " + dtype_name(dt.table);
          // The block's modulation table: [R, 6·C] rows of (shift, scale, gate) x 2; views of columns.
          Tensor table = random_tensor({kTableRows, 6 * c}, dt.table, ++seed, 0.5f);
          Tensor x = random_tensor({n, c + kPad}, dt.x, ++seed);
          Tensor y = random_tensor({n, c + kPad}, dt.y, ++seed);
          const std::vector<int32_t> row = test::random_indices<int32_t>(n, kTableRows, ++seed);
          const Tensor td = to_device(table), xd = to_device(x), yd = to_device(y);
          const int32_t* rowd = device_vector(row);
          VORTEX_EXPECT_OK(cuda::adaln_modulate(columns(xd, col, c), columns(td, 0, c), columns(td, c, c), rowd,
                                                columns(yd, col, c), stream_));
          must(cpu::adaln_modulate(columns(x, col, c), columns(table, 0, c), columns(table, c, c), row,
                                   columns(y, col, c)));
          test::expect_bitwise(compare(to_host(yd), y), what);
        }
      }
    }
  }
}

TEST_F(GpuElementwise, AdalnModulateInPlaceAndBadRowIndex) {
  const int64_t n = 129, c = 5376;
  Tensor table = random_tensor({6, 6 * c}, DType::kBF16, 4101, 0.5f);
  Tensor x = random_tensor({n, c}, DType::kBF16, 4102);
  std::vector<int32_t> row = test::random_indices<int32_t>(n, 6, 4103);
  const Tensor td = to_device(table), xd = to_device(x);
  VORTEX_EXPECT_OK(cuda::adaln_modulate(xd.view(), columns(td, 3 * c, c), columns(td, 4 * c, c), device_vector(row),
                                        xd.view(), stream_));
  Tensor want = x.clone();
  must(cpu::adaln_modulate(want.view(), columns(table, 3 * c, c), columns(table, 4 * c, c), row, want.view()));
  test::expect_bitwise(compare(to_host(xd), want), "adaln_modulate in place");

  // Indices outside [0, R) cannot be checked on the host without a sync: those rows become NaN.
  row[5] = 6;
  row[77] = -1;
  const Tensor xd2 = to_device(x);
  VORTEX_EXPECT_OK(cuda::adaln_modulate(xd2.view(), columns(td, 0, c), columns(td, c, c), device_vector(row),
                                        xd2.view(), stream_));
  const Tensor got = to_host(xd2);
  for (int64_t i : {int64_t{5}, int64_t{77}}) {
    for (int64_t k = 0; k < c; ++k) {
      ASSERT_TRUE(std::isnan(bf16_bits_to_f32(got.data_as<uint16_t>()[i * c + k]))) << "row " << i << " col " << k;
    }
  }
  EXPECT_FALSE(std::isnan(bf16_bits_to_f32(got.data_as<uint16_t>()[6 * c])));
}

// ---- swiglu --------------------------------------------------------------------------------------

// The CPU's R(silu(g)), on the host: glibc expf, IEEE add and divide, one bf16 rounding.
float cpu_silu_bf16(float g) { return round_bf16(g / (1.0f + std::exp(-g))); }

// bf16 neighbour of a finite bf16 value, one ulp towards +inf (dir 1) or -inf (dir -1).
float bf16_step(float v, int dir) {
  const int64_t ord = test::ordered_bits_bf16(f32_to_bf16_bits(v)) + dir;
  const uint16_t bits = ord < 0 ? static_cast<uint16_t>(0x8000u | static_cast<uint16_t>(-ord))
                                : static_cast<uint16_t>(ord);
  return bf16_bits_to_f32(bits);
}

// swiglu with a BF16 output rounds twice: y = R(value * R(silu(gate))). Where CUDA's expf and the
// host's differ next to a bf16 tie, the GPU's R(silu) is the CPU's bf16 neighbour, and the product
// can then move by up to 2 ulps of y; everything else is the same fp32 arithmetic. So the bound is
// exact semantics, not an ulp count: every element equals R(value * s) with s the CPU's R(silu(gate))
// (bitwise) or one of its two bf16 neighbours, the neighbours for at most 1e-3 of the elements (+1);
// elements outside the view keep their bytes.
void expect_swiglu_bf16(const TensorView& u, const Tensor& got, const Tensor& want, int64_t col, int64_t f,
                        const std::string& what) {
  const int64_t n = got.size(0), width = got.size(1);
  int64_t neighbour = 0, wrong = 0;
  std::string first;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < width; ++j) {
      const uint16_t g = got.data_as<uint16_t>()[i * width + j], w = want.data_as<uint16_t>()[i * width + j];
      if (g == w) continue;
      bool explained = false;
      if (j >= col && j < col + f) {
        const int64_t k = j - col;
        const float value = test::view_element(u, i * 2 * f + k);
        const float s = cpu_silu_bf16(test::view_element(u, i * 2 * f + f + k));
        for (int dir : {-1, 1}) explained = explained || f32_to_bf16_bits(value * bf16_step(s, dir)) == g;
      }
      if (explained) {
        ++neighbour;
      } else if (wrong++ == 0) {
        first = "row " + std::to_string(i) + " col " + std::to_string(j) + ": got " +
                std::to_string(bf16_bits_to_f32(g)) + ", want " + std::to_string(bf16_bits_to_f32(w));
      }
    }
  }
  EXPECT_EQ(wrong, 0) << what << ": first at " << first;
  EXPECT_LE(static_cast<double>(neighbour), 1.0 + kExpOneUlpFraction * static_cast<double>(n * f))
      << what << ": " << neighbour << " elements used a neighbouring R(silu)";
}

TEST_F(GpuElementwise, SwigluMatchesCpu) {
  uint64_t seed = 5000;
  struct Dt {
    DType u, y;
  };
  for (Dt dt : {Dt{DType::kF32, DType::kF32}, Dt{DType::kBF16, DType::kBF16}, Dt{DType::kBF16, DType::kF32}}) {
    for (int64_t f : kChannels) {
      for (int64_t n : kRows) {
        for (int64_t col : {int64_t{0}, int64_t{1}}) {
          ArenaScope scope(arena_);
          const std::string what = describe("swiglu", dt.y, n, f, col) + " from " + dtype_name(dt.u);
          // Gate values over [-12, 12] or so: both tails of silu and its curved middle.
          Tensor u = random_tensor({n, 2 * f + kPad}, dt.u, ++seed, 3.0f);
          Tensor y = random_tensor({n, f + kPad}, dt.y, ++seed);
          const Tensor ud = to_device(u), yd = to_device(y);
          VORTEX_EXPECT_OK(cuda::swiglu(columns(ud, col, 2 * f), columns(yd, col, f), stream_));
          must(cpu::swiglu(columns(u, col, 2 * f), columns(y, col, f)));
          const Tensor got = to_host(yd);
          if (dt.y == DType::kBF16) {
            expect_swiglu_bf16(columns(u, col, 2 * f), got, y, col, f, what);
          } else {
            // One rounding (fp32): silu moves by <= ~3 fp32 ulps and no cancellation follows.
            test::expect_max_rel(compare(got, y), kF32RelBound, what);
          }
        }
      }
    }
  }
}

// The bf16 → bf16 instance computes on packed pairs (mul.rn.bf16x2 for R(value · R(silu))): bit
// for bit the F32-input instance on the same values with a bf16 output, which takes the scalar
// fp32 steps. Widths with and without 16-byte vectors, the FFN's included, and an offset view.
TEST_F(GpuElementwise, SwigluBf16PairsEqualScalarPathBitwise) {
  uint64_t seed = 5100;
  for (int64_t f : {int64_t{8}, int64_t{24}, int64_t{77}, int64_t{5376}, int64_t{14336}}) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{300}}) {
      for (int64_t col : {int64_t{0}, int64_t{8}}) {
        ArenaScope scope(arena_);
        const std::string what = describe("swiglu pairs", DType::kBF16, n, f, col);
        const Tensor u = random_tensor({n, 2 * f + kPad + 8}, DType::kBF16, ++seed, 3.0f);
        const Tensor u32 = must(u.to(DType::kF32));
        const Tensor ud = to_device(u), ud32 = to_device(u32);
        const Tensor pairs = must(arena_.alloc({n, f}, DType::kBF16)), scalar = must(arena_.alloc({n, f}, DType::kBF16));
        VORTEX_EXPECT_OK(cuda::swiglu(columns(ud, col, 2 * f), pairs.view(), stream_));
        VORTEX_EXPECT_OK(cuda::swiglu(columns(ud32, col, 2 * f), scalar.view(), stream_));
        const Tensor a = to_host(pairs), b = to_host(scalar);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what;
      }
    }
  }
}

// ---- gated_residual / residual_add ---------------------------------------------------------------

struct ResidualDtypes {
  DType x, gate, branch;
};
constexpr ResidualDtypes kResidualDtypes[] = {{DType::kBF16, DType::kBF16, DType::kBF16},
                                              {DType::kF32, DType::kF32, DType::kF32},
                                              {DType::kF32, DType::kBF16, DType::kBF16}};

TEST_F(GpuElementwise, GatedResidualMatchesCpuBitwise) {
  uint64_t seed = 6000;
  for (ResidualDtypes dt : kResidualDtypes) {
    for (int64_t c : kChannels) {
      for (int64_t n : kRows) {
        for (int64_t col : {kAlignedCol, kOddCol}) {
          ArenaScope scope(arena_);
          const std::string what = describe("gated_residual", dt.x, n, c, col) + " gate/branch " +
                                   dtype_name(dt.gate);
          Tensor table = random_tensor({6, 6 * c}, dt.gate, ++seed, 0.5f);
          Tensor x = random_tensor({n, c + kPad}, dt.x, ++seed, 4.0f);
          Tensor branch = random_tensor({n, c + kPad}, dt.branch, ++seed);
          const std::vector<int32_t> row = test::random_indices<int32_t>(n, 6, ++seed);
          const Tensor td = to_device(table), xd = to_device(x), bd = to_device(branch);
          VORTEX_EXPECT_OK(cuda::gated_residual(columns(xd, col, c), columns(td, 2 * c, c), device_vector(row),
                                                columns(bd, col, c), stream_));
          must(cpu::gated_residual(columns(x, col, c), columns(table, 2 * c, c), row, columns(branch, col, c)));
          test::expect_bitwise(compare(to_host(xd), x), what);
        }
      }
    }
  }
}

TEST_F(GpuElementwise, ResidualAddMatchesCpuBitwise) {
  uint64_t seed = 7000;
  for (ResidualDtypes dt : kResidualDtypes) {
    for (int64_t c : kChannels) {
      for (int64_t n : kRows) {
        for (int64_t col : {kAlignedCol, kOddCol}) {
          ArenaScope scope(arena_);
          const std::string what = describe("residual_add", dt.x, n, c, col) + " branch " + dtype_name(dt.branch);
          Tensor x = random_tensor({n, c + kPad}, dt.x, ++seed, 4.0f);
          Tensor branch = random_tensor({n, c + kPad}, dt.branch, ++seed);
          const Tensor xd = to_device(x), bd = to_device(branch);
          VORTEX_EXPECT_OK(cuda::residual_add(columns(xd, col, c), columns(bd, col, c), stream_));
          must(cpu::residual_add(columns(x, col, c), columns(branch, col, c)));
          test::expect_bitwise(compare(to_host(xd), x), what);
        }
      }
    }
  }
}

// More rows than one grid covers (gridDim.y is capped at 65535 and 2048 bf16 channels make one
// row per block), so the row loop's grid stride is exercised.
TEST_F(GpuElementwise, ResidualAddGridStride) {
  const int64_t n = 70001, c = 2048;
  Tensor x = random_tensor({n, c}, DType::kBF16, 7101, 4.0f);
  Tensor branch = random_tensor({n, c}, DType::kBF16, 7102);
  const Tensor xd = to_device(x), bd = to_device(branch);
  VORTEX_EXPECT_OK(cuda::residual_add(xd.view(), bd.view(), stream_));
  must(cpu::residual_add(x.view(), branch.view()));
  test::expect_bitwise(compare(to_host(xd), x), "residual_add [70001, 2048]");
}

// ---- apply_rope ----------------------------------------------------------------------------------

TEST_F(GpuElementwise, ApplyRopeInFusedQkvMatchesCpuBitwise) {
  uint64_t seed = 8000;
  struct Rope {
    int64_t h, d, rot;
  };
  // rot 16 of 24: vector kernel (half 8); rot 12: scalar kernel (half 6); 96 of 128: the model.
  for (DType dtype : kDtypes) {
    for (Rope r : {Rope{3, 24, 16}, Rope{3, 24, 12}, Rope{56, 128, 96}}) {
      for (int64_t n : kRows) {
        ArenaScope scope(arena_);
        const std::string what = describe("apply_rope", dtype, n, r.h * r.d, 0) + " rot " + std::to_string(r.rot);
        const int64_t inner = r.h * r.d;
        Tensor fused = random_tensor({n, 3 * inner}, dtype, ++seed);
        const Tensor angle = test::uniform_tensor({n, r.rot}, ++seed, -50.0f, 50.0f);
        Tensor cos = Tensor::empty({n, r.rot}, DType::kF32), sin = Tensor::empty({n, r.rot}, DType::kF32);
        for (int64_t i = 0; i < angle.numel(); ++i) {
          cos.data_as<float>()[i] = std::cos(angle.data_as<float>()[i]);
          sin.data_as<float>()[i] = std::sin(angle.data_as<float>()[i]);
        }
        const Tensor fd = to_device(fused), cd = to_device(cos), sd = to_device(sin);
        VORTEX_EXPECT_OK(cuda::apply_rope(head_view(fd, 0, r.h, r.d), cd.view(), sd.view(), stream_));
        VORTEX_EXPECT_OK(cuda::apply_rope(head_view(fd, inner, r.h, r.d), cd.view(), sd.view(), stream_));
        must(cpu::apply_rope(head_view(fused, 0, r.h, r.d), cos, sin));
        must(cpu::apply_rope(head_view(fused, inner, r.h, r.d), cos, sin));
        test::expect_bitwise(compare(to_host(fd), fused), what);
      }
    }
  }
}

// ---- scatter_rows / gather_rows ------------------------------------------------------------------

// dst[di, :] = R(src[si, :]) on host views: the reference of both row copies.
void copy_row(const TensorView& src, int64_t si, const TensorView& dst, int64_t di) {
  const int64_t c = src.shape[1];
  for (int64_t k = 0; k < c; ++k) {
    const float v = test::view_element(src, si * c + k);
    char* p = static_cast<char*>(dst.data) + (di * dst.strides[0] + k) * static_cast<int64_t>(dtype_size(dst.dtype));
    if (dst.dtype == DType::kBF16) {
      *reinterpret_cast<uint16_t*>(p) = f32_to_bf16_bits(v);
    } else {
      *reinterpret_cast<float*>(p) = v;
    }
  }
}

TEST_F(GpuElementwise, ScatterAndGatherRowsMatchHostBitwise) {
  uint64_t seed = 9000;
  struct Dt {
    DType src, out;
  };
  constexpr int64_t kExtraRows = 37;
  for (Dt dt : {Dt{DType::kF32, DType::kF32}, Dt{DType::kF32, DType::kBF16}, Dt{DType::kBF16, DType::kF32},
                Dt{DType::kBF16, DType::kBF16}}) {
    for (int64_t c : kChannels) {
      for (int64_t m : kRows) {
        for (int64_t col : {kAlignedCol, kOddCol}) {
          ArenaScope scope(arena_);
          const std::string what = describe("scatter/gather", dt.out, m, c, col) + " from " + dtype_name(dt.src);
          // Scatter m rows into a buffer of m + 37 (untouched rows must keep their bytes).
          Tensor src = random_tensor({m, c + kPad}, dt.src, ++seed);
          Tensor out = random_tensor({m + kExtraRows, c + kPad}, dt.out, ++seed);
          const std::vector<int64_t> index = test::random_distinct_indices(m, m + kExtraRows, ++seed);
          const Tensor srcd = to_device(src), outd = to_device(out);
          VORTEX_EXPECT_OK(cuda::scatter_rows(columns(srcd, col, c), device_vector(index), columns(outd, col, c),
                                              stream_));
          for (int64_t i = 0; i < m; ++i) copy_row(columns(src, col, c), i, columns(out, col, c), index[i]);
          test::expect_bitwise(compare(to_host(outd), out), "scatter " + what);

          // Gather m rows (with repeats) out of a source of m + 37.
          Tensor gsrc = random_tensor({m + kExtraRows, c + kPad}, dt.src, ++seed);
          Tensor gout = random_tensor({m, c + kPad}, dt.out, ++seed);
          const std::vector<int64_t> gindex = test::random_indices<int64_t>(m, m + kExtraRows, ++seed);
          const Tensor gsrcd = to_device(gsrc), goutd = to_device(gout);
          VORTEX_EXPECT_OK(cuda::gather_rows(columns(gsrcd, col, c), device_vector(gindex), columns(goutd, col, c),
                                             stream_));
          for (int64_t i = 0; i < m; ++i) copy_row(columns(gsrc, col, c), gindex[i], columns(gout, col, c), i);
          test::expect_bitwise(compare(to_host(goutd), gout), "gather " + what);
        }
      }
    }
  }
}

// Out-of-range indices: scatter leaves the output alone, gather writes a NaN row.
TEST_F(GpuElementwise, RowCopyBadIndex) {
  const int64_t m = 7, c = 48;
  Tensor src = random_tensor({m, c}, DType::kBF16, 9101);
  Tensor out = random_tensor({m, c}, DType::kBF16, 9102);
  const std::vector<int64_t> index = {0, 1, 2, 7, -1, 5, 6};
  const Tensor srcd = to_device(src), outd = to_device(out);
  VORTEX_EXPECT_OK(cuda::scatter_rows(srcd.view(), device_vector(index), outd.view(), stream_));
  for (int64_t i = 0; i < m; ++i) {
    if (index[i] >= 0 && index[i] < m) copy_row(src.view(), i, out.view(), index[i]);
  }
  test::expect_bitwise(compare(to_host(outd), out), "scatter with bad indices");

  const Tensor gd = to_device(out);
  VORTEX_EXPECT_OK(cuda::gather_rows(srcd.view(), device_vector(index), gd.view(), stream_));
  const Tensor got = to_host(gd);
  for (int64_t i = 0; i < m; ++i) {
    const bool bad = index[i] < 0 || index[i] >= m;
    for (int64_t k = 0; k < c; ++k) {
      const float v = bf16_bits_to_f32(got.data_as<uint16_t>()[i * c + k]);
      if (bad) {
        ASSERT_TRUE(std::isnan(v)) << "row " << i;
      } else {
        ASSERT_EQ(got.data_as<uint16_t>()[i * c + k], src.data_as<uint16_t>()[index[i] * c + k]) << "row " << i;
      }
    }
  }
}

// ---- silu / fill_zero ----------------------------------------------------------------------------

// A rank-1 view of n elements starting `offset` elements into t (offset 1 breaks 16-byte alignment).
TensorView flat_view(const Tensor& t, int64_t offset, int64_t n) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
  v.shape = Shape({n});
  v.strides = Shape({1});
  return v;
}

TEST_F(GpuElementwise, SiluMatchesCpu) {
  uint64_t seed = 10000;
  for (DType out : kDtypes) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{129}, int64_t{48003}, int64_t{129 * 5376 + 5}}) {
      for (int64_t offset : {int64_t{0}, int64_t{1}}) {
        ArenaScope scope(arena_);
        const std::string what = std::string("silu -> ") + dtype_name(out) + " n " + std::to_string(n) + " offset " +
                                 std::to_string(offset);
        const Tensor x = random_tensor({n + 1}, DType::kF32, ++seed, 4.0f);
        const Tensor y = random_tensor({n + 1}, out, ++seed);
        const Tensor xd = to_device(x), yd = to_device(y);
        VORTEX_EXPECT_OK(cuda::silu(flat_view(xd, offset, n), flat_view(yd, offset, n), stream_));
        Tensor want = must(x.slice(0, offset, offset + n)).clone();
        cpu::silu_f32(want);
        want = must(want.to(out));
        const Tensor got = to_host(yd);
        expect_last_bits(compare(flat_view(got, offset, n), want.view()), out, kExpOneUlpFraction, what);
        // The element outside the view keeps its bytes.
        const int64_t other = offset == 0 ? n : 0;
        EXPECT_EQ(test::view_element(flat_view(got, other, 1), 0), test::view_element(flat_view(y, other, 1), 0))
            << what;
      }
    }
  }
}

TEST_F(GpuElementwise, SiluInPlace) {
  const int64_t n = 5376 * 3 + 1;
  const Tensor x = random_tensor({n}, DType::kF32, 10101, 4.0f);
  const Tensor xd = to_device(x);
  VORTEX_EXPECT_OK(cuda::silu(xd.view(), xd.view(), stream_));
  Tensor want = x.clone();
  cpu::silu_f32(want);
  test::expect_max_rel(compare(to_host(xd), want), kF32RelBound, "silu in place");
}

TEST_F(GpuElementwise, FillZero) {
  for (DType dtype : kDtypes) {
    const Tensor xd = to_device(random_tensor({129, 48}, dtype, 11000));
    VORTEX_EXPECT_OK(cuda::fill_zero(xd.view(), stream_));
    test::expect_bitwise(compare(to_host(xd), Tensor::zeros({129, 48}, dtype)), "fill_zero");
    EXPECT_EQ(cuda::fill_zero(columns(xd, 0, 24), stream_).code(), StatusCode::kInvalidArgument);
  }
}

// ---- argument checks (no GPU needed: every case fails before any CUDA call) -------------------------

TensorView fake_device(const Shape& shape, DType dtype) {
  alignas(16) static char dummy[16];
  TensorView v;
  v.data = dummy;
  v.dtype = dtype;
  v.device = Device::kCuda;
  v.shape = shape;
  v.strides = contiguous_strides(shape);
  return v;
}

void expect_invalid(const Status& s, const std::string& names) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find(names), std::string::npos) << "message should name \"" << names << "\": " << s.message();
}

TEST(GpuElementwiseArgs, InvalidArgumentsNameTheOperand) {
  const DType bf = DType::kBF16, f = DType::kF32;
  const int32_t* row = reinterpret_cast<const int32_t*>(fake_device({1}, DType::kI32).data);
  const int64_t* idx = reinterpret_cast<const int64_t*>(fake_device({1}, DType::kI64).data);
  TensorView host = fake_device({4, 8}, bf);
  host.device = Device::kCpu;
  const TensorView x = fake_device({4, 8}, bf);

  expect_invalid(cuda::rms_norm(host, nullptr, 1e-5f, x, nullptr), "rms_norm input");
  expect_invalid(cuda::rms_norm(x, nullptr, 1e-5f, fake_device({4, 8}, DType::kI32), nullptr), "rms_norm output");
  const TensorView w = fake_device({7}, bf);
  expect_invalid(cuda::rms_norm(x, &w, 1e-5f, x, nullptr), "rms_norm weight");
  expect_invalid(cuda::rms_norm(fake_device({4}, bf), nullptr, 1e-5f, fake_device({4}, bf), nullptr), "rank 2 or 3");

  expect_invalid(cuda::adaln_modulate(x, fake_device({6, 8}, bf), fake_device({6, 9}, bf), row, x, nullptr),
                 "adaln_modulate scale");
  expect_invalid(cuda::adaln_modulate(x, fake_device({6, 4}, bf), fake_device({6, 4}, bf), row, x, nullptr),
                 "adaln_modulate shift");
  expect_invalid(cuda::adaln_modulate(x, fake_device({6, 8}, bf), fake_device({6, 8}, bf), nullptr, x, nullptr),
                 "adaln_modulate row");

  expect_invalid(cuda::swiglu(fake_device({4, 17}, bf), fake_device({4, 8}, bf), nullptr), "swiglu");
  expect_invalid(cuda::gated_residual(x, fake_device({6, 9}, bf), row, x, nullptr), "gated_residual gate");
  expect_invalid(cuda::gated_residual(x, fake_device({6, 8}, bf), row, fake_device({4, 9}, bf), nullptr),
                 "gated_residual branch");
  expect_invalid(cuda::residual_add(x, fake_device({5, 8}, bf), nullptr), "residual_add branch");

  const TensorView heads = fake_device({4, 2, 8}, bf);
  expect_invalid(cuda::apply_rope(heads, fake_device({4, 5}, f), fake_device({4, 5}, f), nullptr), "apply_rope cos");
  expect_invalid(cuda::apply_rope(heads, fake_device({4, 10}, f), fake_device({4, 10}, f), nullptr),
                 "apply_rope cos");
  expect_invalid(cuda::apply_rope(heads, fake_device({4, 4}, bf), fake_device({4, 4}, f), nullptr), "apply_rope cos");
  expect_invalid(cuda::apply_rope(heads, fake_device({4, 4}, f), fake_device({3, 4}, f), nullptr), "apply_rope sin");
  expect_invalid(cuda::apply_rope(x, fake_device({4, 4}, f), fake_device({4, 4}, f), nullptr), "apply_rope input");

  expect_invalid(cuda::scatter_rows(x, idx, fake_device({9, 7}, bf), nullptr), "scatter_rows");
  expect_invalid(cuda::gather_rows(x, nullptr, fake_device({9, 8}, bf), nullptr), "gather_rows index");
  expect_invalid(cuda::silu(x, fake_device({4, 8}, f), nullptr), "silu input");
  expect_invalid(cuda::silu(fake_device({4, 8}, f), fake_device({4, 9}, f), nullptr), "silu");
  expect_invalid(cuda::fill_zero(host, nullptr), "fill_zero");
}

}  // namespace
}  // namespace vortex
