// A Qwen3-VL text encoder checkpoint with seeded weights, in the Hugging Face layout
// (config.json and model.safetensors, `model.language_model.*`): what `vortex bench text-encode`
// times at the released widths, and what the tests encode prompts with. The released weights are
// not reachable from the project's machines; these stand in for them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vortex/status.h"

namespace vortex::text {

struct SyntheticQwen3Shape {
  int64_t vocab = 1000, hidden = 8, heads = 2, kv_heads = 1, head_dim = 4, intermediate = 16, layers = 2;
  // A vision tower (qwen3_vision_encoder.h) of this many blocks, 0 for none: patch 16, merge 2, and
  // the widths below; with it the config names Qwen's vision token ids and preprocessor_config.json
  // is written too (min_pixels 32 · 32, so small canvases need no resize).
  int64_t vision_depth = 0;
  int64_t vision_hidden = 16, vision_heads = 2, vision_intermediate = 32;
  int64_t vision_position_side = 4;                  // the learned position grid's side
  std::vector<int64_t> vision_deepstack_layers = {0};  // the blocks DeepStack features follow
};

// The released Qwen3-VL vision tower's widths on `shape` (27 blocks of 1152, 16 heads of 72, FFN
// 4304, a 48 × 48 position grid, DeepStack after blocks 8, 16 and 24).
void use_released_vision_tower(SyntheticQwen3Shape& shape);

// The released Qwen3-VL language model's widths (hidden 5120, 64 query / 8 key-value heads of
// 128, FFN 25600, vocabulary 151936) with `layers` decoder layers.
SyntheticQwen3Shape released_qwen3_shape(int64_t layers);

// Writes `dir`/config.json and `dir`/model.safetensors (bf16). Linear weights are N(0, 1) ·
// 0.3 · sqrt(8 / fan-in), norm weights 1 + 0.1 · N(0, 1), the embedding N(0, 1): the states stay
// O(1) over the layers. The normals are the counter-based ones of core/rng.h (key `seed`, one
// stream per tensor), so the same call writes the same bytes on any machine and thread count.
Status write_synthetic_qwen3(const std::string& dir, const SyntheticQwen3Shape& shape, uint64_t seed = 23);

}  // namespace vortex::text
