// The video VAE encoder's gather and GroupNorm kernels (contract: vae_conv3d.h).
//
// conv3d_gather writes one thread per 4 channels of one (row, tap) when C is a multiple of 4
// (every conv but conv_in's, which reads 3 channels), one per channel otherwise: a pure copy, so
// the rows are the CPU's im2col rows bit for bit.
//
// frame_group_norm runs five small launches: partial sums of each (frame, group) over kChunks
// slices (per-thread double partials, a warp shuffle tree, the warps in fixed order), their total
// in slice order (the mean), the same for the squared deviations around the double mean (the
// variance), then one elementwise pass. Every sum is deterministic; against the CPU's sequential
// double sums only the order differs, so mean and rstd round to the CPU's floats except next to a
// tie. The output is the CPU's fp32 sequence in explicitly rounded intrinsics (no fma); SiLU's
// expf (2 ulp) is the one place it can differ otherwise.
#include "cuda/vae_conv3d.h"

#include <algorithm>
#include <string>

#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kChunks = 16;
constexpr int64_t kMaxGrid = int64_t{1} << 30;

__device__ __forceinline__ int64_t reflect_index(int64_t i, int64_t n) {
  if (i < 0) i = -i;
  if (i >= n) i = 2 * (n - 1) - i;
  return i;
}

struct GatherParams {
  const float* x;
  float* cols;
  int64_t T, H, W, C, plane, w_out, frame, a0, r0, rows, spatial_taps, real_taps;
  Conv3dTaps g;
};

template <int kVec>
__global__ void __launch_bounds__(kThreads) gather_kernel(GatherParams p) {
  const int64_t vecs = p.C / kVec;
  const int64_t total = p.rows * p.real_taps * vecs;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total; i += int64_t{gridDim.x} * kThreads) {
    const int64_t v = i % vecs, tap = (i / vecs) % p.real_taps, r = i / (vecs * p.real_taps);
    const int64_t ta = p.a0 + tap / p.spatial_taps, b = (tap % p.spatial_taps) / p.g.kw, d = tap % p.g.kw;
    const int64_t out = (p.r0 + r) % p.plane, clip = (p.r0 + r) / p.plane, ho = out / p.w_out, wo = out % p.w_out;
    const int64_t t = clip * p.T + p.frame * p.g.st + ta - p.g.temporal_padding;
    const int64_t hi = reflect_index(ho * p.g.sh + b - p.g.pad_top, p.H);
    const int64_t wi = reflect_index(wo * p.g.sw + d - p.g.pad_left, p.W);
    const float* src = p.x + ((t * p.H + hi) * p.W + wi) * p.C + v * kVec;
    float* dst = p.cols + (r * p.real_taps + tap) * p.C + v * kVec;
    if constexpr (kVec == 4) {
      *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
    } else {
      *dst = *src;
    }
  }
}

struct GroupNormParams {
  const float* x;
  float* y;
  const float* weight;
  const float* bias;
  double* partial;  // [T·G, kChunks]
  double* mean;     // [T·G]
  double* rstd;     // [T·G], the fp32 rstd held as a double
  int64_t frames, pixels, C, G, Cg;
  float eps;
  bool silu;
};

__device__ double block_total(double v, double* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// blockIdx.x: the (frame, group) s = frame·G + g; blockIdx.y: the slice of its P·Cg values.
template <bool kSquares>
__global__ void __launch_bounds__(kThreads) group_partial_kernel(GroupNormParams p) {
  __shared__ double scratch[kWarps];
  const int64_t s = blockIdx.x, frame = s / p.G, g = s % p.G;
  const int64_t n = p.pixels * p.Cg, begin = n * blockIdx.y / kChunks, end = n * (blockIdx.y + 1) / kChunks;
  const float* base = p.x + frame * p.pixels * p.C + g * p.Cg;
  const double m = kSquares ? p.mean[s] : 0.0;
  double sum = 0.0;
  for (int64_t e = begin + threadIdx.x; e < end; e += kThreads) {
    const double v = base[(e / p.Cg) * p.C + e % p.Cg];
    if constexpr (kSquares) {
      sum += (v - m) * (v - m);
    } else {
      sum += v;
    }
  }
  const double total = block_total(sum, scratch);
  if (threadIdx.x == 0) p.partial[s * kChunks + blockIdx.y] = total;
}

template <bool kSquares>
__global__ void group_finish_kernel(GroupNormParams p) {
  const int64_t s = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (s >= p.frames * p.G) return;
  double total = 0.0;
  for (int64_t j = 0; j < kChunks; ++j) total += p.partial[s * kChunks + j];
  const double n = static_cast<double>(p.pixels * p.Cg);
  if constexpr (kSquares) {
    p.rstd[s] = static_cast<float>(1.0 / sqrt(total / n + static_cast<double>(p.eps)));
  } else {
    p.mean[s] = total / n;
  }
}

__global__ void __launch_bounds__(kThreads) group_apply_kernel(GroupNormParams p) {
  const int64_t total = p.frames * p.pixels * p.C;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total; i += int64_t{gridDim.x} * kThreads) {
    const int64_t c = i % p.C, s = (i / (p.pixels * p.C)) * p.G + c / p.Cg;
    const float mean = static_cast<float>(p.mean[s]), rstd = static_cast<float>(p.rstd[s]);
    float v = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(p.x[i], mean), rstd), p.weight[c]), p.bias[c]);
    if (p.silu) v = __fdiv_rn(v, __fadd_rn(1.0f, expf(-v)));
    p.y[i] = v;
  }
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxGrid));
}

