// A ref2va video reference onto H3's clock and canvas, as the reference pipeline's
// MiniMaxH3Ref2VASetupStep normalises it: first the frame rate (whole frames dropped and
// duplicated, as ffmpeg's fps filter does), then the cut at the generated frame count, then its
// own canvas (keyframe_canvas of its aspect ratio, Pillow's LANCZOS stretch unless it is already
// that size).
#pragma once

#include <cstdint>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

// Per output frame on the 24 fps clock, the source frame it shows, at most max_frames of them.
// Source frame i is held from slot floor(i · 24 / fps + 0.5) to the next one's, the last until
// floor(num_frames · 24 / fps + 0.5) (fp64, as numpy computes it); at 24 fps every frame maps to
// itself. A rate that is not positive and finite is an error naming it.
Result<std::vector<int64_t>> reference_frame_sources(int64_t num_frames, double fps, int64_t max_frames);

// frames: U8 [F, H, W, 3] at `fps` → U8 [F', h, w, 3] on H3's clock (F' ≤ generated_frames) and the
// canvas of its own aspect ratio. Errors name the tensor's shape or the rate.
Result<Tensor> normalize_reference_video(const Tensor& frames, double fps, int64_t generated_frames);

// normalize_reference_video one source frame at a time, as a decoder gives them: each is put on the
// canvas (the first frame's) as it comes and the source let go, so only the normalised clip is held.
// The same bits as the whole-tensor call on the same frames.
class ReferenceVideoNormalizer {
 public:
  static Result<ReferenceVideoNormalizer> create(double fps, int64_t generated_frames);
  // The next source frame, U8 [H, W, 3], every one the size of the first. Once the clock is full
  // (generated_frames frames) later frames are ignored.
  Status add(const Tensor& frame);
  bool full() const { return written_ >= max_frames_; }
  // U8 [F', h, w, 3]; an error when no frame came.
  Result<Tensor> finish();

 private:
  ReferenceVideoNormalizer(double fps, int64_t max_frames) : fps_(fps), max_frames_(max_frames) {}
  double fps_;
  int64_t max_frames_;
  int64_t sources_ = 0;  // source frames added
  int64_t written_ = 0;  // clock frames written into out_
  int64_t height_ = 0, width_ = 0;
  Tensor out_;           // [max_frames, canvas, 3] once the first frame gives the canvas
};

// Of a normalised video reference's frames, how many the video VAE encodes: snapped down to 17n + 5
// (n >= 1) so that the VAE needs no padding; all of them when there are fewer than 22.
int64_t reference_video_encoded_frames(int64_t frames);

// The latent frames the release's video VAE gives for that many frames (encode_video_moments): one
// for one frame, else ceil(frames / 17) clips of 5 with the last 3 dropped (17n + 5 → 5n + 2).
// What a request's layout is planned with before the encoder is loaded.
int64_t reference_video_latent_frames(int64_t encoded_frames);

}  // namespace vortex::h3
