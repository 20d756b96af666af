#include "text/video_sampling.h"

#include <cmath>
#include <cstdio>

#include "core/portable_math.h"

namespace vortex::text {
namespace {

std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

Result<VideoSampling> sample_video_frames(int64_t num_frames, double fps, double sample_fps, int64_t temporal_patch) {
  if (!(fps > 0.0) || !(sample_fps > 0.0) || temporal_patch < 1) {
    return invalid_argument("video sampling: fps " + shortest(fps) + ", sample fps " + shortest(sample_fps) +
                            ", temporal patch " + std::to_string(temporal_patch) + " (all must be positive)");
  }
  const double stride = fps / sample_fps;
  std::vector<int64_t> indices;
  double cursor = 0.0;
  for (int64_t at = 0; (at = python_round(cursor)) < num_frames; cursor += stride) {
    if (indices.empty() || at > indices.back()) indices.push_back(at);
  }
  const auto count = static_cast<int64_t>(indices.size());
  if (count < temporal_patch) {
    const int64_t minimum = python_round(static_cast<double>(temporal_patch - 1) * stride) + 1;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.2g", static_cast<double>(minimum) / fps);
    return invalid_argument("a reference video is read at " + shortest(sample_fps) +
                            " fps and its sampled frames are merged in groups of " + std::to_string(temporal_patch) +
                            ", so it must run at least " + std::to_string(minimum) + " frames at " + shortest(fps) +
                            " fps (" + seconds + " seconds), got " + std::to_string(num_frames));
  }
  VideoSampling out;
  out.sampled = count;
  for (int64_t first = 0; first < count; first += temporal_patch) {
    std::vector<int64_t> block;
    for (int64_t k = first; k < first + temporal_patch; ++k) block.push_back(indices[static_cast<size_t>(std::min(k, count - 1))]);
    out.blocks.push_back(std::move(block));
    // Timestamps are sample positions, the padded tail repeating the last one.
    const int64_t last = std::min(first + temporal_patch - 1, count - 1);
    out.block_seconds.push_back((static_cast<double>(first) / sample_fps + static_cast<double>(last) / sample_fps) / 2);
  }
  return out;
}

std::string seconds_label(double seconds) {
  // glibc's printf rounds the exact binary value with ties to even, as Python's format does.
  char buf[48];
  std::snprintf(buf, sizeof buf, "<%.1f seconds>", seconds);
  return buf;
}

}  // namespace vortex::text
