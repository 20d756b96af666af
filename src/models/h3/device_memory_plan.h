// The CUDA model's device memory, planned on the host: the weight arena for a recipe and AdaLN
// placement, and the activation arena for a number of packed rows, with the decisions about which
// buffers share memory. Under sequence parallelism a rank's transformer blocks work on its share
// of the rows only: their working buffers (h, branch, q/k/v, attention output, FC1, SwiGLU, the
// fp8 codes) are sized for that share, the residual stream, RoPE tables, inputs and outputs for
// the whole request, which every rank holds. The CUDA model (cuda_transformer.cc) sizes and
// carves its arenas from this plan; the CPU tests pin the canonical numbers, so a change that
// grows them shows without a GPU.
//
// Sharing (lifetimes that never overlap):
//   - q/k/v + attention output and the FC1 output: the attention half and the FFN half never run
//     at once ([qkv | attn] is FC1's width at the released shapes, 4·inner = 2·F);
//   - the fp32 patch embeddings and head inputs (before / after the block stack; video's and
//     audio's one after the other in one buffer) in FC1's memory: all rows where they fit, else on
//     a sequence-parallel rank as many as fit, the projections then running in chunks of that many
//     rows (on one GPU they get memory of their own instead, so its program never changes);
//   - the raw text states (read by the context embedder, before the refiner's FFN) in the SwiGLU
//     output's memory where they fit, else in memory prepare() takes for the call (not planned here);
//   - the fp8 recipe's e4m3 codes in the SwiGLU output's memory (the fp8 blocks never write it);
//   - the int8fp8 attention workspace in the SwiGLU output's memory (lives only inside attention;
//     decided by the CUDA model, which knows the workspace size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "models/h3/config.h"
#include "models/h3/transformer.h"
#include "vortex/status.h"

namespace vortex::h3 {

// Distinct noise levels one forward may carry (t2va uses 1 or 2).
constexpr int64_t kDeviceMaxTimesteps = 4;

// transformer_blocks.<i>.{attn.to_q, to_k, to_v, to_out.0, ff.net.0.proj, ff.net.2}.weight: what
// the fp8 recipe quantizes.
bool is_block_linear_weight(const std::string& diffusers_name);
// transformer_blocks.<i>.adaln_proj.linear.{weight,bias}: what AdaLN tables per request stream.
bool is_block_adaln_weight(const std::string& diffusers_name);

// Whether the CUDA model can run this config under the fp8 recipe: cuBLASLt's fp8 GEMMs take K
// and N in multiples of 16 (hidden size, inner dim, FFN width), and the inner dim must be a
// multiple of 128 (check_fp8_attention_width). invalid_argument names the width.
Status check_cuda_fp8_widths(const H3Config& config);

// Bytes of the weight arena: bf16 (fp32 islands in fp32), the fp8 recipe's block linears as e4m3
// plus one fp32 scale per row, without the blocks' AdaLN weights when they are not resident.
size_t device_weight_bytes(const H3Config& config, LinearRecipe recipe, bool adaln_resident);

struct ActivationPlan {
  size_t attention_bytes = 0;  // [qkv | attn] at the block rows
  size_t shared_bytes = 0;     // the region holding [qkv | attn] and FC1 (apart with keep_attention_inputs)
  size_t qkv_slot = 0;         // attn's offset in that region
  bool embeds_alias = false;   // the patch embeddings / head inputs (fp32) inside FC1's memory
  int64_t embed_rows = 0;      // their rows: the projections and heads run in chunks of this many
  bool codes_alias = false;    // fp8 codes inside the SwiGLU output's memory
  int64_t widest_input = 0;    // columns of the fp8 codes buffer
  size_t total = 0;            // the arena's size, slack and the GEMM workspaces included
};

// keep_attention_inputs: q/k/v get memory of their own (CudaModelOptions::keep_attention_inputs);
// planned_tables: the per-block AdaLN tables of the current step (AdaLnTables::kPerRequest);
// block_rows: the rows the blocks' working buffers hold (a sequence-parallel rank's largest share,
// 1..rows), 0 for `rows` (one GPU).
ActivationPlan plan_activations(const H3Config& config, int64_t rows, LinearRecipe recipe, bool keep_attention_inputs,
                                bool planned_tables, int64_t block_rows = 0);

}  // namespace vortex::h3
