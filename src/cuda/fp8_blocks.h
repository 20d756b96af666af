// The block-scaled fp8 quantizer on the GPU (the CPU reference and the recipe: cpu/fp8_blocks.h):
// x [N, C] → e4m3 codes [N, C] and one fp32 scale per block, in one of the two scale layouts of
// cpu/fp8_blocks.h (kTiles: 128 rows × 128 columns; kRows: 1 row × 128 columns). Codes and scales are bitwise
// cpu::quantize_blocks_fp8's (the rule of cpu/fp8_scale.h over each block; a non-finite block is
// all NaN codes with a NaN scale).
//
// Its users: the attention outputs of the backends that cannot quantize their own tiles (kTiles),
// and the out projection's weight at load (kRows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/fp8_blocks.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// x: [N, C] F32 or BF16 device view (unit column stride, any row stride), C a multiple of 128;
// codes: F8_E4M3 [N, C] (unit column stride); scales: contiguous F32 of
// cpu::fp8_block_scales(layout, N, C).shape (its padding is written 0).
Status quantize_blocks_fp8(const TensorView& x, cpu::Fp8BlockLayout layout, const TensorView& codes,
                           const TensorView& scales, cudaStream_t stream);

// Writes 0 into the padding of kTiles scales (the K blocks past cols / 128 in each row of
// round_up(cols / 128, 4)), which no block of the quantizer or of an attention epilogue writes;
// nothing when there is none. scales: a contiguous F32 device tensor of that layout's shape.
Status zero_block_scale_padding(const TensorView& scales, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace vortex::cuda
