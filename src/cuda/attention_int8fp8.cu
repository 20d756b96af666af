// The attention pass of the int8fp8 mode on Hopper (contract in attention_int8fp8.h; numerics of
// cpu/attention_int8fp8.h): a producer warpgroup feeding consumer warpgroups through TMA and
// mbarriers, as in the exact kernel (attention_wgmma.cu), on 8-bit operands.
//
//   One CTA per (192 queries, head), four warpgroups. The e4m3 output runs in pairs of CTAs (a
//   cluster), whose 384 queries are three of its 128-query scale blocks (write_output_e4m3).
//   - producer (warpgroup 0, one thread): TMA loads from the quantize pass's workspace — the CTA's
//     int8 Q tile [192 rows, 128 B] once, then per 128-key tile the int8 K tile [128 keys, 128 B]
//     and the e4m3 Vᵀ tile [128 channels, 128 keys] into a three-stage ring whose slot j holds K_j
//     and Vᵀ_{j−1} (one full and one empty mbarrier per slot).
//     Every tile is one box whose 128-byte rows are exactly the 128-byte swizzle span. Each Vᵀ
//     stage is followed by 8 rows of e4m3(1.0), written once per CTA. For long sweeps a pair of
//     CTAs (a cluster; consecutive query blocks of one head) shares each K / Vᵀ load by multicast:
//     each loads half of the tile's rows into both rings (as the exact kernel, attention_wgmma.cu).
//   - consumers (warpgroups 1–3), 64 query rows each (one Q scale), per tile t:
//       S_t = Q8·K8_tᵀ  wgmma m64n128k32 .s32.s8.s8 (both operands K-major in shared memory);
//       softmax of S_t: running max over the int32 scores, then per score one integer add that
//       makes the bits of fp32(1.5·2^23 + S) (exact: |S| < 2^21; no conversion unit), one FFMA by
//       q_scale·k_scale·scale·log2 e whose offset removes the 1.5·2^23 and folds the 448 of P8 =
//       e4m3(448·P) into the exponent, and exp2 — no row sums;
//       P_t·V_t in two channel halves: wgmma m64n64k32 .f32.e4m3.e4m3 (channels 0..63) and
//       m64n72k32 (channels 64..127 and the 8 ones rows, so the tensor core also returns the row
//       sums Σ_k P8 of the weights the products use), A = P8 from registers, B = Vᵀ K-major in
//       shared memory, each into a fresh accumulator: O = O·alpha + (P·V) in fp32 (the fp8 products
//       never accumulate across tiles inside the tensor core), l = l·alpha + Σ P8.
//     Each consumer runs these in turn (sweep); the other two fill the tensor pipe and the exp2
//     unit meanwhile. Keys are permuted within 16-key groups in Vᵀ (int8fp8_vt_slot) so that the S
//     accumulator's columns pack into the A fragment without shuffles. The consumers issue their
//     products without taking turns: the exact kernel's ping-pong barriers cost 1.6% of the
//     two-consumer kernel's cycles (session 16).
//   - epilogue: O · v_scale[channel] / row sum → bf16, 4-byte stores straight from the accumulator
//     layout into the strided out view (tail queries skipped). The e4m3-output instance instead
//     quantizes those bf16 values in 128-query blocks (the amax exchanged between the consumers
//     through shared memory, and for the block that straddles a pair, between its CTAs through
//     distributed shared memory) and stores codes and one scale per block.
// The tile configuration and the per-tile math (softmax, P8 packing, accumulation, the products)
// live in attention_int8fp8_tile.cuh; this file holds the producer, the key sweeps and the host.
#include "cuda/attention_int8fp8.h"

#include <cuda.h>          // CUtensorMap and its enums (types only: the encoder comes via the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cpu/fp8_blocks.h"
#include "cuda/attention_e4m3_tile.cuh"
#include "cuda/attention_int8fp8_tile.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/fp8_blocks.h"
#include "cuda/hopper_primitives.cuh"
#include "cuda/cta_trace.cuh"
#include "cuda/kernel_timeline_record.h"
#include "cuda/row_io.cuh"

