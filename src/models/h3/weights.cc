#include "models/h3/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/byte_pieces.h"
#include "core/parallel.h"
#include "core/quote.h"
#include "formats/gguf.h"
#include "models/h3/lora.h"
#include "models/h3/scaled_weights.h"

namespace vortex::h3 {

const char* layout_name(CheckpointLayout layout) {
  return layout == CheckpointLayout::kDiffusers ? "diffusers" : "original";
}

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
void replace_once(std::string& s, const std::string& from, const std::string& to) {
  if (auto pos = s.find(from); pos != std::string::npos) s.replace(pos, from.size(), to);
}

// Top-level renames between the layouts (original prefix, diffusers prefix).
const std::vector<std::pair<std::string, std::string>>& top_level_renames() {
  static const std::vector<std::pair<std::string, std::string>> kRenames = {
      {"video_patch_proj.", "proj_in."},
      {"audio_patch_proj.", "audio_proj_in."},
      {"condition_proj.", "context_embedder."},
      {"time_embedder.proj_in.", "time_embedder.linear_1."},
      {"time_embedder.proj_out.", "time_embedder.linear_2."},
      {"final_layer.norm.", "norm_out.norm."},
      {"final_layer.adaln_proj.linear.", "norm_out.linear."},
      {"final_layer.video_out.", "proj_out."},
      {"final_layer.audio_out.", "audio_proj_out."},
  };
  return kRenames;
}

// Inside a block (both directions are plain string swaps).
const std::vector<std::pair<std::string, std::string>>& block_renames() {
  static const std::vector<std::pair<std::string, std::string>> kRenames = {
      {".attn.q_norm.", ".attn.norm_q."},
      {".attn.k_norm.", ".attn.norm_k."},
      {".attn.out_proj.", ".attn.to_out.0."},
      {".mlp.fc2.", ".ff.net.2."},
  };
  return kRenames;
}

}  // namespace

std::string original_name_to_diffusers(std::string name) {
  if (starts_with(name, "token_refiner.blocks.")) {
    name = "token_refiner.refiner_blocks." + name.substr(std::strlen("token_refiner.blocks."));
  } else if (starts_with(name, "blocks.")) {
    name = "transformer_blocks." + name.substr(std::strlen("blocks."));
  } else {
    for (const auto& [orig, diff] : top_level_renames()) {
      if (starts_with(name, orig)) return diff + name.substr(orig.size());
    }
    return name;
  }
  for (const auto& [orig, diff] : block_renames()) replace_once(name, orig, diff);
  return name;
}

namespace {

std::string diffusers_name_to_original(std::string name) {
  if (starts_with(name, "token_refiner.refiner_blocks.")) {
    name = "token_refiner.blocks." + name.substr(std::strlen("token_refiner.refiner_blocks."));
  } else if (starts_with(name, "transformer_blocks.")) {
    name = "blocks." + name.substr(std::strlen("transformer_blocks."));
  } else {
    for (const auto& [orig, diff] : top_level_renames()) {
      if (starts_with(name, diff)) return orig + name.substr(diff.size());
    }
    return name;
  }
  for (const auto& [orig, diff] : block_renames()) replace_once(name, diff, orig);
  return name;
}

// Row-block copy: out rows [dst_row, dst_row + count) = in rows [src_row, ...), any dtype.
void copy_rows(const Tensor& in, int64_t src_row, Tensor& out, int64_t dst_row, int64_t count) {
  const size_t row_bytes = static_cast<size_t>(in.numel() / in.size(0)) * dtype_size(in.dtype());
  std::memcpy(static_cast<char*>(out.data()) + dst_row * row_bytes,
              static_cast<const char*>(in.data()) + src_row * row_bytes, count * row_bytes);
}

Tensor new_like_rows(const Tensor& like, int64_t rows) {
  Shape shape = like.shape();
  shape[0] = rows;
  return Tensor::empty(shape, like.dtype());
}

Status expect_rows(const std::string& name, const Shape& shape, int64_t rows) {
  if (shape.rank() != 2 || shape[0] != rows) {
    return invalid_argument("tensor '" + name + "': shape " + shape.to_string() + " but the config expects " +
                            std::to_string(rows) + " rows");
  }
  return ok_status();
}

}  // namespace

