// The quantize pass of the int8fp8 attention mode (contract in attention_int8fp8.h; the math is
// cpu/attention_int8fp8.h's, operation for operation, so the codes and scales are bit-identical
// to the CPU reference's). Two launches, so that a short sequence does not pay the ramps and gaps
// of five (at 4,608 × 24 the pass went 77 → 66 µs):
//
//   stats + q  1-D grid: chunks · H stats blocks, then Nq_pad / 64 · H Q blocks.
//              stats  a chunk of 128 rows (Nk / 64 when longer) of one head: K's column sums in
//                     fp64 (fixed order) → k_partial, |V|'s column maxima → v_partial. The head's
//                     last chunk to finish (a counter per head) reduces them in chunk order:
//                     mean = fp32(Σ k_partial / Nk), amax = max, v_scale = amax / 448.
//              rows   one Q block (64 rows): amax → scale = amax / 127, codes = rint(x · (127 /
//                     amax)) → int8 rows [H, Npad, 128].
//   k + vt     grid (2 · Nk_pad / 128, H), even blocks K, odd blocks V:
//              rows   one K block (128 rows minus the mean), as Q's.
//              vt     e4m3(v · (448 / amax)) for 128 keys, transposed through shared memory into
//                     Vᵀ rows [H, 128, Nk_pad] at the permuted key slots.
//   q producer grid (Nq_pad / 64, H), the block's path instead of the stats launch's Q blocks:
//              Q's RMSNorm and RoPE (head_norm_rope's operations, rounded to bf16 where it rounds)
//              from the raw QKV rows, then the rows' quantization of the block, so Q's bf16 rows
//              are neither written nor read again.
// Every pass reads the strided bf16 views with 16-byte loads (8 channels) and writes padding rows
// as zeros, so the attention kernel never reads past what this pass wrote.
#include "cuda/attention_int8fp8.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/dtype.h"
#include "cuda/dependent_launch.cuh"
#include "cuda/row_math.cuh"

