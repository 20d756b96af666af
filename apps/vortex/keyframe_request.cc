#include "keyframe_request.h"

#include <cctype>
#include <cstdio>
#include <filesystem>

#include "models/h3/config.h"
#include "models/h3/reference_video.h"
#if defined(VORTEX_HAVE_CUDA)
#include "models/vae/cuda_audio_vae_encoder.h"
#include "models/vae/cuda_video_vae_encoder.h"
#endif
#if defined(VORTEX_HAVE_MEDIA)
#include "media/png.h"
#include "media/video_reader.h"
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

std::optional<h3::ReferenceKind> reference_kind_of(const std::string& path) {
  const std::string ext = lowercase_extension(path);
  if (ext == ".wav") return h3::ReferenceKind::kAudio;
  if (ext == ".png") return h3::ReferenceKind::kImage;
  for (const char* video : {".mp4", ".mov", ".mkv", ".webm", ".m4v"}) {
    if (ext == video) return h3::ReferenceKind::kVideo;
  }
  return std::nullopt;
}

int PreparedReferences::count(h3::ReferenceKind kind) const {
  int n = 0;
  for (const PreparedReference& r : items) n += r.kind == kind;
  return n;
}

namespace {

// A soundtrack is refused, naming its file, when no audio VAE encoder is named to encode it.
Status require_audio_vae(const std::string& path, const char* what, const vae::AudioVaeConfig* audio) {
  if (audio != nullptr) return ok_status();
  return invalid_argument(path + ": " + what + " is encoded by the audio VAE (give --audio-vae or " +
                          "--synthetic-audio-vae)");
}

// A soundtrack's sizing: the latents per channel its rows will hold once cut at max_seconds and
// resampled onto the audio VAE's rate.
Status size_soundtrack(PreparedReference& r, const vae::AudioVaeConfig* audio, double max_seconds,
                       const char* what) {
  VORTEX_RETURN_IF_ERROR(require_audio_vae(r.path, what, audio));
  auto keep = vae::reference_soundtrack_samples(*audio, r.soundtrack.samples, r.soundtrack.sample_rate, max_seconds);
  if (!keep.ok()) return keep.status().with_context(r.path);
  const int64_t hop = audio->hop_length();
  r.soundtrack_latents = static_cast<int>((*keep + hop - 1) / hop);
  return ok_status();
}

#if defined(VORTEX_HAVE_MEDIA)
// A video file's frames onto H3's clock and canvas, and its soundtrack if it carries one.
Status prepare_video(PreparedReference& r, const vae::AudioVaeConfig* audio, double max_seconds,
                     int64_t generated_frames) {
  // Each frame onto the canvas as it is decoded: a 4K clip's own frames are never all held.
  std::optional<h3::ReferenceVideoNormalizer> clock;
  const auto on_frame = [&](const media::VideoStream& stream, const Tensor& rgb) -> Status {
    if (!clock) {
      auto created = h3::ReferenceVideoNormalizer::create(stream.fps, generated_frames);
      if (!created.ok()) return created.status().with_context(r.path);
      clock = std::move(*created);
    }
    const Status added = clock->add(rgb);
    return added.ok() ? added : added.with_context(r.path);
  };
  VORTEX_ASSIGN_OR_RETURN(media::DecodedVideo video, media::read_video(r.path, max_seconds, on_frame));
  r.source_fps = video.fps;
  r.source_frames = video.frame_count;
  auto frames = clock->finish();
  if (!frames.ok()) return frames.status().with_context(r.path);
  r.pixels = std::move(*frames);
  r.encoded_frames = h3::reference_video_encoded_frames(r.pixels.size(0));
  r.latent_frames = static_cast<int>(h3::reference_video_latent_frames(r.encoded_frames));
  if (video.audio.defined()) {
    r.soundtrack = {std::move(video.audio), video.sample_rate};
    VORTEX_RETURN_IF_ERROR(size_soundtrack(r, audio, max_seconds, "its soundtrack"));
  }
  return ok_status();
}
#endif

}  // namespace

