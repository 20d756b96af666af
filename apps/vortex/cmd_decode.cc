// vortex decode: latents (as `vortex generate` writes them) to media. The soundtrack decodes
// through the audio VAE to a WAV today; the MP4 needs the video VAE decoder, which is not built yet,
// and asking for it says so instead of writing half a file.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "formats/safetensors.h"
#include "media/wav.h"
#include "models/vae/audio_vae.h"

namespace vortex::cli {

namespace {

struct DecodeArgs {
  std::string latents_path;
  std::string audio_vae_path;
  std::string synthetic_audio_vae;
  uint64_t weights_seed = 0;
  std::string out;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<vae::AudioVae> load_vae(const DecodeArgs& args) {
  if (!args.audio_vae_path.empty()) return vae::load_audio_vae(args.audio_vae_path);
  VORTEX_ASSIGN_OR_RETURN(vae::AudioVaeConfig config, vae::audio_vae_config_preset(args.synthetic_audio_vae));
  return vae::assemble_audio_vae(vae::synthetic_audio_vae_tensors(config, args.weights_seed, false), config);
}

int run_decode(const DecodeArgs& args) {
  if (ends_with(args.out, ".mp4")) {
    return report_error(unimplemented("--out " + args.out +
                                      ": MP4 output needs the video VAE decoder, which this build does not have yet; "
                                      "write the soundtrack with --out PATH.wav"));
  }
  if (!ends_with(args.out, ".wav")) return report_error(invalid_argument("--out must end in .wav (or .mp4)"));
  auto file = SafetensorsFile::open(args.latents_path);
  if (!file.ok()) return report_error(file.status());
  if (!file->has("audio_latents")) {
    return report_error(invalid_argument(args.latents_path + ": no tensor 'audio_latents' (written by vortex generate)"));
  }
  auto latents = file->get("audio_latents");
  if (!latents.ok()) return report_error(latents.status());
  auto vae = load_vae(args);
  if (!vae.ok()) return report_error(vae.status());
  auto waveform = vae::decode_audio(*vae, *latents);
  if (!waveform.ok()) return report_error(waveform.status().with_context(args.latents_path + ": 'audio_latents'"));
  const int rate = vae->config.sampling_rate;
  Status written = media::write_wav(args.out, *waveform, rate);
  if (!written.ok()) return report_error(written);
  std::printf("decoded %s into %s: %lld samples per channel at %d Hz (%.2f s)\n", latents->describe().c_str(),
              args.out.c_str(), static_cast<long long>(waveform->size(1)), rate,
              static_cast<double>(waveform->size(1)) / rate);
  return 0;
}

}  // namespace

void add_decode_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<DecodeArgs>();
  CLI::App* cmd = app.add_subcommand("decode", "Decode latents from `vortex generate` to media (soundtrack: WAV)");
  cmd->add_option("--latents", args->latents_path, "Latents file written by vortex generate")->required();
  auto* vae_path = cmd->add_option("--audio-vae", args->audio_vae_path, "Audio VAE checkpoint (file or folder)");
  auto* synthetic = cmd->add_option("--synthetic-audio-vae", args->synthetic_audio_vae,
                                    "Deterministic synthetic audio VAE of a preset (h3, test, small)");
  vae_path->excludes(synthetic);
  cmd->add_option("--weights-seed", args->weights_seed, "Seed of the synthetic audio VAE")->capture_default_str();
  cmd->add_option("--out", args->out, "Output: PATH.wav (PATH.mp4 needs the video VAE: not yet)")->required();
  cmd->callback([args, &action, vae_path, synthetic] {
    if (vae_path->count() == 0 && synthetic->count() == 0) {
      throw CLI::ValidationError("decode", "one of --audio-vae or --synthetic-audio-vae is required");
    }
    action = [args] { return run_decode(*args); };
  });
}

}  // namespace vortex::cli
