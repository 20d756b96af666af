#include "models/h3/scaled_weights.h"

#include <array>
#include <cstring>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/quote.h"
#include "cpu/fp8.h"
#include "formats/gguf.h"
#include "formats/nvfp4.h"

namespace vortex::h3 {

namespace {

// The scale of `P.weight`, by the names the formats give it.
constexpr std::array<const char*, 2> kScaleSuffixes = {".weight_scale", ".scale_weight"};
// An NVFP4 weight's second-level scale (one for the tensor).
constexpr const char* kTensorScaleSuffix = ".weight_scale_2";
// ComfyUI's per-layer format descriptor: JSON bytes, {"format": ...}.
constexpr const char* kComfyQuantSuffix = ".comfy_quant";
// Side tensors nothing here reads (the header says why).
constexpr std::array<const char*, 2> kReadPastSuffixes = {".input_scale", ".scale_input"};
constexpr const char* kComfyMarker = "scaled_fp8";

bool is_fp8(DType d) { return d == DType::kF8E4M3 || d == DType::kF8E5M2; }
bool is_float(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

// "P" of "P<suffix>" when `name` ends in one of `suffixes`.
template <size_t N>
bool strip_suffix(const std::string& name, const std::array<const char*, N>& suffixes, std::string* prefix) {
  for (const char* suffix : suffixes) {
    if (name.ends_with(suffix)) {
      *prefix = name.substr(0, name.size() - std::strlen(suffix));
      return true;
    }
  }
  return false;
}

bool strip_suffix(const std::string& name, const char* suffix, std::string* prefix) {
  return strip_suffix(name, std::array<const char*, 1>{suffix}, prefix);
}

struct ScaledWeight {
  const Tensor* weight = nullptr;
  const Tensor* scale = nullptr;  // null: scale 1
  std::string scale_name;
};

struct Nvfp4Weight {
  const Tensor* weight = nullptr;
  const Tensor* block_scales = nullptr;
  const Tensor* tensor_scale = nullptr;
  bool comfy_quant = false;  // ComfyUI's descriptor says nvfp4: the block scales are tiled
  Nvfp4ScaleLayout layout = Nvfp4ScaleLayout::kRowMajor;
};

struct GgmlWeight {
  const Tensor* blocks = nullptr;
  uint32_t type = 0;
};

struct QuantizedWeights {
  std::unordered_map<std::string, ScaledWeight> fp8;
  std::unordered_map<std::string, Nvfp4Weight> nvfp4;
  std::unordered_map<std::string, GgmlWeight> ggml;
};

// The ggml type a P.ggml_type tensor holds, checked against its weight P.weight.
Result<uint32_t> ggml_type_of(const std::string& name, const Tensor& type, const std::string& weight_name,
                              const Tensor& blocks) {
  if (type.dtype() != DType::kI32 || type.numel() != 1 || type.rank() > 1) {
    return invalid_argument("tensor " + quote(name) + ": a ggml type is I32 [], not " + dtype_name(type.dtype()) + " " +
                            type.shape().to_string());
  }
  const int32_t value = type.contiguous().data_as<int32_t>()[0];
  const auto t = static_cast<uint32_t>(value);
  if (value < 0 || !ggml_type_supported(t) || ggml_type_is_float(t)) {
    const std::string what = value < 0 ? "type " + std::to_string(value) : ggml_type_name(t);
    return invalid_argument("tensor " + quote(name) + ": " + what +
                            " is not a quantized ggml type dequantized here (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K ... Q6_K)");
  }
  if (blocks.dtype() != DType::kU8 || blocks.rank() != 2 || blocks.size(1) % ggml_block_bytes(t) != 0) {
    return invalid_argument("tensor " + quote(weight_name) + ": " + dtype_name(blocks.dtype()) + " " +
                            blocks.shape().to_string() + " is not rows of whole " + ggml_type_name(t) +
                            " blocks (U8 [O, a multiple of " + std::to_string(ggml_block_bytes(t)) + "])");
  }
  return t;
}

// The "format" of a comfy_quant descriptor (JSON bytes), or an error naming it.
Result<std::string> comfy_quant_format(const std::string& name, const Tensor& descriptor) {
  if ((descriptor.dtype() != DType::kU8 && descriptor.dtype() != DType::kI8) || descriptor.rank() != 1) {
    return invalid_argument("tensor " + quote(name) + ": a comfy_quant descriptor is U8 [n] JSON bytes, not " +
                            dtype_name(descriptor.dtype()) + " " + descriptor.shape().to_string());
  }
  const Tensor bytes = descriptor.contiguous();
  const std::string text(static_cast<const char*>(bytes.data()), static_cast<size_t>(bytes.numel()));
  const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || !parsed.contains("format") || !parsed["format"].is_string()) {
    return invalid_argument("tensor " + quote(name) + ": a comfy_quant descriptor is a JSON object with a \"format\" "
                            "string, not " + quote(text.substr(0, 80)));
  }
  return parsed["format"].get<std::string>();
}

// Checks an NVFP4 weight's scales and decides its block-scale layout.
Status check_nvfp4(const std::string& weight_name, Nvfp4Weight& w) {
  const std::string prefix = weight_name.substr(0, weight_name.size() - std::strlen(".weight"));
  if (!w.block_scales || !w.tensor_scale) {
    return invalid_argument("tensor " + quote(weight_name) + " is stored U8, which only an NVFP4 weight is here, and "
                            "it lacks " + quote(prefix + (w.block_scales ? kTensorScaleSuffix : ".weight_scale")) +
                            " (NVFP4: P.weight U8 [O, I/2], P.weight_scale F8_E4M3, P.weight_scale_2 F32 [])");
  }
  const Tensor& q = *w.weight;
  if (q.rank() != 2 || (2 * q.size(1)) % kNvfp4BlockSize != 0) {
    return invalid_argument("tensor " + quote(weight_name) + ": an NVFP4 weight is U8 [O, I/2] with I a multiple of 16, "
                            "not " + q.shape().to_string());
  }
  const int64_t rows = q.size(0), block_cols = 2 * q.size(1) / kNvfp4BlockSize;
  const Shape row_major{rows, block_cols};
  const Shape tiled = nvfp4_tiled_scale_shape(rows, block_cols);
  const Shape& s = w.block_scales->shape();
  if (w.block_scales->dtype() != DType::kF8E4M3 || (s != row_major && s != tiled) ||
      (w.comfy_quant && s != tiled)) {
    return invalid_argument("tensor " + quote(prefix + ".weight_scale") + ": " + dtype_name(w.block_scales->dtype()) + " " +
                            s.to_string() + " is not the block scales of " + quote(weight_name) + " " +
                            q.shape().to_string() + ": F8_E4M3 " + row_major.to_string() + " (row-major) or " +
                            tiled.to_string() + " (cuBLAS's tiled layout" +
                            (w.comfy_quant ? ", which ComfyUI's descriptor says it is)" : ")"));
  }
  // The shapes agree when O is a multiple of 128 and I / 16 of 4: then only ComfyUI's descriptor
  // says the scales are tiled (ModelOpt writes them row-major and no descriptor).
  w.layout = (w.comfy_quant || s != row_major) ? Nvfp4ScaleLayout::kTiled : Nvfp4ScaleLayout::kRowMajor;
  const std::string scale_name = prefix + kTensorScaleSuffix;
  if (!is_float(w.tensor_scale->dtype()) || w.tensor_scale->numel() != 1 || w.tensor_scale->rank() > 1) {
    return invalid_argument("tensor " + quote(scale_name) + ": " + dtype_name(w.tensor_scale->dtype()) + " " +
                            w.tensor_scale->shape().to_string() + " is not one scale for the tensor (F32, BF16 or "
                            "F16, [] or [1])");
  }
  return ok_status();
}

// The quantized weights by name, each with its scales; checks everything the header lists.
Result<QuantizedWeights> quantized_weights_of(const NamedTensors& tensors, ScaledWeightsSummary* summary) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [name, tensor] : tensors) by_name[name] = &tensor;
  QuantizedWeights found;
  for (const auto& [name, tensor] : tensors) {
    std::string prefix;
    if (!strip_suffix(name, kGgmlTypeSuffix, &prefix)) continue;
    const std::string weight_name = prefix + ".weight";
    const auto weight = by_name.find(weight_name);
    if (weight == by_name.end()) {
      return invalid_argument("tensor " + quote(name) + " types " + quote(weight_name) +
                              ", which is not in the checkpoint");
    }
    VORTEX_ASSIGN_OR_RETURN(const uint32_t type, ggml_type_of(name, tensor, weight_name, *weight->second));
    found.ggml[weight_name] = GgmlWeight{weight->second, type};
  }
  for (const auto& [name, tensor] : tensors) {
    if (is_quantization_side_tensor(name)) continue;
    if (is_fp8(tensor.dtype())) found.fp8[name].weight = &tensor;
    if (tensor.dtype() == DType::kU8 && !found.ggml.count(name)) found.nvfp4[name].weight = &tensor;
  }
  // The weight a side tensor belongs to, or an error naming both.
  const auto weight_of = [&](const std::string& name, const std::string& prefix) -> Result<const Tensor*> {
    const auto weight = by_name.find(prefix + ".weight");
    if (weight == by_name.end()) {
      return invalid_argument("tensor " + quote(name) + " scales " + quote(prefix + ".weight") +
                              ", which is not in the checkpoint");
    }
    return weight->second;
  };
  for (const auto& [name, tensor] : tensors) {
    std::string prefix;
    if (name.ends_with(kGgmlTypeSuffix)) continue;  // read above
    if (strip_suffix(name, kReadPastSuffixes, &prefix) || name == kComfyMarker) {
      ++summary->side_tensors_read_past;
      continue;
    }
    if (strip_suffix(name, kComfyQuantSuffix, &prefix)) {
      const auto nvfp4 = found.nvfp4.find(prefix + ".weight");
      if (nvfp4 == found.nvfp4.end()) {  // an fp8 layer's: its scale says all
        ++summary->side_tensors_read_past;
        continue;
      }
      VORTEX_ASSIGN_OR_RETURN(const std::string format, comfy_quant_format(name, tensor));
      if (format != "nvfp4") {
        return invalid_argument("tensor " + quote(name) + ": format " + quote(format) + " of a U8 weight is not "
                                "supported (NVFP4 is, and fp8 weights with one scale per tensor or output channel)");
      }
      nvfp4->second.comfy_quant = true;
      continue;
    }
    const bool tensor_scale = strip_suffix(name, kTensorScaleSuffix, &prefix);
    if (!tensor_scale && !strip_suffix(name, kScaleSuffixes, &prefix)) continue;
    VORTEX_ASSIGN_OR_RETURN(const Tensor* w, weight_of(name, prefix));
    const std::string weight_name = prefix + ".weight";
    if (found.ggml.count(weight_name)) {
      return invalid_argument("tensor " + quote(name) + " scales " + quote(weight_name) + ", whose GGUF blocks carry "
                              "their own scales");
    }
    if (w->dtype() == DType::kU8 && (tensor_scale || name.ends_with(".weight_scale"))) {
      Nvfp4Weight& entry = found.nvfp4[weight_name];
      (tensor_scale ? entry.tensor_scale : entry.block_scales) = &tensor;
      continue;
    }
    if (!is_fp8(w->dtype())) {
      return invalid_argument("tensor " + quote(name) + " scales " + quote(weight_name) + ", stored " +
                              dtype_name(w->dtype()) + ": only fp8 weights (F8_E4M3, F8_E5M2) with one scale and " +
                              "NVFP4 weights (U8 with weight_scale and weight_scale_2) are supported");
    }
    if (tensor_scale) {
      return invalid_argument("tensor " + quote(name) + ": a second-level scale belongs to an NVFP4 weight (U8), and " +
                              quote(weight_name) + " is " + dtype_name(w->dtype()));
    }
    ScaledWeight& entry = found.fp8[weight_name];
    if (entry.scale) {
      return invalid_argument("tensor " + quote(weight_name) + " has two scales: " + quote(entry.scale_name) + " and " +
                              quote(name));
    }
    if (!is_float(tensor.dtype())) {
      return invalid_argument("tensor " + quote(name) + ": dtype " + dtype_name(tensor.dtype()) +
                              " is not a scale's (F32, BF16 or F16)");
    }
    const int64_t rows = w->rank() >= 1 ? w->size(0) : 1;
    const Shape& s = tensor.shape();
    const bool per_tensor = tensor.numel() == 1 && s.rank() <= 1;
    const bool per_channel = w->rank() == 2 && ((s.rank() == 1 && s[0] == rows) || (s.rank() == 2 && s[0] == rows && s[1] == 1));
    if (!per_tensor && !per_channel) {
      return invalid_argument("tensor " + quote(name) + ": shape " + s.to_string() + " scales neither the whole of " +
                              quote(weight_name) + " " + w->shape().to_string() + " ([] or [1]) nor each of its rows ([" +
                              std::to_string(rows) + "] or [" + std::to_string(rows) + ", 1])");
    }
    entry.scale = &tensor;
    entry.scale_name = name;
    ++(per_channel && !per_tensor ? summary->per_channel : summary->per_tensor);
  }
  for (auto& [name, w] : found.nvfp4) {
    VORTEX_RETURN_IF_ERROR(check_nvfp4(name, w));
    if (w.layout == Nvfp4ScaleLayout::kTiled) ++summary->nvfp4_tiled;
  }
  summary->fp8_weights = static_cast<int64_t>(found.fp8.size());
  summary->nvfp4_weights = static_cast<int64_t>(found.nvfp4.size());
  summary->ggml_weights = static_cast<int64_t>(found.ggml.size());
  return found;
}

