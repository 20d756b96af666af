// The `fp8` recipe's building blocks on the CPU (DESIGN section 3): e4m3 rows with one fp32 scale
// per row, following the rule in cpu/fp8_scale.h; the fused producers that turn the block's bf16
// activations into such rows; and the fp8 linear that cuBLASLt computes from them.
//
//   quantize_rows_fp8            codes[r, :], scales[r] of x[r, :]
//   quantize_weight_fp8          the same for a weight [O, I]: one scale per output channel
//   rms_norm_fused_quantize_fp8  of h = [adaln_modulate](R(rms_norm(x))), after an optional
//                                residual update of x (the steps of cuda::rms_norm_fused)
//   swiglu_quantize_fp8          of h = R(value · R(silu(gate)))
//   linear_fp8                   y[m, n] = R(((Σ_k qa[m, k] · qw[n, k]) · sa[m]) · sw[n] + bias[n])
//
// R rounds to bf16. The fused producers are defined as the bf16 path followed by the quantizer:
// h is exactly the bf16 tensor that cpu/norm.h and cpu/elementwise.h would write, so the fp8 path
// is the bf16 path with each GEMM input quantized, and nothing else changes.
//
// linear_fp8: every product of two e4m3 values is exact in fp32 (4 significant bits each). The
// products are summed in double, which is exact for K < 2^35 / 448² ≈ 171,000 (all partial sums
// are multiples of 2^-18 below 2^35), then rounded once to fp32. The result is an order-free
// accumulator that an fp32 GEMM approximates: cuBLASLt differs from it only by its own rounding of
// the partial sums. The scales and the bias are applied in fp32 in the order written, and y is
// rounded once to its dtype.
//
// Layouts: activations and weights are row-major with unit column stride and any row stride;
// codes are F8_E4M3 [N, C] (any row stride); scales are F32 [N] (unit stride).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

// Codes and scales in fresh host memory.
struct Fp8Rows {
  Tensor codes;   // [N, C] F8_E4M3
  Tensor scales;  // [N] F32
};

// Checks the outputs of a quantizer named `op`: codes F8_E4M3 [rows, cols] with unit column
// stride, scales F32 [rows] with unit stride, both on `device`. The CUDA quantizers use it too.
Status check_fp8_rows_output(const TensorView& codes, const TensorView& scales, int64_t rows, int64_t cols,
                             Device device, const std::string& op);

// x: [N, C] F32 or BF16, C >= 1.
Status quantize_rows_fp8(const TensorView& x, const TensorView& codes, const TensorView& scales);
Result<Fp8Rows> quantize_rows_fp8(const TensorView& x);

// w: [O, I] F32 or BF16. Returns codes [O, I] and one scale per output channel.
Result<Fp8Rows> quantize_weight_fp8(const TensorView& w);

// The steps around the norm, as cuda::NormFusion has them (every pointer optional; null skips
// the step):
//   before: x = R(x + R(gate[gate_row[i]] · branch)) (cpu::gated_residual), or x = R(x + branch)
//           without a gate (cpu::residual_add); x is updated in place (when the call succeeds)
//           and the updated rows are normalised
//   after:  h = adaln_modulate(h, shift, scale, mod_row)
struct Fp8NormFusion {
  const TensorView* branch = nullptr;              // [N, C]
  const TensorView* gate = nullptr;                // [R, C]
  const std::vector<int32_t>* gate_row = nullptr;  // [N]
  const TensorView* shift = nullptr;               // [R', C]
  const TensorView* scale = nullptr;               // [R', C]
  const std::vector<int32_t>* mod_row = nullptr;   // [N]
};

// x: [N, C] F32 or BF16; weight: [C] or null (as cpu::rms_norm). h is the bf16 rms_norm output
// (then modulated), quantized into codes [N, C] and scales [N].
Status rms_norm_fused_quantize_fp8(const TensorView& x, const TensorView* weight, float eps,
                                   const Fp8NormFusion& fusion, const TensorView& codes, const TensorView& scales);

// u: [N, 2F] (value first, gate second, as cpu::swiglu); codes: [N, F].
Status swiglu_quantize_fp8(const TensorView& u, const TensorView& codes, const TensorView& scales);

// qa: [M, K] F8_E4M3, sa: [M] F32; qw: [N, K] F8_E4M3, sw: [N] F32; bias: [N] F32 or BF16 (unit
// stride) or null; y: [M, N] F32 or BF16.
Status linear_fp8(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                  const TensorView* bias, const TensorView& y);

}  // namespace vortex::cpu
