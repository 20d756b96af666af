// The MiniMax-H3 transformer on one GPU: the same numerical program as the CPU reference
// (transformer.h), op for op, on the CUDA backend. bf16 with exact attention by default. Opt-in,
// approximate: int8fp8 attention per request / block, and the fp8 recipe for the block linears
// (cuda_block_fp8.cc). On by default, bitwise equal to what they replace: the block-boundary
// fusions and a CUDA graph of the block stack (cuda_graph.h).
//
// Memory: one arena for the weights, sized from the schema, and one for activations, sized up
// front for `max_rows` packed rows (the blocks' working buffers for this rank's share of them under
// sequence parallelism), in which buffers with disjoint lifetimes share memory; the
// step loop allocates nothing. The time MLP and the RoPE
// tables are computed on the host in fp32 (tiny, and it keeps them bit-identical to the CPU
// reference) and uploaded once per step / request.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/gemm_fp8.h"
#include "cuda/profiler.h"
#include "cuda/runtime.h"
#include "models/h3/cuda_graph.h"
#include "models/h3/device_memory_plan.h"
#include "models/h3/sequence_parallel.h"
#include "models/h3/step_model.h"
#include "models/h3/transformer.h"
#include "models/h3/weights.h"

namespace vortex::h3 {

// Writes the weight called `spec.name` (diffusers layout) into `dst`, a contiguous device tensor
// of spec.shape in its storage dtype (F32 for the fp32 islands, BF16 otherwise), in the order of
// its stream. A filler may leave a check of what it wrote to run on the device (the LoRA merge's
// DoRA zero-norm check, cuda_lora_merge.h) so that the host goes on to the next weight meanwhile:
// finish() waits for those and returns the first failure. Whoever fills calls finish() after its
// last fill and before the weights are used; a filler stays usable after it. The fills between
// two finish() calls are a batch, whose copies a filler may queue ahead of work the caller queued
// after the batch's earlier fills (the merging filler's copy stream), except where they rewrite an
// earlier fill's dst: between fills the caller queues nothing that writes a later fill's dst.
class WeightFiller {
 public:
  using Fill = std::function<Status(const TensorSpec& spec, const Tensor& dst)>;
  using Finish = std::function<Status()>;

  WeightFiller() = default;
  WeightFiller(Fill fill, Finish finish) : fill_(std::move(fill)), finish_(std::move(finish)) {}
  // A filler that checks nothing later (finish() has nothing to wait for).
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, WeightFiller> &&
                                                    std::is_invocable_r_v<Status, F&, const TensorSpec&, const Tensor&>>>
  WeightFiller(F fill) : fill_(std::move(fill)) {}  // NOLINT(google-explicit-constructor): lambdas fill

  Status operator()(const TensorSpec& spec, const Tensor& dst) const { return fill_(spec, dst); }
  Status finish() const { return finish_ ? finish_() : ok_status(); }

