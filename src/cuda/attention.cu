// Exact attention on tensor cores (contract in attention.h): for each head h and query i,
//
//   out[i, h, :] = Σ_j softmax_j(scale · q[i, h, :] · k[j, h, :]) · v[j, h, :]
//
// with bf16 q, k, v, fp32 scores, softmax and accumulation, and a bf16 output rounded once.
//
// Variants (VORTEX_VARIANT_ATTENTION=v0|v1|v2 selects; v1 ships where it applies):
//   v0  FlashAttention-2 style, one CTA per (block of kBlockQ queries, head). Each of its warps
//       owns 16 query rows for the whole key sweep, so the online softmax never leaves the
//       registers. K/V tiles of kBlockK keys stream through shared memory, two stages deep
//       (cp.async), and feed mma.sync m16n8k16 bf16 (fragments by ldmatrix):
//         S = Q·Kᵀ (fp32) → mask tail keys → row max / rescale / row sum in fp32 →
//         P = exp2(S·scale·log2e − m) rounded to bf16 → O += P·V (fp32).
//       The output is divided by the row sum, rounded to bf16, staged through shared memory and
//       written with 16-byte stores into the strided out view. Head dims 64 and 128 (template),
//       and 72 (the Qwen3-VL vision tower's) in 128-wide shared rows: its tiles are loaded as 80
//       columns, the last 8 zero-filled, so that Q·Kᵀ takes whole k16 steps (a zero column adds
//       exact zeros) and P·V whole n8 pairs, whose 8 extra output columns are not stored.
//       Rounding P to bf16 is the only rounding beyond the contract's; with the output's own
//       rounding it leaves ~2e-3 rel-L2 against the fp32 reference. The same kernel with the
//       causal mask and grouped key/value heads is causal_attention() (the text encoder's).
//   v1  FlashAttention-3 style on wgmma + TMA for head dims 128 and 64 (attention_wgmma.cu), the
//       default for them on 16-byte aligned views; the same numerics. Every other case runs v0's path.
//   v2  v1 on a persistent grid with 176-key tiles where they pad no more keys than 128 (head dim 128)
//       (attention_wgmma_v2.cu); the same numerics and the same fallback to v0.
// This file holds v0 and the dispatch (argument checks, variant choice) for the family, causal
// attention's included.
#include "cuda/attention.h"

