// The video VAE encoder's gather and GroupNorm kernels (contract: vae_conv3d.h).
//
// conv3d_gather copies with one warp per (row, tap) when C is a multiple of 4 (every conv but
// conv_in's, which reads 3 channels), one thread per value otherwise: a pure copy, so the rows are
// the CPU's im2col rows bit for bit.
//
// frame_group_norm runs five small launches: partial sums of each (frame, group) over kChunks
// slices (per-thread double partials, a warp shuffle tree, the warps in fixed order), their total
// in slice order (the mean), the same for the squared deviations around the double mean (the
// variance), then one elementwise pass; all read float4s when a group's channel count is a
// multiple of 4 (every GroupNorm of the release: 4 to 32 channels a group). Every sum is deterministic; against the CPU's sequential
// double sums only the order differs, so mean and rstd round to the CPU's floats except next to a
// tie. The output is the CPU's fp32 sequence in explicitly rounded intrinsics (no fma); SiLU's
// expf (2 ulp) is the one place it can differ otherwise.
#include "cuda/vae_conv3d.h"

#include <algorithm>
#include <string>

#include "cuda/block_sum.cuh"
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

// The (row, tap) of item i and where its C channels come from and go.
struct GatherItem {
  const float* src;
  float* dst;
};

__device__ __forceinline__ GatherItem gather_item(const GatherParams& p, int64_t i) {
  const int64_t tap = i % p.real_taps, r = i / p.real_taps;
  const int64_t ta = p.a0 + tap / p.spatial_taps, b = (tap % p.spatial_taps) / p.g.kw, d = tap % p.g.kw;
  const int64_t out = (p.r0 + r) % p.plane, clip = (p.r0 + r) / p.plane, ho = out / p.w_out, wo = out % p.w_out;
  const int64_t t = clip * p.T + p.frame * p.g.st + ta - p.g.temporal_padding;
  const int64_t hi = reflect_index(ho * p.g.sh + b - p.g.pad_top, p.H);
  const int64_t wi = reflect_index(wo * p.g.sw + d - p.g.pad_left, p.W);
  return {p.x + ((t * p.H + hi) * p.W + wi) * p.C, p.cols + i * p.C};
}

// C a multiple of 4: one warp per (row, tap), its lanes copying the C channels as float4s, so the
// index arithmetic is done once per item rather than once per value.
__global__ void __launch_bounds__(kThreads) gather_vec_kernel(GatherParams p) {
  const int64_t items = p.rows * p.real_taps, vecs = p.C / 4;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t i = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32; i < items; i += warps) {
    const GatherItem item = gather_item(p, i);
    const float4* src = reinterpret_cast<const float4*>(item.src);
    float4* dst = reinterpret_cast<float4*>(item.dst);
    for (int64_t v = lane; v < vecs; v += 32) dst[v] = src[v];
  }
}

// Any C (conv_in's 3 channels): one thread per value.
__global__ void __launch_bounds__(kThreads) gather_scalar_kernel(GatherParams p) {
  const int64_t total = p.rows * p.real_taps * p.C;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total; i += int64_t{gridDim.x} * kThreads) {
    const GatherItem item = gather_item(p, i / p.C);
    item.dst[i % p.C] = item.src[i % p.C];
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

// blockIdx.x: the (frame, group) s = frame·G + g; blockIdx.y: the slice of its P·Cg values, read
// kVec at a time (4 when Cg is a multiple of 4: a group's channels of one pixel are contiguous).
template <bool kSquares, int kVec>
__global__ void __launch_bounds__(kThreads) group_partial_kernel(GroupNormParams p) {
  __shared__ double scratch[kWarps];
  const int64_t s = blockIdx.x, frame = s / p.G, g = s % p.G, per_pixel = p.Cg / kVec;
  const int64_t n = p.pixels * per_pixel, begin = n * blockIdx.y / kChunks, end = n * (blockIdx.y + 1) / kChunks;
  const float* base = p.x + frame * p.pixels * p.C + g * p.Cg;
  const double m = kSquares ? p.mean[s] : 0.0;
  double sum = 0.0;
  for (int64_t e = begin + threadIdx.x; e < end; e += kThreads) {
    const float* at = base + (e / per_pixel) * p.C + (e % per_pixel) * kVec;
    float v[kVec];
    if constexpr (kVec == 4) {
      const float4 q = *reinterpret_cast<const float4*>(at);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      v[0] = *at;
    }
    for (int k = 0; k < kVec; ++k) {
      const double d = kSquares ? static_cast<double>(v[k]) - m : static_cast<double>(v[k]);
      sum += kSquares ? d * d : d;
    }
  }
  const double total = block_sum_f64<kWarps>(sum, scratch);
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

__device__ __forceinline__ float group_normed(const GroupNormParams& p, float x, float mean, float rstd, int64_t c) {
  float v = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x, mean), rstd), p.weight[c]), p.bias[c]);
  if (p.silu) v = __fdiv_rn(v, __fadd_rn(1.0f, expf(-v)));
  return v;
}

// kVec consecutive channels per thread (4 when Cg is a multiple of 4: all in one group).
template <int kVec>
__global__ void __launch_bounds__(kThreads) group_apply_kernel(GroupNormParams p) {
  const int64_t total = p.frames * p.pixels * p.C / kVec;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total; i += int64_t{gridDim.x} * kThreads) {
    const int64_t first = i * kVec, c = first % p.C, s = (first / (p.pixels * p.C)) * p.G + c / p.Cg;
    const float mean = static_cast<float>(p.mean[s]), rstd = static_cast<float>(p.rstd[s]);
    if constexpr (kVec == 4) {
      float4 q = reinterpret_cast<const float4*>(p.x)[i];
      q.x = group_normed(p, q.x, mean, rstd, c);
      q.y = group_normed(p, q.y, mean, rstd, c + 1);
      q.z = group_normed(p, q.z, mean, rstd, c + 2);
      q.w = group_normed(p, q.w, mean, rstd, c + 3);
      reinterpret_cast<float4*>(p.y)[i] = q;
    } else {
      p.y[i] = group_normed(p, p.x[i], mean, rstd, c);
    }
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
    gather_vec_kernel<<<grid_for(p.rows * real_taps * 32), kThreads, 0, stream>>>(p);
  } else {
    gather_scalar_kernel<<<grid_for(p.rows * real_taps * C), kThreads, 0, stream>>>(p);
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
  if (p.Cg % 4 == 0) {
    group_partial_kernel<false, 4><<<partial_grid, kThreads, 0, stream>>>(p);
    group_finish_kernel<false><<<grid_for(sets), kThreads, 0, stream>>>(p);
    group_partial_kernel<true, 4><<<partial_grid, kThreads, 0, stream>>>(p);
    group_finish_kernel<true><<<grid_for(sets), kThreads, 0, stream>>>(p);
    group_apply_kernel<4><<<grid_for(T * P * C / 4), kThreads, 0, stream>>>(p);
  } else {
    group_partial_kernel<false, 1><<<partial_grid, kThreads, 0, stream>>>(p);
    group_finish_kernel<false><<<grid_for(sets), kThreads, 0, stream>>>(p);
    group_partial_kernel<true, 1><<<partial_grid, kThreads, 0, stream>>>(p);
    group_finish_kernel<true><<<grid_for(sets), kThreads, 0, stream>>>(p);
    group_apply_kernel<1><<<grid_for(T * P * C), kThreads, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
