#include "models/h3/reference_video.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "models/h3/keyframes.h"
#include "models/h3/layout.h"

namespace vortex::h3 {

Result<std::vector<int64_t>> reference_frame_sources(int64_t num_frames, double fps, int64_t max_frames) {
  if (!(fps > 0.0) || !std::isfinite(fps)) {
    return invalid_argument("a reference video must have a positive frame rate, got " + std::to_string(fps));
  }
  std::vector<int64_t> sources;
  const auto full = [&] { return static_cast<int64_t>(sources.size()) >= max_frames; };
  if (fps == static_cast<double>(kFps)) {
    for (int64_t i = 0; i < num_frames && !full(); ++i) sources.push_back(i);
    return sources;
  }
  const double scale = static_cast<double>(kFps) / fps;
  const auto slot = [&](int64_t i) { return static_cast<int64_t>(std::floor(static_cast<double>(i) * scale + 0.5)); };
  for (int64_t i = 0; i < num_frames && !full(); ++i) {
    for (int64_t repeat = slot(i + 1) - slot(i); repeat > 0 && !full(); --repeat) sources.push_back(i);
  }
  return sources;
}

Result<Tensor> normalize_reference_video(const Tensor& frames, double fps, int64_t generated_frames) {
  if (frames.dtype() != DType::kU8 || frames.rank() != 4 || frames.size(3) != 3 || frames.size(0) < 1) {
    return invalid_argument("a reference video is " + frames.describe() +
                            ", expected u8 [frames, height, width, 3] (RGB) with at least one frame");
  }
  VORTEX_ASSIGN_OR_RETURN(const std::vector<int64_t> sources,
                          reference_frame_sources(frames.size(0), fps, generated_frames));
  const int64_t H = frames.size(1), W = frames.size(2);
  VORTEX_ASSIGN_OR_RETURN(const Canvas canvas, keyframe_canvas(W, H));
  const Tensor source = frames.contiguous();
  const auto F = static_cast<int64_t>(sources.size());
  Tensor out = Tensor::empty({F, canvas.height, canvas.width, 3}, DType::kU8);
  const size_t frame_bytes = static_cast<size_t>(canvas.height * canvas.width * 3);
  uint8_t* o = out.data_as<uint8_t>();
  for (int64_t f = 0; f < F; ++f) {
    uint8_t* dst = o + static_cast<size_t>(f) * frame_bytes;
    if (f > 0 && sources[static_cast<size_t>(f)] == sources[static_cast<size_t>(f - 1)]) {
      std::memcpy(dst, dst - frame_bytes, frame_bytes);  // a duplicated frame is resized once
      continue;
    }
    VORTEX_ASSIGN_OR_RETURN(const Tensor frame, source.select(0, sources[static_cast<size_t>(f)]));
    // The stretch keyframe_canvas's first keyframe gets; a frame already at the canvas passes as is.
    VORTEX_ASSIGN_OR_RETURN(const Tensor fitted, fit_keyframe(frame, canvas, 0));
    std::memcpy(dst, fitted.contiguous().data(), frame_bytes);
  }
  return out;
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
