// fl2va requests (generate --first-frame / --last-frame, and encode-keyframe): keyframe PNGs read
// and put on the request's canvas as the reference pipeline does (MiniMaxH3ResizeStep), and their
// conditioning latents from the video VAE encoder (encode_vae_condition: the posterior sampled under
// seed 42, the same draw for every keyframe). ref2va's references (generate --reference): images
// likewise, each at its own size (MiniMaxH3Ref2VASetupStep), and WAV soundtracks through the audio
// VAE's encoder.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "decode_media.h"
#include "models/h3/generate.h"
#include "models/h3/keyframes.h"
#include "models/h3/layout.h"
#include "media/wav.h"
#include "models/vae/audio_vae_encoder.h"
#include "models/vae/video_vae_encoder.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {
class CudaAudioVaeEncoder;
class CudaVideoVaeEncoder;
}

namespace vortex::cli {

// The seed of every keyframe's posterior sample (the reference's encode_seed).
constexpr uint64_t kKeyframePosteriorSeed = 42;

struct KeyframeInput {
  std::string path;  // an RGB PNG
  h3::KeyframeAnchor anchor = h3::KeyframeAnchor::kFirst;
};

struct PreparedKeyframes {
  h3::Canvas canvas;
  std::vector<Tensor> pixels;  // U8 [H, W, 3] on the canvas, in request order (first, then last)
  std::vector<h3::KeyframeAnchor> anchors;
  std::vector<std::string> paths;
};

// Reads the PNGs and fits them onto `canvas`, or onto the first keyframe's own canvas
// (h3::keyframe_canvas) when none is given. Errors name the file.
Result<PreparedKeyframes> prepare_keyframes(const std::vector<KeyframeInput>& inputs,
                                            const std::optional<h3::Canvas>& canvas);

// One ref2va reference as read, before its encode.
struct PreparedReference {
  h3::ReferenceKind kind = h3::ReferenceKind::kImage;
  std::string path;
  // An image's U8 [H, W, 3] at its reference size, or a video's frames U8 [F, H, W, 3] on H3's
  // clock and its canvas (h3::normalize_reference_video); undefined for an audio reference.
  Tensor pixels;
  // An audio reference's waveform as read, or a video's soundtrack (samples undefined when the
  // video is silent), at the file's own rate.
  media::Waveform soundtrack;
  int soundtrack_latents = 0;  // the latents per channel its rows will hold (0: no soundtrack)
  // A video's: the file's frame rate, the frames decoded from it, the frames of `pixels` the video
  // VAE encodes and the latent frames that gives (h3::reference_video_latent_frames). An image is
  // one latent frame.
  double source_fps = 0.0;
  int64_t source_frames = 0;
  int64_t encoded_frames = 0;
  int latent_frames = 0;
  bool has_soundtrack() const { return soundtrack.samples.defined(); }
};

// ref2va's references in reading order, and the pictures and videos among them in that order (what
// the text encoder's presentation shows).
struct PreparedReferences {
  std::vector<PreparedReference> items;
  std::vector<Tensor> visuals;
  double max_seconds = 0;  // the generated duration a soundtrack is cut at
  int count(h3::ReferenceKind kind) const;
};

// What a reference path names, by its extension (any case): .wav a soundtrack, .mp4 / .mov / .mkv /
// .webm / .m4v a video, .png an image; nullopt for anything else.
std::optional<h3::ReferenceKind> reference_kind_of(const std::string& path);

// Reads each reference by its extension: an image resized to h3::fit_reference_image at
// `short_edge`; a soundtrack at its own rate (cut at the generated duration when encoded); a video
// decoded (media::read_video), put on H3's clock cut at `generated_frames` and on its canvas, with
// its soundtrack if it has one. Soundtracks need the audio VAE encoder's config (`audio`; null
// refuses them, naming the file). Errors name the file.
Result<PreparedReferences> prepare_references(const std::vector<std::string>& paths, int64_t short_edge,
                                              const vae::AudioVaeConfig* audio, int64_t generated_frames);

// Exactly one of --video-vae or --synthetic-video-vae names the keyframes' encoder (checked before
// anything loads).
Status check_keyframe_encoder_named(const std::string& video_vae_path, const std::string& synthetic_preset);

// --vae-encode-precision: "fp32" (the default: the CPU program's sums, on the GPU as three tf32
// products a multiply-add, ~3e-7 from exact sums) or "tf32" (--device cuda only; one tf32 product,
// approximate: the moments ~2.4e-4 rel-L2 from fp32's, as far as diffusers' default TF32
// convolutions are, in 0.57x (a clip) to 0.69x (a keyframe) the time on an H100). Anything else, or
// tf32 on the CPU, is refused by name.
Status check_vae_encode_precision(const std::string& precision, const std::string& device);
// The option's help, alike in every command that encodes keyframes or references.
extern const char* const kVaeEncodePrecisionHelp;

// The keyframes' video VAE encoder: the CPU program, or on --device cuda its GPU twin
// (models/vae/cuda_video_vae_encoder.h: the moments within 1e-5 rel-L2 of the CPU's in fp32).
class KeyframeEncoder {
 public:
  // The encoder --video-vae or --synthetic-video-vae names (exactly one); `device` "cpu" or "cuda";
  // `precision` as check_vae_encode_precision takes it.
  static Result<KeyframeEncoder> load(const std::string& video_vae_path, const std::string& synthetic_preset,
                                      uint64_t weights_seed, const std::string& device,
                                      const std::string& precision = "fp32");

