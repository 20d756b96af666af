// Exact attention on Hopper tensor cores, variant v1 of the attention family (contract in
// attention.h, entry in attention_wgmma.h): for each head h and query i,
//
//   out[i, h, :] = Σ_j softmax_j(scale · q[i, h, :] · k[j, h, :]) · v[j, h, :]
//
// with bf16 q, k, v, fp32 scores, softmax and accumulation, P rounded to bf16 for the P·V product,
// and a bf16 output rounded once — the numerics of v0 (attention.cu), on wgmma instead of mma.sync.
//
//   v1  FlashAttention-3 structure, head dims 128 and 64 (64, the video VAE decoder's heads: the
//       bf16 output only). One CTA per (block of 128 queries, head), three warpgroups:
//       - producer (warpgroup 0, one thread): TMA loads of the CTA's Q tile once and of K / V tiles
//         of 128 keys into a two-stage ring whose slot j holds what the consumers' j-th issue reads,
//         K_j and V_{j−1}, guarded by one full and one empty mbarrier;
//         for long sweeps a pair of CTAs (a cluster) shares each K / V load by multicast;
//       - consumers (warpgroups 1, 2), 64 query rows each, per K/V tile:
//           S = Q·Kᵀ (wgmma m64n128k16, A = the warpgroup's Q rows from registers, loaded once per
//           CTA with ldmatrix; B = K from shared memory) → mask tail keys →
//           online softmax in fp32 on the accumulator registers → P packed to bf16 in registers →
//           O += P·V (wgmma m64n128k16, A = P from registers, B = V from shared memory).
//         Within a warpgroup Q·K_jᵀ and P_{j−1}·V_{j−1} are issued together, and the softmax of
//         S_j runs while the tensor cores do P_{j−1}·V_{j−1} (intra-warpgroup overlap; the wait
//         for that product sits behind the rescale's branch, see wait_product_and_rescale);
//         across the two warpgroups a pair of named barriers makes them issue their products in
//         turn, so one's softmax overlaps the other's matrix work (ping-pong).
//       - epilogue: O / row sum → bf16 → the warpgroup's own rows of the Q tile → 16-byte stores
//         into the strided out view (tail queries skipped); or, in the e4m3-output instance, the
//         CTA's bf16 values quantized as one block of the fp8 recipe's out-projection input
//         (attention_e4m3_tile.cuh) and no bf16 output.
//       Q, K, V tiles are [rows, 64 channels] boxes with the 128-byte swizzle, two per 128-channel
//       tile (one at head dim 64); TMA writes them in exactly the layout the wgmma descriptors describe.
#include "cuda/attention_wgmma.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cpu/fp8_blocks.h"
#include "cuda/attention_e4m3_tile.cuh"
#include "cuda/hopper_primitives.cuh"
#include "cuda/cta_trace.cuh"
#include "cuda/kernel_timeline_record.h"
#include "cuda/runtime.h"