Result<Tensor> dequantize(const ScaledWeight& s, DType into) {
  const Tensor q = s.weight->contiguous();
  Tensor scale;  // F32 (a bf16 or f16 scale widens exactly)
  if (s.scale) {
    VORTEX_ASSIGN_OR_RETURN(scale, s.scale->to(DType::kF32));
    scale = scale.contiguous();
  }
  const bool per_channel = scale.defined() && scale.numel() > 1;
  const float* scales = scale.defined() ? scale.data_as<float>() : nullptr;
  float value_of[256];  // every code's value
  for (int b = 0; b < 256; ++b) {
    const auto code = static_cast<uint8_t>(b);
    value_of[b] = q.dtype() == DType::kF8E4M3 ? e4m3_bits_to_f32(code) : e5m2_bits_to_f32(code);
  }
  const int64_t rows = q.rank() >= 1 ? q.size(0) : 1;
  const int64_t cols = rows > 0 ? q.numel() / rows : 0;
  Tensor out = Tensor::empty(q.shape(), into);
  const auto* codes = static_cast<const uint8_t*>(q.data());
  parallel_for(0, rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float row_scale = scales == nullptr ? 1.0f : scales[per_channel ? r : 0];
      for (int64_t c = r * cols; c < (r + 1) * cols; ++c) {
        const float v = value_of[codes[c]] * row_scale;
        if (into == DType::kF32) {
          out.data_as<float>()[c] = v;
        } else {
          out.data_as<uint16_t>()[c] = f32_to_bf16_bits(v);
        }
      }
    }
  });
  return out;
}

