// Merging LoRA modules into the weights (see lora.h for the arithmetic).
#include <algorithm>
#include <map>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/quote.h"
#include "cpu/gemm.h"
#include "models/h3/lora.h"

namespace vortex::h3 {

namespace {

// Output rows a parallel_for chunk takes at a time: its delta scratch is kRowBlock x in floats.
constexpr int64_t kRowBlock = 32;

struct Term {
  const LoraModule* module;
  float scale;  // strength * alpha / rank
};

// n elements of a weight of `dtype` (F32, BF16 or F16) widened to fp32, and rounded back (RNE,
// DESIGN section 3); the dtype is switched on once a row block so that the loops vectorize.
void load_elements(const void* data, DType dtype, int64_t first, int64_t n, float* out) {
  if (dtype == DType::kBF16) {
    const uint16_t* p = static_cast<const uint16_t*>(data) + first;
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(p[i]);
  } else if (dtype == DType::kF16) {
    const uint16_t* p = static_cast<const uint16_t*>(data) + first;
    for (int64_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(p[i]);
  } else {
    std::copy_n(static_cast<const float*>(data) + first, n, out);
  }
}
void store_elements(const float* values, int64_t n, DType dtype, void* data, int64_t first) {
  if (dtype == DType::kBF16) {
    uint16_t* p = static_cast<uint16_t*>(data) + first;
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16_bits(values[i]);
  } else if (dtype == DType::kF16) {
    uint16_t* p = static_cast<uint16_t*>(data) + first;
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16_bits(values[i]);
  } else {
    std::copy_n(values, n, static_cast<float*>(data) + first);
  }
}

// W (F32, BF16 or F16) + each term's delta, in fp32, rounded once to `out_dtype`. Row blocks go
// to the threads whole (widened, summed, rounded in place): no fp32 copy of the weight is made.
Result<Tensor> merged_weight(const Tensor& weight, const std::vector<Term>& terms, DType out_dtype) {
  if (weight.dtype() != DType::kF32 && weight.dtype() != DType::kBF16 && weight.dtype() != DType::kF16) {
    return invalid_argument(std::string("a LoRA targets a weight of dtype ") + dtype_name(weight.dtype()) +
                            " (F32, BF16 or F16)");
  }
  const Tensor in = weight.contiguous();
  Tensor out = Tensor::empty(in.shape(), out_dtype);
  const int64_t rows = in.size(0), cols = in.size(1);
  parallel_for(0, (rows + kRowBlock - 1) / kRowBlock, [&](int64_t first, int64_t last) {
    std::vector<float> acc(static_cast<size_t>(kRowBlock * cols)), delta(acc.size());
    for (int64_t block = first; block < last; ++block) {
      const int64_t r0 = block * kRowBlock, n = std::min(kRowBlock, rows - r0);
      load_elements(in.data(), in.dtype(), r0 * cols, n * cols, acc.data());
      for (const Term& term : terms) {
        const int64_t rank = term.module->down.size(0);
        // The loops variant: each delta element one FMA chain over the rank, whatever the tiling.
        cpu::matmul_f32(cpu::GemmVariant::kLoops, false, n, cols, rank, term.scale,
                        term.module->up.data_as<const float>() + r0 * rank, rank,
                        term.module->down.data_as<const float>(), cols, delta.data(), cols);
        for (int64_t i = 0; i < n * cols; ++i) acc[i] += delta[i];
      }
      store_elements(acc.data(), n * cols, out_dtype, out.data(), r0 * cols);
    }
  });
  return out;
}

}  // namespace

Status merge_loras(NamedTensors& tensors, const std::vector<LoraApplication>& loras, DType model_dtype) {
  if (model_dtype != DType::kF32 && model_dtype != DType::kBF16 && model_dtype != DType::kF16) {
    return invalid_argument(std::string("LoRA merge: weights of dtype ") + dtype_name(model_dtype) +
                            " (F32, BF16 or F16)");
  }
  // Terms per weight, in the order the adapters came.
  std::map<std::string, std::vector<Term>> terms;
  for (const LoraApplication& lora : loras) {
    for (const LoraModule& m : lora.adapter->modules) {
      terms[m.target + ".weight"].push_back({&m, static_cast<float>(lora.strength * m.scale)});
    }
  }
  for (auto& [name, tensor] : tensors) {
    auto it = terms.find(name);
    if (it == terms.end()) continue;
    const LoraModule& first = *it->second.front().module;
    if (tensor.rank() != 2 || tensor.size(0) != first.up.size(0) || tensor.size(1) != first.down.size(1)) {
      return invalid_argument("LoRA module " + quote(first.source) + " does not fit " + quote(name) + " " +
                              tensor.describe());
    }
    const DType out = is_fp32_island(name) ? DType::kF32 : model_dtype;
    VORTEX_ASSIGN_OR_RETURN(tensor, merged_weight(tensor, it->second, out));
  }
  return ok_status();
}

}  // namespace vortex::h3