namespace vortex::cuda {
namespace {

using namespace hopper;

// ---- tile configuration ---------------------------------------------------------------------------

// Head dim kD (128 or 64) is the kernel's template parameter; Tiles<kD> below has what depends on it.
// wgmma's M: one warpgroup owns 64 query rows for the whole key sweep, so its row statistics stay
// in registers (S and O are 64 fp32 registers per thread each at N = 128).
constexpr int kRowsPerConsumer = 64;
// Two consumer warpgroups share each K/V tile: 128 queries per CTA keep the L2→SM traffic for
// re-reading K and V at N²·H·D·4 B / 128 (~2.8 TB/s at the v0 rate; 64 rows would double it).
constexpr int kConsumers = 2;
constexpr int kBlockQ = kConsumers * kRowsPerConsumer;
// 128 keys per tile: wgmma's N for Q·Kᵀ (the largest whose S fits beside O and P in 240
// registers) and the K extent of eight k16 steps of P·V.
constexpr int kBlockK = 128;
// Two stages: the loads of tile j+1 run under the products of tile j; with Q (32 KB) the ring
// uses 160 KB of the 227 KB. A third stage measured slower (63.27 → 64.32 ms, bench/notes/attention.md).
constexpr int kStages = 2;
// Long sweeps run K and V to the CTAs of a 2-CTA cluster — consecutive query blocks of one head,
// which sweep the same keys in step — by TMA multicast: each CTA loads half of every tile's rows
// into the rings of both, so the head's K and V leave L2 once per pair instead of once per CTA.
// That saves power, not cycles: the pair waits for its slower CTA at every stage (0.6% more
// cycles), which pays only where the 700 W cap sets the clock. Measured (bench/notes/attention.md,
// sessions 11 and 13): 37,810 × 56 went 64.26 → 63.33 ms (the SMs' clock +2.6%), 4,608 × 24
// 0.407 → 0.414 ms (+1.3% cycles, no clock gained); clusters of 4 lost at both. The threshold
// between them (hopper::kMulticastMinPairs, ~7 ms of attention) is a judgment, not a measured
// crossover.
template <int kCluster>
constexpr int kSliceRows = kBlockK / kCluster;

constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
constexpr int kConsumerWarps = kConsumers * kWarpgroupThreads / 32;
// setmaxnreg budgets: the producer only computes coordinates and barrier addresses; the consumers
// hold S (64) + O (64) + P (32) + Q (32) + softmax state at head dim 128 (O 32 and Q 16 at 64).
// 128·24 + 256·240 = 64,512 of the 65,536 registers.
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
static_assert(register_budgets_fit(kProducerRegisters, kConsumers, kConsumerRegisters),
              "register budgets exceed the register file");

// The 128-byte swizzle takes boxes at most 128 bytes wide: 64 bf16 channels. A 128-channel tile is
// two such column halves back to back, each [rows, 64] with 128-byte rows; 8 rows (1024 bytes) are
// one swizzle period, which is also the descriptors' stride between 8-row core-matrix groups.
constexpr int kHalfChannels = kSwizzleBytes / 2;
constexpr int kQHalfBytes = kBlockQ * kSwizzleBytes;
constexpr int kKVHalfBytes = kBlockK * kSwizzleBytes;
// The ring's slot j holds the operands of the consumers' j-th issue, K_j and V_{j−1} (slot 0 only
// K_0, slot `tiles` only the last V): one barrier to wait on and one to release per key tile, which
// took 1.7% of the cycles off separate K and V barriers (their two waits and two releases sat on
// each consumer's chain; bench/notes/attention.md, session 13). K_j sits in K stage j % kStages and
// V_{j−1} in V stage j % kStages. K_j is now released after P_{j−1}·V_{j−1} lands rather than after
// S_j, the same point V's release already had, and the ring does not run dry at that point.
enum MbarrierIndex : int {
  kFullQ = 0,
  kFull = 1,                      // [kStages]: the slot's K and V tiles landed (TMA transaction bytes)
  kEmpty = kFull + kStages,       // [kStages]: every consumer warp has finished reading both
  kMbarrierCount = kEmpty + kStages
};
constexpr int kSmemAlignment = 1024;

// What depends on the head dim kD: the tiles' column halves and the shared memory, from a
// 1024-byte aligned base (the swizzle pattern repeats every 1024 bytes, and the descriptors assume
// tiles start on a period): Q [halves][128 rows][64], K and V [kStages][halves][128 keys][64], the
// mbarriers, the e4m3 output's per-warp amax words.
template <int kD>
struct Tiles {
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");
  static constexpr int kHalves = kD / kHalfChannels;
  static constexpr int kQTileBytes = kHalves * kQHalfBytes;
  static constexpr int kKVTileBytes = kHalves * kKVHalfBytes;
  static constexpr int kSmemQ = 0;
  static constexpr int kSmemK = kSmemQ + kQTileBytes;
  static constexpr int kSmemV = kSmemK + kStages * kKVTileBytes;
  static constexpr int kSmemBarriers = kSmemV + kStages * kKVTileBytes;
  static constexpr int kSmemEpilogue = kSmemBarriers + kMbarrierCount * 8;
  static constexpr int kSmemBytes = kSmemEpilogue + kConsumerWarps * 4 + kSmemAlignment;  // slack to align the base
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the shared memory one CTA may have on sm_90");
};

// Named barriers (0 is __syncthreads). Consumer c waits on kBarrierSchedule + c before issuing its
// products and then releases the other consumer's; kBarrierEpilogue + c orders one consumer's
// shared-memory staging of O before its global stores. Both consumers' warps meet at
// kBarrierE4m3 once their amax is in shared memory (e4m3 output).
constexpr int kBarrierSchedule = 1;
constexpr int kBarrierEpilogue = kBarrierSchedule + kConsumers;
constexpr int kBarrierE4m3 = kBarrierEpilogue + kConsumers;

constexpr float kLog2e = 1.4426950408889634f;

// ---- params --------------------------------------------------------------------------------------

struct WgmmaParams {
  __nv_bfloat16* out;  // [Nq, H, 128] (the bf16 instances)
  int64_t out_row, out_head;  // strides, elements
  detail::E4m3TileOut e4m3;   // the e4m3-output instance
  int nq, nk;
  float scale_log2;  // scale · log2(e): softmax by exp2
  // The timeline instance only: clock64() at each WgmmaTimelineEvent of every key tile, from lane
  // 0 of each consumer warp of CTA (timeline_block, timeline_head).
  long long* timeline;
  int timeline_block, timeline_head;
};

// The timeline instance's marks per key tile (attention_wgmma_timeline names them).
enum class WgmmaTimelineEvent : int {
  kOperandsReady,
  kSlotBegin,
  kSlotEnd,
  kScoresReady,
  kFirstRowDone,
  kProductDone,
  kPacked,
  kCount
};

// The timeline instance's record of this CTA (cta_trace.cuh), after its tile marks.
__device__ __forceinline__ void mark_cta(const WgmmaParams& p, int tiles, CtaMark mark) {
  cta_mark(p.timeline, kConsumerWarps, tiles, static_cast<int>(WgmmaTimelineEvent::kCount), mark);
}

// ---- descriptors and softmax helpers ---------------------------------------------------------------

// V for P·V is MN-major: its two 64-channel column halves are one K/V half apart.
__device__ __forceinline__ uint64_t v_descriptor(uint32_t address) { return mn_major_descriptor(address, kKVHalfBytes); }

// Accumulator layout of m64nNk16 (fp32): thread t of the warpgroup holds rows 16·(t/32) + (t%32)/4
// (elements 4j, 4j+1) and that + 8 (4j+2, 4j+3), columns 8j + 2·(t%4) and + 1, for j < N/8.

// Keys at or past nk (only in the last tile) get −inf scores, hence zero weights.
__device__ __forceinline__ void mask_tail_keys(float (&s)[64], int key0, int nk, int lane) {
#pragma unroll
  for (int j = 0; j < kBlockK / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (key0 + 8 * j + 2 * (lane % 4) + (e % 2) >= nk) s[4 * j + e] = -INFINITY;
    }
  }
}

// Online softmax of one tile for this thread's two rows, in two parts so that the wait for
// P_{t−1}·V_{t−1} can sit between the rows (the key sweep): update_row_max, then
// hopper::exponentiate_row per row. update_row_max: the new running max of each row (over the quad's
// 4 lanes) and alpha = exp2((m_old − m_new)·scale·log2e) to rescale what came before (0 on the first
// tile).
__device__ __forceinline__ void update_row_max(const float (&s)[64], float (&row_max)[2], float (&alpha)[2],
                                               float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The row's 32 scores of this lane. Non-negative floats order like their bits as signed
    // integers, and any of them beats every negative float, so a three-input integer max
    // (VIMNMX3; sm_90 has no three-input float max) over the bits is the float max whenever the
    // result is non-negative. A lane whose 32 scores are all negative takes the float tree.
    int b[kBlockK / 4];
#pragma unroll
    for (int j = 0; j < kBlockK / 8; ++j) {
      b[2 * j] = __float_as_int(s[4 * j + 2 * r]);
      b[2 * j + 1] = __float_as_int(s[4 * j + 2 * r + 1]);
    }
    int i0 = max(max(b[0], b[1]), b[2]), i1 = max(max(b[3], b[4]), b[5]), i2 = max(max(b[6], b[7]), b[8]);
    int i3 = max(max(b[9], b[10]), b[11]), i4 = max(max(b[12], b[13]), b[14]), i5 = max(max(b[15], b[16]), b[17]);
    int i6 = max(max(b[18], b[19]), b[20]), i7 = max(max(b[21], b[22]), b[23]), i8 = max(max(b[24], b[25]), b[26]);
    int i9 = max(max(b[27], b[28]), b[29]), i10 = max(b[30], b[31]);
    i0 = max(max(i0, i1), i2);
    i3 = max(max(i3, i4), i5);
    i6 = max(max(i6, i7), i8);
    i9 = max(i9, i10);
    i0 = max(max(i0, i3), max(i6, i9));
    float m[kBlockK / 8];
    m[0] = __int_as_float(i0);
    if (i0 < 0) {
      // The pairwise float tree: 5 dependent steps instead of 16. A max is exact whatever the
      // order, so the bits are the chain's.
#pragma unroll
      for (int j = 0; j < kBlockK / 8; ++j) m[j] = fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
      static_assert(kBlockK / 8 == 16, "the tree below halves 16 values four times");
#pragma unroll
      for (int j = 0; j < 8; ++j) m[j] = fmaxf(m[j], m[j + 8]);
#pragma unroll
      for (int j = 0; j < 4; ++j) m[j] = fmaxf(m[j], m[j + 4]);
      m[0] = fmaxf(m[0], m[2]);
      m[1] = fmaxf(m[1], m[3]);
      m[0] = fmaxf(m[0], m[1]);
    }
    float new_max = fmaxf(row_max[r], m[0]);
    new_max = fmaxf(new_max, __shfl_xor_sync(0xffffffffu, new_max, 1));
    new_max = fmaxf(new_max, __shfl_xor_sync(0xffffffffu, new_max, 2));
    // Finite from the first tile on: key 0 of every tile is valid and a valid score is finite.
    alpha[r] = fast_exp2((row_max[r] - new_max) * scale_log2);
    row_max[r] = new_max;
  }
}

