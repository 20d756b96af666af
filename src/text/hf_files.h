// What the Qwen3-VL encoders (text and vision) read from a Hugging Face model folder: its JSON
// files, integer fields with named errors, the weights file and weights of a checked shape.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::text {

Result<nlohmann::json> read_json_file(const std::string& path);

// j[key] as a positive integer; the error names `where` and the key.
Result<int64_t> positive_int(const nlohmann::json& j, const std::string& key, const std::string& where);

// The folder holding `path` (itself when it is one).
std::string model_folder(const std::string& path);

// The weights of a model folder: model.safetensors.index.json or model.safetensors when `path` is
// a folder that has one (other safetensors files beside them are not the model's), else `path`.
Result<ShardedCheckpoint> open_model_weights(const std::string& path);

// A weight of the expected shape, BF16 or F32 (what linear and the norms read).
Result<Tensor> checked_weight(const ShardedCheckpoint& ckpt, const std::string& name, const Shape& shape);

}  // namespace vortex::text
