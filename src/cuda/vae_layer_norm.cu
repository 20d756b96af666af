// LayerNorm over the last dim (contract: vae_layer_norm.h), for the video VAE decoder's norm_out
// and the Qwen3-VL vision tower's norms:
//
//   y = R(((x - mean) · rstd) · weight + bias),  rstd = 1 / sqrt(var + eps)
//
// One variant: one 256-thread block per row (rows grid-strided). The CPU reference sums the row
// and the squared deviations in double; so does this kernel (per-thread partials, a warp shuffle
// tree and a fixed-order sum of the eight warp partials), which leaves mean and variance equal to
// the CPU's after their rounding to fp32 except when a double sum lands within an ulp of a tie.
// Everything after the sums is the CPU's fp32 operation sequence in explicitly rounded
// intrinsics, so nvcc cannot fuse a product into an fma. The row is read three times (sum,
// deviations, output); the second and third reads hit L1/L2, and the decoder runs this once per
// tile on ~1.8k rows, so caching the row in registers would buy nothing measurable.
#include "cuda/vae_layer_norm.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "cuda/block_sum.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 65535;

struct LayerNormParams {
  const void* x;
  int64_t x_stride;
  bool x_bf16;
  const float* weight;
  const float* bias;
  void* y;
  int64_t y_stride;
  bool y_bf16;
  int64_t rows;
  int c;
  float eps;
};

template <bool kBf16In>
__global__ void __launch_bounds__(kThreads) layer_norm_kernel(LayerNormParams p) {
  __shared__ double scratch[kWarps];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const auto in = [&](int c) -> float {
      if constexpr (kBf16In) {
        return bf16_bits_to_f32(static_cast<const uint16_t*>(p.x)[r * p.x_stride + c]);
      } else {
        return static_cast<const float*>(p.x)[r * p.x_stride + c];
      }
    };
    double sum = 0.0;
    for (int c = threadIdx.x; c < p.c; c += kThreads) sum += in(c);
    const float mean = static_cast<float>(block_sum_f64<kWarps>(sum, scratch) / static_cast<double>(p.c));
    double squares = 0.0;
    for (int c = threadIdx.x; c < p.c; c += kThreads) {
      const double d = __fsub_rn(in(c), mean);
      squares += d * d;  // exact in double: a product of two floats has at most 48 significant bits
    }
    const float var = static_cast<float>(block_sum_f64<kWarps>(squares, scratch) / static_cast<double>(p.c));
    const float rstd = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, p.eps)));
    for (int c = threadIdx.x; c < p.c; c += kThreads) {
      const float v = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(in(c), mean), rstd), p.weight[c]), p.bias[c]);
      if (p.y_bf16) {
        static_cast<uint16_t*>(p.y)[r * p.y_stride + c] = f32_to_bf16_bits(v);
      } else {
        static_cast<float*>(p.y)[r * p.y_stride + c] = v;
      }
    }
  }
}

}  // namespace

Status layer_norm(const TensorView& x, const TensorView& weight, const TensorView& bias, float eps,
                  const TensorView& y, cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda layer_norm: " + what + " (x " + dtype_name(x.dtype) + x.shape.to_string() + ", y " +
                            dtype_name(y.dtype) + y.shape.to_string() + ")");
  };
  for (const TensorView* t : {&x, &weight, &bias, &y}) {
    if (t->device != Device::kCuda) return bad("every operand must be on the device");
  }
  if ((x.dtype != DType::kF32 && x.dtype != DType::kBF16) || weight.dtype != DType::kF32 ||
      bias.dtype != DType::kF32) {
    return bad("x must be F32 or BF16, weight and bias F32");
  }
  if (y.dtype != DType::kF32 && y.dtype != DType::kBF16) return bad("y must be F32 or BF16");
  if (x.rank() != 2 || y.shape != x.shape || x.strides[1] != 1 || y.strides[1] != 1) {
    return bad("x and y must be [N, C] with unit column stride");
  }
  const int64_t rows = x.shape[0], c = x.shape[1];
  if (weight.rank() != 1 || bias.rank() != 1 || weight.shape[0] != c || bias.shape[0] != c ||
      !weight.is_contiguous() || !bias.is_contiguous()) {
    return bad("weight and bias must be contiguous [C]");
  }
  if (c < 1 || c > INT32_MAX) return bad("C must be in [1, 2^31)");
  if (!(eps >= 0.0f)) return bad("eps must be >= 0");
  if (rows == 0) return ok_status();
  LayerNormParams p{};
  p.x = x.data;
  p.x_stride = x.strides[0];
  p.x_bf16 = x.dtype == DType::kBF16;
  p.weight = static_cast<const float*>(weight.data);
  p.bias = static_cast<const float*>(bias.data);
  p.y = y.data;
  p.y_stride = y.strides[0];
  p.y_bf16 = y.dtype == DType::kBF16;
  p.rows = rows;
  p.c = static_cast<int>(c);
  p.eps = eps;
  const unsigned blocks = static_cast<unsigned>(std::min(rows, kMaxBlocks));
  if (p.x_bf16) {
    layer_norm_kernel<true><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    layer_norm_kernel<false><<<blocks, kThreads, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