// P (fp32, accumulator layout) → bf16 A fragments of P·V. Key step s (keys 16s..16s+15) takes
// accumulator columns j = 2s, 2s+1; wgmma's A layout for a warp's 16 rows is {row g, k 2q..2q+1},
// {g+8, same}, {g, k+8}, {g+8, k+8} — elements 8s..8s+7 in order, so register i packs s[2i], s[2i+1].
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&p)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) p[i] = pack_bf16x2(s[2 * i], s[2 * i + 1]);
}

// Waits for P_{t−1}·V_{t−1}, then O ·= alpha_t, row by row (O to tile t's running max before
// P_t·V_t lands in it). alpha is exactly 1 for a row whose running max did not move, and a product
// by 1 changes nothing; past the first few tiles most tiles move no row of a warp's 16, so the warp
// skips its 64 products then (the branch is warp-uniform; the result is the same bits).
// The branch also places the wait: ptxas hoists a wgmma wait to the top of its basic block, and
// in the softmax's block the wait held every exp2 of S_t until P_{t−1}·V_{t−1}, issued after
// Q·K_tᵀ, had run its 512 tensor cycles (the shipped SASS, session 14). After the branch, in the
// blocks that need it, the softmax runs under that product.
template <int kD>
__device__ __forceinline__ void wait_product_and_rescale(float (&o)[kD / 2], const float (&alpha)[2]) {
  if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
  wgmma_wait<0>();  // a no-op after the products
}

