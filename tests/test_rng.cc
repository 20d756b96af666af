// Philox4x32-10 and the normal sampler of core/rng.h: known answers, the documented
// (seed, stream, element) mapping checked against a double-precision reference, exhaustive accuracy
// of the fp32 ln / sin / cos, range independence and distribution statistics.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "core/rng.h"

namespace vortex {
namespace {

void expect_philox(const uint32_t counter[4], const uint32_t key[2], const uint32_t expected[4]) {
  const U32x4 got = philox4x32_10(counter, key);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], expected[i]) << "word " << i;
}

// The Random123 known-answer vectors for philox4x32 with 10 rounds (kat_vectors).
TEST(Philox, Random123KnownAnswers) {
  {
    const uint32_t ctr[4] = {0, 0, 0, 0}, key[2] = {0, 0};
    const uint32_t want[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
    expect_philox(ctr, key, want);
  }
  {
    const uint32_t ctr[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    const uint32_t key[2] = {0xffffffffu, 0xffffffffu};
    const uint32_t want[4] = {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu};
    expect_philox(ctr, key, want);
  }
  {
    const uint32_t ctr[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    const uint32_t key[2] = {0xa4093822u, 0x299f31d0u};
    const uint32_t want[4] = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
    expect_philox(ctr, key, want);
  }
}

TEST(Philox, BlockUsesTheDocumentedCounterAndKey) {
  const uint64_t seed = 0xa4093822299f31d0ull, stream = 0x1111111122222222ull, block = 0x3333333344444444ull;
  const uint32_t ctr[4] = {0x44444444u, 0x33333333u, 0x22222222u, 0x11111111u};
  const uint32_t key[2] = {0x299f31d0u, 0xa4093822u};
  const U32x4 direct = philox4x32_10(ctr, key);
  const U32x4 mapped = philox_block(seed, stream, block);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(mapped.v[i], direct.v[i]) << "word " << i;
}

TEST(Philox, UniformIsInOpenZeroClosedOne) {
  EXPECT_EQ(uniform_from_uint32(0u), std::ldexp(1.0f, -24));
  EXPECT_EQ(uniform_from_uint32(0xFFu), std::ldexp(1.0f, -24));  // the low 8 bits are dropped
  EXPECT_EQ(uniform_from_uint32(0x100u), std::ldexp(1.0f, -23));
  EXPECT_EQ(uniform_from_uint32(0x80000000u), 0.5f + std::ldexp(1.0f, -24));
  EXPECT_EQ(uniform_from_uint32(0xFFFFFFFFu), 1.0f);
}

// Every u the sampler can produce (k * 2^-24, k in [1, 2^24]): within 2 ulp of the true ln.
TEST(Philox, LogIsAccurateOnEveryUniform) {
  EXPECT_EQ(rng_log(1.0f), 0.0f);
  double worst_ulp = 0;
  uint32_t worst_k = 0;
  for (uint32_t k = 1; k < (1u << 24); ++k) {
    const float u = static_cast<float>(k) * (1.0f / 16777216.0f);
    const double exact = std::log(static_cast<double>(u));
    const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(exact)) - 23);
    const double err = std::fabs(static_cast<double>(rng_log(u)) - exact) / ulp;
    if (err > worst_ulp) {
      worst_ulp = err;
      worst_k = k;
    }
  }
  EXPECT_LE(worst_ulp, 2.0) << "at k = " << worst_k;
}

// Every angle the sampler can produce: sin and cos within 1e-7 (about 1.7 * 2^-24) absolute.
TEST(Philox, SinCosAreAccurateOnEveryAngle) {
  double worst = 0;
  uint32_t worst_k = 0;
  for (uint32_t k = 0; k <= (1u << 24); ++k) {
    float s, c;
    rng_sincos_turns24(k, &s, &c);
    const double a = 2.0 * std::numbers::pi * static_cast<double>(k) / 16777216.0;
    const double err = std::fmax(std::fabs(s - std::sin(a)), std::fabs(c - std::cos(a)));
    if (err > worst) {
      worst = err;
      worst_k = k;
    }
  }
  EXPECT_LE(worst, 1e-7) << "at k = " << worst_k;
}

// The header's formula evaluated in double straight from philox4x32_10 with a hand-built counter.
double reference_normal(uint64_t seed, uint64_t stream, uint64_t element) {
  const uint64_t block = element / 4;
  const uint32_t ctr[4] = {static_cast<uint32_t>(block & 0xFFFFFFFFu), static_cast<uint32_t>(block >> 32),
                           static_cast<uint32_t>(stream & 0xFFFFFFFFu), static_cast<uint32_t>(stream >> 32)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed & 0xFFFFFFFFu), static_cast<uint32_t>(seed >> 32)};
  const U32x4 x = philox4x32_10(ctr, key);
  const int pair = static_cast<int>(element % 4) / 2;
  const double u_radius = ((x.v[2 * pair] >> 8) + 1) / 16777216.0;
  const double u_angle = ((x.v[2 * pair + 1] >> 8) + 1) / 16777216.0;
  const double r = std::sqrt(-2.0 * std::log(u_radius));
  const double a = 2.0 * std::numbers::pi * u_angle;
  return element % 2 == 0 ? r * std::cos(a) : r * std::sin(a);
}

