#include "models/h3/checkpoint_writer.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "models/h3/model_source.h"
#include "models/h3/scaled_weights.h"

namespace vortex::h3 {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kModelClass = "MiniMaxH3Transformer3DModel";
constexpr const char* kFp8QuantizationNote =
    "fp8: the transformer blocks' to_q, to_k, to_v, ff.net.0.proj and ff.net.2 weights (in the original layout "
    "qkv_proj, mlp.fc1 and mlp.fc2) in F8_E4M3 with one F32 scale per output channel beside each (weight_scale; "
    "w = q * scale)";

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// "transformer_blocks.12" from "transformer_blocks.12.attn.to_q.weight" (prefix = "transformer_blocks.").
std::string block_name(const std::string& name, const std::string& prefix) {
  return name.substr(0, name.find('.', prefix.size()));
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

// The group's tensors in spec order, after checking that they are exactly its specs: the writer's
// guard on the GroupSource contract, so a faulty source cannot produce a checkpoint that loads wrong.
Result<NamedTensors> in_spec_order(NamedTensors tensors, const WeightGroup& group) {
  std::set<std::string> expected;
  for (const TensorSpec& spec : group.specs) expected.insert(spec.name);
  std::unordered_map<std::string, size_t> position;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].first;
    if (!expected.count(name)) return invalid_argument("group " + quote(group.name) + ": unexpected tensor " + quote(name));
    if (!position.emplace(name, i).second) {
      return invalid_argument("group " + quote(group.name) + ": tensor " + quote(name) + " given twice");
    }
  }
  NamedTensors ordered;
  for (const TensorSpec& spec : group.specs) {
    const auto it = position.find(spec.name);
    if (it == position.end()) return invalid_argument("group " + quote(group.name) + ": missing tensor " + quote(spec.name));
    auto& entry = tensors[it->second];
    if (entry.second.shape() != spec.shape) {
      return invalid_argument("tensor " + quote(spec.name) + ": shape " + entry.second.shape().to_string() +
                              " but the config expects " + spec.shape.to_string());
    }
    ordered.push_back(std::move(entry));
  }
  return ordered;
}

Status check_cancel(const CheckpointWriteOptions& options) {
  if (options.cancel && options.cancel->load()) return io_error("interrupted; nothing was written");
  return ok_status();
}

// Collects tensors into shards of at most max_bytes and writes each when full. Shards are first
// written as part-0000k.safetensors, since their final names count the shards, known only at the end.
class ShardWriter {
 public:
  ShardWriter(fs::path folder, std::map<std::string, std::string> metadata, const CheckpointWriteOptions& options)
      : folder_(std::move(folder)), metadata_(std::move(metadata)), options_(options) {}

  void set_group(size_t index, size_t count) { group_note_ = std::to_string(index) + "/" + std::to_string(count); }

  Status add(std::string name, Tensor tensor) {
    const uint64_t bytes = tensor.nbytes();
    if (!pending_.empty() && pending_bytes_ + bytes > options_.max_shard_bytes) VORTEX_RETURN_IF_ERROR(flush());
    pending_.emplace_back(std::move(name), std::move(tensor));
    pending_bytes_ += bytes;
    return ok_status();
  }

  // Writes the last shard, renames all to model-0000k-of-0000N.safetensors and writes the index.
  Status finish() {
    if (!pending_.empty()) VORTEX_RETURN_IF_ERROR(flush());
    Json weight_map = Json::object();
    for (size_t k = 0; k < shard_tensors_.size(); ++k) {
      char final_name[64];
      std::snprintf(final_name, sizeof(final_name), "model-%05zu-of-%05zu.safetensors", k + 1, shard_tensors_.size());
      std::error_code ec;
      fs::rename(part_path(k), folder_ / final_name, ec);
      if (ec) return io_error((folder_ / final_name).string() + ": cannot rename the shard: " + ec.message());
      for (const std::string& name : shard_tensors_[k]) weight_map[name] = final_name;
    }
    Json index;
    index["metadata"] = {{"total_size", total_bytes_}};
    index["weight_map"] = std::move(weight_map);
    return write_file_atomically((folder_ / kIndexName).string(), index.dump(2) + "\n");
  }

