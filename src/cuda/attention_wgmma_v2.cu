// Exact attention on Hopper tensor cores, variant v2 of the attention family (contract in
// attention.h, entry in attention_wgmma_v2.h): for each head h and query i,
//
//   out[i, h, :] = Σ_j softmax_j(scale · q[i, h, :] · k[j, h, :]) · v[j, h, :]
//
// with bf16 q, k, v, fp32 scores, softmax and accumulation, P rounded to bf16 for the P·V product,
// and a bf16 output rounded once — v1's numerics and v1's per-tile pipeline (attention_wgmma.cu),
// head dim 128 only. What v2 changes (bench/notes/attention.md has the predictions):
//   - 176-key K/V tiles (FlashAttention-3's choice for D = 128), compiled beside 128-key tiles; the
//     host takes 176 unless it pads more keys than 128 (attention_v2_key_tile). Every fixed
//     per-tile cost (barrier waits and releases, the ping-pong sync, row-max shuffles, the
//     rescale of O) is paid once per 176 keys instead of 128.
//   - A persistent grid: one CTA per SM loops over (block of 128 queries, head) items, query
//     block fastest, so the items in flight share one or two heads' K/V in L2. The K/V ring and
//     its mbarrier phases run on across items; each consumer releases Q as soon as its last
//     Q·Kᵀ of an item completes, so the producer loads the next item's Q and first K/V tiles
//     under the last softmax, P·V and epilogue.
//   - The epilogue stores O / row sum from the accumulator registers (each quad writes 16
//     contiguous bytes of a row), so Q's shared memory is never staging space and can be
//     refilled early.
// Roles: warpgroup 0 = producer (one thread issues TMA), warpgroups 1, 2 = consumers of 64 query
// rows each, ping-ponging their products through two named barriers (as v1).
#include "cuda/attention_wgmma_v2.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/hopper_primitives.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {
namespace {

using namespace hopper;

// ---- tile configuration ---------------------------------------------------------------------------

constexpr int kHeadDim = 128;
// wgmma's M: one warpgroup owns 64 query rows for an item's whole key sweep (row statistics stay
// in registers).
constexpr int kRowsPerConsumer = 64;
// Two consumer warpgroups share each K/V tile (halves the L2→SM traffic of 64-row CTAs).
constexpr int kConsumers = 2;
constexpr int kBlockQ = kConsumers * kRowsPerConsumer;
// Two stages: the loads of tile j+1 run under the products of tile j; a third stage of 176 keys
// does not fit (32 + 3 · 88 KB > 227 KB).
constexpr int kStages = 2;

constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
constexpr int kConsumerWarps = kConsumers * kWarpgroupThreads / 32;
// setmaxnreg budgets: the producer only computes coordinates and barrier addresses; a consumer
// holds S (88 at 176 keys) + O (64) + P (44) + softmax state. 128·24 + 256·240 = 64,512 of 65,536.
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
static_assert(register_budgets_fit(kProducerRegisters, kConsumers, kConsumerRegisters),
              "register budgets exceed the register file");

// 128-byte swizzle boxes are [rows, 64 channels]; a 128-channel tile is two column halves.
constexpr int kHalfChannels = kSwizzleBytes / 2;
constexpr int kHalves = kHeadDim / kHalfChannels;
constexpr int kQHalfBytes = kBlockQ * kSwizzleBytes;
constexpr int kQTileBytes = kHalves * kQHalfBytes;
// The opt-in shared-memory limit of one sm_90 block.
constexpr int kMaxSmemBytes = 227 * 1024;

enum MbarrierIndex : int {
  kFullQ = 0,                      // Q tile landed (TMA transaction bytes)
  kEmptyQ = 1,                     // every consumer warp has finished its last Q·Kᵀ of the item
  kFullK = 2,                      // [kStages]: K tile landed
  kFullV = kFullK + kStages,       // [kStages]: V tile landed
  kEmptyK = kFullV + kStages,      // [kStages]: every consumer warp has finished reading the K tile
  kEmptyV = kEmptyK + kStages,     // [kStages]: ... the V tile
  kMbarrierCount = kEmptyV + kStages
};
constexpr int kSmemAlignment = 1024;  // tiles start on a swizzle period (descriptor base offset 0)

// Named barriers (0 is __syncthreads): consumer c waits on kBarrierSchedule + c before issuing
// its products and then releases the other consumer's.
constexpr int kBarrierSchedule = 1;

constexpr float kLog2e = 1.4426950408889634f;

// Everything that depends on the key-tile size. Shared memory from a 1024-byte aligned base:
// Q [2 halves][128 rows][64], K and V [kStages][2 halves][kBlockK keys][64], then the mbarriers.
template <int kBlockK>
struct KeyTile {
  static_assert(kBlockK % 16 == 0 && kBlockK <= 256, "wgmma N and k16 steps of P·V");
  static constexpr int kScores = kBlockK / 2;  // S accumulators per thread: 64 rows × kBlockK / 128
  static constexpr int kPacked = kBlockK / 4;  // P as bf16x2 A-fragment registers
  static constexpr int kKVHalfBytes = kBlockK * kSwizzleBytes;
  static constexpr int kKVTileBytes = kHalves * kKVHalfBytes;
  static constexpr int kSmemQ = 0;
  static constexpr int kSmemK = kSmemQ + kQTileBytes;
  static constexpr int kSmemV = kSmemK + kStages * kKVTileBytes;
  static constexpr int kSmemBarriers = kSmemV + kStages * kKVTileBytes;
  static constexpr int kSmemBytes = kSmemBarriers + kMbarrierCount * 8 + kSmemAlignment;  // slack to align
  static_assert(kKVHalfBytes % kSwizzlePeriodBytes == 0, "every tile half starts on a swizzle period");
  static_assert(kSmemBytes <= kMaxSmemBytes, "shared memory");
};

// ---- params --------------------------------------------------------------------------------------

struct V2Params {
  __nv_bfloat16* out;  // [Nq, H, 128]
  int64_t out_row, out_head;  // strides, elements
  int nq, nk;
  int q_blocks;  // ceil(Nq / 128)
  int items;     // q_blocks · H work items
  int tiles;     // K/V tiles per item
  float scale_log2;  // scale · log2(e): softmax by exp2
};

// ---- scheduler -----------------------------------------------------------------------------------

// Static round robin: CTA b takes items b, b + gridDim.x, ... Query block fastest: the ~132 items
// in flight at a time belong to one or two heads, whose K and V (19 MB each at N = 37,810) stay in
// L2. Every role of a CTA walks the same sequence.
struct WorkItem {
  int q0, head;
};
__device__ __forceinline__ WorkItem work_item(const V2Params& p, int item) {
  return {(item % p.q_blocks) * kBlockQ, item / p.q_blocks};
}

// ---- softmax helpers ------------------------------------------------------------------------------

// Accumulator layout of m64nNk16 (fp32): thread t of the warpgroup holds rows 16·(t/32) + (t%32)/4
// (elements 4j, 4j+1) and that + 8 (4j+2, 4j+3), columns 8j + 2·(t%4) and + 1, for j < N/8.

// Keys at or past nk (only in an item's last tile) get −inf scores, hence zero weights.
template <int kBlockK>
__device__ __forceinline__ void mask_tail_keys(float (&s)[kBlockK / 2], int key0, int nk, int lane) {
#pragma unroll
  for (int j = 0; j < kBlockK / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (key0 + 8 * j + 2 * (lane % 4) + (e % 2) >= nk) s[4 * j + e] = -INFINITY;
    }
  }
}

