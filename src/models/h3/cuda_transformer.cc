#include "models/h3/cuda_transformer.h"

#include <cmath>
#include <string>
#include <tuple>
#include <unordered_map>

#include "cpu/elementwise.h"
#include "cuda/attention.h"
#include "cuda/attention_int8fp8.h"
#include "cuda/elementwise.h"
#include "cuda/fp8_blocks.h"
#include "cuda/profiler.h"
#include "cuda/synthetic_fill.h"
#include "models/h3/checkpoint_writer.h"
#include "models/h3/synthetic_rule.h"
#include "models/h3/tensor_views.h"

namespace vortex::h3 {

namespace {

const int32_t* i32(const Tensor& t) { return t.data_as<int32_t>(); }

const int64_t* i64(const Tensor& t) { return t.data_as<int64_t>(); }

// Refuses up front, naming the sizes, a model that cannot fit in what the device has free
// (otherwise the weight or activation arena fails later with a bare byte count).
Status check_fits_on_device(const H3Config& c, int64_t rows, int64_t block_rows, const CudaModelOptions& o) {
  const bool adaln_resident = o.adaln_tables == AdaLnTables::kPerStep;
  const size_t weights = device_weight_bytes(c, o.recipe, adaln_resident);
  const size_t activations =
      plan_activations(c, rows, o.recipe, o.keep_attention_inputs, !adaln_resident, block_rows).total;
  size_t free_bytes = 0, total_bytes = 0;
  VORTEX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (weights + activations <= free_bytes) return ok_status();
  std::string hint;
  if (o.recipe == LinearRecipe::kBf16) hint += "; the fp8 recipe stores the block linears in half the bytes";
  if (adaln_resident) {
    const size_t adaln = weights - device_weight_bytes(c, o.recipe, false);
    hint += "; AdaLN tables per request keep the " + human_bytes(adaln) + " of AdaLN weights off the device";
  }
  return out_of_memory("the model needs " + human_bytes(weights) + " of weights and " + human_bytes(activations) +
                       " of activations for " + std::to_string(rows) + " rows, and the device has " +
                       human_bytes(free_bytes) + " free" + hint);
}

}  // namespace

WeightFiller synthetic_weight_filler(uint64_t seed, cudaStream_t stream) {
  return [seed, stream](const TensorSpec& spec, const Tensor& dst) -> Status {
    const SyntheticInit init = synthetic_init(spec);
    if (init.kind == SyntheticInit::Kind::kConstant) return cuda::fill_constant(dst, init.constant, stream);
    return cuda::fill_scaled_normal(dst, seed, init.stream, init.scale, stream);
  };
}

Result<std::unique_ptr<CudaH3Transformer>> CudaH3Transformer::create(const H3Config& config, const WeightFiller& fill,
                                                                     int64_t max_rows, cudaStream_t stream,
                                                                     const CudaModelOptions& options) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  if (options.recipe == LinearRecipe::kFp8) VORTEX_RETURN_IF_ERROR(check_cuda_fp8_widths(config));
  if (max_rows < 1) return invalid_argument("max_rows must be >= 1, got " + std::to_string(max_rows));
  // Under sequence parallelism the blocks hold this rank's share of the rows, and its attention
  // covers its share of the heads (over every row).
  SequenceParallelPeer* const peer = options.sequence_parallel;
  const int64_t block_rows = peer ? peer->max_rows_per_rank(max_rows) : max_rows;
  const int64_t attention_heads = peer ? peer->attention_heads() : config.num_attention_heads;
  VORTEX_RETURN_IF_ERROR(check_fits_on_device(config, max_rows, block_rows, options));
  std::unique_ptr<CudaH3Transformer> model(new CudaH3Transformer());
  model->sequence_parallel_ = options.sequence_parallel;
  model->config_ = config;
  model->stream_ = stream;
  model->fused_norms_ = options.fused_norms;
  model->recipe_ = options.recipe;
  model->cuda_graphs_ = options.cuda_graphs;
  model->keep_attention_inputs_ = options.keep_attention_inputs;
  model->fold_ffn_residual_ = options.fold_ffn_residual;
  model->adaln_tables_ = options.adaln_tables;
  if (options.adaln_tables == AdaLnTables::kPerRequest) model->filler_ = fill;
  VORTEX_RETURN_IF_ERROR(model->load_weights(fill));
  VORTEX_RETURN_IF_ERROR(model->allocate_activations(max_rows, block_rows));
  VORTEX_ASSIGN_OR_RETURN(model->gemm_, cuda::GemmRunner::create(model->activations_));
  if (options.recipe == LinearRecipe::kFp8) {
    VORTEX_ASSIGN_OR_RETURN(model->fp8_gemm_, cuda::Fp8GemmRunner::create(model->activations_));
  }
  if (options.int8fp8_attention) {
    if (config.attention_head_dim != cuda::kInt8Fp8HeadDim) {
      return invalid_argument("int8fp8 attention needs head dim " + std::to_string(cuda::kInt8Fp8HeadDim) +
                              "; this model's is " + std::to_string(config.attention_head_dim));
    }
    // The quantized q/k/v live only inside attention, when the SwiGLU output is dead: they share
    // its memory when they fit (they do at the released shapes).
    const size_t bytes = cuda::int8fp8_workspace_bytes(max_rows, max_rows, attention_heads) + 4096;
    if (bytes <= model->work_.swiglu.nbytes()) {
      VORTEX_ASSIGN_OR_RETURN(model->int8fp8_scratch_, cuda::DeviceArena::within(model->work_.swiglu));
    } else {
      VORTEX_ASSIGN_OR_RETURN(model->int8fp8_scratch_, cuda::DeviceArena::create(bytes));
    }
  }
  return model;
}