 private:
  fs::path part_path(size_t k) const {
    char name[64];
    std::snprintf(name, sizeof(name), "part-%05zu.safetensors", k + 1);
    return folder_ / name;
  }

  Status flush() {
    VORTEX_RETURN_IF_ERROR(check_cancel(options_));
    const size_t k = shard_tensors_.size();
    VORTEX_RETURN_IF_ERROR(write_safetensors(part_path(k).string(), pending_, metadata_));
    std::vector<std::string> names;
    for (const auto& entry : pending_) names.push_back(entry.first);
    shard_tensors_.push_back(std::move(names));
    total_bytes_ += pending_bytes_;
    total_tensors_ += pending_.size();
    if (options_.progress) {
      options_.progress("shard " + std::to_string(k + 1) + ": " + std::to_string(pending_.size()) + " tensors, " +
                        human_bytes(pending_bytes_) + "; " + std::to_string(total_tensors_) + " tensors, " +
                        human_bytes(total_bytes_) + " written (group " + group_note_ + ")");
    }
    pending_.clear();  // releases generated or converted tensors before the next group is made
    pending_bytes_ = 0;
    return ok_status();
  }

  fs::path folder_;
  std::map<std::string, std::string> metadata_;
  const CheckpointWriteOptions& options_;
  NamedTensors pending_;
  uint64_t pending_bytes_ = 0;
  std::vector<std::vector<std::string>> shard_tensors_;  // names in each written shard
  uint64_t total_bytes_ = 0;
  size_t total_tensors_ = 0;
  std::string group_note_;
};

Status write_contents(const fs::path& folder, const H3Config& config, const GroupSource& source,
                      const CheckpointWriteOptions& options) {
  std::map<std::string, std::string> metadata = {
      {"config", config.to_json_string()},
      {"layout", layout_name(options.layout)},
      // Hugging Face loaders reject a safetensors file whose "format" names no known framework.
      {"format", "pt"},
  };
  if (options.quantize_fp8) metadata["quantization"] = kFp8QuantizationNote;
  ShardWriter shards(folder, metadata, options);
  const std::vector<WeightGroup> groups = schema_groups(config);
  for (size_t g = 0; g < groups.size(); ++g) {
    VORTEX_RETURN_IF_ERROR(check_cancel(options));
    Result<NamedTensors> produced = source(groups[g]);
    if (!produced.ok()) return produced.status();
    VORTEX_ASSIGN_OR_RETURN(NamedTensors tensors, in_spec_order(std::move(produced).value(), groups[g]));
    if (options.layout == CheckpointLayout::kOriginal) {
      VORTEX_ASSIGN_OR_RETURN(tensors, diffusers_to_original(tensors, config));
      // diffusers_to_original adds rope.inv_freq to whatever it converts; keep the first group's only.
      if (g > 0) std::erase_if(tensors, [](const auto& entry) { return entry.first == "rope.inv_freq"; });
    }
    // After the layout conversion: each row keeps its own scale, so a fused qkv_proj or mlp.fc1 is
    // quantized into the codes and scales of its diffusers parts, rows reordered.
    if (options.quantize_fp8) {
      VORTEX_ASSIGN_OR_RETURN(tensors, quantize_linears_fp8(tensors));
    }
    shards.set_group(g + 1, groups.size());
    for (auto& [name, tensor] : tensors) VORTEX_RETURN_IF_ERROR(shards.add(std::move(name), std::move(tensor)));
  }
  VORTEX_RETURN_IF_ERROR(shards.finish());
  Json diffusers_config = config.to_json();
  diffusers_config["_class_name"] = kModelClass;
  return write_file_atomically((folder / "config.json").string(), diffusers_config.dump(2) + "\n");
}