// ---- consumer products ----------------------------------------------------------------------------

// This warpgroup's 64 Q rows as wgmma A fragments, 4 registers per k16 step over D. Held in
// registers for the whole sweep, Q·Kᵀ reads only K from shared memory: each k16 step of it then
// moves 4 KB through the shared-memory pipe instead of 6 KB (the pipe ncu shows busiest, 79%).
template <int kD>
__device__ __forceinline__ void load_q_fragments(uint32_t (&q)[kD / 4], uint32_t q_rows, int warp, int lane) {
  const int row = warp * 16 + lane % 16;  // ldmatrix: lanes 0-15 address k 0-7 of the rows, 16-31 k 8-15
#pragma unroll
  for (int step = 0; step < kD / 16; ++step) {
    const int half = step / 4, chunk = (step % 4) * 2 + lane / 16;
    uint32_t (&fragment)[4] = *reinterpret_cast<uint32_t(*)[4]>(&q[4 * step]);
    ldmatrix_x4(fragment, q_rows + half * kQHalfBytes + row * kSwizzleBytes + ((chunk ^ (row % 8)) * 16));
  }
}

// S = Q·Kᵀ for this warpgroup's 64 rows and one 128-key tile: D / 16 k16 steps. Committed as one
// group.
template <int kD>
__device__ __forceinline__ void issue_qk(float (&s)[64], const uint32_t (&q)[kD / 4], uint64_t k_desc) {
  wgmma_fence();
  wgmma_m64n128k16_rs_kmajor<0>(s, q[0], q[1], q[2], q[3], k_desc);
#pragma unroll
  for (int step = 1; step < kD / 16; ++step) {
    wgmma_m64n128k16_rs_kmajor<1>(s, q[4 * step], q[4 * step + 1], q[4 * step + 2], q[4 * step + 3],
                                  k_desc + k_major_step(step, kKVHalfBytes));
  }
  wgmma_commit();
}

// O += P·V for one 128-key tile: 8 k16 steps over the keys, 16 keys = 2048 bytes of each V half.
template <int kD>
__device__ __forceinline__ void issue_pv(float (&o)[kD / 2], uint32_t (&p)[32], uint64_t v_desc) {
  pin_registers(o);
  pin_registers(p);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kBlockK / 16; ++step) {
    const uint64_t b = v_desc + static_cast<uint64_t>((step * 16 * kSwizzleBytes) >> 4);
    if constexpr (kD == 128) {
      wgmma_m64n128k16_rs(o, p[4 * step], p[4 * step + 1], p[4 * step + 2], p[4 * step + 3], b);
    } else {
      wgmma_m64n64k16_rs(o, p[4 * step], p[4 * step + 1], p[4 * step + 2], p[4 * step + 3], b);
    }
  }
  wgmma_commit();
}

// ---- producer: global → shared (TMA) ---------------------------------------------------------------

// This CTA's share of a K or V tile (rank `rank` of the cluster: rows rank·kSliceRows onwards of
// each column half) into the same stage of every CTA in the cluster, completing on `bar` in each.
template <int kCluster, int kD>
__device__ __forceinline__ void load_kv_slice(uint32_t stage_base, const CUtensorMap* map, int head, int key0,
                                              uint32_t bar, uint32_t rank) {
  const int row0 = static_cast<int>(rank) * kSliceRows<kCluster>;
  for (int h = 0; h < Tiles<kD>::kHalves; ++h) {
    const uint32_t dst = stage_base + h * kKVHalfBytes + row0 * kSwizzleBytes;
    if constexpr (kCluster == 1) {
      tma_load(dst, map, h * kHalfChannels, head, key0, bar);
    } else {
      tma_load_multicast(dst, map, h * kHalfChannels, head, key0 + row0, bar, (1u << kCluster) - 1);
    }
  }
}

template <int kCluster, int kD>
__device__ __forceinline__ void produce(const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        uint32_t smem, uint32_t bars, int q0, int head, int tiles, uint32_t rank) {
  using T = Tiles<kD>;
  prefetch_tensor_map(q_map);
  prefetch_tensor_map(k_map);
  prefetch_tensor_map(v_map);
  mbarrier_arrive_expect_tx(bars + 8 * kFullQ, T::kQTileBytes);
  for (int h = 0; h < T::kHalves; ++h) {
    tma_load(smem + T::kSmemQ + h * kQHalfBytes, q_map, h * kHalfChannels, head, q0, bars + 8 * kFullQ);
  }
  for (int slot = 0; slot <= tiles; ++slot) {
    const int stage = slot % kStages;
    const uint32_t parity = (slot / kStages) & 1;
    const bool has_k = slot < tiles, has_v = slot > 0;
    const uint32_t full = bars + 8 * (kFull + stage);
    // Wait for the consumers (of every CTA in the cluster) to have released this stage's previous
    // slot (slot − kStages). This CTA expects whole tiles: its slices and the others'.
    mbarrier_wait(bars + 8 * (kEmpty + stage), parity ^ 1);
    mbarrier_arrive_expect_tx(full, (static_cast<int>(has_k) + static_cast<int>(has_v)) * T::kKVTileBytes);
    if (has_k) {
      load_kv_slice<kCluster, kD>(smem + T::kSmemK + stage * T::kKVTileBytes, k_map, head, slot * kBlockK, full, rank);
    }
    if (has_v) {
      load_kv_slice<kCluster, kD>(smem + T::kSmemV + stage * T::kKVTileBytes, v_map, head, (slot - 1) * kBlockK, full,
                                  rank);
    }
  }
  if constexpr (kCluster > 1) wait_for_last_releases(bars + 8 * kEmpty, tiles + 1, kStages);
}

