// core/portable_math.h: accuracy against libm in double, specials, and the contract that matters —
// the same bits on every host, pinned by a digest of a fixed sweep.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/portable_math.h"
#include "core/sha256.h"

namespace vortex {
namespace {

// |a − b| in units of b's double ulp.
double ulps(double a, double b) {
  if (a == b) return 0.0;
  const double ulp = std::nextafter(std::fabs(b), std::numeric_limits<double>::infinity()) - std::fabs(b);
  return std::fabs(a - b) / ulp;
}

TEST(PortableMath, DoubleKernelsAreWithinAFewUlpOfLibm) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> wide(-3000.0, 3000.0), narrow(-4.0, 4.0), exps(-700.0, 700.0);
  double worst_sin = 0, worst_cos = 0, worst_exp = 0, worst_log = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = (i % 2) ? wide(rng) : narrow(rng);
    // Near a zero of sin or cos the result's own ulp is tiny: measure against the larger of 1e-3
    // and |result| there, since the float tables round far above that.
    const double s = std::sin(x), c = std::cos(x);
    if (std::fabs(s) > 1e-3) worst_sin = std::max(worst_sin, ulps(portable_sin(x), s));
    if (std::fabs(c) > 1e-3) worst_cos = std::max(worst_cos, ulps(portable_cos(x), c));
    const double e = exps(rng);
    worst_exp = std::max(worst_exp, ulps(portable_exp(e), std::exp(e)));
    worst_exp = std::max(worst_exp, ulps(portable_exp2(e), std::exp2(e)));
    const double l = std::exp(e);
    if (std::fabs(e) > 1e-3) worst_log = std::max(worst_log, ulps(portable_log(l), std::log(l)));
  }
  EXPECT_LE(worst_sin, 4.0);
  EXPECT_LE(worst_cos, 4.0);
  EXPECT_LE(worst_exp, 4.0);
  EXPECT_LE(worst_log, 4.0);
}

TEST(PortableMath, FloatResultsAreTheDoubleResultsRoundedOnce) {
  // libm's double functions rounded to float are correctly rounded floats in all but ~1e-8 of the
  // cases; so must ours be: at most one differing float ulp, and then only at a near-midpoint.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> angle(-3000.0f, 3000.0f), arg(-80.0f, 80.0f), expo(0.0f, 1.0f);
  int differing = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = angle(rng), e = arg(rng), p = expo(rng);
    const float pairs[5][2] = {{portable_sinf(x), static_cast<float>(std::sin(static_cast<double>(x)))},
                               {portable_cosf(x), static_cast<float>(std::cos(static_cast<double>(x)))},
                               {portable_expf(e), static_cast<float>(std::exp(static_cast<double>(e)))},
                               {portable_exp2f(e), static_cast<float>(std::exp2(static_cast<double>(e)))},
                               {portable_powf(10000.0f, p),
                                static_cast<float>(std::pow(10000.0, static_cast<double>(p)))}};
    for (const auto& [ours, libm] : pairs) {
      if (ours == libm) continue;
      ++differing;
      EXPECT_EQ(std::nextafter(libm, ours), ours) << "more than one float ulp apart";
    }
  }
  EXPECT_LE(differing, 2);
}

