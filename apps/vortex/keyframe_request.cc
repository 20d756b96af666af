#include "keyframe_request.h"

#include <cctype>
#include <cstdio>
#include <filesystem>

#include "models/h3/config.h"
#if defined(VORTEX_HAVE_CUDA)
#include "models/vae/cuda_video_vae_encoder.h"
#endif
#if defined(VORTEX_HAVE_MEDIA)
#include "media/png.h"
#endif

namespace vortex::cli {

Result<PreparedKeyframes> prepare_keyframes(const std::vector<KeyframeInput>& inputs,
                                            const std::optional<h3::Canvas>& canvas) {
#if !defined(VORTEX_HAVE_MEDIA)
  (void)inputs;
  (void)canvas;
  return unimplemented("keyframes: this build has no PNG reader (libpng was not found)");
#else
  PreparedKeyframes out;
  for (size_t k = 0; k < inputs.size(); ++k) {
    auto image = media::read_png_rgb8(inputs[k].path);
    if (!image.ok()) return image.status();
    if (k == 0) {
      if (canvas) {
        out.canvas = *canvas;
      } else {
        auto resolved = h3::keyframe_canvas(image->size(1), image->size(0));
        if (!resolved.ok()) return resolved.status().with_context(inputs[k].path);
        out.canvas = *resolved;
      }
    }
    auto fitted = h3::fit_keyframe(*image, out.canvas, static_cast<int>(k));
    if (!fitted.ok()) return fitted.status().with_context(inputs[k].path);
    out.pixels.push_back(std::move(*fitted));
    out.anchors.push_back(inputs[k].anchor);
    out.paths.push_back(inputs[k].path);
  }
  return out;
#endif
}

namespace {

std::string lowercase_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

}  // namespace

bool is_soundtrack_reference(const std::string& path) { return lowercase_extension(path) == ".wav"; }

Result<PreparedReferences> prepare_references(const std::vector<std::string>& paths, int64_t short_edge,
                                              const vae::AudioVaeConfig* audio, double max_seconds) {
  PreparedReferences out;
  out.max_seconds = max_seconds;
  for (const std::string& path : paths) {
    const std::string ext = lowercase_extension(path);
    if (ext == ".wav") {
      if (audio == nullptr) {
        return invalid_argument(path + ": an audio reference is encoded by the audio VAE (give --audio-vae or "
                                "--synthetic-audio-vae)");
      }
      VORTEX_ASSIGN_OR_RETURN(media::Waveform wave, media::read_wav(path));
      auto keep = vae::reference_soundtrack_samples(*audio, wave.samples, wave.sample_rate, max_seconds);
      if (!keep.ok()) return keep.status().with_context(path);
      const int64_t hop = audio->hop_length();
      out.soundtrack_latents.push_back(static_cast<int>((*keep + hop - 1) / hop));
      out.soundtracks.push_back(std::move(wave));
      out.kinds.push_back(h3::ReferenceKind::kAudio);
    } else if (ext == ".png") {
#if !defined(VORTEX_HAVE_MEDIA)
      (void)short_edge;
      return unimplemented(path + ": this build has no PNG reader (libpng was not found)");
#else
      auto image = media::read_png_rgb8(path);
      if (!image.ok()) return image.status();
      auto fitted = h3::fit_reference_image(*image, short_edge);
      if (!fitted.ok()) return fitted.status().with_context(path);
      out.pixels.push_back(std::move(*fitted));
      out.kinds.push_back(h3::ReferenceKind::kImage);
#endif
    } else {
      return invalid_argument(path + ": a reference is a .png image or a .wav soundtrack");
    }
    out.paths.push_back(path);
  }
  return out;
}

Status check_keyframe_encoder_named(const std::string& video_vae_path, const std::string& synthetic_preset) {
  if (video_vae_path.empty() == synthetic_preset.empty()) {
    return invalid_argument("give exactly one of --video-vae or --synthetic-video-vae to encode the keyframes");
  }
  return ok_status();
}

Result<KeyframeEncoder> KeyframeEncoder::load(const std::string& video_vae_path,
                                              const std::string& synthetic_preset, uint64_t weights_seed,
                                              const std::string& device) {
  VORTEX_RETURN_IF_ERROR(check_keyframe_encoder_named(video_vae_path, synthetic_preset));
  vae::VideoVaeEncoder cpu;
  if (!video_vae_path.empty()) {
    VORTEX_ASSIGN_OR_RETURN(cpu, vae::load_video_vae_encoder(video_vae_path));
  } else {
    VORTEX_ASSIGN_OR_RETURN(vae::VideoVaeConfig c, vae::video_vae_config_preset(synthetic_preset));
    VORTEX_ASSIGN_OR_RETURN(
        cpu, vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(c, weights_seed), c));
  }
  KeyframeEncoder e;
  e.config_ = cpu.config;
  if (device == "cuda") {
#if defined(VORTEX_HAVE_CUDA)
    VORTEX_ASSIGN_OR_RETURN(std::unique_ptr<vae::CudaVideoVaeEncoder> gpu, vae::CudaVideoVaeEncoder::create(cpu));
    e.gpu_ = std::move(gpu);
    return e;
#else
    return unimplemented("--device cuda: this build has no CUDA backend (the keyframes' video VAE encoder)");
#endif
  }
  e.cpu_ = std::move(cpu);
  return e;
}

