// Device dequantization of checkpoint weights (see dequantize_weights.h). Memory-bound elementwise
// kernels: each thread writes a few consecutive outputs; __fmul_rn keeps the one rounding the host
// makes per product.
#include "cuda/dequantize_weights.h"

#include <string>

#include "core/dtype.h"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void store(void* out, bool bf16, int64_t i, float v) {
  if (bf16) {
    static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(v);
  } else {
    static_cast<float*>(out)[i] = v;
  }
}

__global__ void fp8_kernel(const uint8_t* codes, bool e5m2, const float* scales, bool per_row, int64_t cols,
                           int64_t n, void* out, bool bf16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float value = e5m2 ? e5m2_bits_to_f32(codes[i]) : e4m3_bits_to_f32(codes[i]);
    const float scale = scales == nullptr ? 1.0f : scales[per_row ? i / cols : 0];
    store(out, bf16, i, __fmul_rn(value, scale));
  }
}

// One thread per packed byte: its two elements share a block scale (blocks are 16 elements).
__global__ void nvfp4_kernel(const uint8_t* packed, const uint8_t* block_scales, bool tiled, float tensor_scale,
                             int64_t cols, int64_t bytes, void* out, bool bf16) {
  const int64_t block_cols = cols / kNvfp4BlockSize;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < bytes; b += int64_t(gridDim.x) * blockDim.x) {
    const int64_t first = 2 * b;  // the byte's first element, row-major over [rows, cols]
    const int64_t row = first / cols, block = (first % cols) / kNvfp4BlockSize;
    const int64_t at = tiled ? nvfp4_tiled_scale_index(row, block, block_cols) : row * block_cols + block;
    const float scale = __fmul_rn(tensor_scale, e4m3_bits_to_f32(block_scales[at]));
    const uint8_t byte = packed[b];
    store(out, bf16, first, __fmul_rn(e2m1_code_to_f32(byte & 0xF), scale));
    store(out, bf16, first + 1, __fmul_rn(e2m1_code_to_f32(byte >> 4), scale));
  }
}

int grid_for(int64_t n) {
  // Enough CTAs to fill the device several times over; the loops cover the rest.
  const int64_t ctas = (n + kThreads - 1) / kThreads;
  return static_cast<int>(ctas < 132 * 16 ? (ctas > 0 ? ctas : 1) : 132 * 16);
}

Status check_out(const Tensor& out, const Shape& shape, const char* what) {
  if (out.device() != Device::kCuda || !out.is_contiguous() || out.shape() != shape ||
      (out.dtype() != DType::kF32 && out.dtype() != DType::kBF16)) {
    return invalid_argument(std::string(what) + ": the output must be a contiguous device F32 or BF16 " +
                            shape.to_string() + ", not " + out.describe());
  }
  return ok_status();
}

}  // namespace

Status dequantize_fp8_weight(const Tensor& codes, const Tensor& scales, const Tensor& out, cudaStream_t stream) {
  if (codes.device() != Device::kCuda || !codes.is_contiguous() ||
      (codes.dtype() != DType::kF8E4M3 && codes.dtype() != DType::kF8E5M2)) {
    return invalid_argument("dequantize_fp8_weight: codes must be contiguous device F8_E4M3 / F8_E5M2, not " +
                            codes.describe());
  }
  VORTEX_RETURN_IF_ERROR(check_out(out, codes.shape(), "dequantize_fp8_weight"));
  const int64_t rows = codes.rank() >= 1 ? codes.size(0) : 1;
  const int64_t n = codes.numel();
  if (scales.defined() && (scales.device() != Device::kCuda || scales.dtype() != DType::kF32 || !scales.is_contiguous() ||
                           (scales.numel() != 1 && scales.numel() != rows))) {
    return invalid_argument("dequantize_fp8_weight: scales must be contiguous device F32 of 1 or " +
                            std::to_string(rows) + " elements, not " + scales.describe());
  }
  if (n == 0) return ok_status();
  const bool per_row = scales.defined() && scales.numel() > 1;
  fp8_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const uint8_t*>(codes.data()),
                                                   codes.dtype() == DType::kF8E5M2,
                                                   scales.defined() ? scales.data_as<const float>() : nullptr, per_row,
                                                   rows > 0 ? n / rows : 1, n, out.data(), out.dtype() == DType::kBF16);
  VORTEX_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

Status dequantize_nvfp4_weight(const Tensor& packed, const Tensor& block_scales, Nvfp4ScaleLayout layout,
                               float tensor_scale, const Tensor& out, cudaStream_t stream) {
  if (packed.device() != Device::kCuda || !packed.is_contiguous() || packed.dtype() != DType::kU8 || packed.rank() != 2 ||
      (2 * packed.size(1)) % kNvfp4BlockSize != 0) {
    return invalid_argument("dequantize_nvfp4_weight: packed codes must be contiguous device U8 [rows, cols / 2] "
                            "with cols a multiple of 16, not " + packed.describe());
  }
  const int64_t rows = packed.size(0), cols = 2 * packed.size(1);
  const int64_t block_cols = cols / kNvfp4BlockSize;
  const Shape scale_shape = layout == Nvfp4ScaleLayout::kTiled ? nvfp4_tiled_scale_shape(rows, block_cols)
                                                               : Shape{rows, block_cols};
  if (block_scales.device() != Device::kCuda || !block_scales.is_contiguous() ||
      block_scales.dtype() != DType::kF8E4M3 || block_scales.shape() != scale_shape) {
    return invalid_argument("dequantize_nvfp4_weight: block scales must be contiguous device F8_E4M3 " +
                            scale_shape.to_string() + ", not " + block_scales.describe());
  }
  VORTEX_RETURN_IF_ERROR(check_out(out, Shape{rows, cols}, "dequantize_nvfp4_weight"));
  const int64_t bytes = packed.numel();
  if (bytes == 0) return ok_status();
  nvfp4_kernel<<<grid_for(bytes), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(packed.data()), static_cast<const uint8_t*>(block_scales.data()),
      layout == Nvfp4ScaleLayout::kTiled, tensor_scale, cols, bytes, out.data(), out.dtype() == DType::kBF16);
  VORTEX_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

}  // namespace vortex::cuda
