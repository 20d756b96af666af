// WAV writer: 16-bit PCM RIFF/WAVE, no library needed (built in every configuration).
#pragma once

#include <string>

#include "vortex/tensor.h"

namespace vortex::media {

// Writes `audio` f32 [C, S] (C = 1 or 2 channels, S samples per channel, values in [-1, 1]; bf16
// and f16 are accepted too) as a canonical 44-byte-header WAVE file: format 1 (PCM), 16 bits,
// little-endian, channels interleaved. Each sample is clipped to [-1, 1] and mapped to
// round(x * 32767), rounding half away from zero, so the scale is symmetric and -32768 never
// occurs. The file appears atomically (`<path>.tmp-<pid>`, fsync, rename); on any failure
// nothing is left at `path.tmp-<pid>` and an existing file at `path` is untouched.
// Errors: invalid_argument naming the tensor and field (device, rank, dtype, channels, the first
// NaN/inf element), a sample rate outside 1..768000, or a data chunk over the 4 GiB RIFF limit;
// io_error when the file cannot be written.
Status write_wav(const std::string& path, const Tensor& audio, int sample_rate);

}  // namespace vortex::media
