// The fp8 linear with 128-wide block scales: what cuBLASLt's block scaling computes on sm_90, and
// the planned form of the out projection in the `fp8` recipe (bench/notes/block.md, "The attention
// output's e4m3 quantize"). There one scale covers 128 tokens × 128 channels of the attention
// output, i.e. one head of one 128-query tile, which an attention kernel holds whole when it
// writes its output. So the kernel can quantize its own tile and no bf16 copy of the attention
// output needs to exist. The weight then takes one scale per output channel and 128 inputs.
//
//   quantize_blocks_fp8  x [N, C] → codes [N, C], scales [ceil(N / R), C / 128]: one scale per
//                        block of R rows × 128 columns (R = 128 for activations, 1 for weights;
//                        the last block row may be short), by cpu/fp8_scale.h's rule over the
//                        block's elements; a non-finite block is all NaN codes with a NaN scale
//                        and leaves the other blocks as they are.
//   linear_fp8_blocks    y[m, n] = R(fp32(Σ_b P_b · sa[m / 128, b] · sw[n, b]) + bias[n]),
//                        P_b = Σ_{k in block b} qa[m, k] · qw[n, k]
//
// P_b is exact (a sum of at most 128 exact e4m3 products, in double), the sum over the blocks is
// taken in double in block order and rounded once to fp32, the bias is added in fp32 and y rounded
// once to its dtype. As for linear_fp8 (cpu/fp8.h), this is the accurate value that the GPU's fp32
// accumulation approximates.
//
// Layouts: x and y row-major with unit column stride; codes F8_E4M3 [N, C] with unit column
// stride; scales F32 [blocks of rows, C / 128], contiguous. C (K for the linear) must be a
// multiple of 128.
#pragma once

#include <cstdint>
#include <string>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

constexpr int64_t kFp8BlockCols = 128;  // columns per scale (K per scale in the linear)
constexpr int64_t kFp8TileRows = 128;   // activation rows (tokens) per scale

struct Fp8Blocks {
  Tensor codes;   // [N, C] F8_E4M3
  Tensor scales;  // [ceil(N / R), C / 128] F32
};

// Checks a block quantizer's outputs for x [rows, cols] on `device`: codes F8_E4M3 [rows, cols]
// with unit column stride; scales F32 [ceil(rows / block_rows), cols / 128], contiguous. The CUDA
// quantizer uses it too.
Status check_fp8_blocks_output(const TensorView& codes, const TensorView& scales, int64_t rows, int64_t cols,
                               int64_t block_rows, Device device, const std::string& op);

// x: [N, C] F32 or BF16, C a multiple of 128, block_rows >= 1.
Status quantize_blocks_fp8(const TensorView& x, int64_t block_rows, const TensorView& codes, const TensorView& scales);
Result<Fp8Blocks> quantize_blocks_fp8(const TensorView& x, int64_t block_rows);

// qa: [M, K] F8_E4M3 with sa [ceil(M / 128), K / 128]; qw: [N, K] F8_E4M3 with sw [N, K / 128];
// bias: [N] F32 or BF16 or null; y: [M, N] F32 or BF16.
Status linear_fp8_blocks(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                         const TensorView* bias, const TensorView& y);

}  // namespace vortex::cpu
