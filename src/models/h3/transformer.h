// The MiniMax-H3 transformer on the CPU backend: the reference definition of its numerical
// program (DESIGN sections 1 and 3).
//
// A request is prepared once (RoPE tables from the layout, the refined text stream, which does
// not depend on the timestep) and then evaluated once per sampling step. Activations live in the
// model dtype (F32 or BF16) and are rounded exactly where the reference materialises a tensor;
// the time MLP, the patch projections and the output heads stay fp32.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/fp8.h"
#include "cpu/fp8_blocks.h"
#include "cpu/gemm.h"
#include "models/h3/layout.h"
#include "models/h3/weights.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

// Receives named intermediates during a forward (tests, debugging). Names: "temb", "rope_cos",
// "rope_sin", "refiner_out", "block_0_in", "block_<i>_out", "norm_out", "video_out", "audio_out".
using ForwardObserver = std::function<void(const std::string& name, const Tensor& value)>;

// What stays fixed across the steps of one request.
struct PreparedRequest {
  const PackedLayout* layout = nullptr;
  Tensor rope_cos, rope_sin;  // [N, rotary] F32
  Tensor text_tokens;         // [Nt, C] model dtype: context_embedder + refiner + final norm
};

// DESIGN section 3's attention modes. `exact` is the default; `int8fp8` (int8 Q/K, e4m3 V and P)
// is approximate (rel-L2 ~0.04 vs exact on N(0,1) inputs) and only ever runs when asked for.
enum class AttentionMode { kExact, kInt8Fp8 };
const char* attention_mode_name(AttentionMode mode);
Result<AttentionMode> attention_mode_from_name(const std::string& name);

// Which attention each transformer block runs: the request's mode, overridden per block (the
// refiner, which sees only the text rows, is always exact).
struct AttentionPlan {
  AttentionMode mode = AttentionMode::kExact;
  std::vector<AttentionMode> per_block;  // empty, or one entry per block
  AttentionMode for_block(int block) const {
    return block < static_cast<int>(per_block.size()) ? per_block[block] : mode;
  }
  bool uses(AttentionMode m) const;
  // "int8fp8" with "--exact-blocks 0,1,49": every block int8fp8 except the listed ones.
  static Result<AttentionPlan> parse(const std::string& mode, const std::vector<int>& exact_blocks, int num_blocks);
};

struct StepInputs {
  Tensor video_rows;  // [Nv, patch_dim] F32, packed order of layout.video_indices
  Tensor audio_rows;  // [Na, audio_in_channels] F32
  RowTimesteps timesteps;
  AttentionPlan attention;
};

struct StepOutputs {
  Tensor video_velocity;  // [Nv, patch_dim] F32
  Tensor audio_velocity;  // [Na, audio_in_channels] F32
};

// How the four linears of every transformer block compute (DESIGN section 3).
//   bf16  bf16 weights and activations, fp32 accumulation (the reference program).
//   fp8   e4m3 weights with one fp32 scale per output channel, quantized at load; e4m3
//         activations with one scale per token, written by the ops that produce them (norm +
//         modulation, SwiGLU, a quantize pass over the attention output); fp32 accumulation (the
//         CPU sums exactly, cpu/fp8.h), both scales applied after it. Approximate: its error
//         against bf16 is measured (bench h3-block, tests/test_h3_fp8.cc), and it runs only when
//         asked for. The refiner, embedders, AdaLN projections and output heads stay bf16 / fp32.
enum class LinearRecipe { kBf16, kFp8 };

struct CpuModelOptions {
  // kFp8 runs the CUDA model's fp8 block (cuda_block_fp8.cc) op for op with the cpu/fp8.h
  // references, so the GPU recipe has a CPU program to be checked against; it is not offered to
  // users on the CPU. It needs BF16 weights: the recipe quantizes the bf16 program's tensors.
  LinearRecipe recipe = LinearRecipe::kBf16;
};

// The fp32 time MLP on the host: sinusoid (cos first) -> linear_1 -> silu -> linear_2; [T, TE].
// `gemm` picks the CPU GEMM of the two linears (their summation order, hence the low bits).
Result<Tensor> time_embedding(const H3Config& config, const LinearWeights& linear_1, const LinearWeights& linear_2,
                              const std::vector<float>& timesteps,
                              cpu::GemmVariant gemm = cpu::default_gemm_variant());