Result<Tensor> dequantize(const Nvfp4Weight& w, DType into) {
  VORTEX_ASSIGN_OR_RETURN(const Tensor tensor_scale, w.tensor_scale->to(DType::kF32));
  return dequantize_nvfp4(*w.weight, *w.block_scales, w.layout, tensor_scale.contiguous().data_as<float>()[0], into);
}

Result<Tensor> dequantize(const GgmlWeight& w, DType into) {
  const Tensor blocks = w.blocks->contiguous();
  const int64_t rows = blocks.size(0), row_bytes = blocks.size(1);
  const int64_t cols = ggml_row_values(w.type, row_bytes);
  Tensor out = Tensor::empty({rows, cols}, into);
  const auto* data = static_cast<const uint8_t*>(blocks.data());
  parallel_for(0, rows, [&](int64_t begin, int64_t end) {
    std::vector<float> values(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      // The type and the row's whole blocks were checked: this cannot fail.
      (void)dequantize_ggml(w.type, data + r * row_bytes, cols, values.data());
      for (int64_t c = 0; c < cols; ++c) {
        if (into == DType::kF32) {
          out.data_as<float>()[r * cols + c] = values[c];
        } else {
          out.data_as<uint16_t>()[r * cols + c] = f32_to_bf16_bits(values[c]);
        }
      }
    }
  });
  return out;
}

}  // namespace

