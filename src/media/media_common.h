// What the media writers share: input checks that name the tensor and field at fault, the
// sample quantisers, and the temp-file-then-rename discipline of every vortex file write.
//
// None of this needs libpng or libav*, so it is built in every configuration (the WAV writer
// uses it on the GPU machine, which has neither).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "vortex/tensor.h"

namespace vortex::media {

// `tensor` as a contiguous host f32 tensor of `rank` dims: f32 is used as is (a strided view is
// copied), bf16 and f16 are widened exactly; anything else is invalid_argument naming `what`.
Result<Tensor> host_f32(const Tensor& tensor, const std::string& what, int rank);

// invalid_argument naming the first NaN or infinity of a contiguous f32 tensor: its flat index
// and its coordinates, e.g. "video: element 1234 [0, 1, 2, 3] is NaN".
Status check_finite(const Tensor& f32, const std::string& what);

// A video tensor f32 [3, F, H, W] (RGB planes, values in [0, 1]) checked for shape and finite
// values and returned contiguous f32; errors name `what` and the field.
Result<Tensor> checked_video(const Tensor& video, const std::string& what);

// An audio tensor f32 [C, S] (values in [-1, 1]) with 1 <= C <= max_channels, checked for finite
// values and returned contiguous f32; errors name `what` and the field.
Result<Tensor> checked_audio(const Tensor& audio, const std::string& what, int max_channels);

// [0, 1] -> 0..255: values outside [0, 1] are clipped, then x * 255 is rounded half up.
inline uint8_t unit_to_u8(float x) {
  const float c = x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
  return static_cast<uint8_t>(c * 255.0f + 0.5f);
}

// [-1, 1] -> -32767..32767: values outside [-1, 1] are clipped, then x * 32767 is rounded half
// away from zero. The scale is symmetric, so -32768 never occurs and 0 stays exactly 0.
inline int16_t unit_to_s16(float x) {
  const float c = x < -1.0f ? -1.0f : (x > 1.0f ? 1.0f : x);
  return static_cast<int16_t>(std::lround(c * 32767.0f));
}

// Three [n] planes -> n interleaved RGB pixels, each value as unit_to_u8.
void planes_to_rgb(const float* r, const float* g, const float* b, int64_t n, uint8_t* rgb);

// A file that becomes visible at `path` only when commit() succeeds. Writers fill path() —
// `<path>.tmp-<pid>`, in the same directory so that the rename cannot cross file systems —
// and commit() fsyncs it and renames it over `path`. The destructor removes the temp file when
// commit() was not reached or failed, so a failed write leaves no partial output and any
// previous file at `path` untouched.
class TempFile {
 public:
  explicit TempFile(std::string path);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& path() const { return tmp_; }
  Status commit();

 private:
  std::string final_;
  std::string tmp_;
  bool committed_ = false;
};

}  // namespace vortex::media
