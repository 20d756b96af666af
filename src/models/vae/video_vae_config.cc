#include "models/vae/video_vae_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "models/vae/config_fields.h"

namespace vortex::vae {

namespace {

const ConfigFields kFields("video VAE");

int product(const std::vector<int>& v) {
  int p = 1;
  for (int x : v) p *= x;
  return p;
}

int positive_mod(int a, int m) { return ((a % m) + m) % m; }

void fill_identity_statistics(VideoVaeConfig& c) {
  c.latents_mean.assign(c.latent_channels, 0.0f);
  c.latents_std.assign(c.latent_channels, 1.0f);
}

}  // namespace

int VideoVaeConfig::spatial_ratio() const { return product(spatial_downsample_factors); }
int VideoVaeConfig::temporal_ratio() const { return product(temporal_downsample_factors); }
int VideoVaeConfig::rope_dim() const {
  return static_cast<int>(static_cast<double>(decoder_attention_head_dim) * static_cast<double>(decoder_rope_dim_ratio));
}
int VideoVaeConfig::frame_pre_padding() const { return positive_mod(-clip_length, temporal_ratio()); }
int VideoVaeConfig::tokens_chunk_size() const { return (clip_length + temporal_ratio() - 1) / temporal_ratio(); }
int VideoVaeConfig::token_overlap() const { return positive_mod(-token_drop, tokens_chunk_size()); }
int VideoVaeConfig::frame_overlap() const {
  return std::max(token_overlap() * temporal_ratio() - frame_pre_padding(), 0);
}

int64_t VideoVaeConfig::decoded_frames(int64_t latent_frames) const {
  const int64_t chunk = tokens_chunk_size();
  const int64_t tokens = latent_frames + token_drop;
  if (latent_frames <= 0 || tokens % chunk != 0) return -1;
  const int64_t chunks = tokens / chunk - (token_drop > 0 ? 1 : 0);
  if (chunks < 1) return -1;
  const int64_t per_chunk = int64_t(chunk) * temporal_ratio() - frame_pre_padding();
  // With token_drop, the last chunk's tail (token_overlap latents) is kept as a final overlap.
  const int64_t tail = token_drop > 0 ? int64_t(token_overlap()) * temporal_ratio() - frame_pre_padding() : 0;
  return chunks * per_chunk + std::max<int64_t>(tail, 0);
}

Status VideoVaeConfig::validate() const {
  auto positive = [](const char* field, int v) -> Status {
    if (v <= 0) return invalid_argument(kFields.error(field, "must be positive"));
    return ok_status();
  };
  VORTEX_RETURN_IF_ERROR(positive("out_channels", out_channels));
  VORTEX_RETURN_IF_ERROR(positive("latent_channels", latent_channels));
  VORTEX_RETURN_IF_ERROR(positive("decoder_num_layers", decoder_num_layers));
  VORTEX_RETURN_IF_ERROR(positive("decoder_num_attention_heads", decoder_num_attention_heads));
  VORTEX_RETURN_IF_ERROR(positive("decoder_attention_head_dim", decoder_attention_head_dim));
  VORTEX_RETURN_IF_ERROR(positive("decoder_ffn_mult", decoder_ffn_mult));
  VORTEX_RETURN_IF_ERROR(positive("clip_length", clip_length));
  if (decoder_num_register_tokens < 0) {
    return invalid_argument(kFields.error("decoder_num_register_tokens", "must not be negative"));
  }
  if (token_drop < 0) return invalid_argument(kFields.error("token_drop", "must not be negative"));
  for (const auto* list : {&spatial_downsample_factors, &temporal_downsample_factors}) {
    if (list->empty()) return invalid_argument(kFields.error("spatial/temporal_downsample_factors", "must not be empty"));
    for (int x : *list) {
      if (x <= 0) return invalid_argument(kFields.error("spatial/temporal_downsample_factors", "must be positive"));
    }
  }
  const int r = rope_dim();
  if (r < 0 || r % 6 != 0 || r > decoder_attention_head_dim) {
    return invalid_argument(kFields.error("decoder_rope_dim_ratio", "must give a rotary width (head_dim · ratio = " +
                                                                     std::to_string(r) +
                                                                     ") that is a multiple of 6 within the head"));
  }
  if (!(decoder_rope_theta > 0.0f)) return invalid_argument(kFields.error("decoder_rope_theta", "must be positive"));
  if (!(decoder_norm_eps > 0.0f)) return invalid_argument(kFields.error("decoder_norm_eps", "must be positive"));
  if (latents_mean.size() != static_cast<size_t>(latent_channels)) {
    return invalid_argument(kFields.error("latents_mean", "must have latent_channels (" +
                                                            std::to_string(latent_channels) + ") entries"));
  }
  if (latents_std.size() != static_cast<size_t>(latent_channels)) {
    return invalid_argument(kFields.error("latents_std", "must have latent_channels (" +
                                                           std::to_string(latent_channels) + ") entries"));
  }
  return ok_status();
}

nlohmann::json VideoVaeConfig::to_json() const {
  nlohmann::json j;
  j["_class_name"] = "AutoencoderKLMiniMaxH3";
  j["in_channels"] = in_channels;
  j["out_channels"] = out_channels;
  j["latent_channels"] = latent_channels;
  j["block_out_channels"] = block_out_channels;
  j["layers_per_block"] = layers_per_block;
  j["spatial_downsample_factors"] = spatial_downsample_factors;
  j["temporal_downsample_factors"] = temporal_downsample_factors;
  j["norm_num_groups"] = norm_num_groups;
  j["norm_eps"] = norm_eps;
  j["spatial_padding_mode"] = spatial_padding_mode;
  j["decoder_num_layers"] = decoder_num_layers;
  j["decoder_num_attention_heads"] = decoder_num_attention_heads;
  j["decoder_attention_head_dim"] = decoder_attention_head_dim;
  j["decoder_num_register_tokens"] = decoder_num_register_tokens;
  j["decoder_ffn_mult"] = decoder_ffn_mult;
  j["decoder_rope_theta"] = decoder_rope_theta;
  j["decoder_rope_dim_ratio"] = decoder_rope_dim_ratio;
  j["decoder_norm_eps"] = decoder_norm_eps;
  j["clip_length"] = clip_length;
  j["token_drop"] = token_drop;
  j["latents_mean"] = latents_mean;
  j["latents_std"] = latents_std;
  return j;
}

Status validate_tiling(const VideoTiling& t, int spatial_ratio) {
  if (!t.enabled) return ok_status();
  const auto axis = [&](const char* name, int tile, int overlap) -> Status {
    if (tile <= 0 || overlap <= 0 || overlap >= tile) {
      return invalid_argument(std::string("video tiling: ") + name + " tile " + std::to_string(tile) +
                              " px with overlap " + std::to_string(overlap) + " px (need 0 < overlap < tile)");
    }
    if (tile % spatial_ratio != 0 || overlap % spatial_ratio != 0) {
      return invalid_argument(std::string("video tiling: ") + name + " tile " + std::to_string(tile) +
                              " px and overlap " + std::to_string(overlap) + " px must be multiples of the " +
                              "spatial ratio " + std::to_string(spatial_ratio));
    }
    return ok_status();
  };
  VORTEX_RETURN_IF_ERROR(axis("height", t.tile_height, t.min_overlap_height));
  return axis("width", t.tile_width, t.min_overlap_width);
}

Result<VideoVaeConfig> video_vae_config_from_json(const nlohmann::json& json) {
  if (!json.is_object()) return invalid_argument("video VAE config: not a JSON object");
  if (auto it = json.find("_class_name");
      it != json.end() && it->is_string() && it->get<std::string>() != "AutoencoderKLMiniMaxH3") {
    return invalid_argument("video VAE config field '_class_name' is '" + it->get<std::string>() +
                            "', not AutoencoderKLMiniMaxH3");
  }
  VideoVaeConfig c;
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "in_channels", c.in_channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "out_channels", c.out_channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "latent_channels", c.latent_channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(json, "block_out_channels", c.block_out_channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "layers_per_block", c.layers_per_block));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(json, "spatial_downsample_factors", c.spatial_downsample_factors));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(json, "temporal_downsample_factors", c.temporal_downsample_factors));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "norm_num_groups", c.norm_num_groups));
  VORTEX_RETURN_IF_ERROR(kFields.read_float(json, "norm_eps", c.norm_eps));
  VORTEX_RETURN_IF_ERROR(kFields.read_string(json, "spatial_padding_mode", c.spatial_padding_mode));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "decoder_num_layers", c.decoder_num_layers));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "decoder_num_attention_heads", c.decoder_num_attention_heads));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "decoder_attention_head_dim", c.decoder_attention_head_dim));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "decoder_num_register_tokens", c.decoder_num_register_tokens));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "decoder_ffn_mult", c.decoder_ffn_mult));
  VORTEX_RETURN_IF_ERROR(kFields.read_float(json, "decoder_rope_theta", c.decoder_rope_theta));
  VORTEX_RETURN_IF_ERROR(kFields.read_float(json, "decoder_rope_dim_ratio", c.decoder_rope_dim_ratio));
  VORTEX_RETURN_IF_ERROR(kFields.read_float(json, "decoder_norm_eps", c.decoder_norm_eps));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "clip_length", c.clip_length));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(json, "token_drop", c.token_drop));
  fill_identity_statistics(c);
  VORTEX_RETURN_IF_ERROR(kFields.read_float_list(json, "latents_mean", c.latents_mean));
  VORTEX_RETURN_IF_ERROR(kFields.read_float_list(json, "latents_std", c.latents_std));
  VORTEX_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<VideoVaeConfig> video_vae_config_from_json_string(const std::string& text) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument("video VAE config: not valid JSON");
  return video_vae_config_from_json(json);
}

