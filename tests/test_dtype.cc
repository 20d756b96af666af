// Exhaustive checks of core/dtype.h (DESIGN section 3). Nothing here reuses dtype.h's own logic:
// codes are decoded from their sign/exponent/mantissa fields with std::ldexp, and every rounding
// is compared with a brute-force search for the nearest entry in the sorted table of a format's
// representable values, so a shared mistake cannot hide in both sides.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace vortex {
namespace {

// What the all-ones exponent field means: IEEE (inf and NaNs), OCP e4m3 "fn" (only S.1111.111 is
// NaN, no infinity), or nothing special (e2m1).
enum class Specials { kIeee, kOnlyMaxCodeIsNan, kNone };

struct Format {
  const char* name;
  int exp_bits;
  int mant_bits;
  int bias;
  Specials specials;
  bool saturates;  // finite overflow clamps to the largest finite value instead of becoming inf
  bool nan_keeps_sign;  // false where every NaN encodes to one canonical NaN (bf16: 0x7FFF)
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);

  int magnitude_bits() const { return exp_bits + mant_bits; }
  uint32_t sign_bit() const { return 1u << magnitude_bits(); }
};

const Format kBf16{"bf16", 8, 7, 127, Specials::kIeee, false, false,
                   [](float f) -> uint32_t { return f32_to_bf16_bits(f); },
                   [](uint32_t c) { return bf16_bits_to_f32(static_cast<uint16_t>(c)); }};
const Format kF16{"f16", 5, 10, 15, Specials::kIeee, false, true,
                  [](float f) -> uint32_t { return f32_to_f16_bits(f); },
                  [](uint32_t c) { return f16_bits_to_f32(static_cast<uint16_t>(c)); }};
const Format kE4m3{"e4m3", 4, 3, 7, Specials::kOnlyMaxCodeIsNan, true, true,
                   [](float f) -> uint32_t { return f32_to_e4m3_bits(f); },
                   [](uint32_t c) { return e4m3_bits_to_f32(static_cast<uint8_t>(c)); }};
const Format kE5m2{"e5m2", 5, 2, 15, Specials::kIeee, true, true,
                   [](float f) -> uint32_t { return f32_to_e5m2_bits(f); },
                   [](uint32_t c) { return e5m2_bits_to_f32(static_cast<uint8_t>(c)); }};
const Format kE2m1{"e2m1", 2, 1, 1, Specials::kNone, true, true,
                   [](float f) -> uint32_t { return f32_to_e2m1_code(f); },
                   [](uint32_t c) { return e2m1_code_to_f32(static_cast<uint8_t>(c)); }};

// The value a code stands for, from its fields alone.
double reference_decode(const Format& fmt, uint32_t code) {
  const uint32_t mant_max = (1u << fmt.mant_bits) - 1;
  const uint32_t exp_max = (1u << fmt.exp_bits) - 1;
  const uint32_t mant = code & mant_max;
  const uint32_t exp = (code >> fmt.mant_bits) & exp_max;
  const bool negative = (code & fmt.sign_bit()) != 0;
  double magnitude;
  if (fmt.specials == Specials::kIeee && exp == exp_max) {
    magnitude = mant == 0 ? std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::quiet_NaN();
  } else if (fmt.specials == Specials::kOnlyMaxCodeIsNan && exp == exp_max && mant == mant_max) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    magnitude = std::ldexp(static_cast<double>(mant), 1 - fmt.bias - fmt.mant_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>(mant + (1u << fmt.mant_bits)),
                           static_cast<int>(exp) - fmt.bias - fmt.mant_bits);
  }
  return negative ? -magnitude : magnitude;
}

uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
float float_from_bits(uint32_t u) { return std::bit_cast<float>(u); }

std::string describe(float f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g (0x%08x)", static_cast<double>(f), float_bits(f));
  return buf;
}

// Collects failures so that an exhaustive loop reports a count and a few examples instead of
// thousands of gtest lines.
class Mismatches {
 public:
  void add(const std::string& what) {
    if (count_ < 8) examples_ += "\n  " + what;
    ++count_;
  }
  int64_t count() const { return count_; }
  const std::string& examples() const { return examples_; }

 private:
  int64_t count_ = 0;
  std::string examples_;
};

// Every non-negative target of rounding, ascending: the finite magnitudes, plus 2^(emax+1) standing
// for infinity in IEEE formats that do not saturate (RNE treats infinity as the next value up,
// with an even mantissa of 0).
struct RoundingTable {
  std::vector<double> values;
  std::vector<uint32_t> codes;
};

