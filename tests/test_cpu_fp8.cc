// The fp8 recipe's CPU reference (cpu/fp8.h, rule in cpu/fp8_scale.h): the row-scale rule at its
// edges; every code against an independent brute-force nearest-e4m3 search (codes decoded from
// their fields with std::ldexp, ties to the even mantissa, saturation at 448); the round-trip
// error bound; strided views; the fused producers as "bf16 path, then quantize" (every form of
// the block norms: plain, residual, modulation, gated residual + modulation); linear_fp8
// against a double-precision product of the dequantized operands; and the recipe's error
// against the bf16 linear on N(0, 1) inputs.
//
// Bounds:
// - Round trip, per element: |q·scale − x| <= 2^-4·|x|·(1 + 2^-20) + 2^-10·scale + 2^-21·|x|,
//   which is half an e4m3 step (relative 2^-4 in the normal range, absolute 2^-10 in scaled units
//   among the subnormals) plus the fp32 roundings of inv and x·inv. rel-L2 over N(0, 1) rows:
//   <= 0.03 (measured 0.0264 for F32 and BF16 rows: 3 mantissa bits, so a rounding error of up
//   to 2^-4 relative, about 2^-4 / sqrt(3) · 0.7 in rms).
// - linear_fp8 with an F32 y: |y − ref| <= 2^-21·(|Σ·sa·sw| + |bias|) + 1e-30, where ref is the
//   double product of the dequantized operands. The sum is exact, and the fp32 rounding of the
//   sum, the two scale products and the bias add each contribute at most 2^-24.
// - fp8 against bf16 on y = x·wᵀ, x ~ N(0, 1) [64, 5376], w ~ N(0, 1/K) [256, 5376]: rel-L2 of the
//   fp8 linear against the exact product of the same bf16 operands <= 0.045, and >= 0.01 so that
//   a quantizer that quantizes nothing fails too. Measured 0.0374, which is what the round trip
//   predicts: each operand carries a 0.0264 relative rounding error, a dot product of
//   independent terms keeps it, and sqrt(2) · 0.0264 = 0.0373. The bf16 linear's own error
//   (measured 0.0017, bound 0.01) is checked and printed for scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cpu/elementwise.h"
#include "cpu/fp8.h"
#include "cpu/fp8_scale.h"
#include "must.h"
#include "cpu/gemm.h"
#include "cpu/norm.h"

namespace vortex {
namespace {

using test::must;

// N(0, stddev) values in fp32, rounded once into `dtype`.
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  Tensor f = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = normal(rng);
  return dtype == DType::kF32 ? f : must(f.to(dtype));
}

// Multiplies row r of a contiguous F32 tensor by 2^(e_r), e_r uniform in [-span, span]: rows of
// very different magnitudes, so that a scale applied to the wrong row shows.
void spread_rows(Tensor& t, uint64_t seed, int span) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> e(-span, span);
  const int64_t c = t.size(1);
  for (int64_t r = 0; r < t.size(0); ++r) {
    const float f = std::ldexp(1.0f, e(rng));
    for (int64_t k = 0; k < c; ++k) t.data_as<float>()[r * c + k] *= f;
  }
}

TensorView columns(const Tensor& t, int64_t col, int64_t width) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + col * static_cast<int64_t>(dtype_size(t.dtype()));
  v.shape = Shape({t.size(0), width});
  return v;
}

float element(const TensorView& v, int64_t r, int64_t c) {
  const char* p = static_cast<const char*>(v.data) + (r * v.strides[0] + c) * static_cast<int64_t>(dtype_size(v.dtype));
  if (v.dtype == DType::kBF16) return bf16_bits_to_f32(*reinterpret_cast<const uint16_t*>(p));
  return *reinterpret_cast<const float*>(p);
}

// ---- an independent e4m3 rounding: nearest finite value by search, ties to the even mantissa --------

struct E4m3Entry {
  double value;
  uint8_t code;
};