// ---- consumer: the key sweep -------------------------------------------------------------------------

template <bool kTimeline, bool kE4m3Out, int kCluster, int kD>
__device__ __forceinline__ void consume(const WgmmaParams& p, unsigned char* smem_ptr, uint32_t smem, uint32_t bars,
                                        int q0, int head, int tiles, int consumer) {
  using T = Tiles<kD>;
  static_assert(!kE4m3Out || kD == 128, "the e4m3 output's blocks are 128 channels of one head");
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32;
  const int schedule_mine = kBarrierSchedule + consumer, schedule_other = kBarrierSchedule + (1 - consumer);
  constexpr int kScheduleThreads = 2 * kWarpgroupThreads;

  const auto k_desc = [&](int stage) { return k_major_descriptor(smem + T::kSmemK + stage * T::kKVTileBytes); };
  const auto v_desc = [&](int stage) { return v_descriptor(smem + T::kSmemV + stage * T::kKVTileBytes); };
  // A stage is free once every consumer warp of the cluster has read it: lane i of each warp
  // arrives on CTA i's barrier.
  const auto release = [&](int barrier) {
    if constexpr (kCluster == 1) {
      if (lane == 0) mbarrier_arrive(bars + 8 * barrier);
    } else {
      if (lane < kCluster) mbarrier_arrive_cluster(bars + 8 * barrier, lane);
    }
  };
  // The timeline instance records the SM clock at `event` of key tile `tile`; the shipped instance
  // compiles this away.
  const auto mark = [&](WgmmaTimelineEvent event, int tile) {
    if constexpr (kTimeline) {
      if (lane == 0 && static_cast<int>(blockIdx.x) == p.timeline_block && head == p.timeline_head) {
        p.timeline[timeline_slot(consumer * (kWarpgroupThreads / 32) + warp, tiles, tile,
                                 static_cast<int>(WgmmaTimelineEvent::kCount), static_cast<int>(event))] = clock64();
      }
    }
  };

  float s[64];          // S, then P in fp32: [64 rows, 128 keys] of the warpgroup
  float o[kD / 2];      // O: [64 rows, kD channels]
  uint32_t pk[32];      // P in bf16: A fragments of P·V
  uint32_t qf[kD / 4];  // Q in bf16: A fragments of Q·Kᵀ
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}, alpha[2];

  // Ping-pong: consumer 0 issues first; consumer c's k-th issue slot waits for the other's
  // (k−1)-th (consumer 1's first arrival stands in for consumer 0's slot −1). Consumer 1 skips
  // its last arrival, which nobody would wait for, so both barriers end balanced.
  if (consumer == 1) named_barrier_arrive(schedule_other, kScheduleThreads);
  const auto end_slot = [&](int slot) {
    if (consumer == 0 || slot + 1 < tiles) named_barrier_arrive(schedule_other, kScheduleThreads);
  };

  mbarrier_wait(bars + 8 * kFullQ, 0);
  load_q_fragments<kD>(qf, smem + T::kSmemQ + consumer * kRowsPerConsumer * kSwizzleBytes, warp, lane);

  // Tile 0: S only.
  mbarrier_wait(bars + 8 * kFull, 0);
  named_barrier_sync(schedule_mine, kScheduleThreads);
  issue_qk<kD>(s, qf, k_desc(0));
  end_slot(0);
  wgmma_wait<0>();
  pin_registers(s);
  release(kEmpty);
  if (kBlockK > p.nk) mask_tail_keys(s, 0, p.nk, lane);
  update_row_max(s, row_max, alpha, p.scale_log2);
  exponentiate_row(s, 0, row_max, row_sum, alpha, p.scale_log2);
  exponentiate_row(s, 1, row_max, row_sum, alpha, p.scale_log2);
  // Whether slot t has landed is asked before P_{t−1} is packed, so the answer's latency overlaps
  // the pack; the blocking wait then runs only when it had not. ncu at a locked clock: 1.3% fewer
  // cycles than waiting at the loop's top (the timeline instance, whose marks sit between the two,
  // shows the opposite; bench/notes/attention.md, session 13).
  const auto slot_full = [&](int slot) { return bars + 8 * (kFull + slot % kStages); };
  const auto slot_parity = [&](int slot) { return static_cast<uint32_t>((slot / kStages) & 1); };
  bool slot_ready = mbarrier_test(slot_full(1), slot_parity(1));
  pack_p(s, pk);
  if constexpr (kTimeline) {
    if (consumer == 0 && thread == 0) mark_cta(p, tiles, CtaMark::kFirstTile);
  }

  // Tile t: S_t = Q·K_tᵀ and O += P_{t−1}·V_{t−1} in flight together; softmax of S_t under P·V.
  for (int tile = 1; tile < tiles; ++tile) {
    const int stage = tile % kStages;
    if (!slot_ready) mbarrier_wait(slot_full(tile), slot_parity(tile));
    mark(WgmmaTimelineEvent::kOperandsReady, tile);
    named_barrier_sync(schedule_mine, kScheduleThreads);
    mark(WgmmaTimelineEvent::kSlotBegin, tile);
    issue_qk<kD>(s, qf, k_desc(stage));
    issue_pv<kD>(o, pk, v_desc(stage));
    mark(WgmmaTimelineEvent::kSlotEnd, tile);
    wgmma_wait<1>();  // S_t done; P·V may still run
    pin_registers(s);
    // The other consumer's slot opens only now: its products queue behind P_{t−1}·V_{t−1} alone,
    // so its warps spend less time stalled in the issue of products the tensor pipe cannot take
    // yet (ncu at a locked clock: 0.57% fewer cycles than opening it right after this issue;
    // opening it after P·V landed instead idles the tensor pipe, +41%). The same products in the
    // same order, so the same bits.
    end_slot(tile);
    mark(WgmmaTimelineEvent::kScoresReady, tile);
    const int key0 = tile * kBlockK;
    if (key0 + kBlockK > p.nk) mask_tail_keys(s, key0, p.nk, lane);
    update_row_max(s, row_max, alpha, p.scale_log2);
    exponentiate_row(s, 0, row_max, row_sum, alpha, p.scale_log2);
    mark(WgmmaTimelineEvent::kFirstRowDone, tile);
    // By now P_{t−1}·V_{t−1} has (nearly) run its 512 tensor cycles after S_t. Waiting for it here,
    // behind the rescale's branch, lets the packs of P_t (F2FP, on the ALU pipe) interleave with the
    // second row's exp2s (XU) in one basic block; the conversions are the same, so are the bits.
    wait_product_and_rescale<kD>(o, alpha);  // P_{t−1}·V_{t−1} done: its P registers and the slot are free
    pin_registers(o);
    pin_registers(pk);
    mark(WgmmaTimelineEvent::kProductDone, tile);
    release(kEmpty + stage);
    slot_ready = mbarrier_test(slot_full(tile + 1), slot_parity(tile + 1));
    exponentiate_row(s, 1, row_max, row_sum, alpha, p.scale_log2);
    pack_p(s, pk);
    mark(WgmmaTimelineEvent::kPacked, tile);
  }

  // The last tile's P·V.
  if (!slot_ready) mbarrier_wait(slot_full(tiles), slot_parity(tiles));
  issue_pv<kD>(o, pk, v_desc(tiles % kStages));
  wgmma_wait<0>();
  pin_registers(o);
  if constexpr (kTimeline) {
    if (thread == 0) mark_cta(p, tiles, CtaMark::kSweepDone);
  }
  // No load waits for this stage, but with clusters every producer waits for the cluster's last
  // releases before its CTA may exit.
  if constexpr (kCluster > 1) release(kEmpty + tiles % kStages);
  if (q0 >= p.nq) return;  // a cluster's padding block past the last query block

  // ---- epilogue: O / row sum → bf16 → this warpgroup's rows of the Q tile → global ----
  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inverse[r] = 1.0f / sum;
  }
  if constexpr (kE4m3Out) {
    uint32_t y[2][kD / 8];
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) y[r][j] = pack_bf16x2(o[4 * j + 2 * r] * inverse[r], o[4 * j + 2 * r + 1] * inverse[r]);
    }
    uint32_t* warp_max = reinterpret_cast<uint32_t*>(smem_ptr + T::kSmemEpilogue);
    detail::store_e4m3_tile<kConsumerWarps>(y, p.e4m3, q0 / kBlockQ, head,
                                            q0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4, p.nq,
                                            consumer * (kWarpgroupThreads / 32) + warp, lane, warp_max, kBarrierE4m3);
    return;
  }
  // Staging in Q's own layout (128-byte rows, 16-byte chunk c of row r at c ^ (r % 8)): the quad
  // of a row writes one chunk, the 8 rows of a warp's store land in 8 different chunks (no bank
  // conflicts). This warpgroup read its Q rows into registers before its first product, and no one
  // else reads these rows.
  unsigned char* rows = smem_ptr + T::kSmemQ + consumer * kRowsPerConsumer * kSwizzleBytes;
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + lane / 4 + 8 * r;
      const int half = j / 8, chunk = j % 8;
      *reinterpret_cast<uint32_t*>(rows + half * kQHalfBytes + row * kSwizzleBytes + ((chunk ^ (row % 8)) * 16) +
                                   4 * (lane % 4)) =
          pack_bf16x2(o[4 * j + 2 * r] * inverse[r], o[4 * j + 2 * r + 1] * inverse[r]);
    }
  }
  named_barrier_sync(kBarrierEpilogue + consumer, kWarpgroupThreads);
  constexpr int kChunksPerRow = kD / 8;
