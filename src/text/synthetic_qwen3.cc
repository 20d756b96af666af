#include "text/synthetic_qwen3.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/parallel.h"
#include "core/rng.h"
#include "formats/safetensors.h"
#include "vortex/tensor.h"

namespace vortex::text {

SyntheticQwen3Shape released_qwen3_shape(int64_t layers) {
  SyntheticQwen3Shape s;
  s.vocab = 151936;
  s.hidden = 5120;
  s.heads = 64;
  s.kv_heads = 8;
  s.head_dim = 128;
  s.intermediate = 25600;
  s.layers = layers;
  return s;
}

void use_released_vision_tower(SyntheticQwen3Shape& s) {
  s.vision_depth = 27;
  s.vision_hidden = 1152;
  s.vision_heads = 16;
  s.vision_intermediate = 4304;
  s.vision_position_side = 48;
  s.vision_deepstack_layers = {8, 16, 24};
}

Status write_synthetic_qwen3(const std::string& dir, const SyntheticQwen3Shape& s, uint64_t seed) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return invalid_argument(dir + ": cannot create the folder (" + ec.message() + ")");
  nlohmann::json config = {
      {"model_type", "qwen3_vl"},
      {"text_config",
       {{"vocab_size", s.vocab}, {"hidden_size", s.hidden}, {"intermediate_size", s.intermediate},
        {"num_hidden_layers", s.layers}, {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
        {"head_dim", s.head_dim}, {"rms_norm_eps", 1e-6}, {"hidden_act", "silu"},
        {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5000000.0}}}}}};
  constexpr int64_t kPatch = 16, kMerge = 2, kTemporal = 2;
  const int64_t positions = s.vision_position_side * s.vision_position_side;
  if (s.vision_depth > 0) {
    config["image_token_id"] = 151655;
    config["video_token_id"] = 151656;
    config["vision_start_token_id"] = 151652;
    config["vision_end_token_id"] = 151653;
    config["vision_config"] = {{"depth", s.vision_depth}, {"hidden_size", s.vision_hidden},
                               {"intermediate_size", s.vision_intermediate}, {"num_heads", s.vision_heads},
                               {"in_channels", 3}, {"patch_size", kPatch}, {"spatial_merge_size", kMerge},
                               {"temporal_patch_size", kTemporal}, {"out_hidden_size", s.hidden},
                               {"num_position_embeddings", positions},
                               {"deepstack_visual_indexes", s.vision_deepstack_layers},
                               {"hidden_act", "gelu_pytorch_tanh"}};
    const nlohmann::json processor = {
        {"image_processor_type", "Qwen2VLImageProcessor"}, {"patch_size", kPatch}, {"merge_size", kMerge},
        {"temporal_patch_size", kTemporal}, {"image_mean", {0.5, 0.5, 0.5}}, {"image_std", {0.5, 0.5, 0.5}},
        {"rescale_factor", 1.0 / 255.0}, {"size", {{"shortest_edge", 32 * 32}, {"longest_edge", 16777216}}}};
    std::ofstream out(dir + "/preprocessor_config.json");
    out << processor.dump(2);
    if (!out) return invalid_argument(dir + "/preprocessor_config.json: cannot write");
    nlohmann::json video = processor;
    video.erase("image_processor_type");
    video["video_processor_type"] = "Qwen3VLVideoProcessor";
    std::ofstream video_out(dir + "/video_preprocessor_config.json");
    video_out << video.dump(2);
    if (!video_out) return invalid_argument(dir + "/video_preprocessor_config.json: cannot write");
  }
  {
    std::ofstream out(dir + "/config.json");
    out << config.dump(2);
    if (!out) return invalid_argument(dir + "/config.json: cannot write");
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t stream = 0;
  Status failed = ok_status();
  const auto add = [&](const std::string& name, const Shape& shape, float scale, float offset) {
    Tensor values = Tensor::empty(shape, DType::kF32);
    float* p = values.data_as<float>();
    const uint64_t this_stream = stream++;
    parallel_for(0, values.numel(), [&](int64_t begin, int64_t end) {
      fill_normal(p + begin, end - begin, seed, this_stream, begin);
      for (int64_t i = begin; i < end; ++i) p[i] = offset + scale * p[i];
    }, int64_t{1} << 16);
    auto bf16 = values.to(DType::kBF16);
    if (!bf16.ok()) failed = bf16.status();
    else tensors.emplace_back(name, std::move(*bf16));
  };
  const auto linear_scale = [](int64_t fan_in) { return 0.3f * std::sqrt(8.0f / static_cast<float>(fan_in)); };
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  const std::string m = "model.language_model.";
  add(m + "embed_tokens.weight", {s.vocab, s.hidden}, 1.0f, 0.0f);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = m + "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {s.hidden}, 0.1f, 1.0f);
    add(p + "post_attention_layernorm.weight", {s.hidden}, 0.1f, 1.0f);
    add(p + "self_attn.q_norm.weight", {s.head_dim}, 0.1f, 1.0f);
    add(p + "self_attn.k_norm.weight", {s.head_dim}, 0.1f, 1.0f);
    add(p + "self_attn.q_proj.weight", {q, s.hidden}, linear_scale(s.hidden), 0.0f);
    add(p + "self_attn.k_proj.weight", {kv, s.hidden}, linear_scale(s.hidden), 0.0f);
    add(p + "self_attn.v_proj.weight", {kv, s.hidden}, linear_scale(s.hidden), 0.0f);
    add(p + "self_attn.o_proj.weight", {s.hidden, q}, linear_scale(q), 0.0f);
    add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, linear_scale(s.hidden), 0.0f);
    add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, linear_scale(s.hidden), 0.0f);
    add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, linear_scale(s.intermediate), 0.0f);
  }
  if (s.vision_depth > 0) {
    const std::string v = "model.visual.";
    const int64_t C = s.vision_hidden, F = s.vision_intermediate, M = C * kMerge * kMerge;
    const int64_t K = 3 * kTemporal * kPatch * kPatch;
    const auto layer_norm = [&](const std::string& p, int64_t n) {
      add(p + "weight", {n}, 0.1f, 1.0f);
      add(p + "bias", {n}, 0.1f, 0.0f);
    };
    const auto linear = [&](const std::string& p, int64_t out, int64_t in) {
      add(p + "weight", {out, in}, linear_scale(in), 0.0f);
      add(p + "bias", {out}, 0.1f, 0.0f);
    };
    add(v + "patch_embed.proj.weight", {C, 3, kTemporal, kPatch, kPatch}, linear_scale(K), 0.0f);
    add(v + "patch_embed.proj.bias", {C}, 0.1f, 0.0f);
    add(v + "pos_embed.weight", {positions, C}, 1.0f, 0.0f);
    for (int64_t b = 0; b < s.vision_depth; ++b) {
      const std::string p = v + "blocks." + std::to_string(b) + ".";
      layer_norm(p + "norm1.", C);
      layer_norm(p + "norm2.", C);
      linear(p + "attn.qkv.", 3 * C, C);
      linear(p + "attn.proj.", C, C);
      linear(p + "mlp.linear_fc1.", F, C);
      linear(p + "mlp.linear_fc2.", C, F);
    }
    std::vector<std::string> mergers = {v + "merger."};
    for (size_t j = 0; j < s.vision_deepstack_layers.size(); ++j) {
      mergers.push_back(v + "deepstack_merger_list." + std::to_string(j) + ".");
    }
    for (const std::string& m : mergers) {
      layer_norm(m + "norm.", m == mergers[0] ? C : M);  // the main merger normalises each patch
      linear(m + "linear_fc1.", M, M);
      linear(m + "linear_fc2.", s.hidden, M);
    }
  }
  VORTEX_RETURN_IF_ERROR(failed);
  return write_safetensors(dir + "/model.safetensors", tensors);
}

}  // namespace vortex::text
