// The original checkpoint's video VAE configs (the wrapper and the source model's) mapped onto
// VideoVaeConfig and VideoTiling. The rules are in video_vae_config.h; the names follow
// scripts/convert_minimax_h3_to_diffusers.py (MINIMAX_H3_VIDEO_VAE_CONFIG's comments and
// convert_video_vae), which reads the same two files.
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "models/vae/config_fields.h"
#include "models/vae/video_vae_config.h"

namespace vortex::vae {

namespace {

const ConfigFields kFields("video VAE");
const ConfigFields kVit("video VAE", "vit_decoder_kwargs.");

Status read_wrapper(const nlohmann::json& w, OriginalVideoVaeConfig& out, int& latent_channels) {
  if (!w.is_object()) return invalid_argument("video VAE config: not a JSON object");
  VORTEX_RETURN_IF_ERROR(kFields.only_known(
      w, {"latents_mean", "latents_std", "latent_channels", "vae_clip_length", "vae_token_drop", "vae_tile_size",
          "vae_tile_overlap_min", "vae_decoder_tiling", "source_path", "source_safetensors_path",
          // How the reference finds its model class: nothing to map.
          "auto_map", "source_class_name",
          // Encoder tiling, and how the reference spreads the same tiles over GPUs: the decoded
          // pixels do not depend on them (the diffusers conversion drops them all).
          "vae_encoder_tiling", "vae_encoder_parallel", "vae_decoder_parallel", "vae_parallel_tiling",
          "vae_chunk_dim"}));
  for (const char* key : {"latents_mean", "latents_std", "vae_clip_length", "vae_token_drop", "vae_tile_size",
                          "vae_tile_overlap_min", "source_path", "source_safetensors_path"}) {
    VORTEX_RETURN_IF_ERROR(kFields.require(w, key));
  }
  VideoVaeConfig& c = out.config;
  VORTEX_RETURN_IF_ERROR(kFields.read_int(w, "vae_clip_length", c.clip_length));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(w, "vae_token_drop", c.token_drop));
  if (c.clip_length <= 0) return invalid_argument(kFields.error("vae_clip_length", "must be positive"));
  if (c.token_drop < 0) return invalid_argument(kFields.error("vae_token_drop", "must not be negative"));
  VORTEX_RETURN_IF_ERROR(kFields.read_float_list(w, "latents_mean", c.latents_mean));
  VORTEX_RETURN_IF_ERROR(kFields.read_float_list(w, "latents_std", c.latents_std));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(w, "latent_channels", latent_channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_string(w, "source_path", out.source_path));
  VORTEX_RETURN_IF_ERROR(kFields.read_string(w, "source_safetensors_path", out.source_safetensors_path));

  int tile = 0, overlap = 0;
  VORTEX_RETURN_IF_ERROR(kFields.read_int(w, "vae_tile_size", tile));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(w, "vae_tile_overlap_min", overlap));
  out.tiling = {true, tile, tile, overlap, overlap};
  // Written as 0 / 1 by the reference's config, but a boolean means the same.
  if (auto it = w.find("vae_decoder_tiling"); it != w.end() && !it->is_null()) {
    if (it->is_boolean()) {
      out.tiling.enabled = it->get<bool>();
    } else if (it->is_number_integer()) {
      out.tiling.enabled = it->get<int64_t>() != 0;
    } else {
      return invalid_argument(kFields.error("vae_decoder_tiling", "must be 0, 1, true or false"));
    }
  }
  return ok_status();
}