const std::vector<E4m3Entry>& e4m3_magnitudes() {
  static const std::vector<E4m3Entry> table = [] {
    std::vector<E4m3Entry> t;
    for (int c = 0; c <= 0x7E; ++c) {
      const int exp = (c >> 3) & 0xF, mant = c & 7;
      const double v = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(8 + mant, exp - 10);
      t.push_back({v, static_cast<uint8_t>(c)});
    }
    return t;
  }();
  return table;
}

double e4m3_decode(uint8_t code) {
  const double mag = e4m3_magnitudes()[code & 0x7F].value;
  return (code & 0x80) ? -mag : mag;
}

uint8_t brute_e4m3(float y) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(y));
  if (a >= 448.0) return sign | 0x7E;  // saturating: no infinity in e4m3
  const E4m3Entry* best = nullptr;
  double best_d = INFINITY;
  for (const E4m3Entry& e : e4m3_magnitudes()) {
    const double d = std::fabs(e.value - a);
    if (d < best_d || (d == best_d && (e.code & 1) == 0)) {
      best = &e;
      best_d = d;
    }
  }
  return sign | best->code;
}

// Every code of a quantized row against the brute-force rounding of x·inv, and the scale against
// max|x| / 448 (clamped) computed here in double and rounded once.
void expect_row_follows_rule(const TensorView& x, int64_t r, const uint8_t* codes, float scale,
                             const std::string& what) {
  const int64_t c = x.shape[1];
  double amax = 0.0;
  for (int64_t k = 0; k < c; ++k) amax = std::max(amax, std::fabs(static_cast<double>(element(x, r, k))));
  const double clamped = std::max(amax, std::ldexp(448.0, -126));
  ASSERT_EQ(scale, static_cast<float>(clamped / 448.0)) << what << " row " << r;
  const float inv = static_cast<float>(448.0 / clamped);
  int64_t wrong = 0;
  bool max_code_seen = false;
  for (int64_t k = 0; k < c; ++k) {
    const float x_k = element(x, r, k);
    const uint8_t want = brute_e4m3(x_k * inv);
    if (codes[k] != want && wrong++ < 3) {
      ADD_FAILURE() << what << " row " << r << " col " << k << ": x " << x_k << " code 0x" << std::hex << int{codes[k]}
                    << " want 0x" << int{want};
    }
    max_code_seen = max_code_seen || (codes[k] & 0x7F) == 0x7E;
  }
  if (amax > 0.0 && amax >= std::ldexp(448.0, -126)) {
    EXPECT_TRUE(max_code_seen) << what << " row " << r << ": the largest element must get code ±448";
  }
}

// ---- the scale rule ------------------------------------------------------------------------------------

TEST(CpuFp8, RowScaleRuleAtItsEdges) {
  const auto rule = [](float amax) { return fp8_row_scale(fp8_abs_bits(amax)); };
  Fp8RowScale s = rule(448.0f);
  EXPECT_TRUE(s.finite);
  EXPECT_EQ(s.scale, 1.0f);
  EXPECT_EQ(s.inv, 1.0f);

  s = rule(1.0f);
  EXPECT_EQ(s.scale, 1.0f / 448.0f);
  EXPECT_EQ(s.inv, 448.0f);

  // Zero and tiny rows: the clamp keeps the scale normal and the reciprocal finite.
  for (float tiny : {0.0f, -0.0f, 1e-40f, std::numeric_limits<float>::denorm_min(), 5e-36f}) {
    s = rule(tiny);
    EXPECT_TRUE(s.finite) << tiny;
    EXPECT_EQ(s.scale, std::ldexp(1.0f, -126)) << tiny;
    EXPECT_EQ(s.inv, std::ldexp(1.0f, 126)) << tiny;
    EXPECT_EQ(fp8_quantize(0.0f, s), 0x00);
    EXPECT_EQ(fp8_quantize(-0.0f, s), 0x80);
  }
  EXPECT_EQ(kFp8MinAmax, std::ldexp(448.0f, -126));
  s = rule(std::ldexp(448.0f, -125));  // just above the clamp: the plain rule
  EXPECT_EQ(s.scale, std::ldexp(1.0f, -125));

  // Non-finite rows: NaN scale and NaN codes whatever the element.
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    s = rule(bad);
    EXPECT_FALSE(s.finite);
    EXPECT_TRUE(std::isnan(s.scale));
    EXPECT_EQ(fp8_quantize(1.0f, s), kE4m3NanCode);
    EXPECT_EQ(fp8_quantize(-1.0f, s), kE4m3NanCode);
  }
  // The bits order: NaN above infinity above every finite value.
  EXPECT_GT(fp8_abs_bits(NAN), fp8_abs_bits(INFINITY));
  EXPECT_GT(fp8_abs_bits(INFINITY), fp8_abs_bits(std::numeric_limits<float>::max()));
}

