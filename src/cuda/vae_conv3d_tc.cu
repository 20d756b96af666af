// The video VAE encoder's causal 3D convolution as an implicit GEMM on tensor cores (contract:
// conv3d_implicit in vae_conv3d.h).
//
// What it computes: conv3d_gather's rows times the weight's real-tap columns, plus the bias — the
// gather and the GEMM of the encoder's `gemm` path — without writing the rows anywhere. A CTA owns
// kBlockM output pixels of one output frame and kBlockN output channels; its K loop walks the
// frame's real temporal taps, the spatial taps and the input channels in blocks of kBlockK (one
// tap's channels at a time, so every shared row is one input pixel's 32 contiguous channels,
// reflected and causal-offset as conv3d_gather reads them; each thread keeps its rows' source
// offsets for the current tap and steps the tap without divisions). A and B tiles stream through a
// cp.async ring whose 128-byte rows (16-byte chunks XORed with the row's low three bits, tiles on
// 1024-byte boundaries) are the 128-byte swizzle wgmma reads. Two warpgroups of 64 pixel rows each
// issue wgmma m64n128k8 tf32 per k8 step, B from shared memory.
//
// Two kernels of the same tile and the same sums: conv3d_ws_kernel<3> (tf32x3-ws, the default) reads
// B split at load (split_conv_weight_tf32), gives the copies to a producer warpgroup and lets the
// two product warpgroups take turns on mbarrier-handed stages; conv3d_wgmma_kernel (tf32x3) has all
// warpgroups copy, split and multiply in lockstep between CTA barriers. The GPU test holds the
// first to the second's bits (DESIGN's exactness gate); on the H200 the first encodes a keyframe
// and a clip in 0.74x and 0.73x the second's time (bench/notes/video_vae_encoder.md).
// conv3d_ws_kernel<1> (tf32) is the warp-specialized kernel with one product.
//
// Numerics (VORTEX_VARIANT_VAE_CONV):
//   tf32x3-ws (the encoder's default) and tf32x3: each fp32 operand is split into its tf32
//       rounding (hi) and the tf32 rounding of the remainder (lo), and a·b is a_lo·b_hi + a_hi·b_lo
//       + a_hi·b_hi (a_lo·b_lo, ~2^-22 relative, is dropped): each product good to ~2^-21. A is
//       split in registers (each warp's fragments by ldmatrix, the products read A from
//       registers); B once at load for tf32x3-ws, in shared memory for tf32x3 (every thread splits
//       its share of a landed stage: hi in place, lo into a second tile of the same layout). The
//       tensor core's fp32 accumulation is not IEEE round-to-nearest (it truncates to the largest
//       addend's exponent), so each k-block's 12 products (4 k8 steps × 3) run in a fresh
//       accumulator set that is then added to the running sum by FADD. Measured on the H100: 2.5e-7
//       to 2.9e-7 rel-L2 from double sums over K = 864 to 3456 (with the running sum inside the
//       tensor core instead, 2e-6 to 2e-5).
//   tf32: one product of the raw fp32 values, A and B from shared memory, of which the tensor core
//       reads the tf32 bits (truncation), summed in the tensor core over the whole K: ~7.7e-4.
//   gemm: conv3d_gather + cuBLASLt fp32, chosen in the encoder, not here.
// Sums run in a fixed order (no split-K, no atomics): the output is the same bits run to run.
#include "cuda/vae_conv3d.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/hopper_primitives.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

using hopper::cp_async_16;
using hopper::cp_async_commit;
using hopper::cp_async_wait;
using hopper::smem_address;

// A 128 x 128 CTA tile: 128 output pixels by 128 output channels (every encoder conv but conv_in's
// and conv_out's has a multiple of 128 output channels), kBlockK = 32 input channels (128-byte
// shared rows, the swizzle's width; every conv but conv_in's has a multiple of 32 input channels).
constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 32;
// Three stages: the copies of k-block kb + 2 and the split of kb + 1 run under the products of kb.
constexpr int kStages = 3;
// Two warpgroups of 64 pixel rows; they also load and split.
constexpr int kThreads = 2 * 128;
// 16-byte chunks of a shared row; the CTA's threads load kLoadRows rows per pass.
constexpr int kChunks = kBlockK / 4;
constexpr int kLoadRows = kThreads / kChunks;
constexpr int kRowsPerThread = kBlockM / kLoadRows;
static_assert(kBlockM == kBlockN, "A and B tiles share the load pattern and the tile size");
static_assert(kChunks == 8, "the swizzle permutes 8 chunks per row");
constexpr int kTileFloats = kBlockM * kBlockK;
constexpr int kTileBytes = kTileFloats * static_cast<int>(sizeof(float));  // 16 KB
constexpr int kStageBytes = 2 * kTileBytes;                                 // A, B
constexpr int kRingBytes = kStages * kStageBytes;
// Dynamic shared memory: the ring, two buffers of B's low parts, and 1 KB to align the tiles to the
// swizzle's period.
constexpr int kLockstepSmemBytes = kRingBytes + 2 * kTileBytes + 1024;
// A row's first frame in x before its temporal tap is added (negative for a clip's first frames,
// whose early taps are the causal zeros): this marks a row past the frame's end instead.
constexpr int kPastTheEnd = INT32_MIN;

