// Merging LoRA modules into the weights (see lora.h for the arithmetic).
#include <algorithm>
#include <atomic>
#include <cmath>
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

// The dtypes a merge widens and rounds back (load_elements / store_elements).
bool mergeable(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16; }

// Each DoRA term's f = m / ‖W + s·Δ‖ per output row, filled while its weight merges: its bias
// merge needs them. Indexed like the terms; a plain term's stays empty.
using RowFactors = std::vector<std::vector<float>>;

// W (F32, BF16 or F16) with each term folded in, in fp32, rounded once to `out_dtype`. Row blocks
// go to the threads whole (widened, summed, rounded in place): no fp32 copy of the weight is made.
Result<Tensor> merged_weight(const std::string& name, const Tensor& weight, const std::vector<LoraTerm>& terms,
                             DType out_dtype, RowFactors& factors) {
  if (!mergeable(weight.dtype())) {
    return invalid_argument(std::string("a LoRA targets a weight of dtype ") + dtype_name(weight.dtype()) +
                            " (F32, BF16 or F16)");
  }
  const Tensor in = weight.contiguous();
  Tensor out = Tensor::empty(in.shape(), out_dtype);
  const int64_t rows = in.size(0), cols = in.size(1);
  const bool dora = has_dora(terms);
  factors.assign(terms.size(), {});
  for (size_t t = 0; t < terms.size(); ++t) {
    if (terms[t].module->magnitude.defined()) factors[t].assign(static_cast<size_t>(rows), 0.0f);
  }
  std::atomic<int64_t> zero_norm{-1};  // term * rows + row of the first DoRA row that cannot be scaled
  parallel_for(0, (rows + kRowBlock - 1) / kRowBlock, [&](int64_t first, int64_t last) {
    std::vector<float> acc(static_cast<size_t>(kRowBlock * cols)), delta(acc.size()), base(dora ? acc.size() : 0);
    for (int64_t block = first; block < last; ++block) {
      const int64_t r0 = block * kRowBlock, n = std::min(kRowBlock, rows - r0);
      load_elements(in.data(), in.dtype(), r0 * cols, n * cols, acc.data());
      if (dora) std::copy_n(acc.data(), n * cols, base.data());
      for (size_t t = 0; t < terms.size(); ++t) {
        const LoraTerm& term = terms[t];
        const int64_t rank = term.module->down.size(0);
        // The loops variant: each delta element one chain over the rank, whatever the tiling.
        cpu::matmul_f32(cpu::GemmVariant::kLoops, false, n, cols, rank, term.scale,
                        term.module->up.data_as<const float>() + r0 * rank, rank,
                        term.module->down.data_as<const float>(), cols, delta.data(), cols);
        if (!term.module->magnitude.defined()) {
          for (int64_t i = 0; i < n * cols; ++i) acc[i] += delta[i];
          continue;
        }
        // DoRA: the norm of the unmerged weight's row plus this module's delta, summed in double in
        // column order with explicit FMAs (bits that do not depend on the compiler's contraction).
        const float* magnitude = term.module->magnitude.data_as<const float>();
        for (int64_t r = 0; r < n; ++r) {
          double sum = 0.0;
          for (int64_t c = 0; c < cols; ++c) {
            const double v = static_cast<double>(base[r * cols + c]) + delta[r * cols + c];
            sum = std::fma(v, v, sum);
          }
          if (sum == 0.0) {
            // The first such row is named, whichever thread finds it.
            const int64_t here = static_cast<int64_t>(t) * rows + r0 + r;
            for (int64_t seen = zero_norm.load(); (seen < 0 || here < seen) &&
                                                  !zero_norm.compare_exchange_weak(seen, here);) {
            }
            continue;
          }
          const float f = static_cast<float>(magnitude[r0 + r] / std::sqrt(sum));
          factors[t][static_cast<size_t>(r0 + r)] = f;
          for (int64_t c = 0; c < cols; ++c) acc[r * cols + c] = f * (acc[r * cols + c] + delta[r * cols + c]);
        }
      }
      store_elements(acc.data(), n * cols, out_dtype, out.data(), r0 * cols);
    }
  });
  if (const int64_t at = zero_norm.load(); at >= 0) {
    return dora_zero_norm_error(*terms[static_cast<size_t>(at / rows)].module, name, at % rows);
  }
  return out;
}

