// The video VAE decoder against an independent double-precision implementation written from
// diffusers' autoencoder_kl_minimax_h3.py (MiniMaxH3VideoViTDecoder3d and its blocks) — not from
// the C++ port — on the `test` preset with synthetic weights and random latents. Each transformer
// block is checked on the port's own input to it (so a mismatch points at one block), and the
// whole decode_video_chunk end to end. This is the strongest check available without goldens.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "audio_vae_test_util.h"
#include "models/vae/video_vae.h"

namespace vortex {
namespace {

using Mat = std::vector<double>;  // row-major

struct Ref {
  vae::VideoVaeConfig c;
  std::map<std::string, Mat> w;
  const Mat& at(const std::string& name) const { return w.at(name); }
};

Ref make_ref(const vae::VideoVaeConfig& c, const vae::NamedTensors& tensors) {
  Ref r{c, {}};
  for (const auto& [name, t] : tensors) r.w[name] = test::values_of(t);
  return r;
}

// nn.Linear: y[n, o] = b[o] + Σ_i x[n, i] · W[o, i].
Mat linear(const Ref& r, const std::string& prefix, const Mat& x, int64_t rows, int64_t in) {
  const Mat& W = r.at(prefix + ".weight");
  const Mat& b = r.at(prefix + ".bias");
  const int64_t out = static_cast<int64_t>(b.size());
  Mat y(rows * out);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (int64_t i = 0; i < in; ++i) s += x[n * in + i] * W[o * in + i];
      y[n * out + o] = s;
    }
  return y;
}

// nn.RMSNorm over groups of `width`: x · rsqrt(mean(x²) + eps) (· weight).
Mat rms_norm(const Mat& x, int64_t width, double eps, const Mat* weight) {
  Mat y(x.size());
  for (size_t g = 0; g < x.size() / width; ++g) {
    double ms = 0;
    for (int64_t i = 0; i < width; ++i) ms += x[g * width + i] * x[g * width + i];
    const double inv = 1.0 / std::sqrt(ms / width + eps);
    for (int64_t i = 0; i < width; ++i) y[g * width + i] = x[g * width + i] * inv * (weight ? (*weight)[i] : 1.0);
  }
  return y;
}

// Positions [total, 3]: the meshgrid of 2·(arange(0.5, S) / S) - 1, then R + 1 zero rows.
Mat positions(const Ref& r, int64_t T, int64_t H, int64_t W) {
  const int64_t N = T * H * W, total = N + r.c.decoder_num_register_tokens + 1;
  Mat pos(total * 3, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w) {
        const int64_t n = (t * H + h) * W + w;
        pos[n * 3 + 0] = 2.0 * ((t + 0.5) / T) - 1.0;
        pos[n * 3 + 1] = 2.0 * ((h + 0.5) / H) - 1.0;
        pos[n * 3 + 2] = 2.0 * ((w + 0.5) / W) - 1.0;
      }
  return pos;
}

// MiniMaxH3VideoRotaryPosEmbed: angles [total, rope] = (axis-major 2π · pos · inv_freq).tile(2).
Mat rope_angles(const Ref& r, const Mat& pos) {
  const int64_t rope = static_cast<int64_t>(r.c.decoder_attention_head_dim * r.c.decoder_rope_dim_ratio);
  const int64_t nf = rope / 6, total = static_cast<int64_t>(pos.size() / 3);
  Mat ang(total * rope);
  for (int64_t n = 0; n < total; ++n)
    for (int a = 0; a < 3; ++a)
      for (int64_t k = 0; k < nf; ++k) {
        const double inv_freq = 1.0 / std::pow(double(r.c.decoder_rope_theta), k * (6.0 / rope));
        const double v = 2.0 * std::numbers::pi * pos[n * 3 + a] * inv_freq;
        ang[n * rope + a * nf + k] = v;
        ang[n * rope + rope / 2 + a * nf + k] = v;
      }
  return ang;
}

// MiniMaxH3VideoTransformerBlock.forward on x [total, dim].
Mat block(const Ref& r, int i, const Mat& x_in, const Mat& ang) {
  const std::string p = "decoder.transformer_blocks." + std::to_string(i);
  const int64_t heads = r.c.decoder_num_attention_heads, D = r.c.decoder_attention_head_dim, dim = heads * D;
  const int64_t ffn = dim * r.c.decoder_ffn_mult, total = static_cast<int64_t>(x_in.size()) / dim;
  const int64_t rope = static_cast<int64_t>(ang.size()) / total, half = rope / 2;
  const double eps = r.c.decoder_norm_eps;
  Mat x = x_in;

  const Mat h = rms_norm(x, dim, eps, &r.at(p + ".norm1.weight"));
  Mat q = linear(r, p + ".attn.to_q", h, total, dim);
  Mat k = linear(r, p + ".attn.to_k", h, total, dim);
  const Mat v = linear(r, p + ".attn.to_v", h, total, dim);
  q = rms_norm(q, D, eps, nullptr);  // norm_q / norm_k per head, no weight
  k = rms_norm(k, D, eps, nullptr);
  for (Mat* m : {&q, &k}) {
    for (int64_t n = 0; n < total; ++n)
      for (int64_t hd = 0; hd < heads; ++hd) {
        double* row = m->data() + n * dim + hd * D;
        const Mat src(row, row + rope);
        for (int64_t j = 0; j < rope; ++j) {
          const double rotated = j < half ? -src[j + half] : src[j - half];  // cat([-second, first])
          const double a = ang[n * rope + j];
          row[j] = src[j] * std::cos(a) + rotated * std::sin(a);
        }
      }
  }
  Mat o(total * dim, 0.0);
  const double scale = 1.0 / std::sqrt(double(D));
  for (int64_t hd = 0; hd < heads; ++hd)
    for (int64_t n = 0; n < total; ++n) {
      Mat s(total);
      double mx = -1e300;
      for (int64_t m = 0; m < total; ++m) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[n * dim + hd * D + d] * k[m * dim + hd * D + d];
        s[m] = dot * scale;
        mx = std::max(mx, s[m]);
      }
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - mx));
      for (int64_t m = 0; m < total; ++m)
        for (int64_t d = 0; d < D; ++d) o[n * dim + hd * D + d] += s[m] / z * v[m * dim + hd * D + d];
    }
  const Mat attn = linear(r, p + ".attn.to_out.0", o, total, dim);
  const Mat& s1 = r.at(p + ".scale1");
  for (int64_t n = 0; n < total; ++n)
    for (int64_t c = 0; c < dim; ++c) x[n * dim + c] += attn[n * dim + c] * s1[c];

  const Mat h2 = rms_norm(x, dim, eps, &r.at(p + ".norm2.weight"));
  const Mat u = linear(r, p + ".ff.net.0.proj", h2, total, dim);  // diffusers SwiGLU: [value; gate]
  Mat g(total * ffn);
  for (int64_t n = 0; n < total; ++n)
    for (int64_t j = 0; j < ffn; ++j) {
      const double value = u[n * 2 * ffn + j], gate = u[n * 2 * ffn + ffn + j];
      g[n * ffn + j] = value * (gate / (1.0 + std::exp(-gate)));
    }
  const Mat ff = linear(r, p + ".ff.net.2", g, total, ffn);
  const Mat& s2 = r.at(p + ".scale2");
  for (int64_t n = 0; n < total; ++n)
    for (int64_t c = 0; c < dim; ++c) x[n * dim + c] += ff[n * dim + c] * s2[c];
  return x;
}

