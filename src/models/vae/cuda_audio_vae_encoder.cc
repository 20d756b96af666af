// The audio VAE encoder on the GPU (see cuda_audio_vae_encoder.h).
#include "models/vae/cuda_audio_vae_encoder.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/elementwise.h"
#include "cuda/vae_attention_f32.h"
#include "cuda/vae_conv1d.h"
#include "cuda/vae_layer_norm.h"
#include "cuda/vae_pointwise.h"
#include "cuda/vae_snake.h"
#include "models/h3/tensor_views.h"

namespace vortex::vae {

namespace {

constexpr size_t kWorkspaceBytes = 64u << 20;
constexpr size_t kSlack = cuda::DeviceArena::kAlignment;
constexpr float kLayerNormEps = 1e-5f;  // nn.LayerNorm's default, as the CPU encoder
constexpr int64_t kItems = 2;           // the stereo channels, two items of the mono autoencoder

size_t aligned_floats(int64_t n) { return (static_cast<size_t>(n) * 4 + kSlack - 1) / kSlack * kSlack; }

size_t aligned_bytes(const Tensor& t) { return t.defined() ? (t.nbytes() + kSlack - 1) / kSlack * kSlack : 0; }

// Element counts an encode of `padded` samples a channel needs: the largest [2, T, C] of the DAC
// stack (at least the pre_block's fused QKV rows), the im2col scratch of the largest convolution
// (capped by the budget), and the latents A. `E` is AudioVaeEncoder or the device encoder (the same
// member names).
struct EncoderPlan {
  int64_t stage = 0, columns = 1, latents = 0;
};

template <class E>
Result<EncoderPlan> plan_encoder(const E& e, const AudioVaeConfig& c, int64_t padded, int64_t budget_floats) {
  EncoderPlan p;
  const auto conv = [&](const Conv1dShape& k, int64_t length) -> Result<int64_t> {
    const int64_t out = conv1d_output_length(k, length);
    if (out < 1) return invalid_argument("waveform: " + std::to_string(padded) + " samples are too few to encode");
    p.stage = std::max(p.stage, kItems * out * k.out_channels);
    p.columns = std::max(p.columns, conv1d_columns_floats(k, kItems * out, budget_floats));
    return out;
  };
  VORTEX_ASSIGN_OR_RETURN(int64_t T, conv(e.stem.shape, padded));
  for (const auto& block : e.blocks) {
    for (const auto& unit : block.units) {
      VORTEX_ASSIGN_OR_RETURN(const int64_t inner, conv(unit.conv1.shape, T));
      VORTEX_ASSIGN_OR_RETURN(const int64_t out, conv(unit.conv2.shape, inner));
      if (out != T) return internal_error("audio encoder residual unit changes the length " + std::to_string(T));
    }
    VORTEX_ASSIGN_OR_RETURN(T, conv(block.down.shape, T));
  }
  VORTEX_ASSIGN_OR_RETURN(T, conv(e.conv_out.shape, T));
  if (T != padded / c.hop_length()) {
    return internal_error("audio encoder: " + std::to_string(T) + " latents for " + std::to_string(padded) +
                          " samples at hop " + std::to_string(c.hop_length()));
  }
  p.latents = T;
  p.stage = std::max(p.stage, kItems * T * 3 * static_cast<int64_t>(c.latent_dim));  // the fused QKV
  return p;
}

size_t activation_bytes(const EncoderPlan& p, int64_t padded, const AudioVaeConfig& c, int narrow_buffers) {
  return aligned_floats(kItems * padded) + 3 * aligned_floats(p.stage) + aligned_floats(p.columns) +
         narrow_buffers * aligned_floats(kItems * p.latents * 2 * c.latent_channels);
}

// The first rows · cols floats of `flat` as [rows, cols]; shaped3 as [b, t, c].
Result<Tensor> shaped(const Tensor& flat, int64_t rows, int64_t cols) {
  if (rows * cols > flat.numel()) {
    return internal_error("audio encoder buffer too small for [" + std::to_string(rows) + ", " + std::to_string(cols) +
                          "]");
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor s, flat.slice(0, 0, rows * cols));
  return s.reshape({rows, cols});
}

Result<Tensor> shaped3(const Tensor& flat, int64_t b, int64_t t, int64_t c) {
  VORTEX_ASSIGN_OR_RETURN(Tensor s, shaped(flat, b * t, c));
  return s.reshape({b, t, c});
}

Result<Tensor> rows_of(const Tensor& t) { return t.reshape({t.size(0) * t.size(1), t.size(2)}); }

size_t encoder_weight_bytes(const AudioVaeEncoder& e) {
  const auto conv_bytes = [](const Conv1d& k) { return aligned_bytes(k.weight) + aligned_bytes(k.bias); };
  const auto snake_bytes = [](const SnakeParams& s) { return 2 * aligned_floats(s.channels()); };
  size_t bytes = conv_bytes(e.stem) + conv_bytes(e.conv_out) + conv_bytes(e.mean_proj) + snake_bytes(e.snake_out);
  for (const AudioEncoderBlock& b : e.blocks) {
    bytes += snake_bytes(b.snake) + conv_bytes(b.down);
    for (const AudioResidualUnit& u : b.units) {
      bytes += snake_bytes(u.snake1) + snake_bytes(u.snake2) + conv_bytes(u.conv1) + conv_bytes(u.conv2);
    }
  }
  for (const LayerNormWeights* n : {&e.norm1, &e.norm2, &e.norm3, &e.mlp_norm}) {
    bytes += aligned_bytes(n->weight) + aligned_bytes(n->bias);
  }
  for (const Tensor* t : {&e.qkv_weight, &e.qkv_bias, &e.attn_proj_weight, &e.attn_proj_bias, &e.proj_weight,
                          &e.proj_bias, &e.w0_weight, &e.w0_bias, &e.w1_weight, &e.w1_bias, &e.w2_weight, &e.w2_bias}) {
    bytes += aligned_bytes(*t);
  }
  return bytes + 2 * aligned_floats(e.config.latent_channels);  // latents_mean, latents_std
}

}  // namespace

Result<std::unique_ptr<CudaAudioVaeEncoder>> CudaAudioVaeEncoder::create(const AudioVaeEncoder& encoder,
                                                                         const CudaAudioVaeOptions& options,
                                                                         cudaStream_t stream) {
  const AudioVaeConfig& c = encoder.config;
  VORTEX_RETURN_IF_ERROR(c.validate());
  if (static_cast<int64_t>(c.latents_mean.size()) != c.latent_channels ||
      static_cast<int64_t>(c.latents_std.size()) != c.latent_channels) {
    return invalid_argument("audio VAE config: latents_mean / latents_std must have latent_channels entries");
  }
  if (c.latent_dim % c.num_attention_heads != 0 ||
      c.latent_dim / c.num_attention_heads > cuda::kAttentionF32MaxHeadDim) {
    return invalid_argument("audio VAE encoder on CUDA: pre_block heads of " + std::to_string(c.latent_dim) + " / " +
                            std::to_string(c.num_attention_heads) + " channels (at most " +
                            std::to_string(cuda::kAttentionF32MaxHeadDim) + " whole channels a head)");
  }
  if (options.im2col_budget_bytes < 4) return invalid_argument("audio VAE encoder on CUDA: im2col budget below one float");
  std::unique_ptr<CudaAudioVaeEncoder> model(new CudaAudioVaeEncoder());
  model->config_ = c;
  model->options_ = options;
  model->stream_ = stream;
  VORTEX_RETURN_IF_ERROR(model->upload(encoder));
  VORTEX_ASSIGN_OR_RETURN(model->workspace_, cuda::DeviceArena::create(kWorkspaceBytes + kSlack));
  VORTEX_ASSIGN_OR_RETURN(model->gemm_, cuda::GemmRunner::create(model->workspace_, kWorkspaceBytes));
  return model;
}

Status CudaAudioVaeEncoder::upload(const AudioVaeEncoder& e) {
  VORTEX_ASSIGN_OR_RETURN(weights_, cuda::DeviceArena::create(encoder_weight_bytes(e) + kSlack));
  const auto tensor = [&](const Tensor& host) -> Result<Tensor> {
    if (!host.defined()) return Tensor();
    return cuda::upload(host.contiguous(), weights_, stream_);
  };
  const auto values = [&](const std::vector<float>& v) {
    return tensor(Tensor::from_f32(v, {static_cast<int64_t>(v.size())}));
  };
  const auto conv = [&](const Conv1d& k) { return upload_conv1d(k, weights_, stream_); };
  const auto snake = [&](const SnakeParams& s) -> Result<Snake> {
    Snake out;
    VORTEX_ASSIGN_OR_RETURN(out.frequency, values(s.frequency));
    VORTEX_ASSIGN_OR_RETURN(out.magnitude, values(s.magnitude));
    return out;
  };
  const auto linear = [&](const Tensor& w, const Tensor& b) -> Result<Linear> {
    Linear out;
    VORTEX_ASSIGN_OR_RETURN(out.weight, tensor(w));
    VORTEX_ASSIGN_OR_RETURN(out.bias, tensor(b));
    return out;
  };
  const auto norm = [&](const LayerNormWeights& n) -> Result<Norm> {
    Norm out;
    VORTEX_ASSIGN_OR_RETURN(out.weight, tensor(n.weight));
    VORTEX_ASSIGN_OR_RETURN(out.bias, tensor(n.bias));
    return out;
  };
  Encoder& d = encoder_;
  VORTEX_ASSIGN_OR_RETURN(d.stem, conv(e.stem));
  for (const AudioEncoderBlock& b : e.blocks) {
    Block block;
    for (const AudioResidualUnit& u : b.units) {
      ResidualUnit unit;
      VORTEX_ASSIGN_OR_RETURN(unit.snake1, snake(u.snake1));
      VORTEX_ASSIGN_OR_RETURN(unit.conv1, conv(u.conv1));
      VORTEX_ASSIGN_OR_RETURN(unit.snake2, snake(u.snake2));
      VORTEX_ASSIGN_OR_RETURN(unit.conv2, conv(u.conv2));
      block.units.push_back(std::move(unit));
    }
    VORTEX_ASSIGN_OR_RETURN(block.snake, snake(b.snake));
    VORTEX_ASSIGN_OR_RETURN(block.down, conv(b.down));
    d.blocks.push_back(std::move(block));
  }
  VORTEX_ASSIGN_OR_RETURN(d.snake_out, snake(e.snake_out));
  VORTEX_ASSIGN_OR_RETURN(d.conv_out, conv(e.conv_out));
  VORTEX_ASSIGN_OR_RETURN(d.norm1, norm(e.norm1));
  VORTEX_ASSIGN_OR_RETURN(d.norm2, norm(e.norm2));
  VORTEX_ASSIGN_OR_RETURN(d.norm3, norm(e.norm3));
  VORTEX_ASSIGN_OR_RETURN(d.mlp_norm, norm(e.mlp_norm));
  VORTEX_ASSIGN_OR_RETURN(d.qkv, linear(e.qkv_weight, e.qkv_bias));
  VORTEX_ASSIGN_OR_RETURN(d.attn_proj, linear(e.attn_proj_weight, e.attn_proj_bias));
  VORTEX_ASSIGN_OR_RETURN(d.proj, linear(e.proj_weight, e.proj_bias));
  VORTEX_ASSIGN_OR_RETURN(d.w0, linear(e.w0_weight, e.w0_bias));
  VORTEX_ASSIGN_OR_RETURN(d.w1, linear(e.w1_weight, e.w1_bias));
  VORTEX_ASSIGN_OR_RETURN(d.w2, linear(e.w2_weight, e.w2_bias));
  VORTEX_ASSIGN_OR_RETURN(d.mean_proj, conv(e.mean_proj));
  VORTEX_ASSIGN_OR_RETURN(d.latents_mean, values(config_.latents_mean));
  VORTEX_ASSIGN_OR_RETURN(d.latents_std, values(config_.latents_std));
  return ok_status();
}

Status CudaAudioVaeEncoder::linear(const Linear& l, const Tensor& x, const Tensor& y) {
  const TensorView bias = l.bias.view();
  return gemm_->linear(x.view(), l.weight.view(), &bias, y.view(), stream_);
}

Result<Tensor> CudaAudioVaeEncoder::encode(const Tensor& waveform) {
  VORTEX_ASSIGN_OR_RETURN(const Tensor rows, encode_on_device(waveform));
  return cuda::download(rows, stream_);
}

Result<Tensor> CudaAudioVaeEncoder::encode_on_device(const Tensor& waveform) {
  const AudioVaeConfig& c = config_;
  VORTEX_ASSIGN_OR_RETURN(const Tensor input, padded_waveform(c, waveform));
  const int64_t padded = input.size(1);
  VORTEX_ASSIGN_OR_RETURN(const EncoderPlan plan, plan_encoder(encoder_, c, padded,
                                                               static_cast<int64_t>(options_.im2col_budget_bytes / 4)));
  // The activation arena for this length: made (or grown) once per length.
  const size_t needed = activation_bytes(plan, padded, c, kNarrowBuffers);
  if (activations_.capacity() < needed) {
    activations_ = cuda::DeviceArena();  // free the smaller one first
    VORTEX_ASSIGN_OR_RETURN(activations_, cuda::DeviceArena::create(needed));
  }
  activations_.release_to(0);
  Buffers& buf = buffers_;
  VORTEX_ASSIGN_OR_RETURN(buf.waveform, activations_.alloc(input.shape(), DType::kF32));
  for (Tensor& stage : buf.stage) {
    VORTEX_ASSIGN_OR_RETURN(stage, activations_.alloc({plan.stage}, DType::kF32));
  }
  VORTEX_ASSIGN_OR_RETURN(buf.columns, activations_.alloc({plan.columns}, DType::kF32));
  for (Tensor& narrow : buf.narrow) {
    VORTEX_ASSIGN_OR_RETURN(narrow, activations_.alloc({kItems * plan.latents * 2 * c.latent_channels}, DType::kF32));
  }
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(input, buf.waveform, stream_));

