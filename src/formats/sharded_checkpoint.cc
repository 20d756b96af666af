// Sharded checkpoints: an index JSON mapping tensor names to safetensors shards, a directory
// holding one, or a single file; and the writer that splits tensors into shards plus an index.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "formats/safetensors.h"
#include "formats/safetensors_internal.h"

namespace vortex {

namespace {

namespace fs = std::filesystem;
using safetensors_detail::json_error_text;
using Json = nlohmann::json;

constexpr const char* kIndexSuffix = ".safetensors.index.json";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "'a', 'b', 'c' and 4 more": candidates for an ambiguity message, kept to one readable line.
std::string list_names(const std::vector<std::string>& names) {
  constexpr size_t kMaxListed = 8;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxListed; ++i) out += (i ? ", " : "") + quote(names[i]);
  if (names.size() > kMaxListed) out += " and " + std::to_string(names.size() - kMaxListed) + " more";
  return out;
}

// The checkpoint file a directory stands for: its one index, else its one safetensors file.
Result<std::string> resolve_directory(const std::string& dir) {
  std::vector<std::string> indexes, files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;  // follows symlinks, as in a Hugging Face cache
    const std::string name = it->path().filename().string();
    if (ends_with(name, kIndexSuffix)) indexes.push_back(name);
    if (ends_with(name, ".safetensors")) files.push_back(name);
  }
  if (ec) return io_error(dir + ": cannot list the directory: " + ec.message());
  std::sort(indexes.begin(), indexes.end());
  std::sort(files.begin(), files.end());
  if (indexes.size() > 1) {
    return invalid_argument(dir + ": several index files (" + list_names(indexes) + "); pass the one to use");
  }
  if (indexes.size() == 1) return (fs::path(dir) / indexes[0]).string();
  if (files.size() > 1) {
    return invalid_argument(dir + ": several .safetensors files and no " + kIndexSuffix + " (" +
                            list_names(files) + "); pass the one to use");
  }
  if (files.size() == 1) return (fs::path(dir) / files[0]).string();
  return not_found(dir + ": no *" + kIndexSuffix + " or *.safetensors file in the directory");
}

Result<Json> read_index_json(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return io_error(path + ": cannot stat: " + ec.message());
  if (size > kMaxSafetensorsHeaderBytes) {
    return corrupt_data(path + ": index of " + std::to_string(size) + " bytes exceeds the " +
                        std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path + ": cannot open the index");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return io_error(path + ": cannot read the index");
  try {
    return Json::parse(text.str());
  } catch (const Json::parse_error& e) {
    return corrupt_data(path + ": not valid JSON at byte " + std::to_string(e.byte > 0 ? e.byte - 1 : 0) + ": " +
                        json_error_text(e.what()));
  } catch (const Json::exception& e) {
    return corrupt_data(path + ": not valid JSON: " + json_error_text(e.what()));
  }
}

// A shard name must stay inside the index's folder: an index is data, and data must not steer
// reads to arbitrary files.
bool is_safe_relative(const std::string& name) {
  const fs::path p(name);
  if (name.empty() || p.is_absolute()) return false;
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  return true;
}

std::string shard_file_name(const std::string& basename, size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "-%05zu-of-%05zu.safetensors", index, count);
  return basename + buf;
}

}  // namespace