// Online softmax of one tile for this thread's two rows (v1's): new running max over the quad,
// alpha = exp2((m_old − m_new)·scale·log2e) (0 on the first tile), S → P = exp2(S·scale·log2e −
// m_new·scale·log2e) in place, and this lane's share of the row sum (quad shares added once, in
// the epilogue).
template <int kBlockK>
__device__ __forceinline__ void online_softmax(float (&s)[kBlockK / 2], float (&row_max)[2], float (&row_sum)[2],
                                               float (&alpha)[2], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float max0 = row_max[r], max1 = row_max[r];  // two chains: half the dependent latency
#pragma unroll
    for (int j = 0; j < kBlockK / 8; ++j) {
      max0 = fmaxf(max0, s[4 * j + 2 * r]);
      max1 = fmaxf(max1, s[4 * j + 2 * r + 1]);
    }
    float new_max = fmaxf(max0, max1);
    new_max = fmaxf(new_max, __shfl_xor_sync(0xffffffffu, new_max, 1));
    new_max = fmaxf(new_max, __shfl_xor_sync(0xffffffffu, new_max, 2));
    // Finite from the first tile on: key 0 of every tile is valid and a valid score is finite.
    alpha[r] = fast_exp2((row_max[r] - new_max) * scale_log2);
    row_max[r] = new_max;
    exponentiate_row(s, r, row_max, row_sum, alpha, scale_log2);
  }
}

