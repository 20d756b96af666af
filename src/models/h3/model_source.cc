#include "models/h3/model_source.h"

#include <cstring>
#include <filesystem>

#include "core/quote.h"
#include "models/h3/checkpoint_writer.h"
#include "models/h3/scaled_weights.h"

namespace vortex::h3 {

namespace fs = std::filesystem;

namespace {

// What a GGUF tensor loads as: its stored float dtype, or bf16 / F32 (an fp32 island) when quantized.
DType gguf_load_dtype(const GgufTensorInfo& info) {
  if (ggml_type_is_float(info.ggml_type)) return ggml_float_dtype(info.ggml_type);
  return is_fp32_island(original_name_to_diffusers(info.name)) ? DType::kF32 : DType::kBF16;
}

}  // namespace

Result<ModelSource> ModelSource::open(const std::string& path) {
  ModelSource source;
  source.path_ = path;
  const bool gguf = path.ends_with(".gguf") || (fs::is_regular_file(path) && is_gguf_file(path));
  if (gguf) {
    VORTEX_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
    source.gguf_ = std::make_shared<GgufFile>(std::move(file));
    for (const GgufTensorInfo& info : source.gguf_->tensors()) source.names_.push_back(info.name);
    for (const auto& [key, value] : source.gguf_->metadata()) {
      if (value.kind == GgufValue::Kind::kString) source.metadata_[key] = std::get<std::string>(value.scalar);
    }
    return source;
  }
  VORTEX_ASSIGN_OR_RETURN(ShardedCheckpoint checkpoint, ShardedCheckpoint::open(path));
  source.safetensors_ = std::make_shared<ShardedCheckpoint>(std::move(checkpoint));
  source.names_ = source.safetensors_->names();
  source.metadata_ = source.safetensors_->metadata();
  VORTEX_ASSIGN_OR_RETURN(source.views_, read_all(*source.safetensors_));
  for (size_t i = 0; i < source.views_.size(); ++i) source.view_index_[source.views_[i].first] = i;
  return source;
}

NamedShapes ModelSource::shapes() const {
  if (!gguf_) return shapes_of(views_);
  NamedShapes out;
  for (const GgufTensorInfo& info : gguf_->tensors()) out.emplace_back(info.name, ShapeEntry{info.shape, gguf_load_dtype(info)});
  return out;
}

Result<Tensor> ModelSource::tensor(const std::string& name) const {
  if (!gguf_) {
    const auto it = view_index_.find(name);
    if (it == view_index_.end()) return not_found(path_ + ": no tensor " + quote(name));
    return views_[it->second].second;
  }
  VORTEX_ASSIGN_OR_RETURN(const GgufTensorInfo info, gguf_->info(name));
  return gguf_->get(name, gguf_load_dtype(info));
}

Result<NamedTensors> ModelSource::tensors() const {
  if (!gguf_) return views_;
  NamedTensors out;
  out.reserve(names_.size());
  for (const GgufTensorInfo& info : gguf_->tensors()) {
    if (!ggml_type_is_float(info.ggml_type) && info.name.ends_with(".weight")) {
      // A matrix of whole-block rows stays as stored (scaled_weights.h); a reshaped one is dequantized.
      if (Result<Tensor> blocks = gguf_->blocks(info.name); blocks.ok()) {
        out.emplace_back(info.name, std::move(*blocks));
        out.emplace_back(info.name.substr(0, info.name.size() - std::strlen(".weight")) + kGgmlTypeSuffix,
                         ggml_type_tensor(info.ggml_type));
        continue;
      }
    }
    VORTEX_ASSIGN_OR_RETURN(Tensor t, tensor(info.name));
    out.emplace_back(info.name, std::move(t));
  }
  return out;
}

Result<H3Config> resolve_config(const ModelSource& checkpoint, ConfigSource* source) {
  ConfigSource ignored;
  ConfigSource& from = source ? *source : ignored;
  const std::string& path = checkpoint.path();
  const fs::path p(path);
  const fs::path folder = fs::is_directory(p) ? p : p.parent_path();
  const fs::path config_json = folder / "config.json";
  from = ConfigSource::kConfigJson;
  if (fs::exists(config_json)) return config_from_file(config_json.string());
  const auto& meta = checkpoint.metadata();
  from = ConfigSource::kMetadata;
  if (auto it = meta.find("config"); it != meta.end()) {
    auto config = config_from_json_string(it->second);
    if (!config.ok()) return config.status().with_context(path + ": metadata 'config'");
    return config;
  }
  from = ConfigSource::kInferred;
  VORTEX_ASSIGN_OR_RETURN(const CheckpointLayout layout, detect_layout(checkpoint.names()));
  return infer_config(checkpoint.shapes(), layout);
}

Status validate_model_source(const ModelSource& checkpoint, CheckpointLayout layout, const H3Config& config) {
  if (!checkpoint.gguf()) {
    VORTEX_ASSIGN_OR_RETURN(const NamedTensors tensors, checkpoint.tensors());
    return validate_checkpoint_tensors(tensors, layout, config);
  }
  return validate_checkpoint_shapes(checkpoint.shapes(), layout, config);
}

}  // namespace vortex::h3