 private:
  Fill fill_;
  Finish finish_;
};

// From host tensors (HostWeights: diffusers names, or an original layout's parts written from their
// rows of the fused weights; any float dtype). A quantized weight with its side tensors (fp8, NVFP4, GGUF blocks;
// scaled_weights.h) is dequantized as it is written: on the device, or on the host where `where`
// says so (kConfigured: VORTEX_VARIANT_DEQUANTIZE, read once here; the device when it is unset).
enum class DequantizeOn { kConfigured, kDevice, kHost };
WeightFiller host_weight_filler(HostWeights weights, cudaStream_t stream,
                                DequantizeOn where = DequantizeOn::kConfigured);
// One weight as host_weight_filler writes it: `weight` is HostWeights::weight(spec.name)'s answer
// (the tensor, a quantized one with its side tensors); kConfigured reads the variable each call.
Status write_host_weight(const NamedTensors& weight, const TensorSpec& spec, const Tensor& dst, cudaStream_t stream,
                         DequantizeOn where = DequantizeOn::kConfigured);
// A loader's VORTEX_VARIANT_* setting that says where its work runs: true for "device" (and unset
// or empty), false for "host"; anything else is an error naming the variable.
Result<bool> device_variant(const char* variable);
// The synthetic benchmark weights, made on the device (identical to the host writer's).
WeightFiller synthetic_weight_filler(uint64_t seed, cudaStream_t stream);

// Where each transformer block's AdaLN modulation table (shift, scale, gate x 2 per timestep and
// modality) comes from. kPerStep: one GEMM per block per step from AdaLN weights kept on the
// device (26 GB of the 66 GB at the released size). kPerRequest: plan_steps() computes the tables
// of the request's whole schedule up front with the same GEMMs (so bitwise equal), refilling one
// block's AdaLN weights at a time through a staging buffer; they never stay on the device and a
// step runs no AdaLN GEMM. The filler given to create() must stay valid for plan_steps().
enum class AdaLnTables { kPerStep, kPerRequest };

struct CudaModelOptions {
  // Reserve the int8fp8 attention workspace (about 0.8 GB at the canonical shape) so requests may
  // ask for that mode; it needs head dim 128.
  bool int8fp8_attention = false;
  // Fuse the residual updates, RMSNorms and AdaLN modulations at the block boundaries
  // (cuda::rms_norm_fused). Bitwise equal to the separate launches (tests/gpu/test_gpu_h3_fusions.cc
  // checks the block output and a 2-step trajectory); off runs the separate launches.
  bool fused_norms = true;
  // transformer.h defines the recipes. fp8 here: the producers' kernels write the e4m3 codes, and
  // cuBLASLt accumulates in fp32 and applies both scales in its epilogue (cuda_block_fp8.cc); the
  // CPU model's fp8 recipe is its reference.
  LinearRecipe recipe = LinearRecipe::kBf16;
  // Replay forward()'s device work (the input projections, the block stack, the output norm and
  // heads: everything between the copies of the step's rows in and of the velocities out) from a
  // CUDA graph captured once per (rows of each stream, timesteps, attention plan); the same kernels
  // with the same arguments, so the outputs are bitwise those of direct launches
  // (tests/gpu/test_gpu_h3_fusions.cc). Off while a profiler is attached.
  bool cuda_graphs = true;
  // Where the blocks' AdaLN modulation tables come from (see AdaLnTables).
  AdaLnTables adaln_tables = AdaLnTables::kPerStep;
  // Diagnostics: give q/k/v their own buffer, so that attention_inputs() still holds them after
  // the block's FFN ran (by default the FC1 output reuses that memory; about 2.2 GB more at the
  // canonical shape).
  bool keep_attention_inputs = false;
  // Apply each transformer block's FFN gated residual (x += gate_mlp · FFN output) in the next
  // block's first norm, through rms_norm_fused's residual path as the attention residual already
  // is, and the last block's before the output norm: one pass over the residual stream fewer per
  // block. Needs fused_norms and AdaLnTables::kPerRequest (each block's gates stay in its own
  // table until the next block reads them); ignored otherwise. Bitwise equal to the separate pass
  // (2-step trajectory, both recipes, with and without the graph: tests/gpu/test_gpu_h3_adaln_tables.cc,
  // passed on the H200).
  bool fold_ffn_residual = true;
  // Sequence parallelism: this model is one rank of a group (sequence_parallel.h; it must outlive
  // the model). Either recipe, either attention mode. The blocks' working buffers hold the rank's
  // share of the rows; a request with more text rows than that runs the refiner in buffers made
  // for it by prepare().
  SequenceParallelPeer* sequence_parallel = nullptr;
};

class CudaH3Transformer : public StepModel {
 public:
  static Result<std::unique_ptr<CudaH3Transformer>> create(const H3Config& config, const WeightFiller& fill,
                                                           int64_t max_rows, cudaStream_t stream = nullptr,
                                                           const CudaModelOptions& options = {});

  const H3Config& config() const override { return config_; }
  size_t weight_bytes() const { return weights_arena_.used(); }
  size_t activation_peak_bytes() const { return activations_.peak(); }
  cudaStream_t stream() const { return stream_; }