int64_t row_count(const RowRuns& runs) {
  int64_t rows = 0;
  for (const auto& run : runs) rows += run.second;
  return rows;
}

Tensor gather_rows(const Tensor& tensor, const RowRuns& runs) {
  const Tensor src = tensor.contiguous();
  Tensor out = new_like_rows(src, row_count(runs));
  const size_t row_bytes = src.size(0) == 0 ? 0 : src.nbytes() / static_cast<size_t>(src.size(0));
  const BytePieces pieces = BytePieces::rows(src.data(), row_bytes, runs);
  // On every core: a fused layer's part at the released size is hundreds of MB, and its fresh
  // pages' first touch costs more than the copy (one thread took ~0.3 s a block's parts).
  char* to = static_cast<char*>(out.data());
  parallel_for(0, static_cast<int64_t>(pieces.size()), [&](int64_t begin, int64_t end) {
    pieces.read(static_cast<size_t>(begin), static_cast<size_t>(end), to + begin);
  }, int64_t{1} << 20);
  return out;
}

Result<CheckpointLayout> detect_layout(const std::vector<std::string>& names) {
  bool original = false, diffusers = false;
  for (const auto& n : names) {
    if (is_lora_tensor_name(n)) {
      return invalid_argument("tensor " + quote(n) +
                              " is a LoRA factor: this is an adapter, not a checkpoint (give it to generate or serve "
                              "with --lora; vortex inspect describes it)");
    }
    if (starts_with(n, "blocks.") || starts_with(n, "video_patch_proj.") || starts_with(n, "final_layer.") ||
        starts_with(n, "token_refiner.blocks.") || n == "rope.inv_freq") {
      original = true;
    } else if (starts_with(n, "transformer_blocks.") || starts_with(n, "proj_in.") || starts_with(n, "norm_out.") ||
               starts_with(n, "token_refiner.refiner_blocks.")) {
      diffusers = true;
    }
  }
  if (original && diffusers) return invalid_argument("checkpoint mixes original and diffusers tensor names");
  if (!original && !diffusers) return invalid_argument("checkpoint holds no MiniMax-H3 transformer tensors");
  return original ? CheckpointLayout::kOriginal : CheckpointLayout::kDiffusers;
}

bool is_fp32_island(const std::string& name) {
  return starts_with(name, "proj_in.") || starts_with(name, "audio_proj_in.") || starts_with(name, "time_embedder.") ||
         starts_with(name, "proj_out.") || starts_with(name, "audio_proj_out.");
}

std::vector<TensorSpec> diffusers_schema(const H3Config& c) {
  const int64_t C = c.hidden_size, inner = c.inner_dim(), D = c.attention_head_dim, F = c.ffn_dim;
  const int64_t TE = c.time_embed_dim, TH = c.time_embed_hidden_dim, P = c.video_patch_dim();
  std::vector<TensorSpec> s;
  auto add = [&](const std::string& name, Shape shape) { s.push_back({name, shape, is_fp32_island(name)}); };
  add("proj_in.weight", {C, P});
  add("proj_in.bias", {C});
  add("audio_proj_in.weight", {C, c.audio_in_channels});
  add("audio_proj_in.bias", {C});
  add("context_embedder.weight", {C, c.text_dim});
  add("context_embedder.bias", {C});
  add("time_embedder.linear_1.weight", {TH, c.freq_dim});
  add("time_embedder.linear_1.bias", {TH});
  add("time_embedder.linear_2.weight", {TE, TH});
  add("time_embedder.linear_2.bias", {TE});
  auto add_block = [&](const std::string& p, bool adaln) {
    add(p + ".norm1.weight", {C});
    add(p + ".attn.to_q.weight", {inner, C});
    add(p + ".attn.to_k.weight", {inner, C});
    add(p + ".attn.to_v.weight", {inner, C});
    add(p + ".attn.norm_q.weight", {D});
    add(p + ".attn.norm_k.weight", {D});
    add(p + ".attn.to_out.0.weight", {C, inner});
    add(p + ".norm2.weight", {C});
    add(p + ".ff.net.0.proj.weight", {2 * F, C});
    add(p + ".ff.net.2.weight", {C, F});
    if (adaln) {
      add(p + ".adaln_proj.linear.weight", {6 * kNumModalities * C, TE});
      add(p + ".adaln_proj.linear.bias", {6 * kNumModalities * C});
    }
  };
  for (int i = 0; i < c.num_refiner_layers; ++i) add_block("token_refiner.refiner_blocks." + std::to_string(i), false);
  add("token_refiner.final_norm.weight", {C});
  for (int i = 0; i < c.num_layers; ++i) add_block("transformer_blocks." + std::to_string(i), true);
  add("norm_out.norm.weight", {C});
  add("norm_out.linear.weight", {2 * C, TE});
  add("norm_out.linear.bias", {2 * C});
  add("proj_out.weight", {P, C});
  add("proj_out.bias", {P});
  add("audio_proj_out.weight", {c.audio_in_channels, C});
  add("audio_proj_out.bias", {c.audio_in_channels});
  return s;
}

