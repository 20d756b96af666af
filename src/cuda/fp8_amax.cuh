// The amax reductions of the fp8 quantizers (the rule: cpu/fp8_scale.h). The amax is a max over
// |x|'s bits: order-free, and NaN sorts above infinity, so the result also flags a non-finite row
// or block. Shared by the row quantizers (fp8_quantize.cu), the block quantizer (fp8_blocks.cu)
// and the int8fp8 kernel's e4m3 epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/fp8_scale.h"

namespace vortex::cuda::detail {

template <int V>
__device__ __forceinline__ uint32_t amax_bits(const float (&v)[V], uint32_t acc) {
#pragma unroll
  for (int k = 0; k < V; ++k) acc = fp8_max_bits(acc, fp8_abs_bits(v[k]));
  return acc;
}

// The max over `width` lanes (a power of two <= 32) by an xor-shuffle tree; every lane gets it.
__device__ __forceinline__ uint32_t warp_max_bits(uint32_t m, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) m = fp8_max_bits(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
  return m;
}

// The max over a team of `team` threads: the lanes of a warp (team <= 32), or whole warps of the
// block (team a multiple of 32) through warp_max[team / 32] in shared memory. Every thread of the
// block calls it (the barriers); warp_max may be reused on return.
__device__ __forceinline__ uint32_t team_max(uint32_t m, int team, uint32_t* warp_max) {
  m = warp_max_bits(m, team < 32 ? team : 32);
  if (team <= 32) return m;
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  uint32_t total = 0;
  for (int w = 0; w < team / 32; ++w) total = fp8_max_bits(total, warp_max[w]);
  __syncthreads();
  return total;
}

}  // namespace vortex::cuda::detail
