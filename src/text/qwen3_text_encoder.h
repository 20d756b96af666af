// The Qwen3-VL text encoder H3 is conditioned on: token ids in, the hidden state after decoder
// layer `layer` (50 for the released model) out, unnormalised, [tokens, hidden] BF16.
//
// A text-only presentation (the prompt's tokens, no vision blocks) runs the language model's
// decoder layers alone: token embedding, then per layer
//   h = x + o_proj(attn(rope(q_norm(q_proj(n))), rope(k_norm(k_proj(n))), v_proj(n))), n = rmsnorm(x)
//   x = h + down_proj(R(silu(gate_proj(m))) * up_proj(m)),                                m = rmsnorm(h)
// with causal grouped-query attention (scale 1/sqrt(head_dim)) and rotate-half RoPE over the whole
// head at position = token index. Qwen3-VL's interleaved multimodal RoPE gives every axis that
// same position when there are no vision tokens, so it is plain RoPE there. Later layers and the
// final norm are never run (the H3 pipeline reads `hidden_states[layer]` of the reference).
//
// A presentation with images (fl2va's keyframes) changes three things, as Qwen3VLModel does:
// each run of `<|image_pad|>` ids — or of `<|video_pad|>` ids, one per vision block of a video
// (ref2va's video references) — takes one image's (block's) merged vision features
// (qwen3_vision_encoder.h) in place of its embedding rows, in order; the positions become 3-D (t, h, w):
// text continues one past the previous maximum on all three axes, an image's tokens sit at
// (start, start + row, start + column) of its merged grid and advance the next start by
// max(rows, columns); channel pair k of the head takes the h position when k % 3 == 1 and
// k < 3 · mrope_section[1], the w position when k % 3 == 2 and k < 3 · mrope_section[2], the t
// position otherwise. After decoder layer i < the number of DeepStack features, those rows get
// R(x + deepstack[i]) — except after the last layer run: the reference's hidden_states[layer] is
// that layer's output before its add.
//
// The CPU program rounds where the bf16 reference rounds: each linear's output, RMSNorm's
// normalised value before and after its weight (the module casts, then multiplies), RoPE's
// products and sum, SiLU, the gate product and each residual sum.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "text/qwen3_vision_encoder.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::text {

// The released Qwen3-VL's layer whose output conditions H3 (diffusers' `text_encoder_layer`).
constexpr int kH3TextEncoderLayer = 50;

struct Qwen3TextConfig {
  int64_t vocab_size = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 0.0;
  std::array<int64_t, 3> mrope_section{24, 20, 20};  // rope_parameters.mrope_section (t, h, w)
  int64_t image_token_id = -1;  // Qwen3-VL's `<|image_pad|>` (-1: a text-only config)
  int64_t video_token_id = -1;  // its `<|video_pad|>` (-1: none in the config)

  // From a Qwen3-VL config.json (its `text_config`) or a Qwen3 text config; errors name the field.
  static Result<Qwen3TextConfig> from_json(const nlohmann::json& config, const std::string& where);
};

class Qwen3TextEncoder {
 public:
  // `path`: a directory with config.json and the weights (one safetensors file or a sharded
  // index), in the Hugging Face layout (`model.language_model.layers.N...` for Qwen3-VL,
  // `model.layers.N...` for a Qwen3 text model). Only layers [0, layer) are read; the checkpoint
  // may hold more (the released one has 64) or exactly `layer`. Weights stay memory-mapped.
  static Result<Qwen3TextEncoder> load(const std::string& path, int layer = kH3TextEncoderLayer);

  // [ids.size(), hidden] BF16: the hidden state after `layer` decoder layers. An id outside the
  // vocabulary is an error naming its position; an empty list gives [0, hidden]. `images`: the
  // vision features of the presentation's image-pad runs, in order (their count and sizes must
  // match the runs').
  Result<Tensor> encode(const std::vector<int32_t>& ids, const std::vector<VisionFeatures>& images = {}) const;

  // What the images add to the language model's input, checked against the ids.
  using Positions = std::array<std::vector<int64_t>, 3>;  // t, h, w of every token
  struct VisionRows {
    struct Run {
      int64_t start = 0, count = 0;  // one image's image-pad rows [start, start + count)
    };
    std::vector<Run> runs;          // ascending, one per image
    Tensor embeds;                  // [pad rows, hidden] BF16: the merged features, image after image
    std::vector<Tensor> deepstack;  // per DeepStack layer, [pad rows, hidden] BF16 (those past
                                    // the last layer run are never added)
    Positions positions;
  };
  Result<VisionRows> vision_rows(const std::vector<int32_t>& ids, const std::vector<VisionFeatures>& images) const;
  // embed() with the images' merged features in their runs' rows; *rows gets vision_rows().
  Result<Tensor> embed_presentation(const std::vector<int32_t>& ids, const std::vector<VisionFeatures>& images,
                                    VisionRows* rows) const;
  // Whether DeepStack feature `layer` is added after decoder layer `layer` of this encoder.
  bool adds_deepstack_after(size_t layer, const VisionRows& rows) const {
    return layer < rows.deepstack.size() && layer + 1 < layers_.size();
  }
  // op(features, x's rows) for each image's run: `features` holds the pad rows in run order (the
  // merged embeddings or one DeepStack layer's, on the host or the device, as x is).
  template <typename Op>
  static Status for_each_run(const VisionRows& rows, const Tensor& features, const Tensor& x, Op op) {
    int64_t offset = 0;
    for (const auto& run : rows.runs) {
      VORTEX_ASSIGN_OR_RETURN(const Tensor from, features.slice(0, offset, offset + run.count));
      VORTEX_ASSIGN_OR_RETURN(const Tensor to, x.slice(0, run.start, run.start + run.count));
      VORTEX_RETURN_IF_ERROR(op(from, to));
      offset += run.count;
    }
    return ok_status();
  }

  const Qwen3TextConfig& config() const { return config_; }
  int layer() const { return layer_; }
  const std::string& source() const { return source_; }

  // The two steps every backend shares (the CUDA encoder, cuda_qwen3_text_encoder.h, too):
  // the ids checked and their embedding rows gathered, [N, hidden] BF16; and the RoPE tables at
  // positions 0..N-1 (or the given 3-D positions) over the whole head, F32 [N, head_dim] each, as
  // the reference computes them.
  Result<Tensor> embed(const std::vector<int32_t>& ids) const;
  struct RopeTables {
    Tensor cos, sin;
  };
  RopeTables rope_tables(int64_t n) const;
  RopeTables rope_tables(const Positions& positions) const;

  struct Layer {
    Tensor input_norm, q, k, v, q_norm, k_norm, o, post_norm, gate, up, down;
  };
  // Layers [0, layer()), their weights memory-mapped (BF16 or F32).
  const std::vector<Layer>& layers() const { return layers_; }
  // Bytes of those layers' weights as stored.
  uint64_t layer_bytes() const;
  // What the CUDA encoder allocates for them (cuda_qwen3_text_encoder.h): the linears in bf16 and
  // the norms as stored, each tensor's start aligned to `alignment` bytes.
  uint64_t device_weight_bytes(uint64_t alignment) const;

 private:
  Qwen3TextConfig config_;
  int layer_ = 0;
  std::string source_;
  Tensor embed_tokens_;  // [vocab, hidden]
  std::vector<Layer> layers_;
};

}  // namespace vortex::text
