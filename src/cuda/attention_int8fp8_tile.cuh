// The int8fp8 attention kernel's tile configuration and per-tile math (attention_int8fp8.cu is
// its only includer): the shared-memory layout and barrier indices, the online softmax, the P8
// packing, the two-level accumulation and the wgmma products of one key tile. Split from the kernel
// file so that each stays readable; everything here runs in a consumer thread.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "cuda/attention_int8fp8.h"
#include "cuda/hopper_primitives.cuh"

namespace vortex::cuda::int8fp8 {

using hopper::fast_exp2;
using hopper::pin_registers;
using hopper::wgmma_commit;
using hopper::wgmma_fence;

// ---- tile configuration ---------------------------------------------------------------------------

constexpr int kHeadDim = kInt8Fp8HeadDim;
// wgmma's M: one warpgroup owns 64 query rows (one Q scale block) for the whole sweep.
constexpr int kRowsPerConsumer = 64;
static_assert(kRowsPerConsumer == kInt8Fp8QBlock, "one Q scale per consumer");
// 128 keys per tile: wgmma's N for Q·Kᵀ, four k32 steps of P·V, and one K scale.
constexpr int kBlockK = 128;
static_assert(kBlockK == kInt8Fp8KBlock, "one K scale per tile");
// Three stages: 8-bit tiles are 16 KB, so a deeper ring is cheap (a fourth measured 3.9% slower).
constexpr int kStages = 3;

using hopper::kWarpgroupThreads;
using hopper::register_budgets_fit;

// Every tile row is 128 bytes (128 int8 channels, or 128 e4m3 keys): one 128-byte swizzle span,
// 8 rows (1024 bytes) per swizzle period and per core-matrix group of the descriptors.
constexpr int kRowBytes = 128;
constexpr int kKTileBytes = kBlockK * kRowBytes;
constexpr int kVTileBytes = kHeadDim * kRowBytes;

// Each Vᵀ stage is followed by 8 rows of e4m3(1.0), channels 128..135 of an extended tile: the
// second P·V half covers them, so the tensor core also sums P8 over the tile's keys (the row
// sums). Every byte is 0x38, so the swizzle leaves them as they are; written once per CTA.
constexpr int kOnesBytes = 8 * kRowBytes;
constexpr int kVStageBytes = kVTileBytes + kOnesBytes;

// Three consumer warpgroups of 64 queries (192 per CTA), each holding S (64) + O (64) and, in
// turn, one P·V half (32 or 36) and P8 (16) in its 160 registers, with no product of its own in
// flight during its softmax: the other two consumers fill the tensor pipe and the exp2 unit
// (bench/notes/attention.md, session 16: 8.2% fewer cycles than two consumers that each overlapped
// their own P·V with their softmax in 240 registers).
constexpr int kConsumers = 3;
constexpr int kBlockQ = kConsumers * kRowsPerConsumer;
constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
constexpr int kConsumerWarps = kConsumers * kWarpgroupThreads / 32;
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 160;
static_assert(register_budgets_fit(kProducerRegisters, kConsumers, kConsumerRegisters),
              "register budgets exceed the register file");
// The e4m3 output's scale blocks are 128 queries × one head (the out projection's kTiles layout):
// a pair of CTAs (384 queries) holds three, the middle one split between the pair's CTAs.
constexpr int kScaleBlockQ = 128;
static_assert(2 * kBlockQ == 3 * kScaleBlockQ, "a pair of CTAs holds whole scale blocks");

// The ring's slot j holds what the consumers' j-th issue reads, K_j and Vᵀ_{j−1} (slot 0 only K_0,
// slot `tiles` only the last Vᵀ), in K stage and Vᵀ stage j % kStages: one barrier to wait on and
// one to release per key tile, as in the exact kernel (attention_wgmma.cu). A slot is released once
// (P·V)_{j−1} has retired, where Vᵀ_{j−1}'s release was.
enum MbarrierIndex : int {
  kFullQ = 0,
  kFull = 1,                      // [kStages]: the slot's K and Vᵀ tiles landed (TMA transaction bytes)
  kEmpty = kFull + kStages,       // [kStages]: every consumer warp has finished reading both
  kSplitAmax = kEmpty + kStages,  // the e4m3 output: the other CTA of the pair wrote its half's amax
  kMbarrierCount = kSplitAmax + 1
};

// Shared memory from a 1024-byte aligned base: Q [192 rows][128 B], K [kStages][128 keys][128 B],
// Vᵀ [kStages][128 channels + 8 ones rows][128 B], the mbarriers, then the e4m3 output's amax
// words: one per consumer warp, and the split block's half from the other CTA of the pair.
constexpr int kQTileBytes = kBlockQ * kRowBytes;
constexpr int kSmemQ = 0;
constexpr int kSmemK = kSmemQ + kQTileBytes;
constexpr int kSmemV = kSmemK + kStages * kKTileBytes;
constexpr int kSmemBarriers = kSmemV + kStages * kVStageBytes;
constexpr int kSmemWarpAmax = kSmemBarriers + kMbarrierCount * 8;
constexpr int kSmemSplitAmax = kSmemWarpAmax + kConsumerWarps * 4;
constexpr int kSmemAlignment = 1024;
constexpr int kSmemBytes = kSmemSplitAmax + 4 + kSmemAlignment;  // slack to align the base

// Named barrier (0 is __syncthreads): the consumers' warps meet at kBarrierEpilogue once their amax
// is in shared memory (e4m3 output). The consumers take no turns issuing their products: the exact
// kernel's ping-pong barriers cost 1.6% of the cycles here (bench/notes/attention.md, session 16).
constexpr int kBarrierEpilogue = 1;

// exp2 scaled by 448: P8 = e4m3(448 · P) puts the row's largest weight on e4m3's largest value.
constexpr float kLog2PScale = 8.80735492205760410f;  // log2(448), cpu::kInt8Fp8Log2PScale
constexpr float kLog2e = 1.4426950408889634f;
// A score acc (|acc| < 2^21) enters the softmax as fp32(1.5·2^23 + acc), exact, whose bits are
// acc + bits(1.5·2^23): cpu::kInt8Fp8ScoreBias.
constexpr uint32_t kMagicBits = 0x4B400000u;
constexpr float kMagic = 12582912.0f;

// The timeline instance's marks per key tile t of the three-consumer sweep
// (attention_int8fp8_timeline names them).
enum class Int8Fp8TimelineEvent : int {
  kTileStart,
  kOperandsReady,   // P_{t−1} packed; K_t and Vᵀ_{t−1} landed
  kFirstHalfAdded,  // the first half of (P·V)_{t−1} retired and added to O
  kProductAdded,    // the second half too, with the row sums
  kIssued,          // Q·K_tᵀ issued
  kScoresReady,
  kFirstMaxDone,
  kSoftmaxDone,
  kCount
};

// ---- PTX wrappers: wgmma (hopper_primitives.cuh) -----------------------------------------------

// Every operand here (Q, K, Vᵀ) is [rows, 128 bytes] with the contraction dim contiguous: the
// 128-byte swizzle's K-major descriptor, and the k32 step s is the 32 bytes at 32·s of each row,
// reached by adding 32·s to the start address (the hardware applies the swizzle to the final
// address, as TMA did when writing).
using hopper::k_major_descriptor;
using hopper::wgmma_e4m3;
using hopper::wgmma_s8;
__device__ __forceinline__ constexpr uint64_t k32_step(int s) { return static_cast<uint64_t>((32 * s) >> 4); }

// ---- softmax helpers ------------------------------------------------------------------------------

// Two fp32 → e4m3x2 (RNE, saturating at ±448), `lo` in the low byte.
__device__ __forceinline__ uint32_t pack_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// Accumulator layout of m64nNk32 (s32 or f32): thread t of the warpgroup holds rows 16·(t/32) +
// (t%32)/4 (elements 4j, 4j+1) and that + 8 (4j+2, 4j+3), columns 8j + 2·(t%4) and + 1, for j < N/8.

// Online softmax of one tile for this thread's two rows, in place: s holds the exact int32 scores
// on entry and the bits of P·448 (fp32) on return. c: the tile's factor q_scale·k_scale·scale·log2 e.
// Keys at or past nk (only when kMask) get weight 0 and stay out of the max; alpha =
// exp2(m_old − m_new) (0 on the first tile). The row sums come from the tensor core.
// Row by row: row 0's maximum, after_first_max() (the timeline instance's mark), row 0's exp2s, then
// row 1's. Row 1's maximum takes a false dependency on row 0's first weight (`zero` is 0 at run time
// but unknown to the compiler), so ptxas issues it under row 0's exp2s instead of hoisting both
// maxima ahead of every exp2: 1.15% fewer cycles (session 16, two A/Bs), the same bits.
template <bool kMask, typename AfterFirstMax>
__device__ __forceinline__ void online_softmax(uint32_t (&s)[64], float c, float (&row_max)[2], float (&alpha)[2],
                                               int key0, int nk, int lane, AfterFirstMax after_first_max,
                                               uint32_t zero) {
  uint32_t first_weight = 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // Over the exact scores; two chains: half the dependent latency.
    int max0 = INT_MIN | static_cast<int>(first_weight & zero), max1 = INT_MIN;
#pragma unroll
    for (int j = 0; j < kBlockK / 8; ++j) {
      const int key = key0 + 8 * j + 2 * (lane % 4);
      max0 = max(max0, (!kMask || key < nk) ? static_cast<int>(s[4 * j + 2 * r]) : INT_MIN);
      max1 = max(max1, (!kMask || key + 1 < nk) ? static_cast<int>(s[4 * j + 2 * r + 1]) : INT_MIN);
    }
    int tile_max = max(max0, max1);
    tile_max = max(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = max(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    // Finite: key 0 of every tile is valid. The max of fp32(acc)·c is fp32(max acc)·c (c >= 0).
    const float new_max = fmaxf(row_max[r], static_cast<float>(tile_max) * c);
    alpha[r] = fast_exp2(row_max[r] - new_max);
    row_max[r] = new_max;
    if (r == 0) after_first_max();
    // A score enters the exponent as the float whose bits are acc + bits(1.5·2^23), i.e. exactly
    // 1.5·2^23 + acc (one integer add, no conversion); the offset takes the 1.5·2^23 back out.
    const float offset = fmaf(-kMagic, c, kLog2PScale - new_max);
#pragma unroll
    for (int j = 0; j < kBlockK / 8; ++j) {
      float p0 = fast_exp2(fmaf(__uint_as_float(s[4 * j + 2 * r] + kMagicBits), c, offset));
      float p1 = fast_exp2(fmaf(__uint_as_float(s[4 * j + 2 * r + 1] + kMagicBits), c, offset));
      if (kMask) {
        const int key = key0 + 8 * j + 2 * (lane % 4);
        p0 = key < nk ? p0 : 0.0f;
        p1 = key + 1 < nk ? p1 : 0.0f;
      }
      if (j == 0) first_weight = __float_as_uint(p0);
      s[4 * j + 2 * r] = __float_as_uint(p0);
      s[4 * j + 2 * r + 1] = __float_as_uint(p1);
    }
  }
}

// P·448 (fp32 bits, accumulator layout) → e4m3 A fragments of P·V. For k32 step s, register 4s + r + 2h
// holds row g + 8r, keys (in Vᵀ slot order) 32s + 16h + 4t .. +3, which are the accumulator's
// columns 8j + 2t, 8j + 2t + 1 for j = 4s + 2h and j = 4s + 2h + 1 (int8fp8_vt_slot's permutation).
__device__ __forceinline__ void pack_p(const uint32_t (&s)[64], uint32_t (&p)[16]) {
  const auto x = [&](int i) { return __uint_as_float(s[i]); };
#pragma unroll
  for (int step = 0; step < kBlockK / 32; ++step) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = 4 * step + 2 * h;
        p[4 * step + r + 2 * h] = pack_e4m3x2(x(4 * j + 2 * r), x(4 * j + 2 * r + 1)) |
                               (pack_e4m3x2(x(4 * (j + 1) + 2 * r), x(4 * (j + 1) + 2 * r + 1)) << 16);
      }
    }
  }
}

