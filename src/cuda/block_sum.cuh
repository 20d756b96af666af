// A deterministic block-wide sum of doubles: a warp shuffle tree, then the warps' partials in warp
// order, so the same inputs give the same bits on every run (the norms' statistics).
#pragma once

namespace vortex::cuda {

// The block's total of `v`; every thread gets it. `scratch` holds kWarps doubles in shared memory
// and is free again on return. Every thread of the block (kWarps full warps) must call it.
template <int kWarps>
__device__ double block_sum_f64(double v, double* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

}  // namespace vortex::cuda
