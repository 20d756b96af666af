// VideoVaeConfig: the H3 video autoencoder's hyper-parameters, with the field names of diffusers'
// `AutoencoderKLMiniMaxH3` config.json, and the decode-time tiling options.
//
// Only the decoder side is used here (the causal-conv encoder's fields are parsed and kept so that
// a config round-trips). The ViT decoder's width is heads · head_dim; its patch is the product of
// the encoder's spatial factors (16 in the release) by that of its temporal factors (4).
//
// Temporal geometry, derived from `clip_length` (17) and `token_drop` (3) the way the reference
// derives it: frame_pre_padding = (-clip_length) mod t_ratio (3), tokens_chunk_size =
// ceil(clip_length / t_ratio) (5), token_overlap = (-token_drop) mod tokens_chunk_size (2),
// frame_overlap = max(token_overlap · t_ratio - frame_pre_padding, 0) (5). 17n + 5 pixel frames
// ↔ 5n + 2 latent frames.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "vortex/status.h"

namespace vortex::vae {

struct VideoVaeConfig {
  int in_channels = 3;
  int out_channels = 3;
  int latent_channels = 24;
  std::vector<int> block_out_channels = {128, 256, 256, 512, 512, 1024};
  int layers_per_block = 2;
  std::vector<int> spatial_downsample_factors = {2, 2, 2, 2, 1, 1};
  std::vector<int> temporal_downsample_factors = {1, 2, 2, 1, 1, 1};
  int norm_num_groups = 32;
  float norm_eps = 1e-6f;
  std::string spatial_padding_mode = "reflect";
  int decoder_num_layers = 36;
  int decoder_num_attention_heads = 32;
  int decoder_attention_head_dim = 64;
  int decoder_num_register_tokens = 4;
  int decoder_ffn_mult = 4;
  float decoder_rope_theta = 100.0f;
  float decoder_rope_dim_ratio = 0.75f;
  float decoder_norm_eps = 1e-5f;
  int clip_length = 17;
  int token_drop = 3;
  // Per-channel latent statistics; the pipeline decodes `latents * std + mean` (fp32).
  std::vector<float> latents_mean;
  std::vector<float> latents_std;

  int spatial_ratio() const;   // the decoder's patch_size
  int temporal_ratio() const;  // the decoder's patch_size_t
  int decoder_dim() const { return decoder_num_attention_heads * decoder_attention_head_dim; }
  int decoder_ffn_dim() const { return decoder_dim() * decoder_ffn_mult; }
  // int(head_dim · rope_dim_ratio): the rotated channels of every head; a multiple of 6.
  int rope_dim() const;
  // proj_out's width: out_channels · patch_t · patch².
  int patch_values() const { return out_channels * temporal_ratio() * spatial_ratio() * spatial_ratio(); }
  int frame_pre_padding() const;
  int tokens_chunk_size() const;
  int token_overlap() const;
  int frame_overlap() const;
  // Pixel frames decoded from `latent_frames` latents, or -1 when the count is not one the
  // reference decodes without padding (5n + 2, n >= 1, in the release).
  int64_t decoded_frames(int64_t latent_frames) const;

  Status validate() const;
  nlohmann::json to_json() const;
  bool operator==(const VideoVaeConfig&) const = default;
};

// Spatial tiling of the decode, in pixels (the reference's tile_sample_min_*; on by default,
// because the released frames are the blended-tile ones).
struct VideoTiling {
  bool enabled = true;
  int tile_height = 256;
  int tile_width = 256;
  int min_overlap_height = 64;
  int min_overlap_width = 64;
};

// When enabled: 0 < overlap < tile on both axes, and both multiples of the spatial ratio (tiles
// are cut from the latents, so their edges must fall on latent cells).
Status validate_tiling(const VideoTiling& tiling, int spatial_ratio);

// The original (pre-diffusers) checkpoint's video VAE is described by two files:
//   video_vae/config.json, the wrapper: latents_mean / latents_std (required), the temporal
//     geometry (vae_clip_length, vae_token_drop), the decode tiling (vae_tile_size,
//     vae_tile_overlap_min in pixels, vae_decoder_tiling on/off), latent_channels (cross-checked),
//     and where the source model lives (source_path, source_safetensors_path);
//   video_vae/<source_path>/config.json, the source model's constructor arguments under their
//     original names: out_ch, z_channels / embed_dim (must agree), ch x ch_mult, num_res_blocks,
//     space_down, time_down, padding_mode and vit_decoder_kwargs {num_layers, heads, dim_head,
//     rope_theta, rope_dim_ratio}.
// Settings the ViT decoder implements one way only (use_vit_decoder true, causal_decoder false,
// shift_factor 0, scaling_factor 1, pixel_norm_type "imagenet", and in vit_decoder_kwargs
// norm_type / qk_norm_type "rms_norm", norm_affine true, qk_norm_affine false, ffn_activation_fn
// "silu", ffn_use_gated true) are accepted at that value and refused at any other. Settings that
// only shape the encoder, the CNN decoder the ViT decoder replaces, or how the reference spreads
// tiles over GPUs are accepted and ignored. Any other key is refused: the error names the file and
// the field.
struct OriginalVideoVaeConfig {
  VideoVaeConfig config;
  VideoTiling tiling;
  std::string source_path;              // the source model's folder, relative to the wrapper's
  std::string source_safetensors_path;  // its weights file, relative to source_path
};

// The wrapper is recognised by its source_path key, the source config by vit_decoder_kwargs.
bool is_original_video_vae_wrapper(const nlohmann::json& json);
bool is_original_video_vae_source(const nlohmann::json& json);

// `wrapper_name` / `source_name` (the files' paths) prefix the errors.
Result<OriginalVideoVaeConfig> video_vae_config_from_original(const nlohmann::json& wrapper,
                                                              const nlohmann::json& source,
                                                              const std::string& wrapper_name = "config.json",
                                                              const std::string& source_name = "source/config.json");

// Parses a diffusers config.json object. Unknown keys are ignored; absent keys keep the defaults
// (latent statistics default to 0 / 1); a wrong type or violated constraint names the field, and a
// `_class_name` other than AutoencoderKLMiniMaxH3 is refused.
Result<VideoVaeConfig> video_vae_config_from_json(const nlohmann::json& json);
Result<VideoVaeConfig> video_vae_config_from_json_string(const std::string& text);

// "h3" (the release; statistics 0 / 1 until a config.json provides them) and "test" (the
// conversion script's MINIMAX_H3_TEST_VIDEO_VAE_CONFIG: 4 layers, 4 heads × 32, patch 4 × 4).
Result<VideoVaeConfig> video_vae_config_preset(const std::string& name);
std::vector<std::string> video_vae_config_preset_names();

}  // namespace vortex::vae