// The output folder without trailing slashes (its name is the base of the temp folder's), after
// checking that it may be written.
Result<fs::path> output_folder(std::string dir, bool replace_existing) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty()) return invalid_argument("the output folder name is empty");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) return fs::path(dir);
  if (ec) return io_error(dir + ": cannot stat: " + ec.message());
  if (!fs::is_directory(st)) return invalid_argument(dir + ": exists and is not a folder");
  const bool empty = fs::is_empty(dir, ec);
  if (ec) return io_error(dir + ": cannot list the folder: " + ec.message());
  if (!empty && !replace_existing) return invalid_argument(dir + ": the folder exists and is not empty");
  return fs::path(dir);
}

// Moves the finished temp folder to `dir`. An existing non-empty `dir` is moved aside first (a
// rename cannot replace a non-empty folder), restored if the second rename fails, and removed last.
Status publish(const fs::path& tmp, const fs::path& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec) && !fs::is_empty(dir, ec)) {
    const fs::path old = dir.string() + ".old-" + std::to_string(::getpid());
    fs::rename(dir, old, ec);
    if (ec) return io_error(dir.string() + ": cannot move the old folder aside: " + ec.message());
    fs::rename(tmp, dir, ec);
    if (ec) {
      std::error_code restore_ec;
      fs::rename(old, dir, restore_ec);
      return io_error(dir.string() + ": cannot rename " + tmp.string() + " to it: " + ec.message());
    }
    fs::remove_all(old, ec);
    if (ec) return io_error(old.string() + ": the new checkpoint is in place but the old one could not be removed: " + ec.message());
    return ok_status();
  }
  fs::rename(tmp, dir, ec);  // replaces an empty folder
  if (ec) return io_error(dir.string() + ": cannot rename " + tmp.string() + " to it: " + ec.message());
  return ok_status();
}

}  // namespace

std::string group_of(const std::string& name) {
  static const std::string kBlocks = "transformer_blocks.";
  static const std::string kRefinerBlocks = "token_refiner.refiner_blocks.";
  if (starts_with(name, kBlocks)) return block_name(name, kBlocks);
  if (starts_with(name, kRefinerBlocks)) return block_name(name, kRefinerBlocks);
  if (starts_with(name, "token_refiner.final_norm.")) return "token_refiner.final_norm";
  if (starts_with(name, "norm_out.") || starts_with(name, "proj_out.") || starts_with(name, "audio_proj_out.")) {
    return "outputs";
  }
  return "inputs";
}

std::vector<WeightGroup> schema_groups(const H3Config& config) {
  std::vector<WeightGroup> groups;
  for (TensorSpec& spec : diffusers_schema(config)) {
    std::string group = group_of(spec.name);
    if (groups.empty() || groups.back().name != group) groups.push_back({std::move(group), {}});
    groups.back().specs.push_back(std::move(spec));
  }
  return groups;
}

Status write_checkpoint(const std::string& dir, const H3Config& config, const GroupSource& source,
                        const CheckpointWriteOptions& options) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  if (options.max_shard_bytes == 0) return invalid_argument(dir + ": max_shard_bytes must be positive");
  VORTEX_ASSIGN_OR_RETURN(const fs::path folder, output_folder(dir, options.replace_existing));
  const fs::path tmp = folder.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a leftover of an earlier process that had our pid
  fs::create_directories(tmp, ec);
  if (ec) return io_error(tmp.string() + ": cannot create the folder: " + ec.message());
  Status status = write_contents(tmp, config, source, options);
  if (status.ok()) status = publish(tmp, folder);
  if (!status.ok()) fs::remove_all(tmp, ec);
  return status;
}

Status validate_checkpoint_tensors(const NamedTensors& stored, CheckpointLayout layout, const H3Config& config) {
  VORTEX_RETURN_IF_ERROR(check_scaled_weights(stored).status());
  // Shapes first: a GGUF weight's needs its P.ggml_type.
  NamedShapes shapes;
  for (auto& entry : shapes_of(stored)) {
    if (!is_quantization_side_tensor(entry.first)) shapes.push_back(std::move(entry));
  }
  return validate_checkpoint_shapes(shapes, layout, config);
}

