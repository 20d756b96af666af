// Synthetic H3 weights: the deterministic benchmark weights of DESIGN section 1.
//
// Every tensor is a pure function of (seed, diffusers name, shape, dtype), given by
// models/h3/synthetic_rule.h (fan-in-scaled Philox normals keyed by the FNV-1a hash of the name,
// modulation x0.1, biases 0, norms 1), so the same bytes come out whether the weights are made in
// memory, streamed to disk one block at a time, filled on the GPU, on any number of threads, in
// either layout. fp32 islands are F32; the rest is rounded to the model dtype (RNE, as Tensor::to
// rounds). Fan-in scaling keeps each projection's output near unit variance, and the small
// modulation keeps AdaLN's shift/scale/gate near the identity, so activations stay in a trained
// model's range through 50 blocks and kernels see realistic magnitudes.
#pragma once

#include <cstdint>
#include <string>

#include "models/h3/checkpoint_writer.h"
#include "models/h3/config.h"
#include "models/h3/weights.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

// One tensor of the schema. `dtype` is the model dtype (F32 or BF16); fp32 islands ignore it.
Result<Tensor> synthetic_tensor(const TensorSpec& spec, DType dtype, uint64_t seed);

// Every tensor of diffusers_schema(config), in memory (small configs; the h3 preset needs 62 GB).
Result<NamedTensors> synthetic_weights(const H3Config& config, DType dtype, uint64_t seed);

// Streams the synthetic weights into a checkpoint folder (see write_checkpoint): memory for one
// shard plus one block, whatever the config.
Status write_synthetic_checkpoint(const std::string& dir, const H3Config& config, DType dtype, uint64_t seed,
                                  const CheckpointWriteOptions& options);

}  // namespace vortex::h3
