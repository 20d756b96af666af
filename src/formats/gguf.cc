// GGUF reader: mmap the file, validate the header up front, hand out views or dequantized tensors.
#include "formats/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/quote.h"

namespace vortex {

namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxGgufDims = 4;  // GGML_MAX_DIMS

struct TypeLayout {
  const char* name;
  int64_t block_values = 0;  // 0: not readable here
  int64_t block_bytes = 0;
};

// Indexed by ggml type id; the names of the types this reader refuses are kept for the messages.
const TypeLayout kTypes[] = {
    {"F32", 1, 4},       {"F16", 1, 2},       {"Q4_0", 32, 18},    {"Q4_1", 32, 20},   {"Q4_2", 0, 0},
    {"Q4_3", 0, 0},      {"Q5_0", 32, 22},    {"Q5_1", 32, 24},    {"Q8_0", 32, 34},   {"Q8_1", 0, 0},
    {"Q2_K", 256, 84},   {"Q3_K", 256, 110},  {"Q4_K", 256, 144},  {"Q5_K", 256, 176}, {"Q6_K", 256, 210},
    {"Q8_K", 0, 0},      {"IQ2_XXS", 0, 0},   {"IQ2_XS", 0, 0},    {"IQ3_XXS", 0, 0},  {"IQ1_S", 0, 0},
    {"IQ4_NL", 0, 0},    {"IQ3_S", 0, 0},     {"IQ2_S", 0, 0},     {"IQ4_XS", 0, 0},   {"I8", 0, 0},
    {"I16", 0, 0},       {"I32", 0, 0},       {"I64", 0, 0},       {"F64", 0, 0},      {"IQ1_M", 0, 0},
    {"BF16", 1, 2},      {"Q4_0_4_4", 0, 0},  {"Q4_0_4_8", 0, 0},  {"Q4_0_8_8", 0, 0}, {"TQ1_0", 0, 0},
    {"TQ2_0", 0, 0},     {"IQ4_NL_4_4", 0, 0}, {"IQ4_NL_4_8", 0, 0}, {"IQ4_NL_8_8", 0, 0}, {"MXFP4", 0, 0},
    {"NVFP4", 0, 0},     {"Q1_0", 0, 0},      {"Q2_0", 0, 0},
};
constexpr uint32_t kTypeCount = sizeof(kTypes) / sizeof(kTypes[0]);

float half(const uint8_t* p) { return f16_bits_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }
uint32_t u32_le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// Each block function writes one block's values in ggml's order and with its rounding: every product
// and sum in fp32 as ggml's reference dequantizers write them (this library is built without
// floating-point contraction).
void q4_0(const uint8_t* b, float* y) {
  const float d = half(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((b[2 + j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(b[4 + j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(b[4 + j] >> 4) * d + m;
  }
}

// Q5: the fifth bit of value j (and of j + 16) is bit j (j + 16) of the 32-bit qh.
void q5(const uint8_t* b, float* y, bool with_min) {
  const float d = half(b);
  const float m = with_min ? half(b + 2) : 0.0f;
  const uint8_t* rest = b + (with_min ? 4 : 2);
  const uint32_t qh = u32_le(rest);
  const uint8_t* qs = rest + 4;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    if (with_min) {
      y[j] = static_cast<float>(lo) * d + m;
      y[j + 16] = static_cast<float>(hi) * d + m;
    } else {
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + 16] = static_cast<float>(hi - 16) * d;
    }
  }
}

void q8_0(const uint8_t* b, float* y) {
  const float d = half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: 16 groups of 16, each with a 4-bit scale and a 4-bit min; 2-bit values, four to a byte: each
// half of the block takes 32 bytes, whose bit pairs 0-1, 2-3, 4-5, 6-7 give its four runs of 32.
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half_run = 0; half_run < 2; ++half_run) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half_run] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

// Q3_K: 16 groups of 16 with 6-bit scales (stored + 32: the low four bits in the first eight bytes'
// nibbles, the high two in the last four bytes), 2-bit values plus a high bit from hmask whose
// absence subtracts 4.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* s = b + 96;
  const float d = half(b + 108);
  int scale[16];
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    scale[j] = (low | (high << 4)) - 32;
  }
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < 256; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half_run = 0; half_run < 2; ++half_run) {
        const float dl = d * static_cast<float>(scale[is++]);
        for (int l = 0; l < 16; ++l) {
          const int at = l + 16 * half_run;
          const int v = ((q[at] >> shift) & 3) - ((hmask[at] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
      m = static_cast<uint8_t>(m << 1);
    }
    q += 32;
  }
}

// Q4_K / Q5_K's eight 6-bit scales and mins packed in 12 bytes.
void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K (qh null) and Q5_K: eight groups of 32, each with a 6-bit scale and min.
void q45_k(const uint8_t* b, float* y, bool five_bits) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = five_bits ? b + 16 : nullptr;
  const uint8_t* q = b + (five_bits ? 48 : 16);
  int is = 0;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    const uint8_t u1 = static_cast<uint8_t>(1u << (2 * (j / 64))), u2 = static_cast<uint8_t>(u1 << 1);
    for (int l = 0; l < 32; ++l) {
      const int v = (q[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0);
      *y++ = d1 * static_cast<float>(v) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int v = (q[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0);
      *y++ = d2 * static_cast<float>(v) - m2;
    }
    q += 32;
    is += 2;
  }
}

// Q6_K: sixteen groups of 16 with int8 scales; 6-bit values (low four bits in ql, high two in qh) - 32.
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int v1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int v2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int v3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int v4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(v1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(v2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(v3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(v4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// A bounds-checked reader over the header; errors name the file byte offset.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size) : path_(path), data_(data), size_(size) {}
  uint64_t at() const { return at_; }
  Status need(uint64_t n, const char* what) const {
    if (n > size_ - at_) {
      return corrupt_data(path_ + ": " + what + " at file byte " + std::to_string(at_) + " runs past the end of the " +
                          std::to_string(size_) + "-byte file");
    }
    return ok_status();
  }
  template <typename T>
  Result<T> read(const char* what) {
    VORTEX_RETURN_IF_ERROR(need(sizeof(T), what));
    T v;
    std::memcpy(&v, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  Result<std::string> string(const char* what) {
    VORTEX_ASSIGN_OR_RETURN(const uint64_t n, read<uint64_t>(what));
    VORTEX_RETURN_IF_ERROR(need(n, what));
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }
  // Whether one more array element may be kept: at most 16M in the whole header.
  bool keep_element() { return ++kept_elements_ <= (uint64_t{1} << 24); }
  Status error(const std::string& message) const {
    return corrupt_data(path_ + ": " + message + " (file byte " + std::to_string(at_) + ")");
  }

 private:
  std::string path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t at_ = 0;
  uint64_t kept_elements_ = 0;
};

// A numeric value (types 0-6 and 10-12); the size is checked first, so the reads cannot fail.
Result<GgufValue> read_scalar(Cursor& c, uint32_t type) {
  constexpr uint64_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 0, 0, 0, 8, 8, 8};
  VORTEX_RETURN_IF_ERROR(c.need(kSizes[type], "a metadata value"));
  GgufValue v;
  switch (type) {
    case 0: v.scalar = uint64_t{*c.read<uint8_t>("")}; break;
    case 1: v.kind = GgufValue::Kind::kSigned; v.scalar = int64_t{*c.read<int8_t>("")}; break;
    case 2: v.scalar = uint64_t{*c.read<uint16_t>("")}; break;
    case 3: v.kind = GgufValue::Kind::kSigned; v.scalar = int64_t{*c.read<int16_t>("")}; break;
    case 4: v.scalar = uint64_t{*c.read<uint32_t>("")}; break;
    case 5: v.kind = GgufValue::Kind::kSigned; v.scalar = int64_t{*c.read<int32_t>("")}; break;
    case 6: v.kind = GgufValue::Kind::kFloat; v.scalar = double{*c.read<float>("")}; break;
    case 10: v.scalar = *c.read<uint64_t>(""); break;
    case 11: v.kind = GgufValue::Kind::kSigned; v.scalar = *c.read<int64_t>(""); break;
    default: v.kind = GgufValue::Kind::kFloat; v.scalar = *c.read<double>(""); break;
  }
  return v;
}

Result<GgufValue> read_value(Cursor& c, uint32_t type, int depth) {
  if (type <= 12 && type != 7 && type != 8 && type != 9) return read_scalar(c, type);
  GgufValue v;
  if (type == 7) {
    VORTEX_ASSIGN_OR_RETURN(const uint8_t b, c.read<uint8_t>("a bool value"));
    if (b > 1) return c.error("a bool value is " + std::to_string(b) + ", not 0 or 1");
    v.kind = GgufValue::Kind::kBool;
    v.scalar = b == 1;
    return v;
  }
  if (type == 8) {
    VORTEX_ASSIGN_OR_RETURN(std::string s, c.string("a string value"));
    v.kind = GgufValue::Kind::kString;
    v.scalar = std::move(s);
    return v;
  }
  if (type != 9) return c.error("unknown metadata value type " + std::to_string(type));
  VORTEX_ASSIGN_OR_RETURN(const uint32_t element_type, c.read<uint32_t>("an array's element type"));
  VORTEX_ASSIGN_OR_RETURN(const uint64_t count, c.read<uint64_t>("an array's length"));
  if (depth > 4) return c.error("arrays nested deeper than 4");
  v.kind = GgufValue::Kind::kArray;
  // Every element takes at least one byte: a count past the file's end fails at once.
  VORTEX_RETURN_IF_ERROR(c.need(count, "an array"));
  v.length = count;
  for (uint64_t i = 0; i < count; ++i) {
    VORTEX_ASSIGN_OR_RETURN(GgufValue e, read_value(c, element_type, depth + 1));
    v.element_kind = e.kind;
    if (i < GgufValue::kMaxKeptElements && c.keep_element()) v.elements.push_back(std::move(e));
  }
  return v;
}

// Shape `stored` (row-major) replaced by ComfyUI-GGUF's orig_shape record when it is one and fits.
Result<Shape> recorded_shape(const std::string& path, const std::map<std::string, GgufValue>& metadata,
                             const std::string& stored_name, const Shape& stored) {
  const auto it = metadata.find("comfy.gguf.orig_shape." + stored_name);
  if (it == metadata.end()) return stored;
  const GgufValue& v = it->second;
  Shape shape;
  bool ok = v.kind == GgufValue::Kind::kArray && !v.elements.empty() && v.length <= static_cast<uint64_t>(kMaxDims);
  for (size_t i = 0; ok && i < v.elements.size(); ++i) {
    const GgufValue& e = v.elements[i];
    if (e.kind == GgufValue::Kind::kSigned && std::get<int64_t>(e.scalar) >= 0) {
      shape.push_back(std::get<int64_t>(e.scalar));
    } else if (e.kind == GgufValue::Kind::kUnsigned) {
      shape.push_back(static_cast<int64_t>(std::get<uint64_t>(e.scalar)));
    } else {
      ok = false;
    }
  }
  if (!ok || shape.numel() != stored.numel()) {
    return corrupt_data(path + ": metadata " + quote(it->first) + " = " + v.to_string() + " is not a shape of the " +
                        std::to_string(stored.numel()) + " elements of tensor " + quote(stored_name) + " " +
                        stored.to_string());
  }
  return shape;
}

}  // namespace

std::string GgufValue::to_string() const {
  switch (kind) {
    case Kind::kUnsigned: return std::to_string(std::get<uint64_t>(scalar));
    case Kind::kSigned: return std::to_string(std::get<int64_t>(scalar));
    case Kind::kFloat: {
      std::string s = std::to_string(std::get<double>(scalar));
      while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
      return s;
    }
    case Kind::kBool: return std::get<bool>(scalar) ? "true" : "false";
    case Kind::kString: return quote(std::get<std::string>(scalar));
    case Kind::kArray: {
      std::string s = "[";
      for (size_t i = 0; i < elements.size() && i < 8; ++i) s += (i ? ", " : "") + elements[i].to_string();
      if (length > 8) s += ", ... (" + std::to_string(length) + ")";
      return s + "]";
    }
  }
  return "?";
}

std::string ggml_type_name(uint32_t type) {
  return type < kTypeCount ? kTypes[type].name : "type " + std::to_string(type);
}

bool ggml_type_supported(uint32_t type) { return type < kTypeCount && kTypes[type].block_values > 0; }

int64_t ggml_block_values(uint32_t type) { return type < kTypeCount ? kTypes[type].block_values : 0; }

int64_t ggml_block_bytes(uint32_t type) { return type < kTypeCount ? kTypes[type].block_bytes : 0; }

int64_t ggml_row_values(uint32_t type, int64_t row_bytes) {
  return row_bytes / ggml_block_bytes(type) * ggml_block_values(type);
}

std::vector<int> ggml_f16_fields(uint32_t type) {
  switch (type) {
    case kGgmlQ4_0: case kGgmlQ5_0: case kGgmlQ8_0: return {0};
    case kGgmlQ4_1: case kGgmlQ5_1: case kGgmlQ4_K: case kGgmlQ5_K: return {0, 2};
    case kGgmlQ2_K: return {80, 82};
    case kGgmlQ3_K: return {108};
    case kGgmlQ6_K: return {208};
    default: return {};
  }
}

bool ggml_type_is_float(uint32_t type) { return type == kGgmlF32 || type == kGgmlF16 || type == kGgmlBF16; }

DType ggml_float_dtype(uint32_t type) {
  return type == kGgmlF32 ? DType::kF32 : type == kGgmlF16 ? DType::kF16 : DType::kBF16;
}

Status dequantize_ggml(uint32_t type, const uint8_t* blocks, int64_t n, float* out) {
  if (!ggml_type_supported(type) || ggml_type_is_float(type)) {
    return invalid_argument("ggml type " + ggml_type_name(type) + " is not a quantized type this reader dequantizes");
  }
  const TypeLayout& t = kTypes[type];
  if (n % t.block_values != 0) {
    return invalid_argument(std::to_string(n) + " values are not whole " + t.name + " blocks of " +
                            std::to_string(t.block_values));
  }
  for (int64_t b = 0; b < n / t.block_values; ++b) {
    const uint8_t* block = blocks + b * t.block_bytes;
    float* y = out + b * t.block_values;
    switch (type) {
      case kGgmlQ4_0: q4_0(block, y); break;
      case kGgmlQ4_1: q4_1(block, y); break;
      case kGgmlQ5_0: q5(block, y, false); break;
      case kGgmlQ5_1: q5(block, y, true); break;
      case kGgmlQ8_0: q8_0(block, y); break;
      case kGgmlQ2_K: q2_k(block, y); break;
      case kGgmlQ3_K: q3_k(block, y); break;
      case kGgmlQ4_K: q45_k(block, y, false); break;
      case kGgmlQ5_K: q45_k(block, y, true); break;
      case kGgmlQ6_K: q6_k(block, y); break;
    }
  }
  return ok_status();
}

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return not_found(path + ": no such file");
    return io_error(path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const uint64_t file_bytes = stat_ok ? static_cast<uint64_t>(st.st_size) : 0;
  void* base = stat_ok && file_bytes > 0
                   ? ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0)
                   : MAP_FAILED;
  const int map_errno = errno;
  ::close(fd);
  if (!stat_ok) return io_error(path + ": cannot stat");
  if (base == MAP_FAILED) {
    return file_bytes == 0 ? corrupt_data(path + ": empty file, not GGUF")
                           : io_error(path + ": cannot mmap: " + std::strerror(map_errno));
  }
  GgufFile file;
  file.path_ = path;
  file.mapping_ = std::shared_ptr<void>(base, [file_bytes](void* p) { ::munmap(p, file_bytes); });
  const auto* bytes = static_cast<const uint8_t*>(base);
  Cursor c(path, bytes, file_bytes);

  VORTEX_ASSIGN_OR_RETURN(const uint32_t magic, c.read<uint32_t>("the magic"));
  if (std::memcmp(&magic, "GGUF", 4) != 0) return corrupt_data(path + ": not a GGUF file (no \"GGUF\" at byte 0)");
  VORTEX_ASSIGN_OR_RETURN(file.version_, c.read<uint32_t>("the version"));
  if (file.version_ >= 0x01000000u) return c.error("a big-endian GGUF file; only little-endian files are read");
  if (file.version_ != 2 && file.version_ != 3) {
    return c.error("GGUF version " + std::to_string(file.version_) + "; versions 2 and 3 are read");
  }
  VORTEX_ASSIGN_OR_RETURN(const uint64_t tensor_count, c.read<uint64_t>("the tensor count"));
  VORTEX_ASSIGN_OR_RETURN(const uint64_t kv_count, c.read<uint64_t>("the metadata count"));
  // Each entry takes at least 8 bytes: counts past the file's end fail before any reservation.
  if (tensor_count > file_bytes / 8 || kv_count > file_bytes / 8) {
    return c.error(std::to_string(tensor_count) + " tensors and " + std::to_string(kv_count) +
                   " metadata entries cannot fit in a " + std::to_string(file_bytes) + "-byte file");
  }
  for (uint64_t i = 0; i < kv_count; ++i) {
    VORTEX_ASSIGN_OR_RETURN(std::string key, c.string("a metadata key"));
    VORTEX_ASSIGN_OR_RETURN(const uint32_t type, c.read<uint32_t>("a metadata value type"));
    Result<GgufValue> value = read_value(c, type, 0);
    if (!value.ok()) return value.status().with_context("metadata " + quote(key));
    if (!file.metadata_.emplace(key, std::move(*value)).second) return c.error("metadata key " + quote(key) + " twice");
  }
  uint64_t alignment = kDefaultAlignment;
  if (auto it = file.metadata_.find("general.alignment"); it != file.metadata_.end()) {
    const GgufValue& a = it->second;
    const bool is_u = a.kind == GgufValue::Kind::kUnsigned;
    if (!is_u || std::get<uint64_t>(a.scalar) == 0 || std::get<uint64_t>(a.scalar) % 8 != 0) {
      return corrupt_data(path + ": general.alignment = " + a.to_string() + " is not a positive multiple of 8");
    }
    alignment = std::get<uint64_t>(a.scalar);
  }

  struct Raw {
    std::string name;
    Shape shape;
    int64_t row_values;
    uint32_t type;
    uint64_t offset;
    uint64_t info_at;
  };
  std::vector<Raw> raw;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    Raw r;
    r.info_at = c.at();
    VORTEX_ASSIGN_OR_RETURN(r.name, c.string("a tensor name"));
    VORTEX_ASSIGN_OR_RETURN(const uint32_t rank, c.read<uint32_t>("a tensor's rank"));
    if (rank == 0 || rank > kMaxGgufDims) {
      return c.error("tensor " + quote(r.name) + " has " + std::to_string(rank) + " dimensions (1 to 4)");
    }
    int64_t dims[kMaxGgufDims];
    // No type stores more than 8 elements a byte: a larger count cannot fit in the file (and the
    // product of the dims stays far from overflowing).
    const uint64_t max_elements = (file_bytes + 1) * 8;
    uint64_t elements = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      VORTEX_ASSIGN_OR_RETURN(const uint64_t n, c.read<uint64_t>("a tensor's dimension"));
      if (n == 0 || n > max_elements / elements) {
        return c.error("tensor " + quote(r.name) + " has a dimension of " + std::to_string(n) +
                       ", more elements than the file can hold");
      }
      elements *= n;
      dims[d] = static_cast<int64_t>(n);
    }
    for (uint32_t d = rank; d-- > 0;) r.shape.push_back(dims[d]);
    r.row_values = dims[0];
    VORTEX_ASSIGN_OR_RETURN(r.type, c.read<uint32_t>("a tensor's type"));
    VORTEX_ASSIGN_OR_RETURN(r.offset, c.read<uint64_t>("a tensor's offset"));
    if (!ggml_type_supported(r.type)) {
      return invalid_argument(path + ": tensor " + quote(r.name) + " is stored " + ggml_type_name(r.type) +
                              ", which is not read here (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                              "Q4_K, Q5_K and Q6_K are)");
    }
    if (dims[0] % kTypes[r.type].block_values != 0) {
      return c.error("tensor " + quote(r.name) + ": rows of " + std::to_string(dims[0]) + " values are not whole " +
                     ggml_type_name(r.type) + " blocks");
    }
    raw.push_back(std::move(r));
  }
  const uint64_t data_start = (c.at() + alignment - 1) / alignment * alignment;
  // Names shared by every tensor under ComfyUI's model prefix lose it.
  std::string prefix;
  for (const char* p : {"model.diffusion_model.", "diffusion_model."}) {
    bool all = !raw.empty();
    for (const Raw& r : raw) all = all && r.name.starts_with(p);
    if (all) {
      prefix = p;
      break;
    }
  }
  for (const Raw& r : raw) {
    GgufTensorInfo info;
    info.stored_name = r.name;
    info.name = r.name.substr(prefix.size());
    info.ggml_type = r.type;
    info.row_values = r.row_values;
    const TypeLayout& t = kTypes[r.type];
    info.nbytes = static_cast<uint64_t>(r.shape.numel() / t.block_values * t.block_bytes);
    const std::string where = path + ": tensor " + quote(r.name) + " (info at file byte " + std::to_string(r.info_at) + ")";
    if (r.offset % alignment != 0) {
      return corrupt_data(where + ": data offset " + std::to_string(r.offset) + " is not a multiple of the alignment " +
                          std::to_string(alignment));
    }
    if (data_start > file_bytes || r.offset > file_bytes - data_start || info.nbytes > file_bytes - data_start - r.offset) {
      return corrupt_data(where + ": its " + std::to_string(info.nbytes) + " bytes at data offset " +
                          std::to_string(r.offset) + " run past the end of the " + std::to_string(file_bytes) +
                          "-byte file");
    }
    info.file_offset = data_start + r.offset;
    VORTEX_ASSIGN_OR_RETURN(info.shape, recorded_shape(path, file.metadata_, r.name, r.shape));
    if (!file.index_.emplace(info.name, file.tensors_.size()).second) {
      return corrupt_data(path + ": tensor " + quote(info.name) + " appears twice");
    }
    file.tensors_.push_back(std::move(info));
  }
  return file;
}

Result<GgufTensorInfo> GgufFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return not_found(path_ + ": no tensor " + quote(name));
  return tensors_[it->second];
}

Result<Tensor> GgufFile::blocks(const std::string& name) const {
  VORTEX_ASSIGN_OR_RETURN(const GgufTensorInfo info, this->info(name));
  if (ggml_type_is_float(info.ggml_type) || info.shape.rank() != 2 || info.shape[1] != info.row_values) {
    return invalid_argument(path_ + ": tensor " + quote(name) + " (" + ggml_type_name(info.ggml_type) + " " +
                            info.shape.to_string() + ") is not a quantized matrix of whole-block rows");
  }
  auto storage = std::make_shared<Storage>();
  storage->data = static_cast<uint8_t*>(mapping_.get()) + info.file_offset;
  storage->bytes = info.nbytes;
  storage->keeper = mapping_;
  const int64_t rows = info.shape[0];
  return Tensor::from_storage(std::move(storage), Shape{rows, static_cast<int64_t>(info.nbytes) / rows}, DType::kU8);
}

Result<Tensor> GgufFile::get(const std::string& name, DType quantized_into) const {
  VORTEX_ASSIGN_OR_RETURN(const GgufTensorInfo info, this->info(name));
  const auto* data = static_cast<const uint8_t*>(mapping_.get()) + info.file_offset;
  if (ggml_type_is_float(info.ggml_type)) {
    auto storage = std::make_shared<Storage>();
    storage->data = const_cast<uint8_t*>(data);
    storage->bytes = info.nbytes;
    storage->keeper = mapping_;
    return Tensor::from_storage(std::move(storage), info.shape, ggml_float_dtype(info.ggml_type));
  }
  if (quantized_into != DType::kF32 && quantized_into != DType::kBF16) {
    return invalid_argument(std::string("GGUF tensors dequantize into F32 or BF16, not ") + dtype_name(quantized_into));
  }
  const TypeLayout& t = kTypes[info.ggml_type];
  const int64_t blocks = info.shape.numel() / t.block_values;
  Tensor out = Tensor::empty(info.shape, quantized_into);
  // Chunks of whole blocks; each thread dequantizes into fp32 scratch and rounds into place.
  constexpr int64_t kBlocksPerChunk = 64;
  parallel_for(0, (blocks + kBlocksPerChunk - 1) / kBlocksPerChunk, [&](int64_t begin, int64_t end) {
    std::vector<float> values(kBlocksPerChunk * t.block_values);
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t first = chunk * kBlocksPerChunk;
      const int64_t count = std::min(kBlocksPerChunk, blocks - first);
      // The type is supported and the count whole blocks: this cannot fail.
      (void)dequantize_ggml(info.ggml_type, data + first * t.block_bytes, count * t.block_values, values.data());
      const int64_t at = first * t.block_values;
      for (int64_t i = 0; i < count * t.block_values; ++i) {
        if (quantized_into == DType::kF32) {
          out.data_as<float>()[at + i] = values[i];
        } else {
          out.data_as<uint16_t>()[at + i] = f32_to_bf16_bits(values[i]);
        }
      }
    }
  });
  return out;
}

}  // namespace vortex
