// Fills device tensors with the synthetic weights of models/h3/synthetic_rule.h, on the GPU:
// the 31B-parameter canonical benchmark model is made in about a second instead of being
// generated on the host and copied.
#pragma once

#include <cuda_runtime.h>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// dst[i] = round(normal_at(seed, stream, i) * scale) for a contiguous F32 / BF16 device tensor.
Status fill_scaled_normal(const Tensor& dst, uint64_t seed, uint64_t stream, float scale, cudaStream_t s);
// dst[i] = round(value).
Status fill_constant(const Tensor& dst, float value, cudaStream_t s);

}  // namespace vortex::cuda