// P (fp32, accumulator layout) → bf16 A fragments of P·V: register i packs s[2i], s[2i+1] (key
// step s takes accumulator columns j = 2s, 2s+1, i.e. elements 8s..8s+7 in A-fragment order).
template <int kBlockK>
__device__ __forceinline__ void pack_p(const float (&s)[kBlockK / 2], uint32_t (&p)[kBlockK / 4]) {
#pragma unroll
  for (int i = 0; i < kBlockK / 4; ++i) p[i] = pack_bf16x2(s[2 * i], s[2 * i + 1]);
}

__device__ __forceinline__ void rescale(float (&o)[64], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// ---- consumer products ----------------------------------------------------------------------------

// S = Q·Kᵀ for this warpgroup's 64 rows and one tile: 8 k16 steps over D, one commit group.
template <int kBlockK>
__device__ __forceinline__ void issue_qk(float (&s)[kBlockK / 2], uint64_t q_desc, uint64_t k_desc) {
  wgmma_fence();
  wgmma_ss<0>(s, q_desc, k_desc);
#pragma unroll
  for (int step = 1; step < kHeadDim / 16; ++step) {
    wgmma_ss<1>(s, q_desc + k_major_step(step, kQHalfBytes),
                k_desc + k_major_step(step, KeyTile<kBlockK>::kKVHalfBytes));
  }
  wgmma_commit();
}

// O += P·V for one tile: kBlockK / 16 k16 steps over the keys, 16 keys = 2048 bytes of V each.
template <int kBlockK>
__device__ __forceinline__ void issue_pv(float (&o)[64], uint32_t (&p)[kBlockK / 4], uint64_t v_desc) {
  pin_registers(o);
  pin_registers(p);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kBlockK / 16; ++step) {
    wgmma_m64n128k16_rs(o, p[4 * step], p[4 * step + 1], p[4 * step + 2], p[4 * step + 3],
                        v_desc + static_cast<uint64_t>((step * 16 * kSwizzleBytes) >> 4));
  }
  wgmma_commit();
}

// ---- producer: global → shared (TMA) ---------------------------------------------------------------

// `ring` counts the K/V tiles loaded over all of this CTA's items: stage ring % kStages, parity
// (ring / kStages) & 1. The consumers count the same way.
template <int kBlockK>
__device__ __forceinline__ void produce(const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        uint32_t smem, uint32_t bars, const V2Params& p) {
  using T = KeyTile<kBlockK>;
  prefetch_tensor_map(q_map);
  prefetch_tensor_map(k_map);
  prefetch_tensor_map(v_map);
  uint32_t ring = 0;
  uint32_t n = 0;  // items done by this CTA
  for (int item = static_cast<int>(blockIdx.x); item < p.items; item += static_cast<int>(gridDim.x), ++n) {
    const WorkItem w = work_item(p, item);
    // The previous item's Q is free once every consumer warp has finished its last Q·Kᵀ (the
    // first wait, parity 1 on a fresh barrier, returns at once).
    mbarrier_wait(bars + 8 * kEmptyQ, (n & 1) ^ 1);
    mbarrier_arrive_expect_tx(bars + 8 * kFullQ, kQTileBytes);
    for (int h = 0; h < kHalves; ++h) {
      tma_load(smem + T::kSmemQ + h * kQHalfBytes, q_map, h * kHalfChannels, w.head, w.q0, bars + 8 * kFullQ);
    }
    for (int tile = 0; tile < p.tiles; ++tile, ++ring) {
      const int stage = static_cast<int>(ring % kStages);
      const uint32_t parity = (ring / kStages) & 1;
      const int key0 = tile * kBlockK;
      // Wait for both consumers to have released this stage's previous occupant (ring − kStages).
      mbarrier_wait(bars + 8 * (kEmptyK + stage), parity ^ 1);
      mbarrier_arrive_expect_tx(bars + 8 * (kFullK + stage), T::kKVTileBytes);
      for (int h = 0; h < kHalves; ++h) {
        tma_load(smem + T::kSmemK + stage * T::kKVTileBytes + h * T::kKVHalfBytes, k_map, h * kHalfChannels, w.head,
                 key0, bars + 8 * (kFullK + stage));
      }
      mbarrier_wait(bars + 8 * (kEmptyV + stage), parity ^ 1);
      mbarrier_arrive_expect_tx(bars + 8 * (kFullV + stage), T::kKVTileBytes);
      for (int h = 0; h < kHalves; ++h) {
        tma_load(smem + T::kSmemV + stage * T::kKVTileBytes + h * T::kKVHalfBytes, v_map, h * kHalfChannels, w.head,
                 key0, bars + 8 * (kFullV + stage));
      }
    }
  }
}