Tensor ggml_type_tensor(uint32_t type) {
  Tensor t = Tensor::empty({}, DType::kI32);
  t.data_as<int32_t>()[0] = static_cast<int32_t>(type);
  return t;
}

int64_t StoredQuantizedWeight::rows() const {
  if (codes_rows.empty()) return codes.rank() >= 1 ? codes.size(0) : 0;
  return row_count(codes_rows);
}

Shape StoredQuantizedWeight::logical_shape() const {
  if (ggml_type) return Shape{rows(), ggml_row_values(*ggml_type, codes.size(1))};
  Shape shape = logical_weight_shape(codes);
  if (shape.rank() >= 1) shape[0] = rows();
  return shape;
}

bool is_quantized_storage(DType d) { return is_fp8(d) || d == DType::kU8; }

bool is_quantization_side_tensor(const std::string& name) {
  std::string prefix;
  return strip_suffix(name, kScaleSuffixes, &prefix) || strip_suffix(name, kReadPastSuffixes, &prefix) ||
         name.ends_with(kTensorScaleSuffix) || name.ends_with(kComfyQuantSuffix) || name.ends_with(kGgmlTypeSuffix) ||
         name == kComfyMarker;
}

std::vector<std::string> side_tensor_names_of(const std::string& weight_name) {
  const std::string prefix = weight_name.ends_with(".weight") ? weight_name.substr(0, weight_name.size() - 7) : weight_name;
  std::vector<std::string> names;
  for (const char* suffix : kScaleSuffixes) names.push_back(prefix + suffix);
  names.push_back(prefix + kTensorScaleSuffix);
  names.push_back(prefix + kComfyQuantSuffix);
  names.push_back(prefix + kGgmlTypeSuffix);
  return names;
}