// The linear's bias plus each term's s·b, a DoRA term scaling the sum before it by its row's f, in
// fp32, rounded once to `out_dtype`.
Result<Tensor> merged_bias(const Tensor& bias, const std::vector<LoraTerm>& terms, const RowFactors& factors,
                           DType out_dtype) {
  if (!mergeable(bias.dtype())) {
    return invalid_argument(std::string("a LoRA bias targets a bias of dtype ") + dtype_name(bias.dtype()) +
                            " (F32, BF16 or F16)");
  }
  const Tensor in = bias.contiguous();
  const int64_t rows = in.numel();
  std::vector<float> base(static_cast<size_t>(rows)), out_values(base.size());
  load_elements(in.data(), in.dtype(), 0, rows, base.data());
  for (int64_t r = 0; r < rows; ++r) {
    float added = 0.0f;  // the adapters' part, which a DoRA term scales; the linear's own bias it does not
    for (size_t t = 0; t < terms.size(); ++t) {
      const Tensor& b = terms[t].module->bias;
      const float own = b.defined() ? terms[t].scale * b.data_as<const float>()[r] : 0.0f;
      added = terms[t].module->magnitude.defined() ? factors[t][static_cast<size_t>(r)] * (added + own) : added + own;
    }
    out_values[static_cast<size_t>(r)] = base[static_cast<size_t>(r)] + added;
  }
  Tensor out = Tensor::empty(in.shape(), out_dtype);
  store_elements(out_values.data(), rows, out_dtype, out.data(), 0);
  return out;
}

}  // namespace

std::vector<LoraApplication> LoraStack::applications() const {
  std::vector<LoraApplication> out;
  for (size_t i = 0; i < adapters.size(); ++i) out.push_back({&adapters[i], strengths[i]});
  return out;
}

std::map<std::string, std::vector<LoraTerm>> lora_terms_by_linear(const std::vector<LoraApplication>& loras) {
  std::map<std::string, std::vector<LoraTerm>> out;
  for (const LoraApplication& lora : loras) {
    for (const LoraModule& m : lora.adapter->modules) {
      out[m.target].push_back({&m, static_cast<float>(lora.strength * m.scale)});
    }
  }
  return out;
}

bool has_dora(const std::vector<LoraTerm>& terms) {
  return std::any_of(terms.begin(), terms.end(), [](const LoraTerm& t) { return t.module->magnitude.defined(); });
}

bool has_bias(const std::vector<LoraTerm>& terms) {
  return std::any_of(terms.begin(), terms.end(), [](const LoraTerm& t) { return t.module->bias.defined(); });
}

Status check_lora_fits(const std::vector<LoraTerm>& terms, const std::string& weight_name, const Tensor& weight) {
  const LoraModule& first = *terms.front().module;
  if (weight.rank() != 2 || weight.size(0) != first.up.size(0) || weight.size(1) != first.down.size(1)) {
    return invalid_argument("LoRA module " + quote(first.source) + " does not fit " + quote(weight_name) + " " +
                            weight.describe());
  }
  return ok_status();
}

Status dora_zero_norm_error(const LoraModule& module, const std::string& weight_name, int64_t row) {
  return invalid_argument("DoRA module " + quote(module.source) + ": row " + std::to_string(row) + " of " +
                          quote(weight_name) + " plus its delta is all zeros, which its magnitude cannot scale");
}

std::vector<std::string> LoraModule::merged_tensors() const {
  std::vector<std::string> out = {target + ".weight"};
  if (bias.defined()) out.push_back(target + ".bias");
  return out;
}

Status merge_loras(NamedTensors& tensors, const std::vector<LoraApplication>& loras, DType model_dtype) {
  if (!mergeable(model_dtype)) {
    return invalid_argument(std::string("LoRA merge: weights of dtype ") + dtype_name(model_dtype) +
                            " (F32, BF16 or F16)");
  }
  const std::map<std::string, std::vector<LoraTerm>> terms = lora_terms_by_linear(loras);
  std::map<std::string, RowFactors> factors;  // per linear whose weight merged here
  for (auto& [name, tensor] : tensors) {
    if (!name.ends_with(".weight")) continue;
    auto it = terms.find(name.substr(0, name.size() - 7));
    if (it == terms.end()) continue;
    VORTEX_RETURN_IF_ERROR(check_lora_fits(it->second, name, tensor));
    const DType out = is_fp32_island(name) ? DType::kF32 : model_dtype;
    VORTEX_ASSIGN_OR_RETURN(tensor, merged_weight(name, tensor, it->second, out, factors[it->first]));
  }
  for (auto& [name, tensor] : tensors) {
    if (!name.ends_with(".bias")) continue;
    const std::string linear = name.substr(0, name.size() - 5);
    auto it = terms.find(linear);
    if (it == terms.end() || !has_bias(it->second)) continue;
    const LoraModule& first = *it->second.front().module;
    if (tensor.rank() != 1 || tensor.size(0) != first.up.size(0)) {
      return invalid_argument("LoRA module " + quote(first.source) + " does not fit " + quote(name) + " " +
                              tensor.describe());
    }
    auto f = factors.find(linear);
    if (has_dora(it->second) && f == factors.end()) {
      return invalid_argument("LoRA merge: " + quote(name) + " came without " + quote(linear + ".weight") +
                              ", whose DoRA factors it needs");
    }
    const DType out = is_fp32_island(name) ? DType::kF32 : model_dtype;
    VORTEX_ASSIGN_OR_RETURN(tensor, merged_bias(tensor, it->second, f == factors.end() ? RowFactors() : f->second, out));
  }
  return ok_status();
}

}  // namespace vortex::h3