Status read_vit_kwargs(const nlohmann::json& v, VideoVaeConfig& c) {
  if (!v.is_object()) return invalid_argument(kFields.error("vit_decoder_kwargs", "must be an object"));
  VORTEX_RETURN_IF_ERROR(kVit.only_known(v, {"num_layers", "heads", "dim_head", "rope_theta", "rope_dim_ratio",
                                             "norm_type", "norm_affine", "qk_norm_type", "qk_norm_affine",
                                             "ffn_activation_fn", "ffn_use_gated"}));
  // The reference module's own defaults for these are not the release's; absent, we cannot know.
  for (const char* key : {"num_layers", "heads", "dim_head", "rope_theta", "rope_dim_ratio"}) {
    VORTEX_RETURN_IF_ERROR(kVit.require(v, key));
  }
  VORTEX_RETURN_IF_ERROR(kVit.read_int(v, "num_layers", c.decoder_num_layers));
  VORTEX_RETURN_IF_ERROR(kVit.read_int(v, "heads", c.decoder_num_attention_heads));
  VORTEX_RETURN_IF_ERROR(kVit.read_int(v, "dim_head", c.decoder_attention_head_dim));
  VORTEX_RETURN_IF_ERROR(kVit.read_float(v, "rope_theta", c.decoder_rope_theta));
  VORTEX_RETURN_IF_ERROR(kVit.read_float(v, "rope_dim_ratio", c.decoder_rope_dim_ratio));
  const char* block = "the decoder's block has weight-only RMSNorms, unit q/k RMSNorms and a SwiGLU FFN";
  VORTEX_RETURN_IF_ERROR(kVit.expect_value(v, "norm_type", "rms_norm", block));
  VORTEX_RETURN_IF_ERROR(kVit.expect_value(v, "norm_affine", true, block));
  VORTEX_RETURN_IF_ERROR(kVit.expect_value(v, "qk_norm_type", "rms_norm", block));
  VORTEX_RETURN_IF_ERROR(kVit.expect_value(v, "qk_norm_affine", false, block));
  VORTEX_RETURN_IF_ERROR(kVit.expect_value(v, "ffn_activation_fn", "silu", block));
  return kVit.expect_value(v, "ffn_use_gated", true, block);
}

Status read_source(const nlohmann::json& s, VideoVaeConfig& c) {
  if (!s.is_object()) return invalid_argument("video VAE config: not a JSON object");
  VORTEX_RETURN_IF_ERROR(kFields.only_known(
      s, {"in_channels", "out_ch", "ch", "ch_mult", "z_channels", "embed_dim", "num_res_blocks", "space_down",
          "time_down", "padding_mode", "norm_num_groups", "norm_eps", "vit_decoder_kwargs",
          // One value in the release, the one the decoder implements (checked below).
          "use_vit_decoder", "causal_decoder", "shift_factor", "scaling_factor", "pixel_norm_type",
          // The causal-conv encoder's switches: nothing on the decode path reads them.
          "use_3d_conv", "causal_encoder", "use_t_isolated_gn", "zq_ch_encoder", "padding_mode_t",
          // The CNN decoder that use_vit_decoder replaces.
          "space_up", "time_up", "num_res_blocks_decoder", "zq_ch_decoder"}));
  for (const char* key : {"out_ch", "space_down", "time_down", "vit_decoder_kwargs"}) {
    VORTEX_RETURN_IF_ERROR(kFields.require(s, key));
  }
  VORTEX_RETURN_IF_ERROR(kFields.expect_value(s, "use_vit_decoder", true, "the ViT decoder is the one implemented"));
  VORTEX_RETURN_IF_ERROR(kFields.expect_value(s, "causal_decoder", false, "the ViT decoder attends both ways"));
  const char* stats = "latents are normalised by latents_mean / latents_std alone";
  VORTEX_RETURN_IF_ERROR(kFields.expect_value(s, "shift_factor", 0, stats));
  VORTEX_RETURN_IF_ERROR(kFields.expect_value(s, "scaling_factor", 1, stats));
  VORTEX_RETURN_IF_ERROR(
      kFields.expect_value(s, "pixel_norm_type", "imagenet", "frames are de-normalised with the ImageNet statistics"));

  VORTEX_RETURN_IF_ERROR(kFields.read_int(s, "in_channels", c.in_channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(s, "out_ch", c.out_channels));
  int z_channels = -1, embed_dim = -1;
  VORTEX_RETURN_IF_ERROR(kFields.read_int(s, "z_channels", z_channels));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(s, "embed_dim", embed_dim));
  if (z_channels < 0 && embed_dim < 0) return invalid_argument(kFields.error("z_channels", "is missing"));
  if (z_channels >= 0 && embed_dim >= 0 && z_channels != embed_dim) {
    return invalid_argument(kFields.error("z_channels", "(" + std::to_string(z_channels) + ") differs from embed_dim (" +
                                                          std::to_string(embed_dim) +
                                                          "); this decoder's post_quant_conv keeps the width"));
  }
  c.latent_channels = z_channels >= 0 ? z_channels : embed_dim;
  int ch = -1;
  std::vector<int> ch_mult;
  VORTEX_RETURN_IF_ERROR(kFields.read_int(s, "ch", ch));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(s, "ch_mult", ch_mult));
  if ((ch >= 0) != !ch_mult.empty()) {
    return invalid_argument(kFields.error(ch >= 0 ? "ch_mult" : "ch", "is missing (ch and ch_mult come together)"));
  }
  if (ch >= 0) {
    c.block_out_channels.clear();
    for (int m : ch_mult) c.block_out_channels.push_back(ch * m);
  }
  VORTEX_RETURN_IF_ERROR(kFields.read_int(s, "num_res_blocks", c.layers_per_block));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(s, "space_down", c.spatial_downsample_factors));
  VORTEX_RETURN_IF_ERROR(kFields.read_int_list(s, "time_down", c.temporal_downsample_factors));
  VORTEX_RETURN_IF_ERROR(kFields.read_string(s, "padding_mode", c.spatial_padding_mode));
  VORTEX_RETURN_IF_ERROR(kFields.read_int(s, "norm_num_groups", c.norm_num_groups));
  VORTEX_RETURN_IF_ERROR(kFields.read_float(s, "norm_eps", c.norm_eps));
  return read_vit_kwargs(s.at("vit_decoder_kwargs"), c);
}

