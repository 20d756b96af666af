// The video VAE decoder forward (CPU, fp32): the ViT decoder for one clip, spatial tiling with
// linear blends, temporal chunking with cross-fades, and the pipeline's de-normalisations.
#include "models/vae/video_vae.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/parallel.h"
#include "core/portable_math.h"
#include "cpu/attention.h"
#include "cpu/elementwise.h"
#include "cpu/norm.h"

namespace vortex::vae {

namespace {

struct Emitter {
  const VideoVaeObserver* observer = nullptr;
  void operator()(const std::string& name, const Tensor& value) const {
    if (observer != nullptr && *observer) (*observer)(name, value);
  }
};

Status apply_linear(const VideoLinear& l, const Tensor& x, const Tensor& y) {
  const TensorView bias = l.bias.view();
  return cpu::linear(x.view(), l.weight, &bias, y.view());
}

Result<Tensor> linear_new(const VideoLinear& l, const Tensor& x) {
  Tensor y = Tensor::empty({x.size(0), l.weight.out_features()}, DType::kF32);
  VORTEX_RETURN_IF_ERROR(apply_linear(l, x, y));
  return y;
}

// x[n, :] += branch[n, :] * scale[:]; the reference multiplies, then adds.
void scaled_residual(Tensor& x, const Tensor& branch, const Tensor& scale) {
  const int64_t C = x.size(1);
  float* xd = x.data_as<float>();
  const float* bd = branch.data_as<const float>();
  const float* sd = scale.data_as<const float>();
  parallel_for(0, x.size(0), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        const float product = bd[r * C + c] * sd[c];
        xd[r * C + c] = xd[r * C + c] + product;
      }
    }
  });
}

}  // namespace

Result<Tensor> video_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  const int64_t N = x.size(0), C = x.size(1);
  Tensor y = Tensor::empty({N, C}, DType::kF32);
  const float* xd = x.data_as<const float>();
  const float* w = weight.data_as<const float>();
  const float* b = bias.data_as<const float>();
  float* yd = y.data_as<float>();
  parallel_for(0, N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = xd + r * C;
      double sum = 0.0;
      for (int64_t c = 0; c < C; ++c) sum += row[c];
      const float mean = static_cast<float>(sum / static_cast<double>(C));
      double sq = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        const float d = row[c] - mean;
        sq += static_cast<double>(d) * d;
      }
      const float rstd = 1.0f / std::sqrt(static_cast<float>(sq / static_cast<double>(C)) + eps);
      for (int64_t c = 0; c < C; ++c) yd[r * C + c] = (row[c] - mean) * rstd * w[c] + b[c];
    }
  });
  return y;
}

// cos / sin [tokens + R + 1, rope_dim] for a T x H x W grid (see the header).
std::pair<Tensor, Tensor> video_rope_tables(const VideoVaeConfig& c, int64_t T, int64_t H, int64_t W) {
  const int64_t rope = c.rope_dim(), nf = rope / 6, N = T * H * W;
  const int64_t total = N + c.decoder_num_register_tokens + 1;
  std::vector<float> inv_freq(static_cast<size_t>(nf));
  const float step = static_cast<float>(6.0 / static_cast<double>(rope));
  for (int64_t k = 0; k < nf; ++k) {
    inv_freq[k] = 1.0f / portable_powf(c.decoder_rope_theta, static_cast<float>(k) * step);
  }
  const auto coord = [](int64_t i, int64_t size) {
    const float x = (static_cast<float>(i) + 0.5f) / static_cast<float>(size);
    return 2.0f * x - 1.0f;
  };
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  Tensor cos = Tensor::zeros({total, rope}, DType::kF32), sin = Tensor::zeros({total, rope}, DType::kF32);
  float* cd = cos.data_as<float>();
  float* sd = sin.data_as<float>();
  for (int64_t n = 0; n < total; ++n) {
    float pos[3] = {0.0f, 0.0f, 0.0f};
    if (n < N) {
      pos[0] = coord(n / (H * W), T);
      pos[1] = coord(n / W % H, H);
      pos[2] = coord(n % W, W);
    }
    for (int axis = 0; axis < 3; ++axis) {
      for (int64_t k = 0; k < nf; ++k) {
        const float angle = (two_pi * pos[axis]) * inv_freq[k];
        const int64_t j = axis * nf + k;
        cd[n * rope + j] = cd[n * rope + j + rope / 2] = portable_cosf(angle);
        sd[n * rope + j] = sd[n * rope + j + rope / 2] = portable_sinf(angle);
      }
    }
  }
  return {cos, sin};
}

