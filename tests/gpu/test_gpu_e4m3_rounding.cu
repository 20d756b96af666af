// The device e4m3 conversion (cuda/row_io.cuh's e4m3x2_bits: the hardware cvt, two values per
// instruction) against core/dtype.h's portable round-to-nearest-even with saturation at ±448, on
// every one of the 2^32 float bit patterns that is not a NaN (no caller converts a NaN: a row with
// one gets kE4m3NanCode). The fp8 recipe's quantizers (cuda/fp8_quantize.cu) write their codes
// through it, so their bitwise equality with the CPU quantizers rests on this test.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/dtype.h"
#include "cuda/row_io.cuh"
#include "gpu/all_floats_check.cuh"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

struct E4m3ConversionsAgree {
  __device__ bool operator()(uint32_t bits) const {
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return true;  // NaN: not converted by any caller
    const float v = __uint_as_float(bits);
    // Both byte positions of the pair: v low with its negation high, and the other way round.
    const uint32_t want = f32_to_e4m3_bits(v), want_neg = f32_to_e4m3_bits(-v);
    return cuda::detail::e4m3x2_bits(v, -v) == (want | (want_neg << 8)) &&
           cuda::detail::e4m3x2_bits(-v, v) == (want_neg | (want << 8));
  }
};

TEST(GpuE4m3Rounding, HardwareConversionEqualsThePortableRneOnEveryNonNanFloat) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const test::AllFloatsResult got = test::check_all_floats(E4m3ConversionsAgree{});
  EXPECT_EQ(got.failures, 0u) << "first mismatching input bits 0x" << std::hex << got.first_failure;
}

}  // namespace
}  // namespace vortex
