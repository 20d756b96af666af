// Anti-aliased resampling of the BigVGAN decoder (CPU reference, fp32), on time-major x[B, T, C].
//
//   kaiser_sinc_filter: the reference's low-pass taps: a Kaiser window (β from the attenuation
//       A = 2.285·(⌊K/2⌋ - 1)·π·4·half_width + 7.95: 0.1102·(A - 8.7) above 50 dB, the Kaiser
//       formula from 21 to 50, 0 below) times 2·cutoff·sinc(2·cutoff·t) at t = -K/2 + ½ … (even K)
//       or -⌊K/2⌋ … (odd K), normalised to sum 1. Computed in double; the reference computes it
//       in fp32 and stores the result in the checkpoint as a `filter` buffer, which the model
//       loads — this function serves synthetic weights and the tests that check the buffers.
//   upsample_1d (ratio r, K taps): replicate-pad the input by p = K/r - 1 on both sides, run the
//       depthwise transposed convolution with stride r, multiply by r, and crop
//       p·r + (K - r)/2 on the left and p·r + (K - r + 1)/2 on the right: exactly r·T samples.
//   lowpass_downsample_1d (ratio r, K taps): replicate-pad by K/2 - [K even] on the left and
//       K/2 on the right, then the depthwise convolution (correlation) with stride r:
//       ⌊(T + pads - K)/r⌋ + 1 samples (T/r for the decoder's even lengths).
//
// Every channel uses the same taps (the reference expands one [1, 1, K] filter over C groups).
#pragma once

#include <string>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

std::vector<float> kaiser_sinc_filter(double cutoff, double half_width, int kernel_size);

// The decoder's alias-free activation: upsample 2x and downsample 2x with 12-tap filters of
// cutoff 0.5/ratio and half width 0.6/ratio (the reference's fixed constants).
constexpr int kAliasFreeRatio = 2;
constexpr int kAliasFreeTaps = 12;

// x: contiguous F32 [B, T, C], T >= 1. Returns [B, ratio·T, C].
Result<Tensor> upsample_1d(const Tensor& x, const std::vector<float>& filter, int ratio);
// x: contiguous F32 [B, T, C], T >= 1. Returns [B, T_out, C].
Result<Tensor> lowpass_downsample_1d(const Tensor& x, const std::vector<float>& filter, int ratio);
int64_t lowpass_downsample_length(int64_t length, int taps, int ratio);

}  // namespace vortex::vae