struct ImplicitParams {
  const float* x;     // [clips·T, H, W, C]
  const float* w;     // [O, kt·kh·kw·C]; the tf32 high parts for conv3d_ws_kernel
  const float* w_lo;  // conv3d_ws_kernel: the low parts, the same layout (split_conv_weight_tf32)
  const float* bias;  // [O]
  float* y;           // [T_out·frame_rows, O]
  int T, H, W, C, O;
  int kt, kh, kw, st, sh, sw, pad_top, pad_left, temporal_padding;
  int plane, w_out, frame_rows;  // frame_rows = clips · plane; offsets into x and w fit an int
  int k_total;                   // kt·kh·kw·C
};

__device__ __forceinline__ int reflect_index(int i, int n) {
  if (i < 0) i = -i;
  if (i >= n) i = 2 * (n - 1) - i;
  return i;
}

// The A rows one loading thread copies, rows load_row + stride·i of a tile, and the load cursor
// over the tile's k-blocks. A row's source is its frame in x before the temporal tap and its
// window's top-left corner; the cursor holds the next k-block's tap (ta, tb, td), its weight column
// tap and its channel block, and that tap's row offsets in x (reflected per tap; −1 for a row past
// the frame's end, which reads zeros). Both conv kernels load through it.
template <int kRows>
struct ARowCursor {
  int row_t[kRows], row_h[kRows], row_w[kRows], a_off[kRows];
  int ta, tb, td, w_tap, cb;

  __device__ __forceinline__ void start(const ImplicitParams& p, int m0, int frame, int a0, int load_row, int stride) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = m0 + load_row + stride * i, clip = r / p.plane, pixel = r % p.plane;
      row_t[i] = r < p.frame_rows ? clip * p.T + frame * p.st - p.temporal_padding : kPastTheEnd;
      row_h[i] = (pixel / p.w_out) * p.sh - p.pad_top;
      row_w[i] = (pixel % p.w_out) * p.sw - p.pad_left;
    }
    ta = a0, tb = 0, td = 0, w_tap = a0 * p.kh * p.kw, cb = 0;
    aim(p);
  }
  // After a k-block's copies are issued: the next channel block, or the next tap.
  __device__ __forceinline__ void advance(const ImplicitParams& p, int c_blocks) {
    if (++cb == c_blocks) {
      cb = 0, ++w_tap;
      if (++td == p.kw) {
        td = 0;
        if (++tb == p.kh) tb = 0, ++ta;
      }
      aim(p);
    }
  }
  __device__ __forceinline__ void aim(const ImplicitParams& p) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int hi = reflect_index(row_h[i] + tb, p.H), wi = reflect_index(row_w[i] + td, p.W);
      a_off[i] = row_t[i] == kPastTheEnd ? -1 : (((row_t[i] + ta) * p.H + hi) * p.W + wi) * p.C;
    }
  }
};

// Row `row`, 16-byte chunk `chunk` of a tile, in floats: the 128-byte swizzle.
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * kBlockK + ((chunk ^ (row & 7)) * 4); }

__device__ __forceinline__ uint32_t to_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f));
  return r;
}

// f → hi = tf32(f) in place, lo = tf32(f − hi) (the subtraction is exact).
__device__ __forceinline__ void split(float& f, float& lo) {
  const float hi = __uint_as_float(to_tf32(f));
  lo = __uint_as_float(to_tf32(f - hi));
  f = hi;
}

// Splits this thread's share of a B tile at `raw`, the low parts to the same offsets at `lo` (the
// split is elementwise, so the swizzle is moot).
__device__ __forceinline__ void split_tile(float* raw, float* lo, int tid) {
  static_assert(kTileFloats % (4 * kThreads) == 0, "whole float4s per thread");
#pragma unroll
  for (int i = 0; i < kTileFloats / 4 / kThreads; ++i) {
    const int v = tid + kThreads * i;
    float4 x = reinterpret_cast<float4*>(raw)[v], l;
    split(x.x, l.x), split(x.y, l.y), split(x.z, l.z), split(x.w, l.w);
    reinterpret_cast<float4*>(raw)[v] = x;
    reinterpret_cast<float4*>(lo)[v] = l;
  }
}