namespace vortex::cuda {
namespace {

using namespace int8fp8;  // the tile configuration and per-tile math (attention_int8fp8_tile.cuh)

// ---- params --------------------------------------------------------------------------------------

struct Int8Fp8Params {
  __nv_bfloat16* out;          // [Nq, H, 128] (the bf16 instances)
  int64_t out_row, out_head;   // strides, elements
  // The e4m3-output instance: codes [Nq, H·128] (row stride code_row bytes) and one scale per
  // (128-query tile, head) in cpu::Fp8BlockLayout::kTiles: tile t's scales start at
  // t · code_scale_row (round_up(H, 4)).
  uint8_t* codes;
  int64_t code_row;
  float* code_scales;
  int code_scale_row;
  int heads;
  const float* q_scale;        // [H, Nq_pad / 64]
  const float* k_scale;        // [H, Nk_pad / 128]
  const float* v_scale;        // [H, 128]
  int nq, nk;
  int q_blocks, k_blocks;      // per head: Nq_pad / 64, Nk_pad / 128
  int nq_pad, nk_pad;
  float scale_log2;            // softmax scale · log2(e)
  // All ones, from the host: a value the compiler cannot know; ~all_ones is the zero through which
  // row 1's maximum takes its false dependency on row 0's weights (online_softmax).
  uint32_t all_ones;
  // The timeline instance only: clock64() at each Int8Fp8TimelineEvent of every key tile, from
  // lane 0 of each consumer warp of CTA (timeline_block, timeline_head): [warp][tile][event].
  long long* timeline;
  int timeline_block, timeline_head;
};

// The timeline instance's record of this CTA (cta_trace.cuh), after its tile marks.
__device__ __forceinline__ void mark_cta(const Int8Fp8Params& p, int tiles, CtaMark mark) {
  cta_mark(p.timeline, kConsumerWarps, tiles, static_cast<int>(Int8Fp8TimelineEvent::kCount), mark);
}

// ---- PTX wrappers: shared memory, mbarriers, TMA, named barriers, register budgets ---------------

// The PTX wrappers this kernel shares with the exact Hopper kernels.
using hopper::smem_address;
using hopper::mbarrier_init;
using hopper::mbarrier_init_fence;
using hopper::fence_proxy_async_shared;
using hopper::mbarrier_arrive;
using hopper::mbarrier_arrive_expect_tx;
using hopper::mbarrier_wait;
using hopper::prefetch_tensor_map;
using hopper::release_registers;
using hopper::claim_registers;
using hopper::wgmma_wait;
using hopper::pack_bf16x2;
using hopper::named_barrier_sync;
using hopper::send_to_cluster_cta;
using hopper::mbarrier_wait_cluster;
using detail::e4m3x2_bits;

using hopper::cluster_cta_rank;
using hopper::cluster_sync;
using hopper::mbarrier_arrive_cluster;
using hopper::wait_for_last_releases;

// Long sweeps share each K / Vᵀ load between the 2 CTAs of a cluster (TMA multicast): the head's
// operands leave L2 once per pair, which saves power under the 700 W cap. Measured
// (bench/notes/attention.md, session 12): 37,810 × 56 went 47.66 → 47.10 ms (clock 1,878 → 1,933
// MHz, cycles +1.7%); 4,608 × 24 (uncapped) 0.406 → 0.412 ms, so short sweeps keep one CTA. The
// threshold is the exact kernel's (hopper::kMulticastMinPairs). kSliceRows: the rows of a K or Vᵀ
// tile each CTA loads.
template <int kCluster>
constexpr int kSliceRows = kBlockK / kCluster;
static_assert(kHeadDim == kBlockK, "a Vᵀ tile has as many channel rows as a K tile has keys");

// One box (its rows set by the map: 128, or a slice) at (column, row) of a 2-d byte tensor map,
// completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int column, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(bar)
      : "memory");
}
// tma_load's box written to the same shared address of both CTAs of the cluster, completing its
// bytes on the mbarrier at `bar` of each.
__device__ __forceinline__ void tma_load_pair(uint32_t dst, const CUtensorMap* map, int column, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(bar), "h"(static_cast<uint16_t>(3))
      : "memory");
}

// ---- producer: global → shared (TMA) ---------------------------------------------------------------

// This CTA's share of a K or Vᵀ tile whose first row is `row0` in the map (rank `rank` of the
// cluster: rows rank·kSliceRows onwards) into the stage at `stage_base` of every CTA of the cluster.
template <int kCluster>
__device__ __forceinline__ void load_slice(uint32_t stage_base, const CUtensorMap* map, int column, int row0,
                                           uint32_t bar, uint32_t rank) {
  if constexpr (kCluster == 1) {
    tma_load(stage_base, map, column, row0, bar);
  } else {
    const int offset = static_cast<int>(rank) * kSliceRows<kCluster>;
    tma_load_pair(stage_base + offset * kRowBytes, map, column, row0 + offset, bar);
  }
}

