// Merging LoRA modules into the weights (see lora.h for the arithmetic).
#include <algorithm>
#include <map>
#include <vector>

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

// W (any storage dtype) + each term's delta, in fp32, rounded once to `out_dtype`.
Result<Tensor> merged_weight(const Tensor& weight, const std::vector<Term>& terms, DType out_dtype) {
  Tensor acc = weight.dtype() == DType::kF32 ? weight.clone() : *weight.to(DType::kF32);
  const int64_t rows = acc.size(0), cols = acc.size(1);
  float* w = acc.data_as<float>();
  parallel_for(0, (rows + kRowBlock - 1) / kRowBlock, [&](int64_t first, int64_t last) {
    std::vector<float> delta(static_cast<size_t>(kRowBlock * cols));
    for (int64_t block = first; block < last; ++block) {
      const int64_t r0 = block * kRowBlock, n = std::min(kRowBlock, rows - r0);
      for (const Term& term : terms) {
        const int64_t rank = term.module->down.size(0);
        // The loops variant: each delta element one FMA chain over the rank, whatever the tiling.
        cpu::matmul_f32(cpu::GemmVariant::kLoops, false, n, cols, rank, term.scale,
                        term.module->up.data_as<const float>() + r0 * rank, rank,
                        term.module->down.data_as<const float>(), cols, delta.data(), cols);
        float* dst = w + r0 * cols;
        for (int64_t i = 0; i < n * cols; ++i) dst[i] += delta[i];
      }
    }
  });
  if (out_dtype == DType::kF32) return acc;
  return acc.to(out_dtype);
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