TEST(CpuFp8, RoundingTiesSaturationAndSubnormals) {
  // amax = 448: inv = 1, so the codes are e4m3(x) itself.
  const std::vector<float> row = {448.0f,
                                  1.0625f,                 // tie 1 | 1.125 -> 1 (even)
                                  1.1875f,                 // tie 1.125 | 1.25 -> 1.25 (even)
                                  -1.0625f,                // sign kept
                                  432.0f,                  // tie 416 | 448 -> 448 (even)
                                  424.0f,                  // below the tie -> 416
                                  std::ldexp(1.0f, -10),   // tie 0 | 2^-9 -> 0 (even)
                                  std::ldexp(3.0f, -10),   // tie 2^-9 | 2^-8 -> 2^-8 (even)
                                  std::ldexp(1.0f, -9),    // smallest subnormal
                                  std::ldexp(7.0f, -9),    // largest subnormal
                                  std::ldexp(15.0f, -10),  // tie 7·2^-9 | 2^-6 -> 2^-6 (the smallest normal)
                                  std::ldexp(1.0f, -11),   // below half the smallest subnormal -> 0
                                  0.0f,
                                  -0.0f};
  const std::vector<uint8_t> want = {0x7E, 0x38, 0x3A, 0xB8, 0x7E, 0x7D, 0x00, 0x02,
                                     0x01, 0x07, 0x08, 0x00, 0x00, 0x80};
  Tensor x = Tensor::from_f32(row, {1, static_cast<int64_t>(row.size())});
  const cpu::Fp8Rows q = must(cpu::quantize_rows_fp8(x.view()));
  EXPECT_EQ(q.scales.data_as<float>()[0], 1.0f);
  for (size_t k = 0; k < row.size(); ++k) {
    EXPECT_EQ(q.codes.data_as<uint8_t>()[k], want[k]) << "element " << k << " = " << row[k];
  }

  // Saturation inside a row: amaxes whose x·inv overshoots 448 in fp32 must still give ±448.
  int overshoots = 0;
  float a = 1.0f;
  for (int i = 0; i < 100000 && overshoots < 20; ++i, a = std::nextafter(a, 2.0f)) {
    const Fp8RowScale s = fp8_row_scale(fp8_abs_bits(a));
    if (a * s.inv <= 448.0f) continue;
    ++overshoots;
    Tensor t = Tensor::from_f32({a, -a, 0.5f * a}, {1, 3});
    const cpu::Fp8Rows qt = must(cpu::quantize_rows_fp8(t.view()));
    EXPECT_EQ(qt.codes.data_as<uint8_t>()[0], 0x7E) << a;
    EXPECT_EQ(qt.codes.data_as<uint8_t>()[1], 0xFE) << a;
  }
  EXPECT_GT(overshoots, 0) << "no amax in the scan overshoots 448: the saturation path went untested";

  // Non-finite rows: every code NaN, scale NaN; the other rows are unaffected.
  Tensor bad = Tensor::from_f32({1.0f, NAN, 2.0f, 3.0f, -INFINITY, 4.0f, 1.0f, 2.0f, 448.0f}, {3, 3});
  const cpu::Fp8Rows qb = must(cpu::quantize_rows_fp8(bad.view()));
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(std::isnan(qb.scales.data_as<float>()[r])) << r;
    for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(qb.codes.data_as<uint8_t>()[r * 3 + k], kE4m3NanCode) << r << "," << k;
  }
  EXPECT_EQ(qb.scales.data_as<float>()[2], 1.0f);
  EXPECT_EQ(qb.codes.data_as<uint8_t>()[8], 0x7E);

  // bf16 subnormal rows: the clamped scale and the plain rounding of x · 2^126.
  Tensor tiny = Tensor::from_f32({std::ldexp(1.0f, -133), -std::ldexp(3.0f, -130), std::ldexp(1.0f, -127)}, {1, 3});
  const Tensor tiny_bf16 = must(tiny.to(DType::kBF16));
  const cpu::Fp8Rows qt = must(cpu::quantize_rows_fp8(tiny_bf16.view()));
  EXPECT_EQ(qt.scales.data_as<float>()[0], std::ldexp(1.0f, -126));
  expect_row_follows_rule(tiny_bf16.view(), 0, qt.codes.data_as<uint8_t>(), qt.scales.data_as<float>()[0], "tiny");
}