template <int kCluster>
__device__ __forceinline__ void produce(const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        uint32_t smem, uint32_t bars, int q_row0, int k_row0, int v_row0, int tiles,
                                        uint32_t rank) {
  prefetch_tensor_map(q_map);
  prefetch_tensor_map(k_map);
  prefetch_tensor_map(v_map);
  mbarrier_arrive_expect_tx(bars + 8 * kFullQ, kQTileBytes);
  tma_load(smem + kSmemQ, q_map, 0, q_row0, bars + 8 * kFullQ);
  // Slot 0 holds K_0 alone, slot `tiles` the last Vᵀ alone.
  int stage = 0;
  uint32_t parity = 0;
  for (int slot = 0; slot <= tiles; ++slot) {
    const uint32_t full = bars + 8 * (kFull + stage);
    // Wait for the consumers (of every CTA in the cluster) to have released this stage's previous
    // slot (slot − kStages). This CTA expects whole tiles: its slices and the other's.
    mbarrier_wait(bars + 8 * (kEmpty + stage), parity ^ 1);
    mbarrier_arrive_expect_tx(full, (slot < tiles ? kKTileBytes : 0) + (slot > 0 ? kVTileBytes : 0));
    if (slot < tiles) {
      load_slice<kCluster>(smem + kSmemK + stage * kKTileBytes, k_map, 0, k_row0 + slot * kBlockK, full, rank);
    }
    if (slot > 0) {
      load_slice<kCluster>(smem + kSmemV + stage * kVStageBytes, v_map, (slot - 1) * kBlockK, v_row0, full, rank);
    }
    if (++stage == kStages) stage = 0, parity ^= 1;
  }
  if constexpr (kCluster > 1) wait_for_last_releases(bars + 8 * kEmpty, tiles + 1, kStages);
}

// ---- consumer: the key sweep -------------------------------------------------------------------------

// A consumer thread's place, the operand descriptors, the stage releases and the tile's softmax factor.
template <int kCluster>
struct Consumer {
  const Int8Fp8Params& p;
  uint32_t smem, bars;
  int q0, head, tiles, consumer;
  int warp, lane;

  __device__ Consumer(const Int8Fp8Params& params, uint32_t smem_, uint32_t bars_, int q0_, int head_, int tiles_,
                      int consumer_)
      : p(params), smem(smem_), bars(bars_), q0(q0_), head(head_), tiles(tiles_), consumer(consumer_) {
    const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
    warp = thread / 32;
    lane = thread % 32;
  }

  // Q's descriptor and the tile's factor come from the parameters and the CTA's place each time:
  // the sweep has no registers to hold them across it (held, ptxas spilled 20–28 bytes).
  __device__ uint64_t q_desc() const { return k_major_descriptor(smem + kSmemQ + consumer * kRowsPerConsumer * kRowBytes); }
  __device__ uint64_t k_desc(int stage) const { return k_major_descriptor(smem + kSmemK + stage * kKTileBytes); }
  __device__ uint64_t v_desc(int stage) const { return k_major_descriptor(smem + kSmemV + stage * kVStageBytes); }
  // q_scale · k_scale · scale · log2 e; a cluster's padding block (past the last query block)
  // sweeps with the last block's Q scale.
  __device__ float tile_factor(int tile) const {
    const int q_block = min(q0 / kRowsPerConsumer + consumer, p.q_blocks - 1);
    return p.q_scale[head * p.q_blocks + q_block] * p.scale_log2 * __ldg(p.k_scale + head * p.k_blocks + tile);
  }
  // The timeline instance records the SM clock at `event` of key tile `tile`; the shipped instance
  // compiles this away.
  template <bool kTimeline>
  __device__ void mark(Int8Fp8TimelineEvent event, int tile) const {
    if constexpr (kTimeline) {
      // The sweep's last step (the last P·V, tile == tiles) has no row in the record.
      if (lane == 0 && tile < tiles && static_cast<int>(blockIdx.x) == p.timeline_block && head == p.timeline_head) {
        const int consumer_warp = consumer * (kWarpgroupThreads / 32) + warp;
        p.timeline[timeline_slot(consumer_warp, tiles, tile, static_cast<int>(Int8Fp8TimelineEvent::kCount),
                                 static_cast<int>(event))] = clock64();
      }
    }
  }
  // A stage is free once every consumer warp of the cluster has read it: lane i of each warp
  // arrives on CTA i's barrier.
  __device__ void release(int barrier) const {
    if constexpr (kCluster == 1) {
      if (lane == 0) mbarrier_arrive(bars + 8 * barrier);
    } else {
      if (lane < kCluster) mbarrier_arrive_cluster(bars + 8 * barrier, lane);
    }
  }
  // Waits for ring slot `slot` (K_slot and Vᵀ_{slot−1}) to have landed.
  __device__ void wait_slot(int slot) const {
    mbarrier_wait(bars + 8 * (kFull + slot % kStages), (slot / kStages) & 1);
  }
  __device__ void release_slot(int slot) const { release(kEmpty + slot % kStages); }
  // The start of the sweep: once Q and slot 0 have landed, tile 0's S = Q·K_0ᵀ and its softmax
  // (no P·V yet); s then holds P_0.
  __device__ void first_tile(uint32_t (&s)[64], float (&row_max)[2], float (&alpha)[2]) const {
    mbarrier_wait(bars + 8 * kFullQ, 0);
    wait_slot(0);
    issue_qk(s, q_desc(), k_desc(0));
    wgmma_wait<0>();
    pin_registers(s);
    release_slot(0);  // K_0 alone
    softmax_tile(s, tile_factor(0), row_max, alpha, 0, p.nk, lane, 0u);
  }