// A warp's 16 rows of the A tile at `a_tile` (row a_row, lanes' halves by lane / 16) by ldmatrix, for
// the four k8 steps of a k-block (an fp32 row of 4 values is the 16 bytes ldmatrix moves per row, so
// its b16 fragments are the tf32 A fragment), split in registers: k8 step s at [4s, 4s + 4).
__device__ __forceinline__ void load_split_a(const float* a_tile, int a_row, int lane, uint32_t (&a_hi)[16],
                                             uint32_t (&a_lo)[16]) {
#pragma unroll
  for (int s = 0; s < kBlockK / 8; ++s) {
    uint32_t raw[4];
    hopper::ldmatrix_x4(raw, smem_address(a_tile + swizzled(a_row, 2 * s + lane / 16)));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float hi = __uint_as_float(raw[j]), lo;
      split(hi, lo);
      a_hi[4 * s + j] = __float_as_uint(hi), a_lo[4 * s + j] = __float_as_uint(lo);
    }
  }
}

// A k-block's 12 products into a fresh partial sum `part`: per k8 step a_lo·b_hi, a_hi·b_lo,
// a_hi·b_hi (k8 step s is 32 bytes into each 128-byte row: +2 in the descriptors' 16-byte units).
__device__ __forceinline__ void tf32x3_products(float (&part)[64], const uint32_t (&a_hi)[16],
                                                const uint32_t (&a_lo)[16], uint64_t b_desc, uint64_t b_lo_desc) {
#pragma unroll
  for (int s = 0; s < kBlockK / 8; ++s) {
    const uint32_t(&hi)[4] = *reinterpret_cast<const uint32_t(*)[4]>(a_hi + 4 * s);
    const uint32_t(&lo)[4] = *reinterpret_cast<const uint32_t(*)[4]>(a_lo + 4 * s);
    if (s == 0) {
      hopper::wgmma_m64n128k8_tf32_rs<0>(part, lo, b_desc);
    } else {
      hopper::wgmma_m64n128k8_tf32_rs<1>(part, lo, b_desc + 2 * s);
    }
    hopper::wgmma_m64n128k8_tf32_rs<1>(part, hi, b_lo_desc + 2 * s);
    hopper::wgmma_m64n128k8_tf32_rs<1>(part, hi, b_desc + 2 * s);
  }
}

// A warpgroup's 64 x kBlockN accumulators plus the bias into y: output rows [row0, row0 + 64) of
// `frame`, channels [n0, n0 + kBlockN). Thread t of the warpgroup holds rows 16·(t/32 % 4) + (t%32)/4
// and + 8, columns 8j + 2·(t%4) and + 1 (acc[4j], acc[4j + 1]; acc[4j + 2], acc[4j + 3] for row + 8).
__device__ __forceinline__ void store_tile(const ImplicitParams& p, const float (&acc)[64], int frame, int row0,
                                           int n0, int tid) {
  float* y = p.y + static_cast<int64_t>(frame) * p.frame_rows * p.O;
  const int lane = tid % 32, row = row0 + (tid / 32 % 4) * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const int col = n0 + 8 * j + 2 * (lane % 4);
    const float2 bias = *reinterpret_cast<const float2*>(p.bias + col);
    if (row < p.frame_rows) {
      *reinterpret_cast<float2*>(y + static_cast<int64_t>(row) * p.O + col) =
          make_float2(acc[4 * j] + bias.x, acc[4 * j + 1] + bias.y);
    }
    if (row + 8 < p.frame_rows) {
      *reinterpret_cast<float2*>(y + static_cast<int64_t>(row + 8) * p.O + col) =
          make_float2(acc[4 * j + 2] + bias.x, acc[4 * j + 3] + bias.y);
    }
  }
}