// ---- consumer: epilogue ------------------------------------------------------------------------------

// O / row sum → bf16 → out, straight from the accumulator layout: per j and row, the quad's four
// 4-byte stores cover 16 contiguous bytes; tail queries are skipped.
__device__ __forceinline__ void store_output(const V2Params& p, const float (&o)[64], const float (&row_sum)[2],
                                             WorkItem w, int consumer, int warp, int lane) {
  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inverse[r] = 1.0f / sum;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = w.q0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4 + 8 * r;
    if (query >= p.nq) continue;
    __nv_bfloat16* row = p.out + static_cast<int64_t>(query) * p.out_row + w.head * p.out_head + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      *reinterpret_cast<uint32_t*>(row + 8 * j) =
          pack_bf16x2(o[4 * j + 2 * r] * inverse[r], o[4 * j + 2 * r + 1] * inverse[r]);
    }
  }
}

// ---- consumer: the key sweeps ------------------------------------------------------------------------

template <int kBlockK>
__device__ __forceinline__ void consume(const V2Params& p, uint32_t smem, uint32_t bars, int consumer) {
  using T = KeyTile<kBlockK>;
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32;
  const int schedule_mine = kBarrierSchedule + consumer, schedule_other = kBarrierSchedule + (1 - consumer);
  constexpr int kScheduleThreads = 2 * kWarpgroupThreads;

  const uint64_t q_desc = k_major_descriptor(smem + T::kSmemQ + consumer * kRowsPerConsumer * kSwizzleBytes);
  const auto k_desc = [&](int stage) { return k_major_descriptor(smem + T::kSmemK + stage * T::kKVTileBytes); };
  const auto v_desc = [&](int stage) {
    return mn_major_descriptor(smem + T::kSmemV + stage * T::kKVTileBytes, T::kKVHalfBytes);
  };
  const auto release = [&](int barrier) {
    if (lane == 0) mbarrier_arrive(bars + 8 * barrier);
  };
  const auto full_k = [&](uint32_t ring) {
    mbarrier_wait(bars + 8 * (kFullK + static_cast<int>(ring % kStages)), (ring / kStages) & 1);
  };
  const auto full_v = [&](uint32_t ring) {
    mbarrier_wait(bars + 8 * (kFullV + static_cast<int>(ring % kStages)), (ring / kStages) & 1);
  };

  float s[T::kScores];      // S, then P in fp32: [64 rows, kBlockK keys] of the warpgroup
  float o[64];              // O: [64 rows, 128 channels]
  uint32_t pk[T::kPacked];  // P in bf16: A fragments of P·V

  // Ping-pong over issue slots numbered across all items: consumer c's k-th slot waits for the
  // other's (k−1)-th (consumer 1's first arrival stands in for consumer 0's slot −1). Consumer 1
  // skips its very last arrival, which nobody would wait for, so both barriers end balanced.
  if (consumer == 1) named_barrier_arrive(schedule_other, kScheduleThreads);

  uint32_t ring = 0;  // K/V tiles consumed over all items, as the producer counts them
  uint32_t n = 0;     // items done
  for (int item = static_cast<int>(blockIdx.x); item < p.items; item += static_cast<int>(gridDim.x), ++n) {
    const WorkItem w = work_item(p, item);
    const bool last_item = item + static_cast<int>(gridDim.x) >= p.items;
    const auto end_slot = [&](int tile) {
      if (consumer == 0 || !last_item || tile + 1 < p.tiles) named_barrier_arrive(schedule_other, kScheduleThreads);
    };
    // Q is read only by Q·Kᵀ: released with this item's last one.
    const auto after_qk = [&](int tile) {
      release(kEmptyK + static_cast<int>((ring + tile) % kStages));
      if (tile + 1 == p.tiles) release(kEmptyQ);
    };
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}, alpha[2];

    mbarrier_wait(bars + 8 * kFullQ, n & 1);

    // Tile 0: S only.
    full_k(ring);
    named_barrier_sync(schedule_mine, kScheduleThreads);
    issue_qk<kBlockK>(s, q_desc, k_desc(static_cast<int>(ring % kStages)));
    end_slot(0);
    wgmma_wait<0>();
    pin_registers(s);
    after_qk(0);
    if (kBlockK > p.nk) mask_tail_keys<kBlockK>(s, 0, p.nk, lane);
    online_softmax<kBlockK>(s, row_max, row_sum, alpha, p.scale_log2);
    pack_p<kBlockK>(s, pk);

    // Tile t: S_t = Q·K_tᵀ and O += P_{t−1}·V_{t−1} in flight together; softmax of S_t under P·V.
    for (int tile = 1; tile < p.tiles; ++tile) {
      const uint32_t current = ring + tile, previous = current - 1;
      full_k(current);
      full_v(previous);
      named_barrier_sync(schedule_mine, kScheduleThreads);
      issue_qk<kBlockK>(s, q_desc, k_desc(static_cast<int>(current % kStages)));
      rescale(o, alpha);  // O to the running max of tile t − 1, before P_{t−1}·V_{t−1} lands in it
      issue_pv<kBlockK>(o, pk, v_desc(static_cast<int>(previous % kStages)));
      end_slot(tile);
      wgmma_wait<1>();  // S_t done; P·V may still run
      pin_registers(s);
      after_qk(tile);
      const int key0 = tile * kBlockK;
      if (key0 + kBlockK > p.nk) mask_tail_keys<kBlockK>(s, key0, p.nk, lane);
      online_softmax<kBlockK>(s, row_max, row_sum, alpha, p.scale_log2);
      wgmma_wait<0>();  // P_{t−1}·V_{t−1} done: its P registers and V stage are free
      pin_registers(o);
      pin_registers(pk);
      release(kEmptyV + static_cast<int>(previous % kStages));
      pack_p<kBlockK>(s, pk);
    }

    // The item's last P·V; its V stage is released for the next item's tiles.
    const uint32_t last = ring + p.tiles - 1;
    full_v(last);
    rescale(o, alpha);
    issue_pv<kBlockK>(o, pk, v_desc(static_cast<int>(last % kStages)));
    wgmma_wait<0>();
    pin_registers(o);
    pin_registers(pk);
    release(kEmptyV + static_cast<int>(last % kStages));
    ring += p.tiles;

    store_output(p, o, row_sum, w, consumer, warp, lane);
  }
}