RoundingTable make_rounding_table(const Format& fmt) {
  RoundingTable table;
  for (uint32_t code = 0; code < fmt.sign_bit(); ++code) {
    const double v = reference_decode(fmt, code);
    if (std::isnan(v)) continue;
    if (std::isinf(v)) {
      if (fmt.saturates) continue;
      table.values.push_back(std::ldexp(1.0, (1 << fmt.exp_bits) - 1 - fmt.bias));
    } else {
      table.values.push_back(v);
    }
    table.codes.push_back(code);
  }
  return table;
}

// Round to nearest, ties to the code whose lowest bit is 0; beyond the last entry, the last entry
// (the largest finite value when saturating, infinity otherwise). Comparing 2|x| with lo + hi
// keeps the decision exact in double: both sides carry far fewer than 53 significant bits.
uint32_t reference_encode(const Format& fmt, const RoundingTable& table, float x) {
  const double a = std::fabs(static_cast<double>(x));
  const uint32_t sign = std::signbit(x) ? fmt.sign_bit() : 0u;
  const auto it = std::lower_bound(table.values.begin(), table.values.end(), a);
  const size_t i = static_cast<size_t>(it - table.values.begin());
  if (i == table.values.size()) return sign | table.codes.back();
  if (i == 0 || table.values[i] == a) return sign | table.codes[i];
  const double twice = 2.0 * a;
  const double lo_plus_hi = table.values[i - 1] + table.values[i];
  uint32_t code;
  if (twice < lo_plus_hi) {
    code = table.codes[i - 1];
  } else if (twice > lo_plus_hi) {
    code = table.codes[i];
  } else {
    code = (table.codes[i - 1] & 1u) == 0 ? table.codes[i - 1] : table.codes[i];
  }
  return sign | code;
}

// Every code decodes to the value its fields define; every non-NaN code re-encodes to itself and
// every NaN code decodes to a NaN that re-encodes to a NaN (of the same sign where the format
// keeps it).
void check_all_codes_round_trip(const Format& fmt) {
  Mismatches bad;
  for (uint32_t code = 0; code < 2 * fmt.sign_bit(); ++code) {
    const double expected = reference_decode(fmt, code);
    const float decoded = fmt.decode(code);
    char tag[96];
    std::snprintf(tag, sizeof(tag), "%s code 0x%x", fmt.name, code);
    if (std::isnan(expected)) {
      const float again = fmt.decode(fmt.encode(decoded));
      if (!std::isnan(decoded) || !std::isnan(again) ||
          (fmt.nan_keeps_sign && std::signbit(again) != std::signbit(decoded))) {
        bad.add(std::string(tag) + ": NaN did not stay NaN");
      }
      continue;
    }
    // The formats are all exactly representable in f32; comparing bits also checks the sign of zero.
    if (float_bits(decoded) != float_bits(static_cast<float>(expected))) {
      bad.add(std::string(tag) + " decodes to " + describe(decoded) + ", fields say " +
              describe(static_cast<float>(expected)));
    }
    const uint32_t encoded = fmt.encode(decoded);
    const bool saturated_inf = fmt.saturates && std::isinf(expected);  // e5m2: own test
    if (!saturated_inf && encoded != code) {
      char msg[64];
      std::snprintf(msg, sizeof(msg), " re-encodes to 0x%x", encoded);
      bad.add(std::string(tag) + msg);
    }
  }
  EXPECT_EQ(bad.count(), 0) << bad.examples();
}

TEST(Dtype, Bf16EveryPatternRoundTrips) { check_all_codes_round_trip(kBf16); }
TEST(Dtype, F16EveryPatternRoundTrips) { check_all_codes_round_trip(kF16); }
TEST(Dtype, E4m3EveryPatternRoundTrips) { check_all_codes_round_trip(kE4m3); }
TEST(Dtype, E5m2EveryPatternRoundTrips) { check_all_codes_round_trip(kE5m2); }
TEST(Dtype, E2m1EveryCodeRoundTrips) { check_all_codes_round_trip(kE2m1); }