// The two-level accumulation, one half of the channels: O[:, 64·H .. 64·H + 63] = O·alpha + (P·V)
// of that half (accumulator columns j = 8H .. 8H + 7 of O's m64n128 layout are columns j − 8H of
// the half's m64n64 layout).
template <int H, int N>
__device__ __forceinline__ void accumulate_half(float (&o)[64], const float (&o_half)[N], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < kHeadDim / 16; ++j) {
    float* oj = &o[4 * (j + 8 * H)];
    oj[0] = fmaf(oj[0], alpha[0], o_half[4 * j]);
    oj[1] = fmaf(oj[1], alpha[0], o_half[4 * j + 1]);
    oj[2] = fmaf(oj[2], alpha[1], o_half[4 * j + 2]);
    oj[3] = fmaf(oj[3], alpha[1], o_half[4 * j + 3]);
  }
}

// The second half of a P·V product landed (acc: channels 64..127 and the ones rows): its channels
// into O, and its row sums into l (columns 64 and 64 + 8 of the thread's rows g and g + 8:
// registers 32 and 34).
__device__ __forceinline__ void accumulate_second_half(float (&o)[64], float (&row_sum)[2], const float (&acc)[36],
                                                       const float (&alpha)[2]) {
  accumulate_half<1>(o, acc, alpha);
  row_sum[0] = row_sum[0] * alpha[0] + acc[32];
  row_sum[1] = row_sum[1] * alpha[1] + acc[34];
}