  // (O · v_scale) / row sum → bf16 → global, straight from the accumulator layout. row_sum: the
  // whole row's (from the tensor core).
  __device__ void write_output(const float (&o)[64], const float (&row_sum)[2]) const {
    const float inverse[2] = {1.0f / row_sum[0], 1.0f / row_sum[1]};
    const float* v_scale = p.v_scale + head * kHeadDim;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int query = q0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4 + 8 * r;
      if (query >= p.nq) continue;
      __nv_bfloat16* row = p.out + static_cast<int64_t>(query) * p.out_row + static_cast<int64_t>(head) * p.out_head;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const int channel = 8 * j + 2 * (lane % 4);
        const float2 vs = __ldg(reinterpret_cast<const float2*>(v_scale + channel));
        *reinterpret_cast<uint32_t*>(row + channel) =
            pack_bf16x2((o[4 * j + 2 * r] * vs.x) * inverse[r], (o[4 * j + 2 * r + 1] * vs.y) * inverse[r]);
      }
    }
  }

  // The e4m3 output: the bf16 values write_output would store, quantized in the out projection's
  // blocks of 128 queries × this head (kTiles; attention_e4m3_tile.cuh): bit for bit
  // quantize_blocks_fp8 on the bf16 output of the same kernel. The pair of CTAs (always a cluster
  // of 2 here) holds three blocks: consumers 0 and 1 of rank 0, 1 and 2 of rank 1, and the middle
  // block's halves, rank 0's consumer 2 and rank 1's consumer 0, whose amax each sends the other
  // through distributed shared memory. Both CTAs of a pair run this, a padding one too (no valid
  // rows: amax 0, nothing stored). warp_amax, split_amax: this CTA's amax words.
  __device__ void write_output_e4m3(const float (&o)[64], const float (&row_sum)[2], uint32_t* warp_amax,
                                   const uint32_t* split_amax) const {
    static_assert(kCluster == 2, "the middle scale block straddles the pair");
    const float inverse[2] = {1.0f / row_sum[0], 1.0f / row_sum[1]};
    const float* v_scale = p.v_scale + head * kHeadDim;
    uint32_t y[2][kHeadDim / 8];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const int channel = 8 * j + 2 * (lane % 4);
        const float2 vs = __ldg(reinterpret_cast<const float2*>(v_scale + channel));
        y[r][j] = pack_bf16x2((o[4 * j + 2 * r] * vs.x) * inverse[r], (o[4 * j + 2 * r + 1] * vs.y) * inverse[r]);
      }
    }
    const int rows0 = q0 + consumer * kRowsPerConsumer;  // this consumer's first query
    const int row0 = rows0 + warp * 16 + lane / 4;
    const uint32_t warp_max = detail::warp_amax_of_rows(y, row0, p.nq);
    if (lane == 0) warp_amax[consumer * 4 + warp] = warp_max;
    named_barrier_sync(kBarrierEpilogue, kConsumerWarps * 32);
    const auto consumer_amax = [&](int c) {
      uint32_t amax = 0;
#pragma unroll
      for (int w = 0; w < 4; ++w) amax = fp8_max_bits(amax, warp_amax[4 * c + w]);
      return amax;
    };
    const uint32_t rank = cluster_cta_rank();
    uint32_t amax = consumer_amax(consumer);
    if (consumer == (rank == 0 ? 2 : 0)) {  // a half of the middle block
      if (warp == 0 && lane == 0) {
        send_to_cluster_cta(smem + kSmemSplitAmax, amax, bars + 8 * kSplitAmax, rank ^ 1);
      }
      mbarrier_wait_cluster(bars + 8 * kSplitAmax, 0);
      amax = fp8_max_bits(amax, *split_amax);
    } else {
      amax = fp8_max_bits(amax, consumer_amax(rank == 0 ? 1 - consumer : 3 - consumer));
    }
    const Fp8RowScale s = fp8_row_scale(amax);
    const int block = rows0 / kScaleBlockQ;
    if (rows0 % kScaleBlockQ == 0 && rows0 < p.nq && warp == 0 && lane == 0) {
      p.code_scales[block * p.code_scale_row + head] = s.scale;
    }
    const detail::E4m3TileOut out{p.codes, p.code_row, p.code_scales, p.code_scale_row};
    detail::store_e4m3_rows(y, out, s, head, row0, p.nq, lane);
  }
};

