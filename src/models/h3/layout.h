// The packed sequence of one H3 request: which row holds what, and where it sits in (t, h, w).
//
// t2va packs `[text | audio | video]`, fl2va `[text | keyframes | audio | video]`: each keyframe
// is one latent frame of rows tagged video, placed before the audio and counted first among the
// video rows; the target video keeps all its frames. ref2va packs `[text | reference blocks | audio
// | video]`, one block per reference in request order (see build_ref2va_layout). Positions are built in float64 exactly as the
// reference pipeline builds them (numpy-style linspace for the spatial axes, the 5/3·(1,4,4,4,4)
// frame clock for time) and are rounded to float32 only where the model consumes them (the RoPE
// tables). A keyframe anchored "first" sits at the first target frame's time; one anchored "last"
// at the time of the last pixel frame (the target frames' spans summed in numpy's pairwise order,
// minus one pixel frame's 5/3), with the first frame's (h, w) grid.
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
// The keyframes' noise level: 0.999 · latents + 0.001 · noise, timestep 0.999 (t = 1 is clean).
constexpr double kKeyframeNoiseAug = 0.999;

// Checks the pixel geometry (multiples, 17n+5 frames) and derives the latent geometry. Errors
// name the field and the nearest valid values.
Result<LatentGeometry> resolve_geometry(const VideoGeometry& video, const H3Config& config);

struct PackedLayout {
  int64_t num_rows = 0;
  int64_t num_text = 0;
  int64_t num_audio = 0;  // rows: audio latents x 2 channels, channel-major
  int64_t num_video = 0;  // rows: (keyframes + latent frames) x (h / patch_h) x (w / patch_w)
  int64_t num_condition = 0;  // keyframe / reference video rows: the first of video_indices, never stepped
  int64_t num_condition_audio = 0;  // reference soundtrack rows: the first of audio_indices, clean, never stepped
  std::vector<double> positions;  // [num_rows, 3] (t, h, w), float64 as the reference builds them
  std::vector<int32_t> tags;      // [num_rows] modality tag
  std::vector<int64_t> text_indices, audio_indices, video_indices;  // packed row of each stream row
};

// The t2va layout `[text | audio | video]` for `num_text` text rows.
Result<PackedLayout> build_t2va_layout(int64_t num_text, const LatentGeometry& latents, const H3Config& config);

enum class KeyframeAnchor { kFirst, kLast };

// The fl2va layout `[text | keyframes | audio | video]`: one tag per text row (a keyframe's picture
// tokens in the prompt are tagged video), one anchor per keyframe in packed order. No anchors is the
// t2va layout.
Result<PackedLayout> build_keyframe_layout(const std::vector<int32_t>& text_tags, const LatentGeometry& latents,
                                           const H3Config& config, const std::vector<KeyframeAnchor>& anchors);

// One ref2va reference as the layout sees it: the geometry its encoded latents have.
enum class ReferenceKind { kImage, kVideo, kAudio };
struct ReferenceBlock {
  ReferenceKind kind = ReferenceKind::kImage;
  int latent_frames = 0;  // image: 1; video: its latent frames; audio: 0
  int latent_height = 0;  // image / video: the reference's own latent size
  int latent_width = 0;
  int audio_latents = 0;  // per stereo channel: an audio reference's, or a video's soundtrack (0: none)
};

// The ref2va layout `[text | reference blocks | audio | video]`, as the reference pipeline's
// MiniMaxH3Ref2VAPrepareLayoutStep builds it. The references advance one shared rotary clock that
// starts where the text ends: an image is one latent frame at the clock's time on its own (h, w) grid
// and takes one integer slot; an audio reference is channel-major rows pinned to the target's width
// extremes and takes its latent count; a video's soundtrack rows come right before its frames, both
// from the same origin (the soundtrack pinned to the video's own width extremes), and it takes the
// larger of the soundtrack's latent count and its frames' spans summed as Python 3.12's sum() does. The generated audio
// and video start where the clock ends. Reference video rows count first among the video rows
// (num_condition), soundtrack and audio-reference rows first among the audio rows
// (num_condition_audio).
Result<PackedLayout> build_ref2va_layout(const std::vector<int32_t>& text_tags,
                                         const std::vector<ReferenceBlock>& references, const LatentGeometry& latents,
                                         const H3Config& config);

// numpy's sum of a float64 array (np.add.reduce: pairwise, in blocks of eight), bit for bit.
double numpy_pairwise_sum(const double* values, int64_t n);

// The canonical request that benchmarks and memory plans are stated for: VideoGeometry's defaults
// (768 x 1344, 124 frames) with 100 text tokens, 37,810 packed rows at the released config.
constexpr int64_t kCanonicalTextTokens = 100;
Result<PackedLayout> canonical_t2va_layout(const H3Config& config);

// The distinct timesteps of one forward and the index of every row into them. Rows of the video
// and text streams take `video_timestep`, audio rows `audio_timestep`, keyframe and reference video
// rows max(video_timestep, kKeyframeNoiseAug) (they are noised once, to that level, and stay there),
// reference soundtrack rows 1 (clean); timesteps are sorted ascending as the reference's
// torch.unique does.
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