// The online softmax of the tile from key0, masking keys past nk only in a tile that reaches them.
// zero: 0, from a value the compiler cannot know (online_softmax).
template <typename AfterFirstMax = void (*)()>
__device__ __forceinline__ void softmax_tile(uint32_t (&s)[64], float c, float (&row_max)[2], float (&alpha)[2],
                                             int key0, int nk, int lane, uint32_t zero,
                                             AfterFirstMax after_first_max = [] {}) {
  if (key0 + kBlockK > nk) {
    online_softmax<true>(s, c, row_max, alpha, key0, nk, lane, after_first_max, zero);
  } else {
    online_softmax<false>(s, c, row_max, alpha, key0, nk, lane, after_first_max, zero);
  }
}

// ---- consumer products ----------------------------------------------------------------------------

// S = Q8·K8ᵀ for this warpgroup's 64 rows and one 128-key tile: 4 k32 steps over D.
__device__ __forceinline__ void issue_qk(uint32_t (&s)[64], uint64_t q_desc, uint64_t k_desc) {
  wgmma_fence();
  wgmma_s8<0>(s, q_desc, k_desc);
#pragma unroll
  for (int step = 1; step < kHeadDim / 32; ++step) wgmma_s8<1>(s, q_desc + k32_step(step), k_desc + k32_step(step));
  wgmma_commit();
}

// o_half = P8·V8 for channels 64·H .. 64·H + 63 of one 128-key tile: rows 64·H.. of the Vᵀ tile,
// 64 rows × 128 B = 8 KB (eight swizzle periods) past its start. With 36 registers (the second
// half) the product also covers the 8 ones rows after the tile: columns 64..71 are the row sums
// Σ_k P8.
template <int H, int N>
__device__ __forceinline__ void issue_pv_half(float (&o_half)[N], uint32_t (&p)[16], uint64_t v_desc) {
  static_assert(N == 32 || (N == 36 && H == 1), "64 channels, or the second half with the ones rows");
  const uint64_t b = v_desc + static_cast<uint64_t>((H * (kHeadDim / 2) * kRowBytes) >> 4);
  pin_registers(p);
  wgmma_fence();
  wgmma_e4m3<0>(o_half, p[0], p[1], p[2], p[3], b);
#pragma unroll
  for (int step = 1; step < kBlockK / 32; ++step) {
    wgmma_e4m3<1>(o_half, p[4 * step], p[4 * step + 1], p[4 * step + 2], p[4 * step + 3], b + k32_step(step));
  }
  wgmma_commit();
}

}  // namespace vortex::cuda::int8fp8