// The key sweep, serial within the consumer: for tile t, P_{t−1} is packed, (P·V)_{t−1} issued and
// retired one channel half at a time (each added to O as O·alpha + half, the row sums with the
// second), then S_t = Q·K_tᵀ issued and retired, and its softmax run. Nothing of this consumer is
// in flight during its softmax, so its registers hold S and O plus one half's accumulator and P8
// at a time; the other two consumers' products and softmaxes fill the tensor pipe and the exp2
// unit meanwhile.
template <bool kTimeline, int kCluster>
__device__ __forceinline__ void sweep(const Consumer<kCluster>& w, uint32_t (&s)[64], float (&o)[64],
                                      float (&row_max)[2], float (&row_sum)[2]) {
  const Int8Fp8Params& p = w.p;
  float acc_a[32];  // the first half of one tile's P·V
  float acc_b[36];  // the second half, and the row sums in 32..35
  uint32_t pk[16];  // P8 of the tile whose P·V runs
  float alpha[2];   // of the tile just softmaxed: rescales O before its P·V is added
  w.first_tile(s, row_max, alpha);
  if constexpr (kTimeline) {
    if (w.consumer == 0 && w.warp == 0 && w.lane == 0) mark_cta(p, w.tiles, CtaMark::kFirstTile);
  }
  for (int tile = 1; tile <= w.tiles; ++tile) {
    const int stage = tile % kStages;  // slot t: K_t and Vᵀ_{t−1}
    w.template mark<kTimeline>(Int8Fp8TimelineEvent::kTileStart, tile);
    pack_p(s, pk);  // P_{t−1}
    if (tile >= 2) w.release_slot(tile - 1);  // K_{t−1} and Vᵀ_{t−2}: both products retired
    w.wait_slot(tile);
    w.template mark<kTimeline>(Int8Fp8TimelineEvent::kOperandsReady, tile);
    issue_pv_half<0>(acc_a, pk, w.v_desc(stage));
    wgmma_wait<0>();
    pin_registers(acc_a);
    accumulate_half<0>(o, acc_a, alpha);
    w.template mark<kTimeline>(Int8Fp8TimelineEvent::kFirstHalfAdded, tile);
    issue_pv_half<1>(acc_b, pk, w.v_desc(stage));
    wgmma_wait<0>();
    pin_registers(acc_b);
    pin_registers(pk);  // read by the products until here: its registers stay unallocated
    accumulate_second_half(o, row_sum, acc_b, alpha);
    w.template mark<kTimeline>(Int8Fp8TimelineEvent::kProductAdded, tile);
    if (tile == w.tiles) break;  // slot `tiles` holds the last Vᵀ alone
    issue_qk(s, w.q_desc(), w.k_desc(stage));
    const float c = w.tile_factor(tile);
    w.template mark<kTimeline>(Int8Fp8TimelineEvent::kIssued, tile);
    wgmma_wait<0>();
    pin_registers(s);
    w.template mark<kTimeline>(Int8Fp8TimelineEvent::kScoresReady, tile);
    softmax_tile(s, c, row_max, alpha, tile * kBlockK, p.nk, w.lane, ~p.all_ones,
                 [&] { w.template mark<kTimeline>(Int8Fp8TimelineEvent::kFirstMaxDone, tile); });
    w.template mark<kTimeline>(Int8Fp8TimelineEvent::kSoftmaxDone, tile);
  }
  if constexpr (kTimeline) {
    if (w.warp == 0 && w.lane == 0) mark_cta(p, w.tiles, CtaMark::kSweepDone);
  }
  // No load waits for the last slot, but with clusters each producer waits for the cluster's last
  // releases before its CTA may exit (slots 0 .. tiles − 1 went in the sweep).
  if constexpr (kCluster > 1) w.release_slot(w.tiles);
}

// A consumer's sweep and epilogue.
template <bool kTimeline, bool kE4m3Out, int kCluster>
__device__ __forceinline__ void consume(const Consumer<kCluster>& w, uint32_t* warp_amax, const uint32_t* split_amax) {
  static_assert(!kTimeline || !kE4m3Out, "the timeline instance has the bf16 output");
  uint32_t s[64];  // S: [64 rows, 128 keys] int32, then the bits of P·448 (fp32)
  float o[64];     // O: [64 rows, 128 channels]
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  sweep<kTimeline, kCluster>(w, s, o, row_max, row_sum);
  if constexpr (kE4m3Out) {
    w.write_output_e4m3(o, row_sum, warp_amax, split_amax);  // a padding block too: the pair exchanges
  } else {
    if (kCluster > 1 && w.q0 >= w.p.nq_pad) return;  // a cluster's padding block: nothing to store
    w.write_output(o, row_sum);
  }
}

// ---- the kernel ------------------------------------------------------------------------------------------

