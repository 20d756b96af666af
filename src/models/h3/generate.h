// Text-to-video-and-audio denoising (t2va) with the H3 transformer: layout, seeded noise, the two
// schedules in one loop, and the checksums that make a run reproducible.
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

// The loop alone, from given initial rows (used by generate_t2va and by the trajectory test).
Result<DenoiseResult> denoise_t2va(StepModel& model, const PackedLayout& layout, const Tensor& text_states,
                                   Tensor video_rows, Tensor audio_rows, const GenerateOptions& options,
                                   const ProgressCallback& progress = nullptr);
Result<DenoiseResult> denoise_t2va(const H3Transformer& model, const PackedLayout& layout, const Tensor& text_states,
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

// Standard-normal F32 tensor of `shape` from (seed, stream), element i = Philox normal i.
Tensor seeded_normal(const Shape& shape, uint64_t seed, uint64_t stream);

// The trajectory checksum of DESIGN section 3: SHA-256 of the tensor's bytes and their fp64 sum.
struct LatentChecksum {
  std::string sha256;
  double sum = 0;
};
LatentChecksum latent_checksum(const Tensor& t);

}  // namespace vortex::h3