TEST(CpuFp8, CodesMatchBruteForceOnRandomRowsOfEveryMagnitude) {
  uint64_t seed = 100;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t c : {1, 7, 48, 77, 1000}) {
      Tensor f = random_tensor({37, c}, DType::kF32, ++seed);
      spread_rows(f, ++seed, 40);
      const Tensor x = dtype == DType::kF32 ? f : must(f.to(dtype));
      const cpu::Fp8Rows q = must(cpu::quantize_rows_fp8(x.view()));
      for (int64_t r = 0; r < 37; ++r) {
        expect_row_follows_rule(x.view(), r, q.codes.data_as<uint8_t>() + r * c, q.scales.data_as<float>()[r],
                                std::string(dtype_name(dtype)) + " C=" + std::to_string(c));
      }
    }
  }
}

TEST(CpuFp8, RoundTripErrorWithinHalfAStep) {
  const int64_t n = 257, c = 1000;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Tensor x = random_tensor({n, c}, dtype, 200);
    const cpu::Fp8Rows q = must(cpu::quantize_rows_fp8(x.view()));
    double num = 0.0, den = 0.0;
    int64_t beyond = 0;
    for (int64_t r = 0; r < n; ++r) {
      const double scale = q.scales.data_as<float>()[r];
      for (int64_t k = 0; k < c; ++k) {
        const double v = element(x.view(), r, k);
        const double deq = e4m3_decode(q.codes.data_as<uint8_t>()[r * c + k]) * scale;
        const double err = std::fabs(deq - v);
        const double bound = std::ldexp(std::fabs(v), -4) * (1.0 + std::ldexp(1.0, -20)) + std::ldexp(scale, -10) +
                             std::ldexp(std::fabs(v), -21);
        beyond += err > bound;
        num += err * err;
        den += v * v;
      }
    }
    const double rel_l2 = std::sqrt(num / den);
    std::printf("e4m3 round trip on N(0, 1) %s rows: rel-L2 %.4f\n", dtype_name(dtype), rel_l2);
    EXPECT_EQ(beyond, 0) << dtype_name(dtype);
    EXPECT_LE(rel_l2, 0.03) << dtype_name(dtype);
  }
}