TEST(PortableMath, SpecialValues) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(portable_exp(0.0), 1.0);
  EXPECT_EQ(portable_exp(-inf), 0.0);
  EXPECT_EQ(portable_exp(-800.0), 0.0);
  EXPECT_EQ(portable_exp(710.0), inf);
  EXPECT_TRUE(std::isnan(portable_exp(nan)));
  EXPECT_GT(portable_exp(-745.0), 0.0);  // the smallest subnormals
  EXPECT_EQ(portable_exp2(-1074.0), std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(portable_exp2(1023.0), 0x1p1023);
  EXPECT_EQ(portable_exp2(1024.0), inf);
  EXPECT_EQ(portable_exp2f(-3.0f), 0.125f);
  EXPECT_EQ(portable_log(1.0), 0.0);
  EXPECT_EQ(portable_log(0.0), -inf);
  EXPECT_EQ(portable_log(inf), inf);
  EXPECT_TRUE(std::isnan(portable_log(-1.0)));
  EXPECT_NEAR(portable_log(std::numeric_limits<double>::denorm_min()), -744.44007192138126, 1e-12);
  EXPECT_EQ(portable_sin(0.0), 0.0);
  EXPECT_EQ(portable_cos(0.0), 1.0);
  EXPECT_TRUE(std::isnan(portable_sin(inf)));
  EXPECT_TRUE(std::isnan(portable_cos(nan)));
  EXPECT_TRUE(std::isnan(portable_sin(2e9)));  // outside the served range, not a wrong number
  EXPECT_EQ(portable_powf(2.0f, 10.0f), 1024.0f);
  EXPECT_EQ(portable_powf(10000.0f, 0.0f), 1.0f);
  EXPECT_EQ(portable_powf(0.0f, 0.5f), 0.0f);
  // Odd and even symmetry hold exactly (the reduction and the kernels are sign-symmetric).
  for (double x : {0.3, 1.7, 123.456, 2999.5}) {
    EXPECT_EQ(portable_sin(-x), -portable_sin(x)) << x;
    EXPECT_EQ(portable_cos(-x), portable_cos(x)) << x;
  }
}

// tanh and erf serve the GELUs, where only 1 + f(x) matters: absolute error against libm over a
// dense sweep, the exact ends and the symmetry.
TEST(PortableMath, TanhAndErfAreAbsolutelyAccurate) {
  double worst_tanh = 0.0, worst_erf = 0.0;
  for (int i = -20000; i <= 20000; ++i) {
    const double x = i * 4.0e-4 + (i % 13) * 1e-7;
    worst_tanh = std::max(worst_tanh, std::fabs(portable_tanh(x) - std::tanh(x)));
    worst_erf = std::max(worst_erf, std::fabs(portable_erf(x) - std::erf(x)));
  }
  EXPECT_LE(worst_tanh, 1e-15);
  EXPECT_LE(worst_erf, 1e-13);
  std::printf("worst absolute error: tanh %.2e, erf %.2e\n", worst_tanh, worst_erf);
  for (double x : {0.0, 0.25, 3.0, 5.99, 6.0, 30.0}) {
    EXPECT_EQ(portable_tanh(-x), -portable_tanh(x)) << x;
    EXPECT_EQ(portable_erf(-x), -portable_erf(x)) << x;
  }
  EXPECT_EQ(portable_erf(0.0), 0.0);
  EXPECT_EQ(portable_tanh(0.0), 0.0);
  EXPECT_EQ(portable_erf(7.0), 1.0);
  EXPECT_EQ(portable_tanh(25.0), 1.0);
  EXPECT_TRUE(std::isnan(portable_erf(std::numeric_limits<double>::quiet_NaN())));
}

// The contract: these bits on every IEEE-754 host and C library. A change here changes every
// table the GPU reads from the host (and so every latent): update the digest only on purpose,
// together with the checksums of record (tools/bench/checksum_history.py).
TEST(PortableMath, TheBitsOfAFixedSweepArePinned) {
  std::vector<uint32_t> out;
  for (int i = -4000; i <= 4000; ++i) {
    const float x = static_cast<float>(i) * 0.7853981f + static_cast<float>(i % 7) * 1e-3f;
    out.push_back(std::bit_cast<uint32_t>(portable_sinf(x)));
    out.push_back(std::bit_cast<uint32_t>(portable_cosf(x)));
    out.push_back(std::bit_cast<uint32_t>(portable_expf(static_cast<float>(i) * 0.02f)));
    out.push_back(std::bit_cast<uint32_t>(portable_powf(10000.0f, static_cast<float>(i + 4000) / 8000.0f)));
  }
  EXPECT_EQ(sha256_hex(out.data(), out.size() * sizeof(uint32_t)), "71ad83f30a8c4a7043f74f44eeb54c53200c336410d51faaaf7eac240b3280e7");
}

}  // namespace
}  // namespace vortex
