// Elementwise ops of the H3 block (CPU reference). R rounds to the output's dtype.
//
//   swiglu:          y = R(value * R(silu(gate)))     u = [value | gate] along the last dim
//   gated_residual:  x = R(x + R(gate[row] * branch))
//   residual_add:    x = R(x + branch)
//   apply_rope:      rotate-half RoPE on the first `rotary` channels of every head, in place:
//                    x = R(R(x * R(cos)) + R(rotate_half(x) * R(sin)))
//   gelu:            y = R(0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))))   kTanh ("gelu_pytorch_tanh")
//                    y = R(0.5·x·(1 + erf(x / √2)))                        kErf (torch's default GELU)
//                    evaluated in double from the stored x (tanh / erf: core/portable_math.h's)
//   silu_f32:        y = x / (1 + exp(-x)) in fp32 (the time-embedding path stays fp32; the GPU
//                    program reads it from the host). Both exps are core/portable_math.h's.
#pragma once

#include <cstdint>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

// u: [N, 2F] (value first, gate second: the diffusers SwiGLU order); y: [N, F].
Status swiglu(const TensorView& u, const TensorView& y);

// x: [N, C] in/out; gate: [R, C] table view; row: [N]; branch: [N, C].
Status gated_residual(const TensorView& x, const TensorView& gate, const std::vector<int32_t>& row,
                      const TensorView& branch);

Status residual_add(const TensorView& x, const TensorView& branch);

enum class GeluApproximation { kTanh, kErf };
// x, y: [N, C] (may alias).
Status gelu(const TensorView& x, const TensorView& y, GeluApproximation approximation);

// x: [N, H, D] view (in place); cos, sin: [N, rotary] F32, rotary <= D and even.
Status apply_rope(const TensorView& x, const Tensor& cos, const Tensor& sin);

// In place on a contiguous F32 tensor.
void silu_f32(Tensor& x);

}  // namespace vortex::cpu
