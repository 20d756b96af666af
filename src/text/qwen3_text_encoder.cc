#include "text/qwen3_text_encoder.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/portable_math.h"
#include "cpu/attention.h"
#include "cpu/elementwise.h"
#include "cpu/gemm.h"
#include "cpu/norm.h"
#include "models/h3/tensor_views.h"
#include "text/hf_files.h"

namespace vortex::text {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// RoPE's theta: `rope_parameters.rope_theta` (transformers 5) or `rope_theta` (earlier files), with
// the default rope type only (other types scale the frequencies or the outputs).
Result<double> read_rope_theta(const json& t, const std::string& where) {
  const json* params = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (t.contains(key) && t[key].is_object()) params = &t[key];
  }
  if (params && params->contains("rope_type") && (*params)["rope_type"] != "default") {
    return unimplemented(where + ": rope_type " + (*params)["rope_type"].dump() + " (only \"default\" is supported)");
  }
  const json* theta = nullptr;
  if (params && params->contains("rope_theta")) theta = &(*params)["rope_theta"];
  if (!theta && t.contains("rope_theta")) theta = &t["rope_theta"];
  if (!theta || !theta->is_number() || theta->get<double>() <= 1.0) {
    return corrupt_data(where + ": no usable rope_theta (rope_parameters.rope_theta or rope_theta)");
  }
  return theta->get<double>();
}

// The multimodal RoPE's sections (t, h, w channel pairs), rope_parameters.mrope_section.
Result<std::array<int64_t, 3>> read_mrope_section(const json& t, std::array<int64_t, 3> fallback,
                                                  const std::string& where) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!t.contains(key) || !t[key].is_object() || !t[key].contains("mrope_section")) continue;
    const json& m = t[key]["mrope_section"];
    if (!m.is_array() || m.size() != 3) return corrupt_data(where + ": mrope_section " + m.dump() + " is not 3 numbers");
    std::array<int64_t, 3> out{};
    for (size_t i = 0; i < 3; ++i) {
      if (!m[i].is_number_integer() || m[i].get<int64_t>() < 0) {
        return corrupt_data(where + ": mrope_section " + m.dump() + " has a value that is not a count");
      }
      out[i] = m[i].get<int64_t>();
    }
    return out;
  }
  return fallback;
}

// The tensors stacked along rows (all [n_i, C], one dtype).
Result<Tensor> stack_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.size(0);
  Tensor out = Tensor::empty({rows, parts.front().size(1)}, parts.front().dtype());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor dst, out.slice(0, at, at + p.size(0)));
    VORTEX_RETURN_IF_ERROR(copy_into(p, dst));
    at += p.size(0);
  }
  return out;
}

}  // namespace

