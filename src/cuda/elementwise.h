// CUDA versions of the CPU reference's elementwise families (cpu/norm.h, cpu/elementwise.h),
// with the same rounding points: each op computes in fp32 and rounds to the output dtype exactly
// where the CPU op does, using explicitly rounded intrinsics (__fmul_rn, __fadd_rn) so that nvcc
// never contracts a rounded product into an fma. Results then differ from the CPU only through
// rsqrt / exp / sin / cos implementations and reduction order (the GPU tests state the bounds).
//
// All tensors are device TensorViews (F32 or BF16 unless stated), unit stride in the last dim,
// any row stride (q/k views inside a fused QKV buffer are the main strided case). Row-index
// vectors are device int32 arrays. Every function launches on `stream` and returns launch errors
// as Status; shape errors are invalid_argument naming the operand.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/norm.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// y = R(x * rsqrt(mean(x^2) + eps) * weight) over the last dim; x, y: [N, C] or [N, H, D]; may alias.
// kBeforeWeight rounds the normalised value before the weight too, y = R(R(x * rsqrt(..)) * weight)
// (the Qwen3 text encoder's RMSNorm module; cpu/norm.h).
Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y, cudaStream_t stream,
                cpu::RmsNormRounding rounding = cpu::RmsNormRounding::kOnce);

// What rms_norm_fused does around the norm (every pointer optional; null skips that step):
//   before: x = R(x + R(gate[gate_row[i]] * branch)), or x = R(x + branch) without a gate; the
//           updated x is written back and normalised (branch: [N, C], gate: [R, C], y apart from x)
//   after:  y = R(R(R(norm) * R(1 + scale[mod_row[i]])) + shift[mod_row[i]])  (shift, scale: [R', C])
struct NormFusion {
  const TensorView* branch = nullptr;
  const TensorView* gate = nullptr;
  const int32_t* gate_row = nullptr;
  const TensorView* shift = nullptr;
  const TensorView* scale = nullptr;
  const int32_t* mod_row = nullptr;
};
// gated_residual / residual_add, rms_norm and adaln_modulate in one pass over [N, C] rows; bitwise
// equal to those launches in sequence (same rounding points, same reduction order).
Status rms_norm_fused(const TensorView& x, const TensorView* weight, float eps, const NormFusion& fusion,
                      const TensorView& y, cudaStream_t stream);
// y = R(R(x * R(1 + scale[row[i]])) + shift[row[i]]); x, y: [N, C] (may alias); shift, scale: [R, C]
// views; row: device int32 [N].
Status adaln_modulate(const TensorView& x, const TensorView& shift, const TensorView& scale, const int32_t* row,
                      const TensorView& y, cudaStream_t stream);

// y = R(value * R(silu(gate))) with u = [value | gate]: u [N, 2F], y [N, F].
Status swiglu(const TensorView& u, const TensorView& y, cudaStream_t stream);

// x = R(x + R(gate[row[i]] * branch)); x, branch: [N, C]; gate: [R, C] view.
Status gated_residual(const TensorView& x, const TensorView& gate, const int32_t* row, const TensorView& branch,
                      cudaStream_t stream);

// x = R(x + branch).
Status residual_add(const TensorView& x, const TensorView& branch, cudaStream_t stream);

// In place on x [N, H, D]: rms_norm over D with the weight, then (cos and sin given) apply_rope;
// one launch where the shapes allow, else those ops in turn. Bitwise equal either way.
Status head_norm_rope(const TensorView& x, const TensorView* weight, float eps, const TensorView* cos,
                      const TensorView* sin, cudaStream_t stream);
// head_norm_rope of q, then of k, with their weights.
Status qk_norm_rope(const TensorView& q, const TensorView& k, const TensorView* q_weight, const TensorView* k_weight,
                    float eps, const TensorView* cos, const TensorView* sin, cudaStream_t stream);
// In place on x [N, H, D]: x[:rot] = R(R(x * R(cos)) + R(rotate_half(x) * R(sin))); cos, sin: F32 [N, rot].
Status apply_rope(const TensorView& x, const TensorView& cos, const TensorView& sin, cudaStream_t stream);

// out[index[i], :] = R(src[i, :]) (dtype conversion allowed); index: device int64 [src rows].
Status scatter_rows(const TensorView& src, const int64_t* index, const TensorView& out, cudaStream_t stream);
// out[i, :] = R(src[index[i], :]); index: device int64 [out rows].
Status gather_rows(const TensorView& src, const int64_t* index, const TensorView& out, cudaStream_t stream);

// y = R(x / (1 + exp(-x))), elementwise; x F32, y F32 or BF16, same shape, contiguous.
Status silu(const TensorView& x, const TensorView& y, cudaStream_t stream);

// Zeroes a contiguous tensor.
Status fill_zero(const TensorView& x, cudaStream_t stream);

}  // namespace vortex::cuda