#include "cuda/attention_fallback.h"
#include "cuda/attention_wgmma.h"
#include "cuda/attention_wgmma_v2.h"
#include "cuda/fp8_blocks.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cpu/fp8_blocks.h"
#include "cuda/hopper_primitives.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {
namespace {

// ---- tile configuration ---------------------------------------------------------------------------

// One m16 mma tile of query rows per warp: the softmax statistics of a row live in the 4 lanes
// of one quad, and S (32 fp32), O (64 fp32 at D = 128) and Q's fragments (32 registers at D = 128)
// fit in the register file without spilling.
constexpr int kRowsPerWarp = 16;
// Eight warps give 128 queries per CTA: every CTA re-reads its head's whole K and V from L2, so
// the L2→SM traffic is N²·H·D·4 bytes / kBlockQ — 128 keeps it near 2.7 TB/s at the canonical
// shape, where 64 would need 5.5 TB/s, about the L2's limit.
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockQ = kWarps * kRowsPerWarp;
// 64 keys per tile: S is 16×64 per warp (32 fp32 registers per thread); larger tiles cost
// registers, smaller ones double the per-tile barriers and softmax bookkeeping.
constexpr int kBlockK = 64;
// Two stages: the copies of tile j+1 run under the math of tile j.
constexpr int kStages = 2;
// bf16 elements in one 16-byte cp.async / ldmatrix row.
constexpr int kChunk = 8;

constexpr float kLog2e = 1.4426950408889634f;

// A head dim of kHeadDim values is computed over kPadded columns (whole k16 steps); the columns
// past kHeadDim are zeros in shared memory.
template <int kHeadDim>
constexpr int padded_head_dim() {
  return (kHeadDim + 15) / 16 * 16;
}
// Shared tile rows of 64 or 128 bf16 (8 or 16 swizzled chunks) hold a head of up to that many.
template <int kHeadDim>
constexpr int smem_row() {
  return kHeadDim <= 64 ? 64 : 128;
}

template <int D>
constexpr int smem_bytes() {
  return (kBlockQ + 2 * kStages * kBlockK) * D * static_cast<int>(sizeof(__nv_bfloat16));
}

// ---- params ------------------------------------------------------------------------------------------

struct AttentionParams {
  const __nv_bfloat16* q;  // [Nq, H, D]
  const __nv_bfloat16* k;  // [Nk, H, D]
  const __nv_bfloat16* v;  // [Nk, H, D]
  __nv_bfloat16* out;      // [Nq, H, D]
  int64_t q_row, q_head, k_row, k_head, v_row, v_head, out_row, out_head;  // strides, elements
  int nq, nk;
  int kv_group;  // query heads per key/value head: query head h reads k/v head h / kv_group
  float scale_log2;  // scale · log2(e): softmax by exp2
};

// ---- PTX wrappers ----------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// K/V tiles through L2 only: other CTAs re-read them, this one does not.
using hopper::cp_async_16;
using hopper::cp_async_commit;
using hopper::cp_async_wait;
using hopper::ldmatrix_x4;
using hopper::ldmatrix_x4_trans;

// c += a · b for one m16n8k16 tile: a row-major 16×16 bf16, b column-major 16×8 bf16, c fp32.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx(-inf) = 0, as masking needs
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two fp32 → one bf16x2 register, RNE; `lo` (the smaller column index) in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- shared-memory layout ---------------------------------------------------------------------------

// Tiles are [rows, D] bf16 with each row's 16-byte chunks permuted by chunk ^ (row & 7). An
// 8-row ldmatrix phase then reads 8 different bank groups (rows are 128 or 256 bytes, so
// without the XOR all 8 rows would start in the same bank), and the cp.async writes of a row
// stay a permutation of the same 128-byte span.
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) * kChunk);
}

// ---- producer: global → shared ----------------------------------------------------------------------

// Copies rows [row0, row0 + kRows) of a [rows, kHeadDim] strided matrix into the first
// padded_head_dim columns of a swizzled tile of row width D; rows at or past `row_end`, and the
// padding columns, are zero-filled (their source address is row 0's, never dereferenced).
template <int D, int kHeadDim, int kRows>
__device__ __forceinline__ void load_tile(__nv_bfloat16* tile, const __nv_bfloat16* base, int64_t row_stride,
                                          int row0, int row_end) {
  constexpr int kChunksPerRow = padded_head_dim<kHeadDim>() / kChunk;
  constexpr int kValidChunks = kHeadDim / kChunk;
  constexpr int kTotal = kRows * kChunksPerRow;
  constexpr int kCopies = (kTotal + kThreads - 1) / kThreads;
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    if (kTotal % kThreads != 0 && c >= kTotal) break;
    const int row = c / kChunksPerRow, chunk = c % kChunksPerRow;
    const bool valid = row0 + row < row_end && chunk < kValidChunks;
    const __nv_bfloat16* src = base + (valid ? static_cast<int64_t>(row0 + row) * row_stride + chunk * kChunk : 0);
    cp_async_16(tile + swizzled<D>(row, chunk), src, valid ? 16 : 0);
  }
}

// ---- the kernel ----------------------------------------------------------------------------------------

