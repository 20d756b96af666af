// The device e4m3 conversion (cuda/row_io.cuh's e4m3x2_bits: the hardware cvt, two values per
// instruction) against core/dtype.h's portable round-to-nearest-even with saturation at ±448, on
// every one of the 2^32 float bit patterns that is not a NaN (no caller converts a NaN: a row with
// one gets kE4m3NanCode). The fp8 recipe's quantizers (cuda/fp8_quantize.cu) write their codes
// through it, so their bitwise equality with the CPU quantizers rests on this test.
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

__global__ void compare_all_e4m3_conversions(Mismatches* out) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  uint32_t first = 0xFFFFFFFFu;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (uint64_t{1} << 32); i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) continue;  // NaN
    const float v = __uint_as_float(bits);
    // Both byte positions of the pair: v low with its negation high, and the other way round.
    const uint32_t want = f32_to_e4m3_bits(v), want_neg = f32_to_e4m3_bits(-v);
    const bool same = cuda::detail::e4m3x2_bits(v, -v) == (want | (want_neg << 8)) &&
                      cuda::detail::e4m3x2_bits(-v, v) == (want_neg | (want << 8));
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

TEST(GpuE4m3Rounding, HardwareConversionEqualsThePortableRneOnEveryNonNanFloat) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  Mismatches* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(Mismatches)), cudaSuccess);
  const Mismatches zero{0, 0xFFFFFFFFu};
  ASSERT_EQ(cudaMemcpy(d, &zero, sizeof(zero), cudaMemcpyHostToDevice), cudaSuccess);
  compare_all_e4m3_conversions<<<1024, 256>>>(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  Mismatches got{};
  ASSERT_EQ(cudaMemcpy(&got, d, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  EXPECT_EQ(got.count, 0u) << "first mismatching input bits 0x" << std::hex << got.first_input;
}

}  // namespace
}  // namespace vortex
