#include "models/vae/audio_vae_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "models/vae/config_fields.h"

namespace vortex::vae {

namespace {

const ConfigFields kFields("audio VAE");
// The reference pipeline indexes the latent statistics unconditionally.
constexpr const char* kStatisticsRequired = "missing: the H3 pipeline de-normalises latents with it";

int64_t product(const std::vector<int>& v) {
  int64_t p = 1;
  for (int x : v) p *= x;
  return p;
}

Status all_positive(const char* field, const std::vector<int>& v) {
  if (v.empty()) return invalid_argument(kFields.error(field, "must not be empty"));
  for (int x : v) {
    if (x <= 0) return invalid_argument(kFields.error(field, "must hold positive integers"));
  }
  return ok_status();
}

void fill_identity_statistics(AudioVaeConfig& c) {
  c.latents_mean.assign(c.latent_channels, 0.0f);
  c.latents_std.assign(c.latent_channels, 1.0f);
}

}  // namespace

int64_t AudioVaeConfig::hop_length() const { return product(encoder_rates); }

int64_t AudioVaeConfig::decoded_samples(int64_t frames) const {
  int64_t length = frames;
  for (size_t i = 0; i < decoder_rates.size() && i < decoder_kernel_sizes.size(); ++i) {
    const int64_t r = decoder_rates[i], k = decoder_kernel_sizes[i];
    length = (length - 1) * r - 2 * ((k - r) / 2) + k;
  }
  return length;
}

Status AudioVaeConfig::validate() const {
  auto positive = [](const char* field, int v) -> Status {
    if (v <= 0) return invalid_argument(kFields.error(field, "must be positive"));
    return ok_status();
  };
  VORTEX_RETURN_IF_ERROR(positive("encoder_dim", encoder_dim));
  VORTEX_RETURN_IF_ERROR(positive("latent_dim", latent_dim));
  VORTEX_RETURN_IF_ERROR(positive("latent_channels", latent_channels));
  VORTEX_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  VORTEX_RETURN_IF_ERROR(positive("decoder_dim", decoder_dim));
  VORTEX_RETURN_IF_ERROR(positive("sampling_rate", sampling_rate));
  VORTEX_RETURN_IF_ERROR(all_positive("encoder_rates", encoder_rates));
  VORTEX_RETURN_IF_ERROR(all_positive("decoder_rates", decoder_rates));
  VORTEX_RETURN_IF_ERROR(all_positive("decoder_kernel_sizes", decoder_kernel_sizes));
  VORTEX_RETURN_IF_ERROR(all_positive("resblock_kernel_sizes", resblock_kernel_sizes));
  if (product(decoder_rates) != hop_length()) {
    return invalid_argument(kFields.error("decoder_rates", "must upsample by the encoder hop length " +
                                                             std::to_string(hop_length()) + ", got " +
                                                             std::to_string(product(decoder_rates))));
  }
  if (latent_dim % latent_channels != 0) {
    return invalid_argument(kFields.error("latent_dim", "(" + std::to_string(latent_dim) +
                                                          ") must be a multiple of latent_channels (" +
                                                          std::to_string(latent_channels) + ")"));
  }
  if (latent_dim % num_attention_heads != 0) {
    return invalid_argument(kFields.error("num_attention_heads", "must divide latent_dim"));
  }
  if (decoder_kernel_sizes.size() != decoder_rates.size()) {
    return invalid_argument(kFields.error("decoder_kernel_sizes", "must have one entry per decoder rate"));
  }
  for (size_t i = 0; i < decoder_rates.size(); ++i) {
    if (decoder_kernel_sizes[i] < decoder_rates[i]) {
      return invalid_argument(kFields.error("decoder_kernel_sizes", "must not be smaller than the decoder rate"));
    }
  }
  if ((decoder_dim >> num_upsamples()) < 1) {
    return invalid_argument(
        kFields.error("decoder_dim", "is too small to be halved " + std::to_string(num_upsamples()) + " times"));
  }
  if (resblock_dilation_sizes.size() != resblock_kernel_sizes.size()) {
    return invalid_argument(kFields.error("resblock_dilation_sizes", "must have one row per resblock kernel size"));
  }
  for (int k : resblock_kernel_sizes) {
    // An even kernel's padding (k*d - d)/2 shortens the signal and the residual add has no shape.
    if (k % 2 == 0) return invalid_argument(kFields.error("resblock_kernel_sizes", "must be odd"));
  }
  for (const auto& row : resblock_dilation_sizes) VORTEX_RETURN_IF_ERROR(all_positive("resblock_dilation_sizes", row));
  const auto stats_ok = [&](const char* field, const std::vector<float>& v) -> Status {
    if (static_cast<int>(v.size()) != latent_channels) {
      return invalid_argument(kFields.error(field, "has " + std::to_string(v.size()) + " entries, latent_channels is " +
                                                     std::to_string(latent_channels)));
    }
    for (float x : v) {
      if (!std::isfinite(x)) return invalid_argument(kFields.error(field, "must hold finite numbers"));
    }
    return ok_status();
  };
  VORTEX_RETURN_IF_ERROR(stats_ok("latents_mean", latents_mean));
  VORTEX_RETURN_IF_ERROR(stats_ok("latents_std", latents_std));
  return ok_status();
}

nlohmann::json AudioVaeConfig::to_json() const {
  return nlohmann::json{
      {"_class_name", "AutoencoderKLMiniMaxH3Audio"},
      {"encoder_dim", encoder_dim},
      {"encoder_rates", encoder_rates},
      {"latent_dim", latent_dim},
      {"latent_channels", latent_channels},
      {"num_attention_heads", num_attention_heads},
      {"decoder_dim", decoder_dim},
      {"decoder_rates", decoder_rates},
      {"decoder_kernel_sizes", decoder_kernel_sizes},
      {"resblock_kernel_sizes", resblock_kernel_sizes},
      {"resblock_dilation_sizes", resblock_dilation_sizes},
      {"sampling_rate", sampling_rate},
      {"latents_mean", latents_mean},
      {"latents_std", latents_std},
  };
}

std::string AudioVaeConfig::to_json_string() const { return to_json().dump(); }

Result<AudioVaeConfig> audio_vae_config_from_json(const nlohmann::json& json) {
  if (!json.is_object()) return invalid_argument("audio VAE config must be a JSON object");
  if (auto it = json.find("_class_name");
      it != json.end() && it->is_string() && it->get<std::string>() != "AutoencoderKLMiniMaxH3Audio") {
    return invalid_argument("audio VAE config field '_class_name' is '" + it->get<std::string>() +
                            "', not AutoencoderKLMiniMaxH3Audio");
  }
  AudioVaeConfig c;
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "encoder_dim", c.encoder_dim));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(json, "encoder_rates", c.encoder_rates));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "latent_dim", c.latent_dim));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "latent_channels", c.latent_channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "num_attention_heads", c.num_attention_heads));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "decoder_dim", c.decoder_dim));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(json, "decoder_rates", c.decoder_rates));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(json, "decoder_kernel_sizes", c.decoder_kernel_sizes));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(json, "resblock_kernel_sizes", c.resblock_kernel_sizes));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_table(json, "resblock_dilation_sizes", c.resblock_dilation_sizes));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "sampling_rate", c.sampling_rate));
  VORTEX_RETURN_IF_ERROR(kFields.read_float_list(json, "latents_mean", c.latents_mean, kStatisticsRequired));
  VORTEX_RETURN_IF_ERROR(kFields.read_float_list(json, "latents_std", c.latents_std, kStatisticsRequired));
  VORTEX_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<AudioVaeConfig> audio_vae_config_from_json_string(const std::string& text) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument("audio VAE config is not valid JSON");
  return audio_vae_config_from_json(json);
}