// kCausal: query i sees keys 0 ..= i (Nq = Nk). A CTA then stops at the tile holding its last
// query's key, masks the keys past each row's own in the tiles that cross the diagonal, and the
// grid runs the longest query blocks first so that the short ones fill the last wave. Every row
// sees key 0 in tile 0, so its running maximum is finite from the first tile on, as without it.
template <int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1) attention_v0_kernel(const AttentionParams p) {
  constexpr int D = smem_row<kHeadDim>();  // shared row width
  constexpr int kPadded = padded_head_dim<kHeadDim>();
  static_assert(kHeadDim % kChunk == 0 && kPadded <= D, "whole 16-byte chunks inside the shared row");
  static_assert(D / kChunk >= 8, "the swizzle permutes 8 chunks per row");
  constexpr int kDTiles = kPadded / 8;    // n8 tiles of the output (those past kHeadDim not stored)
  constexpr int kDSteps = kPadded / 16;   // k16 steps of Q·Kᵀ
  constexpr int kKeyTiles = kBlockK / 8;
  constexpr int kKeySteps = kBlockK / 16;

  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem);  // [kBlockQ, D]
  __nv_bfloat16* s_k = s_q + kBlockQ * D;                         // [kStages, kBlockK, D]
  __nv_bfloat16* s_v = s_k + kStages * kBlockK * D;               // [kStages, kBlockK, D]

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane / 4, quad_lane = lane % 4;  // mma fragment coordinates: row, column pair
  const int q_block = kCausal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int q0 = q_block * kBlockQ;
  const int head = static_cast<int>(blockIdx.y), kv_head = head / p.kv_group;
  const __nv_bfloat16* q_base = p.q + head * p.q_head + static_cast<int64_t>(q0) * p.q_row;
  const __nv_bfloat16* k_base = p.k + kv_head * p.k_head;
  const __nv_bfloat16* v_base = p.v + kv_head * p.v_head;
  const int keys_seen = kCausal ? min(p.nk, q0 + kBlockQ) : p.nk;  // by the CTA's last query
  const int num_tiles = (keys_seen + kBlockK - 1) / kBlockK;

  load_tile<D, kHeadDim, kBlockQ>(s_q, q_base, p.q_row, 0, p.nq - q0);
  load_tile<D, kHeadDim, kBlockK>(s_k, k_base, p.k_row, 0, p.nk);
  load_tile<D, kHeadDim, kBlockK>(s_v, v_base, p.v_row, 0, p.nk);
  cp_async_commit();

  uint32_t q_frag[kDSteps][4];
  float o_acc[kDTiles][4];
#pragma unroll
  for (int t = 0; t < kDTiles; ++t) o_acc[t][0] = o_acc[t][1] = o_acc[t][2] = o_acc[t][3] = 0.0f;
  // Rows `group` and `group + 8` of this warp's 16: running max of the raw scores, and this
  // lane's part of the row sum (the quad's four parts are added once, at the end).
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile + 1 < num_tiles) {
      const int next = (tile + 1) % kStages;
      load_tile<D, kHeadDim, kBlockK>(s_k + next * kBlockK * D, k_base, p.k_row, (tile + 1) * kBlockK, p.nk);
      load_tile<D, kHeadDim, kBlockK>(s_v + next * kBlockK * D, v_base, p.v_row, (tile + 1) * kBlockK, p.nk);
    }
    cp_async_commit();      // possibly empty: keeps "all but the newest group" meaning this tile
    cp_async_wait<1>();
    __syncthreads();        // every thread's copies of this tile are visible

    if (tile == 0) {
      // A fragments of this warp's 16×D slice of Q, kept for the whole sweep.
      const int row = warp * kRowsPerWarp + (lane % 8) + (lane / 8 % 2) * 8;
#pragma unroll
      for (int s = 0; s < kDSteps; ++s) ldmatrix_x4(q_frag[s], smem_address(s_q + swizzled<D>(row, 2 * s + lane / 16)));
    }

    // ---- S = Q · Kᵀ: [16, kBlockK] per warp, fp32 ----
    const __nv_bfloat16* k_tile = s_k + stage * kBlockK * D;
    float s_acc[kKeyTiles][4];