// kTimeline: the diagnostics instance (attention_int8fp8_timeline); the same operations plus the
// clock marks of one CTA. kE4m3Out: the output as e4m3 codes with one scale per 128-query block
// (attention_int8fp8_quantized_e4m3), always in pairs. kCluster: CTAs sharing each K / Vᵀ load
// (1 or 2).
template <bool kTimeline, bool kE4m3Out, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    attention_int8fp8_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                             const __grid_constant__ CUtensorMap v_map, const Int8Fp8Params p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw);
  const uint32_t smem = (raw + kSmemAlignment - 1) & ~static_cast<uint32_t>(kSmemAlignment - 1);
  const uint32_t bars = smem + kSmemBarriers;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const int q0 = static_cast<int>(blockIdx.x) * kBlockQ;
  const int head = static_cast<int>(blockIdx.y);
  const int tiles = p.nk_pad / kBlockK;
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
    mbarrier_init(bars + 8 * kSplitAmax, 1);  // the other CTA's half of the middle scale block
    mbarrier_init_fence();
  }
  // The ones rows after each Vᵀ stage, written through the generic proxy and read by wgmma
  // through the async proxy: fenced before the barrier.
  if (warpgroup == 0) {
    unsigned char* smem_ptr = smem_raw + (smem - raw);
    for (int i = static_cast<int>(threadIdx.x); i < kStages * kOnesBytes / 4; i += kWarpgroupThreads) {
      const int stage = i / (kOnesBytes / 4), word = i % (kOnesBytes / 4);
      reinterpret_cast<uint32_t*>(smem_ptr + kSmemV + stage * kVStageBytes + kVTileBytes)[word] = 0x38383838u;
    }
    fence_proxy_async_shared();
  }
  // Everything above is set-up, which may run under the quantize pass's last blocks; the
  // workspace that pass writes is read only after this (dependent_launch.cuh).
  wait_for_prerequisite_grid();
  // The last CTA-wide barrier (the producer's idle warps exit below); with clusters, it also keeps
  // each CTA's loads and arrivals off the other's barriers until those are initialised.
  if constexpr (kCluster == 1) {
    __syncthreads();
  } else {
    cluster_sync();
  }

  if (warpgroup == 0) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) {
      produce<kCluster>(&q_map, &k_map, &v_map, smem, bars, head * p.nq_pad + q0, head * p.nk_pad, head * kHeadDim,
                        tiles, kCluster == 1 ? 0u : cluster_cta_rank());
    }
  } else {
    claim_registers<kConsumerRegisters>();
    unsigned char* aligned = smem_raw + (smem - raw);
    consume<kTimeline, kE4m3Out, kCluster>(Consumer<kCluster>(p, smem, bars, q0, head, tiles, warpgroup - 1),
                                           reinterpret_cast<uint32_t*>(aligned + kSmemWarpAmax),
                                           reinterpret_cast<const uint32_t*>(aligned + kSmemSplitAmax));
    // The first thread of each consumer, once its epilogue is done: the latest count.
    if constexpr (kTimeline) {
      if (threadIdx.x % kWarpgroupThreads == 0) mark_cta(p, tiles, CtaMark::kEnd);
    }
  }
}

// ---- host: tensor maps and launch -------------------------------------------------------------------

using hopper::cluster_dimension;
using hopper::cluster_grid;
using hopper::EncodeTiled;
using hopper::tensor_map_encoder;

// A [rows, width] byte matrix (rows `width` bytes apart) as a 2-d tensor map {width, rows} with
// [box_rows, 128] boxes and the 128-byte swizzle.
Status encode_bytes(EncodeTiled encode, CUtensorMap* map, const char* name, void* data, int64_t width, int64_t rows,
                    int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(width)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kRowBytes), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, data, dims, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return unimplemented(std::string("attention_int8fp8: the driver rejects the tensor map of ") + name +
                         " (CUresult " + std::to_string(static_cast<int>(result)) + ")");
  }
  return ok_status();
}

}  // namespace