namespace {

// A fused layer's parts, each as its rows of the fused weight (diffusers names): QKV is fused per
// head, head h's q, k and v being rows (3h + p) · D ... + D; FC1 is [gate; value] and becomes
// [value; gate]. None for any other tensor.
std::vector<std::pair<std::string, RowRuns>> fused_parts(const std::string& diffusers_name, const H3Config& config) {
  const int64_t heads = config.num_attention_heads, D = config.attention_head_dim, F = config.ffn_dim;
  if (ends_with(diffusers_name, ".attn.qkv_proj.weight")) {
    const std::string prefix = diffusers_name.substr(0, diffusers_name.size() - std::strlen("qkv_proj.weight"));
    const char* names[3] = {"to_q.weight", "to_k.weight", "to_v.weight"};
    std::vector<std::pair<std::string, RowRuns>> parts;
    for (int64_t p = 0; p < 3; ++p) {
      RowRuns runs;
      for (int64_t h = 0; h < heads; ++h) runs.emplace_back((h * 3 + p) * D, D);
      parts.emplace_back(prefix + names[p], std::move(runs));
    }
    return parts;
  }
  if (ends_with(diffusers_name, ".mlp.fc1.weight")) {
    std::string name = diffusers_name;
    replace_once(name, ".mlp.fc1.weight", ".ff.net.0.proj.weight");
    return {{name, RowRuns{{F, F}, {0, F}}}};
  }
  return {};
}

}  // namespace

HostWeights::HostWeights(NamedTensors diffusers) {
  for (auto& [name, tensor] : diffusers) {
    if (by_name_.emplace(name, Entry{std::move(tensor), {}, {}}).second) order_.push_back(name);
  }
}

Result<HostWeights> HostWeights::original(NamedTensors original, const H3Config& config) {
  const int64_t inner = config.inner_dim();
  // Side tensors are checked here, where a fused layer's are still beside the weight they belong to.
  VORTEX_RETURN_IF_ERROR(check_scaled_weights(original).status());
  const auto is_fused = [&](const std::string& weight_name) {
    return !fused_parts(original_name_to_diffusers(weight_name), config).empty();
  };
  std::unordered_map<std::string, const Tensor*> stored;
  for (const auto& [name, tensor] : original) stored[name] = &tensor;
  HostWeights w;
  for (const auto& [name, tensor] : original) {
    if (name == "rope.inv_freq") continue;  // recomputed from rope_theta and rope_freq_dim
    // A fused layer's side tensors go with its parts.
    if (is_quantization_side_tensor(name)) {
      const size_t dot = name.rfind('.');
      if (dot != std::string::npos && is_fused(name.substr(0, dot) + ".weight")) continue;
    }
    const std::string target = original_name_to_diffusers(name);
    auto parts = fused_parts(target, config);
    if (parts.empty()) {
      if (w.by_name_.emplace(target, Entry{tensor, {}, {}}).second) w.order_.push_back(target);
      continue;
    }
    const int64_t rows = parts.size() == 3 ? 3 * inner : 2 * config.ffn_dim;
    VORTEX_RETURN_IF_ERROR(expect_rows(name, logical_weight_shape(tensor), rows));
    NamedTensors& fused = w.fused_[name];
    fused.emplace_back(name, tensor);
    for (const std::string& side : side_tensor_names_of(name)) {
      if (const auto it = stored.find(side); it != stored.end()) fused.emplace_back(side, *it->second);
    }
    for (auto& [part, runs] : parts) {
      if (w.by_name_.emplace(part, Entry{Tensor(), name, std::move(runs)}).second) w.order_.push_back(part);
    }
  }
  return w;
}

