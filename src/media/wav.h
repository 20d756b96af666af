// WAV writer (16-bit PCM) and reader (PCM 8/16/24/32-bit, IEEE float 32/64, WAVE_FORMAT_EXTENSIBLE
// of those): RIFF/WAVE, no library needed (built in every configuration).
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

struct Waveform {
  Tensor samples;  // F32 [channels, samples]
  int sample_rate = 0;
};

// Reads a WAVE file's samples as floats the way ffmpeg's conversion to planar float does: signed
// PCM divided by 2^(bits - 1), 8-bit (unsigned) as (x - 128) / 128, float as stored. Chunks other
// than "fmt " and "data" are skipped. Errors (invalid_argument) name the file and the byte offset or
// field at fault: not RIFF/WAVE, a truncated chunk, a format that is not PCM or float, no data.
Result<Waveform> read_wav(const std::string& path);

}  // namespace vortex::media