#pragma unroll
    for (int t = 0; t < kKeyTiles; ++t) s_acc[t][0] = s_acc[t][1] = s_acc[t][2] = s_acc[t][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < kDSteps; ++s) {
#pragma unroll
      for (int pair = 0; pair < kKeyTiles / 2; ++pair) {
        // Matrices: keys +0..7 | +8..15 of this pair × d chunks 2s | 2s+1 → b0, b1 of each key tile.
        const int key = pair * 16 + (lane % 8) + (lane / 16) * 8;
        uint32_t b[4];
        ldmatrix_x4(b, smem_address(k_tile + swizzled<D>(key, 2 * s + lane / 8 % 2)));
        mma_bf16(s_acc[2 * pair], q_frag[s], b[0], b[1]);
        mma_bf16(s_acc[2 * pair + 1], q_frag[s], b[2], b[3]);
      }
    }

    // ---- mask keys past Nk (only the last tile can hold them) and, causal, past each row's query ----
    if ((tile + 1) * kBlockK > p.nk || (kCausal && (tile + 1) * kBlockK > q0 + 1)) {
#pragma unroll
      for (int t = 0; t < kKeyTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = tile * kBlockK + t * 8 + 2 * quad_lane + (e % 2);
          const int query = q0 + warp * kRowsPerWarp + group + 8 * (e / 2);
          if (key >= p.nk || (kCausal && key > query)) s_acc[t][e] = -INFINITY;
        }
      }
    }

    // ---- online softmax: new max, rescale what came before, P = exp2(S·scale·log2e − m) ----
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int t = 0; t < kKeyTiles; ++t) tile_max = fmaxf(tile_max, fmaxf(s_acc[t][2 * r], s_acc[t][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // Finite from the first tile on: key 0 is always valid, and a valid score is finite. A causal
      // row whose keys in this tile are all masked keeps its maximum (rescale 1, P = 0).
      const float new_max = fmaxf(row_max[r], tile_max);
      const float rescale = fast_exp2((row_max[r] - new_max) * p.scale_log2);  // 0 on the first tile
      row_max[r] = new_max;
      const float offset = -new_max * p.scale_log2;
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < kKeyTiles; ++t) {
        s_acc[t][2 * r] = fast_exp2(fmaf(s_acc[t][2 * r], p.scale_log2, offset));
        s_acc[t][2 * r + 1] = fast_exp2(fmaf(s_acc[t][2 * r + 1], p.scale_log2, offset));
        sum += s_acc[t][2 * r] + s_acc[t][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * rescale + sum;
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        o_acc[t][2 * r] *= rescale;
        o_acc[t][2 * r + 1] *= rescale;
      }
    }

    // ---- O += P · V: P's accumulator layout is the A-fragment layout of two adjacent key tiles ----
    const __nv_bfloat16* v_tile = s_v + stage * kBlockK * D;
#pragma unroll
    for (int s = 0; s < kKeySteps; ++s) {
      const uint32_t a[4] = {pack_bf16x2(s_acc[2 * s][0], s_acc[2 * s][1]),
                             pack_bf16x2(s_acc[2 * s][2], s_acc[2 * s][3]),
                             pack_bf16x2(s_acc[2 * s + 1][0], s_acc[2 * s + 1][1]),
                             pack_bf16x2(s_acc[2 * s + 1][2], s_acc[2 * s + 1][3])};
      const int key = s * 16 + (lane % 8) + (lane / 8 % 2) * 8;
#pragma unroll
      for (int pair = 0; pair < kDTiles / 2; ++pair) {
        // Transposed matrices: keys +0..7 | +8..15 × d chunks 2·pair | 2·pair+1 → b0, b1 of each d tile.
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_address(v_tile + swizzled<D>(key, 2 * pair + lane / 16)));
        mma_bf16(o_acc[2 * pair], a, b[0], b[1]);
        mma_bf16(o_acc[2 * pair + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's copies
  }

  // ---- epilogue: O / row sum → bf16 → this warp's rows of s_q (free since tile 0) → 16-byte stores ----
  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inverse[r] = 1.0f / sum;
  }
  const int warp_row0 = warp * kRowsPerWarp;
#pragma unroll
  for (int t = 0; t < kDTiles; ++t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp_row0 + group + 8 * r;
      const uint32_t packed = pack_bf16x2(o_acc[t][2 * r] * inverse[r], o_acc[t][2 * r + 1] * inverse[r]);
      *reinterpret_cast<uint32_t*>(s_q + swizzled<D>(row, t) + 2 * quad_lane) = packed;
    }
  }
  __syncwarp();
  constexpr int kChunksPerRow = kHeadDim / kChunk;  // the stored ones
  constexpr int kTotal = kRowsPerWarp * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < (kTotal + 31) / 32; ++i) {
    const int c = lane + i * 32;
    if (kTotal % 32 != 0 && c >= kTotal) break;
    const int row = warp_row0 + c / kChunksPerRow, chunk = c % kChunksPerRow;
    const int query = q0 + row;
    if (query < p.nq) {
      const uint4 value = *reinterpret_cast<const uint4*>(s_q + swizzled<D>(row, chunk));
      *reinterpret_cast<uint4*>(p.out + static_cast<int64_t>(query) * p.out_row + head * p.out_head + chunk * kChunk) =
          value;
    }
  }
}