  // Uploads the layout (indices, tags, RoPE tables) and runs context embedder + refiner.
  Status prepare(const PackedLayout& layout, const Tensor& text_states) override;
  // One forward over the prepared request; inputs and outputs are host tensors.
  Result<StepOutputs> forward(const StepInputs& inputs);
  Result<StepOutputs> step(const StepInputs& inputs) override { return forward(inputs); }
  // AdaLnTables::kPerRequest: computes every block's modulation table for each step's distinct
  // timesteps (cuda_adaln_tables.cc); forwards whose timesteps were not planned are refused. A
  // no-op under kPerStep.
  Status plan_steps(const std::vector<std::vector<float>>& step_timesteps) override;

  // Device-level pieces for the bench and the GPU tests. After upload_step_tables, run_block
  // applies one transformer block in place to the packed residual stream [N, C] bf16.
  const Tensor& residual() const { return x_; }
  Status upload_step_tables(const RowTimesteps& timesteps);
  Status run_block(int index, AttentionMode mode = AttentionMode::kExact);
  // Host copies, for peers that recompute a block from the same inputs (bench, tests).
  Result<NamedTensors> download_block_weights(int index) const;  // names relative to the block
  Result<Tensor> time_embedding_host(const std::vector<float>& timesteps) const;  // [T, TE] F32
  Result<Tensor> download_rope(bool cos) const;                                  // [N, rotary] F32
  Result<Tensor> download_adaln_rows() const;                                    // [N] I32
  // q, k, v of the last block run as its attention read them (after QK norm and RoPE), columns
  // [0, inner), [inner, 2·inner), [2·inner, 3·inner) of a device [N, 3·inner] BF16 tensor. Needs
  // CudaModelOptions::keep_attention_inputs.
  Result<Tensor> attention_inputs() const;
  // Brackets every op of the following blocks with events (null: off).
  void set_profiler(cuda::SectionProfiler* profiler) { profiler_ = profiler; }
  // Switches the block-boundary fusion (CudaModelOptions::fused_norms) for the following forwards.
  void set_fused_norms(bool on) { fused_norms_ = on; }
  // Switches CudaModelOptions::cuda_graphs for the following forwards.
  void set_cuda_graphs(bool on) { cuda_graphs_ = on; }
  // Switches CudaModelOptions::fold_ffn_residual for the following forwards.
  void set_fold_ffn_residual(bool on) { fold_ffn_residual_ = on; }

  // Writes the weights named in `names` (diffusers names) again from `fill`, in place, as create()
  // wrote them (the fp8 recipe quantizes a changed linear again); `fill` then stands for the whole
  // model (AdaLnTables::kPerRequest streams the AdaLN weights from it in plan_steps). The captured
  // graphs stay valid: no address changes. For serve's per-request LoRA adapters
  // (cuda_transformer_reload.cc).
  Status refill_weights(const WeightFiller& fill, const std::set<std::string>& names);
  // refill_weights from lora_merging_filler (cuda_lora_merge.h).
  Status merge_adapters(const HostWeights& base, std::shared_ptr<const LoraStack> loras, DType merge_dtype,
                        const std::set<std::string>& names) override;

 private:
  struct Linear {
    Tensor weight, bias;  // device
  };
  struct Block {
    int index = -1;  // transformer blocks: position in the stack; refiner blocks: -1
    Tensor norm1, norm2, norm_q, norm_k;
    Linear qkv, out, fc1, fc2, adaln;  // under the fp8 recipe, qkv / out / fc1 / fc2 hold biases only
    struct {
      cuda::Fp8Weight qkv, out, fc1, fc2;  // out: block scales [inner / 128, C] (linear_blocks)
    } fp8;  // the fp8 recipe's transformer-block weights
  };

  // A block's FFN residual not yet added to x (CudaModelOptions::fold_ffn_residual): the FC2 output
  // and the gate_mlp columns of the block's own table, both left untouched until the next block's
  // first norm reads them.
  struct PendingResidual {
    TensorView branch, gate;
  };

  static constexpr int64_t kMaxTimesteps = kDeviceMaxTimesteps;