TEST(CpuFp8, StridedViewsAndWeightsQuantizeLikeContiguousRows) {
  const int64_t n = 19, c = 45, pad = 11, col = 3;
  const Tensor wide = random_tensor({n, c + pad}, DType::kBF16, 300);
  const Tensor dense = must(wide.slice(1, col, col + c)).contiguous();
  const cpu::Fp8Rows want = must(cpu::quantize_rows_fp8(dense.view()));

  // Codes into the middle of a wider buffer of sentinel bytes.
  Tensor codes = Tensor::empty({n, c + pad}, DType::kF8E4M3);
  std::memset(codes.data(), 0xA5, codes.nbytes());
  Tensor scales = Tensor::empty({n}, DType::kF32);
  TensorView codes_view = columns(codes, col, c);
  must(cpu::quantize_rows_fp8(columns(wide, col, c), codes_view, scales.view()));
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_EQ(scales.data_as<float>()[r], want.scales.data_as<float>()[r]) << r;
    for (int64_t k = 0; k < c + pad; ++k) {
      const uint8_t got = codes.data_as<uint8_t>()[r * (c + pad) + k];
      if (k >= col && k < col + c) {
        EXPECT_EQ(got, want.codes.data_as<uint8_t>()[r * c + k - col]) << r << "," << k;
      } else {
        EXPECT_EQ(got, 0xA5) << "written outside the codes view at " << r << "," << k;
      }
    }
  }

  // A weight [O, I] is quantized per output channel: its rows.
  const Tensor w = random_tensor({48, 32}, DType::kBF16, 301, 0.05f);
  const cpu::Fp8Rows qw = must(cpu::quantize_weight_fp8(w.view()));
  const cpu::Fp8Rows qr = must(cpu::quantize_rows_fp8(w.view()));
  EXPECT_EQ(qw.codes.shape(), Shape({48, 32}));
  EXPECT_EQ(qw.scales.shape(), Shape({48}));
  EXPECT_EQ(std::memcmp(qw.codes.data(), qr.codes.data(), qr.codes.nbytes()), 0);
  EXPECT_EQ(std::memcmp(qw.scales.data(), qr.scales.data(), qr.scales.nbytes()), 0);
}

// ---- the fused producers: the bf16 path, then the quantizer ------------------------------------------

void expect_same_rows(const Tensor& codes, const Tensor& scales, const cpu::Fp8Rows& want, const std::string& what) {
  EXPECT_EQ(std::memcmp(codes.data(), want.codes.data(), want.codes.nbytes()), 0) << what << ": codes";
  EXPECT_EQ(std::memcmp(scales.data(), want.scales.data(), want.scales.nbytes()), 0) << what << ": scales";
}

TEST(CpuFp8, FusedProducersAreTheBf16PathThenQuantize) {
  uint64_t seed = 400;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int64_t c : {24, 77, 5376}) {
      const int64_t n = 7, table_rows = 6;
      const std::string what = std::string(dtype_name(dtype)) + " C=" + std::to_string(c);
      const Tensor x_wide = random_tensor({n, c + 5}, dtype, ++seed, 2.0f);  // x: strided rows
      const Tensor branch = random_tensor({n, c}, dtype, ++seed);
      const Tensor w = random_tensor({c}, DType::kBF16, ++seed, 0.2f);
      const Tensor table = random_tensor({table_rows, 6 * c}, DType::kBF16, ++seed, 0.5f);
      const std::vector<int32_t> row = {0, 5, 3, 3, 1, 2, 4};
      const TensorView wv = w.view(), bv = branch.view(), shift = columns(table, 3 * c, c),
                       scale = columns(table, 4 * c, c), gate = columns(table, 2 * c, c);

      // The four forms the blocks use: refiner norm1 and norm2, transformer norm1 and norm2.
      struct Form {
        const char* name;
        cpu::Fp8NormFusion fusion;
      };
      const Form forms[] = {{"plain", {}},
                            {"residual", {&bv, nullptr, nullptr, nullptr, nullptr, nullptr}},
                            {"modulate", {nullptr, nullptr, nullptr, &shift, &scale, &row}},
                            {"gated residual + modulate", {&bv, &gate, &row, &shift, &scale, &row}}};
      for (const Form& form : forms) {
        const std::string label = std::string(form.name) + " " + what;
        // The bf16 path, step by step.
        const Tensor x_want = x_wide.clone();
        const TensorView xw = columns(x_want, 5, c);
        if (form.fusion.gate) {
          must(cpu::gated_residual(xw, gate, row, bv));
        } else if (form.fusion.branch) {
          must(cpu::residual_add(xw, bv));
        }
        Tensor h = Tensor::empty({n, c}, DType::kBF16);
        must(cpu::rms_norm(xw, &wv, 1e-5f, h.view()));
        if (form.fusion.shift) must(cpu::adaln_modulate(h.view(), shift, scale, row, h.view()));
        const cpu::Fp8Rows want = must(cpu::quantize_rows_fp8(h.view()));

        const Tensor x_got = x_wide.clone();
        Tensor codes = Tensor::empty({n, c}, DType::kF8E4M3), scales = Tensor::empty({n}, DType::kF32);
        must(cpu::rms_norm_fused_quantize_fp8(columns(x_got, 5, c), &wv, 1e-5f, form.fusion, codes.view(),
                                              scales.view()));
        expect_same_rows(codes, scales, want, label);
        EXPECT_EQ(std::memcmp(x_got.data(), x_want.data(), x_want.nbytes()), 0) << label << ": x after the residual";
      }

      // The bf16 rounding points matter: quantizing the fp32 norm instead gives other scales.
      Tensor h32 = Tensor::empty({n, c}, DType::kF32);
      must(cpu::rms_norm(columns(x_wide, 5, c), &wv, 1e-5f, h32.view()));
      const cpu::Fp8Rows f32_path = must(cpu::quantize_rows_fp8(h32.view()));
      Tensor codes = Tensor::empty({n, c}, DType::kF8E4M3), scales = Tensor::empty({n}, DType::kF32);
      must(cpu::rms_norm_fused_quantize_fp8(columns(x_wide, 5, c), &wv, 1e-5f, {}, codes.view(), scales.view()));
      EXPECT_NE(std::memcmp(scales.data(), f32_path.scales.data(), f32_path.scales.nbytes()), 0) << what;

      const Tensor u = random_tensor({n, 2 * c}, dtype, ++seed, 3.0f);
      Tensor p = Tensor::empty({n, c}, DType::kBF16);
      must(cpu::swiglu(u.view(), p.view()));
      const cpu::Fp8Rows want_swiglu = must(cpu::quantize_rows_fp8(p.view()));
      must(cpu::swiglu_quantize_fp8(u.view(), codes.view(), scales.view()));
      expect_same_rows(codes, scales, want_swiglu, "swiglu " + what);
    }
  }
}