TEST(Philox, NormalFollowsTheDocumentedFormula) {
  struct Case {
    uint64_t seed, stream, first;
  };
  const Case cases[] = {{0, 0, 0},
                        {42, 7, 1001},
                        {0xFEDCBA9876543210ull, 0x0123456789ABCDEFull, (1ull << 34) + 2},
                        {~0ull, ~0ull, (1ull << 62) - 64}};
  for (const Case& c : cases) {
    std::vector<float> z(40000);
    fill_normal(z.data(), static_cast<int64_t>(z.size()), c.seed, c.stream, static_cast<int64_t>(c.first));
    double worst = 0;
    for (size_t i = 0; i < z.size(); ++i) {
      const double want = reference_normal(c.seed, c.stream, c.first + i);
      // Relative to the radius: an fp32 r (up to 5.8) times an fp32 cos carries a few r-ulps.
      worst = std::fmax(worst, std::fabs(z[i] - want) / std::fmax(1.0, std::fabs(want)));
    }
    EXPECT_LE(worst, 5e-7) << "seed " << c.seed << " stream " << c.stream << " first " << c.first;
  }
}

// Pinned outputs: the sampler is a cross-device contract, so any change to it must be deliberate.
// The formula test above ties these bits to the documented mapping.
TEST(Philox, GoldenValues) {
  const uint32_t want_seed42[8] = {0xbf785e5bu, 0x3e46acd4u, 0xbf9e28d2u, 0x3ff64339u,
                                   0xbd95e01bu, 0x3e0e79fcu, 0xbf8da733u, 0x3ea742fdu};
  float z[8];
  fill_normal(z, 8, 42, 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(z[i]), want_seed42[i]) << i;
  // High words of seed, stream and block all in use.
  const uint32_t want_high[4] = {0x3f9f77a9u, 0x3efdd290u, 0x40331951u, 0x3f8764dcu};
  fill_normal(z, 4, 0xFEDCBA9876543210ull, 0x0123456789ABCDEFull, (int64_t{1} << 34) + 2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(z[i]), want_high[i]) << i;
}

bool same_bits(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  }
  return true;
}

TEST(Philox, FillIsDeterministic) {
  std::vector<float> a(10007), b(10007);
  fill_normal(a.data(), 10007, 123, 4);
  fill_normal(b.data(), 10007, 123, 4);
  EXPECT_TRUE(same_bits(a.data(), b.data(), a.size()));
  for (size_t i : {size_t{0}, size_t{1}, size_t{5}, size_t{10006}}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(normal_at(123, 4, i)), std::bit_cast<uint32_t>(a[i])) << i;
  }
}

