// Quantized checkpoint weights dequantized on the device, with the bits of the host's rule
// (models/h3/scaled_weights.h, formats/nvfp4.h): each element's fp32 product rounded once (RNE) to
// the output dtype. The loaders upload the codes and scales (half the bytes of bf16 for fp8, a
// quarter for NVFP4) and dequantize here, instead of dequantizing on the host and uploading bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "formats/nvfp4.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// out[r, c] = float(codes[r, c]) · scale, scale = scales[0] (one for the tensor), scales[r] (one a
// row) or 1 (`scales` undefined). `codes`: contiguous device F8_E4M3 / F8_E5M2 [rows, cols] (or any
// rank: rows = the first dim); `scales`: contiguous device F32 of 1 or rows elements; `out`:
// contiguous device F32 or BF16 of codes' shape. Queued on `stream`.
Status dequantize_fp8_weight(const Tensor& codes, const Tensor& scales, const Tensor& out, cudaStream_t stream);

// out[r, i] = e2m1(code) · (tensor_scale · e4m3(block scale of (r, i / 16))). `packed`: contiguous
// device U8 [rows, cols / 2]; `block_scales`: contiguous device F8_E4M3 in `layout`'s shape; `out`:
// contiguous device F32 or BF16 [rows, cols]. Queued on `stream`.
Status dequantize_nvfp4_weight(const Tensor& packed, const Tensor& block_scales, Nvfp4ScaleLayout layout,
                               float tensor_scale, const Tensor& out, cudaStream_t stream);

// out = a GGUF quantized weight's values (formats/gguf.h: ggml's dequantization of `type`, Q4_0 ...
// Q6_K, each product and sum rounded as the host's dequantize_ggml rounds it), rounded once to the
// output dtype. `blocks`: contiguous device U8 [rows, row bytes], whole blocks a row; `out`:
// contiguous device F32 or BF16 [rows, row bytes / block bytes · block values]. Queued on `stream`.
Status dequantize_ggml_weight(const Tensor& blocks, uint32_t type, const Tensor& out, cudaStream_t stream);

}  // namespace vortex::cuda
