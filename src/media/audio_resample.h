// Band-limited resampling of a waveform, as the reference pipeline resamples a ref2va soundtrack
// onto the audio VAE's rate: torchaudio's default Resample (a Hann-windowed sinc, 6 zero crossings
// each side, cutoff 0.99 of the lower Nyquist). No library needed (built in every configuration).
#pragma once

#include <cstdint>

#include "vortex/tensor.h"

namespace vortex::media {

// The sample rates resample_audio accepts (as the WAV reader and writer do).
constexpr int kMaxResampleRate = 768000;

// The length of a `samples`-long waveform at `from_rate` resampled to `to_rate`:
// ceil(samples · to / from) with both rates divided by their gcd. Rates must be in 1..kMaxResampleRate.
int64_t resampled_length(int64_t samples, int from_rate, int to_rate);

// waveform F32 [channels, samples] (samples >= 1, any stride) at `from_rate`, resampled to
// `to_rate`: F32 [channels, resampled_length]. The filter is the reference's: its taps computed in
// float64 where the reference does (the phase offset j / to in float32, as torch divides an integer
// range), rounded to float32 once; each output a dot product of float32 taps and samples,
// accumulated here in float64 (the reference's float32 convolution agrees within its rounding).
// Equal rates return the waveform as it is (contiguous F32, not filtered). Errors (invalid_argument): a rate outside
// 1..kMaxResampleRate, a waveform that is not F32 rank 2 on the CPU with samples, or non-finite.
Result<Tensor> resample_audio(const Tensor& waveform, int from_rate, int to_rate);

}  // namespace vortex::media
