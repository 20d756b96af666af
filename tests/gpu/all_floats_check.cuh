// Runs a device predicate on every one of the 2^32 float bit patterns and reports how many fail and
// the smallest that does: the harness of the exhaustive conversion tests (test_gpu_bf16_rounding.cu,
// test_gpu_e4m3_rounding.cu).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>

namespace vortex::test {

struct AllFloatsResult {
  unsigned long long failures;
  uint32_t first_failure;  // the smallest failing bit pattern (atomicMin); 0xFFFFFFFF when none
};

template <class Predicate>
__global__ void all_floats_kernel(Predicate holds, AllFloatsResult* out) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  uint32_t first = 0xFFFFFFFFu;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (uint64_t{1} << 32); i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    if (!holds(bits)) {
      ++local;
      first = bits < first ? bits : first;
    }
  }
  if (local != 0) {
    atomicAdd(&out->failures, local);
    atomicMin(&out->first_failure, first);
  }
}

// `holds`: a functor with `__device__ bool operator()(uint32_t bits) const`.
template <class Predicate>
AllFloatsResult check_all_floats(Predicate holds) {
  AllFloatsResult* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, sizeof(AllFloatsResult)), cudaSuccess);
  const AllFloatsResult none{0, 0xFFFFFFFFu};
  EXPECT_EQ(cudaMemcpy(d, &none, sizeof(none), cudaMemcpyHostToDevice), cudaSuccess);
  all_floats_kernel<<<1024, 256>>>(holds, d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  AllFloatsResult got{~0ull, 0};
  EXPECT_EQ(cudaMemcpy(&got, d, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  return got;
}

}  // namespace vortex::test
