// NVFP4 weights as checkpoints store them: two e2m1 codes a byte (U8 [O, I/2], the first of a pair
// in the low nibble), one e4m3 scale for each run of 16 elements along a row, and one fp32 scale
// for the whole tensor. NVIDIA's ModelOpt (and the TensorRT-LLM / vLLM checkpoints made with it)
// stores the block scales row-major, [O, I/16]; ComfyUI (comfy-kitchen) stores them in the tiled
// layout cuBLAS reads for block-scaled GEMMs, padded to [roundup(O, 128), roundup(I/16, 4)].
//
// The tiled layout: the scale matrix is cut into 128 × 4 tiles, stored tile after tile along the
// block columns, then along the rows; inside a tile, the scale of (row r, block column c) sits at
// (r % 32) · 16 + (r / 32) · 4 + c, so the four rows r, r + 32, r + 64, r + 96 share 16 bytes.
//
// Dequantized, element (o, i) is e2m1(code) · (tensor_scale · e4m3(block scale of (o, i / 16))) in
// fp32: the two scales multiply first, as the quantizers that wrote them divide by that product.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex {

constexpr int64_t kNvfp4BlockSize = 16;

enum class Nvfp4ScaleLayout { kRowMajor, kTiled };

// [roundup(rows, 128), roundup(block_cols, 4)]: the tiled layout's padded shape.
Shape nvfp4_tiled_scale_shape(int64_t rows, int64_t block_cols);

// Where the scale of (row, block_col) sits in the tiled layout of a matrix of `block_cols` block
// columns (before padding), counted in scales from the start (host and device code).
VORTEX_HD int64_t nvfp4_tiled_scale_index(int64_t row, int64_t block_col, int64_t block_cols) {
  const int64_t tile_cols = (block_cols + 3) / 4;
  const int64_t tile = (row / 128) * tile_cols + block_col / 4;
  const int64_t r = row % 128;
  return tile * 512 + (r % 32) * 16 + (r / 32) * 4 + block_col % 4;
}

// `packed` U8 [O, I/2], `block_scales` F8_E4M3 [O, I/16] (row-major) or the tiled shape above,
// into a new [O, I] tensor of `into` (F32, or BF16 rounded once, to nearest even). The error names
// what does not fit; callers add the tensor names.
Result<Tensor> dequantize_nvfp4(const Tensor& packed, const Tensor& block_scales, Nvfp4ScaleLayout layout,
                                float tensor_scale, DType into);

}  // namespace vortex