template <int kHeadDim, bool kCausal>
Status launch_v0(const AttentionParams& params, int heads, cudaStream_t stream) {
  constexpr int kSmem = smem_bytes<smem_row<kHeadDim>()>();
  VORTEX_CUDA_CHECK(cudaFuncSetAttribute(attention_v0_kernel<kHeadDim, kCausal>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid((params.nq + kBlockQ - 1) / kBlockQ, heads);
  // x fastest: the CTAs resident at one time share a head, so its K and V stay in L2.
  attention_v0_kernel<kHeadDim, kCausal><<<grid, kThreads, kSmem, stream>>>(params);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

bool v0_head_dim(int64_t d) { return d == 64 || d == 72 || d == 128; }

// v0 at a head dim v0_head_dim accepts.
Status launch_v0_for(const AttentionParams& params, int64_t d, bool causal, int heads, cudaStream_t stream) {
  if (d == 64) return causal ? launch_v0<64, true>(params, heads, stream) : launch_v0<64, false>(params, heads, stream);
  if (d == 72) return causal ? launch_v0<72, true>(params, heads, stream) : launch_v0<72, false>(params, heads, stream);
  return causal ? launch_v0<128, true>(params, heads, stream) : launch_v0<128, false>(params, heads, stream);
}

AttentionParams v0_params(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          float scale) {
  AttentionParams params{};
  params.q = static_cast<const __nv_bfloat16*>(q.data);
  params.k = static_cast<const __nv_bfloat16*>(k.data);
  params.v = static_cast<const __nv_bfloat16*>(v.data);
  params.out = static_cast<__nv_bfloat16*>(out.data);
  params.q_row = q.strides[0], params.q_head = q.strides[1];
  params.k_row = k.strides[0], params.k_head = k.strides[1];
  params.v_row = v.strides[0], params.v_head = v.strides[1];
  params.out_row = out.strides[0], params.out_head = out.strides[1];
  params.nq = static_cast<int>(q.shape[0]);
  params.nk = static_cast<int>(k.shape[0]);
  params.kv_group = static_cast<int>(q.shape[1] / k.shape[1]);
  params.scale_log2 = scale * kLog2e;
  return params;
}

// ---- argument checks ------------------------------------------------------------------------------------

// 16-byte copies need 16-byte aligned rows: the pointer and the strides in whole chunks (a stride
// of a size-1 dim is never applied).
bool chunk_aligned(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (t.shape[0] == 1 || t.strides[0] % kChunk == 0) &&
         (t.shape[1] == 1 || t.strides[1] % kChunk == 0);
}

}  // namespace

Result<AttentionVariant> attention_variant_from_env() {
  const char* variant = std::getenv("VORTEX_VARIANT_ATTENTION");
  if (variant == nullptr || *variant == '\0' || std::string(variant) == "v1") return AttentionVariant::kV1;
  if (std::string(variant) == "v0") return AttentionVariant::kV0;
  if (std::string(variant) == "v2") return AttentionVariant::kV2;
  if (std::string(variant) == "v2-128") return AttentionVariant::kV2Keys128;
  return unimplemented(std::string("cuda attention: VORTEX_VARIANT_ATTENTION=") + variant +
                       " is not a variant of this build (v0, v1, v2, v2-128)");
}

const char* attention_variant_description(AttentionVariant variant) {
  switch (variant) {
    case AttentionVariant::kV0:
      return "exact, vortex v0 flash kernel (mma.sync bf16)";
    case AttentionVariant::kV1:
      return "exact, vortex v1 FlashAttention-3 style kernel (TMA + wgmma bf16)";
    case AttentionVariant::kV2:
      return "exact, vortex v2 FlashAttention-3 style kernel (TMA + wgmma bf16, persistent, 176-key tiles)";
    case AttentionVariant::kV2Keys128:
      return "exact, vortex v2 FlashAttention-3 style kernel (TMA + wgmma bf16, persistent, v1's 128-key tiles)";
  }
  return "exact, unknown variant";
}

Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out, float scale,
                 cudaStream_t stream) {
  VORTEX_ASSIGN_OR_RETURN(const AttentionVariant variant, attention_variant_from_env());
  return attention_variant(variant, q, k, v, out, scale, stream);
}

namespace {

// The operand checks of attention() and attention_quantized_e4m3 (out: the bf16 output, when
// there is one); `aligned` receives whether every view suits the tensor-core kernels.
Status check_attention_operands(const std::string& op, const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView* out, float scale, bool& aligned) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument(op + ": " + what + " (" + describe_view("q", q) + ", " + describe_view("k", k) + ", " +
                            describe_view("v", v) + (out ? ", " + describe_view("out", *out) : std::string()) + ")");
  };
  aligned = true;
  for (const TensorView* t : {&q, &k, &v, out}) {
    if (t == nullptr) continue;
    if (t->device != Device::kCuda || t->dtype != DType::kBF16) return bad("every operand must be BF16 on the device");
    if (t->rank() != 3 || t->strides[2] != 1) return bad("every operand must be [N, H, D] with unit stride on D");
    aligned = aligned && chunk_aligned(*t);
  }
  const int64_t nq = q.shape[0], nk = k.shape[0], heads = q.shape[1], d = q.shape[2];
  if ((out && out->shape != q.shape) || v.shape != k.shape || k.shape[1] != heads || k.shape[2] != d) {
    return bad("shapes must be q, out [Nq, H, D] and k, v [Nk, H, D]");
  }
  if (nq < 1 || nk < 1 || heads < 1) return bad("Nq, Nk and H must be >= 1");
  if (!(scale > 0.0f) || !std::isfinite(scale)) return bad("scale must be finite and > 0, got " + std::to_string(scale));
  if (nq > INT32_MAX - kBlockQ || nk > INT32_MAX - kBlockK || heads > 65535) return bad("too large for one launch");
  return ok_status();
}