// One CTA: output pixels [m0, m0 + kBlockM) of frame blockIdx.z, channels [n0, n0 + kBlockN).
__global__ void __launch_bounds__(kThreads, 1) conv3d_wgmma_kernel(ImplicitParams p) {
  extern __shared__ uint8_t smem_unaligned[];
  const uint32_t unaligned = smem_address(smem_unaligned);
  const uint32_t base = (unaligned + 1023) & ~1023u;
  uint8_t* smem = smem_unaligned + (base - unaligned);
  // Tile `which` (0: A, 1: B) of ring stage `stage`; B's low parts in buffer `buffer`.
  const auto raw_tile = [&](int stage, int which) {
    return reinterpret_cast<float*>(smem + stage * kStageBytes + which * kTileBytes);
  };
  const auto b_lo_tile = [&](int buffer) { return reinterpret_cast<float*>(smem + kRingBytes + buffer * kTileBytes); };
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
  const int frame = blockIdx.z, m0 = blockIdx.x * kBlockM, n0 = blockIdx.y * kBlockN;
  // Temporal taps [a0, kt) of this frame read real frames; the ones before read the causal zeros.
  const int a0 = min(max(p.temporal_padding - frame * p.st, 0), p.kt);
  const int c_blocks = p.C / kBlockK;
  const int k_blocks = (p.kt - a0) * p.kh * p.kw * c_blocks;

  // This thread copies chunk `chunk` of rows load_row + kLoadRows·i of both tiles.
  const int chunk = tid % kChunks, load_row = tid / kChunks;
  int w_row[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) w_row[i] = (n0 + load_row + kLoadRows * i) * p.k_total;
  ARowCursor<kRowsPerThread> cursor;
  cursor.start(p, m0, frame, a0, load_row, kLoadRows);
  const auto load_next = [&](int stage) {
    const int c0 = cursor.cb * kBlockK + chunk * 4, w_col = cursor.w_tap * p.C + c0;
    float* a_tile = raw_tile(stage, 0);
    float* b_tile = raw_tile(stage, 1);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = load_row + kLoadRows * i, a_off = cursor.a_off[i];
      cp_async_16(a_tile + swizzled(row, chunk), a_off >= 0 ? p.x + a_off + c0 : p.x, a_off >= 0 ? 16 : 0);
      cp_async_16(b_tile + swizzled(row, chunk), p.w + w_row[i] + w_col, 16);
    }
    cursor.advance(p, c_blocks);
  };
  // Called after a barrier that follows every thread's wait for stage kb's copies: this thread's
  // share of B split, then the stage made visible to the products (the async proxy), which read it
  // once all threads pass the next barrier.
  const auto prepare_stage = [&](int kb) {
    split_tile(raw_tile(kb % kStages, 1), b_lo_tile(kb % 2), tid);
    hopper::fence_proxy_async_shared();
  };

  float acc[64] = {};
  float part[64];
  uint32_t a_hi[16], a_lo[16];  // k8 step s's A fragment at [4s, 4s + 4)
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_blocks) load_next(s);
    cp_async_commit();
  }
  cp_async_wait<kStages - 2>();
  __syncthreads();
  if (k_blocks > 0) prepare_stage(0);
  __syncthreads();

  for (int kb = 0; kb < k_blocks; ++kb) {
    // k8 step s is 32 bytes into each 128-byte row: +2 in the descriptor's 16-byte units.
    const uint64_t b_desc = hopper::k_major_descriptor(smem_address(raw_tile(kb % kStages, 1)));
    const uint64_t b_lo_desc = hopper::k_major_descriptor(smem_address(b_lo_tile(kb % 2)));
    load_split_a(raw_tile(kb % kStages, 0), wg * 64 + (tid / 32 % 4) * 16 + lane % 16, lane, a_hi, a_lo);
    hopper::wgmma_fence();
    tf32x3_products(part, a_hi, a_lo, b_desc, b_lo_desc);
    hopper::wgmma_commit();

    // Under the products: the copies of k-block kb + 2 (into kb − 1's stage, whose products
    // retired before the last barrier) and the split of kb + 1 (into kb − 1's low buffer).
    if (kb + kStages - 1 < k_blocks) load_next((kb + kStages - 1) % kStages);
    cp_async_commit();
    if (kb + 1 < k_blocks) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      prepare_stage(kb + 1);
    }
    hopper::wgmma_wait<0>();
    hopper::pin_registers(part);
    hopper::pin_registers(a_hi), hopper::pin_registers(a_lo);  // read by the products until here
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] += part[i];
    __syncthreads();
  }
  cp_async_wait<0>();

  store_tile(p, acc, frame, m0 + wg * 64, n0, tid);
}