Result<ShardedCheckpoint> ShardedCheckpoint::open(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return not_found(path + ": no such file or directory");
  if (ec) return io_error(path + ": cannot stat: " + ec.message());
  if (fs::is_directory(st)) {
    VORTEX_ASSIGN_OR_RETURN(const std::string file, resolve_directory(path));
    return open(file);
  }

  ShardedCheckpoint ckpt;
  ckpt.path_ = path;
  if (!ends_with(path, ".json")) {
    VORTEX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
    ckpt.names_ = file.names();
    for (const std::string& name : ckpt.names_) ckpt.shard_of_.emplace(name, 0);
    ckpt.shards_.push_back(std::move(file));
    return ckpt;
  }

  VORTEX_ASSIGN_OR_RETURN(const Json index, read_index_json(path));
  if (!index.is_object()) return corrupt_data(path + ": the index is not a JSON object");
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return corrupt_data(path + ": no \"weight_map\" object");
  }
  // Shard name -> tensors the index maps to it; std::map so that shards load in name order.
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) return corrupt_data(path + ": weight_map entry " + quote(name) + " is not a string");
    const std::string shard_name = shard.get<std::string>();
    if (!is_safe_relative(shard_name)) {
      return corrupt_data(path + ": tensor " + quote(name) + " maps to shard " + quote(shard_name) +
                          ", which is not a path inside the index's folder");
    }
    by_shard[shard_name].push_back(name);
  }

  const fs::path folder = fs::path(path).parent_path();
  for (const auto& [shard_name, listed] : by_shard) {
    const std::string shard_path = (folder / shard_name).string();
    Result<SafetensorsFile> file = SafetensorsFile::open(shard_path);
    if (file.status().code() == StatusCode::kNotFound) {
      return not_found(path + ": shard " + quote(shard_name) + " (holding tensor " + quote(listed[0]) +
                       ") does not exist at " + shard_path);
    }
    if (!file.ok()) return file.status();
    for (const std::string& name : listed) {
      if (!file->has(name)) {
        return corrupt_data(path + ": tensor " + quote(name) + " is mapped to shard " + quote(shard_name) +
                            ", which does not hold it");
      }
    }
    for (const std::string& name : file->names()) {
      const auto mapped = map_it->find(name);
      if (mapped == map_it->end()) {
        return corrupt_data(shard_path + ": holds tensor " + quote(name) + ", which the index " + path +
                            " does not list");
      }
      if (mapped->get<std::string>() != shard_name) {
        return corrupt_data(shard_path + ": holds tensor " + quote(name) + ", which the index " + path +
                            " maps to shard " + quote(mapped->get<std::string>()));
      }
      ckpt.shard_of_.emplace(name, ckpt.shards_.size());
      ckpt.names_.push_back(name);
    }
    ckpt.shards_.push_back(std::move(file).value());
  }
  return ckpt;
}

Result<size_t> ShardedCheckpoint::shard_index(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) return not_found(path_ + ": no tensor " + quote(name));
  return it->second;
}

Result<Tensor> ShardedCheckpoint::get(const std::string& name) const {
  VORTEX_ASSIGN_OR_RETURN(const size_t shard, shard_index(name));
  return shards_[shard].get(name);
}

Result<TensorInfo> ShardedCheckpoint::info(const std::string& name) const {
  VORTEX_ASSIGN_OR_RETURN(const size_t shard, shard_index(name));
  return shards_[shard].info(name);
}

const std::map<std::string, std::string>& ShardedCheckpoint::metadata() const {
  static const std::map<std::string, std::string> kEmpty;
  return shards_.empty() ? kEmpty : shards_[0].metadata();
}

Result<std::string> ShardedCheckpoint::source_of(const std::string& name) const {
  VORTEX_ASSIGN_OR_RETURN(const size_t shard, shard_index(name));
  return shards_[shard].path();
}

Status write_sharded(const std::string& dir,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes,
                     const std::string& basename) {
  if (max_shard_bytes == 0) return invalid_argument(dir + ": max_shard_bytes must be positive");
  if (basename.empty() || basename.find('/') != std::string::npos) {
    return invalid_argument(dir + ": basename " + quote(basename) + " must be a plain file name");
  }
  // Checked for the whole set before the first shard is written: a duplicate name across shards
  // is invisible to the per-shard writer.
  VORTEX_RETURN_IF_ERROR(safetensors_detail::check_writable(dir, tensors, metadata));

  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& entry : tensors) {
    const uint64_t bytes = entry.second.nbytes();
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(entry);
    shard_bytes += bytes;
    total_bytes += bytes;
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create the directory: " + ec.message());
  const std::string index_path = (fs::path(dir) / (basename + kIndexSuffix)).string();
  fs::remove(index_path, ec);
  if (ec) return io_error(index_path + ": cannot remove the previous index: " + ec.message());

  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shard_file_name(basename, i + 1, shards.size());
    VORTEX_RETURN_IF_ERROR(write_safetensors((fs::path(dir) / file).string(), shards[i], metadata));
    for (const auto& entry : shards[i]) weight_map[entry.first] = file;
  }
  Json index;
  index["metadata"] = {{"total_size", total_bytes}};
  index["weight_map"] = std::move(weight_map);
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const Json::exception& e) {
    return invalid_argument(index_path + ": " + json_error_text(e.what()));
  }
  return write_file_atomically(index_path, text);
}

}  // namespace vortex
