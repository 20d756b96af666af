// 1-D convolution gathers of the audio VAE (contract: vae_conv1d.h):
//
//   conv1d_im2col                 col[r, k·C + c] = x[b, t·s + k·d - p, c]              (then col · Wᵀ)
//   conv_transpose1d_overlap_add  y[b, t, o] = Σ_k Z[b·T + (t + p - k)/s, k·O + o] + bias[o]
//
// One variant each, one thread per output element with the channel fastest, so reads and writes
// are coalesced along C (or O). The overlap-add performs the CPU's fp32 additions in the CPU's
// order (ascending k from 0.0f, the bias last), so for the same Z the result is bit-identical.
#include "cuda/vae_conv1d.h"

#include <algorithm>
#include <string>

#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t work) { return static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, 132 * 16)); }

struct Im2colParams {
  const float* x;  // [B, T, C]
  float* col;      // [rows, K·C]
  int64_t T, C, K, stride, dilation, padding, out_length, row0, rows;
};

__global__ void im2col_kernel(Im2colParams p) {
  const int64_t width = p.K * p.C, total = p.rows * width;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = p.row0 + e / width, kc = e % width;
    const int64_t b = r / p.out_length, t = r % p.out_length, k = kc / p.C, c = kc % p.C;
    const int64_t src = t * p.stride + k * p.dilation - p.padding;
    p.col[e] = (src >= 0 && src < p.T) ? p.x[(b * p.T + src) * p.C + c] : 0.0f;
  }
}

struct OverlapAddParams {
  const float* z;     // [B·T, K·O]
  const float* bias;  // [O] or null
  float* y;           // [B, T_out, O]
  int64_t T, K, O, stride, padding, out_length, total;
};

__global__ void overlap_add_kernel(OverlapAddParams p) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < p.total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = e % p.O, bt = e / p.O, b = bt / p.out_length, t = bt % p.out_length;
    const int64_t full = t + p.padding;  // index into the uncropped output
    float acc = 0.0f;
    for (int64_t k = full % p.stride; k < p.K; k += p.stride) {
      const int64_t i = (full - k) / p.stride;
      if (i < 0) break;  // i only falls as k grows
      if (i >= p.T) continue;
      acc = __fadd_rn(acc, p.z[(b * p.T + i) * p.K * p.O + k * p.O + o]);
    }
    if (p.bias != nullptr) acc = __fadd_rn(acc, p.bias[o]);
    p.y[e] = acc;
  }
}

bool f32_device_contiguous(const TensorView& t) {
  return t.device == Device::kCuda && t.dtype == DType::kF32 && t.is_contiguous();
}

// A contiguous F32 device matrix [rows, cols] at `data`.
TensorView matrix(void* data, int64_t rows, int64_t cols) {
  TensorView v;
  v.data = data;
  v.dtype = DType::kF32;
  v.device = Device::kCuda;
  v.shape = Shape({rows, cols});
  v.strides = Shape({cols, 1});
  return v;
}

}  // namespace