Result<ScaledWeightsSummary> check_scaled_weights(const NamedTensors& tensors) {
  ScaledWeightsSummary summary;
  VORTEX_RETURN_IF_ERROR(quantized_weights_of(tensors, &summary).status());
  return summary;
}

Result<StoredQuantizedWeight> stored_quantized_weight(const NamedTensors& tensors, const std::string& name) {
  ScaledWeightsSummary summary;
  VORTEX_ASSIGN_OR_RETURN(const QuantizedWeights quantized, quantized_weights_of(tensors, &summary));
  StoredQuantizedWeight out;
  if (const auto fp8 = quantized.fp8.find(name); fp8 != quantized.fp8.end()) {
    out.codes = fp8->second.weight->contiguous();
    if (fp8->second.scale) {
      VORTEX_ASSIGN_OR_RETURN(out.fp8_scales, fp8->second.scale->to(DType::kF32));
      VORTEX_ASSIGN_OR_RETURN(out.fp8_scales, out.fp8_scales.contiguous().reshape({out.fp8_scales.numel()}));
    }
    return out;
  }
  if (const auto ggml = quantized.ggml.find(name); ggml != quantized.ggml.end()) {
    out.codes = ggml->second.blocks->contiguous();
    out.ggml_type = ggml->second.type;
    return out;
  }
  const auto nvfp4 = quantized.nvfp4.find(name);
  if (nvfp4 == quantized.nvfp4.end()) return invalid_argument("tensor " + quote(name) + " is not a quantized weight");
  const Nvfp4Weight& w = nvfp4->second;
  out.codes = w.weight->contiguous();
  out.nvfp4_block_scales = w.block_scales->contiguous();
  out.nvfp4_layout = w.layout;
  VORTEX_ASSIGN_OR_RETURN(const Tensor tensor_scale, w.tensor_scale->to(DType::kF32));
  out.nvfp4_tensor_scale = tensor_scale.contiguous().data_as<float>()[0];
  return out;
}

