// The per-element formulas that several row kernels compute, each defined once: the separate ops
// (elementwise.cu, norm.cu) and their fused forms (norm.cu's rms_norm_fused and qk_norm_rope,
// fp8_quantize.cu's producers) promise to be bitwise equal, and that holds by construction only
// while they share these. Explicitly rounded operations throughout (no fma contraction); R rounds
// to the output dtype (round_out, identity for F32).
#pragma once

#include <cuda_runtime.h>

#include "cuda/row_io.cuh"

namespace vortex::cuda::detail {

// g / (1 + exp(-g)) with IEEE expf (not __expf), add and divide: the CPU's silu, op for op.
__device__ __forceinline__ float silu_f32(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

// rms_norm's 1 / sqrt(mean + eps), each operation correctly rounded as on the CPU.
__device__ __forceinline__ float inv_rms(float sum_sq, int c, float eps) {
  const float mean = __fdiv_rn(sum_sq, static_cast<float>(c));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// gated_residual: R(x + R(gate · branch)).
__device__ __forceinline__ float gated_residual_value(bool bf16, float x, float gate, float branch) {
  return round_out(bf16, __fadd_rn(x, round_out(bf16, __fmul_rn(gate, branch))));
}

// residual_add: R(x + branch).
__device__ __forceinline__ float residual_value(bool bf16, float x, float branch) {
  return round_out(bf16, __fadd_rn(x, branch));
}

// adaln_modulate of an already rounded value: R(R(x · R(1 + scale)) + shift).
__device__ __forceinline__ float modulate_value(bool bf16, float x, float shift, float scale) {
  const float one_plus = round_out(bf16, __fadd_rn(1.0f, scale));
  const float scaled = round_out(bf16, __fmul_rn(x, one_plus));
  return round_out(bf16, __fadd_rn(scaled, shift));
}

// gated_residual and adaln_modulate on two bf16 elements at a time (bf16 operands and output),
// each step the fp32 one plus its rounding (row_io.cuh's bf16x2_mul / bf16x2_add; residual_add's
// pair form is bf16x2_add itself): the packed-pair kernels' forms.
__device__ __forceinline__ uint32_t gated_residual_pair(uint32_t x, uint32_t gate, uint32_t branch) {
  return bf16x2_add(x, bf16x2_mul(gate, branch));
}
__device__ __forceinline__ uint32_t modulate_pair(uint32_t x, uint32_t shift, uint32_t scale) {
  return bf16x2_add(bf16x2_mul(x, bf16x2_add(kBf16OnePair, scale)), shift);
}
// rms_norm's output on two bf16 elements: R((x · inv) · w) in fp32, both halves rounded by one
// conversion.
__device__ __forceinline__ uint32_t norm_pair(uint32_t x, float inv, uint32_t w) {
  return bf16x2_bits(__fmul_rn(__fmul_rn(bf16x2_low(x), inv), bf16x2_low(w)),
                     __fmul_rn(__fmul_rn(bf16x2_high(x), inv), bf16x2_high(w)));
}
// swiglu on two bf16 elements: R(value · R(silu(gate))), R(silu) of both halves in one conversion
// and the product by mul.rn.bf16x2 (the fp32 product of two bf16 values is exact, so its one
// rounding is swiglu's).
__device__ __forceinline__ uint32_t swiglu_pair(uint32_t value, uint32_t gate) {
  return bf16x2_mul(value, bf16x2_bits(silu_f32(bf16x2_low(gate)), silu_f32(bf16x2_high(gate))));
}

// A fused norm's residual update of one 16-byte vector of x (four bf16 pairs v, in place) with the
// branch's pairs b: R(x + R(gate · branch)) when kGated, with the gate's pairs from load_gate()
// (not called when the row's gate index is bad: the row becomes NaN, as gated_residual makes it);
// R(x + branch) otherwise.
template <bool kGated, class LoadGate>
__device__ __forceinline__ void residual_pairs(uint32_t (&v)[4], const uint32_t (&b)[4], bool bad_gate,
                                               const LoadGate& load_gate) {
  if constexpr (kGated) {
    if (bad_gate) {
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = kBf16NanPair;
      return;
    }
    const uint4 gv = load_gate();
    const uint32_t g[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = gated_residual_pair(v[i], g[i], b[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = bf16x2_add(v[i], b[i]);
  }
}

// apply_rope on one pair (lo = x[k], hi = x[k + half]); rotate_half(x) is [-hi, lo]:
//   x[k]        = R(lo · R(cos[k]))        + R(-hi · R(sin[k]))
//   x[k + half] = R(hi · R(cos[k + half])) + R(lo · R(sin[k + half]))
__device__ __forceinline__ float rope_low(bool bf16, float lo, float hi, float cos_lo, float sin_lo) {
  const float a = round_out(bf16, __fmul_rn(lo, round_out(bf16, cos_lo)));
  const float b = round_out(bf16, __fmul_rn(-hi, round_out(bf16, sin_lo)));
  return __fadd_rn(a, b);
}
__device__ __forceinline__ float rope_high(bool bf16, float lo, float hi, float cos_hi, float sin_hi) {
  const float c = round_out(bf16, __fmul_rn(hi, round_out(bf16, cos_hi)));
  const float d = round_out(bf16, __fmul_rn(lo, round_out(bf16, sin_hi)));
  return __fadd_rn(c, d);
}

// The same pair from the side of the lane that holds one half (`mine`), its partner's half in
// `other`: the low half's R(lo·R(cos)) + R(−hi·R(sin)) and the high half's R(hi·R(cos)) +
// R(lo·R(sin)) are both R(mine·R(cos)) + R(other·s) with s = ∓R(sin) (a sign is exact and the
// rounding symmetric). On bf16 rows two channels go per instruction, the sum rounded as the store
// rounds it: bf16x2_mul / bf16x2_add give the fp32 steps' bits (row_io.cuh). rope_factors_bf16x2
// packs R(cos) and s for 2·P channels once (per token, for every head it rotates).
template <int P>
__device__ __forceinline__ void rope_factors_bf16x2(const float (&cos)[2 * P], const float (&sin)[2 * P], bool low,
                                                    uint32_t (&cos2)[P], uint32_t (&sin2)[P]) {
  const float sign = low ? -1.0f : 1.0f;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    cos2[i] = bf16x2_bits(cos[2 * i], cos[2 * i + 1]);
    sin2[i] = bf16x2_bits(sign * sin[2 * i], sign * sin[2 * i + 1]);
  }
}
__device__ __forceinline__ uint32_t rope_bf16x2(uint32_t mine, uint32_t other, uint32_t cos2, uint32_t sin2) {
  return bf16x2_add(bf16x2_mul(mine, cos2), bf16x2_mul(other, sin2));
}

}  // namespace vortex::cuda::detail
