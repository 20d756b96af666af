// The device bf16 rounding (cuda/row_io.cuh: the hardware conversion, one instruction) against
// core/dtype.h's portable round-to-nearest-even on every one of the 2^32 float bit patterns. Every
// elementwise kernel rounds through it, so their bitwise equality with the CPU reference and with
// each other rests on this test.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "cuda/row_io.cuh"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

struct Mismatches {
  unsigned long long count;
  uint32_t first_input;  // the smallest mismatching bit pattern (atomicMin)
};

__global__ void compare_all_bf16_roundings(Mismatches* out) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  uint32_t first = 0xFFFFFFFFu;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (uint64_t{1} << 32); i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    const float v = __uint_as_float(bits);
    const uint16_t want = f32_to_bf16_bits(v);
    const bool same = cuda::detail::bf16_bits(v) == want &&
                      __float_as_uint(cuda::detail::round_bf16_device(v)) == __float_as_uint(round_bf16(v)) &&
                      __float_as_uint(cuda::detail::round_out(true, v)) == (static_cast<uint32_t>(want) << 16) &&
                      cuda::detail::bf16x2_bits(v, -v) ==
                          (static_cast<uint32_t>(want) | (static_cast<uint32_t>(f32_to_bf16_bits(-v)) << 16));
    if (!same) {
      ++local;
      first = bits < first ? bits : first;
    }
  }
  if (local != 0) {
    atomicAdd(&out->count, local);
    atomicMin(&out->first_input, first);
  }
}

TEST(GpuBf16Rounding, DeviceRoundingEqualsThePortableRneOnEveryFloat) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  Mismatches* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(Mismatches)), cudaSuccess);
  const Mismatches zero{0, 0xFFFFFFFFu};
  ASSERT_EQ(cudaMemcpy(d, &zero, sizeof(zero), cudaMemcpyHostToDevice), cudaSuccess);
  compare_all_bf16_roundings<<<1024, 256>>>(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  Mismatches got{};
  ASSERT_EQ(cudaMemcpy(&got, d, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  EXPECT_EQ(got.count, 0u) << "first mismatching input bits 0x" << std::hex << got.first_input;
}

}  // namespace
}  // namespace vortex