// cuda::causal_attention's operand checks (attention.h).
Status check_causal_attention_operands(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& out, float scale) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda causal_attention: " + what + " (" + describe_view("q", q) + ", " +
                            describe_view("k", k) + ", " + describe_view("v", v) + ", " + describe_view("out", out) +
                            ")");
  };
  for (const TensorView* t : {&q, &k, &v, &out}) {
    if (t->device != Device::kCuda || t->dtype != DType::kBF16 || t->data == nullptr) {
      return bad("every operand must be BF16 on the device");
    }
    if (t->rank() != 3 || t->strides[2] != 1) return bad("every operand must be [N, H, D] with unit stride on D");
  }
  const int64_t n = q.shape[0], heads = q.shape[1], kv_heads = k.shape[1], d = q.shape[2];
  if (out.shape != q.shape || v.shape != k.shape || k.shape[0] != n || k.shape[2] != d) {
    return bad("shapes must be q, out [N, H, D] and k, v [N, Hkv, D]");
  }
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0) return bad("H must be a positive multiple of Hkv");
  if (!(scale > 0.0f) || !std::isfinite(scale)) return bad("scale must be finite and > 0, got " + std::to_string(scale));
  if (n > INT32_MAX - kBlockQ || heads > 65535) return bad("too large for one launch");
  if (d > kFallbackMaxHeadDim) {
    return bad("head dim " + std::to_string(d) + " above " + std::to_string(kFallbackMaxHeadDim));
  }
  return ok_status();
}

}  // namespace

