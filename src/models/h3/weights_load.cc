// Assembling H3Weights from diffusers-named tensors, and the one-call model loader.
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "models/h3/model_source.h"
#include "models/h3/scaled_weights.h"
#include "models/h3/weights.h"

namespace vortex::h3 {

namespace {

class TensorTable {
 public:
  TensorTable(const NamedTensors& tensors, DType dtype) : dtype_(dtype) {
    for (const auto& [name, tensor] : tensors) by_name_[name] = tensor;
  }

  // The tensor converted to its storage dtype (fp32 islands stay F32), contiguous.
  Result<Tensor> take(const std::string& name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return invalid_argument("missing tensor '" + name + "'");
    const DType want = is_fp32_island(name) ? DType::kF32 : dtype_;
    if (it->second.dtype() == want) return it->second.contiguous();
    return it->second.to(want);
  }

  Result<LinearWeights> linear(const std::string& prefix, bool bias) const {
    LinearWeights l;
    VORTEX_ASSIGN_OR_RETURN(l.weight, take(prefix + ".weight"));
    if (bias) {
      VORTEX_ASSIGN_OR_RETURN(l.bias, take(prefix + ".bias"));
    }
    return l;
  }

  // Stacks to_q, to_k, to_v into one [3 * inner, C] weight.
  Result<LinearWeights> fused_qkv(const std::string& prefix) const {
    Tensor parts[3];
    const char* names[3] = {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight"};
    for (int p = 0; p < 3; ++p) {
      VORTEX_ASSIGN_OR_RETURN(parts[p], take(prefix + names[p]));
    }
    const int64_t rows = parts[0].size(0), cols = parts[0].size(1);
    Tensor fused = Tensor::empty({3 * rows, cols}, parts[0].dtype());
    const size_t bytes = parts[0].nbytes();
    for (int p = 0; p < 3; ++p) std::memcpy(static_cast<char*>(fused.data()) + p * bytes, parts[p].data(), bytes);
    return LinearWeights{fused, Tensor()};
  }

  Result<BlockWeights> block(const std::string& p, bool adaln) const {
    BlockWeights b;
    VORTEX_ASSIGN_OR_RETURN(b.norm1, take(p + ".norm1.weight"));
    VORTEX_ASSIGN_OR_RETURN(b.norm2, take(p + ".norm2.weight"));
    VORTEX_ASSIGN_OR_RETURN(b.norm_q, take(p + ".attn.norm_q.weight"));
    VORTEX_ASSIGN_OR_RETURN(b.norm_k, take(p + ".attn.norm_k.weight"));
    VORTEX_ASSIGN_OR_RETURN(b.qkv, fused_qkv(p));
    VORTEX_ASSIGN_OR_RETURN(b.out, linear(p + ".attn.to_out.0", false));
    VORTEX_ASSIGN_OR_RETURN(b.fc1, linear(p + ".ff.net.0.proj", false));
    VORTEX_ASSIGN_OR_RETURN(b.fc2, linear(p + ".ff.net.2", false));
    if (adaln) {
      VORTEX_ASSIGN_OR_RETURN(b.adaln, linear(p + ".adaln_proj.linear", true));
    }
    return b;
  }

 private:
  DType dtype_;
  std::unordered_map<std::string, Tensor> by_name_;
};

}  // namespace

Result<H3Weights> assemble_weights(const NamedTensors& tensors, const H3Config& config, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return invalid_argument(std::string("model dtype ") + dtype_name(dtype) + " is not supported (F32 or BF16)");
  }
  VORTEX_RETURN_IF_ERROR(validate_against_schema(tensors, config));
  const TensorTable table(tensors, dtype);
  H3Weights w;
  w.config = config;
  w.dtype = dtype;
  VORTEX_ASSIGN_OR_RETURN(w.proj_in, table.linear("proj_in", true));
  VORTEX_ASSIGN_OR_RETURN(w.audio_proj_in, table.linear("audio_proj_in", true));
  VORTEX_ASSIGN_OR_RETURN(w.context_embedder, table.linear("context_embedder", true));
  VORTEX_ASSIGN_OR_RETURN(w.time_linear_1, table.linear("time_embedder.linear_1", true));
  VORTEX_ASSIGN_OR_RETURN(w.time_linear_2, table.linear("time_embedder.linear_2", true));
  for (int i = 0; i < config.num_refiner_layers; ++i) {
    VORTEX_ASSIGN_OR_RETURN(BlockWeights b, table.block("token_refiner.refiner_blocks." + std::to_string(i), false));
    w.refiner.push_back(std::move(b));
  }
  VORTEX_ASSIGN_OR_RETURN(w.refiner_final_norm, table.take("token_refiner.final_norm.weight"));
  for (int i = 0; i < config.num_layers; ++i) {
    VORTEX_ASSIGN_OR_RETURN(BlockWeights b, table.block("transformer_blocks." + std::to_string(i), true));
    w.blocks.push_back(std::move(b));
  }
  VORTEX_ASSIGN_OR_RETURN(w.norm_out_norm, table.take("norm_out.norm.weight"));
  VORTEX_ASSIGN_OR_RETURN(w.norm_out_linear, table.linear("norm_out.linear", true));
  VORTEX_ASSIGN_OR_RETURN(w.proj_out, table.linear("proj_out", true));
  VORTEX_ASSIGN_OR_RETURN(w.audio_proj_out, table.linear("audio_proj_out", true));
  return w;
}

Result<LoadedModel> load_model(const std::string& path, DType dtype, const TensorTransform& transform) {
  auto checkpoint = ModelSource::open(path);
  if (!checkpoint.ok()) return checkpoint.status();
  LoadedModel model;
  auto layout = detect_layout(checkpoint->names());
  if (!layout.ok()) return layout.status().with_context(path);
  model.layout = *layout;
  auto config = resolve_config(*checkpoint);
  if (!config.ok()) return config.status();
  model.config = *config;
  VORTEX_ASSIGN_OR_RETURN(NamedTensors stored, checkpoint->tensors());
  auto dequantized = dequantize_scaled_weights(stored, dtype);
  if (!dequantized.ok()) return dequantized.status().with_context(path);
  NamedTensors tensors = std::move(*dequantized);
  if (model.layout == CheckpointLayout::kOriginal) {
    auto converted = original_to_diffusers(tensors, model.config);
    if (!converted.ok()) return converted.status().with_context(path);
    tensors = std::move(*converted);
  }
  if (transform) VORTEX_RETURN_IF_ERROR(transform(tensors, model.config));
  auto weights = assemble_weights(tensors, model.config, dtype);
  if (!weights.ok()) return weights.status().with_context(path + " (" + layout_name(model.layout) + " layout)");
  model.weights = std::move(*weights);
  return model;
}

}  // namespace vortex::h3
