// safetensors reader: mmap the file, validate the whole header up front, hand out zero-copy views.
#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/quote.h"
#include "formats/safetensors_internal.h"

namespace vortex {

namespace safetensors_detail {

std::string json_error_text(const char* what) {
  std::string text = what;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find("] ");
    if (close != std::string::npos) text.erase(0, close + 2);
  }
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return text;
}

}  // namespace safetensors_detail

namespace {

using safetensors_detail::json_error_text;
using Json = nlohmann::json;

// The header length prefix: at least 8 bytes in, little-endian whatever the host.
uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

// A value's description for a message: numbers as written, anything else by its JSON type, so
// that a megabyte-long string in a shape never ends up in the message.
std::string describe(const Json& v) {
  if (v.is_number() || v.is_boolean() || v.is_null()) return v.dump();
  return std::string("a JSON ") + v.type_name();
}

std::string byte_range(uint64_t begin, uint64_t end) {
  std::string out = "[";  // appended, not "[" + ...: GCC 12 warns falsely (-Wrestrict) on that
  out += std::to_string(begin) + ", " + std::to_string(end) + ")";
  return out;
}

// A non-negative JSON integer; nlohmann stores exactly those literals as number_unsigned.
bool get_unsigned(const Json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// The parse result plus what the DOM loses: key order, duplicate keys and excess nesting.
struct ParsedHeader {
  Json json;
  std::vector<std::string> keys;  // top-level keys in file order, each once
  std::string duplicate;          // the first top-level key seen twice, if any
  bool too_deep = false;
};

// The deepest containers a valid header has: the top object (depth 0), a tensor entry or
// __metadata__ (1), a shape or data_offsets array (2). Deeper ones are discarded while parsing so
// that a hostile header of nested brackets cannot build a huge DOM.
constexpr int kMaxContainerDepth = 2;

Result<ParsedHeader> parse_header(const std::string& path, const char* begin, const char* end) {
  ParsedHeader out;
  std::unordered_set<std::string> seen;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth > kMaxContainerDepth) {
      out.too_deep = true;
      return false;
    }
    if (event == Json::parse_event_t::key && depth == 1) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (seen.insert(key).second) {
        out.keys.push_back(key);
      } else if (out.duplicate.empty()) {
        out.duplicate = key;
      }
    }
    return true;
  };
  try {
    out.json = Json::parse(begin, end, on_event);
  } catch (const Json::parse_error& e) {
    const uint64_t at = 8 + (e.byte > 0 ? e.byte - 1 : 0);
    return corrupt_data(path + ": header is not valid JSON at file byte " + std::to_string(at) +
                        ": " + json_error_text(e.what()));
  } catch (const Json::exception& e) {
    return corrupt_data(path + ": header is not valid JSON: " + json_error_text(e.what()));
  }
  return out;
}

Status parse_metadata(const std::string& path, const Json& value,
                      std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) {
    return corrupt_data(path + ": __metadata__ is " + describe(value) + ", not an object of strings");
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return corrupt_data(path + ": __metadata__ entry " + quote(key) + " is " + describe(v) +
                          ", not a string");
    }
    (*metadata)[key] = v.get<std::string>();
  }
  return ok_status();
}

// Validates one header entry against the data section [data_start, data_start + data_bytes).
Status parse_entry(const std::string& where, const Json& entry, uint64_t data_start,
                   uint64_t data_bytes, TensorInfo* info) {
  if (!entry.is_object()) return corrupt_data(where + "entry is " + describe(entry) + ", not an object");

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return corrupt_data(where + "missing \"dtype\"");
  if (!dtype_it->is_string()) return corrupt_data(where + "\"dtype\" is " + describe(*dtype_it) + ", not a string");
  const Result<DType> dtype = dtype_from_name(dtype_it->get<std::string>());
  if (!dtype.ok()) return corrupt_data(where + "unknown dtype " + quote(dtype_it->get<std::string>()));
  info->dtype = *dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return corrupt_data(where + "missing \"shape\"");
  if (!shape_it->is_array()) return corrupt_data(where + "\"shape\" is " + describe(*shape_it) + ", not an array");
  if (shape_it->size() > static_cast<size_t>(kMaxDims)) {
    return corrupt_data(where + "shape has " + std::to_string(shape_it->size()) + " dims, more than the " +
                        std::to_string(kMaxDims) + " vortex supports");
  }
  // Element count times element size, overflow-checked: a shape can claim more than 2^64 bytes.
  uint64_t expected_bytes = dtype_size(info->dtype);
  bool overflow = false;
  for (size_t i = 0; i < shape_it->size(); ++i) {
    uint64_t dim = 0;
    const Json& d = (*shape_it)[i];
    if (!get_unsigned(d, &dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return corrupt_data(where + "shape[" + std::to_string(i) + "] is " + describe(d) +
                          ", not a non-negative integer");
    }
    info->shape.push_back(static_cast<int64_t>(dim));
    overflow = overflow || __builtin_mul_overflow(expected_bytes, dim, &expected_bytes);
  }

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) return corrupt_data(where + "missing \"data_offsets\"");
  if (!offsets_it->is_array() || offsets_it->size() != 2 || !get_unsigned((*offsets_it)[0], &info->begin) ||
      !get_unsigned((*offsets_it)[1], &info->end)) {
    return corrupt_data(where + "\"data_offsets\" must be [begin, end] with non-negative integers");
  }
  const std::string offsets = "data_offsets " + byte_range(info->begin, info->end);
  if (info->end < info->begin) {
    return corrupt_data(where + offsets + " end before they begin (the data section starts at file byte " +
                        std::to_string(data_start) + ")");
  }
  // From here begin <= end <= data_bytes, so the file byte offsets below cannot overflow.
  if (info->end > data_bytes) {
    const uint64_t file_bytes = data_start + data_bytes;
    return corrupt_data(where + offsets + " end past the data section (" + std::to_string(data_bytes) +
                        " bytes, file bytes " + byte_range(data_start, file_bytes) + " of a " +
                        std::to_string(file_bytes) + "-byte file)");
  }
  if (overflow || expected_bytes != info->nbytes()) {
    return corrupt_data(where + "shape " + info->shape.to_string() + " of " + dtype_name(info->dtype) + " needs " +
                        (overflow ? std::string("more than 2^64") : std::to_string(expected_bytes)) +
                        " bytes but " + offsets + " hold " + std::to_string(info->nbytes()) + " (file bytes " +
                        byte_range(data_start + info->begin, data_start + info->end) + ")");
  }
  info->file_offset = data_start + info->begin;
  return ok_status();
}