// The decoder's input to block 0: proj_in(post_quant_conv(z)) tokens, registers, one zero token.
Mat embed(const Ref& r, const Mat& z, int64_t T, int64_t H, int64_t W) {
  const int64_t C = r.c.latent_channels, N = T * H * W, dim = r.c.decoder_dim(), R = r.c.decoder_num_register_tokens;
  Mat tokens(N * C);  // permute(0, 2, 3, 4, 1): [N, C]
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) tokens[n * C + c] = z[c * N + n];
  const Mat pq = linear(r, "post_quant_conv", tokens, N, C);  // 1x1x1 conv == per-voxel linear
  Mat x = linear(r, "decoder.proj_in", pq, N, C);
  const Mat& reg = r.at("decoder.register_tokens");
  x.insert(x.end(), reg.begin(), reg.end());
  x.resize((N + R + 1) * dim, 0.0);
  return x;
}

// norm_out (LayerNorm), proj_out, drop the suffix tokens, unpatchify to [oc, T·pt, H·p, W·p].
Mat head(const Ref& r, const Mat& x, int64_t T, int64_t H, int64_t W) {
  const int64_t dim = r.c.decoder_dim(), total = static_cast<int64_t>(x.size()) / dim;
  const Mat& lw = r.at("decoder.norm_out.weight");
  const Mat& lb = r.at("decoder.norm_out.bias");
  Mat normed(x.size());
  for (int64_t n = 0; n < total; ++n) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < dim; ++c) mean += x[n * dim + c];
    mean /= dim;
    for (int64_t c = 0; c < dim; ++c) var += (x[n * dim + c] - mean) * (x[n * dim + c] - mean);
    var /= dim;
    for (int64_t c = 0; c < dim; ++c)
      normed[n * dim + c] = (x[n * dim + c] - mean) / std::sqrt(var + r.c.decoder_norm_eps) * lw[c] + lb[c];
  }
  const Mat y = linear(r, "decoder.proj_out", normed, total, dim);
  const int64_t oc = r.c.out_channels, pt = r.c.temporal_ratio(), p = r.c.spatial_ratio();
  const int64_t pv = oc * pt * p * p, OF = T * pt, OH = H * p, OW = W * p;
  Mat out(oc * OF * OH * OW);
  // view(T, H, W, oc, pt, p, p).permute(4, 1, 5, 2, 6, 3, 7) → [oc, T, pt, H, p, W, p].
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w)
        for (int64_t c = 0; c < oc; ++c)
          for (int64_t a = 0; a < pt; ++a)
            for (int64_t b = 0; b < p; ++b)
              for (int64_t d = 0; d < p; ++d)
                out[((c * OF + t * pt + a) * OH + h * p + b) * OW + w * p + d] =
                    y[((t * H + h) * W + w) * pv + ((c * pt + a) * p + b) * p + d];
  return out;
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(VideoVaeNaive, BlocksAndChunkDecodeMatchADoublePrecisionReference) {
  const vae::VideoVaeConfig c = *vae::video_vae_config_preset("test");
  const vae::NamedTensors tensors = vae::synthetic_video_vae_tensors(c, 11);
  auto vae = vae::assemble_video_vae(tensors, c);
  ASSERT_TRUE(vae.ok()) << vae.status().to_string();
  const Ref r = make_ref(c, tensors);

  const int64_t T = 2, H = 3, W = 2;  // odd spatial sizes: N = 12, plus 5 suffix tokens
  std::mt19937 rng(17);
  const Tensor z = test::random_tensor(rng, {c.latent_channels, T, H, W});
  std::map<std::string, std::vector<double>> seen;
  const vae::VideoVaeObserver observer = [&](const std::string& name, const Tensor& t) {
    seen[name] = test::values_of(t);
  };
  auto out = vae::decode_video_chunk(*vae, z, &observer);
  ASSERT_TRUE(out.ok()) << out.status().to_string();

  const Mat zd = test::values_of(z);
  const Mat ang = rope_angles(r, positions(r, T, H, W));

  // Each block on the port's own input to it.
  Mat x = embed(r, zd, T, H, W);
  EXPECT_LE(rel_l2(seen.at("decoder.proj_in"), Mat(x.begin(), x.begin() + T * H * W * c.decoder_dim())), 1e-5);
  Mat port_in = seen.at("decoder.proj_in");
  port_in.resize(x.size(), 0.0);
  std::copy(x.begin() + T * H * W * c.decoder_dim(), x.end(), port_in.begin() + T * H * W * c.decoder_dim());
  for (int i = 0; i < c.decoder_num_layers; ++i) {
    const std::string name = "decoder.transformer_blocks." + std::to_string(i);
    const Mat want = block(r, i, port_in, ang);
    EXPECT_LE(rel_l2(seen.at(name), want), 1e-5) << name;
    port_in = seen.at(name);
  }

  // End to end.
  for (int i = 0; i < c.decoder_num_layers; ++i) x = block(r, i, x, ang);
  const Mat want = head(r, x, T, H, W);
  ASSERT_EQ(out->shape(), (Shape{c.out_channels, T * c.temporal_ratio(), H * c.spatial_ratio(), W * c.spatial_ratio()}));
  const double err = rel_l2(test::values_of(*out), want);
  EXPECT_LE(err, 1e-5);
  EXPECT_GT(err, 0.0);  // independent arithmetic; an exact match would mean the check is vacuous
}

}  // namespace
}  // namespace vortex
