// safetensors writer and the temp + fsync + rename discipline that every vortex file write uses.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "formats/safetensors.h"
#include "formats/safetensors_internal.h"

namespace vortex {

namespace {

using Json = nlohmann::json;

// A JSON string literal; nlohmann refuses strings that are not UTF-8.
Result<std::string> json_string(const std::string& text, const std::string& what) {
  try {
    return Json(text).dump(-1, ' ', false, Json::error_handler_t::strict);
  } catch (const Json::exception&) {
    return invalid_argument(what + " " + quote(text) + " is not valid UTF-8");
  }
}

}  // namespace

namespace safetensors_detail {

Status check_writable(const std::string& where,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata) {
    VORTEX_RETURN_IF_ERROR(json_string(key, where + ": metadata key").status());
    VORTEX_RETURN_IF_ERROR(json_string(value, where + ": metadata value").status());
  }
  std::unordered_set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    VORTEX_RETURN_IF_ERROR(json_string(name, where + ": tensor name").status());
    const std::string prefix = where + ": tensor " + quote(name) + ": ";
    if (name == "__metadata__") return invalid_argument(prefix + "the name is reserved for the metadata");
    if (!seen.insert(name).second) return invalid_argument(prefix + "named more than once");
    if (!tensor.defined()) return invalid_argument(prefix + "undefined tensor");
    if (tensor.device() != Device::kCpu) {
      return invalid_argument(prefix + tensor.describe() + " is on " + device_name(tensor.device()) +
                              "; copy it to the host first");
    }
  }
  return ok_status();
}

}  // namespace safetensors_detail

namespace {

using WriteFn = std::function<Status(const void* data, size_t bytes)>;

Status write_all(int fd, const std::string& path, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most ~2 GiB per call; ask for 1 GiB at a time.
    const ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(path + ": write failed: " + std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return ok_status();
}

// Runs `body` against `path.tmp-<pid>` and renames that over `path` only once body, fsync and close
// have all succeeded; otherwise removes it. Readers see the old file or the complete new one.
Status write_atomically(const std::string& path, const std::function<Status(const WriteFn&)>& body) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(path + ": cannot create " + tmp + ": " + std::strerror(errno));
  Status status = body([&](const void* data, size_t bytes) { return write_all(fd, tmp, data, bytes); });
  // Data must be on disk before the rename makes it visible, or a crash could expose a hole.
  if (status.ok() && ::fsync(fd) != 0) status = io_error(tmp + ": fsync failed: " + std::strerror(errno));
  if (::close(fd) != 0 && status.ok()) status = io_error(tmp + ": close failed: " + std::strerror(errno));
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = io_error(path + ": cannot rename " + tmp + " over it: " + std::strerror(errno));
  }
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

// The header JSON, entries in the given order, padded with spaces to a multiple of 8 bytes so
// that the data section starts 8-byte aligned. Built by hand because nlohmann's ordered object
// makes each insertion a linear search.
Result<std::string> build_header(const std::string& path,
                                 const std::vector<std::pair<std::string, Tensor>>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      VORTEX_ASSIGN_OR_RETURN(const std::string key, json_string(it->first, path + ": metadata key"));
      VORTEX_ASSIGN_OR_RETURN(const std::string value, json_string(it->second, path + ": metadata value"));
      header += (it == metadata.begin() ? "" : ",") + key + ":" + value;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    VORTEX_ASSIGN_OR_RETURN(const std::string key, json_string(name, path + ": tensor name"));
    std::string shape;
    for (int i = 0; i < tensor.rank(); ++i) {
      if (i > 0) shape += ',';
      shape += std::to_string(tensor.shape()[i]);
    }
    const uint64_t end = offset + tensor.nbytes();
    if (header.size() > 1) header += ",";
    header += key + ":{\"dtype\":\"" + dtype_name(tensor.dtype()) + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  if (header.size() > kMaxSafetensorsHeaderBytes) {
    return invalid_argument(path + ": header of " + std::to_string(header.size()) + " bytes exceeds the " +
                            std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit readers enforce");
  }
  return header;
}

}  // namespace

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  VORTEX_RETURN_IF_ERROR(safetensors_detail::check_writable(path, tensors, metadata));
  VORTEX_ASSIGN_OR_RETURN(const std::string header, build_header(path, tensors, metadata));
  return write_atomically(path, [&](const WriteFn& write) {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    VORTEX_RETURN_IF_ERROR(write(length, sizeof(length)));
    VORTEX_RETURN_IF_ERROR(write(header.data(), header.size()));
    for (const auto& [name, tensor] : tensors) {
      // One tensor at a time, so a strided view costs one extra copy of itself, not of the file.
      const Tensor dense = tensor.contiguous();
      VORTEX_RETURN_IF_ERROR(write(dense.data(), dense.nbytes()));
    }
    return ok_status();
  });
}

Status write_file_atomically(const std::string& path, const std::string& contents) {
  return write_atomically(path, [&](const WriteFn& write) { return write(contents.data(), contents.size()); });
}

}  // namespace vortex