Status CudaH3Transformer::load_weights(const WeightFiller& fill) {
  const std::vector<TensorSpec> schema = diffusers_schema(config_);
  const bool fp8 = recipe_ == LinearRecipe::kFp8;
  const bool adaln_resident = adaln_tables_ == AdaLnTables::kPerStep;
  VORTEX_ASSIGN_OR_RETURN(weights_arena_, cuda::DeviceArena::create(device_weight_bytes(config_, recipe_, adaln_resident)));
  // fp8: each block linear is filled in bf16 here, then quantized into the weights arena.
  cuda::DeviceArena staging;
  if (fp8) {
    const H3Config& c = config_;
    const int64_t widest = std::max({3 * c.inner_dim() * c.hidden_size, 2 * c.ffn_dim * c.hidden_size});
    VORTEX_ASSIGN_OR_RETURN(staging, cuda::DeviceArena::create(static_cast<size_t>(widest) * 2 + 4096));
  }
  std::unordered_map<std::string, const TensorSpec*> specs;
  for (const auto& spec : schema) specs[spec.name] = &spec;

  auto weight = [&](const std::string& name) -> Result<Tensor> {
    auto it = specs.find(name);
    if (it == specs.end()) return internal_error("no schema entry for '" + name + "'");
    const TensorSpec& spec = *it->second;
    VORTEX_ASSIGN_OR_RETURN(Tensor t, weights_arena_.alloc(spec.shape, spec.fp32_island ? DType::kF32 : DType::kBF16));
    VORTEX_RETURN_IF_ERROR(fill(spec, t));
    resident_[name] = t;
    return t;
  };
  auto linear = [&](const std::string& prefix, bool bias) -> Result<Linear> {
    Linear l;
    VORTEX_ASSIGN_OR_RETURN(l.weight, weight(prefix + ".weight"));
    if (bias) {
      VORTEX_ASSIGN_OR_RETURN(l.bias, weight(prefix + ".bias"));
    }
    return l;
  };
  auto block = [&](const std::string& p, bool adaln) -> Result<Block> {
    Block b;
    if (adaln) b.index = static_cast<int>(blocks_.size());
    VORTEX_ASSIGN_OR_RETURN(b.norm1, weight(p + ".norm1.weight"));
    VORTEX_ASSIGN_OR_RETURN(b.norm2, weight(p + ".norm2.weight"));
    VORTEX_ASSIGN_OR_RETURN(b.norm_q, weight(p + ".attn.norm_q.weight"));
    VORTEX_ASSIGN_OR_RETURN(b.norm_k, weight(p + ".attn.norm_k.weight"));
    if (fp8 && adaln) {
      const TensorSpec* qkv[3] = {specs.at(p + ".attn.to_q.weight"), specs.at(p + ".attn.to_k.weight"),
                                  specs.at(p + ".attn.to_v.weight")};
      VORTEX_RETURN_IF_ERROR(load_fp8_linear(fill, qkv, 3, staging, false, b.fp8.qkv));
      fp8_slots_.push_back({b.index, Fp8Slot::kQkv, {*qkv[0], *qkv[1], *qkv[2]}});
      for (auto [name, target, which] : {std::tuple{".attn.to_out.0.weight", &b.fp8.out, Fp8Slot::kOut},
                                         std::tuple{".ff.net.0.proj.weight", &b.fp8.fc1, Fp8Slot::kFc1},
                                         std::tuple{".ff.net.2.weight", &b.fp8.fc2, Fp8Slot::kFc2}}) {
        const TensorSpec* part = specs.at(p + name);
        VORTEX_RETURN_IF_ERROR(load_fp8_linear(fill, &part, 1, staging, which == Fp8Slot::kOut, *target));
        fp8_slots_.push_back({b.index, which, {*part}});
      }
      if (adaln_resident) {
        VORTEX_ASSIGN_OR_RETURN(b.adaln, linear(p + ".adaln_proj.linear", true));
      }
      return b;
    }
    // One fused [3 * inner, C] QKV weight: q, k and v fill consecutive row ranges.
    const int64_t inner = config_.inner_dim();
    VORTEX_ASSIGN_OR_RETURN(b.qkv.weight, weights_arena_.alloc({3 * inner, config_.hidden_size}, DType::kBF16));
    const char* parts[3] = {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight"};
    for (int i = 0; i < 3; ++i) {
      VORTEX_ASSIGN_OR_RETURN(Tensor rows, b.qkv.weight.slice(0, i * inner, (i + 1) * inner));
      VORTEX_RETURN_IF_ERROR(fill(*specs.at(p + parts[i]), rows));
      resident_[p + parts[i]] = rows;
    }
    VORTEX_ASSIGN_OR_RETURN(b.out, linear(p + ".attn.to_out.0", false));
    VORTEX_ASSIGN_OR_RETURN(b.fc1, linear(p + ".ff.net.0.proj", false));
    VORTEX_ASSIGN_OR_RETURN(b.fc2, linear(p + ".ff.net.2", false));
    if (adaln && adaln_resident) {
      VORTEX_ASSIGN_OR_RETURN(b.adaln, linear(p + ".adaln_proj.linear", true));
    }
    return b;
  };

  VORTEX_ASSIGN_OR_RETURN(proj_in_, linear("proj_in", true));
  VORTEX_ASSIGN_OR_RETURN(audio_proj_in_, linear("audio_proj_in", true));
  VORTEX_ASSIGN_OR_RETURN(context_embedder_, linear("context_embedder", true));
  // The time MLP runs on the host in fp32: fill on the device, then keep a host copy.
  for (auto [prefix, target] : {std::pair{"time_embedder.linear_1", &time_linear_1_},
                                std::pair{"time_embedder.linear_2", &time_linear_2_}}) {
    VORTEX_ASSIGN_OR_RETURN(Linear l, linear(prefix, true));
    VORTEX_ASSIGN_OR_RETURN(target->weight, cuda::download(l.weight, stream_));
    VORTEX_ASSIGN_OR_RETURN(target->bias, cuda::download(l.bias, stream_));
  }
  for (int i = 0; i < config_.num_refiner_layers; ++i) {
    VORTEX_ASSIGN_OR_RETURN(Block b, block("token_refiner.refiner_blocks." + std::to_string(i), false));
    refiner_.push_back(std::move(b));
  }
  VORTEX_ASSIGN_OR_RETURN(refiner_final_norm_, weight("token_refiner.final_norm.weight"));
  for (int i = 0; i < config_.num_layers; ++i) {
    VORTEX_ASSIGN_OR_RETURN(Block b, block("transformer_blocks." + std::to_string(i), true));
    blocks_.push_back(std::move(b));
  }
  VORTEX_ASSIGN_OR_RETURN(norm_out_norm_, weight("norm_out.norm.weight"));
  VORTEX_ASSIGN_OR_RETURN(norm_out_linear_, linear("norm_out.linear", true));
  VORTEX_ASSIGN_OR_RETURN(proj_out_, linear("proj_out", true));
  VORTEX_ASSIGN_OR_RETURN(audio_proj_out_, linear("audio_proj_out", true));
  VORTEX_RETURN_IF_ERROR(fill.finish());
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ok_status();
}

// Fills the parts of one linear (q, k, v stacked for the fused QKV) in bf16 into `staging`, then
// quantizes them per output channel (or per output channel and 128 inputs) into the weights arena
// (or `destination`).
Status CudaH3Transformer::load_fp8_linear(const WeightFiller& fill, const TensorSpec* const* parts, int count,
                                          cuda::DeviceArena& staging, bool block_scales, cuda::Fp8Weight& out,
                                          cuda::DeviceArena* destination) {
  cuda::DeviceArena& into = destination ? *destination : weights_arena_;
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) rows += parts[i]->shape[0];
  const size_t mark = staging.mark();
  const Status status = [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(Tensor w, staging.alloc({rows, parts[0]->shape[1]}, DType::kBF16));
    int64_t row = 0;
    for (int i = 0; i < count; ++i) {
      VORTEX_ASSIGN_OR_RETURN(Tensor slice, w.slice(0, row, row + parts[i]->shape[0]));
      VORTEX_RETURN_IF_ERROR(fill(*parts[i], slice));
      row += parts[i]->shape[0];
    }
    VORTEX_ASSIGN_OR_RETURN(out, block_scales ? cuda::quantize_weight_fp8_blocks(w, into, stream_)
                                              : cuda::quantize_weight_fp8(w, into, stream_));
    // The next linear reuses the staging memory: the quantize pass must have read it.
    VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return ok_status();
  }();
  staging.release_to(mark);
  return status;
}