Result<VideoVaeConfig> video_vae_config_preset(const std::string& name) {
  VideoVaeConfig c;
  if (name == "h3") {
    // The defaults are the release.
  } else if (name == "test") {
    c.block_out_channels = {32, 64};
    c.layers_per_block = 1;
    c.spatial_downsample_factors = {2, 2};
    c.temporal_downsample_factors = {2, 2};
    c.decoder_num_layers = 4;
    c.decoder_num_attention_heads = 4;
    c.decoder_attention_head_dim = 32;
  } else if (name == "small") {
    // The release's geometry (16x spatial, 4x temporal: the latents of the H3 "small" preset's
    // requests, so keyframes encode to what the transformer takes) at widths a test can afford.
    c.block_out_channels = {32, 32, 32, 32, 32, 32};
    c.layers_per_block = 1;
    c.decoder_num_layers = 2;
    c.decoder_num_attention_heads = 2;
    c.decoder_attention_head_dim = 32;
  } else {
    return invalid_argument("unknown video VAE preset '" + name + "' (known: h3, test, small)");
  }
  fill_identity_statistics(c);
  VORTEX_RETURN_IF_ERROR(c.validate());
  return c;
}

std::vector<std::string> video_vae_config_preset_names() { return {"h3", "test", "small"}; }

}  // namespace vortex::vae
