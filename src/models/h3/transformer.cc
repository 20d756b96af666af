#include "models/h3/transformer.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/portable_math.h"
#include "cpu/attention.h"
#include "cpu/attention_int8fp8.h"
#include "cpu/elementwise.h"
#include "cpu/norm.h"
#include "models/h3/tensor_views.h"

namespace vortex::h3 {

namespace {

// out[index[i]] = src[i] (with dtype conversion: the reference's `.to(text dtype)` before the
// scatter into the packed buffer).
void scatter_rows(const Tensor& src, const std::vector<int64_t>& index, Tensor& out) {
  const int64_t c = src.size(1);
  std::vector<float> row(c);
  for (size_t i = 0; i < index.size(); ++i) {
    for (int64_t k = 0; k < c; ++k) row[k] = static_cast<float>(element_as_double(src, i * c + k));
    char* dst = static_cast<char*>(out.data()) + index[i] * c * static_cast<int64_t>(dtype_size(out.dtype()));
    if (out.dtype() == DType::kF32) {
      std::memcpy(dst, row.data(), c * sizeof(float));
    } else {
      uint16_t* b = reinterpret_cast<uint16_t*>(dst);
      for (int64_t k = 0; k < c; ++k) b[k] = f32_to_bf16_bits(row[k]);
    }
  }
}

// [index.size(), C] F32 copy of the selected rows (the output heads run in fp32).
Tensor gather_rows_f32(const Tensor& src, const std::vector<int64_t>& index) {
  const int64_t c = src.size(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(index.size()), c}, DType::kF32);
  float* o = out.data_as<float>();
  for (size_t i = 0; i < index.size(); ++i)
    for (int64_t k = 0; k < c; ++k) o[i * c + k] = static_cast<float>(element_as_double(src, index[i] * c + k));
  return out;
}

Status check_finite(const Tensor& t, const char* what) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(element_as_double(t, i))) {
      return invalid_argument(std::string(what) + ": non-finite value at element " + std::to_string(i) + " (row " +
                              std::to_string(i / t.size(-1)) + ")");
    }
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<H3Transformer>> H3Transformer::create(H3Weights weights, const CpuModelOptions& options) {
  if (options.recipe == LinearRecipe::kFp8 && weights.dtype != DType::kBF16) {
    return invalid_argument(std::string("the fp8 recipe runs on the bf16 program; these weights are ") +
                            dtype_name(weights.dtype) + " (load them as BF16)");
  }
  if (options.recipe == LinearRecipe::kFp8) VORTEX_RETURN_IF_ERROR(check_fp8_attention_width(weights.config));
  std::unique_ptr<H3Transformer> model(new H3Transformer(std::move(weights), options.recipe));
  VORTEX_RETURN_IF_ERROR(model->pack());
  return model;
}

Status H3Transformer::pack() {
  auto pack_linear = [](const LinearWeights& w, Linear& out) -> Status {
    VORTEX_ASSIGN_OR_RETURN(out.weight, cpu::PackedWeight::pack(w.weight));
    out.bias = w.bias;
    return ok_status();
  };
  auto pack_block = [&](const BlockWeights& w, Block& b) -> Status {
    b.norm1 = w.norm1;
    b.norm2 = w.norm2;
    b.norm_q = w.norm_q;
    b.norm_k = w.norm_k;
    if (recipe_ == LinearRecipe::kFp8 && w.adaln.weight.defined()) {
      VORTEX_RETURN_IF_ERROR(quantize_block_fp8(w, b));
      return pack_linear(w.adaln, b.adaln);
    }
    VORTEX_RETURN_IF_ERROR(pack_linear(w.qkv, b.qkv));
    VORTEX_RETURN_IF_ERROR(pack_linear(w.out, b.out));
    VORTEX_RETURN_IF_ERROR(pack_linear(w.fc1, b.fc1));
    VORTEX_RETURN_IF_ERROR(pack_linear(w.fc2, b.fc2));
    if (w.adaln.weight.defined()) VORTEX_RETURN_IF_ERROR(pack_linear(w.adaln, b.adaln));
    return ok_status();
  };
  const H3Weights& w = weights_;
  VORTEX_RETURN_IF_ERROR(pack_linear(w.proj_in, proj_in_));
  VORTEX_RETURN_IF_ERROR(pack_linear(w.audio_proj_in, audio_proj_in_));
  VORTEX_RETURN_IF_ERROR(pack_linear(w.context_embedder, context_embedder_));
  VORTEX_RETURN_IF_ERROR(pack_linear(w.norm_out_linear, norm_out_linear_));
  VORTEX_RETURN_IF_ERROR(pack_linear(w.proj_out, proj_out_));
  VORTEX_RETURN_IF_ERROR(pack_linear(w.audio_proj_out, audio_proj_out_));
  refiner_.resize(w.refiner.size());
  for (size_t i = 0; i < w.refiner.size(); ++i) VORTEX_RETURN_IF_ERROR(pack_block(w.refiner[i], refiner_[i]));
  blocks_.resize(w.blocks.size());
  for (size_t i = 0; i < w.blocks.size(); ++i) VORTEX_RETURN_IF_ERROR(pack_block(w.blocks[i], blocks_[i]));
  return ok_status();
}

