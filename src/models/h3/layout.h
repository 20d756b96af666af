// The packed sequence of one H3 request: which row holds what, and where it sits in (t, h, w).
//
// t2va packs `[text | audio | video]` (conditioning rows, absent in t2va, would sit between text
// and audio). Positions are built in float64 exactly as the reference pipeline builds them
// (numpy-style linspace for the spatial axes, the 5/3·(1,4,4,4,4) frame clock for time) and are
// rounded to float32 only where the model consumes them (the RoPE tables).
#pragma once

#include <cstdint>
#include <vector>

#include "models/h3/config.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

// Pixel geometry of a request and the latent geometry it implies.
struct VideoGeometry {
  int height = 768;    // pixels, a multiple of `spatial_ratio * patch_h`
  int width = 1344;    // pixels
  int num_frames = 124;  // of the form 17n + 5
};

struct LatentGeometry {
  int latent_frames = 0;  // 5n + 2
  int latent_height = 0;
  int latent_width = 0;
  int audio_latents = 0;  // per stereo channel, at 40 latents/s
};

constexpr int kVaeSpatialRatio = 16;
constexpr int kVaeFramesPerChunk = 17;
constexpr int kVaeLatentsPerChunk = 5;
constexpr int kFps = 24;
constexpr int kAudioLatentsPerSecond = 40;
constexpr int kAudioChannels = 2;

// Checks the pixel geometry (multiples, 17n+5 frames) and derives the latent geometry. Errors
// name the field and the nearest valid values.
Result<LatentGeometry> resolve_geometry(const VideoGeometry& video, const H3Config& config);

struct PackedLayout {
  int64_t num_rows = 0;
  int64_t num_text = 0;
  int64_t num_audio = 0;  // rows: audio latents x 2 channels, channel-major
  int64_t num_video = 0;  // rows: latent frames x (h / patch_h) x (w / patch_w)
  std::vector<double> positions;  // [num_rows, 3] (t, h, w), float64 as the reference builds them
  std::vector<int32_t> tags;      // [num_rows] modality tag
  std::vector<int64_t> text_indices, audio_indices, video_indices;  // packed row of each stream row
};

// The t2va layout `[text | audio | video]` for `num_text` text rows.
Result<PackedLayout> build_t2va_layout(int64_t num_text, const LatentGeometry& latents, const H3Config& config);

// The canonical request that benchmarks and memory plans are stated for: VideoGeometry's defaults
// (768 x 1344, 124 frames) with 100 text tokens, 37,810 packed rows at the released config.
constexpr int64_t kCanonicalTextTokens = 100;
Result<PackedLayout> canonical_t2va_layout(const H3Config& config);

// The distinct timesteps of one forward and the index of every row into them. Rows of the video
// and text streams take `video_timestep`, audio rows `audio_timestep`; timesteps are sorted
// ascending as the reference's torch.unique does.
struct RowTimesteps {
  std::vector<float> timesteps;      // [T] distinct, ascending
  std::vector<int32_t> row_index;    // [num_rows] index into `timesteps`
};
RowTimesteps assign_row_timesteps(const PackedLayout& layout, float video_timestep, float audio_timestep);

// Video latents [C, F, H, W] <-> patch rows [F/pt * H/ph * W/pw, C*pt*ph*pw] in the reference's
// order (frame-major, then row-major; inside a row channel-major then (pt, ph, pw)).
Result<Tensor> patchify_video(const Tensor& latents, const H3Config& config);
Result<Tensor> unpatchify_video(const Tensor& rows, const LatentGeometry& geometry, const H3Config& config);

}  // namespace vortex::h3
