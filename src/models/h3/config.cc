#include "models/h3/config.h"

#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_int.h"
#include "core/portable_math.h"

namespace vortex::h3 {

int64_t H3Config::parameter_count() const {
  const int64_t c = hidden_size, inner = inner_dim(), f = ffn_dim, te = time_embed_dim;
  const int64_t attn = 3 * inner * c + inner * c + 2 * attention_head_dim;
  const int64_t ffn = 2 * f * c + f * c;
  const int64_t refiner_block = attn + ffn + 2 * c;
  const int64_t block = refiner_block + (6 * kNumModalities * c) * (te + 1);
  const int64_t patch = video_patch_dim();
  int64_t total = 0;
  total += (patch + 1) * c + (audio_in_channels + 1) * c + (int64_t(text_dim) + 1) * c;  // input projections
  total += (int64_t(freq_dim) + 1) * time_embed_hidden_dim + (int64_t(time_embed_hidden_dim) + 1) * te;
  total += num_refiner_layers * refiner_block + c;  // + refiner final norm
  total += num_layers * block;
  total += c + (te + 1) * 2 * c;  // norm_out
  total += (c + 1) * patch + (c + 1) * audio_in_channels;
  return total;
}

Status H3Config::validate() const {
  auto positive = [](const char* field, double v) -> Status {
    if (!(v > 0)) return invalid_argument(std::string("config field '") + field + "' must be positive");
    return ok_status();
  };
  VORTEX_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  VORTEX_RETURN_IF_ERROR(positive("attention_head_dim", attention_head_dim));
  VORTEX_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  VORTEX_RETURN_IF_ERROR(positive("ffn_dim", ffn_dim));
  VORTEX_RETURN_IF_ERROR(positive("in_channels", in_channels));
  VORTEX_RETURN_IF_ERROR(positive("audio_in_channels", audio_in_channels));
  VORTEX_RETURN_IF_ERROR(positive("text_dim", text_dim));
  VORTEX_RETURN_IF_ERROR(positive("freq_dim", freq_dim));
  VORTEX_RETURN_IF_ERROR(positive("time_embed_hidden_dim", time_embed_hidden_dim));
  VORTEX_RETURN_IF_ERROR(positive("time_embed_dim", time_embed_dim));
  VORTEX_RETURN_IF_ERROR(positive("rope_freq_dim", rope_freq_dim));
  VORTEX_RETURN_IF_ERROR(positive("rope_theta", rope_theta));
  VORTEX_RETURN_IF_ERROR(positive("norm_eps", norm_eps));
  VORTEX_RETURN_IF_ERROR(positive("qk_norm_eps", qk_norm_eps));
  VORTEX_RETURN_IF_ERROR(positive("final_norm_eps", final_norm_eps));
  if (num_layers < 0 || num_refiner_layers < 0) {
    return invalid_argument("config fields 'num_layers' and 'num_refiner_layers' must be >= 0");
  }
  for (int p : patch_size) {
    if (p <= 0) return invalid_argument("config field 'patch_size' must hold three positive sizes");
  }
  if (freq_dim % 2 != 0) return invalid_argument("config field 'freq_dim' must be even (cos and sin halves)");
  if (rotary_dim() > attention_head_dim) {
    return invalid_argument("config: 6 * rope_freq_dim (" + std::to_string(rotary_dim()) +
                            ") exceeds attention_head_dim (" + std::to_string(attention_head_dim) + ")");
  }
  return ok_status();
}

nlohmann::json H3Config::to_json() const {
  return nlohmann::json{
      {"num_attention_heads", num_attention_heads},
      {"attention_head_dim", attention_head_dim},
      {"hidden_size", hidden_size},
      {"num_layers", num_layers},
      {"num_refiner_layers", num_refiner_layers},
      {"ffn_dim", ffn_dim},
      {"in_channels", in_channels},
      {"audio_in_channels", audio_in_channels},
      {"patch_size", {patch_size[0], patch_size[1], patch_size[2]}},
      {"text_dim", text_dim},
      {"freq_dim", freq_dim},
      {"time_embed_hidden_dim", time_embed_hidden_dim},
      {"time_embed_dim", time_embed_dim},
      {"rope_freq_dim", rope_freq_dim},
      {"rope_theta", rope_theta},
      {"norm_eps", norm_eps},
      {"qk_norm_eps", qk_norm_eps},
      {"final_norm_eps", final_norm_eps},
  };
}

std::string H3Config::to_json_string() const { return to_json().dump(); }

namespace {

template <class T>
Status read_field(const nlohmann::json& json, const char* key, T& out) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return ok_status();  // keep the default
  if constexpr (std::is_same_v<T, int>) {
    const std::optional<int> x = json_int(*it);
    if (!x) return invalid_argument(std::string("config field '") + key + "' must be an integer (32-bit)");
    out = *x;
  } else {
    if (!it->is_number()) return invalid_argument(std::string("config field '") + key + "' must be a number");
    out = it->template get<double>();
  }
  return ok_status();
}

}  // namespace