// A shard filling [k, n) must see exactly the tail of the whole fill, whatever k's alignment to
// the four-element blocks; so must a fill split into uneven pieces.
TEST(Philox, FillDoesNotDependOnWhereTheRangeStarts) {
  const int64_t n = 4099;
  std::vector<float> whole(n);
  fill_normal(whole.data(), n, 99, 3);
  for (int64_t k : {1, 2, 3, 4, 5, 7, 1024, 4097}) {
    std::vector<float> tail(n - k);
    fill_normal(tail.data(), n - k, 99, 3, k);
    EXPECT_TRUE(same_bits(tail.data(), whole.data() + k, tail.size())) << "k = " << k;
  }
  std::vector<float> pieces(n);
  int64_t start = 0;
  for (int64_t len : {1, 2, 5, 3, 1000, 3088}) {
    fill_normal(pieces.data() + start, len, 99, 3, start);
    start += len;
  }
  ASSERT_EQ(start, n);
  EXPECT_TRUE(same_bits(pieces.data(), whole.data(), pieces.size()));
  fill_normal(pieces.data(), 0, 99, 3, 17);  // an empty range writes nothing
  EXPECT_TRUE(same_bits(pieces.data(), whole.data(), pieces.size()));
}

double correlation(const std::vector<float>& a, const std::vector<float>& b) {
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += static_cast<double>(a[i]) * b[i];
    saa += static_cast<double>(a[i]) * a[i];
    sbb += static_cast<double>(b[i]) * b[i];
  }
  return sab / std::sqrt(saa * sbb);
}

TEST(Philox, SeedsAndStreamsAreIndependent) {
  const int64_t n = 1 << 18;
  std::vector<float> base(n), other_seed(n), other_stream(n);
  fill_normal(base.data(), n, 5, 0);
  fill_normal(other_seed.data(), n, 6, 0);
  fill_normal(other_stream.data(), n, 5, 1);
  // Independent standard normals: the sample correlation has standard deviation 1/sqrt(n) = 0.002.
  EXPECT_LT(std::fabs(correlation(base, other_seed)), 0.01);
  EXPECT_LT(std::fabs(correlation(base, other_stream)), 0.01);
  // Neighbouring elements share a Philox block (cos and sin of one angle): still uncorrelated.
  std::vector<float> even(n / 2), odd(n / 2);
  for (int64_t i = 0; i < n / 2; ++i) {
    even[i] = base[2 * i];
    odd[i] = base[2 * i + 1];
  }
  EXPECT_LT(std::fabs(correlation(even, odd)), 0.01);
}

// Moments of 2^20 samples against N(0, 1), each within about 5 standard errors.
TEST(Philox, NormalMomentsOverAMillionSamples) {
  const int64_t n = 1 << 20;
  std::vector<float> z(n);
  fill_normal(z.data(), n, 2024, 0);
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  int64_t within_1 = 0, within_2 = 0;
  for (float f : z) {
    const double x = f;
    s1 += x;
    s2 += x * x;
    s3 += x * x * x;
    s4 += x * x * x * x;
    within_1 += std::fabs(x) < 1.0;
    within_2 += std::fabs(x) < 2.0;
    ASSERT_TRUE(std::isfinite(f));
    ASSERT_LT(std::fabs(f), 5.8f);  // sqrt(-2 ln 2^-24) = 5.77 bounds every sample
  }
  const double mean = s1 / n;
  const double var = s2 / n - mean * mean;
  EXPECT_LT(std::fabs(mean), 5.0 / std::sqrt(n));                // sd 1/sqrt(n)
  EXPECT_LT(std::fabs(var - 1.0), 5.0 * std::sqrt(2.0 / n));     // sd sqrt(2/n)
  EXPECT_LT(std::fabs(s3 / n), 5.0 * std::sqrt(15.0 / n));       // sd sqrt(15/n)
  EXPECT_LT(std::fabs(s4 / n - 3.0), 5.0 * std::sqrt(96.0 / n));  // sd sqrt((105 - 9)/n)
  const double p1 = 0.682689492137086, p2 = 0.954499736103642;
  EXPECT_LT(std::fabs(static_cast<double>(within_1) / n - p1), 5.0 * std::sqrt(p1 * (1 - p1) / n));
  EXPECT_LT(std::fabs(static_cast<double>(within_2) / n - p2), 5.0 * std::sqrt(p2 * (1 - p2) / n));
}

}  // namespace
}  // namespace vortex