Result<Tensor> KeyframeEncoder::moments(const Tensor& pixels) const {
#if defined(VORTEX_HAVE_CUDA)
  if (gpu_) return gpu_->encode_moments(pixels);
#endif
  return vae::encode_video_moments(*cpu_, pixels);
}

Result<Tensor> keyframe_latents(const KeyframeEncoder& encoder, const Tensor& pixels, uint64_t seed) {
  VORTEX_ASSIGN_OR_RETURN(Tensor normalised, vae::keyframe_pixels(pixels));
  VORTEX_ASSIGN_OR_RETURN(Tensor moments, encoder.moments(normalised));
  const int64_t C = encoder.config().latent_channels;
  const Tensor eps =
      h3::seeded_normal({C, moments.size(1), moments.size(2), moments.size(3)}, seed, h3::kKeyframePosteriorStream);
  return vae::sample_video_condition(encoder.config(), moments, eps);
}

Result<std::vector<h3::Keyframe>> encode_keyframes(const PreparedKeyframes& keyframes, const KeyframeEncoder& encoder) {
  std::vector<h3::Keyframe> out;
  for (size_t k = 0; k < keyframes.pixels.size(); ++k) {
    std::fprintf(stderr, "encoding keyframe %zu (%s) through the video VAE on %s\n", k + 1,
                 keyframes.paths[k].c_str(), encoder.where());
    auto latents = keyframe_latents(encoder, keyframes.pixels[k], kKeyframePosteriorSeed);
    if (!latents.ok()) return latents.status().with_context(keyframes.paths[k]);
    out.push_back({std::move(*latents), keyframes.anchors[k]});
  }
  return out;
}

Result<std::optional<vae::AudioVaeEncoder>> load_soundtrack_encoder(const MediaRequest& media) {
  if (!media.audio_vae_path.empty()) {
    VORTEX_ASSIGN_OR_RETURN(vae::AudioVaeEncoder e, vae::load_audio_vae_encoder(media.audio_vae_path));
    return std::optional<vae::AudioVaeEncoder>(std::move(e));
  }
  if (media.synthetic_audio_vae.empty()) return std::optional<vae::AudioVaeEncoder>();
  VORTEX_ASSIGN_OR_RETURN(const vae::AudioVaeConfig c, vae::audio_vae_config_preset(media.synthetic_audio_vae));
  VORTEX_ASSIGN_OR_RETURN(vae::AudioVaeEncoder e,
                          vae::assemble_audio_vae_encoder(vae::synthetic_audio_vae_tensors(c, media.weights_seed), c));
  return std::optional<vae::AudioVaeEncoder>(std::move(e));
}

Result<std::vector<h3::Reference>> encode_references(const PreparedReferences& references, const KeyframeEncoder& images,
                                                     const vae::AudioVaeEncoder* audio) {
  std::vector<h3::Reference> out;
  size_t image = 0, soundtrack = 0;
  for (size_t k = 0; k < references.kinds.size(); ++k) {
    const std::string& path = references.paths[k];
    if (references.kinds[k] == h3::ReferenceKind::kAudio) {
      if (audio == nullptr) return invalid_argument(path + ": no audio VAE encoder to encode this soundtrack");
      const media::Waveform& wave = references.soundtracks[soundtrack++];
      std::fprintf(stderr, "encoding reference %zu (%s, %lld samples) through the audio VAE on the CPU\n", k + 1,
                   path.c_str(), static_cast<long long>(wave.samples.size(1)));
      auto rows = vae::encode_reference_soundtrack(*audio, wave.samples, wave.sample_rate, references.max_seconds);
      if (!rows.ok()) return rows.status().with_context(path);
      out.push_back({h3::ReferenceKind::kAudio, Tensor(), std::move(*rows)});
      continue;
    }
    const Tensor& pixels = references.pixels[image++];
    std::fprintf(stderr, "encoding reference image %zu (%s, %lldx%lld) through the video VAE on %s\n", k + 1,
                 path.c_str(), static_cast<long long>(pixels.size(1)), static_cast<long long>(pixels.size(0)),
                 images.where());
    auto latents = keyframe_latents(images, pixels, kKeyframePosteriorSeed);
    if (!latents.ok()) return latents.status().with_context(path);
    out.push_back({h3::ReferenceKind::kImage, std::move(*latents), Tensor()});
  }
  return out;
}

}  // namespace vortex::cli
