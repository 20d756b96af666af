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

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// y = R(x * rsqrt(mean(x^2) + eps) * weight) over the last dim; x, y: [N, C] or [N, H, D]; may alias.
Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y, cudaStream_t stream);

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