// ---- warp-specialized (tf32x3-ws) --------------------------------------------------------------
//
// The same tile and the same sums as conv3d_wgmma_kernel<3> (each k-block's 12 products in a
// fresh partial sum, added by FADD in k order; A split in registers), with the roles apart and B
// split once at load instead of in every CTA (split_conv_weight_tf32: the same cvt.rna, so the
// same hi and lo): warpgroup 0 only copies (cp.async) A, B's high and B's low parts, and hands a
// stage over one k-block behind its copies (each thread's own copies are visible to it after
// cp.async.wait; the proxy fence then publishes them to the products); warpgroups 1 and 2 (64 pixel
// rows each) only split their A fragments, issue the products and add them. Stages are handed
// over on mbarriers (full: 128 producer arrivals; empty: 256 consumer arrivals) in a kWsStages
// ring, and the two consumers take turns issuing (named barriers 1 and 2), so one's FADDs and A
// split run under the other's products instead of both waiting at a CTA barrier. Measured on an
// H100 with B still split by the producer (bench/notes/video_vae_encoder.md, session 44): the
// lockstep kernel's printed errors and moments, a keyframe 7% and a clip 6.5% faster.
//
// Persistent: a CTA walks tiles blockIdx.x, + gridDim.x, ... (m fastest, then n, then the output
// frame: the order the per-tile grid ran them in), and the ring's stages and phases run on across
// its tiles, so the producer copies the next tile's first k-blocks while the consumers finish this
// tile's products and store it, instead of a new CTA filling its ring from nothing. Measured on an
// H100 against one tile a CTA: a clip 0.7% faster (level 0's convs 2%), a keyframe 0.5%.
//
// With one product (tf32, approximate) the same roles and ring copy A and the raw B alone, and the
// consumers multiply the raw fp32 tiles from shared memory (the tensor core reads their tf32 bits)
// straight into the running sum: no split, no partial sums.
constexpr int kWsStages = 4;
constexpr int kWsThreads = 3 * 128;
// A stage: A, B (the high parts for three products) and, for three products, B's low parts.
constexpr int ws_stage_bytes(int products) { return (products == 3 ? 3 : 2) * kTileBytes; }
constexpr int ws_smem_bytes(int products) { return kWsStages * ws_stage_bytes(products) + 1024; }
constexpr int kProducerRegisters = 120, kConsumerRegisters = 192;
static_assert(hopper::register_budgets_fit(kProducerRegisters, 2, kConsumerRegisters), "the register file");
constexpr int kWsRows = kBlockM * kChunks / 128;  // rows a producer thread copies in each tile

// Where tile `index` of a conv3d_ws_kernel launch lies, and its k-blocks (the output frame's real
// temporal taps × the spatial taps × the channel blocks).
struct WsTile {
  int m0, n0, frame, a0, k_blocks;
};
__device__ __forceinline__ WsTile ws_tile(const ImplicitParams& p, int index) {
  const int m_tiles = (p.frame_rows + kBlockM - 1) / kBlockM, n_tiles = p.O / kBlockN;
  WsTile t;
  t.m0 = index % m_tiles * kBlockM;
  t.n0 = index / m_tiles % n_tiles * kBlockN;
  t.frame = index / (m_tiles * n_tiles);
  t.a0 = min(max(p.temporal_padding - t.frame * p.st, 0), p.kt);
  t.k_blocks = (p.kt - t.a0) * p.kh * p.kw * (p.C / kBlockK);
  return t;
}