Status H3Transformer::linear(const Linear& l, const Tensor& x, const Tensor& y) const {
  const TensorView bias = l.bias.defined() ? l.bias.view() : TensorView();
  return cpu::linear(x.view(), l.weight, l.bias.defined() ? &bias : nullptr, y.view());
}

Result<Tensor> time_embedding(const H3Config& c, const LinearWeights& linear_1, const LinearWeights& linear_2,
                              const std::vector<float>& timesteps, cpu::GemmVariant gemm) {
  const int64_t T = static_cast<int64_t>(timesteps.size()), half = c.freq_dim / 2;
  // Sinusoid with cos first (flip_sin_to_cos), frequencies exp(-ln(1e4) * i / half), fp32. The GPU
  // program reads this embedding too: exp, cos and sin are core/portable_math.h's, not libm's.
  Tensor sinusoid = Tensor::empty({T, c.freq_dim}, DType::kF32);
  const float log_period = static_cast<float>(-portable_log(10000.0));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float exponent = log_period * static_cast<float>(i) / static_cast<float>(half);
      const float arg = timesteps[t] * portable_expf(exponent);
      sinusoid.data_as<float>()[t * c.freq_dim + i] = portable_cosf(arg);
      sinusoid.data_as<float>()[t * c.freq_dim + half + i] = portable_sinf(arg);
    }
  }
  Tensor hidden = Tensor::empty({T, c.time_embed_hidden_dim}, DType::kF32);
  Tensor temb = Tensor::empty({T, c.time_embed_dim}, DType::kF32);
  const TensorView b1 = linear_1.bias.view(), b2 = linear_2.bias.view();
  VORTEX_RETURN_IF_ERROR(cpu::linear(sinusoid.view(), linear_1.weight.view(), &b1, hidden.view(), gemm));
  cpu::silu_f32(hidden);
  VORTEX_RETURN_IF_ERROR(cpu::linear(hidden.view(), linear_2.weight.view(), &b2, temb.view(), gemm));
  return temb;
}

void rope_tables(const H3Config& c, const std::vector<double>& positions, Tensor& cos, Tensor& sin) {
  const int64_t n = static_cast<int64_t>(positions.size() / 3), F = c.rope_freq_dim, rot = c.rotary_dim();
  const std::vector<float> inv_freq = rope_inverse_frequencies(c);
  cos = Tensor::empty({n, rot}, DType::kF32);
  sin = Tensor::empty({n, rot}, DType::kF32);
  for (int64_t r = 0; r < n; ++r) {
    float* co = cos.data_as<float>() + r * rot;
    float* si = sin.data_as<float>() + r * rot;
    for (int axis = 0; axis < 3; ++axis) {
      // Positions are built in float64 and consumed in float32, as the reference does.
      const float p = static_cast<float>(positions[r * 3 + axis]);
      for (int64_t i = 0; i < F; ++i) {
        const float angle = p * inv_freq[i];
        const int64_t k = axis * F + i;
        co[k] = co[k + 3 * F] = portable_cosf(angle);
        si[k] = si[k + 3 * F] = portable_sinf(angle);
      }
    }
  }
}

const char* attention_mode_name(AttentionMode mode) {
  return mode == AttentionMode::kExact ? "exact" : "int8fp8";
}

