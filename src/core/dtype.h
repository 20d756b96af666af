// Bit-exact number format conversions shared by the CPU and CUDA code (DESIGN section 3).
//
// fp32 -> bf16 / f16: round to nearest, ties to even; infinities stay. A NaN becomes bf16's canonical
//   NaN 0x7FFF (CUDART_NAN_BF16, what the GPU's conversion writes for every NaN, so the device rounds
//   with one instruction and still matches bit for bit) or a quiet f16 NaN with its sign.
// fp32 -> e4m3: RNE, saturating to +-448 (e4m3 has no infinity); NaN -> 0x7F / 0xFF.
// fp32 -> e5m2: RNE, saturating to +-57344 (finite inputs never become infinity); NaN -> quiet NaN.
// fp32 -> e2m1: RNE onto {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6; NaN -> 6 with its sign
//   (e2m1 has no NaN; callers that may see NaN must check before quantising).
// Every function is usable from host and device code.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define VORTEX_HD __host__ __device__ __forceinline__
#else
#define VORTEX_HD inline
#endif

namespace vortex {

VORTEX_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

VORTEX_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bf16 --------------------------------------------------------------------------------------

VORTEX_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;  // the canonical NaN (see the top of this file)
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest with ties to even; carries into the
  // exponent give the correct next binade and overflow rounds to infinity, as RNE requires.
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

VORTEX_HD float bf16_bits_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// The value of f after a round trip through bf16: how the CPU reference "stores" an activation.
VORTEX_HD float round_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// ---- f16 ---------------------------------------------------------------------------------------

VORTEX_HD float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return f32_from_bits(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // exact: mant * 2^-24
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// ---- f16 and the small floats: one generic RNE encoder -----------------------------------------------------
//
// Encodes |f| into a format with `mant_bits` mantissa bits, exponent bias `bias`, and largest
// finite magnitude `max_value` (saturation target). Returns the magnitude code (no sign bit).
// Works by scaling into the subnormal grid when below the smallest normal, so subnormals and
// normals share one rounding path.
VORTEX_HD uint32_t small_float_magnitude_code(float abs_value, int mant_bits, int bias, float max_value,
                                              uint32_t max_code) {
  if (!(abs_value < max_value)) return max_code;  // also catches +inf (NaN handled by callers)
  uint32_t u = f32_bits(abs_value);
  int exp = static_cast<int>(u >> 23) - 127;  // unbiased f32 exponent (-127 for zero/subnormal)
  int min_normal_exp = 1 - bias;
  // Quantum (spacing) at this magnitude: 2^(max(exp, min_normal_exp) - mant_bits).
  int q_exp = (exp < min_normal_exp ? min_normal_exp : exp) - mant_bits;
  // abs_value / quantum is exact in f32 (power-of-two scaling) as long as it stays normal.
  float scaled = abs_value * f32_from_bits(static_cast<uint32_t>(127 - q_exp) << 23);
  // RNE to integer: add and subtract 2^23 (scaled < 2^(mant_bits+1) <= 2^24, exact enough).
  float rounded = (scaled + 8388608.0f) - 8388608.0f;
  uint32_t units = static_cast<uint32_t>(rounded);
  // units counts quanta of 2^q_exp. Convert to code: for the subnormal range the code equals
  // units; for normals the code is ((e + bias) << mant_bits) + (units - 2^mant_bits), where a
  // rounding carry to 2^(mant_bits+1) correctly bumps the exponent.
  uint32_t code;
  if (exp < min_normal_exp) {
    code = units;  // may become the smallest normal (units == 2^mant_bits): same encoding
  } else {
    code = (static_cast<uint32_t>(exp + bias) << mant_bits) + (units - (1u << mant_bits));
  }
  return code > max_code ? max_code : code;
}

VORTEX_HD uint16_t f32_to_f16_bits(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  // f16 has infinity: everything from the rounding midpoint above 65504 up becomes inf.
  if (f32_from_bits(abs) >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00u);
  return static_cast<uint16_t>(sign | small_float_magnitude_code(f32_from_bits(abs), 10, 15, 65520.0f,
                                                                   0x7BFFu));
}

VORTEX_HD uint8_t f32_to_e4m3_bits(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);
  // Saturate at 448 (code 0x7E); values that would round above it clamp there.
  return static_cast<uint8_t>(sign | small_float_magnitude_code(f32_from_bits(u & 0x7FFFFFFFu), 3, 7,
                                                                  464.0f, 0x7Eu));
}

VORTEX_HD float e4m3_bits_to_f32(uint8_t b) {
  uint32_t sign = (b & 0x80u) ? 1u : 0u;
  uint32_t exp = (b >> 3) & 0xFu;
  uint32_t mant = b & 0x7u;
  float v;
  if (exp == 0xFu && mant == 0x7u) {
    v = f32_from_bits(0x7FC00000u);
  } else if (exp == 0) {
    v = static_cast<float>(mant) * (1.0f / 512.0f);  // mant * 2^-9
  } else {
    v = f32_from_bits(((exp + 120u) << 23) | (mant << 20));
  }
  return sign ? -v : v;
}

VORTEX_HD uint8_t f32_to_e5m2_bits(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Eu);
  // Saturate at 57344 (code 0x7B); infinity also saturates (DESIGN: saturating conversion).
  return static_cast<uint8_t>(sign | small_float_magnitude_code(f32_from_bits(u & 0x7FFFFFFFu), 2, 15,
                                                                  61440.0f, 0x7Bu));
}

VORTEX_HD float e5m2_bits_to_f32(uint8_t b) {
  return f16_bits_to_f32(static_cast<uint16_t>(static_cast<uint16_t>(b) << 8));
}

// e2m1: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} for codes 0..7; bit 3 is the sign.
VORTEX_HD uint8_t f32_to_e2m1_code(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7u);
  return static_cast<uint8_t>(sign | small_float_magnitude_code(f32_from_bits(u & 0x7FFFFFFFu), 1, 1,
                                                                  7.0f, 0x7u));
}

VORTEX_HD float e2m1_code_to_f32(uint8_t code) {
  const uint32_t mag = code & 0x7u;
  // code -> value: 0,0.5,1,1.5 for exp 0/1 (subnormal step 0.5), then 2,3,4,6.
  float v = (mag < 4u) ? static_cast<float>(mag) * 0.5f
                       : static_cast<float>(2u + (mag & 1u)) * static_cast<float>(1u << ((mag >> 1) - 2u));
  return (code & 0x8u) ? -v : v;
}

VORTEX_HD uint8_t pack_e2m1x2(float first, float second) {
  return static_cast<uint8_t>(f32_to_e2m1_code(first) | (f32_to_e2m1_code(second) << 4));
}

}  // namespace vortex
