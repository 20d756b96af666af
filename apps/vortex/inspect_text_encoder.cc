#include "inspect_text_encoder.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "models/h3/checkpoint_writer.h"
#include "text/qwen3_text_encoder.h"

namespace vortex::cli {

namespace {

namespace fs = std::filesystem;

fs::path folder_of(const std::string& path) {
  return fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
}

// The CUDA encoder's arena alignment (cuda::DeviceArena::kAlignment), here without the CUDA headers.
constexpr uint64_t kDeviceAlignment = 256;

}  // namespace

bool is_text_encoder_checkpoint(const std::string& path) {
  std::ifstream in(folder_of(path) / "config.json");
  if (!in) return false;
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return false;
  const std::string type = config.value("model_type", "");
  return type == "qwen3_vl" || type == "qwen3" || config.contains("text_config");
}

int inspect_text_encoder(const std::string& path, bool json) {
  const fs::path dir = folder_of(path);
  std::ifstream in(dir / "config.json");
  const nlohmann::json raw = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  auto config = text::Qwen3TextConfig::from_json(raw, (dir / "config.json").string());
  if (!config.ok()) return report_error(config.status());
  // The layers H3 reads (layer 50 of the released 64), or all of a shorter checkpoint's.
  const int layer = static_cast<int>(std::min<int64_t>(text::kH3TextEncoderLayer, config->layers));
  auto encoder = text::Qwen3TextEncoder::load(dir.string(), layer);
  if (!encoder.ok()) return report_error(encoder.status());
  const text::Qwen3TextConfig& c = encoder->config();
  const bool tokenizer = fs::exists(dir / "tokenizer.json");
  const uint64_t host_bytes = encoder->layer_bytes(), device_bytes = encoder->device_weight_bytes(kDeviceAlignment);
  const std::string reads =
      layer == text::kH3TextEncoderLayer
          ? "layer " + std::to_string(layer) + " (H3's): layers 0.." + std::to_string(layer - 1) + " present"
          : "only " + std::to_string(c.layers) + " layers, below H3's " + std::to_string(text::kH3TextEncoderLayer) +
                " (--text-encoder-layer " + std::to_string(c.layers) + " or lower)";
  if (json) {
    const nlohmann::json out = {
        {"text_encoder", encoder->source()},
        {"config",
         {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden}, {"num_hidden_layers", c.layers},
          {"num_attention_heads", c.heads}, {"num_key_value_heads", c.kv_heads}, {"head_dim", c.head_dim},
          {"intermediate_size", c.intermediate}, {"rope_theta", c.rope_theta}, {"rms_norm_eps", c.rms_norm_eps}}},
        {"layers_read", layer},
        {"reads", reads},
        {"layers_bytes", host_bytes},
        {"cuda_weights_bytes", device_bytes},
        {"tokenizer", tokenizer ? nlohmann::json((dir / "tokenizer.json").string()) : nlohmann::json()}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("text encoder  %s\n", encoder->source().c_str());
  std::printf("config        hidden %lld, %lld layers, %lld / %lld heads x %lld, FFN %lld, vocabulary %lld, rope theta %g\n",
              static_cast<long long>(c.hidden), static_cast<long long>(c.layers), static_cast<long long>(c.heads),
              static_cast<long long>(c.kv_heads), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.intermediate), static_cast<long long>(c.vocab_size), c.rope_theta);
  std::printf("reads         %s\n", reads.c_str());
  std::printf("schema        ok: every tensor of those layers and the embedding, with its shape\n");
  std::printf("bytes         %s in those layers as stored; %s on --device cuda (linears in bf16)\n",
              h3::human_bytes(host_bytes).c_str(), h3::human_bytes(device_bytes).c_str());
  std::printf("tokenizer     %s\n", tokenizer ? (dir / "tokenizer.json").string().c_str()
                                              : "none beside it (pass --tokenizer)");
  return 0;
}

}  // namespace vortex::cli