template <int kProducts>
__global__ void __launch_bounds__(kWsThreads, 1) conv3d_ws_kernel(ImplicitParams p, int tiles) {
  static_assert(kProducts == 1 || kProducts == 3, "one tf32 product or the hi/lo split's three");
  constexpr int kStageBytes = ws_stage_bytes(kProducts);
  extern __shared__ uint8_t smem_unaligned[];
  __shared__ __align__(8) uint64_t full_bar[kWsStages], empty_bar[kWsStages];
  const uint32_t unaligned = smem_address(smem_unaligned);
  const uint32_t base = (unaligned + 1023) & ~1023u;
  uint8_t* smem = smem_unaligned + (base - unaligned);
  // Tile `which` (0: A, 1: B, 2: B's low parts) of stage `stage`.
  const auto tile = [&](int stage, int which) {
    return reinterpret_cast<float*>(smem + stage * kStageBytes + which * kTileBytes);
  };
  const int tid = threadIdx.x, role = tid / 128, lane = tid % 32;
  const int c_blocks = p.C / kBlockK;
  if (tid == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      hopper::mbarrier_init(smem_address(&full_bar[s]), 128);
      hopper::mbarrier_init(smem_address(&empty_bar[s]), 256);
    }
    hopper::mbarrier_init_fence();
  }
  __syncthreads();

  if (role == 0) {
    hopper::release_registers<kProducerRegisters>();
    // This thread copies chunk `chunk` of rows load_row + 16·i of both tiles.
    const int chunk = tid % kChunks, load_row = tid / kChunks;
    // Hands stage `stage` over once this thread's copies into it have landed.
    const auto finish = [&](int stage) {
      hopper::fence_proxy_async_shared();
      hopper::mbarrier_arrive(smem_address(&full_bar[stage]));
    };
    int g = 0;  // k-blocks copied by this CTA so far, over all its tiles: the ring's position
    for (int index = blockIdx.x; index < tiles; index += gridDim.x) {
      const WsTile t = ws_tile(p, index);
      // Row load_row + 16·i of B's parts at + 16·i·k_total.
      const int w_row0 = (t.n0 + load_row) * p.k_total;
      ARowCursor<kWsRows> cursor;
      cursor.start(p, t.m0, t.frame, t.a0, load_row, 16);
      for (int kb = 0; kb < t.k_blocks; ++kb, ++g) {
        const int stage = g % kWsStages;
        hopper::mbarrier_wait(smem_address(&empty_bar[stage]), ((g / kWsStages) & 1) ^ 1);
        const int c0 = cursor.cb * kBlockK + chunk * 4, w_col = cursor.w_tap * p.C + c0;
#pragma unroll
        for (int i = 0; i < kWsRows; ++i) {
          const int row = load_row + 16 * i, at = swizzled(row, chunk), w_at = w_row0 + 16 * i * p.k_total + w_col;
          const int a_off = cursor.a_off[i];
          cp_async_16(tile(stage, 0) + at, a_off >= 0 ? p.x + a_off + c0 : p.x, a_off >= 0 ? 16 : 0);
          cp_async_16(tile(stage, 1) + at, p.w + w_at, 16);
          if constexpr (kProducts == 3) cp_async_16(tile(stage, 2) + at, p.w_lo + w_at, 16);
        }
        cp_async_commit();
        cursor.advance(p, c_blocks);
        // The previous k-block (this tile's or the last tile's) is handed over one behind.
        if (g > 0) {
          cp_async_wait<1>();
          finish((g - 1) % kWsStages);
        }
      }
    }
    if (g > 0) {
      cp_async_wait<0>();
      finish((g - 1) % kWsStages);
    }
    return;
  }

  hopper::claim_registers<kConsumerRegisters>();
  const int consumer = role - 1;
  const int a_row = consumer * 64 + (tid / 32 % 4) * 16 + lane % 16;
  // Turns: consumer c issues after named barrier 1 + c has both consumers' 256 threads. Consumer 1
  // makes no arrival after the CTA's last k-block (no one would meet it), so it counts them first.
  int remaining = 0;
  if (consumer == 1) {
    for (int index = blockIdx.x; index < tiles; index += gridDim.x) remaining += ws_tile(p, index).k_blocks;
    if (remaining > 0) hopper::named_barrier_arrive(1, 256);
  }
  float part[64];
  uint32_t a_hi[16], a_lo[16];
  int g = 0;
  for (int index = blockIdx.x; index < tiles; index += gridDim.x) {
    const WsTile t = ws_tile(p, index);
    float acc[64] = {};
    for (int kb = 0; kb < t.k_blocks; ++kb, ++g) {
      const int stage = g % kWsStages;
      hopper::mbarrier_wait(smem_address(&full_bar[stage]), (g / kWsStages) & 1);
      const uint64_t b_desc = hopper::k_major_descriptor(smem_address(tile(stage, 1)));
      if constexpr (kProducts == 3) load_split_a(tile(stage, 0), a_row, lane, a_hi, a_lo);
      hopper::named_barrier_sync(1 + consumer, 256);
      hopper::wgmma_fence();
      if constexpr (kProducts == 3) {
        tf32x3_products(part, a_hi, a_lo, b_desc, hopper::k_major_descriptor(smem_address(tile(stage, 2))));
      } else {
        // This consumer's 64 rows of A; k8 step s is 32 bytes into each row (+2 in 16-byte units).
        const uint64_t a_desc =
            hopper::k_major_descriptor(smem_address(tile(stage, 0)) + consumer * 64 * kBlockK * 4);
#pragma unroll
        for (int s = 0; s < kBlockK / 8; ++s) hopper::wgmma_m64n128k8_tf32_ss<1>(acc, a_desc + 2 * s, b_desc + 2 * s);
      }
      hopper::wgmma_commit();
      // The other consumer's turn.
      if (consumer == 0 || --remaining > 0) hopper::named_barrier_arrive(2 - consumer, 256);
      hopper::wgmma_wait<0>();
      if constexpr (kProducts == 3) {
        hopper::pin_registers(part);
        hopper::pin_registers(a_hi), hopper::pin_registers(a_lo);  // read by the products until here
      } else {
        hopper::pin_registers(acc);
      }
      hopper::mbarrier_arrive(smem_address(&empty_bar[stage]));
      if constexpr (kProducts == 3) {
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] += part[i];
      }
    }
    store_tile(p, acc, t.frame, t.m0 + consumer * 64, t.n0, tid);
  }
}