// VideoVaeConfig::validate names the diffusers field; the user's file spells it otherwise.
std::string with_original_names(std::string message) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"'out_channels'", "'out_ch'"},
      {"'latent_channels'", "'z_channels'"},
      {"'decoder_num_layers'", "'vit_decoder_kwargs.num_layers'"},
      {"'decoder_num_attention_heads'", "'vit_decoder_kwargs.heads'"},
      {"'decoder_attention_head_dim'", "'vit_decoder_kwargs.dim_head'"},
      {"'decoder_rope_theta'", "'vit_decoder_kwargs.rope_theta'"},
      {"'decoder_rope_dim_ratio'", "'vit_decoder_kwargs.rope_dim_ratio'"},
      {"'spatial/temporal_downsample_factors'", "'space_down/time_down'"},
  };
  for (const auto& [ours, theirs] : kNames) {
    if (auto at = message.find(ours); at != std::string::npos) message.replace(at, std::string(ours).size(), theirs);
  }
  return message;
}

}  // namespace

bool is_original_video_vae_wrapper(const nlohmann::json& json) {
  return json.is_object() && json.contains("source_path");
}

bool is_original_video_vae_source(const nlohmann::json& json) {
  return json.is_object() && json.contains("vit_decoder_kwargs");
}

Result<OriginalVideoVaeConfig> video_vae_config_from_original(const nlohmann::json& wrapper,
                                                              const nlohmann::json& source,
                                                              const std::string& wrapper_name,
                                                              const std::string& source_name) {
  OriginalVideoVaeConfig out;
  int wrapper_channels = -1;
  Status st = read_wrapper(wrapper, out, wrapper_channels);
  if (!st.ok()) return st.with_context(wrapper_name);
  st = read_source(source, out.config);
  if (!st.ok()) return st.with_context(source_name);
  const VideoVaeConfig& c = out.config;
  if (wrapper_channels >= 0 && wrapper_channels != c.latent_channels) {
    const std::string what = std::to_string(wrapper_channels) + " differs from " + source_name + "'s z_channels " +
                             std::to_string(c.latent_channels);
    return invalid_argument(kFields.error("latent_channels", what)).with_context(wrapper_name);
  }
  for (const auto& [field, stats] : {std::pair{"latents_mean", &c.latents_mean}, std::pair{"latents_std", &c.latents_std}}) {
    if (stats->size() != static_cast<size_t>(c.latent_channels)) {
      return invalid_argument(kFields.error(field, "has " + std::to_string(stats->size()) + " entries, z_channels is " +
                                                       std::to_string(c.latent_channels)))
          .with_context(wrapper_name);
    }
  }
  st = c.validate();
  if (!st.ok()) return Status(st.code(), with_original_names(st.message())).with_context(source_name);
  st = validate_tiling(out.tiling, c.spatial_ratio());
  if (!st.ok()) return st.with_context(wrapper_name + ": vae_tile_size / vae_tile_overlap_min");
  return out;
}

}  // namespace vortex::vae