// ---- linear_fp8 --------------------------------------------------------------------------------------

TEST(CpuFp8, LinearMatchesDoubleProductOfDequantizedOperands) {
  uint64_t seed = 500;
  struct Case {
    int64_t m, k, n;
  };
  for (Case cs : {Case{1, 16, 16}, Case{7, 37, 48}, Case{33, 256, 17}, Case{5, 1000, 64}}) {
    for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {  // none, F32, BF16
      const std::string what = "M=" + std::to_string(cs.m) + " K=" + std::to_string(cs.k) + " N=" +
                               std::to_string(cs.n) + " bias " + std::to_string(bias_kind);
      Tensor a = random_tensor({cs.m, cs.k}, DType::kF32, ++seed);
      Tensor w = random_tensor({cs.n, cs.k}, DType::kF32, ++seed, 0.05f);
      spread_rows(a, ++seed, 6);
      spread_rows(w, ++seed, 6);
      const cpu::Fp8Rows qa = must(cpu::quantize_rows_fp8(must(a.to(DType::kBF16)).view()));
      const cpu::Fp8Rows qw = must(cpu::quantize_weight_fp8(w.view()));
      const Tensor bias = random_tensor({cs.n}, bias_kind == 2 ? DType::kBF16 : DType::kF32, ++seed);
      const TensorView bias_view = bias.view();
      const TensorView* b = bias_kind == 0 ? nullptr : &bias_view;

      Tensor y = Tensor::empty({cs.m, cs.n}, DType::kF32);
      must(cpu::linear_fp8(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), b, y.view()));
      Tensor y16 = Tensor::empty({cs.m, cs.n}, DType::kBF16);
      must(cpu::linear_fp8(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), b, y16.view()));

      int64_t beyond = 0;
      for (int64_t i = 0; i < cs.m; ++i) {
        const double sa = qa.scales.data_as<float>()[i];
        for (int64_t j = 0; j < cs.n; ++j) {
          const double sw = qw.scales.data_as<float>()[j];
          double ref = 0.0;
          for (int64_t k = 0; k < cs.k; ++k) {
            ref += (e4m3_decode(qa.codes.data_as<uint8_t>()[i * cs.k + k]) * sa) *
                   (e4m3_decode(qw.codes.data_as<uint8_t>()[j * cs.k + k]) * sw);
          }
          const double bj = b ? element_as_double(bias, j) : 0.0;
          const double got = y.data_as<float>()[i * cs.n + j];
          const double bound = std::ldexp(std::fabs(ref) + std::fabs(bj), -21) + 1e-30;
          beyond += std::fabs(got - (ref + bj)) > bound;
          EXPECT_EQ(f32_to_bf16_bits(y.data_as<float>()[i * cs.n + j]), y16.data_as<uint16_t>()[i * cs.n + j])
              << what << " bf16 y is not the fp32 value rounded once";
        }
      }
      EXPECT_EQ(beyond, 0) << what;
    }
  }
}