Status conv1d_im2col(const TensorView& x, const Conv1dGeometry& g, int64_t row0, const TensorView& col,
                     cudaStream_t stream) {
  if (!f32_device_contiguous(x) || x.rank() != 3 || !f32_device_contiguous(col) || col.rank() != 2) {
    return invalid_argument("conv1d_im2col: x must be contiguous F32 [B, T, C] and col contiguous F32 [rows, K·C], on "
                            "the device");
  }
  const int64_t B = x.shape[0], T = x.shape[1], C = x.shape[2];
  if (g.kernel < 1 || g.stride < 1 || g.dilation < 1 || g.padding < 0 || g.out_length < 1 ||
      col.shape[1] != g.kernel * C || row0 < 0 || row0 + col.shape[0] > B * g.out_length) {
    return invalid_argument("conv1d_im2col: col " + col.shape.to_string() + " at row " + std::to_string(row0) +
                            " does not match x " + x.shape.to_string() + " and kernel " + std::to_string(g.kernel));
  }
  if (col.shape[0] == 0 || C == 0) return ok_status();
  const Im2colParams p{static_cast<const float*>(x.data), static_cast<float*>(col.data), T, C, g.kernel, g.stride,
                       g.dilation, g.padding, g.out_length, row0, col.shape[0]};
  im2col_kernel<<<blocks_for(col.shape[0] * col.shape[1]), kThreads, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status conv_transpose1d_overlap_add(const TensorView& z, int64_t batch, int64_t kernel, int64_t stride,
                                    int64_t padding, const float* bias, const TensorView& y, cudaStream_t stream) {
  if (!f32_device_contiguous(z) || z.rank() != 2 || !f32_device_contiguous(y) || y.rank() != 3) {
    return invalid_argument("conv_transpose1d_overlap_add: z must be contiguous F32 [B·T, K·O] and y contiguous F32 "
                            "[B, T_out, O], on the device");
  }
  const int64_t O = y.shape[2];
  if (batch < 1 || kernel < 1 || stride < 1 || padding < 0 || y.shape[0] != batch || z.shape[0] % batch != 0 ||
      z.shape[1] != kernel * O) {
    return invalid_argument("conv_transpose1d_overlap_add: z " + z.shape.to_string() + " does not match y " +
                            y.shape.to_string() + " with kernel " + std::to_string(kernel));
  }
  const int64_t T = z.shape[0] / batch;
  if (y.shape[1] != (T - 1) * stride - 2 * padding + kernel) {
    return invalid_argument("conv_transpose1d_overlap_add: y " + y.shape.to_string() + " is not the output length of " +
                            std::to_string(T) + " samples");
  }
  const int64_t total = y.shape[0] * y.shape[1] * O;
  if (total == 0) return ok_status();
  const OverlapAddParams p{static_cast<const float*>(z.data), bias, static_cast<float*>(y.data), T, kernel, O, stride,
                           padding, y.shape[1], total};
  overlap_add_kernel<<<blocks_for(total), kThreads, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status conv1d(GemmRunner& gemm, const TensorView& x, const Conv1dGeometry& geometry, const TensorView& weight,
              const TensorView* bias, const TensorView& columns, const TensorView& y, cudaStream_t stream) {
  if (!f32_device_contiguous(x) || x.rank() != 3 || !f32_device_contiguous(y) || y.rank() != 3 ||
      !f32_device_contiguous(columns) || weight.rank() != 2) {
    return invalid_argument("conv1d: x and y must be contiguous F32 [B, T, C] device tensors, the weight [O, K·C]");
  }
  const int64_t B = x.shape[0], T = x.shape[1], C = x.shape[2], O = weight.shape[0], T_out = y.shape[1];
  const int64_t width = geometry.kernel * C;
  if (y.shape[0] != B || y.shape[2] != O || weight.shape[1] != width || geometry.out_length != T_out) {
    return invalid_argument("conv1d: x " + x.shape.to_string() + ", weight " + weight.shape.to_string() + " and y " +
                            y.shape.to_string() + " do not make a convolution of kernel " +
                            std::to_string(geometry.kernel));
  }
  if (geometry.kernel == 1 && geometry.stride == 1 && geometry.padding == 0) {
    if (T_out != T) return invalid_argument("conv1d: a 1x1 convolution keeps the length " + std::to_string(T));
    return gemm.linear(matrix(x.data, B * T, C), weight, bias, matrix(y.data, B * T_out, O), stream);
  }
  const int64_t block = columns.numel() / width;
  if (block < 1) {
    return invalid_argument("conv1d: a scratch of " + std::to_string(columns.numel()) + " floats holds no row of " +
                            std::to_string(width));
  }
  float* out = static_cast<float*>(y.data);
  for (int64_t r0 = 0; r0 < B * T_out; r0 += block) {
    const int64_t rows = std::min(block, B * T_out - r0);
    const TensorView col = matrix(columns.data, rows, width);
    VORTEX_RETURN_IF_ERROR(conv1d_im2col(x, geometry, r0, col, stream));
    VORTEX_RETURN_IF_ERROR(gemm.linear(col, weight, bias, matrix(out + r0 * O, rows, O), stream));
  }
  return ok_status();
}

}  // namespace vortex::cuda