// ---- the kernel ------------------------------------------------------------------------------------------

template <int kBlockK>
__global__ void __launch_bounds__(kThreads, 1)
    attention_v2_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap v_map, const V2Params p) {
  using T = KeyTile<kBlockK>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw);
  const uint32_t smem = (raw + kSmemAlignment - 1) & ~static_cast<uint32_t>(kSmemAlignment - 1);
  const uint32_t bars = smem + T::kSmemBarriers;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;

  if (threadIdx.x == 0) {
    mbarrier_init(bars + 8 * kFullQ, 1);                 // the producer's arrive.expect_tx
    mbarrier_init(bars + 8 * kEmptyQ, kConsumerWarps);   // one arrival per consumer warp
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(bars + 8 * (kFullK + stage), 1);
      mbarrier_init(bars + 8 * (kFullV + stage), 1);
      mbarrier_init(bars + 8 * (kEmptyK + stage), kConsumerWarps);
      mbarrier_init(bars + 8 * (kEmptyV + stage), kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: the producer's idle warps exit below

  if (warpgroup == 0) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) produce<kBlockK>(&q_map, &k_map, &v_map, smem, bars, p);
  } else {
    claim_registers<kConsumerRegisters>();
    consume<kBlockK>(p, smem, bars, warpgroup - 1);
  }
}

