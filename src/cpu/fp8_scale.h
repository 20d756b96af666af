// The per-row e4m3 scale rule of the `fp8` recipe (DESIGN section 3). The CPU reference
// (cpu/fp8.h) and the CUDA quantizers (cuda/fp8_quantize.h) both call these functions, so both
// perform the same fp32 operations and write the same bits.
//
// For one row x[0, C) (a token of an activation, or an output channel of a weight):
//   a      = max_i |x_i|                      exact, so the order of a parallel max cannot matter
//   a'     = max(a, kFp8MinAmax)              kFp8MinAmax = 448 · 2^-126
//   scale  = a' / 448                         fp32 IEEE division, round to nearest even
//   inv    = 448 / a'                         fp32 IEEE division, round to nearest even
//   q_i    = e4m3(x_i · inv)                  fp32 product (RNE), then core/dtype.h's RNE,
//                                             saturating at ±448
// and x_i ≈ q_i · scale when the codes are used.
//
// Why a reciprocal: one division per row instead of one per element. The int8fp8 attention's V
// already quantizes this way. scale · inv differs from 1 by at most ~2^-23, which is far below
// e4m3's 2^-4 relative step. The largest element lands within two fp32 ulps of 448, and the
// rounding (below) or the saturation (above) makes its code ±448 either way.
// Why clamp a: scale is then always a normal fp32 (>= 2^-126) and inv is finite (<= 2^126), so
// no row needs a special case. An all-zero row gets scale 2^-126 and zero codes. A row whose
// amax is below 5.3e-36 is quantized on a coarser grid; no bf16 activation that small matters.
// Non-finite rows: if any |x_i| is NaN or infinite, every code is 0x7F (the e4m3 NaN) and the
// scale is NaN. The fault then shows up in the GEMM output instead of being saturated silently,
// the way the bf16 kernels write NaN for rows they cannot compute.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace vortex {

constexpr float kE4m3Max = 448.0f;
constexpr float kFp8MinAmax = 0x1.cp-118f;  // 448 · 2^-126 = 7 · 2^-120, exact in fp32
constexpr uint8_t kE4m3NanCode = 0x7F;
constexpr uint32_t kF32InfBits = 0x7F800000u;

// |x| as bits. For non-negative floats, integer order equals numeric order and NaNs sort above
// infinity, so a max over these bits is the row amax and also flags a non-finite row.
VORTEX_HD uint32_t fp8_abs_bits(float x) { return f32_bits(x) & 0x7FFFFFFFu; }

VORTEX_HD uint32_t fp8_max_bits(uint32_t a, uint32_t b) { return a > b ? a : b; }

struct Fp8RowScale {
  float scale;  // dequantization factor: x ≈ q · scale (NaN for a non-finite row)
  float inv;    // quantization factor: q = e4m3(x · inv)
  bool finite;
};

// Divisions and the product are the correctly rounded intrinsics on the device, so neither
// --use_fast_math nor fma contraction could ever change them.
VORTEX_HD float fp8_div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

VORTEX_HD float fp8_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

VORTEX_HD Fp8RowScale fp8_row_scale(uint32_t amax_bits) {
  if (amax_bits >= kF32InfBits) return {f32_from_bits(0x7FC00000u), 0.0f, false};
  const float a = f32_from_bits(amax_bits) > kFp8MinAmax ? f32_from_bits(amax_bits) : kFp8MinAmax;
  return {fp8_div_rn(a, kE4m3Max), fp8_div_rn(kE4m3Max, a), true};
}

VORTEX_HD uint8_t fp8_quantize(float x, const Fp8RowScale& s) {
  return s.finite ? f32_to_e4m3_bits(fp8_mul_rn(x, s.inv)) : kE4m3NanCode;
}

}  // namespace vortex
