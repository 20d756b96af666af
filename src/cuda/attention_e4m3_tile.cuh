// The attention output's e4m3 epilogue for the fp8 recipe's out projection (cpu/fp8_blocks.h),
// shared by the Hopper attention kernels: their bf16 output values become blocks of
// cpu::Fp8BlockLayout::kTiles (128 queries × one head of 128 channels) — e4m3 codes and one fp32
// scale by cpu/fp8_scale.h's rule over the block's valid rows — with no bf16 output written. Bit
// for bit quantize_blocks_fp8 (kTiles) of the bf16 values the kernel would have stored. The exact
// v1 kernel's CTA is one block (store_e4m3_tile); the int8fp8 kernel's pairs of CTAs hold three
// and exchange the middle one's amax themselves (warp_amax_of_rows, store_e4m3_rows).
#pragma once

#include <cstdint>

#include "cpu/fp8_scale.h"
#include "cuda/fp8_amax.cuh"
#include "cuda/hopper_primitives.cuh"
#include "cuda/row_io.cuh"

namespace vortex::cuda::detail {

// Where a CTA's e4m3 tile goes: codes [Nq, H·128] (row stride code_row bytes), scales in the kTiles
// layout (tile t's scales start at t · scale_row).
struct E4m3TileOut {
  uint8_t* codes;
  int64_t code_row;
  float* scales;
  int scale_row;
};

// y[r][j]: this thread's bf16 output pairs in the wgmma m64nNk16 accumulator layout — query
// row0 + 8r (row0 = the consumer's first row + warp · 16 + lane / 4), channels 8j + 2 · (lane % 4)
// and + 1, low half first.

// The amax (bits) of this warp's valid rows (query < nq), reduced over the warp.
__device__ __forceinline__ uint32_t warp_amax_of_rows(const uint32_t (&y)[2][16], int row0, int nq) {
  uint32_t amax = 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row0 + 8 * r >= nq) continue;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float pair[2] = {__uint_as_float(y[r][j] << 16), __uint_as_float(y[r][j] & 0xFFFF0000u)};
      amax = amax_bits<2>(pair, amax);
    }
  }
  return warp_max_bits(amax, 32);
}

// This thread's valid rows as e4m3 codes under the block's scale s (fp8_row_scale of its amax).
__device__ __forceinline__ void store_e4m3_rows(const uint32_t (&y)[2][16], const E4m3TileOut& out, const Fp8RowScale& s,
                                                int head, int row0, int nq, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = row0 + 8 * r;
    if (query >= nq) continue;
    uint8_t* row = out.codes + static_cast<int64_t>(query) * out.code_row + static_cast<int64_t>(head) * 128;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float lo = __uint_as_float(y[r][j] << 16), hi = __uint_as_float(y[r][j] & 0xFFFF0000u);
      const uint32_t pair = s.finite ? e4m3x2_bits(fp8_mul_rn(lo, s.inv), fp8_mul_rn(hi, s.inv)) : kE4m3NanCode * 0x0101u;
      *reinterpret_cast<uint16_t*>(row + 8 * j + 2 * (lane % 4)) = static_cast<uint16_t>(pair);
    }
  }
}

// The CTA's 128 queries as one block: the amax over both consumers' warps through `warp_max`
// (kConsumerWarps words of shared memory) at named barrier `barrier` of the 256 consumer threads
// (the producer warpgroup never joins, so __syncthreads cannot be used). Every consumer thread
// must call it.
template <int kConsumerWarps>
__device__ __forceinline__ void store_e4m3_tile(const uint32_t (&y)[2][16], const E4m3TileOut& out, int tile,
                                                int head, int row0, int nq, int consumer_warp, int lane,
                                                uint32_t* warp_max, int barrier) {
  uint32_t amax = warp_amax_of_rows(y, row0, nq);
  if (lane == 0) warp_max[consumer_warp] = amax;
  hopper::named_barrier_sync(barrier, kConsumerWarps * 32);
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) amax = fp8_max_bits(amax, warp_max[w]);
  const Fp8RowScale s = fp8_row_scale(amax);
  if (consumer_warp == 0 && lane == 0) out.scales[tile * out.scale_row + head] = s.scale;
  store_e4m3_rows(y, out, s, head, row0, nq, lane);
}

}  // namespace vortex::cuda::detail
