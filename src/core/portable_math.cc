#include "core/portable_math.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

// Every multiply-add below is an explicit std::fma (correctly rounded, in hardware or software), and
// no product feeds an addition otherwise, so no compiler can fuse or split them differently (the
// library also builds with -ffp-contract=off). std::nearbyint and std::frexp are exact.
namespace vortex {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ln 2 = kLn2Hi + kLn2Lo: the double nearest ln 2 and the remainder.
constexpr double kLn2Hi = 0.6931471805599453;
constexpr double kLn2Lo = 2.3190468138462996e-17;
constexpr double kInvLn2 = 1.4426950408889634;

// pi/2 as four parts (the first three of 33 significant bits, the sum within 7.4e-49 of pi/2): each
// fma below subtracts n times one part exactly and rounds once, so r's error stays far below a
// float's rounding even where x is close to a multiple of pi/2.
const double kHalfPi1 = std::bit_cast<double>(uint64_t{0x3FF921FB54400000});
const double kHalfPi2 = std::bit_cast<double>(uint64_t{0x3DD0B4611A600000});
const double kHalfPi3 = std::bit_cast<double>(uint64_t{0x3BA3198A2E000000});
const double kHalfPi4 = std::bit_cast<double>(uint64_t{0x397B839A252049C1});
constexpr double kTwoOverPi = 0.6366197723675814;

// 1/k! for k = 0..16, from exact integer factorials rounded once to double.
constexpr std::array<double, 17> inverse_factorials() {
  std::array<double, 17> c{};
  uint64_t f = 1;
  for (int k = 0; k < 17; ++k) {
    if (k > 0) f *= static_cast<uint64_t>(k);
    c[k] = 1.0 / static_cast<double>(f);
  }
  return c;
}
constexpr std::array<double, 17> kInvFact = inverse_factorials();

// sin r and cos r for |r| <= pi/4 (plus the reduction's last bits): Taylor series to r^15 and r^16,
// whose first omitted terms are below 4.7e-17 and 2.1e-18.
double sin_kernel(double r) {
  const double z = r * r;
  double p = -kInvFact[15];
  for (int k = 13; k >= 3; k -= 2) p = std::fma(p, z, (k % 4 == 1) ? kInvFact[k] : -kInvFact[k]);
  return std::fma(r * z, p, r);
}

double cos_kernel(double r) {
  const double z = r * r;
  double p = kInvFact[16];
  for (int k = 14; k >= 2; k -= 2) p = std::fma(p, z, (k % 4 == 0) ? kInvFact[k] : -kInvFact[k]);
  return std::fma(z, p, 1.0);
}

// 2^n for n in [-1074, 1023], exactly (a subnormal power of two below -1022).
double power_of_two(int n) {
  if (n >= -1022) return std::bit_cast<double>(static_cast<uint64_t>(n + 1023) << 52);
  return std::bit_cast<double>(uint64_t{1} << (n + 1074));
}

// x = n·pi/2 + r with |r| <= pi/4 + tiny; n's low two bits pick the quadrant. False for inputs the
// kernels do not serve (non-finite, |x| >= 2^30).
bool reduce_half_pi(double x, double* r, int* quadrant) {
  if (!(std::fabs(x) < 1073741824.0)) return false;
  const double n = std::nearbyint(x * kTwoOverPi);
  double y = std::fma(-n, kHalfPi1, x);
  y = std::fma(-n, kHalfPi2, y);
  y = std::fma(-n, kHalfPi3, y);
  *r = std::fma(-n, kHalfPi4, y);
  *quadrant = static_cast<int>(static_cast<int64_t>(n) & 3);
  return true;
}

// sin(x + shift·pi/2) for shift in {0, 1}: the quadrant of x (plus the shift) picks ±sin r or ±cos r.
double sin_in_quadrant(double x, int shift) {
  double r = 0.0;
  int q = 0;
  if (!reduce_half_pi(x, &r, &q)) return kNaN;
  switch ((q + shift) & 3) {
    case 0: return sin_kernel(r);
    case 1: return cos_kernel(r);
    case 2: return -sin_kernel(r);
    default: return -cos_kernel(r);
  }
}

// e^r · 2^k for |r| <= ln2/2 (+ rounding): Taylor to r^12 (next term < 1.8e-16), in Estrin's order
// (a shorter dependency chain than Horner's; the order is fixed all the same), then one exact or
// correctly rounded product, split in two where 2^k is out of range.
double exp_reduced(double r, int k) {
  const double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
  const auto& c = kInvFact;
  const double q0 = std::fma(r, c[1], c[0]), q1 = std::fma(r, c[3], c[2]), q2 = std::fma(r, c[5], c[4]);
  const double q3 = std::fma(r, c[7], c[6]), q4 = std::fma(r, c[9], c[8]), q5 = std::fma(r, c[11], c[10]);
  const double s0 = std::fma(r2, q1, q0), s1 = std::fma(r2, q3, q2), s2 = std::fma(r2, q5, q4);
  const double t0 = std::fma(r4, s1, s0), t1 = std::fma(r4, c[12], s2);
  const double e_r = std::fma(r8, t1, t0);  // in [0.70, 1.42]
  if (k > 1023) return (e_r * 2.0) * power_of_two(k - 1);
  if (k < -1074) return (e_r * power_of_two(k + 64)) * power_of_two(-64);
  return e_r * power_of_two(k);
}

}  // namespace