Result<Tensor> decode_video_chunk(const VideoVae& vae, const Tensor& z, const VideoVaeObserver* observer) {
  const VideoVaeConfig& c = vae.config;
  const Emitter emit{observer};
  if (z.rank() != 4 || z.size(0) != c.latent_channels || z.dtype() != DType::kF32) {
    return invalid_argument("video VAE chunk: latents " + z.describe() + " must be f32[" +
                            std::to_string(c.latent_channels) + ", T, H, W]");
  }
  const int64_t C = z.size(0), T = z.size(1), H = z.size(2), W = z.size(3), N = T * H * W;
  const int64_t R = c.decoder_num_register_tokens, total = N + R + 1, dim = c.decoder_dim();
  const int64_t heads = c.decoder_num_attention_heads, D = c.decoder_attention_head_dim;
  const float eps = c.decoder_norm_eps;

  // Token-major latents [N, C], then post_quant_conv as a per-voxel linear.
  VORTEX_ASSIGN_OR_RETURN(Tensor zt, z.reshape({C, N}));
  VORTEX_ASSIGN_OR_RETURN(zt, zt.transpose(0, 1));
  zt = zt.contiguous();
  VORTEX_ASSIGN_OR_RETURN(Tensor pq, linear_new(vae.post_quant_conv, zt));
  if (observer != nullptr) {
    VORTEX_ASSIGN_OR_RETURN(Tensor pq_t, pq.transpose(0, 1));
    VORTEX_ASSIGN_OR_RETURN(Tensor pq_c, pq_t.contiguous().reshape({C, T, H, W}));
    emit("post_quant_conv", pq_c);
  }

  Tensor x = Tensor::zeros({total, dim}, DType::kF32);
  VORTEX_ASSIGN_OR_RETURN(Tensor patches, x.slice(0, 0, N));
  VORTEX_RETURN_IF_ERROR(apply_linear(vae.proj_in, pq, patches));
  emit("decoder.proj_in", patches);
  std::copy_n(vae.register_tokens.data_as<const float>(), R * dim, x.data_as<float>() + N * dim);

  auto [cos, sin] = video_rope_tables(c, T, H, W);
  emit("decoder.rope.cos", cos);
  emit("decoder.rope.sin", sin);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  Tensor h = Tensor::empty({total, dim}, DType::kF32);
  Tensor q = Tensor::empty({total, dim}, DType::kF32), k = Tensor::empty({total, dim}, DType::kF32);
  Tensor v = Tensor::empty({total, dim}, DType::kF32), o = Tensor::empty({total, dim}, DType::kF32);
  Tensor u = Tensor::empty({total, 2 * c.decoder_ffn_dim()}, DType::kF32);
  Tensor g = Tensor::empty({total, c.decoder_ffn_dim()}, DType::kF32);
  Tensor branch = Tensor::empty({total, dim}, DType::kF32);
  const Shape heads_shape{total, heads, D};
  for (size_t i = 0; i < vae.blocks.size(); ++i) {
    const VideoVitBlock& b = vae.blocks[i];
    const TensorView n1 = b.norm1.view(), n2 = b.norm2.view();
    VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &n1, eps, h.view()));
    VORTEX_RETURN_IF_ERROR(apply_linear(b.to_q, h, q));
    VORTEX_RETURN_IF_ERROR(apply_linear(b.to_k, h, k));
    VORTEX_RETURN_IF_ERROR(apply_linear(b.to_v, h, v));
    VORTEX_ASSIGN_OR_RETURN(Tensor q3, q.reshape(heads_shape));
    VORTEX_ASSIGN_OR_RETURN(Tensor k3, k.reshape(heads_shape));
    VORTEX_ASSIGN_OR_RETURN(Tensor v3, v.reshape(heads_shape));
    VORTEX_ASSIGN_OR_RETURN(Tensor o3, o.reshape(heads_shape));
    VORTEX_RETURN_IF_ERROR(cpu::rms_norm(q3.view(), nullptr, eps, q3.view()));
    VORTEX_RETURN_IF_ERROR(cpu::rms_norm(k3.view(), nullptr, eps, k3.view()));
    if (c.rope_dim() > 0) {
      VORTEX_RETURN_IF_ERROR(cpu::apply_rope(q3.view(), cos, sin));
      VORTEX_RETURN_IF_ERROR(cpu::apply_rope(k3.view(), cos, sin));
    }
    VORTEX_RETURN_IF_ERROR(cpu::attention(q3.view(), k3.view(), v3.view(), o3.view(), scale));
    VORTEX_RETURN_IF_ERROR(apply_linear(b.to_out, o, branch));
    scaled_residual(x, branch, b.scale1);
    VORTEX_RETURN_IF_ERROR(cpu::rms_norm(x.view(), &n2, eps, h.view()));
    VORTEX_RETURN_IF_ERROR(apply_linear(b.ff_in, h, u));
    VORTEX_RETURN_IF_ERROR(cpu::swiglu(u.view(), g.view()));
    VORTEX_RETURN_IF_ERROR(apply_linear(b.ff_out, g, branch));
    scaled_residual(x, branch, b.scale2);
    emit("decoder.transformer_blocks." + std::to_string(i), x);
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor normed, video_layer_norm(x, vae.norm_out_weight, vae.norm_out_bias, eps));
  emit("decoder.norm_out", normed);
  VORTEX_ASSIGN_OR_RETURN(Tensor y, linear_new(vae.proj_out, normed));
  emit("decoder.proj_out", y);

  const int64_t p = c.spatial_ratio(), pt = c.temporal_ratio(), oc = c.out_channels, pv = c.patch_values();
  Tensor out = Tensor::empty({oc, T * pt, H * p, W * p}, DType::kF32);
  const float* yd = y.data_as<const float>();
  float* od = out.data_as<float>();
  const int64_t OF = T * pt, OH = H * p, OW = W * p;
  parallel_for(0, N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t t = n / (H * W), hh = n / W % H, ww = n % W;
      const float* row = yd + n * pv;
      for (int64_t ch = 0; ch < oc; ++ch) {
        for (int64_t a = 0; a < pt; ++a) {
          for (int64_t bb = 0; bb < p; ++bb) {
            float* dst = od + ((ch * OF + t * pt + a) * OH + hh * p + bb) * OW + ww * p;
            std::copy_n(row + ((ch * pt + a) * p + bb) * p, p, dst);
          }
        }
      }
    }
  });
  emit("decoder", out);
  return out;
}

}  // namespace vortex::vae