Status attention_variant(AttentionVariant variant, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, float scale, cudaStream_t stream, AttentionVariant* ran) {
  if (ran != nullptr) *ran = AttentionVariant::kV0;
  bool aligned = true;
  VORTEX_RETURN_IF_ERROR(check_attention_operands("cuda attention", q, k, v, &out, scale, aligned));
  const int64_t heads = q.shape[1], d = q.shape[2];
  // The tensor-core kernels take head dims 64, 72 and 128 on 16-byte aligned rows; anything else
  // (the small test models, odd views) goes to the warp-per-row fallback with the same numerics.
  if (!v0_head_dim(d) || !aligned) return attention_fallback(q, k, v, out, scale, stream);

  // v1 also has a head-dim-64 instance (the video VAE decoder's heads); v2 only the 128 one.
  if ((variant != AttentionVariant::kV0 && d == 128) || (variant == AttentionVariant::kV1 && d == 64)) {
    const Status status =
        variant == AttentionVariant::kV1
            ? attention_wgmma(q, k, v, out, scale, stream)
            : attention_wgmma_v2(q, k, v, out, scale, stream,
                                 variant == AttentionVariant::kV2 ? V2KeyTiles::kFitted : V2KeyTiles::kOfV1);
    // unimplemented: no tensor-map encoder, or views it cannot describe; nothing was launched.
    if (status.code() != StatusCode::kUnimplemented) {
      if (status.ok() && ran != nullptr) *ran = variant;
      return status;
    }
  }

  return launch_v0_for(v0_params(q, k, v, out, scale), d, false, static_cast<int>(heads), stream);
}

Status causal_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        float scale, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check_causal_attention_operands(q, k, v, out, scale));
  const int64_t heads = q.shape[1], d = q.shape[2];
  bool aligned = true;
  for (const TensorView* t : {&q, &k, &v, &out}) aligned = aligned && chunk_aligned(*t);
  if (q.shape[0] == 0) return ok_status();
  if (!v0_head_dim(d) || !aligned) return causal_attention_fallback(q, k, v, out, scale, stream);
  return launch_v0_for(v0_params(q, k, v, out, scale), d, true, static_cast<int>(heads), stream);
}

Status attention_quantized_e4m3(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& codes, const TensorView& scales, float scale, cudaStream_t stream) {
  const std::string op = "cuda attention_quantized_e4m3";
  bool aligned = true;
  VORTEX_RETURN_IF_ERROR(check_attention_operands(op, q, k, v, nullptr, scale, aligned));
  const int64_t nq = q.shape[0], width = q.shape[1] * q.shape[2];
  if (width % cpu::kFp8BlockCols != 0) {
    return invalid_argument(op + ": H·D = " + std::to_string(width) + ", not a multiple of 128");
  }
  VORTEX_RETURN_IF_ERROR(
      cpu::check_fp8_blocks_output(codes, scales, nq, width, cpu::Fp8BlockLayout::kTiles, Device::kCuda, op));
  if (reinterpret_cast<uintptr_t>(codes.data) % 2 != 0 || (nq > 1 && codes.strides[0] % 2 != 0)) {
    return invalid_argument(op + " codes: the pointer and the row stride must be multiples of 2 bytes");
  }
  if (q.shape[2] != 128 || !aligned) return unimplemented(op + ": the v1 kernel needs D = 128 and 16-byte aligned views");
  VORTEX_RETURN_IF_ERROR(attention_wgmma_quantized_e4m3(q, k, v, codes, scales, scale, stream));
  // After the kernel's launch, so that an unimplemented return has written nothing.
  return zero_block_scale_padding(scales, nq, width, stream);
}

}  // namespace vortex::cuda
