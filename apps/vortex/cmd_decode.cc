// vortex decode: latents (as `vortex generate` writes them) to media: the soundtrack through the
// audio VAE to a WAV, or picture and sound through both VAEs to an H.264 + AAC MP4, on the CPU or
// the GPU. The work is decode_media's, shared with `vortex generate --media`.
#include <memory>

#include "commands.h"
#include "decode_media.h"
#include "formats/safetensors.h"

namespace vortex::cli {

namespace {

struct DecodeArgs {
  std::string latents_path;
  MediaRequest media;
};

Result<Tensor> latents_named(const SafetensorsFile& file, const std::string& path, const std::string& name) {
  if (!file.has(name)) return invalid_argument(path + ": no tensor '" + name + "' (written by vortex generate)");
  return file.get(name);
}

Status run_decode(const DecodeArgs& args) {
  // The request and the latents file first: both are cheap, a checkpoint may not be.
  VORTEX_RETURN_IF_ERROR(check_media_request(args.media));
  VORTEX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(args.latents_path));
  VORTEX_ASSIGN_OR_RETURN(Tensor audio, latents_named(file, args.latents_path, "audio_latents"));
  Tensor video;
  if (wants_picture(args.media)) {
    VORTEX_ASSIGN_OR_RETURN(video, latents_named(file, args.latents_path, "video_latents"));
  }
  VORTEX_ASSIGN_OR_RETURN(MediaDecoder decoder, MediaDecoder::load(args.media));
  return decoder.decode(video.defined() ? &video : nullptr, audio, args.latents_path);
}

}  // namespace

void add_decode_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<DecodeArgs>();
  CLI::App* cmd = app.add_subcommand("decode", "Decode latents from `vortex generate` to a WAV or an MP4");
  cmd->add_option("--latents", args->latents_path, "Latents file written by vortex generate")->required();
  add_vae_options(cmd, args->media);
  cmd->add_option("--weights-seed", args->media.weights_seed, "Seed of the synthetic VAEs")->capture_default_str();
  cmd->add_option("--device", args->media.device,
                  "Where the decoders run: cpu (fp32 reference) or cuda (video VAE bf16, audio VAE fp32)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--out", args->media.out, "Output: PATH.wav (soundtrack) or PATH.mp4 (picture and sound)")
      ->required();
  cmd->callback([args, &action] {
    action = [args] {
      Status st = run_decode(*args);
      return st.ok() ? 0 : report_error(st);
    };
  });
}

}  // namespace vortex::cli
