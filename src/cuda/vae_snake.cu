// The alias-free SnakeBeta activation, fused (contract: vae_snake.h):
//
//   u[n] = 2 · Σ_i up[phase + 2i] · x[clamp(q - i - pad, 0, T - 1)]      (n + pad_left = 2q + phase)
//   s[n] = u[n] + magnitude · sin(frequency · u[n])²
//   y[m] = Σ_k down[k] · s[clamp(2m + k - pad_down, 0, 2T - 1)]
//
// One variant. A block takes kTileOut output samples of up to 32 channels of one batch item: it
// computes the (kTileOut - 1)·2 + down_taps upsampled, activated samples those outputs read into
// shared memory (the upsampler's replicate padding and crop, and the downsampler's replicate
// padding, become index clamps), then each thread filters its outputs from there. Every sum starts
// at 0 and adds the taps in the CPU's order with explicitly rounded products and sums, and the
// snake is the CPU's sequence of roundings, so the only difference from the CPU is sinf's last bit
// (CUDA's sinf is within 2 ulp, glibc's within 1).
//
// The plain snake (the DAC encoder's): a grid-stride loop over the elements, the same roundings.
#include "cuda/vae_snake.h"

#include <algorithm>
#include <string>

#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kRatio = kSnakeRatio;
constexpr int kThreads = 256;
constexpr int kTileOut = 64;
constexpr int kMaxChannelTile = 32;

struct SnakeParams {
  const float* x;  // [B, T, C]
  float* y;        // [B, T_out, C]
  const float* frequency;
  const float* magnitude;
  SnakeFilters f;
  int64_t T, T_out, C;
  int channel_tile;
};

__device__ __forceinline__ int64_t clamp_index(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

// The upsampled, activated sample n (0 <= n < 2T) of channel c.
__device__ __forceinline__ float activated_sample(const SnakeParams& p, const float* xb, int64_t n, int64_t c) {
  const int64_t pad = p.f.up_taps / kRatio - 1;
  const int64_t pad_left = pad * kRatio + (p.f.up_taps - kRatio) / 2;
  const int64_t padded = p.T + 2 * pad;
  const int64_t m = n + pad_left;
  float acc = 0.0f;
  for (int64_t k = m % kRatio, j = m / kRatio; k < p.f.up_taps && j >= 0; k += kRatio, --j) {
    if (j >= padded) continue;
    const int64_t src = clamp_index(j - pad, p.T);
    acc = __fadd_rn(acc, __fmul_rn(p.f.up[k], xb[src * p.C + c]));
  }
  const float u = __fmul_rn(static_cast<float>(kRatio), acc);
  const float s = sinf(__fmul_rn(p.frequency[c], u));
  return __fadd_rn(u, __fmul_rn(p.magnitude[c], __fmul_rn(s, s)));
}

__global__ void __launch_bounds__(kThreads) alias_free_snake_kernel(SnakeParams p) {
  extern __shared__ float activated[];  // [needed][channel_tile]
  const int tile = p.channel_tile;
  const int64_t b = blockIdx.z, m0 = static_cast<int64_t>(blockIdx.x) * kTileOut;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * tile;
  const int64_t pad_down = p.f.down_taps / 2 - (p.f.down_taps % 2 == 0 ? 1 : 0);
  const int64_t upsampled = kRatio * p.T;
  const int needed = (kTileOut - 1) * kRatio + p.f.down_taps;
  const float* xb = p.x + b * p.T * p.C;
  const int lane = threadIdx.x, row = threadIdx.y, rows = blockDim.y;

  for (int e = row * tile + lane; e < needed * tile; e += rows * tile) {
    const int local = e / tile;
    const int64_t c = c0 + e % tile;
    if (c >= p.C) continue;
    const int64_t n = clamp_index(m0 * kRatio - pad_down + local, upsampled);
    activated[e] = activated_sample(p, xb, n, c);
  }
  __syncthreads();
  const int64_t c = c0 + lane;
  if (c >= p.C) return;
  for (int mm = row; mm < kTileOut; mm += rows) {
    const int64_t m = m0 + mm;
    if (m >= p.T_out) break;
    float acc = 0.0f;
    for (int k = 0; k < p.f.down_taps; ++k) {
      acc = __fadd_rn(acc, __fmul_rn(p.f.down[k], activated[(mm * kRatio + k) * tile + lane]));
    }
    p.y[(b * p.T_out + m) * p.C + c] = acc;
  }
}

__global__ void snake_kernel(const float* x, const float* frequency, const float* magnitude, float* y, int64_t n,
                             int64_t C) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % C;
    const float v = x[i];
    const float s = sinf(__fmul_rn(frequency[c], v));
    y[i] = __fadd_rn(v, __fmul_rn(magnitude[c], __fmul_rn(s, s)));
  }
}

}  // namespace