Result<AttentionMode> attention_mode_from_name(const std::string& name) {
  if (name == "exact") return AttentionMode::kExact;
  if (name == "int8fp8") return AttentionMode::kInt8Fp8;
  return invalid_argument("attention mode '" + name + "' (expected exact or int8fp8)");
}

bool AttentionPlan::uses(AttentionMode m) const {
  if (per_block.empty()) return mode == m;
  for (AttentionMode b : per_block) {
    if (b == m) return true;
  }
  return false;
}

Result<AttentionPlan> AttentionPlan::parse(const std::string& mode, const std::vector<int>& exact_blocks,
                                           int num_blocks) {
  AttentionPlan plan;
  VORTEX_ASSIGN_OR_RETURN(plan.mode, attention_mode_from_name(mode));
  if (exact_blocks.empty()) return plan;
  plan.per_block.assign(static_cast<size_t>(num_blocks), plan.mode);
  for (int b : exact_blocks) {
    if (b < 0 || b >= num_blocks) {
      return invalid_argument("exact block " + std::to_string(b) + " outside the model's " + std::to_string(num_blocks) +
                              " blocks");
    }
    plan.per_block[b] = AttentionMode::kExact;
  }
  return plan;
}

Status H3Transformer::attention_half(const Block& b, const Tensor& h, const Tensor* cos, const Tensor* sin,
                                     AttentionMode mode, const Tensor& out) const {
  const int64_t n = h.size(0), inner = config().inner_dim();
  Tensor qkv = Tensor::empty({n, 3 * inner}, dtype());
  VORTEX_RETURN_IF_ERROR(linear(b.qkv, h, qkv));
  Tensor attn = Tensor::empty({n, inner}, dtype());
  VORTEX_RETURN_IF_ERROR(attention_core(b, qkv, cos, sin, mode, attn));
  return linear(b.out, attn, out);
}

Status H3Transformer::attention_core(const Block& b, const Tensor& qkv, const Tensor* cos, const Tensor* sin,
                                     AttentionMode mode, const Tensor& attn) const {
  const H3Config& c = config();
  const int64_t heads = c.num_attention_heads, d = c.attention_head_dim, inner = c.inner_dim();
  const TensorView q = heads_view(qkv, 0, heads, d), k = heads_view(qkv, inner, heads, d);
  const TensorView v = heads_view(qkv, 2 * inner, heads, d);
  const TensorView nq = b.norm_q.view(), nk = b.norm_k.view();
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm(q, &nq, static_cast<float>(c.qk_norm_eps), q));
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm(k, &nk, static_cast<float>(c.qk_norm_eps), k));
  if (cos) {
    VORTEX_RETURN_IF_ERROR(cpu::apply_rope(q, *cos, *sin));
    VORTEX_RETURN_IF_ERROR(cpu::apply_rope(k, *cos, *sin));
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  if (mode == AttentionMode::kInt8Fp8) return cpu::attention_int8fp8(q, k, v, heads_view(attn, 0, heads, d), scale);
  return cpu::attention(q, k, v, heads_view(attn, 0, heads, d), scale);
}

Status H3Transformer::feed_forward(const Block& b, const Tensor& h, const Tensor& out) const {
  const int64_t n = h.size(0), f = config().ffn_dim;
  Tensor u = Tensor::empty({n, 2 * f}, dtype());
  VORTEX_RETURN_IF_ERROR(linear(b.fc1, h, u));
  Tensor p = Tensor::empty({n, f}, dtype());
  VORTEX_RETURN_IF_ERROR(cpu::swiglu(u.view(), p.view()));
  return linear(b.fc2, p, out);
}

Status H3Transformer::refiner_block(const Block& b, Tensor& x) const {
  const float eps = static_cast<float>(config().norm_eps);
  Tensor h = Tensor::empty(x.shape(), dtype());
  Tensor branch = Tensor::empty(x.shape(), dtype());
  const TensorView n1 = b.norm1.view(), n2 = b.norm2.view();
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &n1, eps, h.view()));
  VORTEX_RETURN_IF_ERROR(attention_half(b, h, nullptr, nullptr, AttentionMode::kExact, branch));
  VORTEX_RETURN_IF_ERROR(cpu::residual_add(x.view(), branch.view()));
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &n2, eps, h.view()));
  VORTEX_RETURN_IF_ERROR(feed_forward(b, h, branch));
  return cpu::residual_add(x.view(), branch.view());
}