Result<NamedTensors> HostWeights::weight(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) return NamedTensors{};
  const Entry& e = it->second;
  if (!e.fused.empty()) {
    const NamedTensors& fused = fused_.at(e.fused);
    const Tensor& stored = fused.front().second;
    if (is_quantized_storage(stored.dtype())) return take_quantized_rows(fused, e.fused, e.runs, name);
    return NamedTensors{{name, gather_rows(stored, e.runs)}};
  }
  NamedTensors out = {{name, e.tensor}};
  if (is_quantized_storage(e.tensor.dtype())) {
    for (const std::string& side : side_tensor_names_of(name)) {
      const auto s = by_name_.find(side);
      if (s != by_name_.end() && s->second.fused.empty()) out.emplace_back(side, s->second.tensor);
    }
  }
  return out;
}

Shape HostWeights::StoredRows::shape() const {
  Shape shape = stored.front().second.shape();
  shape[0] = row_count(runs);
  return shape;
}

std::optional<HostWeights::StoredRows> HostWeights::stored_rows(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end() || it->second.fused.empty()) return std::nullopt;
  return StoredRows{fused_.at(it->second.fused), it->second.runs};
}

Result<NamedTensors> HostWeights::all() const {
  NamedTensors out;
  for (const std::string& name : order_) {
    const Entry& e = by_name_.at(name);
    if (e.fused.empty()) {
      out.emplace_back(name, e.tensor);
      continue;
    }
    VORTEX_ASSIGN_OR_RETURN(NamedTensors part, weight(name));
    for (auto& entry : part) out.push_back(std::move(entry));
  }
  return out;
}

Result<NamedTensors> original_to_diffusers(const NamedTensors& original, const H3Config& config) {
  VORTEX_ASSIGN_OR_RETURN(const HostWeights weights, HostWeights::original(original, config));
  return weights.all();
}

Result<NamedTensors> diffusers_to_original(const NamedTensors& diffusers, const H3Config& config) {
  const int64_t heads = config.num_attention_heads, D = config.attention_head_dim, inner = config.inner_dim();
  std::unordered_map<std::string, Tensor> by_name;
  for (const auto& [name, tensor] : diffusers) by_name[name] = tensor;
  NamedTensors out;
  for (const auto& [name, tensor] : diffusers) {
    if (ends_with(name, ".attn.to_k.weight") || ends_with(name, ".attn.to_v.weight")) continue;
    std::string target = diffusers_name_to_original(name);
    if (ends_with(name, ".attn.to_q.weight")) {
      const std::string prefix = name.substr(0, name.size() - std::strlen("to_q.weight"));
      Tensor parts[3];
      const char* suffixes[3] = {"to_q.weight", "to_k.weight", "to_v.weight"};
      for (int p = 0; p < 3; ++p) {
        auto it = by_name.find(prefix + suffixes[p]);
        if (it == by_name.end()) return invalid_argument("missing tensor '" + prefix + suffixes[p] + "'");
        VORTEX_RETURN_IF_ERROR(expect_rows(it->first, it->second.shape(), inner));
        parts[p] = it->second.contiguous();
        if (parts[p].dtype() != parts[0].dtype()) {
          return invalid_argument("tensor '" + prefix + suffixes[p] + "': dtype differs from to_q");
        }
      }
      Tensor dst = new_like_rows(parts[0], 3 * inner);
      for (int64_t h = 0; h < heads; ++h)
        for (int p = 0; p < 3; ++p) copy_rows(parts[p], h * D, dst, (h * 3 + p) * D, D);
      replace_once(target, ".attn.to_q.weight", ".attn.qkv_proj.weight");
      out.emplace_back(target, dst);
    } else if (ends_with(name, ".ff.net.0.proj.weight")) {
      VORTEX_RETURN_IF_ERROR(expect_rows(name, tensor.shape(), 2 * int64_t(config.ffn_dim)));
      Tensor src = tensor.contiguous();
      Tensor dst = new_like_rows(src, 2 * config.ffn_dim);
      copy_rows(src, config.ffn_dim, dst, 0, config.ffn_dim);  // gate first
      copy_rows(src, 0, dst, config.ffn_dim, config.ffn_dim);  // then value
      replace_once(target, ".ff.net.0.proj.weight", ".mlp.fc1.weight");
      out.emplace_back(target, dst);
    } else {
      out.emplace_back(target, tensor);
    }
  }
  // The original layout ships the rotary frequencies; they are a pure function of the config.
  const std::vector<float> frequencies = rope_inverse_frequencies(config);
  out.emplace_back("rope.inv_freq", Tensor::from_f32(frequencies, {static_cast<int64_t>(frequencies.size())}));
  return out;
}