double portable_exp(double x) {
  if (std::isnan(x)) return x;
  if (x > 709.782712893384) return kInf;
  if (x < -745.2) return 0.0;
  // x = n ln 2 + r, |r| <= ln2/2 (+ rounding), by a split ln 2.
  const double n = std::nearbyint(x * kInvLn2);
  return exp_reduced(std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x)), static_cast<int>(n));
}

double portable_exp2(double x) {
  if (std::isnan(x)) return x;
  if (x >= 1024.0) return kInf;
  if (x < -1075.0) return 0.0;
  // x = n + f with |f| <= 1/2, exact; 2^f = e^(f ln 2).
  const double n = std::nearbyint(x);
  return exp_reduced((x - n) * kLn2Hi, static_cast<int>(n));
}

double portable_log(double x) {
  if (std::isnan(x) || x < 0.0) return kNaN;
  if (x == 0.0) return -kInf;
  if (std::isinf(x)) return x;
  // x = m·2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s), s = (m − 1)/(m + 1), |s| <= 0.172,
  // by its odd series to s^23 (next term < 2e-20).
  int e = 0;
  double m = std::frexp(x, &e);  // m in [1/2, 1)
  if (m < 0.70710678118654752) {
    m *= 2.0;
    --e;
  }
  const double s = (m - 1.0) / (m + 1.0);  // m − 1 is exact
  const double z = s * s;
  double p = 1.0 / 23.0;
  for (int k = 21; k >= 3; k -= 2) p = std::fma(p, z, 1.0 / k);
  const double two_s = 2.0 * s;
  const double ln_m = std::fma(two_s * z, p, two_s);
  const double ef = static_cast<double>(e);
  return std::fma(ef, kLn2Hi, std::fma(ef, kLn2Lo, ln_m));
}

double portable_sin(double x) { return sin_in_quadrant(x, 0); }

// cos x = sin(x + pi/2): the same reduction, one quadrant on.
double portable_cos(double x) { return sin_in_quadrant(x, 1); }

double portable_tanh(double x) {
  if (x != x) return x;
  const double a = std::fabs(x);
  if (a > 20.0) return x > 0 ? 1.0 : -1.0;  // 1 - tanh(20) < 1e-17
  const double t = 1.0 - 2.0 / (portable_exp(2.0 * a) + 1.0);
  return x < 0 ? -t : t;
}

double portable_erf(double x) {
  if (x != x) return x;
  const double a = std::fabs(x);
  if (a >= 6.0) return x > 0 ? 1.0 : -1.0;  // 1 - erf(6) < 3e-17
  // Terms grow while 2x² > 2n + 1 and then fall geometrically; at |x| < 6 fewer than 160 are needed.
  const double z = 2.0 * a * a;
  double term = a, sum = a;
  for (int n = 1; n < 400; ++n) {
    term *= z / (2.0 * n + 1.0);
    sum += term;
    if (term < sum * 1e-17) break;
  }
  constexpr double kTwoOverSqrtPi = 1.1283791670955126;
  const double e = std::min(1.0, kTwoOverSqrtPi * portable_exp(-a * a) * sum);
  return x < 0 ? -e : e;
}

float portable_expf(float x) { return static_cast<float>(portable_exp(x)); }
float portable_exp2f(float x) { return static_cast<float>(portable_exp2(x)); }
float portable_sinf(float x) { return static_cast<float>(portable_sin(x)); }
float portable_cosf(float x) { return static_cast<float>(portable_cos(x)); }

float portable_powf(float base, float exponent) {
  if (exponent == 0.0f) return 1.0f;
  return static_cast<float>(portable_exp(static_cast<double>(exponent) * portable_log(base)));
}

}  // namespace vortex