#pragma unroll
  for (int i = 0; i < kRowsPerConsumer * kChunksPerRow / kWarpgroupThreads; ++i) {
    const int c = thread + i * kWarpgroupThreads;
    const int row = c / kChunksPerRow, column_chunk = c % kChunksPerRow;
    const int query = q0 + consumer * kRowsPerConsumer + row;
    if (query < p.nq) {
      const int half = column_chunk / 8, chunk = column_chunk % 8;
      const uint4 value =
          *reinterpret_cast<const uint4*>(rows + half * kQHalfBytes + row * kSwizzleBytes + ((chunk ^ (row % 8)) * 16));
      *reinterpret_cast<uint4*>(p.out + static_cast<int64_t>(query) * p.out_row + head * p.out_head +
                                column_chunk * 8) = value;
    }
  }
}

// ---- the kernel ------------------------------------------------------------------------------------------

// kTimeline: the diagnostics instance (attention_wgmma_timeline); the same operations plus the
// clock marks of one CTA. kE4m3Out: the e4m3-output instance (attention_wgmma_quantized_e4m3).
template <bool kTimeline, bool kE4m3Out, int kCluster, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                           const __grid_constant__ CUtensorMap v_map, const WgmmaParams p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw);
  const uint32_t smem = (raw + kSmemAlignment - 1) & ~static_cast<uint32_t>(kSmemAlignment - 1);
  unsigned char* smem_ptr = smem_raw + (smem - raw);
  const uint32_t bars = smem + Tiles<kD>::kSmemBarriers;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const int q0 = static_cast<int>(blockIdx.x) * kBlockQ;
  const int head = static_cast<int>(blockIdx.y);
  const int tiles = (p.nk + kBlockK - 1) / kBlockK;
  if constexpr (kTimeline) {
    if (threadIdx.x == kWarpgroupThreads) mark_cta(p, tiles, CtaMark::kStart);
  }

  if (threadIdx.x == 0) {
    mbarrier_init(bars + 8 * kFullQ, 1);
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(bars + 8 * (kFull + stage), 1);  // the producer's arrive.expect_tx
      // One arrival per consumer warp of the cluster.
      mbarrier_init(bars + 8 * (kEmpty + stage), kConsumerWarps * kCluster);
    }
    mbarrier_init_fence();
  }
  // The last CTA-wide barrier (the producer's idle warps exit below); with clusters, it also keeps
  // every CTA's loads and arrivals off the others' barriers until those are initialised.
  if constexpr (kCluster == 1) {
    __syncthreads();
  } else {
    cluster_sync();
  }

  if (warpgroup == 0) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) {
      produce<kCluster, kD>(&q_map, &k_map, &v_map, smem, bars, q0, head, tiles, cluster_cta_rank());
    }
  } else {
    claim_registers<kConsumerRegisters>();
    consume<kTimeline, kE4m3Out, kCluster, kD>(p, smem_ptr, smem, bars, q0, head, tiles, warpgroup - 1);
    // The first thread of each consumer, once its epilogue is done: the later of the two counts.
    if constexpr (kTimeline) {
      if (threadIdx.x % kWarpgroupThreads == 0) mark_cta(p, tiles, CtaMark::kEnd);
    }
  }
}

