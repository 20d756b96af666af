// GGUF checkpoints made by the tests (CPU: test_cli_gguf.cc; GPU: test_gpu_quantized_checkpoints.cc)
// as ComfyUI-GGUF writes a diffusion model: the original layout's names under
// `model.diffusion_model.`, no config, the block linears in Q8_0 quantized by this code, the rest
// F32 / F16 / BF16; and the reference checkpoint of the same weights dequantized by this code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/safetensors.h"
#include "models/h3/checkpoint_writer.h"
#include "models/h3/model_source.h"
#include "models/h3/synthetic.h"

namespace vortex::test_util {

// A minimal GGUF v3 writer: string metadata, tensors of ggml type F32 (0), F16 (1),
// BF16 (30) or Q8_0 (8) given as their raw bytes.
struct GgufTensor {
  std::string name;
  Shape shape;  // row-major
  uint32_t type;
  std::vector<uint8_t> bytes;
};

inline void put(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
inline void put_u32(std::string& out, uint32_t v) { put(out, &v, 4); }
inline void put_u64(std::string& out, uint64_t v) { put(out, &v, 8); }
inline void put_string(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}

inline void write_gguf(const std::string& path, const std::map<std::string, std::string>& metadata,
                const std::vector<GgufTensor>& tensors) {
  std::string out = "GGUF";
  put_u32(out, 3);
  put_u64(out, tensors.size());
  put_u64(out, metadata.size());
  for (const auto& [key, value] : metadata) {
    put_string(out, key);
    put_u32(out, 8);  // string
    put_string(out, value);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const GgufTensor& t : tensors) {
    put_string(out, t.name);
    put_u32(out, static_cast<uint32_t>(t.shape.rank()));
    for (int d = t.shape.rank() - 1; d >= 0; --d) put_u64(out, static_cast<uint64_t>(t.shape[d]));
    put_u32(out, t.type);
    put_u64(out, offset);
    offsets.push_back(offset);
    offset = (offset + t.bytes.size() + 31) / 32 * 32;
  }
  out.resize((out.size() + 31) / 32 * 32, '\0');
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    out.resize(data_start + offsets[i], '\0');
    put(out, tensors[i].bytes.data(), tensors[i].bytes.size());
  }
  std::ofstream(path, std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
}

// Q8_0 by the tests: per 32 values an f16 scale amax / 127 and int8 codes round(x / scale); the
// reference weight is code · scale in fp32, rounded to bf16.
inline GgufTensor q8_0(const std::string& name, const Tensor& weight, Tensor* reference) {
  const Tensor w = (*weight.to(DType::kF32)).contiguous();
  const int64_t n = w.numel();
  GgufTensor t{name, w.shape(), 8, {}};
  std::vector<float> back(n);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = w.data_as<float>() + b * 32;
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[k]));
    const uint16_t d_bits = f32_to_f16_bits(amax / 127.0f);
    const float d = f16_bits_to_f32(d_bits);
    t.bytes.push_back(static_cast<uint8_t>(d_bits & 0xFF));
    t.bytes.push_back(static_cast<uint8_t>(d_bits >> 8));
    for (int k = 0; k < 32; ++k) {
      const int code = d > 0.0f ? std::clamp(static_cast<int>(std::lround(x[k] / d)), -127, 127) : 0;
      t.bytes.push_back(static_cast<uint8_t>(static_cast<int8_t>(code)));
      back[b * 32 + k] = static_cast<float>(code) * d;
    }
  }
  *reference = *Tensor::from_f32(back, w.shape()).to(DType::kBF16);
  return t;
}

inline GgufTensor as_stored(const std::string& name, const Tensor& tensor, uint32_t type, DType dtype) {
  const Tensor t = (*tensor.to(dtype)).contiguous();
  GgufTensor out{name, t.shape(), type, {}};
  out.bytes.assign(static_cast<const uint8_t*>(t.data()), static_cast<const uint8_t*>(t.data()) + t.nbytes());
  return out;
}

struct GgufCheckpoint {
  std::vector<GgufTensor> tensors;  // as written
  int quantized = 0;                // Q8_0 tensors
};

// The synthetic original-layout weights of `config` (seed; made in `work_dir`) written as a GGUF file
// at `gguf_path` (metadata general.architecture = h3) and as the reference safetensors file at
// `reference_path` (no config either: both infer it). The block linears whose input width is a
// multiple of 32 are Q8_0; the 1-D tensors and fp32 islands F32; the other tensors BF16 or F16 by turns.
inline Result<GgufCheckpoint> write_gguf_checkpoints(const h3::H3Config& config, uint64_t seed, const std::string& work_dir,
                                                     const std::string& gguf_path, const std::string& reference_path) {
  h3::CheckpointWriteOptions options;
  options.layout = h3::CheckpointLayout::kOriginal;
  VORTEX_RETURN_IF_ERROR(h3::write_synthetic_checkpoint(work_dir, config, DType::kBF16, seed, options));
  VORTEX_ASSIGN_OR_RETURN(const h3::ModelSource source, h3::ModelSource::open(work_dir));
  VORTEX_ASSIGN_OR_RETURN(const h3::NamedTensors tensors, source.tensors());
  GgufCheckpoint out;
  h3::NamedTensors reference;
  int others = 0;
  for (const auto& [name, tensor] : tensors) {
    Tensor ref = tensor;
    const std::string stored = "model.diffusion_model." + name;
    if (tensor.rank() == 2 && tensor.size(1) % 32 == 0 && name.starts_with("blocks.")) {
      out.tensors.push_back(q8_0(stored, tensor, &ref));
      ++out.quantized;
    } else {
      const DType dtype = tensor.rank() == 1 || tensor.dtype() == DType::kF32 ? DType::kF32
                          : others++ % 2 == 0                                 ? DType::kBF16
                                                                              : DType::kF16;
      const uint32_t type = dtype == DType::kF32 ? 0 : dtype == DType::kF16 ? 1 : 30;
      out.tensors.push_back(as_stored(stored, tensor, type, dtype));
      ref = *tensor.to(dtype);
    }
    reference.emplace_back(name, ref);
  }
  write_gguf(gguf_path, {{"general.architecture", "h3"}}, out.tensors);
  VORTEX_RETURN_IF_ERROR(write_safetensors(reference_path, reference, {}));
  return out;
}

}  // namespace vortex::test_util