Result<NamedTensors> dequantize_scaled_weights(const NamedTensors& tensors, DType into) {
  if (into != DType::kF32 && into != DType::kBF16) {
    return invalid_argument(std::string("quantized weights dequantize into F32 or BF16, not ") + dtype_name(into));
  }
  ScaledWeightsSummary summary;
  VORTEX_ASSIGN_OR_RETURN(const QuantizedWeights quantized, quantized_weights_of(tensors, &summary));
  NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    if (is_quantization_side_tensor(name)) continue;
    const auto fp8 = quantized.fp8.find(name);
    const auto nvfp4 = quantized.nvfp4.find(name);
    const auto ggml = quantized.ggml.find(name);
    if (fp8 == quantized.fp8.end() && nvfp4 == quantized.nvfp4.end() && ggml == quantized.ggml.end()) {
      out.emplace_back(name, tensor);
      continue;
    }
    const DType target = is_fp32_island(original_name_to_diffusers(name)) ? DType::kF32 : into;
    Result<Tensor> dequantized = fp8 != quantized.fp8.end()     ? dequantize(fp8->second, target)
                                 : nvfp4 != quantized.nvfp4.end() ? dequantize(nvfp4->second, target)
                                                                  : dequantize(ggml->second, target);
    if (!dequantized.ok()) return dequantized.status().with_context(name);
    out.emplace_back(name, std::move(*dequantized));
  }
  return out;
}

Result<StoredQuantizedWeight> quantized_rows(const NamedTensors& tensors, const std::string& name,
                                             const RowRuns& runs) {
  VORTEX_ASSIGN_OR_RETURN(StoredQuantizedWeight q, stored_quantized_weight(tensors, name));
  const int64_t rows = q.rows();
  if (runs.empty()) return invalid_argument("tensor " + quote(name) + ": no rows asked for");
  for (const auto& [first, count] : runs) {
    if (first < 0 || count < 0 || first > rows || count > rows - first) {
      return invalid_argument("tensor " + quote(name) + ": rows [" + std::to_string(first) + ", " +
                              std::to_string(first + count) + ") are not among its " + std::to_string(rows));
    }
  }
  q.codes_rows = runs;
  if (q.nvfp4()) {
    // Row-major block scales: rows of a tiled layout are not contiguous.
    Tensor row_major = q.nvfp4_block_scales;
    if (q.nvfp4_layout == Nvfp4ScaleLayout::kTiled) {
      const int64_t block_cols = 2 * q.codes.size(1) / kNvfp4BlockSize;
      row_major = Tensor::empty({rows, block_cols}, DType::kF8E4M3);
      const auto* tiled = static_cast<const uint8_t*>(q.nvfp4_block_scales.data());
      auto* to = static_cast<uint8_t*>(row_major.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < block_cols; ++b) {
          to[r * block_cols + b] = tiled[nvfp4_tiled_scale_index(r, b, block_cols)];
        }
      }
    }
    q.nvfp4_block_scales = gather_rows(row_major, runs);
    q.nvfp4_layout = Nvfp4ScaleLayout::kRowMajor;
  } else if (q.fp8_scales.defined() && q.fp8_scales.numel() != 1) {
    q.fp8_scales = gather_rows(q.fp8_scales, runs);
  }
  return q;
}