namespace {

// The bf16 output's checks.
Status check_output(const Int8Fp8Workspace& ws, const TensorView& out) {
  const std::string what = "attention_int8fp8: " + describe_view("out", out);
  if (out.device != Device::kCuda || out.dtype != DType::kBF16) return invalid_argument(what + " must be BF16 on the device");
  if (out.rank() != 3 || out.shape[0] != ws.nq || out.shape[1] != ws.heads || out.shape[2] != kHeadDim ||
      out.strides[2] != 1) {
    return invalid_argument(what + " must be [" + std::to_string(ws.nq) + ", " + std::to_string(ws.heads) +
                            ", 128] with unit stride on D");
  }
  if (reinterpret_cast<uintptr_t>(out.data) % 4 != 0 || (out.shape[0] > 1 && out.strides[0] % 2 != 0) ||
      (out.shape[1] > 1 && out.strides[1] % 2 != 0)) {
    return invalid_argument(what + ": the pointer and N / H strides must be multiples of 4 bytes");
  }
  return ok_status();
}

// The e4m3 output's checks: codes [Nq, H·128] with 2-byte aligned rows (the epilogue stores pairs),
// scales in cpu::Fp8BlockLayout::kTiles, [Nq_pad / 128, round_up(H, 4)] contiguous.
Status check_e4m3_output(const Int8Fp8Workspace& ws, const TensorView& codes, const TensorView& scales) {
  const std::string op = "attention_int8fp8_quantized_e4m3";
  VORTEX_RETURN_IF_ERROR(cpu::check_fp8_blocks_output(codes, scales, ws.nq, ws.heads * kHeadDim,
                                                      cpu::Fp8BlockLayout::kTiles, Device::kCuda, op));
  if (reinterpret_cast<uintptr_t>(codes.data) % 2 != 0 || (ws.nq > 1 && codes.strides[0] % 2 != 0)) {
    return invalid_argument(op + " codes: the pointer and the row stride must be multiples of 2 bytes");
  }
  return ok_status();
}

// The CTAs of one head: the padded queries (whole Q scale blocks) in blocks of 192; the last may
// reach past them, into rows whose outputs are not stored.
int64_t cta_count(int64_t nq_pad) { return (nq_pad + kBlockQ - 1) / kBlockQ; }

// Encodes the tensor maps and launches an instance; `timeline` (kTimeline only) is
// [12 consumer warps][tiles][events] of device memory. The output's checks are the caller's.
template <bool kTimeline, bool kE4m3Out, int kCluster>
Status launch(const Int8Fp8Workspace& ws, const TensorView* out, const TensorView* codes, const TensorView* scales,
              float scale, long long* timeline, cudaStream_t stream) {
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    return invalid_argument("attention_int8fp8: scale must be finite and > 0, got " + std::to_string(scale));
  }
  const EncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr) return unimplemented("attention_int8fp8: the driver offers no cuTensorMapEncodeTiled");
  CUtensorMap q_map, k_map, v_map;
  VORTEX_RETURN_IF_ERROR(encode_bytes(encode, &q_map, "q8", ws.q, kHeadDim, ws.heads * ws.nq_pad, kBlockQ));
  VORTEX_RETURN_IF_ERROR(
      encode_bytes(encode, &k_map, "k8", ws.k, kHeadDim, ws.heads * ws.nk_pad, kSliceRows<kCluster>));
  VORTEX_RETURN_IF_ERROR(
      encode_bytes(encode, &v_map, "vt8", ws.vt, ws.nk_pad, ws.heads * kHeadDim, kSliceRows<kCluster>));

  Int8Fp8Params params{};
  if (out != nullptr) {
    params.out = static_cast<__nv_bfloat16*>(out->data);
    params.out_row = out->strides[0];
    params.out_head = out->strides[1];
  }
  if (codes != nullptr) {
    params.codes = static_cast<uint8_t*>(codes->data);
    params.code_row = codes->strides[0];
    params.code_scales = static_cast<float*>(scales->data);
    const cpu::Fp8BlockScales at = cpu::fp8_block_scales(cpu::Fp8BlockLayout::kTiles, ws.nq, ws.heads * kHeadDim);
    params.code_scale_row = static_cast<int>(at.row_block_stride);
    VORTEX_RETURN_IF_ERROR(zero_block_scale_padding(*scales, ws.nq, ws.heads * kHeadDim, stream));
  }
  params.heads = static_cast<int>(ws.heads);
  params.q_scale = ws.q_scale;
  params.k_scale = ws.k_scale;
  params.v_scale = ws.v_scale;
  params.nq = static_cast<int>(ws.nq);
  params.nk = static_cast<int>(ws.nk);
  params.nq_pad = static_cast<int>(ws.nq_pad);
  params.nk_pad = static_cast<int>(ws.nk_pad);
  params.q_blocks = static_cast<int>(ws.nq_pad / kInt8Fp8QBlock);
  params.k_blocks = static_cast<int>(ws.nk_pad / kInt8Fp8KBlock);
  params.scale_log2 = scale * kLog2e;
  params.all_ones = ~0u;
  // The middle query block of the middle head: a CTA of a wave in full flight.
  params.timeline = timeline;
  params.timeline_block = static_cast<int>(cta_count(ws.nq_pad) / 2);
  params.timeline_head = static_cast<int>(ws.heads / 2);

  const auto kernel = attention_int8fp8_kernel<kTimeline, kE4m3Out, kCluster>;
  VORTEX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  // x fastest: the CTAs resident at one time share a head, so its K and Vᵀ stay in L2. The query
  // blocks are padded to whole clusters; a padding block loads its share and stores nothing.
  cudaLaunchConfig_t config{};
  config.gridDim = cluster_grid(cta_count(ws.nq_pad), kCluster, ws.heads);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  // The kernel's set-up runs under the end of the kernel before it (the quantize pass).
  cudaLaunchAttribute attributes[2] = {cluster_dimension(kCluster), programmatic_serialization()};
  config.attrs = attributes;
  config.numAttrs = 2;
  VORTEX_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, q_map, k_map, v_map, params));
  return ok_status();
}

// The cluster size a caller's cluster_ctas means for this workspace (resolve_cluster_ctas).
Result<int> cluster_for(int cluster_ctas, const Int8Fp8Workspace& ws) {
  return hopper::resolve_cluster_ctas("attention_int8fp8", cluster_ctas, ws.nq, ws.nk, ws.heads);
}

