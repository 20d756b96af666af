// The block-scaled fp8 quantizer on the GPU (the CPU reference and the recipe: cpu/fp8_blocks.h):
// x [N, C] → e4m3 codes [N, C] and one fp32 scale per block of block_rows rows × 128 columns,
// scales [ceil(N / block_rows), C / 128] row-major. Codes and scales are bitwise
// cpu::quantize_blocks_fp8's (the rule of cpu/fp8_scale.h over each block; a non-finite block is
// all NaN codes with a NaN scale).
//
// Its users: the attention outputs of the backends that cannot quantize their own tiles (128-row
// tiles), and the out projection's weight at load (1-row blocks). Compiled; first run on the
// device is the next session's (bench/notes/block.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// x: [N, C] F32 or BF16 device view (unit column stride, any row stride), C a multiple of 128;
// codes: F8_E4M3 [N, C] (unit column stride); scales: contiguous F32 [ceil(N / block_rows), C / 128].
Status quantize_blocks_fp8(const TensorView& x, int64_t block_rows, const TensorView& codes,
                           const TensorView& scales, cudaStream_t stream);

}  // namespace vortex::cuda