// ---- host: tensor maps and launch -------------------------------------------------------------------

}  // namespace

namespace {

// Encodes the tensor maps and launches an instance: bf16 into `out`, or (kE4m3Out) e4m3 into
// `e4m3`; `timeline` (kTimeline only) is [8 warps][tiles][events] of device memory.
template <bool kTimeline, bool kE4m3Out, int kCluster, int kD>
Status launch(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* out,
              const detail::E4m3TileOut* e4m3, float scale, long long* timeline, cudaStream_t stream) {
  const EncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr) return unimplemented("attention v1: the driver offers no cuTensorMapEncodeTiled");
  CUtensorMap q_map, k_map, v_map;
  VORTEX_RETURN_IF_ERROR(encode_head_view(encode, &q_map, "attention v1", "q", q, kD, kBlockQ));
  VORTEX_RETURN_IF_ERROR(encode_head_view(encode, &k_map, "attention v1", "k", k, kD, kSliceRows<kCluster>));
  VORTEX_RETURN_IF_ERROR(encode_head_view(encode, &v_map, "attention v1", "v", v, kD, kSliceRows<kCluster>));

  WgmmaParams params{};
  if (out != nullptr) {
    params.out = static_cast<__nv_bfloat16*>(out->data);
    params.out_row = out->strides[0];
    params.out_head = out->strides[1];
  }
  if (e4m3 != nullptr) params.e4m3 = *e4m3;
  params.nq = static_cast<int>(q.shape[0]);
  params.nk = static_cast<int>(k.shape[0]);
  params.scale_log2 = scale * kLog2e;
  // The middle query block of the middle head: a CTA of a wave in full flight.
  const unsigned q_blocks = static_cast<unsigned>((params.nq + kBlockQ - 1) / kBlockQ);
  params.timeline = timeline;
  params.timeline_block = static_cast<int>(q_blocks / 2);
  params.timeline_head = static_cast<int>(q.shape[1] / 2);