TEST(CpuFp8, RecipeErrorAgainstBf16LinearOnNormalInputs) {
  const int64_t m = 64, k = 5376, n = 256;
  const Tensor x = random_tensor({m, k}, DType::kBF16, 600);
  const Tensor w = random_tensor({n, k}, DType::kBF16, 601, 1.0f / std::sqrt(static_cast<float>(k)));

  // The exact product of the bf16 operands both recipes start from.
  std::vector<double> exact(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        s += static_cast<double>(bf16_bits_to_f32(x.data_as<uint16_t>()[i * k + c])) *
             bf16_bits_to_f32(w.data_as<uint16_t>()[j * k + c]);
      }
      exact[i * n + j] = s;
    }
  }
  const auto rel_l2 = [&](const Tensor& y) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < m * n; ++i) {
      const double d = bf16_bits_to_f32(y.data_as<uint16_t>()[i]) - exact[i];
      num += d * d;
      den += exact[i] * exact[i];
    }
    return std::sqrt(num / den);
  };

  Tensor y_bf16 = Tensor::empty({m, n}, DType::kBF16);
  must(cpu::linear(x.view(), w.view(), nullptr, y_bf16.view()));
  const cpu::Fp8Rows qa = must(cpu::quantize_rows_fp8(x.view()));
  const cpu::Fp8Rows qw = must(cpu::quantize_weight_fp8(w.view()));
  Tensor y_fp8 = Tensor::empty({m, n}, DType::kBF16);
  must(cpu::linear_fp8(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), nullptr, y_fp8.view()));

  const double e_bf16 = rel_l2(y_bf16), e_fp8 = rel_l2(y_fp8);
  std::printf("linear [%lld, %lld] x [%lld, %lld]^T on N(0, 1): rel-L2 vs exact: bf16 %.4f, fp8 %.4f\n",
              static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
              static_cast<long long>(k), e_bf16, e_fp8);
  EXPECT_LE(e_fp8, 0.045);
  EXPECT_GE(e_fp8, 0.01);
  EXPECT_LE(e_bf16, 0.01);
}

// ---- bad input -----------------------------------------------------------------------------------

void expect_invalid(const Status& s, const std::string& names) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find(names), std::string::npos) << "message should name \"" << names << "\": " << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line: " << s.message();
}