Status check_fp8_attention_width(const H3Config& config) {
  if (config.inner_dim() % 128 != 0) {
    return invalid_argument("the fp8 recipe needs the inner dim (num_attention_heads x attention_head_dim) to be a "
                            "multiple of 128, got " + std::to_string(config.inner_dim()));
  }
  return ok_status();
}

Result<H3Config> config_from_json(const nlohmann::json& json) {
  if (!json.is_object()) return invalid_argument("config must be a JSON object");
  H3Config c;
  VORTEX_RETURN_IF_ERROR(read_field(json, "num_attention_heads", c.num_attention_heads));
  VORTEX_RETURN_IF_ERROR(read_field(json, "attention_head_dim", c.attention_head_dim));
  VORTEX_RETURN_IF_ERROR(read_field(json, "hidden_size", c.hidden_size));
  VORTEX_RETURN_IF_ERROR(read_field(json, "num_layers", c.num_layers));
  VORTEX_RETURN_IF_ERROR(read_field(json, "num_refiner_layers", c.num_refiner_layers));
  VORTEX_RETURN_IF_ERROR(read_field(json, "ffn_dim", c.ffn_dim));
  VORTEX_RETURN_IF_ERROR(read_field(json, "in_channels", c.in_channels));
  VORTEX_RETURN_IF_ERROR(read_field(json, "audio_in_channels", c.audio_in_channels));
  VORTEX_RETURN_IF_ERROR(read_field(json, "text_dim", c.text_dim));
  VORTEX_RETURN_IF_ERROR(read_field(json, "freq_dim", c.freq_dim));
  VORTEX_RETURN_IF_ERROR(read_field(json, "time_embed_hidden_dim", c.time_embed_hidden_dim));
  VORTEX_RETURN_IF_ERROR(read_field(json, "time_embed_dim", c.time_embed_dim));
  VORTEX_RETURN_IF_ERROR(read_field(json, "rope_freq_dim", c.rope_freq_dim));
  VORTEX_RETURN_IF_ERROR(read_field(json, "rope_theta", c.rope_theta));
  VORTEX_RETURN_IF_ERROR(read_field(json, "norm_eps", c.norm_eps));
  VORTEX_RETURN_IF_ERROR(read_field(json, "qk_norm_eps", c.qk_norm_eps));
  VORTEX_RETURN_IF_ERROR(read_field(json, "final_norm_eps", c.final_norm_eps));
  if (auto it = json.find("patch_size"); it != json.end()) {
    if (!it->is_array() || it->size() != 3) return invalid_argument("config field 'patch_size' must be [t, h, w]");
    for (int i = 0; i < 3; ++i) {
      const std::optional<int> x = json_int((*it)[i]);
      if (!x) return invalid_argument("config field 'patch_size' must hold integers (32-bit)");
      c.patch_size[i] = *x;
    }
  }
  VORTEX_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<H3Config> config_from_json_string(const std::string& text) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument("config is not valid JSON");
  return config_from_json(json);
}

Result<H3Config> config_from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open config");
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto config = config_from_json_string(buffer.str());
  if (!config.ok()) return config.status().with_context(path);
  return config;
}

Result<H3Config> config_preset(const std::string& name) {
  H3Config c;  // defaults are the released checkpoint
  if (name == "h3") return c;
  if (name == "test") {
    c.num_attention_heads = 2;
    c.attention_head_dim = 16;
    c.hidden_size = 24;
    c.num_layers = 2;
    c.num_refiner_layers = 2;
    c.ffn_dim = 32;
    c.in_channels = 4;
    c.audio_in_channels = 6;
    c.text_dim = 8;
    c.freq_dim = 8;
    c.time_embed_hidden_dim = 24;
    c.time_embed_dim = 16;
    c.rope_freq_dim = 2;
    return c;
  }
  if (name == "small") {
    c.num_attention_heads = 3;
    c.attention_head_dim = 24;
    c.hidden_size = 48;
    c.num_layers = 3;
    c.ffn_dim = 64;
    c.text_dim = 40;
    c.freq_dim = 16;
    c.time_embed_hidden_dim = 48;
    c.time_embed_dim = 24;
    c.rope_freq_dim = 3;
    return c;
  }
  if (name == "mid") {
    c.num_attention_heads = 8;
    c.attention_head_dim = 64;
    c.hidden_size = 512;
    c.num_layers = 4;
    c.ffn_dim = 1408;
    c.text_dim = 256;
    c.freq_dim = 256;
    c.time_embed_hidden_dim = 512;
    c.time_embed_dim = 256;
    c.rope_freq_dim = 8;
    return c;
  }
  return invalid_argument("unknown preset '" + name + "' (known: h3, test, small, mid)");
}

std::vector<std::string> config_preset_names() { return {"h3", "test", "small", "mid"}; }

std::vector<float> rope_inverse_frequencies(const H3Config& config) {
  const int F = config.rope_freq_dim;
  std::vector<float> inv_freq(static_cast<size_t>(F));
  for (int i = 0; i < F; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(2 * F);
    inv_freq[i] = 1.0f / portable_powf(static_cast<float>(config.rope_theta), exponent);
  }
  return inv_freq;
}

}  // namespace vortex::h3
