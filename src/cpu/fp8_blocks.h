// The fp8 linear with 128-wide block scales: what cuBLASLt's block scaling computes on sm_90, and
// the out projection of the `fp8` recipe (models/h3/block_fp8.cc, cuda_block_fp8.cc;
// bench/notes/block.md). There one scale covers 128 tokens × 128 channels of the attention output,
// i.e. one head of one 128-query tile, which an attention kernel holds whole when it writes its
// output: the kernel quantizes its own tile and no bf16 copy of the attention output exists. The
// weight takes one scale per output channel and 128 inputs.
//
//   quantize_blocks_fp8  x [N, C] → codes [N, C] and one scale per block of the layout's rows ×
//                        128 columns, by cpu/fp8_scale.h's rule over the block's elements (the last
//                        block of rows may be short); a non-finite block is all NaN codes with a
//                        NaN scale and leaves the other blocks as they are.
//   linear_fp8_blocks    y[m, n] = R(fp32(Σ_b P_b · sa(m / 128, b) · sw(n, b)) + bias[n]),
//                        P_b = Σ_{k in block b} qa[m, k] · qw[n, k]
//
// P_b is exact (a sum of at most 128 exact e4m3 products, in double), the sum over the blocks is
// taken in double in block order and rounded once to fp32, the bias is added in fp32 and y rounded
// once to its dtype. As for linear_fp8 (cpu/fp8.h), this is the accurate value that the GPU's fp32
// accumulation approximates.
//
// Scale layouts (Fp8BlockLayout) are the ones cuBLASLt 13's block scaling reads on sm_90, found by
// tools/bench/probe_block_scaled_fp8_gemm.cu on the H200 and matching the layouts PyTorch's
// scaled_mm asks for its 1×128 / 128×128 recipe:
//   kTiles   activations, 128 rows × 128 columns per scale: scales [ceil(N / 128), round_up(C / 128, 4)]
//            row-major, the K blocks of a row block contiguous and padded to a multiple of 4 (the
//            padding holds 0);
//   kRows    weights, 1 row × 128 columns per scale: scales [C / 128, N] row-major, i.e. the rows
//            (output channels) contiguous within a K block.
// Codes: F8_E4M3 [N, C] with unit column stride. x and y row-major with unit column stride.
// C (K for the linear) must be a multiple of 128.
#pragma once

#include <cstdint>
#include <string>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

constexpr int64_t kFp8BlockCols = 128;  // columns per scale (K per scale in the linear)
constexpr int64_t kFp8TileRows = 128;   // activation rows (tokens) per scale

enum class Fp8BlockLayout { kTiles, kRows };

// Where the scales of an [rows, cols] operand live: block (row block rb, column block cb) has its
// scale at rb · row_block_stride + cb · col_block_stride of a contiguous F32 tensor of `shape`.
struct Fp8BlockScales {
  int64_t block_rows;        // 128 (kTiles) or 1 (kRows)
  int64_t row_blocks;        // ceil(rows / block_rows)
  int64_t col_blocks;        // cols / 128
  int64_t row_block_stride;  // kTiles: round_up(col_blocks, 4); kRows: 1
  int64_t col_block_stride;  // kTiles: 1; kRows: rows
  Shape shape;               // kTiles: [row_blocks, round_up(col_blocks, 4)]; kRows: [col_blocks, rows]
  bool padded() const { return shape.numel() > row_blocks * col_blocks; }
};
Fp8BlockScales fp8_block_scales(Fp8BlockLayout layout, int64_t rows, int64_t cols);

struct Fp8Blocks {
  Tensor codes;   // [N, C] F8_E4M3
  Tensor scales;  // fp8_block_scales(layout, N, C).shape, F32
};

// Checks a block quantizer's outputs for x [rows, cols] on `device`: codes F8_E4M3 [rows, cols]
// with unit column stride; scales a contiguous F32 tensor of fp8_block_scales(layout, rows,
// cols).shape. The CUDA quantizer and the int8fp8 attention's e4m3 output use it too.
Status check_fp8_blocks_output(const TensorView& codes, const TensorView& scales, int64_t rows, int64_t cols,
                               Fp8BlockLayout layout, Device device, const std::string& op);

// x: [N, C] F32 or BF16, C a multiple of 128.
Status quantize_blocks_fp8(const TensorView& x, Fp8BlockLayout layout, const TensorView& codes,
                           const TensorView& scales);
Result<Fp8Blocks> quantize_blocks_fp8(const TensorView& x, Fp8BlockLayout layout);

// qa: [M, K] F8_E4M3 with sa in the kTiles layout; qw: [N, K] F8_E4M3 with sw in the kRows
// layout; bias: [N] F32 or BF16 or null; y: [M, N] F32 or BF16.
Status linear_fp8_blocks(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                         const TensorView* bias, const TensorView& y);

}  // namespace vortex::cpu
