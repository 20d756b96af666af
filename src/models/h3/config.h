// H3Config: the transformer's hyper-parameters, with the names of diffusers' config.json.
//
// Sources, in order of preference: a diffusers config.json beside the weights, the `config`
// key of the safetensors metadata (written by vortex and by tools/golden), a named preset, or
// inference from tensor shapes (which cannot see eps / theta and takes those from the preset).
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "vortex/status.h"

namespace vortex::h3 {

// Modality tags index the AdaLN table; the values are a checkpoint contract.
constexpr int kVideoTag = 0;
constexpr int kTextTag = 1;
constexpr int kAudioTag = 2;
constexpr int kNumModalities = 3;

struct H3Config {
  int num_attention_heads = 56;
  int attention_head_dim = 128;
  int hidden_size = 5376;
  int num_layers = 50;
  int num_refiner_layers = 2;
  int ffn_dim = 14336;
  int in_channels = 24;
  int audio_in_channels = 32;
  std::array<int, 3> patch_size = {1, 2, 2};
  int text_dim = 5120;
  int freq_dim = 256;
  int time_embed_hidden_dim = 5376;
  int time_embed_dim = 2688;
  int rope_freq_dim = 16;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double qk_norm_eps = 1e-5;
  double final_norm_eps = 1e-5;

  int inner_dim() const { return num_attention_heads * attention_head_dim; }
  int video_patch_dim() const { return in_channels * patch_size[0] * patch_size[1] * patch_size[2]; }
  // Channels of each head that RoPE rotates: three axes, `rope_freq_dim` angles each, doubled.
  int rotary_dim() const { return 6 * rope_freq_dim; }
  int64_t parameter_count() const;

  Status validate() const;
  nlohmann::json to_json() const;
  std::string to_json_string() const;
  bool operator==(const H3Config&) const = default;
};

// The fp8 recipe's out projection scales its input per 128 tokens × 128 channels (one attention
// head of 128; cpu/fp8_blocks.h), so it needs the inner dim to be a multiple of 128.
// invalid_argument names it.
Status check_fp8_attention_width(const H3Config& config);

// The RoPE frequencies theta^(-2i / 2F) for i < F = rope_freq_dim, in fp32 as the reference computes
// them: the tables of both programs and the original layout's `rope.inv_freq` (core/portable_math.h's
// pow, so the bits do not follow the host's C library).
std::vector<float> rope_inverse_frequencies(const H3Config& config);

// Parses a diffusers config.json object; unknown keys are ignored, wrong types are errors naming
// the field.
Result<H3Config> config_from_json(const nlohmann::json& json);
Result<H3Config> config_from_json_string(const std::string& text);
Result<H3Config> config_from_file(const std::string& path);

// "h3" (the released checkpoint), "test" (diffusers' unit-test config), "small" (the 3-block golden
// config) and "mid" (4 blocks, hidden 512: the CPU speed benchmark).
Result<H3Config> config_preset(const std::string& name);
std::vector<std::string> config_preset_names();

}  // namespace vortex::h3