Result<NamedTensors> read_all(const ShardedCheckpoint& checkpoint) {
  NamedTensors out;
  for (const auto& name : checkpoint.names()) {
    VORTEX_ASSIGN_OR_RETURN(Tensor t, checkpoint.get(name));
    out.emplace_back(name, t);
  }
  Result<NamedTensors> descriptors = comfy_quant_from_header(checkpoint.metadata());
  if (!descriptors.ok()) return descriptors.status().with_context(checkpoint.path());
  for (auto& [name, tensor] : *descriptors) {
    if (!checkpoint.has(name)) out.emplace_back(name, std::move(tensor));
  }
  return out;
}

Result<H3Config> infer_config(const NamedShapes& stored, CheckpointLayout layout) {
  // Renames alone give the shapes inference needs; of an original fused QKV, its first third.
  std::unordered_map<std::string, Shape> t;
  for (const auto& [name, entry] : stored) {
    if (layout == CheckpointLayout::kDiffusers) {
      t[name] = entry.shape;
      continue;
    }
    std::string target = original_name_to_diffusers(name);
    Shape shape = entry.shape;
    if (ends_with(target, ".attn.qkv_proj.weight") && shape.rank() == 2) {
      replace_once(target, ".attn.qkv_proj.weight", ".attn.to_q.weight");
      shape[0] /= 3;
    }
    t[target] = shape;
  }
  auto need = [&](const std::string& name, int rank) -> Result<Shape> {
    auto it = t.find(name);
    if (it == t.end()) return invalid_argument("cannot infer the config: missing tensor '" + name + "'");
    if (it->second.rank() != rank) return invalid_argument("tensor '" + name + "': unexpected rank");
    return it->second;
  };
  H3Config c;  // eps, theta and patch size keep the released defaults
  VORTEX_ASSIGN_OR_RETURN(const Shape proj_in, need("proj_in.weight", 2));
  VORTEX_ASSIGN_OR_RETURN(const Shape audio_in, need("audio_proj_in.weight", 2));
  VORTEX_ASSIGN_OR_RETURN(const Shape context, need("context_embedder.weight", 2));
  VORTEX_ASSIGN_OR_RETURN(const Shape lin1, need("time_embedder.linear_1.weight", 2));
  VORTEX_ASSIGN_OR_RETURN(const Shape lin2, need("time_embedder.linear_2.weight", 2));
  c.hidden_size = static_cast<int>(proj_in[0]);
  const int patch = c.patch_size[0] * c.patch_size[1] * c.patch_size[2];
  c.in_channels = static_cast<int>(proj_in[1] / patch);
  c.audio_in_channels = static_cast<int>(audio_in[1]);
  c.text_dim = static_cast<int>(context[1]);
  c.freq_dim = static_cast<int>(lin1[1]);
  c.time_embed_hidden_dim = static_cast<int>(lin1[0]);
  c.time_embed_dim = static_cast<int>(lin2[0]);
  c.num_layers = 0;
  while (t.count("transformer_blocks." + std::to_string(c.num_layers) + ".norm1.weight")) ++c.num_layers;
  c.num_refiner_layers = 0;
  while (t.count("token_refiner.refiner_blocks." + std::to_string(c.num_refiner_layers) + ".norm1.weight")) {
    ++c.num_refiner_layers;
  }
  const std::string first = c.num_layers > 0 ? "transformer_blocks.0" : "token_refiner.refiner_blocks.0";
  VORTEX_ASSIGN_OR_RETURN(const Shape norm_q, need(first + ".attn.norm_q.weight", 1));
  VORTEX_ASSIGN_OR_RETURN(const Shape to_q, need(first + ".attn.to_q.weight", 2));
  VORTEX_ASSIGN_OR_RETURN(const Shape fc2, need(first + ".ff.net.2.weight", 2));
  c.attention_head_dim = static_cast<int>(norm_q[0]);
  c.num_attention_heads = static_cast<int>(to_q[0] / c.attention_head_dim);
  c.ffn_dim = static_cast<int>(fc2[1]);
  c.rope_freq_dim = std::min(16, c.attention_head_dim / 6);
  for (const auto& [name, entry] : stored) {
    if (name == "rope.inv_freq") c.rope_freq_dim = static_cast<int>(entry.shape.numel());
  }
  VORTEX_RETURN_IF_ERROR(c.validate());
  return c;
}

