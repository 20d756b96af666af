// exp, exp2, log, sin, cos, tanh, erf and pow whose bits do not depend on the C library.
//
// The host computes a few tables that the GPU program reads: the timestep sinusoid and the time
// MLP's SiLU, the RoPE tables of the transformer and the video VAE, the audio VAE's snake
// parameters. With libm's float functions those tables, and through them every latent the GPU
// writes, followed the host's C library (glibc picks its expf / sinf / powf variant by CPU
// features, and its sinf is not correctly rounded on ~1.3% of arguments; other libraries round
// differently). The CPU program's own transcendentals (SwiGLU's and the time MLP's SiLU, the
// snake's sin, the int8fp8 reference's exp2, the audio resampler's sinc) did too. These functions
// evaluate in double with operations IEEE 754 rounds correctly (+, −, ×, /, fma, exact scaling by
// powers of two) in a fixed order, so every conforming host gets the same bits; each float result
// is the double result rounded once, within ~2e-16 relative of the true value, so it is the
// correctly rounded float except for inputs within that distance of a rounding midpoint. The
// random sampler (core/rng.h) follows the same rule for the initial noise; the exact CPU
// attention has its own fixed-order exp (cpu/attention.cc).
#pragma once

#include <cmath>
#include <cstdint>

namespace vortex {

// Python's round() of a double to an integer: half to even (the default rounding mode's
// nearbyint, exact for every double in int64's range).
inline int64_t python_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// Double-precision kernels, each within a few double ulp: exp and exp2 for any x (0 below −745.2
// and −1075, inf above 709.78 and from 1024), log for x > 0 (NaN for x < 0 or NaN, −inf at 0),
// sin and cos for |x| < 2^30 (NaN beyond and for non-finite x; no caller comes near).
double portable_exp(double x);
double portable_exp2(double x);
double portable_log(double x);
double portable_sin(double x);
double portable_cos(double x);
// tanh and erf for any x, within 1e-15 and 1e-13 *absolute* (what 1 + tanh and 1 + erf in the
// GELUs need; a tiny result's relative error is larger): tanh from exp, erf from its all-positive
// series e^{-x²} · Σ 2^n x^{2n+1} / (1·3···(2n+1)) up to |x| = 6 (±1 beyond, to double precision).
double portable_tanh(double x);
double portable_erf(double x);

// The float functions: the double kernels on the float argument, rounded once.
float portable_expf(float x);
float portable_exp2f(float x);
float portable_sinf(float x);
float portable_cosf(float x);
// base^exponent for base > 0, as exp(exponent · ln base) in double.
float portable_powf(float base, float exponent);

}  // namespace vortex