  // The DAC stack over three rotating stage buffers: `cur` holds x, the other two the branch.
  int cur = 0, free1 = 1, free2 = 2;
  const auto run_conv = [&](const Conv& k, const Tensor& in, int into) -> Result<Tensor> {
    VORTEX_ASSIGN_OR_RETURN(Tensor y, shaped3(buf.stage[into], kItems, conv1d_output_length(k.shape, in.size(1)),
                                              k.shape.out_channels));
    VORTEX_RETURN_IF_ERROR(run_conv1d(*gemm_, k, in, buf.columns, y, stream_));
    return y;
  };
  const auto run_snake = [&](const Snake& s, const Tensor& in, int into) -> Result<Tensor> {
    VORTEX_ASSIGN_OR_RETURN(Tensor y, shaped3(buf.stage[into], in.size(0), in.size(1), in.size(2)));
    VORTEX_RETURN_IF_ERROR(
        cuda::snake(in.view(), s.frequency.data_as<float>(), s.magnitude.data_as<float>(), y.view(), stream_));
    return y;
  };
  const Encoder& e = encoder_;
  VORTEX_ASSIGN_OR_RETURN(Tensor x, run_conv(e.stem, buf.waveform, cur));
  for (const Block& block : e.blocks) {
    for (const ResidualUnit& u : block.units) {
      // x + conv2(snake2(conv1(snake1(x)))): the branch ends in free1, which becomes x.
      VORTEX_ASSIGN_OR_RETURN(const Tensor a, run_snake(u.snake1, x, free1));
      VORTEX_ASSIGN_OR_RETURN(Tensor r, run_conv(u.conv1, a, free2));
      VORTEX_RETURN_IF_ERROR(cuda::snake(r.view(), u.snake2.frequency.data_as<float>(),
                                         u.snake2.magnitude.data_as<float>(), r.view(), stream_));
      VORTEX_ASSIGN_OR_RETURN(r, run_conv(u.conv2, r, free1));
      if (r.shape() != x.shape()) {
        return internal_error("audio encoder residual " + r.describe() + " vs " + x.describe());
      }
      VORTEX_ASSIGN_OR_RETURN(const Tensor r_rows, rows_of(r));
      VORTEX_ASSIGN_OR_RETURN(const Tensor x_rows, rows_of(x));
      VORTEX_RETURN_IF_ERROR(cuda::residual_add(r_rows.view(), x_rows.view(), stream_));
      x = r;
      std::swap(cur, free1);
    }
    VORTEX_ASSIGN_OR_RETURN(const Tensor a, run_snake(block.snake, x, free1));
    VORTEX_ASSIGN_OR_RETURN(x, run_conv(block.down, a, free2));
    std::swap(cur, free2);
  }
  VORTEX_ASSIGN_OR_RETURN(const Tensor a, run_snake(e.snake_out, x, free1));
  VORTEX_ASSIGN_OR_RETURN(x, run_conv(e.conv_out, a, free2));
  std::swap(cur, free2);
  if (x.size(1) != plan.latents) return internal_error("audio encoder: latents " + x.describe());

