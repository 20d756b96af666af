#include "models/h3/scaled_weights.h"

#include <array>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/quote.h"
#include "cpu/fp8.h"

namespace vortex::h3 {

namespace {

// The scale of `P.weight`, by the names the formats give it.
constexpr std::array<const char*, 2> kScaleSuffixes = {".weight_scale", ".scale_weight"};
// Side tensors nothing here reads (the header says why).
constexpr std::array<const char*, 3> kReadPastSuffixes = {".input_scale", ".scale_input", ".comfy_quant"};
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

struct ScaledWeight {
  const Tensor* weight = nullptr;
  const Tensor* scale = nullptr;  // null: scale 1
  std::string scale_name;
};

// The fp8 weights by name, each with its scale; checks everything the header lists.
Result<std::unordered_map<std::string, ScaledWeight>> scaled_weights_of(const NamedTensors& tensors,
                                                                       ScaledWeightsSummary* summary) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [name, tensor] : tensors) by_name[name] = &tensor;
  std::unordered_map<std::string, ScaledWeight> scaled;
  for (const auto& [name, tensor] : tensors) {
    if (is_fp8(tensor.dtype()) && !is_quantization_side_tensor(name)) scaled[name].weight = &tensor;
  }
  for (const auto& [name, tensor] : tensors) {
    std::string prefix;
    if (name.ends_with(".weight_scale_2")) {
      return invalid_argument("tensor " + quote(name) + ": NVFP4 weights (a second-level weight_scale_2) are not "
                              "supported yet; fp8 weights with one scale per tensor or per output channel are");
    }
    if (strip_suffix(name, kReadPastSuffixes, &prefix) || name == kComfyMarker) {
      ++summary->side_tensors_read_past;
      continue;
    }
    if (!strip_suffix(name, kScaleSuffixes, &prefix)) continue;
    const std::string weight_name = prefix + ".weight";
    const auto weight = by_name.find(weight_name);
    if (weight == by_name.end()) {
      return invalid_argument("tensor " + quote(name) + " scales " + quote(weight_name) + ", which is not in the checkpoint");
    }
    const Tensor& w = *weight->second;
    if (!is_fp8(w.dtype())) {
      return invalid_argument("tensor " + quote(name) + " scales " + quote(weight_name) + ", stored " +
                              dtype_name(w.dtype()) + ": only fp8 weights (F8_E4M3, F8_E5M2) with scales are supported");
    }
    ScaledWeight& entry = scaled[weight_name];
    if (entry.scale) {
      return invalid_argument("tensor " + quote(weight_name) + " has two scales: " + quote(entry.scale_name) + " and " +
                              quote(name));
    }
    if (!is_float(tensor.dtype())) {
      return invalid_argument("tensor " + quote(name) + ": dtype " + dtype_name(tensor.dtype()) +
                              " is not a scale's (F32, BF16 or F16)");
    }
    const int64_t rows = w.rank() >= 1 ? w.size(0) : 1;
    const Shape& s = tensor.shape();
    const bool per_tensor = tensor.numel() == 1 && s.rank() <= 1;
    const bool per_channel = w.rank() == 2 && ((s.rank() == 1 && s[0] == rows) || (s.rank() == 2 && s[0] == rows && s[1] == 1));
    if (!per_tensor && !per_channel) {
      return invalid_argument("tensor " + quote(name) + ": shape " + s.to_string() + " scales neither the whole of " +
                              quote(weight_name) + " " + w.shape().to_string() + " ([] or [1]) nor each of its rows ([" +
                              std::to_string(rows) + "] or [" + std::to_string(rows) + ", 1])");
    }
    entry.scale = &tensor;
    entry.scale_name = name;
    ++(per_channel && !per_tensor ? summary->per_channel : summary->per_tensor);
  }
  summary->fp8_weights = static_cast<int64_t>(scaled.size());
  return scaled;
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

}  // namespace



bool is_quantization_side_tensor(const std::string& name) {
  std::string prefix;
  return strip_suffix(name, kScaleSuffixes, &prefix) || strip_suffix(name, kReadPastSuffixes, &prefix) ||
         name.ends_with(".weight_scale_2") || name == kComfyMarker;
}

std::vector<std::string> scale_names_of(const std::string& weight_name) {
  const std::string prefix = weight_name.ends_with(".weight") ? weight_name.substr(0, weight_name.size() - 7) : weight_name;
  std::vector<std::string> names;
  for (const char* suffix : kScaleSuffixes) names.push_back(prefix + suffix);
  return names;
}

Result<ScaledWeightsSummary> check_scaled_weights(const NamedTensors& tensors) {
  ScaledWeightsSummary summary;
  VORTEX_RETURN_IF_ERROR(scaled_weights_of(tensors, &summary).status());
  return summary;
}

Result<NamedTensors> dequantize_scaled_weights(const NamedTensors& tensors, DType into) {
  if (into != DType::kF32 && into != DType::kBF16) {
    return invalid_argument(std::string("fp8 weights dequantize into F32 or BF16, not ") + dtype_name(into));
  }
  ScaledWeightsSummary summary;
  VORTEX_ASSIGN_OR_RETURN(const auto scaled, scaled_weights_of(tensors, &summary));
  NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    if (is_quantization_side_tensor(name)) continue;
    const auto it = scaled.find(name);
    if (it == scaled.end()) {
      out.emplace_back(name, tensor);
      continue;
    }
    const bool island = is_fp32_island(original_name_to_diffusers(name));
    VORTEX_ASSIGN_OR_RETURN(Tensor dequantized, dequantize(it->second, island ? DType::kF32 : into));
    out.emplace_back(name, std::move(dequantized));
  }
  return out;
}

bool is_fp8_channel_quantized_linear(const std::string& name) {
  if (!name.starts_with("transformer_blocks.")) return false;
  for (const char* suffix : {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight", ".ff.net.0.proj.weight",
                             ".ff.net.2.weight"}) {
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
