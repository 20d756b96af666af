// Video-and-audio denoising with the H3 transformer, from a prompt (t2va), a prompt and keyframes
// (fl2va) or a prompt and references (ref2va): layout, seeded noise, the two schedules in one loop, and the checksums that make a run
// reproducible.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "models/h3/layout.h"
#include "models/h3/step_model.h"
#include "models/h3/transformer.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

// Philox streams (DESIGN section 3): the same (seed, stream, element) gives the same number on
// every device and sequence-parallel degree.
constexpr uint64_t kVideoNoiseStream = 1;
constexpr uint64_t kAudioNoiseStream = 2;
constexpr uint64_t kSyntheticTextStream = 3;
// Keyframe k's one-time noise is stream kKeyframeNoiseStream + k.
constexpr uint64_t kKeyframeNoiseStream = 4;
// The video VAE posterior sample of a keyframe's encode (vortex encode-keyframe, seed 42 by default
// as in the reference): far from the keyframe streams above.
constexpr uint64_t kKeyframePosteriorStream = 0x100;

struct GenerateOptions {
  VideoGeometry video;
  int steps = 12;  // sigma grid points including the final 0 (steps - 1 forwards)
  uint64_t seed = 0;
  float video_shift = 12.0f;
  float audio_shift = 3.0f;
  AttentionPlan attention;  // exact unless asked otherwise
  // Asked before every step; true ends the loop with a kCancelled status (a served job that was
  // cancelled: the step in flight finishes, no later one starts). Null: never.
  std::function<bool()> should_stop;
};

struct StepProgress {
  int step = 0;   // 1-based, after the step finished
  int total = 0;
  double step_seconds = 0;
  double elapsed_seconds = 0;
};
using ProgressCallback = std::function<void(const StepProgress&)>;

struct DenoiseResult {
  Tensor video_rows;  // [Nv, patch_dim] F32, packed order
  Tensor audio_rows;  // [Na, audio_in_channels] F32, channel-major stereo
  int forwards = 0;
  double seconds = 0;
};

// The loop alone, from given initial rows (used by generate_t2va / generate_fl2va and by the
// trajectory tests). video_rows holds the layout's num_condition keyframe rows first: they go into
// every forward and are never stepped (their velocity is dropped, as the reference drops it).
Result<DenoiseResult> denoise(StepModel& model, const PackedLayout& layout, const Tensor& text_states,
                                   Tensor video_rows, Tensor audio_rows, const GenerateOptions& options,
                                   const ProgressCallback& progress = nullptr);
Result<DenoiseResult> denoise(const H3Transformer& model, const PackedLayout& layout, const Tensor& text_states,
                                   Tensor video_rows, Tensor audio_rows, const GenerateOptions& options,
                                   const ProgressCallback& progress = nullptr);

struct GenerateResult {
  LatentGeometry geometry;
  PackedLayout layout;
  Tensor video_latents;  // [C, F, H, W] F32
  Tensor audio_latents;  // [2, A, C_audio] F32: stereo channel, latent time, latent channel
  DenoiseResult run;
};

// text_states: [Nt, text_dim] (F32 or BF16), finite.
Result<GenerateResult> generate_t2va(StepModel& model, const Tensor& text_states, const GenerateOptions& options,
                                     const ProgressCallback& progress = nullptr);
Result<GenerateResult> generate_t2va(const H3Transformer& model, const Tensor& text_states,
                                     const GenerateOptions& options, const ProgressCallback& progress = nullptr);

// One keyframe: its latents as the video VAE encoder's conditioning gives them (normalised,
// vae::sample_video_condition, F32 [C, 1, h, w] at the request's latent size) and where it sits.
struct Keyframe {
  Tensor latents;
  KeyframeAnchor anchor = KeyframeAnchor::kFirst;
};

// Conditioning rows (keyframes, references), in order: each latent tensor (F32 [C, F, h, w], each of
// its own size) noised once, t · x + (1 - t) · eps with t = fp32(0.999) in fp32 (the reference's
// scale_noise), then patchified. noise[k] is condition k's eps, of its latents' shape.
Result<Tensor> condition_rows(const std::vector<Tensor>& latents, const std::vector<Tensor>& noise,
                              const H3Config& config);

// fl2va: text_states and one tag per text row (kTextTag, or kVideoTag for a keyframe's picture
// tokens); at least one keyframe. Keyframe k's noise is seeded_normal(seed, kKeyframeNoiseStream + k).
// The result's video rows and latents are the generated ones only.
Result<GenerateResult> generate_fl2va(StepModel& model, const Tensor& text_states, const std::vector<int32_t>& text_tags,
                                      const std::vector<Keyframe>& keyframes, const GenerateOptions& options,
                                      const ProgressCallback& progress = nullptr);

// One encoded ref2va reference, in request order.
struct Reference {
  ReferenceKind kind = ReferenceKind::kImage;
  // Image F32 [C, 1, h, w], video F32 [C, F, h, w]: the video VAE's normalised conditioning at the
  // reference's own size. Undefined for an audio reference.
  Tensor latents;
  // An audio reference's or a video's soundtrack: F32 [2 · A, audio_in_channels], the audio VAE's
  // normalised posterior mean, channel-major. Undefined for an image or a silent video.
  Tensor audio_rows;
};

// The released checkpoint's limits on one request's references (MiniMaxH3Ref2VASetupStep).
constexpr int kMaxImageReferences = 9;
constexpr int kMaxVideoReferences = 3;
constexpr int kMaxAudioReferences = 3;
constexpr int kMaxReferences = 12;

// ref2va: text_states and one tag per text row (a reference's vision tokens tagged kVideoTag), at
// least one image or video reference (audio ones only beside them). The references' video latents are
// noised once (the k-th image or video reference with seeded_normal(seed, kKeyframeNoiseStream + k)),
// their soundtracks stay clean, and all of them ride before the generated rows, never stepped. Run
// it on the transformer_ref checkpoint partition. The result holds the generated rows only.
Result<GenerateResult> generate_ref2va(StepModel& model, const Tensor& text_states,
                                       const std::vector<int32_t>& text_tags, const std::vector<Reference>& references,
                                       const GenerateOptions& options, const ProgressCallback& progress = nullptr);

// Standard-normal F32 tensor of `shape` from (seed, stream), element i = Philox normal i.
Tensor seeded_normal(const Shape& shape, uint64_t seed, uint64_t stream);

// The trajectory checksum of DESIGN section 3: SHA-256 of the tensor's bytes and their fp64 sum.
struct LatentChecksum {
  std::string sha256;
  double sum = 0;
};
LatentChecksum latent_checksum(const Tensor& t);

}  // namespace vortex::h3