namespace vortex::cuda {
namespace {

constexpr int kD = kInt8Fp8HeadDim;
constexpr int kThreads = 256;
// A thread owns 8 consecutive channels (one 16-byte load); 16 threads cover a row, so a block
// of 256 threads works on 16 rows at a time.
constexpr int kLanesPerRow = kD / 8;
constexpr int kRowsInFlight = kThreads / kLanesPerRow;
constexpr int kMaxChunks = 64;
constexpr float kP8Max = 448.0f;

struct RowsView {
  const __nv_bfloat16* data;
  int64_t row, head;  // strides, elements
};

RowsView rows_view(const TensorView& t) {
  return {static_cast<const __nv_bfloat16*>(t.data), t.strides[0], t.strides[1]};
}

// Channels [8·lane, 8·lane + 8) of row r of head h: the raw bf16 pairs, and widened to fp32.
__device__ __forceinline__ uint4 load_raw8(const RowsView& t, int64_t r, int h, int lane) {
  return *reinterpret_cast<const uint4*>(t.data + r * t.row + h * t.head + 8 * lane);
}
__device__ __forceinline__ void widen8(const uint4& raw, float (&x)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = bf16_bits_to_f32(static_cast<uint16_t>(w[i] & 0xFFFFu));
    x[2 * i + 1] = bf16_bits_to_f32(static_cast<uint16_t>(w[i] >> 16));
  }
}
__device__ __forceinline__ void load8(const RowsView& t, int64_t r, int h, int lane, float (&x)[8]) {
  widen8(load_raw8(t, r, h, lane), x);
}

// ---- stats: K column sums (fp64 per chunk), V column maxima, reduced by the head's last chunk ----------

// One chunk of head h's rows: its column sums of K → k_partial[chunk, h], its column maxima of |V|
// → v_partial[chunk, h]. The block that finishes a head's last chunk reduces them all in chunk
// order (the counter `done[h]` is zero before the launch).
__device__ __forceinline__ void stats_chunk(const RowsView& k, const RowsView& v, int nk, int chunks, int chunk, int h,
                                            int heads, double* k_partial, float* v_partial, unsigned* done, float* k_mean,
                                            float* v_amax, float* v_scale) {
  __shared__ double sums[kRowsInFlight][kD];
  __shared__ float maxima[kRowsInFlight][kD];
  __shared__ bool last_chunk;
  const int lane = static_cast<int>(threadIdx.x) % kLanesPerRow, slot = static_cast<int>(threadIdx.x) / kLanesPerRow;
  const int per_chunk = (nk + chunks - 1) / chunks;
  const int r0 = chunk * per_chunk, r1 = min(nk, r0 + per_chunk);
  double s[8] = {};
  float m[8] = {};
  const auto add_row = [&](const uint4& k_raw, const uint4& v_raw) {
    float x[8];
    widen8(k_raw, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] += static_cast<double>(x[i]);
    widen8(v_raw, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) m[i] = fmaxf(m[i], fabsf(x[i]));
  };
  // Two rows' loads in flight per step; the sums still add the rows in order.
  for (int r = r0 + slot; r < r1; r += 2 * kRowsInFlight) {
    const bool second = r + kRowsInFlight < r1;
    const uint4 k0 = load_raw8(k, r, h, lane), v0 = load_raw8(v, r, h, lane);
    uint4 k1 = make_uint4(0u, 0u, 0u, 0u), v1 = k1;
    if (second) k1 = load_raw8(k, r + kRowsInFlight, h, lane), v1 = load_raw8(v, r + kRowsInFlight, h, lane);
    add_row(k0, v0);
    if (second) add_row(k1, v1);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    sums[slot][8 * lane + i] = s[i];
    maxima[slot][8 * lane + i] = m[i];
  }
  __syncthreads();
  const int c = static_cast<int>(threadIdx.x);
  const int64_t at = (static_cast<int64_t>(chunk) * heads + h) * kD + c;
  if (c < kD) {
    double total = 0.0;
    float amax = 0.0f;
    for (int i = 0; i < kRowsInFlight; ++i) {
      total += sums[i][c];
      amax = fmaxf(amax, maxima[i][c]);
    }
    k_partial[at] = total;
    v_partial[at] = amax;
  }
  // The partials are visible device-wide before the count says so; the last block reads them
  // from L2 (ld.cg), past its own L1.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_chunk = atomicAdd(done + h, 1u) == static_cast<unsigned>(chunks - 1);
  __syncthreads();
  if (!last_chunk || c >= kD) return;
  __threadfence();
  double total = 0.0;
  float amax = 0.0f;
  for (int i = 0; i < chunks; ++i) {
    const int64_t from = (static_cast<int64_t>(i) * heads + h) * kD + c;
    total += __ldcg(k_partial + from);
    amax = fmaxf(amax, __ldcg(v_partial + from));
  }
  k_mean[h * kD + c] = static_cast<float>(total / static_cast<double>(nk));
  v_amax[h * kD + c] = amax;
  v_scale[h * kD + c] = amax / kP8Max;
}

// ---- rows: int8 Q / K blocks -------------------------------------------------------------------------------

// Quantizes one block of kRows rows of head h held by the CTA: values(p, x) fills x with the
// thread's 8 channels (from 8·lane) of row block·kRows + slot + p·kRowsInFlight, 0 past the end;
// it is called twice per row (the amax, then the codes), so a caller may keep its rows in a
// narrower form than 8 floats. amax over the block → scales[h, block] = amax / 127,
// codes = clamp(rint(x · (127 / amax)), ±127) → int8 rows.
template <int kRows, class Values>
__device__ __forceinline__ void quantize_block(const Values& values, int block, int h, int64_t n_pad, int8_t* codes,
                                               float* scales) {
  constexpr int kPerThread = kRows / kRowsInFlight;
  __shared__ float warp_max[kThreads / 32];
  const int lane = static_cast<int>(threadIdx.x) % kLanesPerRow, slot = static_cast<int>(threadIdx.x) / kLanesPerRow;
  float amax = 0.0f;
#pragma unroll
  for (int p = 0; p < kPerThread; ++p) {
    float x[8];
    values(p, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
  if (threadIdx.x == 0) scales[static_cast<int64_t>(h) * (n_pad / kRows) + block] = amax / 127.0f;
#pragma unroll
  for (int p = 0; p < kPerThread; ++p) {
    const int r = block * kRows + slot + p * kRowsInFlight;
    float x[8];
    values(p, x);
    uint32_t packed[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int code = min(127, max(-127, __float2int_rn(x[i] * inverse)));
      packed[i / 4] |= (static_cast<uint32_t>(code) & 0xFFu) << (8 * (i % 4));
    }
    *reinterpret_cast<uint2*>(codes + (static_cast<int64_t>(h) * n_pad + r) * kD + 8 * lane) =
        make_uint2(packed[0], packed[1]);
  }
}

// One block of kRows rows of head h. K's blocks (kSmooth: minus the mean) keep their 8 rows per
// thread as raw bf16 pairs (32 registers) and widen them for each of quantize_block's two uses:
// 8 rows of 8 widened floats took 89 registers and left the pass latency-bound at 41% of the DRAM
// bandwidth.
template <int kRows, bool kSmooth>
__device__ __forceinline__ void rows_block(const RowsView& src, int n, int64_t n_pad, const float* mean, int8_t* codes,
                                           float* scales, int block, int h) {
  constexpr int kPerThread = kRows / kRowsInFlight;
  const int lane = static_cast<int>(threadIdx.x) % kLanesPerRow, slot = static_cast<int>(threadIdx.x) / kLanesPerRow;
  float mu[8] = {};
  if (kSmooth) {
#pragma unroll
    for (int i = 0; i < 8; ++i) mu[i] = mean[h * kD + 8 * lane + i];
  }
  uint4 raw[kPerThread];
  bool valid[kPerThread];
#pragma unroll
  for (int p = 0; p < kPerThread; ++p) {
    const int r = block * kRows + slot + p * kRowsInFlight;
    valid[p] = r < n;
    raw[p] = valid[p] ? load_raw8(src, r, h, lane) : make_uint4(0u, 0u, 0u, 0u);
  }
  const auto values = [&](int p, float (&x)[8]) {
    widen8(raw[p], x);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (kSmooth && valid[p]) x[i] = x[i] - mu[i];
    }
  };
  quantize_block<kRows>(values, block, h, n_pad, codes, scales);
}

// ---- q producer: RMSNorm + RoPE + quantize ---------------------------------------------------------------------

struct QProducerParams {
  RowsView q;             // the raw rows (the QKV projection's output)
  const char* weight;     // [128] F32 or BF16, or null (weight 1)
  bool weight_bf16;
  float eps;
  const float* cos;       // [Nq, rot] contiguous, or null (no RoPE)
  const float* sin;
  int rot, rot_lanes;     // rot channels; rot / 2 / 8 lanes hold each half
  int nq;
  int64_t nq_pad;
  int8_t* codes;
  float* scales;
};

// One Q block (64 rows of head h) per CTA. Each row is normalised as head_norm_rope's kernel does
// it (16 lanes of 8 channels, the same fma order and shuffle tree, the same roundings), rotated
// with the partner half fetched by shuffle, rounded to bf16 as the store would, and quantized with
// the rows pass's operations: the codes and scale are those of head_norm_rope + quantize_int8fp8.
__global__ void __launch_bounds__(kThreads) int8fp8_q_producer_kernel(QProducerParams p) {
  allow_dependent_launch();  // the attention pass may be placed; it waits for this grid's results
  constexpr int kPerThread = kInt8Fp8QBlock / kRowsInFlight;
  const int block = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x) % kLanesPerRow, slot = static_cast<int>(threadIdx.x) / kLanesPerRow;
  const int r = p.rot_lanes;
  const int partner = lane < r ? lane + r : (lane < 2 * r ? lane - r : lane);
  const int partner_lane = static_cast<int>(threadIdx.x % 32) - lane + partner;
  float w[8];
  if (p.weight != nullptr) {
    detail::load_vec<8>(p.weight, p.weight_bf16, 8 * lane, w);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = 1.0f;
  }
  float x[kPerThread][8];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int row = block * kInt8Fp8QBlock + slot + k * kRowsInFlight;
    const bool active = row < p.nq;
    float v[8] = {};
    float ss = 0.0f;
    if (active) {
      load8(p.q, row, h, lane, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss = fmaf(v[i], v[i], ss);
    }
    for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
    const float inv = detail::inv_rms(ss, kD, p.eps);
    // Two channels per instruction, as head_norm_rope's BF16 rows do it: R(x·inv·w), then the
    // rotation from this lane's side (row_math.cuh: rope_bf16x2).
    uint32_t normed[4], other[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      normed[i] = active ? detail::bf16x2_bits(__fmul_rn(__fmul_rn(v[2 * i], inv), w[2 * i]),
                                               __fmul_rn(__fmul_rn(v[2 * i + 1], inv), w[2 * i + 1]))
                         : 0u;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) other[i] = __shfl_sync(0xffffffffu, normed[i], partner_lane);
    if (active && p.cos != nullptr && lane < 2 * r) {
      float c[8], sn[8];
      detail::load_vec<8>(reinterpret_cast<const char*>(p.cos + static_cast<int64_t>(row) * p.rot), false, 8 * lane, c);
      detail::load_vec<8>(reinterpret_cast<const char*>(p.sin + static_cast<int64_t>(row) * p.rot), false, 8 * lane, sn);
      uint32_t cos2[4], sin2[4];
      detail::rope_factors_bf16x2<4>(c, sn, lane < r, cos2, sin2);
#pragma unroll
      for (int i = 0; i < 4; ++i) normed[i] = detail::rope_bf16x2(normed[i], other[i], cos2[i], sin2[i]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[k][2 * i] = __uint_as_float(normed[i] << 16);
      x[k][2 * i + 1] = __uint_as_float(normed[i] & 0xFFFF0000u);
    }
  }
  quantize_block<kInt8Fp8QBlock>(
      [&](int k, float (&out)[8]) {
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = x[k][i];
      },
      block, h, p.nq_pad, p.codes, p.scales);
}

// ---- vt: e4m3 Vᵀ, keys at their permuted slots ---------------------------------------------------------------

constexpr int kVtKeys = kInt8Fp8KBlock;
// A thread converts the four keys that land in four consecutive slots of a 16-key group (keys
// 2t, 2t + 1, 8 + 2t, 9 + 2t → slots 4t .. 4t + 3, int8fp8_vt_slot), so each of its 8 channels
// becomes one 32-bit word of the staged Vᵀ tile: 32 quads per 128-key block, two per thread.
constexpr int kVtQuads = kVtKeys / 4;
constexpr int kVtQuadsPerThread = kVtQuads / kRowsInFlight;

// e4m3 codes of two values (`lo` in the low byte) with f32_to_e4m3_bits's result for a NaN
// (sign | 0x7F), which the hardware conversion (e4m3x2_bits, equal on every other float) is not
// asked to reproduce.
__device__ __forceinline__ uint32_t e4m3x2_codes(float lo, float hi) {
  uint32_t pair = detail::e4m3x2_bits(lo, hi);
  if (lo != lo) pair = (pair & 0xFF00u) | ((__float_as_uint(lo) >> 24) & 0x80u) | 0x7Fu;
  if (hi != hi) pair = (pair & 0x00FFu) | ((((__float_as_uint(hi) >> 24) & 0x80u) | 0x7Fu) << 8);
  return pair;
}

// The staged tile is [128 channels][128 slots] bytes; the 16-byte chunk j of channel row c sits at
// chunk j ^ (c / 8 mod 8), so that the word stores of a warp (16 lanes 8 channels apart, the same
// chunk) spread over the banks (2-way) instead of all hitting one, and the row read-out stays one
// 16-byte load per chunk.
__device__ __forceinline__ int vt_tile_chunk(int c, int chunk) { return chunk ^ ((c >> 3) & 7); }

// One 128-key block of head h's Vᵀ.
__device__ __forceinline__ void vt_block(const RowsView& v, int nk, int64_t nk_pad, const float* v_amax, uint8_t* vt,
                                         int block, int h) {
  __shared__ __align__(16) uint32_t tile[kD * kVtKeys / 4];  // [channel][slot / 4], chunks swizzled
  const int lane = static_cast<int>(threadIdx.x) % kLanesPerRow, slot = static_cast<int>(threadIdx.x) / kLanesPerRow;
  float inverse[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float amax = v_amax[h * kD + 8 * lane + i];
    inverse[i] = amax > 0.0f ? kP8Max / amax : 0.0f;
  }
  // All eight rows' loads first (two quads of four keys), kept as raw bf16 pairs (32 registers
  // where widened floats took 64), then the conversions.
  uint4 raw[kVtQuadsPerThread][4];
#pragma unroll
  for (int p = 0; p < kVtQuadsPerThread; ++p) {
    const int quad = slot + p * kRowsInFlight, group = quad / 4, t = quad % 4;
    const int keys[4] = {16 * group + 2 * t, 16 * group + 2 * t + 1, 16 * group + 8 + 2 * t, 16 * group + 9 + 2 * t};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = block * kVtKeys + keys[j];
      raw[p][j] = r < nk ? load_raw8(v, r, h, lane) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
#pragma unroll
  for (int p = 0; p < kVtQuadsPerThread; ++p) {
    const int quad = slot + p * kRowsInFlight;
    float x[4][8];
#pragma unroll
    for (int j = 0; j < 4; ++j) widen8(raw[p][j], x[j]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = 8 * lane + i;
      const uint32_t word = e4m3x2_codes(x[0][i] * inverse[i], x[1][i] * inverse[i]) |
                            (e4m3x2_codes(x[2][i] * inverse[i], x[3][i] * inverse[i]) << 16);
      tile[c * (kVtKeys / 4) + 4 * vt_tile_chunk(c, quad / 4) + quad % 4] = word;
    }
  }
  __syncthreads();
  constexpr int kChunksPerRow = kVtKeys / 16;
#pragma unroll
  for (int i = 0; i < kD * kChunksPerRow / kThreads; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads;
    const int c = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    const uint4 value = *reinterpret_cast<const uint4*>(tile + c * (kVtKeys / 4) + 4 * vt_tile_chunk(c, chunk));
    *reinterpret_cast<uint4*>(vt + (static_cast<int64_t>(h) * kD + c) * nk_pad + static_cast<int64_t>(block) * kVtKeys +
                              16 * chunk) = value;
  }
}

// ---- the two launches --------------------------------------------------------------------------------

struct StatsParams {
  RowsView k, v;
  int nk, chunks;
  double* k_partial;
  float* v_partial;
  unsigned* done;
  float *k_mean, *v_amax, *v_scale;
  // Q's rows, quantized by the blocks past the chunks (none when the grid has no such blocks).
  RowsView q;
  int nq;
  int64_t nq_pad;
  int8_t* q_codes;
  float* q_scales;
  int heads;
};

// Blocks [0, chunks · H) are the stats chunks, chunk-major so that every head's chunks start in the
// first wave (a stats block is a long chain of loads; started last, it would be the launch's tail);
// the Q blocks follow, head-major.
__global__ void __launch_bounds__(kThreads, 4) int8fp8_stats_q_kernel(StatsParams p) {
  allow_dependent_launch();  // the K / Vᵀ launch may be placed; it waits for this grid's results
  const int x = static_cast<int>(blockIdx.x), stats_blocks = p.chunks * p.heads;
  if (x < stats_blocks) {
    stats_chunk(p.k, p.v, p.nk, p.chunks, x / p.heads, x % p.heads, p.heads, p.k_partial, p.v_partial, p.done,
                p.k_mean, p.v_amax, p.v_scale);
  } else {
    const int q_blocks = static_cast<int>(p.nq_pad / kInt8Fp8QBlock), y = x - stats_blocks;
    rows_block<kInt8Fp8QBlock, false>(p.q, p.nq, p.nq_pad, nullptr, p.q_codes, p.q_scales, y % q_blocks, y / q_blocks);
  }
}

struct KvParams {
  RowsView k, v;
  int nk;
  int64_t nk_pad;
  const float *k_mean, *v_amax;
  int8_t* k_codes;
  float* k_scales;
  uint8_t* vt;
};

// Block 2b quantizes K's rows of key block b, block 2b + 1 its Vᵀ. Four CTAs per SM cap K's rows at
// 64 registers, which spills 48 bytes per thread; three (80 registers, no spill) left fewer loads in
// flight and measured slower: 66.2 → 65.1 µs for the pass at 4,608 × 24, 0.915 → 0.895 ms at the
// canonical shape.
__global__ void __launch_bounds__(kThreads, 4) int8fp8_kv_kernel(KvParams p) {
  allow_dependent_launch();  // the attention pass may be placed; it waits for this grid's results
  wait_for_prerequisite_grid();  // K's mean and V's maxima come from the stats launch
  const int block = static_cast<int>(blockIdx.x) / 2, h = static_cast<int>(blockIdx.y);
  if (blockIdx.x % 2 == 0) {
    rows_block<kInt8Fp8KBlock, true>(p.k, p.nk, p.nk_pad, p.k_mean, p.k_codes, p.k_scales, block, h);
  } else {
    vt_block(p.v, p.nk, p.nk_pad, p.v_amax, p.vt, block, h);
  }
}

// ---- host -------------------------------------------------------------------------------------------------

constexpr size_t kPartAlignment = 256;

size_t align_up(size_t x) { return (x + kPartAlignment - 1) / kPartAlignment * kPartAlignment; }
int64_t pad_rows(int64_t n) { return (n + kInt8Fp8RowPad - 1) / kInt8Fp8RowPad * kInt8Fp8RowPad; }
int stats_chunks(int64_t nk) { return static_cast<int>(std::clamp<int64_t>((nk + 127) / 128, 1, kMaxChunks)); }

// Byte offsets of the parts, in the order of Int8Fp8Workspace; the last entry is the total.
struct Layout {
  size_t q, k, vt, q_scale, k_scale, v_scale, k_mean, k_partial, v_partial, v_amax, stats_done, total;
};

Layout layout(int64_t nq, int64_t nk, int64_t heads) {
  const size_t nq_pad = static_cast<size_t>(pad_rows(nq)), nk_pad = static_cast<size_t>(pad_rows(nk));
  const size_t h = static_cast<size_t>(heads);
  Layout l{};
  size_t at = 0;
  const auto take = [&](size_t bytes) {
    const size_t here = at;
    at += align_up(bytes);
    return here;
  };
  l.q = take(h * nq_pad * kD);
  l.k = take(h * nk_pad * kD);
  l.vt = take(h * nk_pad * kD);
  l.q_scale = take(h * (nq_pad / kInt8Fp8QBlock) * sizeof(float));
  l.k_scale = take(h * (nk_pad / kInt8Fp8KBlock) * sizeof(float));
  l.v_scale = take(h * kD * sizeof(float));
  l.k_mean = take(h * kD * sizeof(float));
  l.k_partial = take(static_cast<size_t>(stats_chunks(nk)) * h * kD * sizeof(double));
  l.v_partial = take(static_cast<size_t>(stats_chunks(nk)) * h * kD * sizeof(float));
  l.v_amax = take(h * kD * sizeof(float));
  l.stats_done = take(h * sizeof(unsigned));
  l.total = at;
  return l;
}

// BF16 [rows, heads, 128] on the device, unit stride on D, 16-byte aligned rows.
Status check_input(const char* name, const TensorView& t, int64_t rows, int64_t heads) {
  const std::string what = "attention_int8fp8: " + describe_view(name, t);
  if (t.device != Device::kCuda || t.dtype != DType::kBF16) return invalid_argument(what + " must be BF16 on the device");
  if (t.rank() != 3 || t.shape[0] != rows || t.shape[1] != heads || t.shape[2] != kD || t.strides[2] != 1) {
    return invalid_argument(what + " must be [" + std::to_string(rows) + ", " + std::to_string(heads) +
                            ", 128] with unit stride on D");
  }
  const bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (t.shape[0] == 1 || t.strides[0] % 8 == 0) &&
                       (t.shape[1] == 1 || t.strides[1] % 8 == 0);
  if (!aligned) return invalid_argument(what + ": the pointer and N / H strides must be multiples of 16 bytes");
  return ok_status();
}

// The stats launch (with Q's rows when q is given), then K's rows and Vᵀ. k, v, q checked.
Status launch_quantize(const TensorView& k, const TensorView& v, const TensorView* q, const Int8Fp8Workspace& ws,
                       cudaStream_t stream) {
  const unsigned heads = static_cast<unsigned>(ws.heads);
  VORTEX_CUDA_CHECK(cudaMemsetAsync(ws.stats_done, 0, static_cast<size_t>(ws.heads) * sizeof(unsigned), stream));
  StatsParams s{};
  s.k = rows_view(k), s.v = rows_view(v);
  s.nk = static_cast<int>(ws.nk), s.chunks = ws.chunks;
  s.k_partial = ws.k_partial, s.v_partial = ws.v_partial, s.done = ws.stats_done;
  s.k_mean = ws.k_mean, s.v_amax = ws.v_amax, s.v_scale = ws.v_scale;
  s.heads = static_cast<int>(ws.heads);
  unsigned q_blocks = 0;
  if (q != nullptr) {
    s.q = rows_view(*q);
    s.nq = static_cast<int>(ws.nq), s.nq_pad = ws.nq_pad;
    s.q_codes = ws.q, s.q_scales = ws.q_scale;
    q_blocks = static_cast<unsigned>(ws.nq_pad / kInt8Fp8QBlock) * heads;
  }
  int8fp8_stats_q_kernel<<<static_cast<unsigned>(ws.chunks) * heads + q_blocks, kThreads, 0, stream>>>(s);
  VORTEX_CUDA_CHECK_LAUNCH();
  KvParams kv{};
  kv.k = rows_view(k), kv.v = rows_view(v);
  kv.nk = static_cast<int>(ws.nk), kv.nk_pad = ws.nk_pad;
  kv.k_mean = ws.k_mean, kv.v_amax = ws.v_amax;
  kv.k_codes = ws.k, kv.k_scales = ws.k_scale, kv.vt = ws.vt;
  // Placed under the stats launch's last blocks (dependent_launch.cuh).
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(2 * ws.nk_pad / kInt8Fp8KBlock), heads);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute overlap = programmatic_serialization();
  config.attrs = &overlap;
  config.numAttrs = 1;
  VORTEX_CUDA_CHECK(cudaLaunchKernelEx(&config, int8fp8_kv_kernel, kv));
  return ok_status();
}

}  // namespace

size_t int8fp8_workspace_bytes(int64_t nq, int64_t nk, int64_t heads) { return layout(nq, nk, heads).total; }

Result<Int8Fp8Workspace> int8fp8_workspace(DeviceArena& arena, int64_t nq, int64_t nk, int64_t heads) {
  // The stats launch's 1-D grid holds (chunks + Nq_pad / 64) · H blocks.
  if (nq < 1 || nk < 1 || heads < 1 || heads > 65535 || nq > INT32_MAX - kInt8Fp8RowPad ||
      nk > INT32_MAX - kInt8Fp8RowPad ||
      (static_cast<int64_t>(stats_chunks(nk)) + pad_rows(nq) / kInt8Fp8QBlock) * heads > INT32_MAX) {
    return invalid_argument("attention_int8fp8: unsupported sizes Nq=" + std::to_string(nq) + " Nk=" +
                            std::to_string(nk) + " H=" + std::to_string(heads));
  }
  const Layout l = layout(nq, nk, heads);
  VORTEX_ASSIGN_OR_RETURN(const Tensor block, arena.alloc({static_cast<int64_t>(l.total)}, DType::kU8));
  char* base = static_cast<char*>(block.data());
  Int8Fp8Workspace ws;
  ws.nq = nq, ws.nk = nk, ws.heads = heads;
  ws.nq_pad = pad_rows(nq), ws.nk_pad = pad_rows(nk);
  ws.chunks = stats_chunks(nk);
  ws.q = reinterpret_cast<int8_t*>(base + l.q);
  ws.k = reinterpret_cast<int8_t*>(base + l.k);
  ws.vt = reinterpret_cast<uint8_t*>(base + l.vt);
  ws.q_scale = reinterpret_cast<float*>(base + l.q_scale);
  ws.k_scale = reinterpret_cast<float*>(base + l.k_scale);
  ws.v_scale = reinterpret_cast<float*>(base + l.v_scale);
  ws.k_mean = reinterpret_cast<float*>(base + l.k_mean);
  ws.k_partial = reinterpret_cast<double*>(base + l.k_partial);
  ws.v_partial = reinterpret_cast<float*>(base + l.v_partial);
  ws.v_amax = reinterpret_cast<float*>(base + l.v_amax);
  ws.stats_done = reinterpret_cast<unsigned*>(base + l.stats_done);
  return ws;
}

Status quantize_int8fp8(const TensorView& q, const TensorView& k, const TensorView& v, const Int8Fp8Workspace& ws,
                        cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check_input("q", q, ws.nq, ws.heads));
  VORTEX_RETURN_IF_ERROR(check_input("k", k, ws.nk, ws.heads));
  VORTEX_RETURN_IF_ERROR(check_input("v", v, ws.nk, ws.heads));
  return launch_quantize(k, v, &q, ws, stream);
}