bool is_f32_device(const TensorView& t) { return t.device == Device::kCuda && t.dtype == DType::kF32; }

}  // namespace

Status conv3d_gather(const TensorView& x, int64_t clips, const Conv3dTaps& taps, int64_t h_out, int64_t w_out,
                     int64_t frame, int64_t a0, int64_t r0, const TensorView& cols, cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda conv3d_gather: " + what + " (" + describe_view("x", x) + ", " +
                            describe_view("cols", cols) + ")");
  };
  if (!is_f32_device(x) || !is_f32_device(cols)) return bad("x and cols must be F32 device tensors");
  if (x.rank() != 4 || !x.is_contiguous()) return bad("x must be contiguous [T, H, W, C]");
  if (cols.rank() != 2 || !cols.is_contiguous()) return bad("cols must be contiguous [rows, K]");
  if (a0 < 0 || a0 >= taps.kt) return bad("the first real temporal tap must be in [0, kt)");
  if (clips < 1 || x.shape[0] % clips != 0) return bad("x must hold a whole number of clips");
  const int64_t T = x.shape[0] / clips, plane = h_out * w_out;
  const int64_t C = x.shape[3], spatial = taps.kh * taps.kw, real_taps = (taps.kt - a0) * spatial;
  if (cols.shape[1] != real_taps * C) return bad("cols must have (kt - a0)·kh·kw·C columns");
  if (r0 < 0 || r0 + cols.shape[0] > clips * plane) return bad("the rows must lie in the clips' output frames");
  const int64_t t_first = frame * taps.st + a0 - taps.temporal_padding, t_last = frame * taps.st + taps.kt - 1 -
                                                                              taps.temporal_padding;
  if (t_first < 0 || t_last >= T) return bad("the taps of frame " + std::to_string(frame) + " leave the clip");
  if (cols.shape[0] == 0) return ok_status();
  GatherParams p{static_cast<const float*>(x.data),
                 static_cast<float*>(cols.data),
                 T,
                 x.shape[1],
                 x.shape[2],
                 C,
                 plane,
                 w_out,
                 frame,
                 a0,
                 r0,
                 cols.shape[0],
                 spatial,
                 real_taps,
                 taps};
  if (C % 4 == 0) {
    gather_kernel<4><<<grid_for(p.rows * real_taps * C / 4), kThreads, 0, stream>>>(p);
  } else {
    gather_kernel<1><<<grid_for(p.rows * real_taps * C), kThreads, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

int64_t frame_group_norm_scratch(int64_t frames, int64_t groups) { return frames * groups * (kChunks + 2); }

Status frame_group_norm(const TensorView& x, const TensorView& weight, const TensorView& bias, int64_t groups,
                        float eps, bool silu, const TensorView& scratch, const TensorView& y, cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda frame_group_norm: " + what + " (" + describe_view("x", x) + ", " +
                            describe_view("y", y) + ")");
  };
  if (!is_f32_device(x) || !is_f32_device(y) || !is_f32_device(weight) || !is_f32_device(bias)) {
    return bad("x, y, weight and bias must be F32 device tensors");
  }
  if (x.rank() != 4 || !x.is_contiguous() || y.shape != x.shape || !y.is_contiguous()) {
    return bad("x and y must be contiguous [T, H, W, C] of one shape");
  }
  const int64_t T = x.shape[0], P = x.shape[1] * x.shape[2], C = x.shape[3];
  if (groups < 1 || C % groups != 0) {
    return bad(std::to_string(C) + " channels do not split into " + std::to_string(groups) + " groups");
  }
  if (weight.numel() != C || bias.numel() != C || !weight.is_contiguous() || !bias.is_contiguous()) {
    return bad("weight and bias must be contiguous [C]");
  }
  if (scratch.device != Device::kCuda || scratch.dtype != DType::kF64 || !scratch.is_contiguous() ||
      scratch.numel() < frame_group_norm_scratch(T, groups)) {
    return bad("scratch must be contiguous F64 on the device with frame_group_norm_scratch(T, groups) elements");
  }
  if (T * P * C == 0) return ok_status();
  double* s = static_cast<double*>(scratch.data);
  const int64_t sets = T * groups;
  GroupNormParams p{static_cast<const float*>(x.data),
                    static_cast<float*>(y.data),
                    static_cast<const float*>(weight.data),
                    static_cast<const float*>(bias.data),
                    s,
                    s + sets * kChunks,
                    s + sets * (kChunks + 1),
                    T,
                    P,
                    C,
                    groups,
                    C / groups,
                    eps,
                    silu};
  if (sets > kMaxGrid) return bad("too many (frame, group) sets");
  const dim3 partial_grid(static_cast<unsigned>(sets), static_cast<unsigned>(kChunks));
  group_partial_kernel<false><<<partial_grid, kThreads, 0, stream>>>(p);
  group_finish_kernel<false><<<grid_for(sets), kThreads, 0, stream>>>(p);
  group_partial_kernel<true><<<partial_grid, kThreads, 0, stream>>>(p);
  group_finish_kernel<true><<<grid_for(sets), kThreads, 0, stream>>>(p);
  group_apply_kernel<<<grid_for(T * P * C), kThreads, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