Status CudaH3Transformer::allocate_activations(int64_t max_rows, int64_t block_rows) {
  max_rows_ = max_rows;
  const H3Config& c = config_;
  const int64_t N = max_rows, B = block_rows, C = c.hidden_size, inner = c.inner_dim(), F = c.ffn_dim;
  // Which buffers share memory, and the arena's size: device_memory_plan.h.
  const bool planned_tables = adaln_tables_ == AdaLnTables::kPerRequest;
  const ActivationPlan plan = plan_activations(c, N, recipe_, keep_attention_inputs_, planned_tables, B);
  VORTEX_ASSIGN_OR_RETURN(activations_, cuda::DeviceArena::create(plan.total));
  cuda::DeviceArena& a = activations_;
  VORTEX_ASSIGN_OR_RETURN(x_, a.alloc({N, C}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(work_.h, a.alloc({B, C}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(work_.branch, a.alloc({B, C}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(Tensor shared, a.alloc({static_cast<int64_t>(plan.shared_bytes)}, DType::kU8));
  VORTEX_ASSIGN_OR_RETURN(work_.qkv, alias(shared, {B, 3 * inner}, DType::kBF16, 0));
  VORTEX_ASSIGN_OR_RETURN(work_.attn, alias(shared, {B, inner}, DType::kBF16, plan.qkv_slot));
  VORTEX_ASSIGN_OR_RETURN(work_.fc1, alias(shared, {B, 2 * F}, DType::kBF16,
                                           keep_attention_inputs_ ? plan.attention_bytes : 0));
  VORTEX_ASSIGN_OR_RETURN(work_.swiglu, a.alloc({B, F}, DType::kBF16));
  if (recipe_ == LinearRecipe::kFp8) {
    if (plan.codes_alias) {
      VORTEX_ASSIGN_OR_RETURN(codes_, alias(work_.swiglu, {B, plan.widest_input}, DType::kF8E4M3, 0));
    } else {
      VORTEX_ASSIGN_OR_RETURN(codes_, a.alloc({B, plan.widest_input}, DType::kF8E4M3));
    }
    VORTEX_ASSIGN_OR_RETURN(code_scales_, a.alloc({B}, DType::kF32));
    VORTEX_ASSIGN_OR_RETURN(tile_scales_,
                            a.alloc(cpu::fp8_block_scales(cpu::Fp8BlockLayout::kTiles, B, inner).shape, DType::kF32));
    VORTEX_ASSIGN_OR_RETURN(attn_codes_, alias(shared, {B, inner}, DType::kF8E4M3, plan.qkv_slot));
  }
  VORTEX_ASSIGN_OR_RETURN(rope_cos_, a.alloc({N, c.rotary_dim()}, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(rope_sin_, a.alloc({N, c.rotary_dim()}, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(text_idx_, a.alloc({N}, DType::kI64));
  VORTEX_ASSIGN_OR_RETURN(audio_idx_, a.alloc({N}, DType::kI64));
  VORTEX_ASSIGN_OR_RETURN(video_idx_, a.alloc({N}, DType::kI64));
  VORTEX_ASSIGN_OR_RETURN(adaln_rows_, a.alloc({N}, DType::kI32));
  VORTEX_ASSIGN_OR_RETURN(timestep_rows_, a.alloc({N}, DType::kI32));
  VORTEX_ASSIGN_OR_RETURN(silu_temb_, a.alloc({kMaxTimesteps, c.time_embed_dim}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(mod_table_, a.alloc({kMaxTimesteps, 18 * C}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(out_mod_, a.alloc({kMaxTimesteps, 2 * C}, DType::kBF16));
  for (int64_t i = 0; planned_tables && i < c.num_layers; ++i) {
    VORTEX_ASSIGN_OR_RETURN(Tensor table, a.alloc({kMaxTimesteps, 18 * C}, DType::kBF16));
    block_tables_.push_back(std::move(table));
  }
  VORTEX_ASSIGN_OR_RETURN(video_in_, a.alloc({N, c.video_patch_dim()}, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(audio_in_, a.alloc({N, c.audio_in_channels}, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(video_out_, a.alloc({N, c.video_patch_dim()}, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(audio_out_, a.alloc({N, c.audio_in_channels}, DType::kF32));
  if (plan.embeds_alias) {
    VORTEX_ASSIGN_OR_RETURN(embed_, alias(work_.fc1, {plan.embed_rows, C}, DType::kF32, 0));
  } else {
    VORTEX_ASSIGN_OR_RETURN(embed_, a.alloc({plan.embed_rows, C}, DType::kF32));
  }
  return ok_status();
}

Status CudaH3Transformer::linear(const Linear& l, const Tensor& x, const Tensor& y) {
  const TensorView bias = l.bias.defined() ? l.bias.view() : TensorView();
  return gemm_->linear(x.view(), l.weight.view(), l.bias.defined() ? &bias : nullptr, y.view(), stream_);
}

Status CudaH3Transformer::attention_half(const Block& b, const Tensor& h, bool rope, AttentionMode mode,
                                        const Tensor& out) {
  const int64_t n = h.size(0);
  VORTEX_ASSIGN_OR_RETURN(Tensor qkv, rows_of(work_.qkv, n));
  {
    cuda::SectionScope scope(profiler_, "gemm_qkv", stream_);
    VORTEX_RETURN_IF_ERROR(linear(b.qkv, h, qkv));
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor attn, rows_of(work_.attn, n));
  VORTEX_RETURN_IF_ERROR(attention_core(b, qkv, rope, mode, attn));
  cuda::SectionScope scope(profiler_, "gemm_out", stream_);
  return linear(b.out, attn, out);
}

Status CudaH3Transformer::attention_core(const Block& b, const Tensor& qkv, bool rope, AttentionMode mode,
                                        const Tensor& attn, E4m3Tiles* e4m3) {
  const H3Config& c = config_;
  const int64_t n = qkv.size(0), heads = c.num_attention_heads, d = c.attention_head_dim, inner = c.inner_dim();
  const TensorView q = heads_view(qkv, 0, heads, d), k = heads_view(qkv, inner, heads, d);
  const TensorView v = heads_view(qkv, 2 * inner, heads, d);
  const TensorView nq = b.norm_q.view(), nk = b.norm_k.view();
  const float eps = static_cast<float>(c.qk_norm_eps);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const TensorView out = heads_view(attn, 0, heads, d);
  if (mode == AttentionMode::kInt8Fp8 && int8fp8_scratch_.capacity() == 0) {
    return invalid_argument("int8fp8 attention was not enabled when this model was created");
  }
  Tensor cos, sin;
  if (rope) {  // transformer blocks: their rows start at block_row_begin_
    VORTEX_ASSIGN_OR_RETURN(cos, rope_cos_.slice(0, block_row_begin_, block_row_begin_ + n));
    VORTEX_ASSIGN_OR_RETURN(sin, rope_sin_.slice(0, block_row_begin_, block_row_begin_ + n));
  }
  const TensorView cos_view = cos.defined() ? cos.view() : TensorView(), sin_view = sin.defined() ? sin.view() : TensorView();
  const TensorView* cos_arg = rope ? &cos_view : nullptr;
  const TensorView* sin_arg = rope ? &sin_view : nullptr;
  // A transformer block on a sequence-parallel rank: q and k are normed and rotated on this rank's
  // rows in bf16, then attention runs over every row of this rank's heads (in either mode, a bf16
  // output; the fp8 recipe's tiles are quantized below, as where no kernel quantizes its own).
  const bool across_ranks = sequence_parallel_ != nullptr && rope;
  if (mode == AttentionMode::kInt8Fp8 && fused_norms_ && !across_ranks) {
    // Q's norm and RoPE run inside its quantization (bit for bit the separate passes): its bf16
    // rows are neither written nor read back.
    const size_t mark = int8fp8_scratch_.mark();
    const Status status = [&]() -> Status {
      VORTEX_ASSIGN_OR_RETURN(const cuda::Int8Fp8Workspace ws, cuda::int8fp8_workspace(int8fp8_scratch_, n, n, heads));
      {
        cuda::SectionScope scope(profiler_, "qk_norm_rope", stream_);
        VORTEX_RETURN_IF_ERROR(cuda::head_norm_rope(k, &nk, eps, cos_arg, sin_arg, stream_));
        VORTEX_RETURN_IF_ERROR(cuda::norm_rope_quantize_q_int8fp8(q, &nq, eps, cos_arg, sin_arg, ws, stream_));
      }
      cuda::SectionScope scope(profiler_, "attention", stream_);
      VORTEX_RETURN_IF_ERROR(cuda::quantize_int8fp8_kv(k, v, ws, stream_));
      if (e4m3) {
        VORTEX_ASSIGN_OR_RETURN(Tensor codes, attn_codes_.slice(0, 0, n));
        e4m3->codes = codes.view();
        return cuda::attention_int8fp8_quantized_e4m3(ws, e4m3->codes, e4m3->scales, scale, stream_);
      }
      return cuda::attention_int8fp8_quantized(ws, out, scale, stream_);
    }();
    int8fp8_scratch_.release_to(mark);
    return status;
  }
  {
    cuda::SectionScope scope(profiler_, "qk_norm_rope", stream_);
    if (fused_norms_) {
      VORTEX_RETURN_IF_ERROR(cuda::qk_norm_rope(q, k, &nq, &nk, eps, cos_arg, sin_arg, stream_));
    } else {
      VORTEX_RETURN_IF_ERROR(cuda::rms_norm(q, &nq, eps, q, stream_));
      VORTEX_RETURN_IF_ERROR(cuda::rms_norm(k, &nk, eps, k, stream_));
      if (rope) {
        VORTEX_RETURN_IF_ERROR(cuda::apply_rope(q, cos_view, sin_view, stream_));
        VORTEX_RETURN_IF_ERROR(cuda::apply_rope(k, cos_view, sin_view, stream_));
      }
    }
  }
  if (across_ranks) {
    cuda::SectionScope scope(profiler_, "attention", stream_);
    cuda::DeviceArena* scratch = mode == AttentionMode::kInt8Fp8 ? &int8fp8_scratch_ : nullptr;
    VORTEX_RETURN_IF_ERROR(
        sequence_parallel_->attention(layout_->num_rows, qkv.view(), attn.view(), scale, scratch, stream_));
  } else if (e4m3 && mode == AttentionMode::kExact) {
    // The v1 kernel (the default exact variant) quantizes its own output tiles (into attn's memory,
    // as the int8fp8 one); unimplemented (nothing launched) where it does not apply. Another
    // variant chosen by VORTEX_VARIANT_ATTENTION runs as chosen, followed by quantize_blocks_fp8.
    VORTEX_ASSIGN_OR_RETURN(const cuda::AttentionVariant variant, cuda::attention_variant_from_env());
    if (variant == cuda::AttentionVariant::kV1) {
      cuda::SectionScope scope(profiler_, "attention", stream_);
      VORTEX_ASSIGN_OR_RETURN(Tensor codes, attn_codes_.slice(0, 0, n));
      e4m3->codes = codes.view();
      const Status status = cuda::attention_quantized_e4m3(q, k, v, e4m3->codes, e4m3->scales, scale, stream_);
      if (status.code() != StatusCode::kUnimplemented) return status;
    }
  }
  if (!across_ranks) {
    cuda::SectionScope scope(profiler_, "attention", stream_);
    VORTEX_RETURN_IF_ERROR(mode == AttentionMode::kInt8Fp8
                               ? cuda::attention_int8fp8(q, k, v, out, scale, int8fp8_scratch_, stream_)
                               : cuda::attention(q, k, v, out, scale, stream_));
  }
  if (!e4m3) return ok_status();
  cuda::SectionScope scope(profiler_, "quantize", stream_);
  VORTEX_ASSIGN_OR_RETURN(Tensor codes, codes_.slice(0, 0, n));
  e4m3->codes = columns(codes, 0, inner);
  return cuda::quantize_blocks_fp8(attn.view(), cpu::Fp8BlockLayout::kTiles, e4m3->codes, e4m3->scales, stream_);
}

Status CudaH3Transformer::feed_forward(const Block& b, const Tensor& h, const Tensor& out) {
  const int64_t n = h.size(0);
  VORTEX_ASSIGN_OR_RETURN(Tensor u, rows_of(work_.fc1, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor p, rows_of(work_.swiglu, n));
  {
    cuda::SectionScope scope(profiler_, "gemm_fc1", stream_);
    VORTEX_RETURN_IF_ERROR(linear(b.fc1, h, u));
  }
  {
    cuda::SectionScope scope(profiler_, "swiglu", stream_);
    VORTEX_RETURN_IF_ERROR(cuda::swiglu(u.view(), p.view(), stream_));
  }
  cuda::SectionScope scope(profiler_, "gemm_fc2", stream_);
  return linear(b.fc2, p, out);
}

// The block's AdaLN table for this step's timesteps: [T, 18C] viewed as [3T, 6C] (a row per
// (timestep, modality)): shift, scale, gate for attention, then for the FFN.
Result<Tensor> CudaH3Transformer::block_modulation(const Block& b) {
  if (adaln_tables_ == AdaLnTables::kPerRequest) {  // selected by upload_step_tables
    VORTEX_ASSIGN_OR_RETURN(Tensor table, rows_of(block_tables_.at(b.index), num_timesteps_));
    return table.reshape({num_timesteps_ * kNumModalities, 6 * config_.hidden_size});
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor table, rows_of(mod_table_, num_timesteps_));
  VORTEX_ASSIGN_OR_RETURN(Tensor silu, rows_of(silu_temb_, num_timesteps_));
  cuda::SectionScope scope(profiler_, "gemm_adaln", stream_);
  VORTEX_RETURN_IF_ERROR(linear(b.adaln, silu, table));
  return table.reshape({num_timesteps_ * kNumModalities, 6 * config_.hidden_size});
}

// One block in place on x (the first x.size(0) rows). With AdaLN rows it is a transformer block
// (modulation + gates + RoPE); without, a refiner block (plain pre-norm, no RoPE).
Status CudaH3Transformer::block_forward(const Block& b, const Tensor& x, const Tensor* adaln_rows, AttentionMode mode,
                                        const PendingResidual* pending_in, PendingResidual* pending_out) {
  if ((pending_in || pending_out) && (!adaln_rows || !fused_norms_)) {
    return invalid_argument("block_forward: a folded FFN residual needs a transformer block with fused norms");
  }
  if (recipe_ == LinearRecipe::kFp8 && adaln_rows) {
    return block_forward_fp8(b, x, *adaln_rows, mode, pending_in, pending_out);
  }
  const int64_t n = x.size(0), C = config_.hidden_size;
  const float eps = static_cast<float>(config_.norm_eps);
  VORTEX_ASSIGN_OR_RETURN(Tensor h, rows_of(work_.h, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor branch, rows_of(work_.branch, n));
  const TensorView n1 = b.norm1.view(), n2 = b.norm2.view();
  Tensor mod;
  if (adaln_rows) {
    VORTEX_ASSIGN_OR_RETURN(mod, block_modulation(b));
  }
  // Transformer blocks: the modulation columns shift, scale, gate for attention, then for the FFN.
  const int32_t* rows = adaln_rows ? i32(*adaln_rows) : nullptr;
  TensorView shift1, scale1, gate1, shift2, scale2, gate2;
  if (adaln_rows) {
    TensorView* targets[] = {&shift1, &scale1, &gate1, &shift2, &scale2, &gate2};
    for (int k = 0; k < 6; ++k) *targets[k] = columns(mod, k * C, C);
  }
  const TensorView branch_view = branch.view();
  if (fused_norms_) {
    // Two passes instead of five: norm1 + modulation, then the attention residual + norm2 +
    // modulation (the refiner's plain residual and norms take the same kernels).
    cuda::NormFusion first, second{&branch_view};
    if (adaln_rows) {
      first = pending_in ? cuda::NormFusion{&pending_in->branch, &pending_in->gate, rows, &shift1, &scale1, rows}
                         : cuda::NormFusion{nullptr, nullptr, nullptr, &shift1, &scale1, rows};
      second = {&branch_view, &gate1, rows, &shift2, &scale2, rows};
    }
    {
      cuda::SectionScope scope(profiler_, pending_in ? "residual_norm_modulate" : "norm_modulate", stream_);
      VORTEX_RETURN_IF_ERROR(cuda::rms_norm_fused(x.view(), &n1, eps, first, h.view(), stream_));
    }
    VORTEX_RETURN_IF_ERROR(attention_half(b, h, adaln_rows != nullptr, mode, branch));
    cuda::SectionScope scope(profiler_, "residual_norm_modulate", stream_);
    VORTEX_RETURN_IF_ERROR(cuda::rms_norm_fused(x.view(), &n2, eps, second, h.view(), stream_));
  } else {
    {
      cuda::SectionScope scope(profiler_, "norm_modulate", stream_);
      VORTEX_RETURN_IF_ERROR(cuda::rms_norm(x.view(), &n1, eps, h.view(), stream_));
      if (adaln_rows) VORTEX_RETURN_IF_ERROR(cuda::adaln_modulate(h.view(), shift1, scale1, rows, h.view(), stream_));
    }
    VORTEX_RETURN_IF_ERROR(attention_half(b, h, adaln_rows != nullptr, mode, branch));
    {
      cuda::SectionScope scope(profiler_, "residual", stream_);
      VORTEX_RETURN_IF_ERROR(adaln_rows ? cuda::gated_residual(x.view(), gate1, rows, branch_view, stream_)
                                        : cuda::residual_add(x.view(), branch_view, stream_));
    }
    cuda::SectionScope scope(profiler_, "norm_modulate", stream_);
    VORTEX_RETURN_IF_ERROR(cuda::rms_norm(x.view(), &n2, eps, h.view(), stream_));
    if (adaln_rows) VORTEX_RETURN_IF_ERROR(cuda::adaln_modulate(h.view(), shift2, scale2, rows, h.view(), stream_));
  }
  VORTEX_RETURN_IF_ERROR(feed_forward(b, h, branch));
  if (pending_out) {
    *pending_out = {branch_view, gate2};
    return ok_status();
  }
  cuda::SectionScope final_residual(profiler_, "residual", stream_);
  return adaln_rows ? cuda::gated_residual(x.view(), gate2, rows, branch_view, stream_)
                    : cuda::residual_add(x.view(), branch_view, stream_);
}

Status CudaH3Transformer::run_block(int index, AttentionMode mode) {
  if (!layout_ || index < 0 || index >= static_cast<int>(blocks_.size())) {
    return invalid_argument("run_block " + std::to_string(index) + ": no such block or no prepared request");
  }
  if (sequence_parallel_) return unimplemented("run_block runs a block on one GPU; this model is a sequence-parallel rank");
  block_row_begin_ = 0;
  VORTEX_ASSIGN_OR_RETURN(Tensor x, rows_of(x_, layout_->num_rows));
  return block_forward(blocks_[index], x, &adaln_rows_, mode);
}

Result<Tensor> CudaH3Transformer::time_embedding_host(const std::vector<float>& timesteps) const {
  // The k-ordered loops, never the build's default GEMM: OpenBLAS picks its kernel by CPU and
  // size, so the device's latents would follow the host's BLAS and CPU (an OpenBLAS build and a
  // loops build gave the canonical denoise different checksums).
  return time_embedding(config_, time_linear_1_, time_linear_2_, timesteps, cpu::GemmVariant::kLoops);
}

Result<Tensor> CudaH3Transformer::silu_time_embedding(const std::vector<float>& timesteps) const {
  VORTEX_ASSIGN_OR_RETURN(Tensor temb, time_embedding_host(timesteps));
  cpu::silu_f32(temb);
  return temb.to(DType::kBF16);
}

Result<StepOutputs> CudaH3Transformer::forward(const StepInputs& in) {
  if (!layout_) return invalid_argument("forward before prepare");
  const PackedLayout& layout = *layout_;
  const H3Config& c = config_;
  const int64_t N = layout.num_rows, C = c.hidden_size;
  if (in.video_rows.rank() != 2 || in.video_rows.size(0) != layout.num_video ||
      in.video_rows.size(1) != c.video_patch_dim() || in.video_rows.dtype() != DType::kF32) {
    return invalid_argument("video rows must be f32[" + std::to_string(layout.num_video) + ", " +
                            std::to_string(c.video_patch_dim()) + "], got " + in.video_rows.describe());
  }
  if (in.audio_rows.rank() != 2 || in.audio_rows.size(0) != layout.num_audio ||
      in.audio_rows.size(1) != c.audio_in_channels || in.audio_rows.dtype() != DType::kF32) {
    return invalid_argument("audio rows must be f32[" + std::to_string(layout.num_audio) + ", " +
                            std::to_string(c.audio_in_channels) + "], got " + in.audio_rows.describe());
  }
  VORTEX_RETURN_IF_ERROR(upload_step_tables(in.timesteps));
  if (!in.attention.per_block.empty() && in.attention.per_block.size() != blocks_.size()) {
    return invalid_argument("attention plan names " + std::to_string(in.attention.per_block.size()) +
                            " blocks; the model has " + std::to_string(blocks_.size()));
  }
  // The step's rows come from the host; everything after their copies runs on the device alone.
  for (auto [host, in_buf] : {std::pair{&in.video_rows, &video_in_}, std::pair{&in.audio_rows, &audio_in_}}) {
    if (host->size(0) == 0) continue;
    VORTEX_ASSIGN_OR_RETURN(Tensor rows, rows_of(*in_buf, host->size(0)));
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(*host, rows, stream_));
  }
  const bool fold = folds_ffn_residual();
  block_row_begin_ = sequence_parallel_ ? sequence_parallel_->row_begin(N) : 0;
  const int64_t block_row_end = sequence_parallel_ ? sequence_parallel_->row_end(N) : N;
  const auto device_forward = [&]() -> Status {
    // 1. Project and scatter each stream into the packed sequence.
    VORTEX_ASSIGN_OR_RETURN(Tensor x, rows_of(x_, N));
    VORTEX_RETURN_IF_ERROR(cuda::fill_zero(x.view(), stream_));
    if (layout.num_text > 0) {
      VORTEX_ASSIGN_OR_RETURN(Tensor text, rows_of(text_tokens_, layout.num_text));
      VORTEX_RETURN_IF_ERROR(cuda::scatter_rows(text.view(), i64(text_idx_), x.view(), stream_));
    }
    // The fp32 embeddings pass through embed_ (a stream's rows at once, except on a sequence-
    // parallel rank whose FC1 memory holds fewer: chunks of embed_'s rows, device_memory_plan.h).
    const int64_t chunk = embed_.size(0);
    for (auto [n, in_buf, proj, index] : {std::tuple{layout.num_video, &video_in_, &proj_in_, &video_idx_},
                                          std::tuple{layout.num_audio, &audio_in_, &audio_proj_in_, &audio_idx_}}) {
      for (int64_t begin = 0; begin < n; begin += chunk) {
        const int64_t m = std::min(chunk, n - begin);
        VORTEX_ASSIGN_OR_RETURN(Tensor rows, in_buf->slice(0, begin, begin + m));
        VORTEX_ASSIGN_OR_RETURN(Tensor embed, rows_of(embed_, m));
        VORTEX_RETURN_IF_ERROR(linear(*proj, rows, embed));
        VORTEX_RETURN_IF_ERROR(cuda::scatter_rows(embed.view(), i64(*index) + begin, x.view(), stream_));
      }
    }

    // 2. The block stack, on this rank's rows under sequence parallelism (all rows otherwise).
    // With the FFN residual folded, block i leaves its residual in pending[i % 2] for block i + 1.
    VORTEX_ASSIGN_OR_RETURN(Tensor block_x, x.slice(0, block_row_begin_, block_row_end));
    VORTEX_ASSIGN_OR_RETURN(Tensor block_adaln, adaln_rows_.slice(0, block_row_begin_, block_row_end));
    PendingResidual pending[2];
    const PendingResidual* previous = nullptr;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      PendingResidual* mine = fold ? &pending[i % 2] : nullptr;
      VORTEX_RETURN_IF_ERROR(block_forward(blocks_[i], block_x, &block_adaln,
                                           in.attention.for_block(static_cast<int>(i)), previous, mine));
      previous = mine;
    }
    if (previous != nullptr) {
      cuda::SectionScope scope(profiler_, "residual", stream_);
      VORTEX_RETURN_IF_ERROR(
          cuda::gated_residual(block_x.view(), previous->gate, i32(block_adaln), previous->branch, stream_));
    }
    if (sequence_parallel_) VORTEX_RETURN_IF_ERROR(sequence_parallel_->gather_rows(N, x.view(), stream_));

    // 3. Output norm with per-timestep shift/scale, then the fp32 heads on their own rows.
    VORTEX_ASSIGN_OR_RETURN(Tensor out_mod, rows_of(out_mod_, num_timesteps_));
    VORTEX_ASSIGN_OR_RETURN(Tensor silu, rows_of(silu_temb_, num_timesteps_));
    VORTEX_RETURN_IF_ERROR(linear(norm_out_linear_, silu, out_mod));
    const TensorView w = norm_out_norm_.view();
    VORTEX_RETURN_IF_ERROR(cuda::rms_norm(x.view(), &w, static_cast<float>(c.final_norm_eps), x.view(), stream_));
    VORTEX_RETURN_IF_ERROR(cuda::adaln_modulate(x.view(), columns(out_mod, 0, C), columns(out_mod, C, C),
                                                i32(timestep_rows_), x.view(), stream_));
    for (auto [n, index, head, out_buf] : {std::tuple{layout.num_video, &video_idx_, &proj_out_, &video_out_},
                                           std::tuple{layout.num_audio, &audio_idx_, &audio_proj_out_, &audio_out_}}) {
      for (int64_t begin = 0; begin < n; begin += chunk) {
        const int64_t m = std::min(chunk, n - begin);
        VORTEX_ASSIGN_OR_RETURN(Tensor gathered, rows_of(embed_, m));  // the head's f32 inputs
        VORTEX_ASSIGN_OR_RETURN(Tensor velocity, out_buf->slice(0, begin, begin + m));
        VORTEX_RETURN_IF_ERROR(cuda::gather_rows(x.view(), i64(*index) + begin, gathered.view(), stream_));
        VORTEX_RETURN_IF_ERROR(linear(*head, gathered, velocity));
      }
    }
    return ok_status();
  };
  if (cuda_graphs_ && profiler_ == nullptr) {
    // Everything a replay bakes in: the rows, and those of each stream, the number of AdaLN rows
    // (the tables' contents are uploaded before each replay), the norm fusion switch, each block's
    // attention mode, and the text stream's buffer (reallocated when a request brings more text rows).
    std::string key = std::to_string(N) + "/" + std::to_string(block_row_begin_) + "/" + std::to_string(layout.num_text) + "/" +
                      std::to_string(layout.num_audio) + "/" + std::to_string(layout.num_video) + "/" +
                      std::to_string(num_timesteps_) + "/" +
                      (fused_norms_ ? "f" : "u") + (fold ? "r" : "") + "/" +
                      std::to_string(reinterpret_cast<uintptr_t>(text_tokens_.data())) + "/";
    for (size_t i = 0; i < blocks_.size(); ++i) {
      key += in.attention.for_block(static_cast<int>(i)) == AttentionMode::kInt8Fp8 ? 'q' : 'e';
    }
    if (!forward_graph_.matches(key)) VORTEX_RETURN_IF_ERROR(forward_graph_.capture(key, stream_, device_forward));
    VORTEX_RETURN_IF_ERROR(forward_graph_.launch(stream_));
  } else {
    VORTEX_RETURN_IF_ERROR(device_forward());
  }

  // 4. The velocities back to the host.
  StepOutputs out;
  for (auto [n, head, out_buf, result] :
       {std::tuple{layout.num_video, &proj_out_, &video_out_, &out.video_velocity},
        std::tuple{layout.num_audio, &audio_proj_out_, &audio_out_, &out.audio_velocity}}) {
    if (n == 0) {
      *result = Tensor::empty({0, head->weight.size(0)}, DType::kF32);
      continue;
    }
    VORTEX_ASSIGN_OR_RETURN(Tensor velocity, rows_of(*out_buf, n));
    VORTEX_ASSIGN_OR_RETURN(*result, cuda::download(velocity, stream_));
  }
  return out;
}

}  // namespace vortex::h3
