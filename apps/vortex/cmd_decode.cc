// vortex decode: latents (as `vortex generate` writes them) to media: the soundtrack through the
// audio VAE to a WAV, or picture and sound through both VAEs to an H.264 + AAC MP4 (CPU decoders;
// the video VAE port is unit-tested but not yet checked against the reference, see README).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "formats/safetensors.h"
#include "media/wav.h"
#include "models/vae/audio_vae.h"
#include "models/vae/video_vae.h"
#if defined(VORTEX_HAVE_MEDIA)
#include "media/mp4.h"
#endif

namespace vortex::cli {

namespace {

struct DecodeArgs {
  std::string latents_path;
  std::string audio_vae_path;
  std::string synthetic_audio_vae;
  std::string video_vae_path;
  std::string synthetic_video_vae;
  uint64_t weights_seed = 0;
  std::string out;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<vae::AudioVae> load_audio(const DecodeArgs& args) {
  if (!args.audio_vae_path.empty()) return vae::load_audio_vae(args.audio_vae_path);
  VORTEX_ASSIGN_OR_RETURN(vae::AudioVaeConfig config, vae::audio_vae_config_preset(args.synthetic_audio_vae));
  return vae::assemble_audio_vae(vae::synthetic_audio_vae_tensors(config, args.weights_seed, false), config);
}

Result<vae::VideoVae> load_video(const DecodeArgs& args) {
  if (!args.video_vae_path.empty()) return vae::load_video_vae(args.video_vae_path);
  VORTEX_ASSIGN_OR_RETURN(vae::VideoVaeConfig config, vae::video_vae_config_preset(args.synthetic_video_vae));
  return vae::assemble_video_vae(vae::synthetic_video_vae_tensors(config, args.weights_seed), config);
}

Result<Tensor> latents_named(const SafetensorsFile& file, const std::string& path, const std::string& name) {
  if (!file.has(name)) return invalid_argument(path + ": no tensor '" + name + "' (written by vortex generate)");
  return file.get(name);
}

// The stereo soundtrack F32 [2, samples] and its sample rate.
Result<std::pair<Tensor, int>> decode_soundtrack(const DecodeArgs& args, const SafetensorsFile& file) {
  VORTEX_ASSIGN_OR_RETURN(Tensor latents, latents_named(file, args.latents_path, "audio_latents"));
  VORTEX_ASSIGN_OR_RETURN(vae::AudioVae audio_vae, load_audio(args));
  auto waveform = vae::decode_audio(audio_vae, latents);
  if (!waveform.ok()) return waveform.status().with_context(args.latents_path + ": 'audio_latents'");
  return std::pair<Tensor, int>{*waveform, audio_vae.config.sampling_rate};
}

int write_wav_output(const DecodeArgs& args, const SafetensorsFile& file) {
  auto sound = decode_soundtrack(args, file);
  if (!sound.ok()) return report_error(sound.status());
  const auto& [waveform, rate] = *sound;
  Status written = media::write_wav(args.out, waveform, rate);
  if (!written.ok()) return report_error(written);
  std::printf("wrote %s: %lld samples per channel at %d Hz (%.2f s)\n", args.out.c_str(),
              static_cast<long long>(waveform.size(1)), rate, static_cast<double>(waveform.size(1)) / rate);
  return 0;
}

int write_mp4_output(const DecodeArgs& args, const SafetensorsFile& file) {
#if defined(VORTEX_HAVE_MEDIA)
  if (args.video_vae_path.empty() && args.synthetic_video_vae.empty()) {
    return report_error(invalid_argument("--out " + args.out + ": an MP4 needs --video-vae or --synthetic-video-vae"));
  }
  auto latents = latents_named(file, args.latents_path, "video_latents");
  if (!latents.ok()) return report_error(latents.status());
  auto video_vae = load_video(args);
  if (!video_vae.ok()) return report_error(video_vae.status());
  auto frames = vae::decode_video(*video_vae, *latents);
  if (!frames.ok()) return report_error(frames.status().with_context(args.latents_path + ": 'video_latents'"));
  auto sound = decode_soundtrack(args, file);
  if (!sound.ok()) return report_error(sound.status());
  Status written = media::write_mp4(args.out, *frames, 24, &sound->first, sound->second);
  if (!written.ok()) return report_error(written);
  std::printf("wrote %s: %lld frames of %lldx%lld at 24 fps with a %d Hz stereo soundtrack\n", args.out.c_str(),
              static_cast<long long>(frames->size(1)), static_cast<long long>(frames->size(3)),
              static_cast<long long>(frames->size(2)), sound->second);
  return 0;
#else
  return report_error(unimplemented("--out " + args.out + ": this build has no MP4 writer (libav was not found)"));
#endif
}

int run_decode(const DecodeArgs& args) {
  const bool mp4 = ends_with(args.out, ".mp4");
  if (!mp4 && !ends_with(args.out, ".wav")) return report_error(invalid_argument("--out must end in .wav or .mp4"));
  auto file = SafetensorsFile::open(args.latents_path);
  if (!file.ok()) return report_error(file.status());
  return mp4 ? write_mp4_output(args, *file) : write_wav_output(args, *file);
}

}  // namespace

void add_decode_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<DecodeArgs>();
  CLI::App* cmd = app.add_subcommand("decode", "Decode latents from `vortex generate` to a WAV or an MP4");
  cmd->add_option("--latents", args->latents_path, "Latents file written by vortex generate")->required();
  auto* vae_path = cmd->add_option("--audio-vae", args->audio_vae_path, "Audio VAE checkpoint (file or folder)");
  auto* synthetic = cmd->add_option("--synthetic-audio-vae", args->synthetic_audio_vae,
                                    "Deterministic synthetic audio VAE of a preset (h3, test, small)");
  vae_path->excludes(synthetic);
  auto* video_path = cmd->add_option("--video-vae", args->video_vae_path, "Video VAE checkpoint (file or folder; MP4)");
  auto* video_synthetic = cmd->add_option("--synthetic-video-vae", args->synthetic_video_vae,
                                          "Deterministic synthetic video VAE of a preset (h3, test; MP4)");
  video_path->excludes(video_synthetic);
  cmd->add_option("--weights-seed", args->weights_seed, "Seed of the synthetic VAEs")->capture_default_str();
  cmd->add_option("--out", args->out, "Output: PATH.wav (soundtrack) or PATH.mp4 (picture and sound)")->required();
  cmd->callback([args, &action, vae_path, synthetic] {
    if (vae_path->count() == 0 && synthetic->count() == 0) {
      throw CLI::ValidationError("decode", "one of --audio-vae or --synthetic-audio-vae is required");
    }
    action = [args] { return run_decode(*args); };
  });
}

}  // namespace vortex::cli
