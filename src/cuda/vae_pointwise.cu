// Pointwise ops of the audio VAE decode (contract: vae_pointwise.h):
//
//   divide_by           x = x / d           (IEEE division, __fdiv_rn: the CPU's operation)
//   clamp               x = x < lo ? lo : (hi < x ? hi : x)
//   heads_mean_pool     a thread per output value, its window's head sums in the CPU's order
//   gelu_tanh_gate      g = R(0.5·a·(1 + tanh(√(2/π)·(a + 0.044715·a³)))) · v, the GELU in double
//   normalize_channels  x = (x − mean[c]) / std[c]
//
// One variant each: a grid-stride loop over the elements (of the output, for the pooling).
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

__global__ void heads_mean_pool_kernel(const float* x, float* pooled, int64_t rows, int heads, int width, int out) {
  const int64_t n = rows * out;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / out;
    const int i = static_cast<int>(e % out);
    const int start = i * width / out, end = ((i + 1) * width + out - 1) / out;
    const float* row = x + r * heads * width;
    float sum = 0.0f;
    for (int w = start; w < end; ++w) {
      float head_sum = 0.0f;
      for (int h = 0; h < heads; ++h) head_sum = __fadd_rn(head_sum, row[h * width + w]);
      sum = __fadd_rn(sum, __fdiv_rn(head_sum, static_cast<float>(heads)));
    }
    pooled[e] = __fdiv_rn(sum, static_cast<float>(end - start));
  }
}

__global__ void gelu_tanh_gate_kernel(float* gate, const float* value, int64_t n) {
  constexpr double kSqrtTwoOverPi = 0.79788456080286536;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // The host's double operations one by one (no fma contraction), as cpu::gelu writes them;
    // CUDA's tanh may differ from the host's in the last double bits.
    const double a = gate[i];
    const double cubic = __dmul_rn(__dmul_rn(__dmul_rn(0.044715, a), a), a);
    const double t = tanh(__dmul_rn(kSqrtTwoOverPi, __dadd_rn(a, cubic)));
    const float g = __double2float_rn(__dmul_rn(__dmul_rn(0.5, a), __dadd_rn(1.0, t)));
    gate[i] = __fmul_rn(g, value[i]);
  }
}

__global__ void normalize_channels_kernel(float* x, const float* mean, const float* std, int64_t n, int64_t C) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % C;
    x[i] = __fdiv_rn(__fsub_rn(x[i], mean[c]), std[c]);
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

Status heads_mean_pool(const TensorView& x, int64_t heads, const TensorView& pooled, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check(x, "heads_mean_pool"));
  VORTEX_RETURN_IF_ERROR(check(pooled, "heads_mean_pool"));
  if (x.rank() != 2 || pooled.rank() != 2 || pooled.shape[0] != x.shape[0] || heads < 1 || x.shape[1] % heads != 0 ||
      pooled.shape[1] < 1 || pooled.shape[1] > x.shape[1] / heads || x.shape[1] > INT32_MAX) {
    return invalid_argument("heads_mean_pool: x " + x.shape.to_string() + " of " + std::to_string(heads) +
                            " heads cannot pool to " + pooled.shape.to_string());
  }
  const int64_t n = pooled.numel();
  if (n == 0) return ok_status();
  heads_mean_pool_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      static_cast<const float*>(x.data), static_cast<float*>(pooled.data), x.shape[0], static_cast<int>(heads),
      static_cast<int>(x.shape[1] / heads), static_cast<int>(pooled.shape[1]));
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status gelu_tanh_gate(const TensorView& gate, const TensorView& value, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check(gate, "gelu_tanh_gate"));
  VORTEX_RETURN_IF_ERROR(check(value, "gelu_tanh_gate"));
  if (value.shape != gate.shape) {
    return invalid_argument("gelu_tanh_gate: value " + value.shape.to_string() + " is not gate's " +
                            gate.shape.to_string());
  }
  const int64_t n = gate.numel();
  if (n == 0) return ok_status();
  gelu_tanh_gate_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<float*>(gate.data),
                                                                 static_cast<const float*>(value.data), n);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status normalize_channels(const TensorView& x, const float* mean, const float* std, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check(x, "normalize_channels"));
  if (x.rank() != 2 || mean == nullptr || std == nullptr) {
    return invalid_argument("normalize_channels: x " + x.shape.to_string() + " must be [R, C] with C means and stds");
  }
  const int64_t n = x.numel();
  if (n == 0) return ok_status();
  normalize_channels_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<float*>(x.data), mean, std, n,
                                                                     x.shape[1]);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