  // A transformer block's linear under the fp8 recipe: the bf16 weights it was quantized from.
  struct Fp8Slot {
    enum Linear { kQkv, kOut, kFc1, kFc2 };
    int block = 0;
    Linear linear = kQkv;
    std::vector<TensorSpec> parts;  // q, k, v for kQkv; else the one weight
    cuda::Fp8Weight& in(Block& b) const {
      return linear == kQkv ? b.fp8.qkv : linear == kOut ? b.fp8.out : linear == kFc1 ? b.fp8.fc1 : b.fp8.fc2;
    }
  };

  CudaH3Transformer() = default;
  Status load_weights(const WeightFiller& fill);
  // The working buffers of one block, [rows, ·] each: the transformer blocks' (this rank's share
  // of the rows) or, in prepare(), the refiner's when the text rows are more than that.
  struct BlockBuffers {
    Tensor h, branch, qkv, attn, fc1, swiglu;
  };
  Status allocate_activations(int64_t max_rows, int64_t block_rows);
  // Context embedder, refiner blocks and final norm: the request's raw text states (host BF16
  // [n, text_dim]) into `text` (device [n, C]).
  Status refine_text(const Tensor& text_host, const Tensor& text);
  Status linear(const Linear& l, const Tensor& x, const Tensor& y);
  Status attention_half(const Block& b, const Tensor& h, bool rope, AttentionMode mode, const Tensor& out);
  // The attention output as the fp8 recipe's out projection reads it: e4m3 codes [n, inner] and one
  // scale per 128 tokens × one head (cpu::Fp8BlockLayout::kTiles).
  struct E4m3Tiles {
    TensorView codes;   // set by attention_core
    TensorView scales;  // given
  };
  // QK norm + RoPE in place on the [n, 3·inner] qkv buffer, then attention into attn [n, inner].
  // With `e4m3`, the output is quantized and e4m3->codes says where the codes are: the int8fp8
  // kernel (fused norms) and the exact v1 kernel quantize their own tiles into attn's memory
  // (attn_codes_) and write no bf16 output; the other paths write attn, then quantize_blocks_fp8
  // reads it into codes_. (codes_ shares memory with the int8fp8 workspace, which the kernel is
  // still reading while it writes.)
  Status attention_core(const Block& b, const Tensor& qkv, bool rope, AttentionMode mode, const Tensor& attn,
                        E4m3Tiles* e4m3 = nullptr);
  Result<Tensor> block_modulation(const Block& b);
  // silu(time embedding) of the timesteps, rounded to bf16: what the AdaLN and output-norm linears read.
  Result<Tensor> silu_time_embedding(const std::vector<float>& timesteps) const;  // host [T, TE]
  // kPerRequest: copies the planned tables of these timesteps into block_tables_ and their
  // silu(temb) into `silu` (device [T, TE]) (cuda_adaln_tables.cc).
  Status select_planned_step(const std::vector<float>& timesteps, const Tensor& silu);
  // A transformer block under the fp8 recipe (cuda_block_fp8.cc); pending_in / pending_out as in
  // block_forward.
  Status block_forward_fp8(const Block& b, const Tensor& x, const Tensor& adaln_rows, AttentionMode mode,
                           const PendingResidual* pending_in,
                           PendingResidual* pending_out);
  // block_scales: one scale per output channel and 128 inputs (the out projection's weight),
  // else one per output channel. The codes and scales go into the weights arena, or `destination`.
  Status load_fp8_linear(const WeightFiller& fill, const TensorSpec* const* parts, int count, cuda::DeviceArena& staging,
                         bool block_scales, cuda::Fp8Weight& out, cuda::DeviceArena* destination = nullptr);
  Status feed_forward(const Block& b, const Tensor& h, const Tensor& out);
  // One block in place on x. pending_in: the previous block's FFN residual, added by this block's
  // first norm; pending_out: where to leave this block's instead of adding it (both transformer
  // blocks with fused norms only).
  Status block_forward(const Block& b, const Tensor& x, const Tensor* adaln_rows,
                       AttentionMode mode = AttentionMode::kExact, const PendingResidual* pending_in = nullptr,
                       PendingResidual* pending_out = nullptr);
  bool folds_ffn_residual() const {
    return fold_ffn_residual_ && fused_norms_ && adaln_tables_ == AdaLnTables::kPerRequest;
  }