TEST(Dtype, FormatLandmarks) {
  // Spot values from the format definitions, so that the independent decoder is itself checked.
  EXPECT_EQ(reference_decode(kE4m3, 0x7E), 448.0);
  EXPECT_EQ(reference_decode(kE4m3, 0x01), std::ldexp(1.0, -9));
  EXPECT_TRUE(std::isnan(reference_decode(kE4m3, 0x7F)));
  EXPECT_TRUE(std::isnan(reference_decode(kE4m3, 0xFF)));
  EXPECT_EQ(reference_decode(kE5m2, 0x7B), 57344.0);
  EXPECT_EQ(reference_decode(kE5m2, 0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(reference_decode(kF16, 0x7BFF), 65504.0);
  EXPECT_EQ(reference_decode(kBf16, 0x3F80), 1.0);
  const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint32_t c = 0; c < 8; ++c) {
    EXPECT_EQ(reference_decode(kE2m1, c), e2m1[c]) << c;
    EXPECT_EQ(reference_decode(kE2m1, c | 8u), -e2m1[c]) << c;
  }
}

TEST(Dtype, E5m2InfinityDecodesAndSaturates) {
  EXPECT_EQ(e5m2_bits_to_f32(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(e5m2_bits_to_f32(0xFC), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f32_to_e5m2_bits(std::numeric_limits<float>::infinity()), 0x7B);
  EXPECT_EQ(f32_to_e5m2_bits(-std::numeric_limits<float>::infinity()), 0xFB);
  EXPECT_EQ(e5m2_bits_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(f32_to_e5m2_bits(1e30f), 0x7B);
  EXPECT_EQ(f32_to_e5m2_bits(-1e30f), 0xFB);
}

TEST(Dtype, NanInputs) {
  const uint32_t nans[] = {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0x7FA00000u};
  for (uint32_t bits : nans) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float nan = float_from_bits(bits | sign);
      const bool negative = sign != 0;
      SCOPED_TRACE(describe(nan));
      // bf16: every NaN becomes the canonical 0x7FFF, as the GPU's conversion writes it (a quiet
      // NaN: its top mantissa bit is set). f16 keeps a quiet NaN with its sign.
      EXPECT_EQ(f32_to_bf16_bits(nan), 0x7FFFu);
      EXPECT_TRUE(std::isnan(round_bf16(nan)));
      const uint16_t h = f32_to_f16_bits(nan);
      EXPECT_EQ((h & 0x7C00u), 0x7C00u);
      EXPECT_NE((h & 0x0200u), 0u) << "f16 NaN must be quiet";
      EXPECT_EQ((h & 0x8000u) != 0, negative);
      // e4m3 has exactly one NaN per sign.
      EXPECT_EQ(f32_to_e4m3_bits(nan), negative ? 0xFF : 0x7F);
      // e5m2: any quiet NaN code (S.11111.1x).
      const uint8_t e = f32_to_e5m2_bits(nan);
      EXPECT_EQ((e & 0x7Eu), 0x7Eu);
      EXPECT_EQ((e & 0x80u) != 0, negative);
      // e2m1 has no NaN: documented to become 6 with the NaN's sign.
      EXPECT_EQ(f32_to_e2m1_code(nan), negative ? 0xF : 0x7);
    }
  }
}

// ---- rounding against the brute-force reference -------------------------------------------------

void add_with_neighbours(std::vector<float>& out, float f) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {f, -f}) {
    out.push_back(s);
    out.push_back(std::nextafter(s, inf));
    out.push_back(std::nextafter(s, -inf));
  }
}

// The inputs most likely to expose a rounding bug in `fmt`: every midpoint between adjacent
// rounding targets (the exact ties) and their f32 neighbours, and the saturation thresholds.
void add_format_boundaries(std::vector<float>& out, const Format& fmt, const RoundingTable& table) {
  for (size_t i = 0; i < table.values.size(); ++i) {
    add_with_neighbours(out, static_cast<float>(table.values[i]));
    if (i == 0) continue;
    const double mid = 0.5 * (table.values[i - 1] + table.values[i]);
    ASSERT_EQ(static_cast<double>(static_cast<float>(mid)), mid) << fmt.name << " midpoint not f32";
    add_with_neighbours(out, static_cast<float>(mid));
  }
  if (fmt.saturates) {
    // Where the next binade's first value would be, and the midpoint below it: the places a
    // non-saturating rounding would step past the largest finite value.
    const double max = table.values.back();
    const double step = max - table.values[table.values.size() - 2];
    add_with_neighbours(out, static_cast<float>(max + step / 2));
    add_with_neighbours(out, static_cast<float>(max + step));
    add_with_neighbours(out, static_cast<float>(2 * max));
  }
}

