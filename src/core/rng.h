// Counter-based random numbers: Philox4x32-10 and the normal sampler behind every initial latent.
//
// DESIGN section 3: noise is a pure function of (seed, stream, element), so the CPU reference, the
// GPU and every sequence-parallel shard draw the same value for the same element, bit for bit,
// whatever range of elements each of them fills. The mapping below is that contract; changing
// any part of it changes every seeded output.
//
//   key       = { seed & 0xFFFFFFFF, seed >> 32 }
//   block     = element / 4,  lane = element % 4
//   counter   = { block & 0xFFFFFFFF, block >> 32, stream & 0xFFFFFFFF, stream >> 32 }
//   x[0..3]   = philox4x32_10(counter, key)               (Random123's Philox4x32 with 10 rounds)
//   k(x)      = (x >> 8) + 1                              (24 bits, in [1, 2^24])
//   u(x)      = k(x) * 2^-24                              (uniform in (0, 1]; never 0, so ln is finite)
//   r0 = sqrt(-2 ln u(x[0])),  a0 = 2 pi u(x[1])          (Box-Muller, fp32)
//   r1 = sqrt(-2 ln u(x[2])),  a1 = 2 pi u(x[3])
//   lane 0..3 = r0 cos a0, r0 sin a0, r1 cos a1, r1 sin a1
//
// ln, sin and cos are not libm's or CUDA's (those differ in the last bit between host and device):
// they are the fp32 polynomials below, written only with operations IEEE rounds correctly (fma,
// *, /, sqrt, exact int->float) in a fixed order, and with no product feeding an addition, so no
// compiler can contract them differently. The angle is reduced exactly in integers (k is a count
// of 2^-24 turns). Accuracy: a few ulp, far below what matters for noise.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace vortex {

struct U32x4 {
  uint32_t v[4];
};

struct F32x4 {
  float v[4];
};

// Random123 constants: the round multipliers and the key schedule's Weyl increments.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

VORTEX_HD U32x4 philox4x32_10(const uint32_t counter[4], const uint32_t key[2]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
  }
  return {{c0, c1, c2, c3}};
}

// The four words for one block of four elements, with the counter and key laid out as above.
VORTEX_HD U32x4 philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  const uint32_t counter[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                               static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  return philox4x32_10(counter, key);
}

// k(x): the top 24 bits plus one, so that u = k * 2^-24 lies in (0, 1].
VORTEX_HD uint32_t uniform24_from_uint32(uint32_t x) { return (x >> 8) + 1u; }

// u(x) in (0, 1]: exact, since k has at most 24 significant bits.
VORTEX_HD float uniform_from_uint32(uint32_t x) {
  return static_cast<float>(uniform24_from_uint32(x)) * (1.0f / 16777216.0f);
}

// ---- correctly rounded primitives ------------------------------------------------------------
// Device code uses the _rn intrinsics so that -use_fast_math or -prec-div=false cannot change them.

VORTEX_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

VORTEX_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

VORTEX_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// ln(u) for a positive normal float u. u = m * 2^e with m in [sqrt(1/2), sqrt(2)); then
// ln m = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.172, whose odd series to s^9 leaves < 3e-9 relative.
// e * ln 2 uses a split ln 2 (Cody-Waite) whose high part times |e| <= 2^7 is exact.
VORTEX_HD float rng_log(float u) {
  const uint32_t bits = f32_bits(u);
  int e = static_cast<int>(bits >> 23) - 127;
  uint32_t mant_bits = (bits & 0x007FFFFFu) | 0x3F800000u;  // m in [1, 2)
  if (mant_bits > 0x3FB504F3u) {                             // m > sqrt(2): use m/2, e+1
    mant_bits -= 0x00800000u;
    ++e;
  }
  const float m = f32_from_bits(mant_bits);
  const float s = div_rn(m - 1.0f, m + 1.0f);  // m - 1 is exact (Sterbenz)
  const float s2 = s * s;
  const float two_s = 2.0f * s;
  float p = fma_rn(s2, 1.0f / 9.0f, 1.0f / 7.0f);
  p = fma_rn(s2, p, 1.0f / 5.0f);
  p = fma_rn(s2, p, 1.0f / 3.0f);
  const float ln_m = fma_rn(two_s * s2, p, two_s);
  constexpr float kLn2Hi = 0.693145751953125f;  // 0x3F317200: 15 significant bits
  constexpr float kLn2Lo = 1.42860677e-06f;     // ln 2 - kLn2Hi
  const float ef = static_cast<float>(e);
  return fma_rn(ef, kLn2Hi, fma_rn(ef, kLn2Lo, ln_m));
}

