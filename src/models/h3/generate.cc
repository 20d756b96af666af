#include "models/h3/generate.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "core/sha256.h"
#include "sampling/h3_scheduler.h"

namespace vortex::h3 {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// F32 [rows, width] blocks stacked in order (all of one width, at least one block).
Tensor concat_rows(const std::vector<Tensor>& blocks) {
  int64_t rows = 0;
  for (const Tensor& b : blocks) rows += b.size(0);
  Tensor out = Tensor::empty({rows, blocks[0].size(1)}, DType::kF32);
  char* dst = static_cast<char*>(out.data());
  for (const Tensor& b : blocks) {
    std::memcpy(dst, b.data(), b.nbytes());
    dst += b.nbytes();
  }
  return out;
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

Result<DenoiseResult> denoise(const H3Transformer& model, const PackedLayout& layout, const Tensor& text_states,
                                   Tensor video_rows, Tensor audio_rows, const GenerateOptions& options,
                                   const ProgressCallback& progress) {
  CpuStepModel cpu(model);
  return denoise(cpu, layout, text_states, std::move(video_rows), std::move(audio_rows), options, progress);
}

Result<DenoiseResult> denoise(StepModel& model, const PackedLayout& layout, const Tensor& text_states,
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
    // Keyframe and reference rows stay as they are: only the generated rows after them are stepped.
    VORTEX_ASSIGN_OR_RETURN(Tensor generated, result.video_rows.slice(0, layout.num_condition, layout.num_video));
    VORTEX_ASSIGN_OR_RETURN(Tensor generated_velocity,
                            out.video_velocity.slice(0, layout.num_condition, layout.num_video));
    VORTEX_RETURN_IF_ERROR(sampling::euler_step(generated, generated_velocity, video_t[i], (*video_sigmas)[i],
                                                (*video_sigmas)[i + 1]));
    VORTEX_ASSIGN_OR_RETURN(Tensor generated_audio,
                            result.audio_rows.slice(0, layout.num_condition_audio, layout.num_audio));
    VORTEX_ASSIGN_OR_RETURN(Tensor generated_audio_velocity,
                            out.audio_velocity.slice(0, layout.num_condition_audio, layout.num_audio));
    VORTEX_RETURN_IF_ERROR(sampling::euler_step(generated_audio, generated_audio_velocity, audio_t[i],
                                                (*audio_sigmas)[i], (*audio_sigmas)[i + 1]));
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

namespace {

// The shared body of generate_t2va, generate_fl2va and generate_ref2va: seeded noise for the
// generated rows after the conditioning video rows and soundtrack rows (each undefined when the
// layout has none), the loop, and the latents of the generated rows.
Result<GenerateResult> generate_on_layout(StepModel& model, GenerateResult out, const Tensor& text_states,
                                          const Tensor& condition_video_rows, const Tensor& condition_audio_rows,
                                          const GenerateOptions& options, const ProgressCallback& progress) {
  const H3Config& config = model.config();
  const LatentGeometry& g = out.geometry;
  // The video noise is drawn in latent layout and then packed, the audio noise directly in rows,
  // so that a latent element's noise does not depend on the patch size.
  const Tensor video_noise =
      seeded_normal({config.in_channels, g.latent_frames, g.latent_height, g.latent_width}, options.seed,
                    kVideoNoiseStream);
  VORTEX_ASSIGN_OR_RETURN(Tensor video_rows, patchify_video(video_noise, config));
  const int64_t condition = out.layout.num_condition, condition_audio = out.layout.num_condition_audio;
  if (condition > 0) video_rows = concat_rows({condition_video_rows, video_rows});
  Tensor audio_rows = seeded_normal({out.layout.num_audio - condition_audio, config.audio_in_channels},
                                    options.seed, kAudioNoiseStream);
  if (condition_audio > 0) audio_rows = concat_rows({condition_audio_rows, audio_rows});
  VORTEX_ASSIGN_OR_RETURN(out.run, denoise(model, out.layout, text_states, std::move(video_rows),
                                           std::move(audio_rows), options, progress));
  if (condition > 0) {
    VORTEX_ASSIGN_OR_RETURN(Tensor generated, out.run.video_rows.slice(0, condition, out.layout.num_video));
    out.run.video_rows = generated.contiguous();
  }
  if (condition_audio > 0) {
    VORTEX_ASSIGN_OR_RETURN(Tensor generated, out.run.audio_rows.slice(0, condition_audio, out.layout.num_audio));
    out.run.audio_rows = generated.contiguous();
  }
  VORTEX_ASSIGN_OR_RETURN(out.video_latents, unpatchify_video(out.run.video_rows, g, config));
  VORTEX_ASSIGN_OR_RETURN(out.audio_latents,
                          out.run.audio_rows.reshape({kAudioChannels, g.audio_latents, config.audio_in_channels}));
  return out;
}

Status check_text_states(const Tensor& text_states, const H3Config& config) {
  if (text_states.rank() != 2) {
    return invalid_argument("text states must be [tokens, " + std::to_string(config.text_dim) + "], got " +
                            text_states.describe());
  }
  return ok_status();
}

// The text states and one tag per text row (fl2va, ref2va).
Status check_tagged_text(const Tensor& text_states, const std::vector<int32_t>& text_tags, const H3Config& config) {
  VORTEX_RETURN_IF_ERROR(check_text_states(text_states, config));
  if (static_cast<int64_t>(text_tags.size()) != text_states.size(0)) {
    return invalid_argument("text tags: " + std::to_string(text_tags.size()) + " for " +
                            std::to_string(text_states.size(0)) + " text rows");
  }
  return ok_status();
}

}  // namespace

Result<GenerateResult> generate_t2va(StepModel& model, const Tensor& text_states, const GenerateOptions& options,
                                     const ProgressCallback& progress) {
  const H3Config& config = model.config();
  GenerateResult out;
  VORTEX_ASSIGN_OR_RETURN(out.geometry, resolve_geometry(options.video, config));
  VORTEX_RETURN_IF_ERROR(check_text_states(text_states, config));
  VORTEX_ASSIGN_OR_RETURN(out.layout, build_t2va_layout(text_states.size(0), out.geometry, config));
  return generate_on_layout(model, std::move(out), text_states, Tensor(), Tensor(), options, progress);
}

Result<Tensor> condition_rows(const std::vector<Tensor>& latents, const std::vector<Tensor>& noise,
                              const H3Config& config) {
  if (noise.size() != latents.size()) return invalid_argument("one noise tensor per condition is needed");
  const float t = static_cast<float>(kKeyframeNoiseAug), keep = 1.0f - t;
  std::vector<Tensor> rows;
  for (size_t k = 0; k < latents.size(); ++k) {
    const Tensor& x = latents[k];
    const std::string name = "condition " + std::to_string(k + 1);
    if (!x.defined() || x.dtype() != DType::kF32 || x.rank() != 4 || x.size(0) != config.in_channels) {
      return invalid_argument(name + ": latents " + (x.defined() ? x.describe() : "(undefined)") + " must be F32 [" +
                              std::to_string(config.in_channels) + ", frames, h, w]");
    }
    if (!noise[k].defined() || noise[k].shape() != x.shape() || noise[k].dtype() != DType::kF32) {
      return invalid_argument(name + ": noise must be F32 " + x.shape().to_string());
    }
    const Tensor xc = x.contiguous(), ec = noise[k].contiguous();
    Tensor noised = Tensor::empty(x.shape(), DType::kF32);
    const float* xd = xc.data_as<const float>();
    const float* ed = ec.data_as<const float>();
    float* nd = noised.data_as<float>();
    for (int64_t i = 0; i < noised.numel(); ++i) {
      const float v = xd[i];
      if (!std::isfinite(v)) return invalid_argument(name + ": latent element " + std::to_string(i) + " is not finite");
      nd[i] = t * v + keep * ed[i];
    }
    VORTEX_ASSIGN_OR_RETURN(Tensor packed, patchify_video(noised, config));
    rows.push_back(std::move(packed));
  }
  if (rows.empty()) return Tensor::empty({0, config.video_patch_dim()}, DType::kF32);
  return concat_rows(rows);
}

Result<GenerateResult> generate_fl2va(StepModel& model, const Tensor& text_states, const std::vector<int32_t>& text_tags,
                                      const std::vector<Keyframe>& keyframes, const GenerateOptions& options,
                                      const ProgressCallback& progress) {
  const H3Config& config = model.config();
  GenerateResult out;
  VORTEX_ASSIGN_OR_RETURN(out.geometry, resolve_geometry(options.video, config));
  VORTEX_RETURN_IF_ERROR(check_tagged_text(text_states, text_tags, config));
  if (keyframes.empty()) return invalid_argument("fl2va needs at least one keyframe");
  const LatentGeometry& g = out.geometry;
  std::vector<KeyframeAnchor> anchors;
  std::vector<Tensor> latents, noise;
  for (size_t k = 0; k < keyframes.size(); ++k) {
    const Tensor& x = keyframes[k].latents;
    const Shape want{config.in_channels, 1, g.latent_height, g.latent_width};
    if (!x.defined() || x.shape() != want) {
      return invalid_argument("keyframe " + std::to_string(k + 1) + ": latents " +
                              (x.defined() ? x.describe() : "(undefined)") + " do not fit the request's " +
                              want.to_string() + " (the keyframe must be encoded at the request's size)");
    }
    anchors.push_back(keyframes[k].anchor);
    latents.push_back(x);
    noise.push_back(seeded_normal(want, options.seed, kKeyframeNoiseStream + k));
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor rows, condition_rows(latents, noise, config));
  VORTEX_ASSIGN_OR_RETURN(out.layout, build_keyframe_layout(text_tags, g, config, anchors));
  return generate_on_layout(model, std::move(out), text_states, rows, Tensor(), options, progress);
}

namespace {

const char* reference_kind_name(ReferenceKind kind) {
  switch (kind) {
    case ReferenceKind::kImage: return "image";
    case ReferenceKind::kVideo: return "video";
    case ReferenceKind::kAudio: return "audio";
  }
  return "unknown";
}

// The request rules of MiniMaxH3Ref2VASetupStep, then each reference's tensors: their shapes are
// where the layout's blocks come from.
Result<std::vector<ReferenceBlock>> reference_blocks(const std::vector<Reference>& references,
                                                     const H3Config& config) {
  if (references.empty()) return invalid_argument("ref2va needs at least one reference (t2va takes none)");
  int counts[3] = {0, 0, 0};
  for (const Reference& r : references) ++counts[static_cast<int>(r.kind)];
  const int limits[3] = {kMaxImageReferences, kMaxVideoReferences, kMaxAudioReferences};
  for (ReferenceKind kind : {ReferenceKind::kImage, ReferenceKind::kVideo, ReferenceKind::kAudio}) {
    const int k = static_cast<int>(kind);
    if (counts[k] > limits[k]) {
      return invalid_argument("references: " + std::to_string(counts[k]) + " " + reference_kind_name(kind) +
                              " references; at most " + std::to_string(limits[k]) + " are accepted");
    }
  }
  if (static_cast<int>(references.size()) > kMaxReferences) {
    return invalid_argument("references: " + std::to_string(references.size()) + " in all; at most " +
                            std::to_string(kMaxReferences) + " are accepted");
  }
  if (counts[static_cast<int>(ReferenceKind::kAudio)] == static_cast<int>(references.size())) {
    return invalid_argument("references: an audio reference needs an image or video reference beside it");
  }
  std::vector<ReferenceBlock> blocks;
  for (size_t k = 0; k < references.size(); ++k) {
    const Reference& r = references[k];
    const std::string name = "reference " + std::to_string(k + 1) + " (" + reference_kind_name(r.kind) + ")";
    ReferenceBlock block;
    block.kind = r.kind;
    const bool visual = r.kind != ReferenceKind::kAudio;
    if (visual != r.latents.defined()) {
      return invalid_argument(name + ": " + (visual ? "needs video latents" : "has no video latents"));
    }
    if (visual) {
      const Tensor& x = r.latents;
      if (x.dtype() != DType::kF32 || x.rank() != 4 || x.size(0) != config.in_channels ||
          (r.kind == ReferenceKind::kImage && x.size(1) != 1)) {
        return invalid_argument(name + ": latents " + x.describe() + " must be F32 [" +
                                std::to_string(config.in_channels) +
                                (r.kind == ReferenceKind::kImage ? ", 1, h, w]" : ", frames, h, w]"));
      }
      block.latent_frames = static_cast<int>(x.size(1));
      block.latent_height = static_cast<int>(x.size(2));
      block.latent_width = static_cast<int>(x.size(3));
    }
    const bool sound = r.kind == ReferenceKind::kAudio || (r.kind == ReferenceKind::kVideo && r.audio_rows.defined());
    if (r.audio_rows.defined() && !sound) return invalid_argument(name + ": an image reference has no soundtrack");
    if (sound) {
      const Tensor& a = r.audio_rows;
      if (!a.defined() || a.dtype() != DType::kF32 || a.rank() != 2 || a.size(0) == 0 ||
          a.size(0) % kAudioChannels != 0 || a.size(1) != config.audio_in_channels) {
        return invalid_argument(name + ": soundtrack rows " + (a.defined() ? a.describe() : "(undefined)") +
                                " must be F32 [2 x latents, " + std::to_string(config.audio_in_channels) + "]");
      }
      const Tensor ac = a.contiguous();
      const float* ad = ac.data_as<const float>();
      for (int64_t i = 0; i < ac.numel(); ++i) {
        if (!std::isfinite(ad[i])) {
          return invalid_argument(name + ": soundtrack element " + std::to_string(i) + " is not finite");
        }
      }
      block.audio_latents = static_cast<int>(a.size(0) / kAudioChannels);
    }
    blocks.push_back(block);
  }
  return blocks;
}

}  // namespace

Result<GenerateResult> generate_ref2va(StepModel& model, const Tensor& text_states,
                                       const std::vector<int32_t>& text_tags, const std::vector<Reference>& references,
                                       const GenerateOptions& options, const ProgressCallback& progress) {
  const H3Config& config = model.config();
  GenerateResult out;
  VORTEX_ASSIGN_OR_RETURN(out.geometry, resolve_geometry(options.video, config));
  VORTEX_RETURN_IF_ERROR(check_tagged_text(text_states, text_tags, config));
  VORTEX_ASSIGN_OR_RETURN(const std::vector<ReferenceBlock> blocks, reference_blocks(references, config));
  std::vector<Tensor> latents, noise, soundtracks;
  for (const Reference& r : references) {
    if (r.latents.defined()) {
      latents.push_back(r.latents);
      noise.push_back(seeded_normal(r.latents.shape(), options.seed, kKeyframeNoiseStream + noise.size()));
    }
    if (r.audio_rows.defined()) soundtracks.push_back(r.audio_rows.contiguous());
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor video_rows, condition_rows(latents, noise, config));
  const Tensor audio_rows = soundtracks.empty() ? Tensor() : concat_rows(soundtracks);
  VORTEX_ASSIGN_OR_RETURN(out.layout, build_ref2va_layout(text_tags, blocks, out.geometry, config));
  return generate_on_layout(model, std::move(out), text_states, video_rows, audio_rows, options, progress);
}

}  // namespace vortex::h3
