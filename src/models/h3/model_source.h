// A model checkpoint as every command reads it (generate, serve, convert, inspect): safetensors (a
// file, an index or a folder holding one; formats/safetensors.h), or one GGUF file
// (formats/gguf.h), as stable-diffusion.cpp and ComfyUI-GGUF users have them.
//
// A GGUF file's float tensors (F32, F16, BF16) are views of its mapping like safetensors'. Its
// quantized weight matrices are handed out by tensors() as stored, zero-copy views of their blocks
// with a P.ggml_type beside each (scaled_weights.h), which the loaders dequantize one weight at a
// time (the CUDA loader on the device); tensor() and any other quantized tensor are dequantized
// when asked for, into bf16 (the fp32 islands into F32), rounded once from ggml's fp32 values.
// Names and shapes (for the layout, the config and the schema check) come from the file's tensor
// infos without dequantizing anything.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "models/h3/weights.h"

namespace vortex::h3 {

class ModelSource {
 public:
  // A path ending in .gguf, or any file starting with GGUF's magic, is read as GGUF.
  static Result<ModelSource> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::string>& names() const { return names_; }
  // safetensors: the first shard's __metadata__; GGUF: its string-valued metadata.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Every tensor's name, shape (logical_weight_shape) and dtype: for GGUF, the dtype its quantized
  // tensors load as.
  NamedShapes shapes() const;
  // One tensor (GGUF: dequantized now); every tensor, in the file's order (safetensors: read_all's
  // views, with a ComfyUI header's descriptors; GGUF: views, quantized matrices as their blocks).
  Result<Tensor> tensor(const std::string& name) const;
  Result<NamedTensors> tensors() const;

  const ShardedCheckpoint* safetensors() const { return safetensors_.get(); }
  const GgufFile* gguf() const { return gguf_.get(); }

 private:
  std::string path_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<ShardedCheckpoint> safetensors_;
  NamedTensors views_;  // safetensors'
  std::unordered_map<std::string, size_t> view_index_;
  std::shared_ptr<GgufFile> gguf_;
};

// The config for a checkpoint: config.json beside it (or inside it, for a folder), else the `config`
// metadata key, else inferred from the tensor shapes (infer_config). `source`, when given, is set to
// the one used (or, on failure, the one that failed).
Result<H3Config> resolve_config(const ModelSource& checkpoint, ConfigSource* source = nullptr);

// The schema check of validate_checkpoint_tensors (checkpoint_writer.h) on a whole checkpoint; a GGUF
// file's on its shapes, without dequantizing.
Status validate_model_source(const ModelSource& checkpoint, CheckpointLayout layout, const H3Config& config);

}  // namespace vortex::h3