Result<PreparedReferences> prepare_references(const std::vector<std::string>& paths, int64_t short_edge,
                                              const vae::AudioVaeConfig* audio, int64_t generated_frames) {
  PreparedReferences out;
  out.max_seconds = static_cast<double>(generated_frames) / h3::kFps;
  for (const std::string& path : paths) {
    const std::optional<h3::ReferenceKind> kind = reference_kind_of(path);
    if (!kind) {
      return invalid_argument(path + ": a reference is a .png image, a .wav soundtrack or a video (.mp4, .mov, "
                              ".mkv, .webm, .m4v)");
    }
    PreparedReference r;
    r.kind = *kind;
    r.path = path;
    if (r.kind == h3::ReferenceKind::kAudio) {
      VORTEX_RETURN_IF_ERROR(require_audio_vae(path, "an audio reference", audio));
      VORTEX_ASSIGN_OR_RETURN(r.soundtrack, media::read_wav(path));
      VORTEX_RETURN_IF_ERROR(size_soundtrack(r, audio, out.max_seconds, "an audio reference"));
    } else {
#if !defined(VORTEX_HAVE_MEDIA)
      (void)short_edge;
      (void)generated_frames;
      return unimplemented(path + ": this build has no image or video reader (libpng / libav were not found)");
#else
      if (r.kind == h3::ReferenceKind::kImage) {
        VORTEX_ASSIGN_OR_RETURN(const Tensor image, media::read_png_rgb8(path));
        auto fitted = h3::fit_reference_image(image, short_edge);
        if (!fitted.ok()) return fitted.status().with_context(path);
        r.pixels = std::move(*fitted);
        r.latent_frames = 1;
      } else {
        VORTEX_RETURN_IF_ERROR(prepare_video(r, audio, out.max_seconds, generated_frames));
      }
      out.visuals.push_back(r.pixels);
#endif
    }
    out.items.push_back(std::move(r));
  }
  return out;
}

Status check_keyframe_encoder_named(const std::string& video_vae_path, const std::string& synthetic_preset) {
  if (video_vae_path.empty() == synthetic_preset.empty()) {
    return invalid_argument("give exactly one of --video-vae or --synthetic-video-vae to encode the keyframes");
  }
  return ok_status();
}

const char* const kVaeEncodePrecisionHelp =
    "The video VAE encoder's convolutions (keyframes and references): fp32 (the reference's sums), or tf32 "
    "(--device cuda; one tf32 product, approximate: the moments ~2.4e-4 rel-L2 from fp32's, as diffusers' default "
    "TF32 convolutions; ~1.4-1.8x faster)";

Status check_vae_encode_precision(const std::string& precision, const std::string& device) {
  if (precision != "fp32" && precision != "tf32") {
    return invalid_argument("--vae-encode-precision " + precision + ": expected fp32 or tf32");
  }
  if (precision == "tf32" && device != "cuda") {
    return invalid_argument(
        "--vae-encode-precision tf32 runs on --device cuda only (the CPU runs the reference program)");
  }
  return ok_status();
}

Result<KeyframeEncoder> KeyframeEncoder::load(const std::string& video_vae_path,
                                              const std::string& synthetic_preset, uint64_t weights_seed,
                                              const std::string& device, const std::string& precision) {
  VORTEX_RETURN_IF_ERROR(check_vae_encode_precision(precision, device));
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
    // fp32: the encoder's default kernels (VORTEX_VARIANT_VAE_CONV may name a measurement variant).
    e.tf32_ = precision == "tf32";
    std::optional<cuda::VaeConvVariant> variant;
    if (e.tf32_) variant = cuda::VaeConvVariant::kTf32;
    VORTEX_ASSIGN_OR_RETURN(std::unique_ptr<vae::CudaVideoVaeEncoder> gpu,
                            vae::CudaVideoVaeEncoder::create(cpu, nullptr, variant));
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

Result<std::optional<SoundtrackEncoder>> SoundtrackEncoder::load(const MediaRequest& media, const std::string& device) {
  vae::AudioVaeEncoder cpu;
  if (!media.audio_vae_path.empty()) {
    VORTEX_ASSIGN_OR_RETURN(cpu, vae::load_audio_vae_encoder(media.audio_vae_path));
  } else if (!media.synthetic_audio_vae.empty()) {
    VORTEX_ASSIGN_OR_RETURN(const vae::AudioVaeConfig c, vae::audio_vae_config_preset(media.synthetic_audio_vae));
    VORTEX_ASSIGN_OR_RETURN(cpu,
                            vae::assemble_audio_vae_encoder(vae::synthetic_audio_vae_tensors(c, media.weights_seed), c));
  } else {
    return std::optional<SoundtrackEncoder>();
  }
  SoundtrackEncoder e;
  e.config_ = cpu.config;
  if (device == "cuda") {
#if defined(VORTEX_HAVE_CUDA)
    VORTEX_ASSIGN_OR_RETURN(std::unique_ptr<vae::CudaAudioVaeEncoder> gpu, vae::CudaAudioVaeEncoder::create(cpu));
    e.gpu_ = std::move(gpu);
    return std::optional<SoundtrackEncoder>(std::move(e));
#else
    return unimplemented("--device cuda: this build has no CUDA backend (the soundtracks' audio VAE encoder)");
#endif
  }
  e.cpu_ = std::move(cpu);
  return std::optional<SoundtrackEncoder>(std::move(e));
}

Result<Tensor> SoundtrackEncoder::rows(const Tensor& waveform, int sample_rate, double max_seconds) const {
#if defined(VORTEX_HAVE_CUDA)
  if (gpu_) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor stereo, vae::normalize_reference_soundtrack(waveform, sample_rate,
                                                                                     config_.sampling_rate, max_seconds));
    return gpu_->encode(stereo);
  }