// RoPE tables [N, rotary] F32 from float64 (t, h, w) positions, consumed in float32; the GPU program
// reads them too, so cos and sin are core/portable_math.h's, not libm's.
void rope_tables(const H3Config& config, const std::vector<double>& positions, Tensor& cos, Tensor& sin);

class H3Transformer {
 public:
  // Takes the weights and prepares them for the CPU GEMM (an fp32 copy of each bf16 matrix; under
  // the fp8 recipe, e4m3 codes and scales for the transformer blocks' linears instead).
  static Result<std::unique_ptr<H3Transformer>> create(H3Weights weights, const CpuModelOptions& options = {});

  const H3Config& config() const { return weights_.config; }
  const H3Weights& weights() const { return weights_; }
  DType dtype() const { return weights_.dtype; }
  LinearRecipe recipe() const { return recipe_; }

  // text_states: [Nt, text_dim] F32 or BF16, finite. Checks the layout against the config.
  Result<PreparedRequest> prepare(const PackedLayout& layout, const Tensor& text_states,
                                  const ForwardObserver* observer = nullptr) const;
  Result<StepOutputs> forward(const PreparedRequest& request, const StepInputs& inputs,
                              const ForwardObserver* observer = nullptr) const;


 private:
  struct Linear {
    cpu::PackedWeight weight;
    Tensor bias;
  };
  struct Block {
    Tensor norm1, norm2, norm_q, norm_k;
    Linear qkv, out, fc1, fc2, adaln;  // under the fp8 recipe, qkv / out / fc1 / fc2 hold biases only
    struct {
      cpu::Fp8Rows qkv, fc1, fc2;  // [O, I] e4m3 codes, [O] scales; qkv rows q_all; k_all; v_all
      cpu::Fp8Blocks out;          // [O, I] e4m3 codes, scales per row and 128 inputs (Fp8BlockLayout::kRows)
    } fp8;  // the fp8 recipe's transformer-block weights
  };

  H3Transformer(H3Weights weights, LinearRecipe recipe) : weights_(std::move(weights)), recipe_(recipe) {}
  Status pack();
  // The fp8 recipe's weights of one transformer block, quantized per output channel (block_fp8.cc).
  static Status quantize_block_fp8(const BlockWeights& w, Block& b);
  Status linear(const Linear& l, const Tensor& x, const Tensor& y) const;
  Status attention_half(const Block& b, const Tensor& h, const Tensor* cos, const Tensor* sin, AttentionMode mode,
                        const Tensor& out) const;
  // QK norm + RoPE (when cos is given) in place on the [n, 3·inner] qkv tensor, then attention into
  // attn [n, inner].
  Status attention_core(const Block& b, const Tensor& qkv, const Tensor* cos, const Tensor* sin, AttentionMode mode,
                        const Tensor& attn) const;
  // The block's AdaLN table [3T, 6C]: a row per (timestep, modality) holding shift, scale, gate
  // for attention, then for the FFN.
  Result<Tensor> block_modulation(const Block& b, const Tensor& silu_temb) const;
  Status feed_forward(const Block& b, const Tensor& h, const Tensor& out) const;
  Status refiner_block(const Block& b, Tensor& x) const;
  Status transformer_block(const Block& b, Tensor& x, const Tensor& silu_temb, const std::vector<int32_t>& rows,
                           const PreparedRequest& request, AttentionMode mode) const;
  // A transformer block under the fp8 recipe (block_fp8.cc).
  Status transformer_block_fp8(const Block& b, Tensor& x, const Tensor& silu_temb, const std::vector<int32_t>& rows,
                               const PreparedRequest& request, AttentionMode mode) const;

  H3Weights weights_;
  LinearRecipe recipe_ = LinearRecipe::kBf16;
  Linear proj_in_, audio_proj_in_, context_embedder_;
  Linear norm_out_linear_, proj_out_, audio_proj_out_;
  std::vector<Block> refiner_, blocks_;
};

}  // namespace vortex::h3
