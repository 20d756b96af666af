// LoRA adapters merged into the weights as they upload: the bits merge_loras (lora.h) computes on
// the host, with the targeted weights merged on the device (cuda/lora_merge.h) under
// VORTEX_VARIANT_LORA_MERGE=device: `generate --lora` and serve's per-request adapters on a GPU then
// cost the upload of the weights they change.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "models/h3/cuda_transformer.h"
#include "models/h3/lora.h"

namespace vortex::h3 {

// A WeightFiller for `base` (diffusers names, every tensor of the model) with `loras` merged as
// merge_loras(base, loras, merge_dtype) merges them. A targeted weight uploads as it is and merges
// on the device in place; a lora_B bias merges on the host (a vector), and so does the weight of a
// linear where a DoRA module meets a lora_B bias (the bias needs the weight's DoRA factors) or whose
// dtypes the device merge does not take. Every other tensor uploads as host_weight_filler uploads it.
// The filler keeps `base` and `loras` alive. VORTEX_VARIANT_LORA_MERGE=host merges every targeted
// tensor on the host instead (the path the device merge is held bitwise equal to; the default until
// the device merge's GPU tests have run, which the pool's machines did not allow in session 54).
WeightFiller lora_merging_filler(NamedTensors base, std::shared_ptr<const LoraStack> loras, DType merge_dtype,
                                 cudaStream_t stream);
// VORTEX_VARIANT_LORA_MERGE's value, or the default's name ("device" or "host").
std::string lora_merge_variant();

}  // namespace vortex::h3
