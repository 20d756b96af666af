#include "text/hf_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace vortex::text {

namespace fs = std::filesystem;
using nlohmann::json;

Result<json> read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream s;
  s << in.rdbuf();
  json j = json::parse(s.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt_data(path + ": not valid JSON");
  return j;
}

Result<int64_t> positive_int(const json& j, const std::string& key, const std::string& where) {
  if (!j.contains(key)) return corrupt_data(where + ": no field '" + key + "'");
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1) {
    return corrupt_data(where + ": '" + key + "' is " + j[key].dump() + ", expected a positive integer");
  }
  return j[key].get<int64_t>();
}

std::string model_folder(const std::string& path) {
  return fs::is_directory(path) ? path : fs::path(path).parent_path().string();
}

Result<ShardedCheckpoint> open_model_weights(const std::string& path) {
  std::string weights_path = path;
  if (fs::is_directory(path)) {
    for (const char* name : {"model.safetensors.index.json", "model.safetensors"}) {
      if (fs::exists(fs::path(path) / name)) {
        weights_path = (fs::path(path) / name).string();
        break;
      }
    }
  }
  return ShardedCheckpoint::open(weights_path);
}

Result<Tensor> checked_weight(const ShardedCheckpoint& ckpt, const std::string& name, const Shape& shape) {
  if (!ckpt.has(name)) return not_found(ckpt.path() + ": no tensor '" + name + "'");
  VORTEX_ASSIGN_OR_RETURN(Tensor t, ckpt.get(name));
  if (t.shape() != shape || (t.dtype() != DType::kBF16 && t.dtype() != DType::kF32)) {
    return corrupt_data(ckpt.path() + ": tensor '" + name + "' is " + t.describe() + ", expected bf16 or f32" +
                        shape.to_string());
  }
  return t;
}

}  // namespace vortex::text