// launch's instance for clusters of cluster_ctas (as cluster_for resolves it).
template <bool kTimeline, bool kE4m3Out>
Status launch_clustered(int cluster_ctas, const Int8Fp8Workspace& ws, const TensorView* out, const TensorView* codes,
                        const TensorView* scales, float scale, long long* timeline, cudaStream_t stream) {
  if constexpr (kE4m3Out) {
    // The middle scale block of a pair straddles its two CTAs (write_output_e4m3).
    if (cluster_ctas != 0 && cluster_ctas != 2) {
      return invalid_argument("attention_int8fp8_quantized_e4m3: cluster_ctas must be 0 or 2 (the e4m3 output runs "
                              "in pairs of CTAs), got " + std::to_string(cluster_ctas));
    }
    return launch<kTimeline, true, 2>(ws, out, codes, scales, scale, timeline, stream);
  } else {
    VORTEX_ASSIGN_OR_RETURN(const int cluster, cluster_for(cluster_ctas, ws));
    if (cluster == 1) return launch<kTimeline, false, 1>(ws, out, codes, scales, scale, timeline, stream);
    return launch<kTimeline, false, 2>(ws, out, codes, scales, scale, timeline, stream);
  }
}

}  // namespace

int attention_int8fp8_cluster_ctas(int64_t nq, int64_t nk, int64_t heads) {
  return hopper::multicast_cluster_ctas(nq, nk, heads);
}

Status attention_int8fp8_quantized(const Int8Fp8Workspace& ws, const TensorView& out, float scale,
                                   cudaStream_t stream, int cluster_ctas) {
  VORTEX_RETURN_IF_ERROR(check_output(ws, out));
  return launch_clustered<false, false>(cluster_ctas, ws, &out, nullptr, nullptr, scale, nullptr, stream);
}

Status attention_int8fp8_quantized_e4m3(const Int8Fp8Workspace& ws, const TensorView& codes, const TensorView& scales,
                                        float scale, cudaStream_t stream, int cluster_ctas) {
  VORTEX_RETURN_IF_ERROR(check_e4m3_output(ws, codes, scales));
  return launch_clustered<false, true>(cluster_ctas, ws, nullptr, &codes, &scales, scale, nullptr, stream);
}

Result<KernelTimeline> attention_int8fp8_timeline(const Int8Fp8Workspace& ws, const TensorView& out, float scale,
                                                  cudaStream_t stream, int cluster_ctas) {
  std::vector<std::string> events = {"tile start (P_t-1 to pack)",
                                     "P_t-1 packed, K_t and V_t-1 landed",
                                     "first half of PV_t-1 added",
                                     "second half of PV_t-1 added",
                                     "QK_t issued",
                                     "scores landed",
                                     "first row maximum done",
                                     "softmax done"};
  static_assert(static_cast<int>(Int8Fp8TimelineEvent::kCount) == 8, "one name per event");
  VORTEX_ASSIGN_OR_RETURN(const int cluster, cluster_for(cluster_ctas, ws));
  const dim3 grid = cluster_grid(cta_count(ws.nq_pad), cluster, ws.heads);
  VORTEX_ASSIGN_OR_RETURN(KernelTimeline timeline,
                          record_timeline(std::move(events), kConsumerWarps,
                                          static_cast<int>(ws.nk_pad / kBlockK),
                                          static_cast<int>(grid.x * grid.y), stream,
                                          [&](long long* marks) -> Status {
                                            VORTEX_RETURN_IF_ERROR(check_output(ws, out));
                                            return launch_clustered<true, false>(cluster, ws, &out, nullptr, nullptr,
                                                                                 scale, marks, stream);
                                          }));
  timeline.cluster_ctas = cluster;
  return timeline;
}

Status attention_int8fp8(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         float scale, DeviceArena& scratch, cudaStream_t stream) {
  if (q.rank() != 3 || k.rank() != 3) {
    return invalid_argument("attention_int8fp8: q and k must be [N, H, D], got " + describe_view("q", q) + ", " +
                            describe_view("k", k));
  }
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    return invalid_argument("attention_int8fp8: scale must be finite and > 0, got " + std::to_string(scale));
  }
  const size_t mark = scratch.mark();
  const Status status = [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(const Int8Fp8Workspace ws, int8fp8_workspace(scratch, q.shape[0], k.shape[0], q.shape[1]));
    VORTEX_RETURN_IF_ERROR(quantize_int8fp8(q, k, v, ws, stream));
    return attention_int8fp8_quantized(ws, out, scale, stream);
  }();
  scratch.release_to(mark);
  return status;
}

Result<KernelResources> attention_int8fp8_resources(int cluster_ctas) {
  const void* kernel = cluster_ctas == 2 ? reinterpret_cast<const void*>(attention_int8fp8_kernel<false, false, 2>)
                                         : reinterpret_cast<const void*>(attention_int8fp8_kernel<false, false, 1>);
  return kernel_resources(kernel, kSmemBytes);
}

}  // namespace vortex::cuda
