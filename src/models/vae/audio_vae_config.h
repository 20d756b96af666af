// AudioVaeConfig: the H3 audio autoencoder's hyper-parameters, with the field names of diffusers'
// `AutoencoderKLMiniMaxH3Audio` config.json.
//
// The autoencoder is mono: stereo H3 audio is two batch items. The encoder hops
// prod(encoder_rates) samples per latent and the BigVGAN decoder upsamples by prod(decoder_rates);
// the two must agree (800 at 32 kHz, i.e. 40 latents per second, in the release).
//
// Sources: a diffusers config.json (the converted release), the original checkpoint's
// `audio_vae/metadata.json` + `audio_vae/config.json` pair (converted here the way diffusers'
// conversion script does), the `config` metadata key of a safetensors file, or a preset.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "vortex/status.h"

namespace vortex::vae {

struct AudioVaeConfig {
  int encoder_dim = 64;
  std::vector<int> encoder_rates = {2, 4, 4, 5, 5};
  int latent_dim = 2048;
  int latent_channels = 32;
  int num_attention_heads = 8;
  int decoder_dim = 1024;
  std::vector<int> decoder_rates = {5, 5, 2, 2, 2, 2, 2};
  std::vector<int> decoder_kernel_sizes = {9, 9, 4, 4, 4, 4, 4};
  std::vector<int> resblock_kernel_sizes = {3, 7, 11};
  std::vector<std::vector<int>> resblock_dilation_sizes = {{1, 3, 5}, {1, 3, 5}, {1, 3, 5}};
  int sampling_rate = 32000;
  // Per-channel latent statistics; the pipeline decodes `latents * std + mean`. Stored as the
  // reference uses them: fp32 (torch.tensor of the JSON list). Required in config.json (the
  // reference pipeline cannot decode without them); presets use 0 and 1.
  std::vector<float> latents_mean;
  std::vector<float> latents_std;

  int num_upsamples() const { return static_cast<int>(decoder_rates.size()); }
  int num_kernels() const { return static_cast<int>(resblock_kernel_sizes.size()); }
  // Samples per latent of the encoder (the hop).
  int64_t hop_length() const;
  // Input channels of decoder upsampler i; its output (and stage i's width) is stage_channels(i + 1).
  int stage_channels(int i) const { return decoder_dim >> i; }
  // Decoder output samples for `frames` latents: the transposed convolutions' length rule,
  // (L - 1) * rate - 2 * ((kernel - rate) / 2) + kernel per stage; frames * hop when every
  // kernel - rate is even (the release).
  int64_t decoded_samples(int64_t frames) const;

  Status validate() const;
  nlohmann::json to_json() const;
  std::string to_json_string() const;
  bool operator==(const AudioVaeConfig&) const = default;
};

// Parses a diffusers config.json object. Unknown keys are ignored; a wrong type or a violated
// constraint is an error naming the field.
Result<AudioVaeConfig> audio_vae_config_from_json(const nlohmann::json& json);
Result<AudioVaeConfig> audio_vae_config_from_json_string(const std::string& text);
Result<AudioVaeConfig> audio_vae_config_from_file(const std::string& path);

// The original checkpoint's pair: `metadata.json` ({"metadata": {"kwargs": {...}}}: the
// constructor arguments encoder_dim, encoder_rates, latent_dim, vae_latent_channels, decoder_dim,
// decoder_rates, sample_rate, decoder_type "bigvgan", attn_proj true, all required) and the wrapper
// `config.json` (latent_channels and sample_rate, cross-checked, and latents_mean / latents_std;
// auto_map and source_*_path only say where the reference finds its files). Kernel sizes follow the
// rule of the reference's tables (2r for even rate r, 2r - 1 for odd); heads and the AMP tables are
// the reference's fixed values. Any other kwarg or wrapper key is refused: the error names the file
// (`metadata_name` / `wrapper_name`) and the field.
Result<AudioVaeConfig> audio_vae_config_from_original(const nlohmann::json& metadata, const nlohmann::json& config,
                                                      const std::string& metadata_name = "metadata.json",
                                                      const std::string& wrapper_name = "config.json");

// The original wrapper config.json is recognised by the original `sample_rate` spelling (diffusers
// writes `sampling_rate`) or its source_*_path keys, without a `_class_name`.
bool is_original_audio_vae_wrapper(const nlohmann::json& json);

// "h3" (the release; latent statistics 0 / 1 until a config.json provides the real ones),
// "test" (diffusers' unit-test config) and "small" (the golden config: the release's structure,
// rate-5 and rate-2 stages, three AMP kernels with dilations 1/3/5, 32 latent channels).
Result<AudioVaeConfig> audio_vae_config_preset(const std::string& name);
std::vector<std::string> audio_vae_config_preset_names();

}  // namespace vortex::vae