Result<SnakeFilters> make_snake_filters(const std::vector<float>& up, const std::vector<float>& down) {
  for (const auto* taps : {&up, &down}) {
    if (taps->size() < static_cast<size_t>(kRatio) || taps->size() > static_cast<size_t>(kSnakeMaxTaps)) {
      return invalid_argument("alias-free snake: resampling filters need " + std::to_string(kRatio) + " to " +
                              std::to_string(kSnakeMaxTaps) + " taps, got " + std::to_string(taps->size()));
    }
  }
  SnakeFilters f;
  std::copy(up.begin(), up.end(), f.up);
  std::copy(down.begin(), down.end(), f.down);
  f.up_taps = static_cast<int>(up.size());
  f.down_taps = static_cast<int>(down.size());
  return f;
}

int64_t alias_free_snake_length(const SnakeFilters& f, int64_t length) {
  const int64_t pad_left = f.down_taps / 2 - (f.down_taps % 2 == 0 ? 1 : 0), pad_right = f.down_taps / 2;
  const int64_t span = kRatio * length + pad_left + pad_right - f.down_taps;
  return span < 0 ? 0 : span / kRatio + 1;
}

Status alias_free_snake(const TensorView& x, const float* frequency, const float* magnitude,
                        const SnakeFilters& filters, const TensorView& y, cudaStream_t stream) {
  for (const TensorView* t : {&x, &y}) {
    if (t->device != Device::kCuda || t->dtype != DType::kF32 || t->rank() != 3 || !t->is_contiguous()) {
      return invalid_argument("alias_free_snake: x and y must be contiguous F32 [B, T, C] device tensors");
    }
  }
  const int64_t B = x.shape[0], T = x.shape[1], C = x.shape[2];
  if (filters.up_taps < kRatio || filters.up_taps > kSnakeMaxTaps || filters.down_taps < kRatio ||
      filters.down_taps > kSnakeMaxTaps) {
    return invalid_argument("alias_free_snake: filters must have 2 to 16 taps (make_snake_filters)");
  }
  if (T < 1 || y.shape[0] != B || y.shape[2] != C || y.shape[1] != alias_free_snake_length(filters, T)) {
    return invalid_argument("alias_free_snake: y " + y.shape.to_string() + " is not the output of x " +
                            x.shape.to_string());
  }
  if (frequency == nullptr || magnitude == nullptr) return invalid_argument("alias_free_snake: no snake parameters");
  if (B == 0 || C == 0 || y.shape[1] == 0) return ok_status();
  if (B > 65535) return invalid_argument("alias_free_snake: batch above 65535");
  int tile = 1;
  while (tile < C && tile < kMaxChannelTile) tile *= 2;
  SnakeParams p{};
  p.x = static_cast<const float*>(x.data);
  p.y = static_cast<float*>(y.data);
  p.frequency = frequency;
  p.magnitude = magnitude;
  p.f = filters;
  p.T = T;
  p.T_out = y.shape[1];
  p.C = C;
  p.channel_tile = tile;
  const dim3 block(static_cast<unsigned>(tile), static_cast<unsigned>(kThreads / tile));
  const dim3 grid(static_cast<unsigned>((p.T_out + kTileOut - 1) / kTileOut),
                  static_cast<unsigned>((C + tile - 1) / tile), static_cast<unsigned>(B));
  const size_t smem = static_cast<size_t>((kTileOut - 1) * kRatio + filters.down_taps) * tile * sizeof(float);
  alias_free_snake_kernel<<<grid, block, smem, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status snake(const TensorView& x, const float* frequency, const float* magnitude, const TensorView& y,
             cudaStream_t stream) {
  for (const TensorView* t : {&x, &y}) {
    if (t->device != Device::kCuda || t->dtype != DType::kF32 || t->rank() < 1 || !t->is_contiguous()) {
      return invalid_argument("snake: x and y must be contiguous F32 device tensors");
    }
  }
  if (y.shape != x.shape) return invalid_argument("snake: y " + y.shape.to_string() + " is not x's " + x.shape.to_string());
  if (frequency == nullptr || magnitude == nullptr) return invalid_argument("snake: no snake parameters");
  const int64_t n = x.numel(), C = x.shape[x.rank() - 1];
  if (n == 0) return ok_status();
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16);
  snake_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<const float*>(x.data), frequency,
                                                                        magnitude, static_cast<float*>(y.data), n, C);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