TEST(CpuFp8, BadInputIsNamed) {
  const Tensor x = random_tensor({4, 32}, DType::kBF16, 700);
  Tensor codes = Tensor::empty({4, 32}, DType::kF8E4M3), scales = Tensor::empty({4}, DType::kF32);
  const Tensor wrong_codes = Tensor::empty({4, 32}, DType::kU8);
  const Tensor short_scales = Tensor::empty({3}, DType::kF32);
  expect_invalid(cpu::quantize_rows_fp8(x.view(), wrong_codes.view(), scales.view()), "quantize_rows_fp8 codes");
  expect_invalid(cpu::quantize_rows_fp8(x.view(), Tensor::empty({4, 31}, DType::kF8E4M3).view(), scales.view()),
                 "quantize_rows_fp8 codes");
  expect_invalid(cpu::quantize_rows_fp8(x.view(), codes.view(), short_scales.view()), "quantize_rows_fp8 scales");
  expect_invalid(cpu::quantize_rows_fp8(Tensor::empty({4, 32}, DType::kI32).view(), codes.view(), scales.view()),
                 "quantize_rows_fp8 input");
  expect_invalid(cpu::quantize_rows_fp8(Tensor::empty({4, 0}, DType::kF32).view()).status(), "quantize_rows_fp8 input");
  expect_invalid(cpu::quantize_weight_fp8(Tensor::empty({32}, DType::kBF16).view()).status(),
                 "quantize_weight_fp8 weight");
  TensorView on_device = codes.view();
  on_device.device = Device::kCuda;
  expect_invalid(cpu::quantize_rows_fp8(x.view(), on_device, scales.view()), "quantize_rows_fp8 codes");

  const Tensor table = random_tensor({6, 64}, DType::kBF16, 701);
  const TensorView shift = columns(table, 0, 32), scale = columns(table, 32, 32);
  const std::vector<int32_t> bad_rows = {0, 1, 6, 2};
  // Refused after the residual step: x must be left as it was.
  const Tensor x_before = x.clone();
  const TensorView branch = x_before.view();
  expect_invalid(cpu::rms_norm_fused_quantize_fp8(x.view(), nullptr, 1e-5f,
                                                  {&branch, nullptr, nullptr, &shift, &scale, &bad_rows},
                                                  codes.view(), scales.view()),
                 "row index 6");
  EXPECT_EQ(std::memcmp(x.data(), x_before.data(), x.nbytes()), 0) << "a refused call changed x";
  expect_invalid(cpu::rms_norm_fused_quantize_fp8(x.view(), nullptr, 1e-5f, {nullptr, &shift, &bad_rows},
                                                  codes.view(), scales.view()),
                 "rms_norm_fused_quantize_fp8 gate");
  expect_invalid(cpu::rms_norm_fused_quantize_fp8(x.view(), nullptr, 1e-5f, {nullptr, nullptr, nullptr, &shift},
                                                  codes.view(), scales.view()),
                 "rms_norm_fused_quantize_fp8 shift");
  expect_invalid(cpu::rms_norm_fused_quantize_fp8(x.view(), nullptr, 1e-5f, {}, codes.view(), short_scales.view()),
                 "rms_norm_fused_quantize_fp8 scales");
  expect_invalid(cpu::swiglu_quantize_fp8(x.view(), codes.view(), scales.view()), "swiglu_quantize_fp8 codes");
  expect_invalid(cpu::swiglu_quantize_fp8(Tensor::empty({4, 33}, DType::kBF16).view(), codes.view(), scales.view()),
                 "swiglu_quantize_fp8 input");

  const cpu::Fp8Rows qa = must(cpu::quantize_rows_fp8(x.view()));
  const cpu::Fp8Rows qw = must(cpu::quantize_rows_fp8(random_tensor({16, 32}, DType::kBF16, 702).view()));
  const cpu::Fp8Rows qw_k = must(cpu::quantize_rows_fp8(random_tensor({16, 48}, DType::kBF16, 703).view()));
  Tensor y = Tensor::empty({4, 16}, DType::kBF16);
  const Tensor bias = Tensor::zeros({15}, DType::kF32);
  const TensorView bias_view = bias.view();
  expect_invalid(cpu::linear_fp8(qa.codes.view(), qa.scales.view(), qw_k.codes.view(), qw_k.scales.view(), nullptr,
                                 y.view()),
                 "linear_fp8 weight codes");
  expect_invalid(cpu::linear_fp8(qa.codes.view(), qw.scales.view(), qw.codes.view(), qw.scales.view(), nullptr,
                                 y.view()),
                 "linear_fp8 activation scales");
  expect_invalid(cpu::linear_fp8(qa.codes.view(), qa.scales.view(), qw.codes.view(), qa.scales.view(), nullptr,
                                 y.view()),
                 "linear_fp8 weight scales");
  expect_invalid(cpu::linear_fp8(x.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), nullptr, y.view()),
                 "linear_fp8 activation codes");
  expect_invalid(cpu::linear_fp8(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), &bias_view,
                                 y.view()),
                 "linear_fp8 bias");
  expect_invalid(cpu::linear_fp8(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), nullptr,
                                 Tensor::empty({4, 17}, DType::kBF16).view()),
                 "linear_fp8 output");
}

}  // namespace
}  // namespace vortex
