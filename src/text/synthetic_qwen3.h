// A Qwen3-VL text encoder checkpoint with seeded weights, in the Hugging Face layout
// (config.json and model.safetensors, `model.language_model.*`): what `vortex bench text-encode`
// times at the released widths, and what the tests encode prompts with. The released weights are
// not reachable from the project's machines; these stand in for them.
#pragma once

#include <cstdint>
#include <string>

#include "vortex/status.h"

namespace vortex::text {

struct SyntheticQwen3Shape {
  int64_t vocab = 1000, hidden = 8, heads = 2, kv_heads = 1, head_dim = 4, intermediate = 16, layers = 2;
  // A vision tower (qwen3_vision_encoder.h) of this many blocks, 0 for none: width 16, 2 heads,
  // FFN 32, patch 16, merge 2, a 4 × 4 learned position grid, DeepStack after block 0; with it
  // the config names Qwen's vision token ids and preprocessor_config.json is written too (min_pixels
  // 32 · 32, so small canvases need no resize).
  int64_t vision_depth = 0;
};

// The released Qwen3-VL language model's widths (hidden 5120, 64 query / 8 key-value heads of
// 128, FFN 25600, vocabulary 151936) with `layers` decoder layers.
SyntheticQwen3Shape released_qwen3_shape(int64_t layers);

// Writes `dir`/config.json and `dir`/model.safetensors (bf16). Linear weights are N(0, 1) ·
// 0.3 · sqrt(8 / fan-in), norm weights 1 + 0.1 · N(0, 1), the embedding N(0, 1): the states stay
// O(1) over the layers. The normals are the counter-based ones of core/rng.h (key `seed`, one
// stream per tensor), so the same call writes the same bytes on any machine and thread count.
Status write_synthetic_qwen3(const std::string& dir, const SyntheticQwen3Shape& shape, uint64_t seed = 23);

}  // namespace vortex::text
