// Which frames of a reference video the conditioner sees, and how their vision blocks are labelled
// (the reference pipeline's MiniMaxH3Ref2VAPromptEncoderStep). The conditioner reads the video,
// already on H3's 24 fps clock, at kVideoSampleFps: a cursor advances by fps / sample_fps and
// each Python round() of it (half to even) that passes the last index taken is a sampled frame.
// Qwen3-VL's vision tower merges the sampled frames temporal_patch at a time, the last one repeated
// until the count divides; each merged group is one vision block, labelled with the mean of its
// first and last timestamps (index / sample_fps) as "<{t:.1f} seconds>".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vortex/status.h"

namespace vortex::text {

constexpr double kVideoSampleFps = 2.0;

struct VideoSampling {
  // Per vision block, temporal_patch frame indices into the video (the last block's tail repeats
  // the last sampled frame).
  std::vector<std::vector<int64_t>> blocks;
  std::vector<double> block_seconds;  // one timestamp per block
  int64_t sampled = 0;                // distinct frames read (before the padding)
};

// An error names the minimum frame count when fewer than temporal_patch frames would be sampled.
Result<VideoSampling> sample_video_frames(int64_t num_frames, double fps, double sample_fps, int64_t temporal_patch);

// "<0.2 seconds>": the timestamp with one decimal, rounded as Python's format does (the exact
// binary value, ties to even).
std::string seconds_label(double seconds);

}  // namespace vortex::text
