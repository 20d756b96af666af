// Synthetic weight fill (see synthetic_fill.h): one thread per group of four elements, which is
// one Philox block, so each counter value is computed once.
#include "cuda/synthetic_fill.h"

#include "core/dtype.h"
#include "core/rng.h"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

template <bool kBf16>
__global__ void scaled_normal_kernel(void* out, int64_t n, uint64_t seed, uint64_t stream, float scale) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks; b += int64_t(gridDim.x) * blockDim.x) {
    const F32x4 z = normal4_at_block(seed, stream, static_cast<uint64_t>(b));
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = b * 4 + lane;
      if (i >= n) break;
      const float v = __fmul_rn(z.v[lane], scale);
      if constexpr (kBf16) {
        static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(v);
      } else {
        static_cast<float*>(out)[i] = v;
      }
    }
  }
}

template <bool kBf16>
__global__ void constant_kernel(void* out, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (kBf16) {
      static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(value);
    } else {
      static_cast<float*>(out)[i] = value;
    }
  }
}

Status check_target(const Tensor& dst) {
  if (dst.device() != Device::kCuda || !dst.is_contiguous() ||
      (dst.dtype() != DType::kF32 && dst.dtype() != DType::kBF16)) {
    return invalid_argument("synthetic fill needs a contiguous F32/BF16 device tensor, got " + dst.describe());
  }
  return ok_status();
}

constexpr int kThreads = 256;
int grid_for(int64_t work) { return static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, 132 * 16)); }

}  // namespace

Status fill_scaled_normal(const Tensor& dst, uint64_t seed, uint64_t stream, float scale, cudaStream_t s) {
  VORTEX_RETURN_IF_ERROR(check_target(dst));
  const int64_t n = dst.numel();
  if (n == 0) return ok_status();
  const int grid = grid_for((n + 3) / 4);
  if (dst.dtype() == DType::kBF16) {
    scaled_normal_kernel<true><<<grid, kThreads, 0, s>>>(dst.data(), n, seed, stream, scale);
  } else {
    scaled_normal_kernel<false><<<grid, kThreads, 0, s>>>(dst.data(), n, seed, stream, scale);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status fill_constant(const Tensor& dst, float value, cudaStream_t s) {
  VORTEX_RETURN_IF_ERROR(check_target(dst));
  const int64_t n = dst.numel();
  if (n == 0) return ok_status();
  if (dst.dtype() == DType::kBF16) {
    constant_kernel<true><<<grid_for(n), kThreads, 0, s>>>(dst.data(), n, value);
  } else {
    constant_kernel<false><<<grid_for(n), kThreads, 0, s>>>(dst.data(), n, value);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
