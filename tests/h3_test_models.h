// Small H3 models and requests shared by the model-level tests (CPU and GPU): the released head
// shape (head dim 128, 3-axis RoPE) at reduced widths, so the Hopper kernels and the fp8 GEMMs run
// as at the canonical shape while a forward takes milliseconds; and one t2va request over them.
#pragma once

#include <gtest/gtest.h>

#include "models/h3/generate.h"
#include "models/h3/layout.h"
#include "models/h3/step_model.h"
#include "models/h3/synthetic.h"

namespace vortex::test {

// The released config with `heads` heads of 128, `hidden` channels, an FFN of `ffn` and `layers`
// blocks (one refiner block), and small text / time-embedding widths.
inline h3::H3Config released_heads_config(int heads, int hidden, int ffn, int layers) {
  h3::H3Config c = *h3::config_preset("h3");
  c.num_attention_heads = heads;
  c.hidden_size = hidden;
  c.num_layers = layers;
  c.num_refiner_layers = 1;
  c.ffn_dim = ffn;
  c.text_dim = 64;
  c.time_embed_hidden_dim = 256;
  c.time_embed_dim = 128;
  return c;
}

// One forward's inputs for a 22-frame 128 x 192 clip: the layout, seeded text states and noise,
// and video / audio at the two given noise levels.
struct H3TestRequest {
  h3::PackedLayout layout;
  Tensor text;
  h3::StepInputs in;
};

inline H3TestRequest make_h3_request(const h3::H3Config& c, int64_t text_rows, uint64_t seed, float video_t,
                                     float audio_t) {
  H3TestRequest r;
  auto geometry = h3::resolve_geometry({128, 192, 22}, c);
  EXPECT_TRUE(geometry.ok()) << geometry.status().to_string();
  auto layout = h3::build_t2va_layout(text_rows, *geometry, c);
  EXPECT_TRUE(layout.ok()) << layout.status().to_string();
  r.layout = std::move(*layout);
  r.text = h3::seeded_normal({text_rows, c.text_dim}, seed, h3::kSyntheticTextStream);
  r.in.video_rows = h3::seeded_normal({r.layout.num_video, c.video_patch_dim()}, seed, h3::kVideoNoiseStream);
  r.in.audio_rows = h3::seeded_normal({r.layout.num_audio, c.audio_in_channels}, seed, h3::kAudioNoiseStream);
  r.in.timesteps = h3::assign_row_timesteps(r.layout, video_t, audio_t);
  return r;
}

// The latents' checksums of one generate_t2va run: paths that must be bitwise equal compare these.
struct TrajectoryChecksums {
  h3::LatentChecksum video, audio;
};

inline TrajectoryChecksums trajectory_checksums(h3::StepModel& model, const Tensor& text,
                                                const h3::GenerateOptions& options) {
  auto r = h3::generate_t2va(model, text, options);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  return {h3::latent_checksum(r->video_latents), h3::latent_checksum(r->audio_latents)};
}

// Both latents of `got` equal `want`'s bit for bit (`what` names the path in a failure).
inline void expect_same_trajectory(const TrajectoryChecksums& got, const TrajectoryChecksums& want,
                                   const std::string& what) {
  EXPECT_EQ(got.video.sha256, want.video.sha256) << what << ": video sums " << got.video.sum << " vs " << want.video.sum;
  EXPECT_EQ(got.audio.sha256, want.audio.sha256) << what << ": audio sums " << got.audio.sum << " vs " << want.audio.sum;
}

}  // namespace vortex::test