Result<Qwen3TextConfig> Qwen3TextConfig::from_json(const json& config, const std::string& where) {
  const bool vl = config.contains("text_config");
  const json& t = vl ? config["text_config"] : config;
  const std::string at = vl ? where + ": text_config" : where;
  if (!t.is_object()) return corrupt_data(at + " is not an object");
  Qwen3TextConfig c;
  VORTEX_ASSIGN_OR_RETURN(c.vocab_size, positive_int(t, "vocab_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.hidden, positive_int(t, "hidden_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.intermediate, positive_int(t, "intermediate_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.layers, positive_int(t, "num_hidden_layers", at));
  VORTEX_ASSIGN_OR_RETURN(c.heads, positive_int(t, "num_attention_heads", at));
  c.kv_heads = c.heads;
  if (t.contains("num_key_value_heads") && !t["num_key_value_heads"].is_null()) {
    VORTEX_ASSIGN_OR_RETURN(c.kv_heads, positive_int(t, "num_key_value_heads", at));
  }
  if (c.heads % c.kv_heads != 0) {
    return corrupt_data(at + ": num_attention_heads " + std::to_string(c.heads) + " is not a multiple of " +
                        "num_key_value_heads " + std::to_string(c.kv_heads));
  }
  c.head_dim = c.hidden / c.heads;
  if (t.contains("head_dim") && !t["head_dim"].is_null()) {
    VORTEX_ASSIGN_OR_RETURN(c.head_dim, positive_int(t, "head_dim", at));
  }
  if (c.head_dim % 2 != 0) return corrupt_data(at + ": head_dim " + std::to_string(c.head_dim) + " is odd");
  if (t.contains("rms_norm_eps")) {
    if (!t["rms_norm_eps"].is_number() || t["rms_norm_eps"].get<double>() <= 0.0) {
      return corrupt_data(at + ": rms_norm_eps is " + t["rms_norm_eps"].dump());
    }
    c.rms_norm_eps = t["rms_norm_eps"].get<double>();
  }
  VORTEX_ASSIGN_OR_RETURN(c.rope_theta, read_rope_theta(t, at));
  VORTEX_ASSIGN_OR_RETURN(c.mrope_section, read_mrope_section(t, c.mrope_section, at));
  for (auto [key, id] : {std::pair{"image_token_id", &c.image_token_id}, std::pair{"video_token_id", &c.video_token_id}}) {
    if (!vl || !config.contains(key)) continue;
    if (!config[key].is_number_integer() || config[key].get<int64_t>() < 0) {
      return corrupt_data(where + ": " + key + " is " + config[key].dump());
    }
    *id = config[key].get<int64_t>();
  }
  if (t.value("hidden_act", "silu") != "silu") {
    return unimplemented(at + ": hidden_act " + t["hidden_act"].dump() + " (only silu is supported)");
  }
  if (t.value("attention_bias", false)) return unimplemented(at + ": attention_bias is true (not supported)");
  return c;
}

Result<Qwen3TextEncoder> Qwen3TextEncoder::load(const std::string& path, int layer) {
  const std::string config_path = (fs::path(model_folder(path)) / "config.json").string();
  VORTEX_ASSIGN_OR_RETURN(json config_json, read_json_file(config_path));
  Qwen3TextEncoder enc;
  VORTEX_ASSIGN_OR_RETURN(enc.config_, Qwen3TextConfig::from_json(config_json, config_path));
  const Qwen3TextConfig& c = enc.config_;
  if (layer < 1 || layer > c.layers) {
    return invalid_argument("text encoder layer " + std::to_string(layer) + " is outside 1.." +
                            std::to_string(c.layers) + " (" + config_path + " has " + std::to_string(c.layers) +
                            " decoder layers)");
  }
  enc.layer_ = layer;
  VORTEX_ASSIGN_OR_RETURN(ShardedCheckpoint ckpt, open_model_weights(path));
  enc.source_ = ckpt.path();

  std::string prefix;
  for (const char* candidate : {"model.language_model.", "model."}) {
    if (ckpt.has(std::string(candidate) + "embed_tokens.weight")) {
      prefix = candidate;
      break;
    }
  }
  if (prefix.empty()) {
    return not_found(ckpt.path() + ": no 'model.language_model.embed_tokens.weight' (Qwen3-VL) or "
                     "'model.embed_tokens.weight' (Qwen3): not a Qwen3 text model in the Hugging Face layout");
  }
  const int64_t C = c.hidden, F = c.intermediate, D = c.head_dim;
  VORTEX_ASSIGN_OR_RETURN(enc.embed_tokens_, checked_weight(ckpt, prefix + "embed_tokens.weight", Shape({c.vocab_size, C})));
  enc.layers_.resize(static_cast<size_t>(layer));
  for (int i = 0; i < layer; ++i) {
    const std::string p = prefix + "layers." + std::to_string(i) + ".";
    Layer& l = enc.layers_[static_cast<size_t>(i)];
    VORTEX_ASSIGN_OR_RETURN(l.input_norm, checked_weight(ckpt, p + "input_layernorm.weight", Shape({C})));
    VORTEX_ASSIGN_OR_RETURN(l.q, checked_weight(ckpt, p + "self_attn.q_proj.weight", Shape({c.heads * D, C})));
    VORTEX_ASSIGN_OR_RETURN(l.k, checked_weight(ckpt, p + "self_attn.k_proj.weight", Shape({c.kv_heads * D, C})));
    VORTEX_ASSIGN_OR_RETURN(l.v, checked_weight(ckpt, p + "self_attn.v_proj.weight", Shape({c.kv_heads * D, C})));
    VORTEX_ASSIGN_OR_RETURN(l.q_norm, checked_weight(ckpt, p + "self_attn.q_norm.weight", Shape({D})));
    VORTEX_ASSIGN_OR_RETURN(l.k_norm, checked_weight(ckpt, p + "self_attn.k_norm.weight", Shape({D})));
    VORTEX_ASSIGN_OR_RETURN(l.o, checked_weight(ckpt, p + "self_attn.o_proj.weight", Shape({C, c.heads * D})));
    VORTEX_ASSIGN_OR_RETURN(l.post_norm, checked_weight(ckpt, p + "post_attention_layernorm.weight", Shape({C})));
    VORTEX_ASSIGN_OR_RETURN(l.gate, checked_weight(ckpt, p + "mlp.gate_proj.weight", Shape({F, C})));
    VORTEX_ASSIGN_OR_RETURN(l.up, checked_weight(ckpt, p + "mlp.up_proj.weight", Shape({F, C})));
    VORTEX_ASSIGN_OR_RETURN(l.down, checked_weight(ckpt, p + "mlp.down_proj.weight", Shape({C, F})));
  }
  return enc;
}

uint64_t Qwen3TextEncoder::layer_bytes() const {
  uint64_t bytes = 0;
  for (const Layer& l : layers_) {
    for (const Tensor* t : {&l.input_norm, &l.q, &l.k, &l.v, &l.q_norm, &l.k_norm, &l.o, &l.post_norm, &l.gate, &l.up,
                            &l.down}) {
      bytes += t->nbytes();
    }
  }
  return bytes;
}

uint64_t Qwen3TextEncoder::device_weight_bytes(uint64_t alignment) const {
  const auto aligned = [alignment](int64_t elements, DType dtype) {
    const uint64_t b = static_cast<uint64_t>(elements) * dtype_size(dtype);
    return (b + alignment - 1) / alignment * alignment;
  };
  const Qwen3TextConfig& c = config_;
  const int64_t C = c.hidden, F = c.intermediate, q_rows = c.heads * c.head_dim, kv_rows = c.kv_heads * c.head_dim;
  uint64_t bytes = 0;
  for (const Layer& l : layers_) {
    for (const Tensor* t : {&l.input_norm, &l.post_norm, &l.q_norm, &l.k_norm}) bytes += aligned(t->numel(), t->dtype());
    bytes += aligned((q_rows + 2 * kv_rows) * C, DType::kBF16) + aligned(C * q_rows, DType::kBF16) +
             aligned(2 * F * C, DType::kBF16) + aligned(C * F, DType::kBF16);
  }
  return bytes;
}

Result<Tensor> Qwen3TextEncoder::embed(const std::vector<int32_t>& ids) const {
  const int64_t N = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < N; ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      return invalid_argument("token " + std::to_string(i) + " has id " + std::to_string(ids[i]) +
                              ", outside the text encoder's vocabulary of " + std::to_string(config_.vocab_size));
    }
  }
  Tensor x = Tensor::empty({N, config_.hidden}, DType::kBF16);
  for (int64_t i = 0; i < N; ++i) {
    VORTEX_ASSIGN_OR_RETURN(Tensor row, embed_tokens_.select(0, ids[i]));
    VORTEX_ASSIGN_OR_RETURN(Tensor dst, x.select(0, i));
    VORTEX_RETURN_IF_ERROR(copy_into(row, dst));
  }
  return x;
}

// inv_freq and the angles in fp32 as the reference computes them (cat(freqs, freqs) along the
// head), cos/sin through portable_math.
Qwen3TextEncoder::RopeTables Qwen3TextEncoder::rope_tables(int64_t N) const {
  std::vector<int64_t> index(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) index[static_cast<size_t>(n)] = n;
  return rope_tables(Positions{index, index, index});
}

Qwen3TextEncoder::RopeTables Qwen3TextEncoder::rope_tables(const Positions& positions) const {
  const int64_t D = config_.head_dim, N = static_cast<int64_t>(positions[0].size());
  const auto& section = config_.mrope_section;
  Tensor cos = Tensor::empty({N, D}, DType::kF32), sin = Tensor::empty({N, D}, DType::kF32);
  for (int64_t k = 0; k < D / 2; ++k) {
    const float exponent = static_cast<float>(2 * k) / static_cast<float>(D);
    const float inv_freq = 1.0f / portable_powf(static_cast<float>(config_.rope_theta), exponent);
    // The interleaved layout: pairs 1, 4, 7, ... follow h and 2, 5, 8, ... follow w within their
    // sections; every other pair follows t.
    const int axis = (k % 3 == 1 && k < 3 * section[1]) ? 1 : (k % 3 == 2 && k < 3 * section[2]) ? 2 : 0;
    const std::vector<int64_t>& pos = positions[static_cast<size_t>(axis)];
    for (int64_t n = 0; n < N; ++n) {
      const float angle = static_cast<float>(pos[static_cast<size_t>(n)]) * inv_freq;
      cos.data_as<float>()[n * D + k] = cos.data_as<float>()[n * D + k + D / 2] = portable_cosf(angle);
      sin.data_as<float>()[n * D + k] = sin.data_as<float>()[n * D + k + D / 2] = portable_sinf(angle);
    }
  }
  return {cos, sin};
}

Result<Qwen3TextEncoder::VisionRows> Qwen3TextEncoder::vision_rows(const std::vector<int32_t>& ids,
                                                                   const std::vector<VisionFeatures>& images) const {
  const int64_t N = static_cast<int64_t>(ids.size()), C = config_.hidden;
  VisionRows out;
  for (auto& axis : out.positions) axis.resize(static_cast<size_t>(N));
  if (!images.empty() && (config_.image_token_id < 0 || config_.image_token_id >= config_.vocab_size)) {
    return invalid_argument("the text encoder's config has no image_token_id inside its vocabulary of " +
                            std::to_string(config_.vocab_size) + ": it takes no images");
  }
  // A video's vision block sits as an image of one frame would (the reference splits a video's
  // grid per block, its timestamps being text between them), so both pads start a run.
  const auto is_pad = [&](int32_t id) {
    return id == config_.image_token_id || (config_.video_token_id >= 0 && id == config_.video_token_id);
  };
  int64_t next = 0;  // the next text position (one past the previous maximum)
  for (int64_t i = 0; i < N;) {
    // Without images a pad id is a plain token, as in the reference without pixel values.
    if (images.empty() || !is_pad(ids[static_cast<size_t>(i)])) {
      for (auto& axis : out.positions) axis[static_cast<size_t>(i)] = next;
      ++next, ++i;
      continue;
    }
    int64_t end = i;
    while (end < N && ids[static_cast<size_t>(end)] == ids[static_cast<size_t>(i)]) ++end;
    const size_t k = out.runs.size();
    if (k >= images.size()) {
      return invalid_argument("token " + std::to_string(i) + " starts image-pad run " + std::to_string(k + 1) +
                              ", but " + std::to_string(images.size()) + " image(s) were given");
    }
    const VisionGrid& grid = images[k].grid;
    if (end - i != grid.tokens()) {
      return invalid_argument("the image-pad run at token " + std::to_string(i) + " has " + std::to_string(end - i) +
                              " tokens; image " + std::to_string(k + 1) + " gives " + std::to_string(grid.tokens()));
    }
    const int64_t rows = grid.height / grid.merge, cols = grid.width / grid.merge;
    for (int64_t j = 0; j < end - i; ++j) {
      const size_t n = static_cast<size_t>(i + j);
      out.positions[0][n] = next;
      out.positions[1][n] = next + j / cols;
      out.positions[2][n] = next + j % cols;
    }
    out.runs.push_back({i, end - i});
    next += std::max(rows, cols);
    i = end;
  }
  if (out.runs.size() != images.size()) {
    return invalid_argument(std::to_string(images.size()) + " image(s) given for " + std::to_string(out.runs.size()) +
                            " image-pad run(s) in the presentation");
  }
  if (images.empty()) return out;
  std::vector<Tensor> merged;
  const size_t layers = images[0].deepstack.size();
  std::vector<std::vector<Tensor>> deepstack(layers);
  for (size_t k = 0; k < images.size(); ++k) {
    const VisionFeatures& f = images[k];
    const Shape expected({f.grid.tokens(), C});
    if (f.merged.shape() != expected || f.merged.dtype() != DType::kBF16 || f.deepstack.size() != layers) {
      return invalid_argument("image " + std::to_string(k + 1) + "'s vision features are " + f.merged.describe() +
                              " with " + std::to_string(f.deepstack.size()) + " DeepStack layers, expected bf16" +
                              expected.to_string() + " with " + std::to_string(layers));
    }
    merged.push_back(f.merged);
    for (size_t l = 0; l < layers; ++l) {
      if (f.deepstack[l].shape() != expected || f.deepstack[l].dtype() != DType::kBF16) {
        return invalid_argument("image " + std::to_string(k + 1) + "'s DeepStack feature " + std::to_string(l) +
                                " is " + f.deepstack[l].describe() + ", expected bf16" + expected.to_string());
      }
      deepstack[l].push_back(f.deepstack[l]);
    }
  }
  VORTEX_ASSIGN_OR_RETURN(out.embeds, stack_rows(merged));
  for (auto& d : deepstack) {
    VORTEX_ASSIGN_OR_RETURN(Tensor joined, stack_rows(d));
    out.deepstack.push_back(std::move(joined));
  }
  return out;
}

Result<Tensor> Qwen3TextEncoder::embed_presentation(const std::vector<int32_t>& ids,
                                                    const std::vector<VisionFeatures>& images,
                                                    VisionRows* rows) const {
  VORTEX_ASSIGN_OR_RETURN(Tensor x, embed(ids));
  VORTEX_ASSIGN_OR_RETURN(*rows, vision_rows(ids, images));
  if (images.empty()) return x;
  VORTEX_RETURN_IF_ERROR(for_each_run(*rows, rows->embeds, x, [](const Tensor& from, const Tensor& to) {
    return copy_into(from, to);
  }));
  return x;
}

Result<Tensor> Qwen3TextEncoder::encode(const std::vector<int32_t>& ids,
                                        const std::vector<VisionFeatures>& images) const {
  const Qwen3TextConfig& c = config_;
  const int64_t N = static_cast<int64_t>(ids.size()), C = c.hidden, F = c.intermediate, D = c.head_dim;
  const DType bf16 = DType::kBF16;
  VisionRows vision;
  VORTEX_ASSIGN_OR_RETURN(Tensor x, embed_presentation(ids, images, &vision));
  if (N == 0) return x;
  const RopeTables rope = images.empty() ? rope_tables(N) : rope_tables(vision.positions);
  const Tensor& cos = rope.cos;
  const Tensor& sin = rope.sin;

  const int64_t q_width = c.heads * D, kv_width = c.kv_heads * D;
  Tensor normed = Tensor::empty({N, C}, bf16);
  Tensor qkv = Tensor::empty({N, q_width + 2 * kv_width}, bf16);
  Tensor attn = Tensor::empty({N, q_width}, bf16);
  Tensor branch = Tensor::empty({N, C}, bf16);
  Tensor up_gate = Tensor::empty({N, 2 * F}, bf16);  // [up | gate]: swiglu's [value | gate]
  Tensor act = Tensor::empty({N, F}, bf16);
  const TensorView q = h3::heads_view(qkv, 0, c.heads, D);
  const TensorView k = h3::heads_view(qkv, q_width, c.kv_heads, D);
  const TensorView v = h3::heads_view(qkv, q_width + kv_width, c.kv_heads, D);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const auto norm_rounding = cpu::RmsNormRounding::kBeforeWeight;
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    const Layer& l = layers_[layer];
    const TensorView in_w = l.input_norm.view(), post_w = l.post_norm.view();
    const TensorView qn_w = l.q_norm.view(), kn_w = l.k_norm.view();
    VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &in_w, eps, normed.view(), norm_rounding));
    VORTEX_RETURN_IF_ERROR(cpu::linear(normed.view(), l.q.view(), nullptr, h3::columns(qkv, 0, q_width)));
    VORTEX_RETURN_IF_ERROR(cpu::linear(normed.view(), l.k.view(), nullptr, h3::columns(qkv, q_width, kv_width)));
    VORTEX_RETURN_IF_ERROR(
        cpu::linear(normed.view(), l.v.view(), nullptr, h3::columns(qkv, q_width + kv_width, kv_width)));
    VORTEX_RETURN_IF_ERROR(cpu::rms_norm(q, &qn_w, eps, q, norm_rounding));
    VORTEX_RETURN_IF_ERROR(cpu::rms_norm(k, &kn_w, eps, k, norm_rounding));
    VORTEX_RETURN_IF_ERROR(cpu::apply_rope(q, cos, sin));
    VORTEX_RETURN_IF_ERROR(cpu::apply_rope(k, cos, sin));
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    VORTEX_RETURN_IF_ERROR(cpu::causal_attention(q, k, v, h3::heads_view(attn, 0, c.heads, D), scale));
    VORTEX_RETURN_IF_ERROR(cpu::linear(attn.view(), l.o.view(), nullptr, branch.view()));
    VORTEX_RETURN_IF_ERROR(cpu::residual_add(x.view(), branch.view()));

    VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &post_w, eps, normed.view(), norm_rounding));
    VORTEX_RETURN_IF_ERROR(cpu::linear(normed.view(), l.up.view(), nullptr, h3::columns(up_gate, 0, F)));
    VORTEX_RETURN_IF_ERROR(cpu::linear(normed.view(), l.gate.view(), nullptr, h3::columns(up_gate, F, F)));
    VORTEX_RETURN_IF_ERROR(cpu::swiglu(up_gate.view(), act.view()));
    VORTEX_RETURN_IF_ERROR(cpu::linear(act.view(), l.down.view(), nullptr, branch.view()));
    VORTEX_RETURN_IF_ERROR(cpu::residual_add(x.view(), branch.view()));
    // The reference records hidden_states[i] as layer i − 1's output, before its DeepStack add:
    // the add after the last layer run is not part of the state asked for.
    if (adds_deepstack_after(layer, vision)) {
      VORTEX_RETURN_IF_ERROR(for_each_run(vision, vision.deepstack[layer], x, [](const Tensor& from, const Tensor& to) {
        return cpu::residual_add(to.view(), from.view());
      }));
    }
  }
  return x;
}

}  // namespace vortex::text
