// NVFP4 checkpoints made by the tests (CPU: test_nvfp4_weights.cc; GPU: test_gpu_quantized_checkpoints.cc)
// with their own quantizer, the ModelOpt recipe: tensor scale amax / (6 · 448), block scale
// e4m3(block amax / 6 / tensor scale), codes e2m1(w / (tensor scale · block scale)); and the
// reference checkpoint of the same weights dequantized by this code into bf16, not by the loader's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/nvfp4.h"
#include "formats/safetensors.h"
#include "models/h3/config.h"
#include "models/h3/synthetic.h"
#include "models/h3/weights.h"

namespace vortex::test_util {

inline Tensor u8_tensor(const std::vector<uint8_t>& bytes, const Shape& shape, DType dtype = DType::kU8) {
  Tensor t = Tensor::empty(shape, dtype);
  std::memcpy(t.data(), bytes.data(), bytes.size());
  return t;
}

// ComfyUI's per-layer descriptor: the JSON's bytes.
inline Tensor comfy_quant(const std::string& json) {
  return u8_tensor(std::vector<uint8_t>(json.begin(), json.end()), {static_cast<int64_t>(json.size())});
}

struct TestNvfp4 {
  Tensor packed, scales;  // scales row-major
  float tensor_scale = 1.0f;
  Tensor dequantized_bf16;
};

inline TestNvfp4 quantize_nvfp4_for_test(const Tensor& weight) {
  const Tensor w = *weight.to(DType::kF32);
  const int64_t rows = w.size(0), cols = w.size(1), block_cols = cols / 16;
  const float* v = w.data_as<float>();
  float amax = 0.0f;
  for (int64_t i = 0; i < w.numel(); ++i) amax = std::max(amax, std::fabs(v[i]));
  TestNvfp4 out;
  out.tensor_scale = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
  std::vector<uint8_t> codes(rows * cols / 2, 0), scale_codes(rows * block_cols);
  std::vector<float> back(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < block_cols; ++b) {
      float block_amax = 0.0f;
      for (int64_t k = 0; k < 16; ++k) block_amax = std::max(block_amax, std::fabs(v[r * cols + b * 16 + k]));
      const uint8_t s = f32_to_e4m3_bits(block_amax / 6.0f / out.tensor_scale);
      scale_codes[r * block_cols + b] = s;
      const float scale = out.tensor_scale * e4m3_bits_to_f32(s);
      for (int64_t k = 0; k < 16; ++k) {
        const int64_t i = b * 16 + k;
        const uint8_t code = scale > 0.0f ? f32_to_e2m1_code(v[r * cols + i] / scale) : 0;
        codes[(r * cols + i) / 2] |= static_cast<uint8_t>(i % 2 == 0 ? code : code << 4);
        back[r * cols + i] = e2m1_code_to_f32(code) * scale;
      }
    }
  }
  out.packed = u8_tensor(codes, {rows, cols / 2});
  out.scales = u8_tensor(scale_codes, {rows, block_cols}, DType::kF8E4M3);
  out.dequantized_bf16 = *Tensor::from_f32(back, {rows, cols}).to(DType::kBF16);
  return out;
}

// The transformer blocks' six linears, which the NVFP4 checkpoints store quantized.
inline bool is_nvfp4_test_target(const std::string& name) {
  if (!name.starts_with("transformer_blocks.")) return false;
  for (const char* suffix : {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight", ".attn.to_out.0.weight",
                             ".ff.net.0.proj.weight", ".ff.net.2.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

// Writes the synthetic weights of `config` (seed) as an NVFP4 checkpoint at `nvfp4_path` (the first
// block in ComfyUI's form: block scales tiled, a comfy_quant descriptor; the others in ModelOpt's:
// row-major, none) and the same weights dequantized by this code at `reference_path`, both single
// diffusers-layout files with the config in their metadata. A linear whose input width is not a
// multiple of 16 (whole NVFP4 blocks) stays bf16.
struct Nvfp4Checkpoint {
  h3::NamedTensors tensors;  // the NVFP4 file's
  int quantized = 0;         // weights stored NVFP4
  int tiled = 0;             // ... with tiled block scales
};

inline Result<Nvfp4Checkpoint> write_nvfp4_checkpoints(const h3::H3Config& config, uint64_t seed,
                                                        const std::string& nvfp4_path,
                                                        const std::string& reference_path) {
  VORTEX_ASSIGN_OR_RETURN(const h3::NamedTensors source, h3::synthetic_weights(config, DType::kBF16, seed));
  Nvfp4Checkpoint out;
  h3::NamedTensors& nvfp4 = out.tensors;
  h3::NamedTensors reference;
  for (const auto& [name, tensor] : source) {
    if (!is_nvfp4_test_target(name) || tensor.size(1) % 16 != 0) {
      nvfp4.emplace_back(name, tensor);
      reference.emplace_back(name, tensor);
      continue;
    }
    const TestNvfp4 w = quantize_nvfp4_for_test(tensor);
    const std::string prefix = name.substr(0, name.size() - std::strlen(".weight"));
    Tensor scales = w.scales;
    if (name.starts_with("transformer_blocks.0.")) {
      const int64_t rows = w.scales.size(0), block_cols = w.scales.size(1);
      std::vector<uint8_t> tiled(nvfp4_tiled_scale_shape(rows, block_cols).numel(), 0);
      const auto* row_major = static_cast<const uint8_t*>(w.scales.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < block_cols; ++b) {
          tiled[nvfp4_tiled_scale_index(r, b, block_cols)] = row_major[r * block_cols + b];
        }
      }
      scales = u8_tensor(tiled, nvfp4_tiled_scale_shape(rows, block_cols), DType::kF8E4M3);
      nvfp4.emplace_back(prefix + ".comfy_quant", comfy_quant(R"({"format":"nvfp4"})"));
      ++out.tiled;
    }
    nvfp4.emplace_back(name, w.packed);
    nvfp4.emplace_back(prefix + ".weight_scale", scales);
    nvfp4.emplace_back(prefix + ".weight_scale_2", Tensor::from_f32({w.tensor_scale}, {}));
    reference.emplace_back(name, w.dequantized_bf16);
    ++out.quantized;
  }
  const std::map<std::string, std::string> metadata = {{"config", config.to_json_string()}};
  VORTEX_RETURN_IF_ERROR(write_safetensors(nvfp4_path, nvfp4, metadata));
  VORTEX_RETURN_IF_ERROR(write_safetensors(reference_path, reference, metadata));
  return out;
}

}  // namespace vortex::test_util
