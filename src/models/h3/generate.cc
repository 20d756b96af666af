#include "models/h3/generate.h"

#include <chrono>
#include <cstring>

#include "core/rng.h"
#include "core/sha256.h"
#include "sampling/h3_scheduler.h"

namespace vortex::h3 {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Tensor seeded_normal(const Shape& shape, uint64_t seed, uint64_t stream) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  fill_normal(t.data_as<float>(), t.numel(), seed, stream);
  return t;
}

LatentChecksum latent_checksum(const Tensor& t) {
  const Tensor c = t.contiguous();
  LatentChecksum out;
  out.sha256 = sha256_hex(c.data(), c.nbytes());
  for (int64_t i = 0; i < c.numel(); ++i) out.sum += element_as_double(c, i);
  return out;
}

Result<DenoiseResult> denoise_t2va(const H3Transformer& model, const PackedLayout& layout, const Tensor& text_states,
                                   Tensor video_rows, Tensor audio_rows, const GenerateOptions& options,
                                   const ProgressCallback& progress) {
  CpuStepModel cpu(model);
  return denoise_t2va(cpu, layout, text_states, std::move(video_rows), std::move(audio_rows), options, progress);
}

Result<DenoiseResult> denoise_t2va(StepModel& model, const PackedLayout& layout, const Tensor& text_states,
                                   Tensor video_rows, Tensor audio_rows, const GenerateOptions& options,
                                   const ProgressCallback& progress) {
  auto video_sigmas = sampling::sigma_grid(options.steps, options.video_shift);
  if (!video_sigmas.ok()) return video_sigmas.status();
  auto audio_sigmas = sampling::sigma_grid(options.steps, options.audio_shift);
  if (!audio_sigmas.ok()) return audio_sigmas.status();
  const std::vector<float> video_t = sampling::timesteps_from_sigmas(*video_sigmas);
  const std::vector<float> audio_t = sampling::timesteps_from_sigmas(*audio_sigmas);
  // Shifts can collapse different numbers of grid points; the loop runs over the video schedule,
  // as the reference does, and needs the audio schedule to be as long.
  if (audio_t.size() != video_t.size()) {
    return invalid_argument("the video and audio sigma grids have different lengths (" +
                            std::to_string(video_t.size()) + " vs " + std::to_string(audio_t.size()) +
                            ") for " + std::to_string(options.steps) + " steps");
  }
  const auto start = std::chrono::steady_clock::now();
  VORTEX_RETURN_IF_ERROR(model.prepare(layout, text_states));
  std::vector<std::vector<float>> step_timesteps;
  for (size_t i = 0; i < video_t.size(); ++i) {
    step_timesteps.push_back(assign_row_timesteps(layout, video_t[i], audio_t[i]).timesteps);
  }
  VORTEX_RETURN_IF_ERROR(model.plan_steps(step_timesteps));
  DenoiseResult result;
  result.video_rows = video_rows.contiguous();
  result.audio_rows = audio_rows.contiguous();
  for (size_t i = 0; i < video_t.size(); ++i) {
    if (options.should_stop && options.should_stop()) {
      return cancelled("stopped before step " + std::to_string(i + 1) + " of " + std::to_string(video_t.size()));
    }
    const auto step_start = std::chrono::steady_clock::now();
    StepInputs in;
    in.video_rows = result.video_rows;
    in.audio_rows = result.audio_rows;
    in.timesteps = assign_row_timesteps(layout, video_t[i], audio_t[i]);
    in.attention = options.attention;
    VORTEX_ASSIGN_OR_RETURN(StepOutputs out, model.step(in));
    VORTEX_RETURN_IF_ERROR(sampling::euler_step(result.video_rows, out.video_velocity, video_t[i], (*video_sigmas)[i],
                                                (*video_sigmas)[i + 1]));
    VORTEX_RETURN_IF_ERROR(sampling::euler_step(result.audio_rows, out.audio_velocity, audio_t[i], (*audio_sigmas)[i],
                                                (*audio_sigmas)[i + 1]));
    ++result.forwards;
    if (progress) {
      progress({static_cast<int>(i + 1), static_cast<int>(video_t.size()), seconds_since(step_start),
                seconds_since(start)});
    }
  }
  result.seconds = seconds_since(start);
  return result;
}

Result<GenerateResult> generate_t2va(const H3Transformer& model, const Tensor& text_states,
                                     const GenerateOptions& options, const ProgressCallback& progress) {
  CpuStepModel cpu(model);
  return generate_t2va(cpu, text_states, options, progress);
}

Result<GenerateResult> generate_t2va(StepModel& model, const Tensor& text_states, const GenerateOptions& options,
                                     const ProgressCallback& progress) {
  const H3Config& config = model.config();
  GenerateResult out;
  VORTEX_ASSIGN_OR_RETURN(out.geometry, resolve_geometry(options.video, config));
  if (text_states.rank() != 2) {
    return invalid_argument("text states must be [tokens, " + std::to_string(config.text_dim) + "], got " +
                            text_states.describe());
  }
  VORTEX_ASSIGN_OR_RETURN(out.layout, build_t2va_layout(text_states.size(0), out.geometry, config));
  const LatentGeometry& g = out.geometry;
  // The video noise is drawn in latent layout and then packed, the audio noise directly in rows,
  // so that a latent element's noise does not depend on the patch size.
  const Tensor video_noise =
      seeded_normal({config.in_channels, g.latent_frames, g.latent_height, g.latent_width}, options.seed,
                    kVideoNoiseStream);
  VORTEX_ASSIGN_OR_RETURN(Tensor video_rows, patchify_video(video_noise, config));
  Tensor audio_rows =
      seeded_normal({out.layout.num_audio, config.audio_in_channels}, options.seed, kAudioNoiseStream);
  VORTEX_ASSIGN_OR_RETURN(out.run, denoise_t2va(model, out.layout, text_states, std::move(video_rows),
                                                std::move(audio_rows), options, progress));
  VORTEX_ASSIGN_OR_RETURN(out.video_latents, unpatchify_video(out.run.video_rows, g, config));
  VORTEX_ASSIGN_OR_RETURN(out.audio_latents,
                          out.run.audio_rows.reshape({kAudioChannels, g.audio_latents, config.audio_in_channels}));
  return out;
}

}  // namespace vortex::h3