Result<AudioVaeConfig> audio_vae_config_from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open config");
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto config = audio_vae_config_from_json_string(buffer.str());
  if (!config.ok()) return config.status().with_context(path);
  return config;
}

bool is_original_audio_vae_wrapper(const nlohmann::json& json) {
  if (!json.is_object() || json.contains("_class_name")) return false;
  return json.contains("sample_rate") || json.contains("source_metadata_path") ||
         json.contains("source_safetensors_path");
}

namespace {

const ConfigFields kKwargs("audio VAE", "metadata.kwargs.");

Status read_original_kwargs(const nlohmann::json& metadata, AudioVaeConfig& c) {
  const nlohmann::json* kwargs = nullptr;
  if (metadata.is_object()) {
    auto m = metadata.find("metadata");
    if (m != metadata.end() && m->is_object()) {
      auto k = m->find("kwargs");
      if (k != m->end() && k->is_object()) kwargs = &*k;
    }
  }
  if (kwargs == nullptr) return invalid_argument("audio VAE metadata has no 'metadata.kwargs' object");
  // The constructor arguments the conversion script reads; any other one would configure a
  // decoder the converted checkpoint does not describe.
  VORTEX_RETURN_IF_ERROR(kKwargs.only_known(*kwargs, {"encoder_dim", "encoder_rates", "latent_dim",
                                                      "vae_latent_channels", "decoder_dim", "decoder_rates",
                                                      "sample_rate", "decoder_type", "attn_proj"}));
  for (const char* key : {"encoder_dim", "encoder_rates", "latent_dim", "vae_latent_channels", "decoder_dim",
                          "decoder_rates", "sample_rate", "decoder_type", "attn_proj"}) {
    VORTEX_RETURN_IF_ERROR(kKwargs.require(*kwargs, key));
  }
  VORTEX_RETURN_IF_ERROR(kKwargs.expect_value(*kwargs, "decoder_type", "bigvgan", "the BigVGAN decoder"));
  VORTEX_RETURN_IF_ERROR(kKwargs.expect_value(*kwargs, "attn_proj", true, "the causal-attention latent projection"));
  VORTEX_RETURN_IF_ERROR(kKwargs.read_int(*kwargs, "encoder_dim", c.encoder_dim));
  VORTEX_RETURN_IF_ERROR(kKwargs.read_int_list(*kwargs, "encoder_rates", c.encoder_rates));
  VORTEX_RETURN_IF_ERROR(kKwargs.read_int(*kwargs, "latent_dim", c.latent_dim));
  VORTEX_RETURN_IF_ERROR(kKwargs.read_int(*kwargs, "vae_latent_channels", c.latent_channels));
  VORTEX_RETURN_IF_ERROR(kKwargs.read_int(*kwargs, "decoder_dim", c.decoder_dim));
  VORTEX_RETURN_IF_ERROR(kKwargs.read_int_list(*kwargs, "decoder_rates", c.decoder_rates));
  VORTEX_RETURN_IF_ERROR(kKwargs.read_int(*kwargs, "sample_rate", c.sampling_rate));
  // The reference's BigVGAN tables pair rate r with kernel 2r for even r and 2r - 1 for odd r.
  c.decoder_kernel_sizes.clear();
  for (int r : c.decoder_rates) c.decoder_kernel_sizes.push_back(2 * r - (r % 2));
  return ok_status();
}

Status read_original_wrapper(const nlohmann::json& wrapper, AudioVaeConfig& c) {
  if (!wrapper.is_object()) return invalid_argument("audio VAE config must be a JSON object");
  VORTEX_RETURN_IF_ERROR(kFields.only_known(wrapper, {"latent_channels", "sample_rate", "latents_mean", "latents_std",
                                                      // Where the reference finds its model: no decoder setting.
                                                      "auto_map", "source_config_path", "source_metadata_path",
                                                      "source_safetensors_path"}));
  VORTEX_RETURN_IF_ERROR(kFields.require(wrapper, "latent_channels"));
  VORTEX_RETURN_IF_ERROR(kFields.require(wrapper, "sample_rate"));
  int channels = -1, rate = -1;
  VORTEX_RETURN_IF_ERROR(kFields.read_int(wrapper, "latent_channels", channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(wrapper, "sample_rate", rate));
  if (channels != c.latent_channels) {
    return invalid_argument("audio VAE latent width disagreement: metadata.json says " +
                            std::to_string(c.latent_channels) + ", config.json says " + std::to_string(channels));
  }
  if (rate != c.sampling_rate) {
    return invalid_argument("audio VAE sample rate disagreement: metadata.json says " +
                            std::to_string(c.sampling_rate) + ", config.json says " + std::to_string(rate));
  }
  VORTEX_RETURN_IF_ERROR(kFields.read_float_list(wrapper, "latents_mean", c.latents_mean, kStatisticsRequired));
  return kFields.read_float_list(wrapper, "latents_std", c.latents_std, kStatisticsRequired);
}

}  // namespace

Result<AudioVaeConfig> audio_vae_config_from_original(const nlohmann::json& metadata, const nlohmann::json& wrapper,
                                                      const std::string& metadata_name,
                                                      const std::string& wrapper_name) {
  AudioVaeConfig c;  // heads, AMP kernels and dilations: the reference's fixed values (the defaults)
  Status st = read_original_kwargs(metadata, c);
  if (!st.ok()) return st.with_context(metadata_name);
  st = read_original_wrapper(wrapper, c);
  if (!st.ok()) return st.with_context(wrapper_name);
  // The architecture is the metadata's, the statistics the wrapper's; name both.
  st = c.validate();
  if (!st.ok()) return st.with_context(metadata_name + " + " + wrapper_name);
  return c;
}

Result<AudioVaeConfig> audio_vae_config_preset(const std::string& name) {
  AudioVaeConfig c;  // defaults are the release
  if (name == "h3") {
    fill_identity_statistics(c);
    return c;
  }
  if (name == "test") {
    c.encoder_dim = 4;
    c.encoder_rates = {2, 2};
    c.latent_dim = 32;
    c.latent_channels = 8;
    c.num_attention_heads = 2;
    c.decoder_dim = 16;
    c.decoder_rates = {2, 2};
    c.decoder_kernel_sizes = {4, 4};
    c.resblock_kernel_sizes = {3, 7};
    c.resblock_dilation_sizes = {{1, 3}, {1, 3}};
    fill_identity_statistics(c);
    return c;
  }
  if (name == "small") {
    c.encoder_dim = 4;
    c.encoder_rates = {5, 2, 2};
    c.latent_dim = 64;
    c.latent_channels = 32;
    c.num_attention_heads = 2;
    c.decoder_dim = 32;
    c.decoder_rates = {5, 2, 2};
    c.decoder_kernel_sizes = {9, 4, 4};
    fill_identity_statistics(c);
    return c;
  }
  return invalid_argument("unknown audio VAE preset '" + name + "' (known: h3, test, small)");
}

std::vector<std::string> audio_vae_config_preset_names() { return {"h3", "test", "small"}; }

}  // namespace vortex::vae
