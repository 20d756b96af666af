// The audio VAE encoder forward (CPU, fp32): the DAC encoder, the causal-attention pre_block, the
// posterior mean and the ref2va normalisation (audio_vae_encoder.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/attention.h"
#include "cpu/elementwise.h"
#include "cpu/gemm.h"
#include "cpu/norm.h"
#include "media/audio_resample.h"
#include "models/h3/tensor_views.h"
#include "models/vae/audio_vae_encoder.h"

namespace vortex::vae {

namespace {

constexpr float kLayerNormEps = 1e-5f;  // nn.LayerNorm's default

void emit(const AudioVaeObserver* observer, const std::string& name, const Tensor& value) {
  if (observer != nullptr && *observer) (*observer)(name, value);
}

// a += b, elementwise (same shape, contiguous F32).
void add_into(Tensor& a, const Tensor& b) {
  float* ad = a.data_as<float>();
  const float* bd = b.data_as<const float>();
  for (int64_t i = 0; i < a.numel(); ++i) ad[i] += bd[i];
}

Result<Tensor> snaked(const SnakeParams& params, const Tensor& x) {
  Tensor y = x.clone();
  VORTEX_RETURN_IF_ERROR(apply_snake(params, y));
  return y;
}

// DAC's residual unit: x + conv2(snake2(conv1(snake1(x)))); the convolutions keep the length.
Result<Tensor> residual_unit(const AudioResidualUnit& u, const Tensor& x) {
  VORTEX_ASSIGN_OR_RETURN(Tensor r, snaked(u.snake1, x));
  VORTEX_ASSIGN_OR_RETURN(r, conv1d(u.conv1, r));
  VORTEX_RETURN_IF_ERROR(apply_snake(u.snake2, r));
  VORTEX_ASSIGN_OR_RETURN(r, conv1d(u.conv2, r));
  if (r.shape() != x.shape()) return internal_error("audio encoder residual " + r.describe() + " vs " + x.describe());
  add_into(r, x);
  return r;
}

Result<Tensor> layer_normed(const LayerNormWeights& norm, const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  VORTEX_RETURN_IF_ERROR(cpu::layer_norm(x.view(), norm.weight.view(), norm.bias.view(), kLayerNormEps, y.view()));
  return y;
}

Result<Tensor> linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = Tensor::empty({x.size(0), weight.size(0)}, DType::kF32);
  const TensorView b = bias.view();
  VORTEX_RETURN_IF_ERROR(cpu::linear(x.view(), weight.view(), &b, y.view()));
  return y;
}

// The pre_block's causal attention on rows [B·T, D] of B items: per item, causal attention over
// heads of D / H, the heads averaged, the remaining D / H wide axis adaptively average-pooled to
// `out` (window [floor(i·W/out), ceil((i+1)·W/out)) for output i), then the projection.
Result<Tensor> pooled_causal_attention(const AudioVaeEncoder& e, const Tensor& x, int64_t items) {
  const int64_t d = e.config.latent_dim, heads = e.config.num_attention_heads, width = d / heads;
  const int64_t out = e.config.latent_channels, t = x.size(0) / items;
  VORTEX_ASSIGN_OR_RETURN(const Tensor qkv, linear(x, e.qkv_weight, e.qkv_bias));
  Tensor attended = Tensor::empty({x.size(0), d}, DType::kF32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(width));
  for (int64_t b = 0; b < items; ++b) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor rows, qkv.slice(0, b * t, (b + 1) * t));
    VORTEX_ASSIGN_OR_RETURN(const Tensor o, attended.slice(0, b * t, (b + 1) * t));
    VORTEX_RETURN_IF_ERROR(cpu::causal_attention(h3::heads_view(rows, 0, heads, width),
                                                 h3::heads_view(rows, d, heads, width),
                                                 h3::heads_view(rows, 2 * d, heads, width),
                                                 h3::heads_view(o, 0, heads, width), scale));
  }
  Tensor pooled = Tensor::empty({x.size(0), out}, DType::kF32);
  const float* a = attended.data_as<const float>();
  float* p = pooled.data_as<float>();
  std::vector<float> mean(static_cast<size_t>(width));
  for (int64_t r = 0; r < x.size(0); ++r) {
    for (int64_t w = 0; w < width; ++w) {
      float sum = 0.0f;
      for (int64_t h = 0; h < heads; ++h) sum += a[r * d + h * width + w];
      mean[w] = sum / static_cast<float>(heads);
    }
    for (int64_t i = 0; i < out; ++i) {
      const int64_t start = i * width / out, end = ((i + 1) * width + out - 1) / out;
      float sum = 0.0f;
      for (int64_t w = start; w < end; ++w) sum += mean[w];
      p[r * out + i] = sum / static_cast<float>(end - start);
    }
  }
  return linear(pooled, e.attn_proj_weight, e.attn_proj_bias);
}