// w → its tf32 high part in place, the low part into lo: split(), elementwise.
__global__ void split_tf32_kernel(float* w, float* lo, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float hi = w[i], l;
    split(hi, l);
    w[i] = hi, lo[i] = l;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool f32_device(const TensorView& t) { return t.device == Device::kCuda && t.dtype == DType::kF32; }

}  // namespace

Result<VaeConvVariant> vae_conv_variant_from_env() {
  const char* v = std::getenv("VORTEX_VARIANT_VAE_CONV");
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "tf32x3-ws") return VaeConvVariant::kTf32x3Ws;
  if (s == "tf32x3") return VaeConvVariant::kTf32x3;
  if (s == "gemm") return VaeConvVariant::kGatherGemm;
  if (s == "tf32") return VaeConvVariant::kTf32;
  return invalid_argument("VORTEX_VARIANT_VAE_CONV must be tf32x3-ws, tf32x3, gemm or tf32 (got '" + s + "')");
}

bool conv3d_implicit_supports(int64_t in_channels, int64_t out_channels) {
  return in_channels % kBlockK == 0 && out_channels % kBlockN == 0;
}

Status split_conv_weight_tf32(const TensorView& weight, const TensorView& lo, cudaStream_t stream) {
  if (!f32_device(weight) || !f32_device(lo) || !weight.is_contiguous() || !lo.is_contiguous() ||
      lo.shape != weight.shape) {
    return invalid_argument("cuda split_conv_weight_tf32: weight and lo must be contiguous F32 device tensors of "
                            "one shape (" + describe_view("weight", weight) + ", " + describe_view("lo", lo) + ")");
  }
  const int64_t n = weight.numel();
  if (n == 0) return ok_status();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  split_tf32_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(static_cast<float*>(weight.data),
                                                                           static_cast<float*>(lo.data), n);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status conv3d_implicit(const TensorView& x, int64_t clips, const Conv3dTaps& taps, int64_t h_out, int64_t w_out,
                       const TensorView& weight, const TensorView* weight_lo, const TensorView& bias,
                       const TensorView& y, VaeConvVariant variant, cudaStream_t stream, int ctas) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda conv3d_implicit: " + what + " (" + describe_view("x", x) + ", " +
                            describe_view("weight", weight) + ", " + describe_view("y", y) + ")");
  };
  if (!f32_device(x) || !f32_device(weight) || !f32_device(bias) || !f32_device(y)) {
    return bad("x, weight, bias and y must be F32 device tensors");
  }
  if (variant == VaeConvVariant::kGatherGemm) return bad("the gather + GEMM variant is not an implicit GEMM");
  // tf32x3-ws reads B split at load; the lockstep kernel splits it itself, and tf32 multiplies it raw.
  const bool presplit = variant == VaeConvVariant::kTf32x3Ws;
  if (presplit != (weight_lo != nullptr)) {
    return bad(presplit ? "tf32x3-ws needs weight_lo (the weight split by split_conv_weight_tf32)"
                        : "weight_lo is for tf32x3-ws only");
  }
  if (presplit && (!f32_device(*weight_lo) || !weight_lo->is_contiguous() || weight_lo->shape != weight.shape ||
                   !aligned16(weight_lo->data))) {
    return bad("weight_lo must be a contiguous, 16-byte aligned F32 device tensor of the weight's shape");
  }
  if (x.rank() != 4 || !x.is_contiguous()) return bad("x must be contiguous [T, H, W, C]");
  if (clips < 1 || x.shape[0] % clips != 0) return bad("x must hold a whole number of clips");
  const int64_t T = x.shape[0] / clips, C = x.shape[3];
  const int64_t k_total = taps.kt * taps.kh * taps.kw * C;
  if (weight.rank() != 2 || !weight.is_contiguous() || weight.shape[1] != k_total) {
    return bad("weight must be contiguous [O, kt·kh·kw·C]");
  }
  const int64_t O = weight.shape[0];
  if (!conv3d_implicit_supports(C, O)) return bad("C must be a multiple of 32 and O of 128");
  if (bias.rank() != 1 || bias.shape[0] != O) return bad("bias must be [O]");
  if (taps.st < 1 || T + taps.temporal_padding < taps.kt) return bad("the clip is shorter than the temporal kernel");
  const int64_t t_out = (T + taps.temporal_padding - taps.kt) / taps.st + 1;
  if (clips > 1 && t_out != 1) return bad("batched clips must have one output frame");
  const int64_t plane = h_out * w_out, frame_rows = clips * plane;
  if (y.rank() != 2 || !y.is_contiguous() || y.shape[0] != t_out * frame_rows || y.shape[1] != O) {
    return bad("y must be contiguous [T_out·clips·h_out·w_out, O]");
  }
  if (!aligned16(x.data) || !aligned16(weight.data) || !aligned16(bias.data) || !aligned16(y.data)) {
    return bad("x, weight, bias and y must be 16-byte aligned");
  }
  // Every tap of every output frame lies inside its clip (the causal zeros are skipped): the last
  // frame's last tap reads frame (t_out − 1)·st + kt − 1 − temporal_padding, and the spatial
  // reflection needs the window within one reflection of the edges.
  if ((t_out - 1) * taps.st + taps.kt - 1 - taps.temporal_padding >= T) return bad("the taps leave the clip");
  const int64_t h_reach = (h_out - 1) * taps.sh + taps.kh - 1 - taps.pad_top;
  const int64_t w_reach = (w_out - 1) * taps.sw + taps.kw - 1 - taps.pad_left;
  if (taps.pad_top >= x.shape[1] || taps.pad_left >= x.shape[2] || h_reach > 2 * (x.shape[1] - 1) ||
      w_reach > 2 * (x.shape[2] - 1)) {
    return bad("the spatial window reaches past one reflection");
  }
  const int64_t tiles = (frame_rows + kBlockM - 1) / kBlockM * (O / kBlockN) * t_out;
  if (x.numel() >= (int64_t{1} << 31) / 2 || weight.numel() >= (int64_t{1} << 31) / 2 ||
      frame_rows >= (int64_t{1} << 31) / 2 || t_out > 65535 || tiles >= (int64_t{1} << 31) / 2) {
    return bad("too large for the kernel's 32-bit coordinates");
  }
  if (frame_rows == 0) return ok_status();
  const ImplicitParams p{static_cast<const float*>(x.data),
                         static_cast<const float*>(weight.data),
                         presplit ? static_cast<const float*>(weight_lo->data) : nullptr,
                         static_cast<const float*>(bias.data),
                         static_cast<float*>(y.data),
                         static_cast<int>(T),
                         static_cast<int>(x.shape[1]),
                         static_cast<int>(x.shape[2]),
                         static_cast<int>(C),
                         static_cast<int>(O),
                         static_cast<int>(taps.kt),
                         static_cast<int>(taps.kh),
                         static_cast<int>(taps.kw),
                         static_cast<int>(taps.st),
                         static_cast<int>(taps.sh),
                         static_cast<int>(taps.sw),
                         static_cast<int>(taps.pad_top),
                         static_cast<int>(taps.pad_left),
                         static_cast<int>(taps.temporal_padding),
                         static_cast<int>(plane),
                         static_cast<int>(w_out),
                         static_cast<int>(frame_rows),
                         static_cast<int>(k_total)};
  // The warp-specialized kernels: one CTA an SM (the ring takes most of an SM's shared memory), each
  // walking its tiles.
  const auto walk = [&](auto kernel, int smem) -> Status {
    if (ctas <= 0) {
      int device = 0;
      VORTEX_CUDA_CHECK(cudaGetDevice(&device));
      VORTEX_CUDA_CHECK(cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, device));
    }
    VORTEX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int walkers = static_cast<int>(std::min<int64_t>(ctas, tiles));
    kernel<<<walkers, kWsThreads, smem, stream>>>(p, static_cast<int>(tiles));
    VORTEX_CUDA_CHECK_LAUNCH();
    return ok_status();
  };
  switch (variant) {
    case VaeConvVariant::kTf32x3Ws:
      return walk(conv3d_ws_kernel<3>, ws_smem_bytes(3));
    case VaeConvVariant::kTf32:
      return walk(conv3d_ws_kernel<1>, ws_smem_bytes(1));
    case VaeConvVariant::kTf32x3: {
      const dim3 grid(static_cast<unsigned>((frame_rows + kBlockM - 1) / kBlockM),
                      static_cast<unsigned>(O / kBlockN), static_cast<unsigned>(t_out));
      VORTEX_CUDA_CHECK(
          cudaFuncSetAttribute(conv3d_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kLockstepSmemBytes));
      conv3d_wgmma_kernel<<<grid, kThreads, kLockstepSmemBytes, stream>>>(p);
      VORTEX_CUDA_CHECK_LAUNCH();
      return ok_status();
    }
    case VaeConvVariant::kGatherGemm:
      break;
  }
  return bad("the gather + GEMM variant is not an implicit GEMM");
}

}  // namespace vortex::cuda
