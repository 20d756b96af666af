// LoRA adapters merged into the weights as they upload: the bits merge_loras (lora.h) computes on
// the host, with the targeted weights merged on the device (cuda/lora_merge.h): `generate --lora`
// and serve's per-request adapters on a GPU then cost the upload of the weights they change
// (VORTEX_VARIANT_LORA_MERGE=device, below).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "models/h3/cuda_transformer.h"
#include "models/h3/lora.h"

namespace vortex::h3 {

// A WeightFiller for `base` (every tensor of the model) with `loras` merged as
// merge_loras(base, loras, merge_dtype) merges them. A targeted weight uploads as it is and merges
// on the device in place; a lora_B bias merges on the host (a vector), and so does the weight of a
// linear where a DoRA module meets a lora_B bias (the bias needs the weight's DoRA factors), whose
// dtypes the device merge does not take, or with more terms than one device merge takes (64).
// Every other tensor uploads as host_weight_filler uploads it. Nothing here waits for the device:
// the caller synchronises its stream before reading, and a DoRA row that its magnitude cannot
// scale (W + delta all zeros: merge_loras' error) is reported by finish(), or by a later fill once
// a few hundred DoRA weights are pending. The filler keeps `base` and `loras` alive, and one DoRA
// workspace (128 MB at most) from its first DoRA merge to finish().
WeightFiller lora_merging_filler(HostWeights base, std::shared_ptr<const LoraStack> loras, DType merge_dtype,
                                 cudaStream_t stream);
// Whether the model's loaders and switches merge on the device (lora_merging_filler) or merge the
// whole model on the host first (merge_loras, then host_weight_filler: the path the device merge is
// held bitwise equal to): VORTEX_VARIANT_LORA_MERGE=device|host, the device by default (its GPU
// tests passed on an H100 in session 55, under both settings).
Result<bool> lora_merge_on_device();

}  // namespace vortex::h3