Status validate_checkpoint_shapes(const NamedShapes& tensors, CheckpointLayout layout, const H3Config& config) {
  if (layout == CheckpointLayout::kDiffusers) return validate_against_schema(tensors, config);
  const int64_t inner = config.inner_dim();
  const Shape qkv_shape{3 * inner, config.hidden_size};
  const Shape inv_freq_shape{config.rope_freq_dim};
  NamedShapes views;
  for (const auto& [name, entry] : tensors) {
    if (name == "rope.inv_freq") {
      if (entry.shape != inv_freq_shape) {
        return invalid_argument("tensor 'rope.inv_freq': shape " + entry.shape.to_string() +
                                " but the config expects " + inv_freq_shape.to_string());
      }
      continue;
    }
    std::string target = original_name_to_diffusers(name);
    if (ends_with(target, ".attn.qkv_proj.weight")) {
      if (entry.shape != qkv_shape) {
        return invalid_argument("tensor " + quote(name) + ": shape " + entry.shape.to_string() +
                                " but the config expects " + qkv_shape.to_string());
      }
      // Row thirds of a per-head-interleaved QKV are not q, k and v, but they have their shapes,
      // which is all the schema check reads.
      const std::string prefix = target.substr(0, target.size() - std::string("qkv_proj.weight").size());
      for (const char* part : {"to_q.weight", "to_k.weight", "to_v.weight"}) {
        views.emplace_back(prefix + part, ShapeEntry{Shape{inner, config.hidden_size}, entry.dtype});
      }
    } else if (ends_with(target, ".mlp.fc1.weight")) {
      views.emplace_back(target.substr(0, target.size() - std::string("mlp.fc1.weight").size()) + "ff.net.0.proj.weight",
                         entry);
    } else {
      views.emplace_back(target, entry);
    }
  }
  return validate_against_schema(views, config);
}

Status convert_checkpoint(const std::string& in_path, const std::string& dir, const CheckpointWriteOptions& options,
                          const TensorTransform& transform) {
  VORTEX_ASSIGN_OR_RETURN(const ModelSource checkpoint, ModelSource::open(in_path));
  Result<CheckpointLayout> layout = detect_layout(checkpoint.names());
  if (!layout.ok()) return layout.status().with_context(in_path);
  VORTEX_ASSIGN_OR_RETURN(const H3Config config, resolve_config(checkpoint));
  const Status valid = validate_model_source(checkpoint, *layout, config);
  if (!valid.ok()) return valid.with_context(in_path + " (" + layout_name(*layout) + " layout)");

  // Names by group; each group's tensors are read (views, or a GGUF file's dequantized) when written.
  std::unordered_map<std::string, std::vector<std::string>> by_group;
  for (const auto& [name, entry] : checkpoint.shapes()) {
    if (name == "rope.inv_freq") continue;  // a function of the config, recomputed for the output
    const std::string diffusers_name = *layout == CheckpointLayout::kOriginal ? original_name_to_diffusers(name) : name;
    by_group[group_of(diffusers_name)].push_back(name);
  }
  const GroupSource source = [&](const WeightGroup& group) -> Result<NamedTensors> {
    // Each group is asked for once. Quantized weights are written dequantized (scaled_weights.h).
    NamedTensors stored;
    for (const std::string& name : by_group[group.name]) {
      VORTEX_ASSIGN_OR_RETURN(Tensor t, checkpoint.tensor(name));
      stored.emplace_back(name, std::move(t));
    }
    by_group[group.name].clear();
    VORTEX_ASSIGN_OR_RETURN(NamedTensors taken, dequantize_scaled_weights(stored, DType::kBF16));
    if (*layout == CheckpointLayout::kOriginal) {
      VORTEX_ASSIGN_OR_RETURN(taken, original_to_diffusers(taken, config));
    }
    if (transform) VORTEX_RETURN_IF_ERROR(transform(taken, config));
    return taken;
  };
  return write_checkpoint(dir, config, source, options);
}

std::string human_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1000.0 && unit < 4) {
    value /= 1000.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", value, kUnits[unit]);
  }
  return buf;
}

}  // namespace vortex::h3