  const auto kernel = attention_wgmma_kernel<kTimeline, kE4m3Out, kCluster, kD>;
  constexpr int kSmemBytes = Tiles<kD>::kSmemBytes;
  VORTEX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  // x fastest: the CTAs resident at one time share a head, so its K and V stay in L2. The query
  // blocks are padded to whole clusters; a padding block loads its share and stores nothing.
  cudaLaunchConfig_t config{};
  config.gridDim = cluster_grid(q_blocks, kCluster, q.shape[1]);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster = cluster_dimension(kCluster);
  config.attrs = &cluster;
  config.numAttrs = 1;
  VORTEX_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, q_map, k_map, v_map, params));
  return ok_status();
}

}  // namespace

int attention_wgmma_cluster_ctas(int64_t nq, int64_t nk, int64_t heads) {
  return multicast_cluster_ctas(nq, nk, heads);
}

namespace {

// The cluster size a caller's cluster_ctas means at this size (resolve_cluster_ctas).
Result<int> cluster_for(int cluster_ctas, const TensorView& q, const TensorView& k) {
  return resolve_cluster_ctas("attention v1", cluster_ctas, q.shape[0], k.shape[0], q.shape[1]);
}

// launch's instance for clusters of cluster_ctas (as cluster_for resolves it) and q's head dim:
// 128, or 64 for the plain bf16 output.
template <bool kTimeline, bool kE4m3Out>
Status launch_clustered(int cluster_ctas, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView* out, const detail::E4m3TileOut* e4m3, float scale, long long* timeline,
                        cudaStream_t stream) {
  VORTEX_ASSIGN_OR_RETURN(const int cluster, cluster_for(cluster_ctas, q, k));
  constexpr bool kPlain = !kTimeline && !kE4m3Out;
  if constexpr (kPlain) {
    if (q.shape[2] == 64) {
      if (cluster == 1) return launch<false, false, 1, 64>(q, k, v, out, e4m3, scale, timeline, stream);
      return launch<false, false, 2, 64>(q, k, v, out, e4m3, scale, timeline, stream);
    }
  }
  if (q.shape[2] != 128) {
    return invalid_argument(std::string("attention v1: head dim must be 128") + (kPlain ? " or 64" : "") + ", got " +
                            std::to_string(q.shape[2]));
  }
  if (cluster == 1) return launch<kTimeline, kE4m3Out, 1, 128>(q, k, v, out, e4m3, scale, timeline, stream);
  return launch<kTimeline, kE4m3Out, 2, 128>(q, k, v, out, e4m3, scale, timeline, stream);
}

}  // namespace

Status attention_wgmma(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       float scale, cudaStream_t stream, int cluster_ctas) {
  return launch_clustered<false, false>(cluster_ctas, q, k, v, &out, nullptr, scale, nullptr, stream);
}

Status attention_wgmma_quantized_e4m3(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& codes, const TensorView& scales, float scale,
                                      cudaStream_t stream, int cluster_ctas) {
  const cpu::Fp8BlockScales at =
      cpu::fp8_block_scales(cpu::Fp8BlockLayout::kTiles, q.shape[0], q.shape[1] * q.shape[2]);
  const detail::E4m3TileOut e4m3{static_cast<uint8_t*>(codes.data), codes.strides[0], static_cast<float*>(scales.data),
                                 static_cast<int>(at.row_block_stride)};
  return launch_clustered<false, true>(cluster_ctas, q, k, v, nullptr, &e4m3, scale, nullptr, stream);
}

Result<KernelTimeline> attention_wgmma_timeline(const TensorView& q, const TensorView& k, const TensorView& v,
                                                const TensorView& out, float scale, cudaStream_t stream,
                                                int cluster_ctas) {
  std::vector<std::string> events = {"operands (K_t, V_t-1 landed)",
                                     "slot begins (the other consumer's S landed)",
                                     "issued (QK_t, PV_t-1)",
                                     "scores landed",
                                     "first row's weights done",
                                     "PV_t-1 landed",
                                     "softmax done, P_t packed"};
  static_assert(static_cast<int>(WgmmaTimelineEvent::kCount) == 7, "one name per event");
  const int tiles = static_cast<int>((k.shape[0] + kBlockK - 1) / kBlockK);
  VORTEX_ASSIGN_OR_RETURN(const int cluster, cluster_for(cluster_ctas, q, k));
  const dim3 grid = cluster_grid((q.shape[0] + kBlockQ - 1) / kBlockQ, cluster, q.shape[1]);
  VORTEX_ASSIGN_OR_RETURN(KernelTimeline timeline,
                          record_timeline(std::move(events), kConsumerWarps, tiles, static_cast<int>(grid.x * grid.y),
                                          stream, [&](long long* marks) {
                                            return launch_clustered<true, false>(cluster, q, k, v, &out, nullptr, scale,
                                                                                 marks, stream);
                                          }));
  timeline.cluster_ctas = cluster;
  return timeline;
}

Result<KernelResources> attention_wgmma_resources(int cluster_ctas) {
  const void* kernel = cluster_ctas == 2 ? reinterpret_cast<const void*>(attention_wgmma_kernel<false, false, 2, 128>)
                                         : reinterpret_cast<const void*>(attention_wgmma_kernel<false, false, 1, 128>);
  return kernel_resources(kernel, Tiles<128>::kSmemBytes);
}

}  // namespace vortex::cuda
