// Latents to media, as `vortex decode` and `vortex generate --media` both run it: the soundtrack
// through the audio VAE to a WAV, or picture and sound through both VAEs to an H.264 + AAC MP4.
//
// Everything that can be checked is checked before any decoder runs — the request (output kind
// and folder, which VAEs), then the latents against the VAE configs (shapes, dtypes, NaN / Inf,
// the soundtrack's length against the picture's) with the library's checks — so that bad input
// ends with one line and no output file; the file itself is written atomically by the writers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "models/vae/audio_vae.h"
#include "models/vae/video_vae.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cli {

struct MediaRequest {
  std::string audio_vae_path;
  std::string synthetic_audio_vae;
  std::string video_vae_path;
  std::string synthetic_video_vae;
  uint64_t weights_seed = 0;  // of the synthetic VAEs
  std::string out;            // PATH.wav (soundtrack) or PATH.mp4 (picture and sound)
  const char* out_flag = "--out";  // the option that gave `out`, for the errors
  // Where the decoders run: "cpu" (the fp32 reference), or "cuda" (the video VAE in bf16 with
  // fp32 norms, residual stream and stitching; the audio VAE in fp32).
  std::string device = "cpu";
};

// Registers --audio-vae, --synthetic-audio-vae, --video-vae and --synthetic-video-vae on `cmd`,
// spelled and explained alike in every command that decodes.
void add_vae_options(CLI::App* cmd, MediaRequest& request);

// The checks on the request alone: `out` ends in .wav or .mp4 and its folder exists; exactly one
// audio VAE; a video VAE exactly when the output is an MP4; an MP4 writer in this build.
Status check_media_request(const MediaRequest& request);

// Whether any of the VAE options came (they only make sense with an output to decode into).
bool any_vae_option(const MediaRequest& request);

// Whether the request decodes a picture (an MP4); meaningful once check_media_request passed.
bool wants_picture(const MediaRequest& request);

class MediaDecoder {
 public:
  // check_media_request, then loads the decoders (checkpoints or synthetic presets).
  static Result<MediaDecoder> load(const MediaRequest& request);

  // The latent shapes the decoders will be given (video [C, T, H, W], ignored for a WAV; audio
  // [2, A, C]), checked before any latents exist. `what` prefixes the errors.
  Status check_shapes(const Shape& video, const Shape& audio, const std::string& what) const;

  // Checks the latents (errors name `source`, the tensor and the element), decodes them and writes
  // request.out. `video_latents` may be null for a WAV. Progress lines go to stderr, one summary
  // line to stdout.
  Status decode(const Tensor* video_latents, const Tensor& audio_latents, const std::string& source) const {
    return decode(video_latents, audio_latents, source, request_.out);
  }
  // The same into `out` (of the request's kind, .wav or .mp4): a server's decoder writes one file per job.
  Status decode(const Tensor* video_latents, const Tensor& audio_latents, const std::string& source,
                const std::string& out) const;

 private:
  // The decoders on request_.device: frames [3, F, H, W] and the waveform [2, S], host F32.
  Result<Tensor> decode_picture(const Tensor& latents) const;
  Result<Tensor> decode_sound(const Tensor& latents) const;
  // The picture's and the sound's lengths agree; the picture has even sides.
  Status check_pairing(const Shape& video, const Shape& audio) const;

  MediaRequest request_;
  std::unique_ptr<const vae::AudioVae> audio_;
  std::unique_ptr<const vae::VideoVae> video_;
};

}  // namespace vortex::cli
