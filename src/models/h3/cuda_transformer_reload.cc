// Writing some of a loaded model's weights again, in place: serve switches LoRA adapters between
// requests without loading the model again, merging them as they are written. The same fills
// load_weights made, into the tensors it allocated, and under the fp8 recipe the same quantization
// of each changed linear, so the model then computes what a model created from the new weights
// computes, bit for bit.
#include <algorithm>

#include "core/quote.h"
#include "models/h3/cuda_lora_merge.h"
#include "models/h3/cuda_transformer.h"

namespace vortex::h3 {

Status CudaH3Transformer::refill_weights(const WeightFiller& fill, const std::set<std::string>& names) {
  std::unordered_map<std::string, TensorSpec> specs;
  for (TensorSpec& spec : diffusers_schema(config_)) specs.emplace(spec.name, std::move(spec));
  const auto quantized = [&](const Fp8Slot& slot) {
    return std::any_of(slot.parts.begin(), slot.parts.end(), [&](const TensorSpec& p) { return names.count(p.name); });
  };
  // Every name is checked before anything is written.
  for (const std::string& name : names) {
    if (!specs.count(name)) return invalid_argument("refill_weights: the model has no weight " + quote(name));
    const bool streamed = adaln_tables_ == AdaLnTables::kPerRequest && name.find(".adaln_proj.") != std::string::npos;
    const bool in_fp8 = std::any_of(fp8_slots_.begin(), fp8_slots_.end(), [&](const Fp8Slot& slot) {
      return std::any_of(slot.parts.begin(), slot.parts.end(), [&](const TensorSpec& p) { return p.name == name; });
    });
    if (!resident_.count(name) && !in_fp8 && !streamed) {
      return internal_error("refill_weights: " + quote(name) + " has no place on the device");
    }
  }

  // The weights kept as given: the fill writes them where they are.
  bool time_mlp = false;
  for (const std::string& name : names) {
    const auto it = resident_.find(name);
    if (it == resident_.end()) continue;
    VORTEX_RETURN_IF_ERROR(fill(specs.at(name), it->second));
    time_mlp = time_mlp || name.starts_with("time_embedder.");
  }
  if (time_mlp) {  // the time MLP runs on the host, from copies of its device weights
    for (auto [prefix, target] : {std::pair{"time_embedder.linear_1", &time_linear_1_},
                                  std::pair{"time_embedder.linear_2", &time_linear_2_}}) {
      VORTEX_ASSIGN_OR_RETURN(target->weight, cuda::download(resident_.at(std::string(prefix) + ".weight"), stream_));
      VORTEX_ASSIGN_OR_RETURN(target->bias, cuda::download(resident_.at(std::string(prefix) + ".bias"), stream_));
    }
  }

  // The fp8 recipe's linears: filled in bf16 and quantized as at load into arenas of their own,
  // then copied over the codes and scales they replace.
  if (std::any_of(fp8_slots_.begin(), fp8_slots_.end(), quantized)) {
    const H3Config& c = config_;
    const size_t widest = static_cast<size_t>(std::max(3 * c.inner_dim() * c.hidden_size, 2 * c.ffn_dim * c.hidden_size));
    VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena staging, cuda::DeviceArena::create(widest * 2 + 4096));
    // e4m3 codes and at most one scale per 128 inputs of each row, with room to align.
    VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena codes, cuda::DeviceArena::create(widest + widest / 32 + (1 << 16)));
    for (const Fp8Slot& slot : fp8_slots_) {
      if (!quantized(slot)) continue;
      std::vector<const TensorSpec*> parts;
      for (const TensorSpec& p : slot.parts) parts.push_back(&p);
      cuda::Fp8Weight fresh;
      VORTEX_RETURN_IF_ERROR(load_fp8_linear(fill, parts.data(), static_cast<int>(parts.size()), staging,
                                             slot.linear == Fp8Slot::kOut, fresh, &codes));
      cuda::Fp8Weight& target = slot.in(blocks_.at(static_cast<size_t>(slot.block)));
      for (auto [from, to] : {std::pair{&fresh.codes, &target.codes}, std::pair{&fresh.scales, &target.scales}}) {
        if (from->shape() != to->shape() || from->dtype() != to->dtype()) {
          return internal_error("refill_weights: block " + std::to_string(slot.block) + "'s fp8 linear changed shape");
        }
        VORTEX_CUDA_CHECK(cudaMemcpyAsync(to->data(), from->data(), to->nbytes(), cudaMemcpyDeviceToDevice, stream_));
      }
      VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the next linear reuses `codes`
      codes.release_to(0);
    }
  }

  VORTEX_RETURN_IF_ERROR(fill.finish());
  // AdaLN weights that stay off the device are streamed from the filler in plan_steps.
  if (adaln_tables_ == AdaLnTables::kPerRequest) filler_ = fill;
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ok_status();
}

Status CudaH3Transformer::merge_adapters(const HostWeights& base, std::shared_ptr<const LoraStack> loras,
                                         DType merge_dtype, const std::set<std::string>& names) {
  VORTEX_ASSIGN_OR_RETURN(const bool on_device, lora_merge_on_device());
  if (on_device) return refill_weights(lora_merging_filler(base, std::move(loras), merge_dtype, stream_), names);
  VORTEX_ASSIGN_OR_RETURN(NamedTensors merged, base.all());
  VORTEX_RETURN_IF_ERROR(merge_loras(merged, loras->applications(), merge_dtype));
  return refill_weights(host_weight_filler(std::move(merged), stream_), names);
}

}  // namespace vortex::h3