const char* config_source_name(ConfigSource source) {
  switch (source) {
    case ConfigSource::kConfigJson: return "config.json";
    case ConfigSource::kMetadata: return "safetensors metadata";
    case ConfigSource::kInferred: return "inferred from tensor shapes";
  }
  return "unknown";
}

Shape logical_weight_shape(const Tensor& stored) {
  if (stored.dtype() != DType::kU8 || stored.rank() != 2) return stored.shape();
  return Shape{stored.size(0), 2 * stored.size(1)};
}

NamedShapes shapes_of(const NamedTensors& tensors) {
  // GGUF blocks' shapes need their type (scaled_weights.h); a malformed one is check_scaled_weights' error.
  std::unordered_map<std::string, uint32_t> ggml_types;
  for (const auto& [name, tensor] : tensors) {
    if (ends_with(name, kGgmlTypeSuffix) && tensor.dtype() == DType::kI32 && tensor.numel() == 1) {
      const std::string weight = name.substr(0, name.size() - std::strlen(kGgmlTypeSuffix)) + ".weight";
      ggml_types[weight] = static_cast<uint32_t>(tensor.contiguous().data_as<int32_t>()[0]);
    }
  }
  NamedShapes out;
  out.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const auto type = ggml_types.find(name);
    Shape shape = logical_weight_shape(tensor);
    if (type != ggml_types.end() && tensor.rank() == 2 && ggml_block_bytes(type->second) > 0) {
      shape = Shape{tensor.size(0), ggml_row_values(type->second, tensor.size(1))};
    }
    out.emplace_back(name, ShapeEntry{shape, tensor.dtype()});
  }
  return out;
}

Status validate_against_schema(const NamedTensors& tensors, const H3Config& config) {
  return validate_against_schema(shapes_of(tensors), config);
}

Status validate_against_schema(const NamedShapes& tensors, const H3Config& config) {
  std::unordered_map<std::string, const ShapeEntry*> present;
  for (const auto& [name, entry] : tensors) {
    if (!present.emplace(name, &entry).second) return invalid_argument("tensor '" + name + "' appears twice");
  }
  std::set<std::string> expected;
  for (const auto& spec : diffusers_schema(config)) {
    expected.insert(spec.name);
    auto it = present.find(spec.name);
    if (it == present.end()) return invalid_argument("missing tensor '" + spec.name + "'");
    const ShapeEntry& t = *it->second;
    if (t.shape != spec.shape) {
      return invalid_argument("tensor '" + spec.name + "': shape " + t.shape.to_string() + " but the config expects " +
                              spec.shape.to_string());
    }
    // Quantized weights come with their scales, which the loaders apply first (scaled_weights.h).
    const DType d = t.dtype;
    if (d != DType::kF32 && d != DType::kBF16 && d != DType::kF16 && d != DType::kF8E4M3 && d != DType::kF8E5M2 &&
        d != DType::kU8) {
      return invalid_argument("tensor '" + spec.name + "': dtype " + dtype_name(d) +
                              " is not supported yet (F32, BF16, F16, F8_E4M3 / F8_E5M2 with a scale, NVFP4 or "
                              "GGUF blocks as U8)");
    }
  }
  for (const auto& [name, tensor] : tensors) {
    if (!expected.count(name)) return invalid_argument("unexpected tensor '" + name + "' for this config");
  }
  return ok_status();
}

}  // namespace vortex::h3