// h = proj(LN3(x)) + attn(LN1(x)); h + w2(gelu_tanh(w0(LN(LN2(h)))) · w1(LN(LN2(h)))).
Result<Tensor> pre_block(const AudioVaeEncoder& e, const Tensor& x, int64_t items) {
  VORTEX_ASSIGN_OR_RETURN(const Tensor n1, layer_normed(e.norm1, x));
  VORTEX_ASSIGN_OR_RETURN(Tensor h, pooled_causal_attention(e, n1, items));
  VORTEX_ASSIGN_OR_RETURN(const Tensor n3, layer_normed(e.norm3, x));
  VORTEX_ASSIGN_OR_RETURN(Tensor projected, linear(n3, e.proj_weight, e.proj_bias));
  add_into(projected, h);  // proj(...) + attn(...), in the reference's order
  h = std::move(projected);
  VORTEX_ASSIGN_OR_RETURN(const Tensor n2, layer_normed(e.norm2, h));
  VORTEX_ASSIGN_OR_RETURN(const Tensor m, layer_normed(e.mlp_norm, n2));
  VORTEX_ASSIGN_OR_RETURN(Tensor gate, linear(m, e.w0_weight, e.w0_bias));
  VORTEX_RETURN_IF_ERROR(cpu::gelu(gate.view(), gate.view(), cpu::GeluApproximation::kTanh));
  VORTEX_ASSIGN_OR_RETURN(const Tensor value, linear(m, e.w1_weight, e.w1_bias));
  float* g = gate.data_as<float>();
  const float* v = value.data_as<const float>();
  for (int64_t i = 0; i < gate.numel(); ++i) g[i] *= v[i];
  VORTEX_ASSIGN_OR_RETURN(const Tensor mlp, linear(gate, e.w2_weight, e.w2_bias));
  add_into(h, mlp);
  return h;
}

}  // namespace

Result<Tensor> padded_waveform(const AudioVaeConfig& c, const Tensor& waveform) {
  if (!waveform.defined() || waveform.rank() != 2 || waveform.size(0) != 2 || waveform.size(1) < 1) {
    return invalid_argument("waveform: " + (waveform.defined() ? waveform.describe() : std::string("(undefined)")) +
                            " must be stereo [2, samples >= 1]");
  }
  VORTEX_ASSIGN_OR_RETURN(const Tensor wave, waveform.to(DType::kF32));
  const int64_t samples = wave.size(1), hop = c.hop_length();
  const int64_t padded = (samples + hop - 1) / hop * hop, items = 2;
  Tensor x = Tensor::zeros({items, padded, 1}, DType::kF32);  // time-major, zero right padding
  const Tensor src = wave.contiguous();
  for (int64_t b = 0; b < items; ++b) {
    const float* s = src.data_as<const float>() + b * samples;
    for (int64_t i = 0; i < samples; ++i) {
      if (!std::isfinite(s[i])) {
        return invalid_argument("waveform: sample " + std::to_string(i) + " of channel " + std::to_string(b) +
                                " is not finite");
      }
    }
    std::memcpy(x.data_as<float>() + b * padded, s, sizeof(float) * samples);
  }
  return x;
}

