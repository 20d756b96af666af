// The device bf16 rounding (cuda/row_io.cuh: the hardware conversion, one instruction) against
// core/dtype.h's portable round-to-nearest-even on every one of the 2^32 float bit patterns. Every
// elementwise kernel rounds through it, so their bitwise equality with the CPU reference and with
// each other rests on this test.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/dtype.h"
#include "cuda/row_io.cuh"
#include "gpu/all_floats_check.cuh"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

struct Bf16RoundingsAgree {
  __device__ bool operator()(uint32_t bits) const {
    const float v = __uint_as_float(bits);
    const uint16_t want = f32_to_bf16_bits(v);
    return cuda::detail::bf16_bits(v) == want &&
           __float_as_uint(cuda::detail::round_bf16_device(v)) == __float_as_uint(round_bf16(v)) &&
           __float_as_uint(cuda::detail::round_out(true, v)) == (static_cast<uint32_t>(want) << 16) &&
           cuda::detail::bf16x2_bits(v, -v) ==
               (static_cast<uint32_t>(want) | (static_cast<uint32_t>(f32_to_bf16_bits(-v)) << 16));
  }
};

TEST(GpuBf16Rounding, DeviceRoundingEqualsThePortableRneOnEveryFloat) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const test::AllFloatsResult got = test::check_all_floats(Bf16RoundingsAgree{});
  EXPECT_EQ(got.failures, 0u) << "first mismatching input bits 0x" << std::hex << got.first_failure;
}

}  // namespace
}  // namespace vortex