// Tensors may leave gaps but must not share bytes. Empty tensors occupy no bytes and are skipped.
Status check_overlaps(const std::string& path, const std::vector<std::string>& names,
                      const std::vector<TensorInfo>& infos) {
  std::vector<size_t> order;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (infos[i].nbytes() > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return infos[a].begin != infos[b].begin ? infos[a].begin < infos[b].begin : infos[a].end < infos[b].end;
  });
  // Against the furthest-reaching tensor so far, which any overlap in begin order must hit.
  size_t reach = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const TensorInfo& cur = infos[order[k]];
    if (k > 0 && cur.begin < infos[reach].end) {
      const TensorInfo& prev = infos[reach];
      const uint64_t data_start = cur.file_offset - cur.begin;
      return corrupt_data(path + ": tensors " + quote(names[reach]) + " data_offsets " +
                          byte_range(prev.begin, prev.end) + " and " + quote(names[order[k]]) +
                          " data_offsets " + byte_range(cur.begin, cur.end) + " overlap at file bytes " +
                          byte_range(data_start + cur.begin, data_start + std::min(prev.end, cur.end)));
    }
    if (k == 0 || cur.end > infos[reach].end) reach = order[k];
  }
  return ok_status();
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return not_found(path + ": no such file");
    return io_error(path + ": cannot open: " + std::strerror(err));
  }
  FdCloser closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return invalid_argument(path + ": not a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    return corrupt_data(path + ": file is " + std::to_string(file_bytes) +
                        " bytes, shorter than the 8-byte header length");
  }

  // Private and writable: an in-place edit of a loaded tensor (a converter rescaling weights)
  // copies the page instead of faulting or reaching the file. NORESERVE: a 60 GB checkpoint
  // must not be charged against the commit limit for copies that are almost never made.
  void* base = ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) return io_error(path + ": cannot mmap: " + std::strerror(errno));
  SafetensorsFile file;
  file.path_ = path;
  file.file_bytes_ = file_bytes;
  file.mapping_ = std::shared_ptr<void>(base, [file_bytes](void* p) { ::munmap(p, file_bytes); });
  const auto* bytes = static_cast<const std::byte*>(base);

  const uint64_t header_bytes = read_u64_le(bytes);
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return corrupt_data(path + ": header length " + std::to_string(header_bytes) + " (file bytes [0, 8)) exceeds the " +
                        std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit");
  }
  if (header_bytes > file_bytes - 8) {
    return corrupt_data(path + ": header length " + std::to_string(header_bytes) + " runs past the end of the " +
                        std::to_string(file_bytes) + "-byte file (the header would end at file byte " +
                        std::to_string(8 + header_bytes) + ")");
  }
  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start;

  const char* header_text = reinterpret_cast<const char*>(bytes + 8);
  VORTEX_ASSIGN_OR_RETURN(ParsedHeader header, parse_header(path, header_text, header_text + header_bytes));
  if (header.too_deep) return corrupt_data(path + ": header nests containers deeper than a safetensors header can");
  if (!header.json.is_object()) {
    return corrupt_data(path + ": header is " + describe(header.json) + ", not an object");
  }
  if (!header.duplicate.empty()) {
    return corrupt_data(path + ": header names " + quote(header.duplicate) + " more than once");
  }

  for (const std::string& name : header.keys) {
    const Json& value = *header.json.find(name);  // every recorded key is in the object
    if (name == "__metadata__") {
      VORTEX_RETURN_IF_ERROR(parse_metadata(path, value, &file.metadata_));
      continue;
    }
    TensorInfo info;
    VORTEX_RETURN_IF_ERROR(parse_entry(path + ": tensor " + quote(name) + ": ", value, data_start, data_bytes, &info));
    file.index_.emplace(name, file.names_.size());
    file.names_.push_back(name);
    file.infos_.push_back(std::move(info));
  }
  VORTEX_RETURN_IF_ERROR(check_overlaps(path, file.names_, file.infos_));
  return file;
}

Result<TensorInfo> SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return not_found(path_ + ": no tensor " + quote(name));
  return infos_[it->second];
}

Result<Tensor> SafetensorsFile::get(const std::string& name) const {
  VORTEX_ASSIGN_OR_RETURN(const TensorInfo info, this->info(name));
  auto storage = std::make_shared<Storage>();
  storage->data = static_cast<std::byte*>(mapping_.get()) + info.file_offset;
  storage->bytes = info.nbytes();
  storage->device = Device::kCpu;
  storage->keeper = mapping_;
  return Tensor::from_storage(std::move(storage), info.shape, info.dtype);
}

std::span<const std::byte> SafetensorsFile::bytes() const {
  return {static_cast<const std::byte*>(mapping_.get()), static_cast<size_t>(file_bytes_)};
}

}  // namespace vortex
