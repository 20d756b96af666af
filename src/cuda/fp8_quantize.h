// The `fp8` recipe's quantizers on the GPU: rows to e4m3 codes with one fp32 scale per row, by the
// rule in cpu/fp8_scale.h. The codes and scales are bitwise the CPU reference's (cpu/fp8.h) for the
// same input rows.
//
// The fused producers compute the bf16 tensor that the unfused CUDA path writes (cuda/elementwise.h),
// bit for bit, and quantize it in the same pass without writing it:
//   rms_norm_fused_quantize_fp8  = rms_norm_fused (residual update, rms_norm, modulation) → bf16
//                                  → quantize_rows_fp8
//   swiglu_quantize_fp8          = swiglu → bf16 → quantize_rows_fp8
// "The unfused path" means those ops writing a 16-byte-aligned bf16 buffer (every arena tensor
// is). rms_norm_fused picks its summation order (the vector width) from the alignment of all its
// operands, and the fused kernel applies the same rule with its bf16 output taken as aligned.
//
// Tensors are device views. Inputs: F32 or BF16, unit column stride, any row stride. codes:
// F8_E4M3 [N, C], unit column stride, any row stride. scales: F32 [N], unit stride. A row whose
// gate or modulation-table index is outside [0, R) comes out as a NaN row (codes 0x7F, scale
// NaN), as the unfused path's NaN row would quantize. Shape and dtype errors are
// invalid_argument naming the operand; launch errors carry file:line.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/elementwise.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// x: [N, C], C >= 1 (an activation, or a weight [O, I] quantized per output channel).
Status quantize_rows_fp8(const TensorView& x, const TensorView& codes, const TensorView& scales,
                         cudaStream_t stream);

// rms_norm_fused's contract (cuda/elementwise.h) with its bf16 output replaced by codes and
// scales: x: [N, C], updated in place when `fusion` has a residual branch; weight: [C] (F32 or
// BF16) or null. One call per block norm: the refiner's ({} and {branch}) and the transformer
// blocks' ({shift, scale, rows} and {branch, gate, rows, shift, scale, rows}).
Status rms_norm_fused_quantize_fp8(const TensorView& x, const TensorView* weight, float eps, const NormFusion& fusion,
                                   const TensorView& codes, const TensorView& scales, cudaStream_t stream);

// u: [N, 2F] = [value | gate]; codes: [N, F]. The fc2 input.
Status swiglu_quantize_fp8(const TensorView& u, const TensorView& codes, const TensorView& scales,
                           cudaStream_t stream);

}  // namespace vortex::cuda