const std::vector<float>& rounding_inputs() {
  static const std::vector<float> inputs = [] {
    std::vector<float> out;
    for (const Format* fmt : {&kBf16, &kF16, &kE4m3, &kE5m2, &kE2m1}) {
      add_format_boundaries(out, *fmt, make_rounding_table(*fmt));
    }
    const float inf = std::numeric_limits<float>::infinity();
    for (float f : {0.0f, inf, std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                    std::numeric_limits<float>::denorm_min(),
                    std::nextafter(std::numeric_limits<float>::min(), 0.0f)}) {
      add_with_neighbours(out, f);
    }
    std::mt19937 rng(20240611);
    // f32 subnormals: far below every small format, but they exercise the encoders' scaling.
    for (int i = 0; i < 4096; ++i) out.push_back(float_from_bits(static_cast<uint32_t>(rng()) & 0x807FFFFFu));
    // Uniform bit patterns (most are huge or tiny), then patterns whose exponent lands in
    // [2^-30, 2^18), the range where f16 and the 8- and 4-bit formats actually round.
    for (int i = 0; i < (1 << 19); ++i) {
      const float f = float_from_bits(static_cast<uint32_t>(rng()));
      if (!std::isnan(f)) out.push_back(f);
    }
    for (int i = 0; i < (1 << 19); ++i) {
      const uint32_t r = static_cast<uint32_t>(rng());
      const uint32_t exp = 127 - 30 + (r >> 23) % 48;
      out.push_back(float_from_bits((r & 0x807FFFFFu) | (exp << 23)));
    }
    return out;
  }();
  return inputs;
}

void check_rounding(const Format& fmt) {
  const RoundingTable table = make_rounding_table(fmt);
  const std::vector<float>& inputs = rounding_inputs();
  Mismatches bad;
  for (float x : inputs) {
    const uint32_t got = fmt.encode(x);
    const uint32_t want = reference_encode(fmt, table, x);
    if (got != want) {
      char msg[96];
      std::snprintf(msg, sizeof(msg), " -> 0x%x, nearest is 0x%x", got, want);
      bad.add(std::string(fmt.name) + ": " + describe(x) + msg);
    }
  }
  EXPECT_GT(inputs.size(), 1000000u);
  EXPECT_EQ(bad.count(), 0) << bad.count() << " of " << inputs.size() << " inputs" << bad.examples();
}

TEST(Dtype, Bf16RoundingMatchesReference) { check_rounding(kBf16); }
TEST(Dtype, F16RoundingMatchesReference) { check_rounding(kF16); }
TEST(Dtype, E4m3RoundingMatchesReference) { check_rounding(kE4m3); }
TEST(Dtype, E5m2RoundingMatchesReference) { check_rounding(kE5m2); }
TEST(Dtype, E2m1RoundingMatchesReference) { check_rounding(kE2m1); }

TEST(Dtype, OverflowBehaviour) {
  // The documented edges, spelled out: IEEE formats overflow to inf from the midpoint above their
  // largest finite value; the fp8 and fp4 formats clamp.
  EXPECT_EQ(f32_to_bf16_bits(float_from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(f32_to_bf16_bits(float_from_bits(0x7F7F8000u)), 0x7F80);  // tie, to even = inf
  EXPECT_EQ(f32_to_f16_bits(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(f32_to_e4m3_bits(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3_bits(464.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3_bits(1e9f), 0x7E);
  EXPECT_EQ(f32_to_e4m3_bits(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e5m2_bits(61440.0f), 0x7B);
  EXPECT_EQ(f32_to_e2m1_code(5.0f), 0x6);  // tie between 4 and 6: even mantissa is 4
  EXPECT_EQ(f32_to_e2m1_code(7.0f), 0x7);
  EXPECT_EQ(f32_to_e2m1_code(-100.0f), 0xF);
}

TEST(Dtype, PackE2m1PutsFirstValueInLowNibble) {
  EXPECT_EQ(pack_e2m1x2(1.0f, -6.0f), 0xF2);
  EXPECT_EQ(pack_e2m1x2(-0.5f, 3.0f), 0x59);
  const RoundingTable table = make_rounding_table(kE2m1);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  Mismatches bad;
  for (int i = 0; i < 10000; ++i) {
    const float a = dist(rng), b = dist(rng);
    const uint32_t want = reference_encode(kE2m1, table, a) | (reference_encode(kE2m1, table, b) << 4);
    if (pack_e2m1x2(a, b) != want) bad.add(describe(a) + ", " + describe(b));
  }
  EXPECT_EQ(bad.count(), 0) << bad.examples();
}

TEST(Dtype, RoundBf16IsTheRoundTrip) {
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256.0f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256.0f), 1.0f + 4.0f / 256.0f);
  EXPECT_EQ(float_bits(round_bf16(-0.0f)), 0x80000000u);
}

}  // namespace
}  // namespace vortex
