// The vision tower's elementwise ops (contract: vision_ops.h). One variant each, one element (gelu)
// or one rotation pair (rope_widened) per thread over a 2-D grid of rows: the tower runs them a few
// times per block on ~4k rows, far below its GEMMs and attention. The fp32 products and sums are
// explicitly rounded intrinsics, so nvcc cannot contract them into an fma; gelu's double tanh / erf
// are CUDA's and may differ from the host's in the last double bits, which the bf16 rounding hides
// but for ties.
#include "cuda/vision_ops.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

struct GeluParams {
  const uint16_t* x;
  uint16_t* y;
  int64_t x_stride, y_stride, rows, cols;
  bool tanh_form;
};

__global__ void gelu_kernel(GeluParams p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const double v = bf16_bits_to_f32(p.x[r * p.x_stride + c]);
    double g;
    if (p.tanh_form) {
      const double k = 0.7978845608028654;  // sqrt(2 / pi)
      g = 0.5 * v * (1.0 + tanh(k * (v + 0.044715 * v * v * v)));
    } else {
      g = 0.5 * v * (1.0 + erf(v * 0.7071067811865476));
    }
    p.y[r * p.y_stride + c] = f32_to_bf16_bits(static_cast<float>(g));
  }
}

struct RopeParams {
  uint16_t* x;
  int64_t row_stride, head_stride;
  const float* cos;
  const float* sin;
  int64_t rows, heads, half;
};

// Thread (head, k) of a row rotates the pair (k, half + k) of that head.
__global__ void rope_widened_kernel(RopeParams p) {
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= p.heads * p.half) return;
  const int64_t h = unit / p.half, k = unit % p.half, D = 2 * p.half;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    uint16_t* head = p.x + r * p.row_stride + h * p.head_stride;
    const float lo = bf16_bits_to_f32(head[k]), hi = bf16_bits_to_f32(head[p.half + k]);
    const float* cos = p.cos + r * D;
    const float* sin = p.sin + r * D;
    const float out_lo = __fadd_rn(__fmul_rn(lo, cos[k]), __fmul_rn(-hi, sin[k]));
    const float out_hi = __fadd_rn(__fmul_rn(hi, cos[p.half + k]), __fmul_rn(lo, sin[p.half + k]));
    head[k] = f32_to_bf16_bits(out_lo);
    head[p.half + k] = f32_to_bf16_bits(out_hi);
  }
}

bool on_device(std::initializer_list<const TensorView*> views) {
  for (const TensorView* v : views) {
    if (v->device != Device::kCuda) return false;
  }
  return true;
}

}  // namespace

Status gelu(const TensorView& x, const TensorView& y, cpu::GeluApproximation approximation, cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda gelu: " + what + " (x " + dtype_name(x.dtype) + x.shape.to_string() + ", y " +
                            dtype_name(y.dtype) + y.shape.to_string() + ")");
  };
  if (!on_device({&x, &y})) return bad("both operands must be on the device");
  if (x.dtype != DType::kBF16 || y.dtype != DType::kBF16) return bad("x and y must be BF16");
  if (x.rank() != 2 || y.shape != x.shape || x.strides[1] != 1 || y.strides[1] != 1) {
    return bad("x and y must be [N, C] with unit column stride");
  }
  if (x.shape.numel() == 0) return ok_status();
  GeluParams p{static_cast<const uint16_t*>(x.data), static_cast<uint16_t*>(y.data), x.strides[0], y.strides[0],
               x.shape[0], x.shape[1], approximation == cpu::GeluApproximation::kTanh};
  const dim3 grid(static_cast<unsigned>((p.cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min(p.rows, kMaxGridY)));
  gelu_kernel<<<grid, kThreads, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status rope_widened(const TensorView& x, const TensorView& cos, const TensorView& sin, cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda rope_widened: " + what + " (x " + dtype_name(x.dtype) + x.shape.to_string() +
                            ", cos " + cos.shape.to_string() + ")");
  };
  if (!on_device({&x, &cos, &sin})) return bad("every operand must be on the device");
  if (x.dtype != DType::kBF16 || x.rank() != 3 || x.strides[2] != 1 || x.shape[2] % 2 != 0) {
    return bad("x must be BF16 [N, H, D] with unit stride on an even D");
  }
  const Shape table{x.shape[0], x.shape[2]};
  if (cos.dtype != DType::kF32 || sin.dtype != DType::kF32 || cos.shape != table || sin.shape != table ||
      !cos.is_contiguous() || !sin.is_contiguous()) {
    return bad("cos and sin must be contiguous F32 [N, D]");
  }
  if (x.shape.numel() == 0) return ok_status();
  RopeParams p{static_cast<uint16_t*>(x.data), x.strides[0], x.strides[1], static_cast<const float*>(cos.data),
               static_cast<const float*>(sin.data), x.shape[0], x.shape[1], x.shape[2] / 2};
  const int64_t units = p.heads * p.half;
  const dim3 grid(static_cast<unsigned>((units + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min(p.rows, kMaxGridY)));
  rope_widened_kernel<<<grid, kThreads, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
