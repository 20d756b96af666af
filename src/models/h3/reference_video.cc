#include "models/h3/reference_video.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "models/h3/keyframes.h"
#include "models/h3/layout.h"

namespace vortex::h3 {

namespace {

// A rate a reference video can be put on the clock from.
Status check_rate(double fps) {
  if (!(fps > 0.0) || !std::isfinite(fps)) {
    return invalid_argument("a reference video must have a positive frame rate, got " + std::to_string(fps));
  }
  return ok_status();
}

// How many clock frames source frame i shows: floor(i · 24 / fps + 0.5) to the next one's slot (fp64,
// as numpy computes it); one each at 24 fps.
int64_t clock_repeats(int64_t i, double fps) {
  if (fps == static_cast<double>(kFps)) return 1;
  const double scale = static_cast<double>(kFps) / fps;
  const auto slot = [&](int64_t k) { return static_cast<int64_t>(std::floor(static_cast<double>(k) * scale + 0.5)); };
  return slot(i + 1) - slot(i);
}

}  // namespace

Result<std::vector<int64_t>> reference_frame_sources(int64_t num_frames, double fps, int64_t max_frames) {
  VORTEX_RETURN_IF_ERROR(check_rate(fps));
  std::vector<int64_t> sources;
  for (int64_t i = 0; i < num_frames && static_cast<int64_t>(sources.size()) < max_frames; ++i) {
    for (int64_t repeat = clock_repeats(i, fps); repeat > 0 && static_cast<int64_t>(sources.size()) < max_frames;
         --repeat) {
      sources.push_back(i);
    }
  }
  return sources;
}

Result<Tensor> normalize_reference_video(const Tensor& frames, double fps, int64_t generated_frames) {
  if (frames.dtype() != DType::kU8 || frames.rank() != 4 || frames.size(3) != 3 || frames.size(0) < 1) {
    return invalid_argument("a reference video is " + frames.describe() +
                            ", expected u8 [frames, height, width, 3] (RGB) with at least one frame");
  }
  VORTEX_ASSIGN_OR_RETURN(ReferenceVideoNormalizer normalizer, ReferenceVideoNormalizer::create(fps, generated_frames));
  const Tensor source = frames.contiguous();
  for (int64_t f = 0; f < source.size(0) && !normalizer.full(); ++f) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor frame, source.select(0, f));
    VORTEX_RETURN_IF_ERROR(normalizer.add(frame));
  }
  return normalizer.finish();
}

Result<ReferenceVideoNormalizer> ReferenceVideoNormalizer::create(double fps, int64_t generated_frames) {
  VORTEX_RETURN_IF_ERROR(check_rate(fps));
  if (generated_frames < 1) {
    return invalid_argument("a reference video is cut at the generated frame count, got " +
                            std::to_string(generated_frames));
  }
  return ReferenceVideoNormalizer(fps, generated_frames);
}

Status ReferenceVideoNormalizer::add(const Tensor& frame) {
  if (full()) return ok_status();
  if (frame.dtype() != DType::kU8 || frame.rank() != 3 || frame.size(2) != 3) {
    return invalid_argument("reference video frame " + std::to_string(sources_) + " is " + frame.describe() +
                            ", expected u8 [height, width, 3] (RGB)");
  }
  if (!out_.defined()) {
    height_ = frame.size(0), width_ = frame.size(1);
    VORTEX_ASSIGN_OR_RETURN(const Canvas canvas, keyframe_canvas(width_, height_));
    out_ = Tensor::empty({max_frames_, canvas.height, canvas.width, 3}, DType::kU8);
  } else if (frame.size(0) != height_ || frame.size(1) != width_) {
    return invalid_argument("reference video frame " + std::to_string(sources_) + " is " + frame.describe() +
                            "; the video began at " + std::to_string(height_) + " x " + std::to_string(width_));
  }
  const int64_t repeats = std::min(clock_repeats(sources_++, fps_), max_frames_ - written_);
  if (repeats <= 0) return ok_status();  // a frame the clock drops
  const Canvas canvas{out_.size(1), out_.size(2)};
  const size_t frame_bytes = static_cast<size_t>(canvas.height * canvas.width * 3);
  uint8_t* dst = out_.data_as<uint8_t>() + static_cast<size_t>(written_) * frame_bytes;
  // The stretch keyframe_canvas's first keyframe gets; a frame already at the canvas passes as is.
  VORTEX_ASSIGN_OR_RETURN(const Tensor fitted, fit_keyframe(frame.contiguous(), canvas, 0));
  std::memcpy(dst, fitted.contiguous().data(), frame_bytes);
  for (int64_t r = 1; r < repeats; ++r) std::memcpy(dst + r * frame_bytes, dst, frame_bytes);  // resized once
  written_ += repeats;
  return ok_status();
}

Result<Tensor> ReferenceVideoNormalizer::finish() {
  if (written_ == 0) return invalid_argument("a reference video needs at least one frame on H3's clock");
  return out_.slice(0, 0, written_);
}

int64_t reference_video_encoded_frames(int64_t frames) {
  const int64_t snapped = std::max<int64_t>(1, (frames - 5) / kVaeFramesPerChunk) * kVaeFramesPerChunk + 5;
  return std::min(frames, snapped);
}

int64_t reference_video_latent_frames(int64_t encoded_frames) {
  constexpr int64_t kDroppedLatents = 3;  // the release's token_drop
  if (encoded_frames <= 1) return encoded_frames;
  const int64_t clips = (encoded_frames + kVaeFramesPerChunk - 1) / kVaeFramesPerChunk;
  return clips * kVaeLatentsPerChunk - kDroppedLatents;
}

}  // namespace vortex::h3