  H3Config config_;
  LinearWeights time_linear_1_, time_linear_2_;  // host F32: the time MLP runs on the host
  cudaStream_t stream_ = nullptr;
  cuda::SectionProfiler* profiler_ = nullptr;
  cuda::DeviceArena weights_arena_, activations_;
  cuda::DeviceArena int8fp8_scratch_;  // empty unless CudaModelOptions::int8fp8_attention
  cuda::DeviceArena text_arena_;       // the refined text stream, sized per request by prepare()
  // AdaLnTables::kPerRequest: the weight filler (to stream the AdaLN weights in plan_steps), the
  // planned steps' tables, and the current step's table per block (fixed addresses, so a captured
  // graph reads whichever step was selected).
  AdaLnTables adaln_tables_ = AdaLnTables::kPerStep;
  WeightFiller filler_;
  cuda::DeviceArena planned_arena_;
  struct PlannedStep {
    std::vector<float> timesteps;
    Tensor silu;                 // [T, TE] BF16: silu(time embedding)
    std::vector<Tensor> tables;  // per block [T, 18C] BF16
  };
  std::vector<PlannedStep> planned_;
  std::vector<Tensor> block_tables_;  // per block [kMaxTimesteps, 18C] BF16
  std::unique_ptr<cuda::GemmRunner> gemm_;
  std::unique_ptr<cuda::Fp8GemmRunner> fp8_gemm_;  // the fp8 recipe only
  LinearRecipe recipe_ = LinearRecipe::kBf16;
  Linear proj_in_, audio_proj_in_, context_embedder_, norm_out_linear_, proj_out_, audio_proj_out_;
  Tensor refiner_final_norm_, norm_out_norm_;
  std::vector<Block> refiner_, blocks_;
  // Where load_weights wrote each weight it keeps as given (the time MLP's are downloaded from
  // theirs), and the fp8 recipe's quantized linears: what refill_weights writes again.
  std::unordered_map<std::string, Tensor> resident_;
  std::vector<Fp8Slot> fp8_slots_;

  int64_t max_rows_ = 0;
  const PackedLayout* layout_ = nullptr;
  // Activations (device).
  Tensor x_;
  BlockBuffers work_;
  // fp8 recipe, at the blocks' rows (work_'s): e4m3 [B, max(C, inner, F)] activations, F32 [B] scales
  Tensor codes_, code_scales_;
  Tensor tile_scales_;          // fp8 recipe: the attention output's block scales (E4m3Tiles)
  Tensor attn_codes_;           // fp8 recipe: e4m3 [B, inner] in work_.attn's memory (E4m3Tiles)
  Tensor rope_cos_, rope_sin_, text_tokens_;
  Tensor text_idx_, audio_idx_, video_idx_;  // int64
  Tensor adaln_rows_, timestep_rows_;        // int32
  Tensor silu_temb_, mod_table_, out_mod_;
  Tensor video_in_, audio_in_, video_out_, audio_out_;
  // F32 [ActivationPlan::embed_rows, C]: the video, then the audio patch embeddings / head inputs,
  // in chunks of its rows where it holds fewer than a stream's (a sequence-parallel rank)
  Tensor embed_;
  int64_t num_timesteps_ = 0;
  bool fused_norms_ = true;
  bool cuda_graphs_ = true;
  bool keep_attention_inputs_ = false;
  bool fold_ffn_residual_ = true;
  SequenceParallelPeer* sequence_parallel_ = nullptr;
  // The transformer blocks' first packed row: the rank's under sequence parallelism, else 0 (where
  // their RoPE rows start).
  int64_t block_row_begin_ = 0;
  CapturedGraph forward_graph_;  // forward()'s device work, keyed by rows, timesteps and attention plan
};

}  // namespace vortex::h3