Result<Tensor> encode_audio(const AudioVaeEncoder& e, const Tensor& waveform, const AudioVaeObserver* observer) {
  const AudioVaeConfig& c = e.config;
  VORTEX_ASSIGN_OR_RETURN(Tensor x, padded_waveform(c, waveform));
  const int64_t padded = x.size(1), hop = c.hop_length(), items = 2;

  VORTEX_ASSIGN_OR_RETURN(x, conv1d(e.stem, x));
  emit(observer, "encoder.block.0", x);
  for (size_t i = 0; i < e.blocks.size(); ++i) {
    for (const AudioResidualUnit& unit : e.blocks[i].units) {
      VORTEX_ASSIGN_OR_RETURN(x, residual_unit(unit, x));
    }
    VORTEX_RETURN_IF_ERROR(apply_snake(e.blocks[i].snake, x));
    VORTEX_ASSIGN_OR_RETURN(x, conv1d(e.blocks[i].down, x));
    emit(observer, "encoder.block." + std::to_string(i + 1), x);
  }
  const size_t n = e.blocks.size();
  VORTEX_RETURN_IF_ERROR(apply_snake(e.snake_out, x));
  emit(observer, "encoder.block." + std::to_string(n + 1), x);
  VORTEX_ASSIGN_OR_RETURN(x, conv1d(e.conv_out, x));
  emit(observer, "encoder.block." + std::to_string(n + 2), x);
  const int64_t latents = x.size(1);
  if (latents != padded / hop) {
    return internal_error("audio encoder: " + std::to_string(latents) + " latents for " + std::to_string(padded) +
                          " samples at hop " + std::to_string(hop));
  }

  VORTEX_ASSIGN_OR_RETURN(const Tensor rows, x.reshape({items * latents, c.latent_dim}));
  VORTEX_ASSIGN_OR_RETURN(Tensor h, pre_block(e, rows, items));
  VORTEX_ASSIGN_OR_RETURN(h, h.reshape({items, latents, c.latent_channels}));
  emit(observer, "pre_block", h);
  VORTEX_ASSIGN_OR_RETURN(Tensor mean, conv1d(e.mean_proj, h));
  emit(observer, "mean", mean);

  // Normalised, channel-major: the left channel's latents, then the right's.
  Tensor out = Tensor::empty({items * latents, c.latent_channels}, DType::kF32);
  const float* m = mean.data_as<const float>();
  float* o = out.data_as<float>();
  for (int64_t r = 0; r < items * latents; ++r) {
    for (int ch = 0; ch < c.latent_channels; ++ch) {
      o[r * c.latent_channels + ch] = (m[r * c.latent_channels + ch] - c.latents_mean[ch]) / c.latents_std[ch];
    }
  }
  return out;
}

namespace {

// The samples of a reference soundtrack the pipeline keeps, at its own rate (the checks of
// reference_soundtrack_samples): the cut comes before the resampling, as the reference's.
Result<int64_t> soundtrack_cut(const Tensor& waveform, int sample_rate, double max_seconds) {
  if (!waveform.defined() || waveform.rank() != 2 || (waveform.size(0) != 1 && waveform.size(0) != 2)) {
    return invalid_argument("soundtrack: " + (waveform.defined() ? waveform.describe() : std::string("(undefined)")) +
                            " must be a [channels, samples] mono or stereo waveform");
  }
  if (sample_rate < 1 || sample_rate > media::kMaxResampleRate) {
    return invalid_argument("soundtrack: sample rate " + std::to_string(sample_rate) + " Hz is outside 1.." +
                            std::to_string(media::kMaxResampleRate));
  }
  // Python's int(max_seconds * rate): the product in float64, truncated toward zero.
  const int64_t keep = std::min(waveform.size(1), static_cast<int64_t>(max_seconds * sample_rate));
  if (keep < 1) return invalid_argument("soundtrack: no samples within " + std::to_string(max_seconds) + " s");
  return keep;
}

}  // namespace

Result<int64_t> reference_soundtrack_samples(const AudioVaeConfig& config, const Tensor& waveform, int sample_rate,
                                             double max_seconds) {
  VORTEX_ASSIGN_OR_RETURN(const int64_t keep, soundtrack_cut(waveform, sample_rate, max_seconds));
  return media::resampled_length(keep, sample_rate, config.sampling_rate);
}

Result<Tensor> normalize_reference_soundtrack(const Tensor& waveform, int sample_rate, int vae_rate,
                                              double max_seconds) {
  VORTEX_ASSIGN_OR_RETURN(const int64_t keep, soundtrack_cut(waveform, sample_rate, max_seconds));
  VORTEX_ASSIGN_OR_RETURN(const Tensor wave, waveform.to(DType::kF32));
  const Tensor src = wave.contiguous();
  Tensor stereo = Tensor::empty({2, keep}, DType::kF32);
  for (int64_t c = 0; c < 2; ++c) {
    const int64_t from = waveform.size(0) == 1 ? 0 : c;
    std::memcpy(stereo.data_as<float>() + c * keep, src.data_as<const float>() + from * src.size(1),
                sizeof(float) * keep);
  }
  return media::resample_audio(stereo, sample_rate, vae_rate);
}

Result<Tensor> encode_reference_soundtrack(const AudioVaeEncoder& e, const Tensor& waveform, int sample_rate,
                                           double max_seconds) {
  VORTEX_ASSIGN_OR_RETURN(const Tensor stereo,
                          normalize_reference_soundtrack(waveform, sample_rate, e.config.sampling_rate, max_seconds));
  return encode_audio(e, stereo);
}

}  // namespace vortex::vae