  const vae::VideoVaeConfig& config() const { return config_; }
  const char* where() const { return !gpu_ ? "the CPU" : tf32_ ? "the GPU (tf32 convolutions)" : "the GPU"; }
  // encode_video_moments with the checkpoint's tiling.
  Result<Tensor> moments(const Tensor& pixels) const;

 private:
  vae::VideoVaeConfig config_;
  std::optional<vae::VideoVaeEncoder> cpu_;        // the CPU's, or
  std::shared_ptr<vae::CudaVideoVaeEncoder> gpu_;  // the GPU's
  bool tf32_ = false;                              // its convs one tf32 product (--vae-encode-precision tf32)
};

// Canvas pixels' normalised conditioning latents: an image U8 [H, W, 3] → F32 [C, 1, H/16, W/16],
// frames U8 [F, H, W, 3] → F32 [C, F', H/16, W/16].
Result<Tensor> keyframe_latents(const KeyframeEncoder& encoder, const Tensor& pixels, uint64_t seed);

// Every prepared keyframe's latents with its anchor, through `encoder`.
Result<std::vector<h3::Keyframe>> encode_keyframes(const PreparedKeyframes& keyframes, const KeyframeEncoder& encoder);

// The audio VAE's encoder for soundtrack references, on the CPU or (--device cuda) the GPU.
class SoundtrackEncoder {
 public:
  // --audio-vae's checkpoint or the --synthetic-audio-vae preset (drawn from `media.weights_seed`, as
  // the decoders are); none when neither is named. `device` "cpu" or "cuda".
  static Result<std::optional<SoundtrackEncoder>> load(const MediaRequest& media, const std::string& device);

  const vae::AudioVaeConfig& config() const { return config_; }
  const char* where() const { return gpu_ ? "the GPU" : "the CPU"; }
  // vae::encode_reference_soundtrack's contract: the normalised rows [2 · A, latent_channels].
  Result<Tensor> rows(const Tensor& waveform, int sample_rate, double max_seconds) const;

 private:
  vae::AudioVaeConfig config_;
  std::optional<vae::AudioVaeEncoder> cpu_;        // the CPU's, or
  std::shared_ptr<vae::CudaAudioVaeEncoder> gpu_;  // the GPU's
};

// Every reference's conditioning in reading order through `images`: an image's latents (F32 [C, 1,
// H/16, W/16], the same seed-42 posterior draw as a keyframe's), a video's (F32 [C, F', H/16, W/16]
// from its first encoded_frames frames, the same draw of the moments' shape); and a soundtrack's
// rows, an audio reference's or a video's, through `audio` (null only when no reference has sound).
Result<std::vector<h3::Reference>> encode_references(const PreparedReferences& references, const KeyframeEncoder& images,
                                                     const SoundtrackEncoder* audio);

}  // namespace vortex::cli
