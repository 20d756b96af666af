// Pointwise ops of the audio VAE decode (contract: vae_pointwise.h):
//
//   divide_by  x = x / d           (IEEE division, __fdiv_rn: the CPU's operation)
//   clamp      x = x < lo ? lo : (hi < x ? hi : x)
//
// One variant each: a grid-stride loop over the elements.
#include "cuda/vae_pointwise.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16)); }

__global__ void divide_kernel(float* x, int64_t n, float divisor) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = __fdiv_rn(x[i], divisor);
  }
}

__global__ void clamp_kernel(float* x, int64_t n, float lo, float hi) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    x[i] = v < lo ? lo : (hi < v ? hi : v);
  }
}

Status check(const TensorView& x, const char* op) {
  if (x.device != Device::kCuda || x.dtype != DType::kF32 || !x.is_contiguous()) {
    return invalid_argument(std::string(op) + ": x must be a contiguous F32 device tensor");
  }
  return ok_status();
}

}  // namespace

Status divide_by(const TensorView& x, float divisor, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check(x, "divide_by"));
  const int64_t n = x.numel();
  if (n == 0) return ok_status();
  divide_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<float*>(x.data), n, divisor);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status clamp(const TensorView& x, float lo, float hi, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check(x, "clamp"));
  const int64_t n = x.numel();
  if (n == 0) return ok_status();
  clamp_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<float*>(x.data), n, lo, hi);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
