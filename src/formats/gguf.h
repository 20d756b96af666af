// GGUF (ggml's single-file format, as stable-diffusion.cpp, llama.cpp and ComfyUI-GGUF write it):
// read by mmap, the whole header validated when the file opens, tensors handed out as zero-copy views
// (F32, F16, BF16) or dequantized (ggml's block types, below).
//
// File layout (little-endian, version 2 or 3): "GGUF", u32 version, u64 tensor count, u64 metadata
// count, the metadata (u64-length strings as keys, a u32 value type, the value; arrays carry their
// element type and count), then each tensor's name, u32 rank, u64 dims (ggml order: the fastest
// dimension first), u32 ggml type and u64 offset into the data section, which starts at the next
// multiple of `general.alignment` (32 when absent) after the tensor infos.
//
// Shapes are given in row-major order, ggml's dims reversed, as the checkpoints they were converted
// from had them; a `comfy.gguf.orig_shape.<name>` array (ComfyUI-GGUF's record of a reshaped
// tensor) overrides it when its element count matches. A leading `model.diffusion_model.` or
// `diffusion_model.` shared by every tensor name is dropped.
//
// Dequantization follows ggml's definitions of each block type exactly (F16 scales widened, each
// product and sum rounded to fp32 in ggml's order, no fused multiply-add), then rounds once to the
// target dtype: F32, F16 and BF16 stored values pass through; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 values
// a block) and the k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256 a super-block). Other types (the IQ
// family, TQ, MXFP4, ggml's NVFP4, integers) are refused by name. tests/golden/gguf holds tensors
// of every supported type quantized and dequantized by ggml itself.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex {

// One metadata value: a scalar, a string, or an array of them (nested arrays are read past as an
// empty array of kind kArray).
struct GgufValue {
  enum class Kind { kUnsigned, kSigned, kFloat, kBool, kString, kArray };
  Kind kind = Kind::kUnsigned;
  std::variant<uint64_t, int64_t, double, bool, std::string> scalar;
  Kind element_kind = Kind::kUnsigned;  // kArray's
  uint64_t length = 0;                  // kArray's element count
  std::vector<GgufValue> elements;      // kArray's, the first kMaxKeptElements of them

  // A tokenizer's vocabulary is the longest array a checkpoint carries (~150k); a longer one is
  // read past beyond this many (and beyond 16M kept in the whole header), so a file of huge arrays
  // cannot exhaust memory.
  static constexpr uint64_t kMaxKeptElements = uint64_t{1} << 20;

  std::string to_string() const;  // for messages and inspect: 7, -2.5, true, "text", [3, 2, 256]
};

struct GgufTensorInfo {
  std::string name;          // as used (the shared diffusion_model prefix dropped)
  std::string stored_name;   // as in the file
  uint32_t ggml_type = 0;
  Shape shape;               // row-major (see above)
  int64_t row_values = 0;    // ggml's first dim: the values of one stored row (whole blocks)
  uint64_t file_offset = 0;  // of the tensor's bytes
  uint64_t nbytes = 0;
};

// ggml's type ids (docs/gguf.md in ggml) of the types this reader reads.
enum GgmlType : uint32_t {
  kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ5_0 = 6, kGgmlQ5_1 = 7, kGgmlQ8_0 = 8,
  kGgmlQ2_K = 10, kGgmlQ3_K = 11, kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14, kGgmlBF16 = 30,
};

// The ggml type's name (F32, Q4_K, IQ2_XXS, ...) or "type N".
std::string ggml_type_name(uint32_t type);
// True for the types this reader dequantizes or passes through.
bool ggml_type_supported(uint32_t type);
// True for F32, F16 and BF16 (handed out as stored), and their dtype.
bool ggml_type_is_float(uint32_t type);
DType ggml_float_dtype(uint32_t type);

// A supported type's block: the values it holds and its bytes (1 and the element size for F32, F16,
// BF16); 0 for the others.
int64_t ggml_block_values(uint32_t type);
int64_t ggml_block_bytes(uint32_t type);

// The values in `row_bytes` of whole blocks of a supported type.
int64_t ggml_row_values(uint32_t type, int64_t row_bytes);

// The byte offsets of a quantized type's f16 fields in its block (the scale d, and the min or dmin
// of the types that have one).
std::vector<int> ggml_f16_fields(uint32_t type);

// Dequantizes `n` values (a whole number of blocks) of a supported quantized ggml type into fp32.
Status dequantize_ggml(uint32_t type, const uint8_t* blocks, int64_t n, float* out);

class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  Result<GgufTensorInfo> info(const std::string& name) const;

  // F32 / F16 / BF16 tensors as zero-copy views; quantized ones dequantized into `quantized_into`
  // (F32 or BF16, rounded once).
  Result<Tensor> get(const std::string& name, DType quantized_into) const;
  // A quantized tensor's stored blocks as a zero-copy U8 view [rows, row bytes] of a 2-D shape [rows,
  // row_values] (whole blocks a row, as ggml stores them); an error for a float tensor or for one
  // whose recorded shape is not its stored rows (comfy.gguf.orig_shape reshaped it).
  Result<Tensor> blocks(const std::string& name) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  std::shared_ptr<void> mapping_;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// True when the file at `path` starts with GGUF's magic.
bool is_gguf_file(const std::string& path);

}  // namespace vortex