Result<Tensor> H3Transformer::block_modulation(const Block& b, const Tensor& silu_temb) const {
  const int64_t C = config().hidden_size, T = silu_temb.size(0);
  // [T, 18C] viewed as [3T, 6C].
  Tensor table = Tensor::empty({T, 6 * kNumModalities * C}, dtype());
  VORTEX_RETURN_IF_ERROR(linear(b.adaln, silu_temb, table));
  return table.reshape({T * kNumModalities, 6 * C});
}

Status H3Transformer::transformer_block(const Block& b, Tensor& x, const Tensor& silu_temb,
                                        const std::vector<int32_t>& rows, const PreparedRequest& request,
                                        AttentionMode mode) const {
  if (recipe_ == LinearRecipe::kFp8) return transformer_block_fp8(b, x, silu_temb, rows, request, mode);
  const int64_t C = config().hidden_size;
  const float eps = static_cast<float>(config().norm_eps);
  VORTEX_ASSIGN_OR_RETURN(Tensor mod, block_modulation(b, silu_temb));

  Tensor h = Tensor::empty(x.shape(), dtype());
  Tensor branch = Tensor::empty(x.shape(), dtype());
  const TensorView n1 = b.norm1.view(), n2 = b.norm2.view();
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &n1, eps, h.view()));
  VORTEX_RETURN_IF_ERROR(cpu::adaln_modulate(h.view(), columns(mod, 0, C), columns(mod, C, C), rows, h.view()));
  VORTEX_RETURN_IF_ERROR(attention_half(b, h, &request.rope_cos, &request.rope_sin, mode, branch));
  VORTEX_RETURN_IF_ERROR(cpu::gated_residual(x.view(), columns(mod, 2 * C, C), rows, branch.view()));

  VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &n2, eps, h.view()));
  VORTEX_RETURN_IF_ERROR(cpu::adaln_modulate(h.view(), columns(mod, 3 * C, C), columns(mod, 4 * C, C), rows, h.view()));
  VORTEX_RETURN_IF_ERROR(feed_forward(b, h, branch));
  return cpu::gated_residual(x.view(), columns(mod, 5 * C, C), rows, branch.view());
}

Result<PreparedRequest> H3Transformer::prepare(const PackedLayout& layout, const Tensor& text_states,
                                               const ForwardObserver* observer) const {
  const H3Config& c = config();
  if (text_states.rank() != 2 || text_states.size(0) != layout.num_text || text_states.size(1) != c.text_dim) {
    return invalid_argument("text states must be [" + std::to_string(layout.num_text) + ", " +
                            std::to_string(c.text_dim) + "], got " + text_states.describe());
  }
  if (text_states.dtype() != DType::kF32 && text_states.dtype() != DType::kBF16) {
    return invalid_argument(std::string("text states: dtype ") + dtype_name(text_states.dtype()) +
                            " (expected F32 or BF16)");
  }
  VORTEX_RETURN_IF_ERROR(check_finite(text_states, "text states"));
  if (static_cast<int64_t>(layout.positions.size()) != layout.num_rows * 3) {
    return invalid_argument("layout positions do not cover every row");
  }
  PreparedRequest request;
  request.layout = &layout;
  rope_tables(c, layout.positions, request.rope_cos, request.rope_sin);
  // The embedder reads the text in the model dtype (the reference casts before the projection).
  VORTEX_ASSIGN_OR_RETURN(Tensor text, text_states.to(dtype()));
  Tensor x = Tensor::empty({layout.num_text, c.hidden_size}, dtype());
  VORTEX_RETURN_IF_ERROR(linear(context_embedder_, text, x));
  for (const Block& b : refiner_) VORTEX_RETURN_IF_ERROR(refiner_block(b, x));
  const TensorView final_norm = weights_.refiner_final_norm.view();
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &final_norm, static_cast<float>(c.final_norm_eps), x.view()));
  request.text_tokens = x;
  if (observer) {
    (*observer)("rope_cos", request.rope_cos);
    (*observer)("rope_sin", request.rope_sin);
    (*observer)("refiner_out", x);
  }
  return request;
}