#endif
  return vae::encode_reference_soundtrack(*cpu_, waveform, sample_rate, max_seconds);
}

Result<std::vector<h3::Reference>> encode_references(const PreparedReferences& references, const KeyframeEncoder& images,
                                                     const SoundtrackEncoder* audio) {
  std::vector<h3::Reference> out;
  for (size_t k = 0; k < references.items.size(); ++k) {
    const PreparedReference& r = references.items[k];
    h3::Reference encoded{r.kind, Tensor(), Tensor()};
    if (r.kind == h3::ReferenceKind::kImage) {
      std::fprintf(stderr, "encoding reference image %zu (%s, %lldx%lld) through the video VAE on %s\n", k + 1,
                   r.path.c_str(), static_cast<long long>(r.pixels.size(1)), static_cast<long long>(r.pixels.size(0)),
                   images.where());
      auto latents = keyframe_latents(images, r.pixels, kKeyframePosteriorSeed);
      if (!latents.ok()) return latents.status().with_context(r.path);
      encoded.latents = std::move(*latents);
    } else if (r.kind == h3::ReferenceKind::kVideo) {
      std::fprintf(stderr, "encoding reference video %zu (%s, %lld frames of %lldx%lld) through the video VAE on %s\n",
                   k + 1, r.path.c_str(), static_cast<long long>(r.encoded_frames),
                   static_cast<long long>(r.pixels.size(2)), static_cast<long long>(r.pixels.size(1)), images.where());
      VORTEX_ASSIGN_OR_RETURN(const Tensor frames, r.pixels.slice(0, 0, r.encoded_frames));
      auto latents = keyframe_latents(images, frames.contiguous(), kKeyframePosteriorSeed);
      if (!latents.ok()) return latents.status().with_context(r.path);
      if (latents->size(1) != r.latent_frames) {
        return invalid_argument(r.path + ": the video VAE encoded " + std::to_string(latents->size(1)) +
                                " latent frames from " + std::to_string(r.encoded_frames) + "; the request was laid out for " +
                                std::to_string(r.latent_frames) + " (a VAE of another temporal geometry than the release's)");
      }
      encoded.latents = std::move(*latents);
    }
    if (r.has_soundtrack()) {
      if (audio == nullptr) return invalid_argument(r.path + ": no audio VAE encoder to encode this soundtrack");
      std::fprintf(stderr, "encoding the soundtrack of reference %zu (%s, %lld samples at %d Hz) through the audio VAE on %s\n",
                   k + 1, r.path.c_str(), static_cast<long long>(r.soundtrack.samples.size(1)), r.soundtrack.sample_rate,
                   audio->where());
      auto rows = audio->rows(r.soundtrack.samples, r.soundtrack.sample_rate, references.max_seconds);
      if (!rows.ok()) return rows.status().with_context(r.path);
      encoded.audio_rows = std::move(*rows);
    }
    out.push_back(std::move(encoded));
  }
  return out;
}

}  // namespace vortex::cli
