// The device bf16 rounding (cuda/row_io.cuh: the hardware conversion, one instruction) against
// core/dtype.h's portable round-to-nearest-even on every one of the 2^32 float bit patterns. Every
// elementwise kernel rounds through it, so their bitwise equality with the CPU reference and with
// each other rests on this test. Also the packed bf16x2 product and sum against the fp32 operation
// and a rounding, on every pair of bf16 operands.
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

// bits = (a << 16) | b: two bf16 operands. R(a·b) and R(a + b) through fp32 against the packed
// instructions, each operand pair in both halves (a·b in the low half, b·a in the high one); a NaN
// result only has to be a NaN (payloads are not part of the contract: callers pass no NaN).
struct PackedBf16OpsAgree {
  __device__ static bool same(uint32_t got, float want) {
    const float g = __uint_as_float(got << 16);
    return (g != g && want != want) || (got & 0xFFFFu) == cuda::detail::bf16_bits(want);
  }
  __device__ bool operator()(uint32_t bits) const {
    const uint32_t a = bits >> 16, b = bits & 0xFFFFu;
    const float fa = __uint_as_float(a << 16), fb = __uint_as_float(b << 16);
    const uint32_t ab = (b << 16) | a, ba = (a << 16) | b;
    const uint32_t product = cuda::detail::bf16x2_mul(ab, ba), sum = cuda::detail::bf16x2_add(ab, ba);
    return same(product, __fmul_rn(fa, fb)) && same(product >> 16, __fmul_rn(fb, fa)) &&
           same(sum, __fadd_rn(fa, fb)) && same(sum >> 16, __fadd_rn(fb, fa));
  }
};

TEST(GpuBf16Rounding, PackedProductAndSumEqualTheRoundedFp32OnesOnEveryOperandPair) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const test::AllFloatsResult got = test::check_all_floats(PackedBf16OpsAgree{});
  EXPECT_EQ(got.failures, 0u) << "first mismatching operand pair 0x" << std::hex << got.first_failure;
}

}  // namespace
}  // namespace vortex