// ---- host: launch ----------------------------------------------------------------------------------

template <int kBlockK>
Status launch_v2(const TensorView& q, const TensorView& k, const TensorView& v, V2Params params, EncodeTiled encode,
                 int grid, cudaStream_t stream) {
  constexpr int kSmem = KeyTile<kBlockK>::kSmemBytes;
  CUtensorMap q_map, k_map, v_map;
  VORTEX_RETURN_IF_ERROR(encode_head_view(encode, &q_map, "attention v2", "q", q, kHeadDim, kBlockQ));
  VORTEX_RETURN_IF_ERROR(encode_head_view(encode, &k_map, "attention v2", "k", k, kHeadDim, kBlockK));
  VORTEX_RETURN_IF_ERROR(encode_head_view(encode, &v_map, "attention v2", "v", v, kHeadDim, kBlockK));
  params.tiles = (params.nk + kBlockK - 1) / kBlockK;
  VORTEX_CUDA_CHECK(
      cudaFuncSetAttribute(attention_v2_kernel<kBlockK>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  attention_v2_kernel<kBlockK><<<grid, kThreads, kSmem, stream>>>(q_map, k_map, v_map, params);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

// Key-tile sizes v2 is compiled for: FlashAttention-3's 176 for D = 128, and 128 where 176 would pad.
constexpr int kLongKeyTile = 176;
constexpr int kShortKeyTile = 128;

}  // namespace

int attention_v2_key_tile(int64_t nk, V2KeyTiles tiles) {
  if (tiles == V2KeyTiles::kOfV1) return kShortKeyTile;
  const auto padded = [nk](int64_t tile) { return (nk + tile - 1) / tile * tile; };
  return padded(kLongKeyTile) <= padded(kShortKeyTile) ? kLongKeyTile : kShortKeyTile;
}

Status attention_wgmma_v2(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          float scale, cudaStream_t stream, V2KeyTiles tiles) {
  if (q.shape[2] != kHeadDim) return invalid_argument("attention v2: head dim must be 128");
  const int64_t q_blocks = (q.shape[0] + kBlockQ - 1) / kBlockQ;
  const int64_t items = q_blocks * q.shape[1];
  if (items > INT32_MAX) return unimplemented("attention v2: more than 2^31 work items");
  const EncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr) return unimplemented("attention v2: the driver offers no cuTensorMapEncodeTiled");

  V2Params params{};
  params.out = static_cast<__nv_bfloat16*>(out.data);
  params.out_row = out.strides[0];
  params.out_head = out.strides[1];
  params.nq = static_cast<int>(q.shape[0]);
  params.nk = static_cast<int>(k.shape[0]);
  params.q_blocks = static_cast<int>(q_blocks);
  params.items = static_cast<int>(items);
  params.scale_log2 = scale * kLog2e;

  // One CTA per SM (the shared memory admits no second); never more CTAs than items, so every
  // CTA has work and the ping-pong barriers end balanced.
  int device = 0, sms = 0;
  VORTEX_CUDA_CHECK(cudaGetDevice(&device));
  VORTEX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int grid = static_cast<int>(std::min<int64_t>(items, sms));

  return attention_v2_key_tile(params.nk, tiles) == kLongKeyTile
             ? launch_v2<kLongKeyTile>(q, k, v, params, encode, grid, stream)
             : launch_v2<kShortKeyTile>(q, k, v, params, encode, grid, stream);
}

Result<KernelResources> attention_v2_resources(int64_t nk, V2KeyTiles tiles) {
  if (attention_v2_key_tile(nk, tiles) == kLongKeyTile) {
    return kernel_resources(reinterpret_cast<const void*>(attention_v2_kernel<kLongKeyTile>),
                            KeyTile<kLongKeyTile>::kSmemBytes);
  }
  return kernel_resources(reinterpret_cast<const void*>(attention_v2_kernel<kShortKeyTile>),
                          KeyTile<kShortKeyTile>::kSmemBytes);
}

}  // namespace vortex::cuda