Result<StepOutputs> H3Transformer::forward(const PreparedRequest& request, const StepInputs& in,
                                           const ForwardObserver* observer) const {
  const H3Config& c = config();
  const PackedLayout& layout = *request.layout;
  const int64_t C = c.hidden_size, N = layout.num_rows;
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
  if (!in.attention.per_block.empty() && static_cast<int>(in.attention.per_block.size()) != c.num_layers) {
    return invalid_argument("attention plan names " + std::to_string(in.attention.per_block.size()) +
                            " blocks; the model has " + std::to_string(c.num_layers));
  }
  const int64_t T = static_cast<int64_t>(in.timesteps.timesteps.size());
  if (T == 0 || static_cast<int64_t>(in.timesteps.row_index.size()) != N) {
    return invalid_argument("row timesteps must cover all " + std::to_string(N) + " rows");
  }
  std::vector<int32_t> adaln_rows(N);
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = in.timesteps.row_index[i];
    if (t < 0 || t >= T) return invalid_argument("row " + std::to_string(i) + ": timestep index out of range");
    adaln_rows[i] = t * kNumModalities + layout.tags[i];
  }

  // 1. Project each stream and scatter it into the packed sequence (fp32 projections, then the
  // cast to the model dtype).
  Tensor x = Tensor::zeros({N, C}, dtype());
  scatter_rows(request.text_tokens, layout.text_indices, x);
  Tensor video = Tensor::empty({layout.num_video, C}, DType::kF32);
  VORTEX_RETURN_IF_ERROR(linear(proj_in_, in.video_rows, video));
  scatter_rows(video, layout.video_indices, x);
  Tensor audio = Tensor::empty({layout.num_audio, C}, DType::kF32);
  VORTEX_RETURN_IF_ERROR(linear(audio_proj_in_, in.audio_rows, audio));
  scatter_rows(audio, layout.audio_indices, x);

  // 2. One time embedding per distinct timestep; every AdaLN projection reads silu(temb) cast
  // to its own (model) dtype.
  VORTEX_ASSIGN_OR_RETURN(Tensor temb,
                          time_embedding(c, weights_.time_linear_1, weights_.time_linear_2, in.timesteps.timesteps));
  Tensor silu_temb = temb.clone();
  cpu::silu_f32(silu_temb);
  VORTEX_ASSIGN_OR_RETURN(silu_temb, silu_temb.to(dtype()));
  if (observer) {
    (*observer)("temb", temb);
    (*observer)("block_0_in", x);
  }

  // 3. The block stack.
  for (size_t i = 0; i < blocks_.size(); ++i) {
    VORTEX_RETURN_IF_ERROR(
        transformer_block(blocks_[i], x, silu_temb, adaln_rows, request, in.attention.for_block(static_cast<int>(i))));
    if (observer) (*observer)("block_" + std::to_string(i) + "_out", x);
  }

  // 4. Output norm, shift/scale per timestep row, then the fp32 heads on their own rows.
  Tensor out_mod = Tensor::empty({T, 2 * C}, dtype());
  VORTEX_RETURN_IF_ERROR(linear(norm_out_linear_, silu_temb, out_mod));
  const TensorView norm_w = weights_.norm_out_norm.view();
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &norm_w, static_cast<float>(c.final_norm_eps), x.view()));
  VORTEX_RETURN_IF_ERROR(
      cpu::adaln_modulate(x.view(), columns(out_mod, 0, C), columns(out_mod, C, C), in.timesteps.row_index, x.view()));
  if (observer) (*observer)("norm_out", x);

  StepOutputs out;
  out.video_velocity = Tensor::empty({layout.num_video, c.video_patch_dim()}, DType::kF32);
  out.audio_velocity = Tensor::empty({layout.num_audio, c.audio_in_channels}, DType::kF32);
  VORTEX_RETURN_IF_ERROR(linear(proj_out_, gather_rows_f32(x, layout.video_indices), out.video_velocity));
  VORTEX_RETURN_IF_ERROR(linear(audio_proj_out_, gather_rows_f32(x, layout.audio_indices), out.audio_velocity));
  if (observer) {
    (*observer)("video_out", out.video_velocity);
    (*observer)("audio_out", out.audio_velocity);
  }
  return out;
}

}  // namespace vortex::h3