  // pre_block on rows [2·A, latent_dim]; the other two stage buffers hold its wide rows.
  const int64_t A = plan.latents, R = kItems * A, D = c.latent_dim, Cl = c.latent_channels;
  const int64_t heads = c.num_attention_heads, width = D / heads;
  VORTEX_ASSIGN_OR_RETURN(const Tensor xr, rows_of(x));
  VORTEX_ASSIGN_OR_RETURN(const Tensor wide, shaped(buf.stage[free1], R, D));
  VORTEX_ASSIGN_OR_RETURN(const Tensor qkv, shaped(buf.stage[free2], R, 3 * D));
  Tensor narrow[kNarrowBuffers];
  for (int i = 0; i < kNarrowBuffers; ++i) {
    VORTEX_ASSIGN_OR_RETURN(narrow[i], shaped(buf.narrow[i], R, i == 4 || i == 5 ? 2 * Cl : Cl));
  }
  const Tensor &pooled = narrow[0], &attended = narrow[1], &h = narrow[2], &normed = narrow[3];
  const Tensor &gate = narrow[4], &value = narrow[5], &mlp = narrow[6];
  const auto layer_norm = [&](const Norm& n, const Tensor& in, const Tensor& out) {
    return cuda::layer_norm(in.view(), n.weight.view(), n.bias.view(), kLayerNormEps, out.view(), stream_);
  };
  // h = proj(LN3(x)) + attn(LN1(x)), attn the causal attention per item, its heads averaged and
  // pooled to latent_channels, then projected.
  VORTEX_RETURN_IF_ERROR(layer_norm(e.norm1, xr, wide));
  VORTEX_RETURN_IF_ERROR(linear(e.qkv, wide, qkv));
  const float scale = 1.0f / std::sqrt(static_cast<float>(width));
  for (int64_t b = 0; b < kItems; ++b) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor item, qkv.slice(0, b * A, (b + 1) * A));
    VORTEX_ASSIGN_OR_RETURN(const Tensor out, wide.slice(0, b * A, (b + 1) * A));
    VORTEX_RETURN_IF_ERROR(cuda::causal_attention_f32(
        h3::heads_view(item, 0, heads, width), h3::heads_view(item, D, heads, width),
        h3::heads_view(item, 2 * D, heads, width), h3::heads_view(out, 0, heads, width), scale, stream_));
  }
  VORTEX_RETURN_IF_ERROR(cuda::heads_mean_pool(wide.view(), heads, pooled.view(), stream_));
  VORTEX_RETURN_IF_ERROR(linear(e.attn_proj, pooled, attended));
  VORTEX_RETURN_IF_ERROR(layer_norm(e.norm3, xr, wide));
  VORTEX_RETURN_IF_ERROR(linear(e.proj, wide, h));
  VORTEX_RETURN_IF_ERROR(cuda::residual_add(h.view(), attended.view(), stream_));
  // h + w2(gelu_tanh(w0(m)) · w1(m)), m = LN_mlp(LN2(h)).
  VORTEX_RETURN_IF_ERROR(layer_norm(e.norm2, h, normed));
  VORTEX_RETURN_IF_ERROR(layer_norm(e.mlp_norm, normed, normed));
  VORTEX_RETURN_IF_ERROR(linear(e.w0, normed, gate));
  VORTEX_RETURN_IF_ERROR(linear(e.w1, normed, value));
  VORTEX_RETURN_IF_ERROR(cuda::gelu_tanh_gate(gate.view(), value.view(), stream_));
  VORTEX_RETURN_IF_ERROR(linear(e.w2, gate, mlp));
  VORTEX_RETURN_IF_ERROR(cuda::residual_add(h.view(), mlp.view(), stream_));

  // The posterior mean, normalised; rows item-major (the left channel's latents, then the right's).
  VORTEX_ASSIGN_OR_RETURN(const Tensor h3d, h.reshape({kItems, A, Cl}));
  VORTEX_ASSIGN_OR_RETURN(const Tensor mean, shaped3(buf.narrow[7], kItems, A, Cl));
  VORTEX_RETURN_IF_ERROR(run_conv1d(*gemm_, e.mean_proj, h3d, buf.columns, mean, stream_));
  VORTEX_ASSIGN_OR_RETURN(Tensor rows, rows_of(mean));
  VORTEX_RETURN_IF_ERROR(cuda::normalize_channels(rows.view(), e.latents_mean.data_as<float>(),
                                                  e.latents_std.data_as<float>(), stream_));
  return rows;
}

}  // namespace vortex::vae