// sin and cos of 2 pi k / 2^24 for k in [0, 2^24]. The nearest quarter turn q is split off in
// integers, leaving |angle| <= pi/4 where Taylor series to x^9 (sin) and x^10 (cos) are within
// 3e-9; the quadrant then only swaps and negates.
VORTEX_HD void rng_sincos_turns24(uint32_t k, float* sin_out, float* cos_out) {
  const uint32_t q = (k + (1u << 21)) >> 22;  // nearest multiple of 2^22 (a quarter turn)
  const int32_t rem = static_cast<int32_t>(k) - static_cast<int32_t>(q << 22);  // in [-2^21, 2^21)
  constexpr float kTwoPiOver2p24 = 6.28318548f / 16777216.0f;  // float(2 pi) * 2^-24, exact
  const float x = static_cast<float>(rem) * kTwoPiOver2p24;
  const float x2 = x * x;
  float ps = fma_rn(x2, 1.0f / 362880.0f, -1.0f / 5040.0f);
  ps = fma_rn(x2, ps, 1.0f / 120.0f);
  ps = fma_rn(x2, ps, -1.0f / 6.0f);
  const float sin_x = fma_rn(x * x2, ps, x);
  float pc = fma_rn(x2, -1.0f / 3628800.0f, 1.0f / 40320.0f);
  pc = fma_rn(x2, pc, -1.0f / 720.0f);
  pc = fma_rn(x2, pc, 1.0f / 24.0f);
  pc = fma_rn(x2, pc, -0.5f);
  const float cos_x = fma_rn(x2, pc, 1.0f);
  switch (q & 3u) {
    case 0: *sin_out = sin_x; *cos_out = cos_x; break;
    case 1: *sin_out = cos_x; *cos_out = -sin_x; break;
    case 2: *sin_out = -sin_x; *cos_out = -cos_x; break;
    default: *sin_out = -cos_x; *cos_out = sin_x; break;
  }
}

// One Box-Muller pair: (r cos a, r sin a) with r from `radius_word` and a from `angle_word`.
VORTEX_HD void box_muller(uint32_t radius_word, uint32_t angle_word, float* z_cos, float* z_sin) {
  const float r = sqrt_rn(-2.0f * rng_log(uniform_from_uint32(radius_word)));
  float s, c;
  rng_sincos_turns24(uniform24_from_uint32(angle_word), &s, &c);
  *z_cos = r * c;
  *z_sin = r * s;
}

// Standard normals for elements 4*block .. 4*block+3.
VORTEX_HD F32x4 normal4_at_block(uint64_t seed, uint64_t stream, uint64_t block) {
  const U32x4 x = philox_block(seed, stream, block);
  F32x4 z;
  box_muller(x.v[0], x.v[1], &z.v[0], &z.v[1]);
  box_muller(x.v[2], x.v[3], &z.v[2], &z.v[3]);
  return z;
}

// The standard normal for one element; a kernel filling a range should call normal4_at_block once
// per block instead.
VORTEX_HD float normal_at(uint64_t seed, uint64_t stream, uint64_t element) {
  return normal4_at_block(seed, stream, element / 4).v[element % 4];
}

// out[i] = normal_at(seed, stream, first_element + i) for i in [0, n). first_element >= 0, so a
// shard fills its own slice of a tensor and gets exactly the values a whole-tensor fill would.
void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, int64_t first_element = 0);

}  // namespace vortex