Status quantize_int8fp8_kv(const TensorView& k, const TensorView& v, const Int8Fp8Workspace& ws, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check_input("k", k, ws.nk, ws.heads));
  VORTEX_RETURN_IF_ERROR(check_input("v", v, ws.nk, ws.heads));
  return launch_quantize(k, v, nullptr, ws, stream);
}

Status norm_rope_quantize_q_int8fp8(const TensorView& q, const TensorView* weight, float eps, const TensorView* cos,
                                    const TensorView* sin, const Int8Fp8Workspace& ws, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check_input("q", q, ws.nq, ws.heads));
  if (static_cast<bool>(cos) != static_cast<bool>(sin)) {
    return invalid_argument("attention_int8fp8 q producer: cos given without sin, or sin without cos");
  }
  QProducerParams p{};
  p.q = rows_view(q);
  if (weight != nullptr) {
    const std::string what = "attention_int8fp8 q producer: " + describe_view("weight", *weight);
    if (weight->device != Device::kCuda || (weight->dtype != DType::kF32 && weight->dtype != DType::kBF16)) {
      return invalid_argument(what + " must be F32 or BF16 on the device");
    }
    if (weight->rank() != 1 || weight->shape[0] != kD || weight->strides[0] != 1 ||
        reinterpret_cast<uintptr_t>(weight->data) % 16 != 0) {
      return invalid_argument(what + " must be [128], contiguous and 16-byte aligned");
    }
    p.weight = static_cast<const char*>(weight->data);
    p.weight_bf16 = weight->dtype == DType::kBF16;
  }
  if (cos != nullptr) {
    for (const TensorView* t : {cos, sin}) {
      const std::string what = "attention_int8fp8 q producer: " + describe_view(t == cos ? "cos" : "sin", *t);
      const int64_t rot = t->rank() == 2 ? t->shape[1] : 0;
      if (t->device != Device::kCuda || t->dtype != DType::kF32 || t->rank() != 2 || t->shape[0] != ws.nq ||
          rot < 16 || rot > kD || rot % 16 != 0 || !t->is_contiguous() ||
          reinterpret_cast<uintptr_t>(t->data) % 16 != 0) {
        return invalid_argument(what + " must be F32 [" + std::to_string(ws.nq) +
                                ", rot] on the device, contiguous, 16-byte aligned, rot a multiple of 16 up to 128");
      }
    }
    if (sin->shape != cos->shape) {
      return invalid_argument("attention_int8fp8 q producer: sin " + sin->shape.to_string() + " must match cos " +
                              cos->shape.to_string());
    }
    p.cos = static_cast<const float*>(cos->data);
    p.sin = static_cast<const float*>(sin->data);
    p.rot = static_cast<int>(cos->shape[1]);
    p.rot_lanes = p.rot / 16;
  }
  p.eps = eps;
  p.nq = static_cast<int>(ws.nq);
  p.nq_pad = ws.nq_pad;
  p.codes = ws.q;
  p.scales = ws.q_scale;
  int8fp8_q_producer_kernel<<<dim3(static_cast<unsigned>(ws.nq_pad / kInt8Fp8QBlock), static_cast<unsigned>(ws.heads)),
                              kThreads, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