Result<NamedTensors> take_quantized_rows(const NamedTensors& tensors, const std::string& name, const RowRuns& runs,
                                         const std::string& new_name) {
  if (!new_name.ends_with(".weight")) {
    return invalid_argument("take_quantized_rows: " + quote(new_name) + " is not a weight's name (P.weight)");
  }
  VORTEX_ASSIGN_OR_RETURN(const StoredQuantizedWeight q, quantized_rows(tensors, name, runs));
  const std::string prefix = new_name.substr(0, new_name.size() - std::strlen(".weight"));
  NamedTensors out = {{new_name, gather_rows(q.codes, q.codes_rows)}};
  if (q.ggml_type) {
    out.emplace_back(prefix + kGgmlTypeSuffix, ggml_type_tensor(*q.ggml_type));
  } else if (q.nvfp4()) {
    out.emplace_back(prefix + ".weight_scale", q.nvfp4_block_scales);
    out.emplace_back(prefix + kTensorScaleSuffix, Tensor::from_f32({q.nvfp4_tensor_scale}, {}));
  } else if (q.fp8_scales.defined()) {
    out.emplace_back(prefix + ".weight_scale", q.fp8_scales);
  }
  return out;
}

Result<NamedTensors> comfy_quant_from_header(const std::map<std::string, std::string>& metadata) {
  const auto it = metadata.find("_quantization_metadata");
  if (it == metadata.end()) return NamedTensors{};
  const nlohmann::json parsed = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || !parsed.contains("layers") || !parsed["layers"].is_object()) {
    return invalid_argument("safetensors metadata '_quantization_metadata': not a JSON object with a \"layers\" "
                            "object of per-layer descriptors");
  }
  NamedTensors out;
  for (const auto& [layer, descriptor] : parsed["layers"].items()) {
    const std::string text = descriptor.dump();
    Tensor bytes = Tensor::empty({static_cast<int64_t>(text.size())}, DType::kU8);
    std::memcpy(bytes.data(), text.data(), text.size());
    out.emplace_back(layer + kComfyQuantSuffix, std::move(bytes));
  }
  return out;
}

bool is_fp8_channel_quantized_linear(const std::string& stored_name) {
  // The original layout's names by their renames; its fused QKV and FC1 keep their own.
  const std::string name = original_name_to_diffusers(stored_name);
  if (!name.starts_with("transformer_blocks.")) return false;
  for (const char* suffix : {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight", ".attn.qkv_proj.weight",
                             ".ff.net.0.proj.weight", ".mlp.fc1.weight", ".ff.net.2.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

Result<NamedTensors> quantize_linears_fp8(const NamedTensors& tensors) {
  NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    if (!is_fp8_channel_quantized_linear(name)) {
      out.emplace_back(name, tensor);
      continue;
    }
    // The recipe quantizes the bf16 weight it would otherwise run, whatever the source's dtype.
    Tensor source = tensor;
    if (source.dtype() != DType::kBF16) {
      VORTEX_ASSIGN_OR_RETURN(source, tensor.to(DType::kBF16));
    }
    Result<cpu::Fp8Rows> q = cpu::quantize_weight_fp8(source.contiguous().view());
    if (!q.ok()) return q.status().with_context(name);
    out.emplace_back(name, q->codes);
    out.emplace_back(name.substr(0, name.size() - std::strlen(".weight")) + ".weight_scale", q->scales);
  }
  return out;
}

}  // namespace vortex::h3
