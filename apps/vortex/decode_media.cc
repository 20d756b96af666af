#include "decode_media.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "media/wav.h"
#if defined(VORTEX_HAVE_CUDA)
#include "cuda/runtime.h"
#include "models/vae/cuda_audio_vae.h"
#include "models/vae/cuda_video_vae.h"
#endif
#include "models/h3/layout.h"
#if defined(VORTEX_HAVE_MEDIA)
#include "media/mp4.h"
#endif

namespace vortex::cli {

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Status exactly_one(const std::string& path, const std::string& preset, const char* path_flag,
                   const char* preset_flag, const char* purpose) {
  if (!path.empty() && !preset.empty()) {
    return invalid_argument(std::string(path_flag) + " and " + preset_flag + " exclude each other");
  }
  if (path.empty() && preset.empty()) {
    return invalid_argument(std::string("one of ") + path_flag + " PATH or " + preset_flag + " PRESET is needed to " +
                            purpose);
  }
  return ok_status();
}

Result<vae::AudioVae> load_audio(const MediaRequest& r) {
  if (!r.audio_vae_path.empty()) return vae::load_audio_vae(r.audio_vae_path);
  auto config = vae::audio_vae_config_preset(r.synthetic_audio_vae);
  if (!config.ok()) return config.status().with_context("--synthetic-audio-vae");
  return vae::assemble_audio_vae(vae::synthetic_audio_vae_tensors(*config, r.weights_seed, false), *config);
}

Result<vae::VideoVae> load_video(const MediaRequest& r) {
  if (!r.video_vae_path.empty()) return vae::load_video_vae(r.video_vae_path);
  auto config = vae::video_vae_config_preset(r.synthetic_video_vae);
  if (!config.ok()) return config.status().with_context("--synthetic-video-vae");
  return vae::assemble_video_vae(vae::synthetic_video_vae_tensors(*config, r.weights_seed), *config);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

bool any_vae_option(const MediaRequest& r) {
  return !r.audio_vae_path.empty() || !r.synthetic_audio_vae.empty() || !r.video_vae_path.empty() ||
         !r.synthetic_video_vae.empty();
}

void add_vae_options(CLI::App* cmd, MediaRequest& request) {
  cmd->add_option("--audio-vae", request.audio_vae_path, "Audio VAE checkpoint (file or folder)");
  cmd->add_option("--synthetic-audio-vae", request.synthetic_audio_vae,
                  "Deterministic synthetic audio VAE of a preset (h3, test, small)");
  cmd->add_option("--video-vae", request.video_vae_path, "Video VAE checkpoint (file or folder; MP4 only)");
  cmd->add_option("--synthetic-video-vae", request.synthetic_video_vae,
                  "Deterministic synthetic video VAE of a preset (h3, test, small; MP4 only)");
}

bool wants_picture(const MediaRequest& r) { return ends_with(r.out, ".mp4"); }

Status check_media_request(const MediaRequest& r) {
  const bool mp4 = wants_picture(r);
  const std::string out = std::string(r.out_flag) + " " + r.out;
  if (r.device != "cpu" && r.device != "cuda") return invalid_argument("--device " + r.device + ": expected cpu or cuda");
#if defined(VORTEX_HAVE_CUDA)
  if (r.device == "cuda") VORTEX_RETURN_IF_ERROR(cuda::require_hopper_device("--device cuda"));
#else
  if (r.device == "cuda") return unimplemented("--device cuda: this build has no CUDA backend");
#endif
  if (!mp4 && !ends_with(r.out, ".wav")) return invalid_argument(out + ": must end in .wav or .mp4");
  const fs::path folder = fs::path(r.out).parent_path();
  if (!folder.empty() && !fs::is_directory(folder)) {
    return invalid_argument(out + ": the folder " + folder.string() + " does not exist");
  }
  VORTEX_RETURN_IF_ERROR(
      exactly_one(r.audio_vae_path, r.synthetic_audio_vae, "--audio-vae", "--synthetic-audio-vae", "decode the sound"));
  const bool video = !r.video_vae_path.empty() || !r.synthetic_video_vae.empty();
  if (mp4) {
    VORTEX_RETURN_IF_ERROR(exactly_one(r.video_vae_path, r.synthetic_video_vae, "--video-vae", "--synthetic-video-vae",
                                       "decode the picture of an MP4"));
#if !defined(VORTEX_HAVE_MEDIA)
    return unimplemented(out + ": this build has no MP4 writer (libav was not found)");
#endif
  } else if (video) {
    return invalid_argument(out + ": a WAV holds no picture; drop --video-vae / --synthetic-video-vae or write an .mp4");
  }
  return ok_status();
}

Result<MediaDecoder> MediaDecoder::load(const MediaRequest& request) {
  VORTEX_RETURN_IF_ERROR(check_media_request(request));
  MediaDecoder d;
  d.request_ = request;
  VORTEX_ASSIGN_OR_RETURN(vae::AudioVae audio, load_audio(request));
  d.audio_ = std::make_unique<const vae::AudioVae>(std::move(audio));
  if (wants_picture(request)) {
    VORTEX_ASSIGN_OR_RETURN(vae::VideoVae video, load_video(request));
    d.video_ = std::make_unique<const vae::VideoVae>(std::move(video));
  }
  return d;
}

Status MediaDecoder::check_pairing(const Shape& video, const Shape& audio) const {
  const vae::VideoVaeConfig& c = video_->config;
  VORTEX_RETURN_IF_ERROR(vae::check_soundtrack_length(c, video[1], audio_->config, audio[1], h3::kFps));
  // 4:2:0 H.264 needs even sides; an odd spatial ratio can make them odd.
  const int64_t height = video[2] * c.spatial_ratio(), width = video[3] * c.spatial_ratio();
  if (height % 2 != 0 || width % 2 != 0) {
    return invalid_argument("video latents " + video.to_string() + " decode to " + std::to_string(width) + "x" +
                            std::to_string(height) + " pixels; an MP4 needs even sides");
  }
  return ok_status();
}

Status MediaDecoder::check_shapes(const Shape& video, const Shape& audio, const std::string& what) const {
  Status st = vae::check_audio_latent_shape(audio_->config, audio, "audio latents");
  if (st.ok() && video_ != nullptr) {
    st = vae::check_video_latent_shape(video_->config, video, "video latents");
    if (st.ok()) st = check_pairing(video, audio);
  }
  return st.with_context(what);
}

Result<Tensor> MediaDecoder::decode_picture(const Tensor& latents) const {
  if (request_.device == "cpu") return vae::decode_video(*video_, latents);
#if defined(VORTEX_HAVE_CUDA)
  vae::CudaVideoVaeOptions options;
  options.dtype = DType::kBF16;
  VORTEX_ASSIGN_OR_RETURN(auto gpu, vae::CudaVideoVae::create(*video_, options));
  return gpu->decode(latents);  // the checkpoint's own tiling
#else
  return unimplemented("--device cuda: this build has no CUDA backend");
#endif
}

Result<Tensor> MediaDecoder::decode_sound(const Tensor& latents) const {
  if (request_.device == "cpu") return vae::decode_audio(*audio_, latents);
#if defined(VORTEX_HAVE_CUDA)
  VORTEX_ASSIGN_OR_RETURN(auto gpu, vae::CudaAudioVae::create(*audio_));
  return gpu->decode(latents);
#else
  return unimplemented("--device cuda: this build has no CUDA backend");
#endif
}

Status MediaDecoder::decode(const Tensor* video_latents, const Tensor& audio_latents, const std::string& source,
                            const std::string& out) const {
  const auto start = std::chrono::steady_clock::now();
  Status st = vae::validate_audio_latents(audio_->config, audio_latents, "tensor 'audio_latents'");
  if (st.ok() && video_ != nullptr) {
    if (video_latents == nullptr) return internal_error("an MP4 decode was given no video latents");
    st = vae::validate_video_latents(video_->config, *video_latents, "tensor 'video_latents'");
    if (st.ok()) st = check_pairing(video_latents->shape(), audio_latents.shape());
  }
  VORTEX_RETURN_IF_ERROR(st.with_context(source));

  Tensor frames;
  if (video_ != nullptr) {
    const Shape& s = video_latents->shape();
    const int64_t p = video_->config.spatial_ratio();
    std::fprintf(stderr, "decode: picture: video VAE on latents %s -> %lld frames of %lldx%lld\n",
                 s.to_string().c_str(), static_cast<long long>(video_->config.decoded_frames(s[1])),
                 static_cast<long long>(s[3] * p), static_cast<long long>(s[2] * p));
    VORTEX_ASSIGN_OR_RETURN(frames, decode_picture(*video_latents));
  }
  const vae::AudioVaeConfig& ac = audio_->config;
  std::fprintf(stderr, "decode: sound: audio VAE on latents %s -> %lld samples per channel at %d Hz\n",
               audio_latents.shape().to_string().c_str(),
               static_cast<long long>(ac.decoded_samples(audio_latents.size(1))), ac.sampling_rate);
  VORTEX_ASSIGN_OR_RETURN(Tensor waveform, decode_sound(audio_latents));
  std::fprintf(stderr, "decode: writing %s\n", out.c_str());
  const double seconds = seconds_since(start);

  if (video_ == nullptr) {
    VORTEX_RETURN_IF_ERROR(media::write_wav(out, waveform, ac.sampling_rate));
    std::printf("wrote %s: %lld samples per channel at %d Hz (%.2f s); decoded in %.2f s\n", out.c_str(),
                static_cast<long long>(waveform.size(1)), ac.sampling_rate,
                static_cast<double>(waveform.size(1)) / ac.sampling_rate, seconds);
    return ok_status();
  }
#if defined(VORTEX_HAVE_MEDIA)
  VORTEX_RETURN_IF_ERROR(media::write_mp4(out, frames, h3::kFps, &waveform, ac.sampling_rate));
  std::printf("wrote %s: %lld frames of %lldx%lld at %d fps with a %d Hz stereo soundtrack; decoded in %.2f s\n",
              out.c_str(), static_cast<long long>(frames.size(1)), static_cast<long long>(frames.size(3)),
              static_cast<long long>(frames.size(2)), h3::kFps, ac.sampling_rate, seconds);
  return ok_status();
#else
  return unimplemented(std::string(request_.out_flag) + " " + out +
                       ": this build has no MP4 writer (libav was not found)");
#endif
}

}  // namespace vortex::cli
