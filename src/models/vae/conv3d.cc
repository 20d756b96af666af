#include "models/vae/conv3d.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "core/portable_math.h"
#include "models/vae/conv1d.h"

namespace vortex::vae {

namespace {

// One tile's gathered inputs stay under 4 MiB, as in conv1d.
constexpr int64_t kTileScratchFloats = int64_t{1} << 20;
constexpr int64_t kMaxTileRows = 256;
constexpr int64_t kMinTileRows = 16;

// PyTorch's reflect padding: index i of the padded axis reads index reflect(i) of the n real ones.
inline int64_t reflect(int64_t i, int64_t pad_before, int64_t n) {
  int64_t j = i - pad_before;
  if (j < 0) j = -j;
  if (j >= n) j = 2 * (n - 1) - j;
  return j;
}

}  // namespace

int64_t conv3d_output_length(int64_t length, int64_t pad_before, int64_t pad_after, int64_t kernel, int64_t stride) {
  const int64_t span = length + pad_before + pad_after - kernel;
  if (span < 0) return 0;
  return span / stride + 1;
}

Result<Shape> conv3d_output_shape(const Conv3dGeometry& g, int64_t out_channels, const Shape& x,
                                  const std::string& what) {
  const int64_t T = x[0], H = x[1], W = x[2];
  if (std::max(g.pad_top, g.pad_bottom) >= H || std::max(g.pad_left, g.pad_right) >= W) {
    return invalid_argument("conv3d: x " + what + " is too small for reflect padding " +
                            std::to_string(std::max({g.pad_top, g.pad_bottom, g.pad_left, g.pad_right})) +
                            " (each padded axis must be longer than its pad)");
  }
  const int64_t T_out = conv3d_output_length(T, g.temporal_padding, 0, g.kt, g.st);
  const int64_t H_out = conv3d_output_length(H, g.pad_top, g.pad_bottom, g.kh, g.sh);
  const int64_t W_out = conv3d_output_length(W, g.pad_left, g.pad_right, g.kw, g.sw);
  if (T_out < 1 || H_out < 1 || W_out < 1) {
    return invalid_argument("conv3d: x " + what + " is smaller than the kernel [" + std::to_string(g.kt) + ", " +
                            std::to_string(g.kh) + ", " + std::to_string(g.kw) + "]");
  }
  return Shape{T_out, H_out, W_out, out_channels};
}

Result<CausalConv3d> make_causal_conv3d(const std::string& what, const Tensor& weight, const Tensor& bias,
                                        Conv3dGeometry g) {
  if (!weight.defined() || weight.rank() != 5) {
    return invalid_argument("tensor '" + what + "' must be a conv3d weight [O, C, kt, kh, kw]");
  }
  if (g.st < 1 || g.sh < 1 || g.sw < 1 || g.pad_top < 0 || g.pad_bottom < 0 || g.pad_left < 0 || g.pad_right < 0 ||
      g.temporal_padding < 0) {
    return invalid_argument("conv3d '" + what + "': strides must be >= 1 and paddings >= 0");
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor w, conv_tensor_f32(what, weight));
  CausalConv3d conv;
  const int64_t O = w.size(0), C = w.size(1);
  g.kt = w.size(2);
  g.kh = w.size(3);
  g.kw = w.size(4);
  conv.in_channels = C;
  conv.out_channels = O;
  conv.geometry = g;
  const int64_t taps = g.kt * g.kh * g.kw;
  conv.weight = Tensor::empty({O, taps * C}, DType::kF32);
  const float* src = w.data_as<const float>();
  float* dst = conv.weight.data_as<float>();
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < taps; ++k) dst[(o * taps + k) * C + c] = src[(o * C + c) * taps + k];
  if (!bias.defined() || bias.rank() != 1 || bias.size(0) != O) {
    return invalid_argument("conv3d '" + what + "': bias " + (bias.defined() ? bias.describe() : "(missing)") +
                            " must be [" + std::to_string(O) + "]");
  }
  VORTEX_ASSIGN_OR_RETURN(conv.bias, conv_tensor_f32(what + " bias", bias));
  return conv;
}

Result<Tensor> causal_conv3d(const CausalConv3d& conv, const Tensor& x, cpu::GemmVariant variant) {
  const Conv3dGeometry& g = conv.geometry;
  if (!x.defined() || x.dtype() != DType::kF32 || x.rank() != 4 || !x.is_contiguous() || x.device() != Device::kCpu) {
    return invalid_argument("conv3d: x " + (x.defined() ? x.describe() : std::string("(undefined)")) +
                            " must be a contiguous F32 CPU tensor [T, H, W, C]");
  }
  const int64_t H = x.size(1), W = x.size(2), C = conv.in_channels, O = conv.out_channels;
  if (x.size(3) != C) {
    return invalid_argument("conv3d: x " + x.describe() + " has " + std::to_string(x.size(3)) +
                            " channels, the weight expects " + std::to_string(C));
  }
  VORTEX_ASSIGN_OR_RETURN(const Shape out, conv3d_output_shape(g, O, x.shape(), x.describe()));
  if (!cpu::gemm_variant_available(variant)) return unimplemented("conv3d: GEMM variant not in this build");
  const int64_t T_out = out[0], H_out = out[1], W_out = out[2];
  Tensor y = Tensor::empty(out, DType::kF32);
  const int64_t plane = H_out * W_out, spatial_taps = g.kh * g.kw, KC = g.kt * spatial_taps * C;
  const bool direct = g.kt == 1 && spatial_taps == 1 && g.st == 1 && g.sh == 1 && g.sw == 1 && g.pad_top == 0 &&
                      g.pad_bottom == 0 && g.pad_left == 0 && g.pad_right == 0 && g.temporal_padding == 0;
  const int64_t tile_rows =
      std::min(plane, direct ? kMaxTileRows
                             : std::clamp(kTileScratchFloats / std::max<int64_t>(KC, 1), kMinTileRows, kMaxTileRows));
  const int64_t row_blocks = (plane + tile_rows - 1) / tile_rows;
  const int64_t cols_per_block = conv_column_block(T_out * row_blocks, O);
  const int64_t col_blocks = (O + cols_per_block - 1) / cols_per_block;

  const float* xd = x.data_as<const float>();
  const float* wd = conv.weight.data_as<const float>();
  const float* bd = conv.bias.data_as<const float>();
  float* yd = y.data_as<float>();
  parallel_for(0, T_out * row_blocks * col_blocks, [&](int64_t t0, int64_t t1) {
    std::vector<float> col;
    int64_t gathered = -1;  // the (frame, row block) whose inputs `col` holds
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t cb = t % col_blocks, frb = t / col_blocks;
      const int64_t f = frb / row_blocks, r0 = (frb % row_blocks) * tile_rows;
      const int64_t rows = std::min(tile_rows, plane - r0);
      const int64_t c0 = cb * cols_per_block, cols = std::min(cols_per_block, O - c0);
      // Temporal taps [a0, kt) read real frames; the ones before read the causal zeros.
      const int64_t a0 = std::clamp<int64_t>(g.temporal_padding - f * g.st, 0, g.kt);
      const int64_t k_begin = a0 * spatial_taps * C, k_len = KC - k_begin;
      const float* a = xd + f * H * W * C + r0 * C;
      int64_t lda = C;
      if (!direct) {
        if (gathered != frb) {
          col.resize(static_cast<size_t>(rows * std::max<int64_t>(k_len, 1)));
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t ho = (r0 + r) / W_out, wo = (r0 + r) % W_out;
            float* dst = col.data() + r * k_len;
            for (int64_t ta = a0; ta < g.kt; ++ta) {
              const float* frame = xd + (f * g.st + ta - g.temporal_padding) * H * W * C;
              for (int64_t b = 0; b < g.kh; ++b) {
                const int64_t hi = reflect(ho * g.sh + b, g.pad_top, H);
                for (int64_t d = 0; d < g.kw; ++d) {
                  const int64_t wi = reflect(wo * g.sw + d, g.pad_left, W);
                  std::memcpy(dst, frame + (hi * W + wi) * C, static_cast<size_t>(C) * sizeof(float));
                  dst += C;
                }
              }
            }
          }
          gathered = frb;
        }
        a = col.data();
        lda = k_len;
      }
      float* c = yd + (f * plane + r0) * O + c0;
      cpu::matmul_f32(variant, true, rows, cols, k_len, 1.0f, a, std::max<int64_t>(lda, 1), wd + c0 * KC + k_begin,
                      std::max<int64_t>(KC, 1), c, O);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) c[r * O + j] += bd[c0 + j];
    }
  });
  return y;
}

Status frame_group_norm(Tensor& x, const Tensor& weight, const Tensor& bias, int groups, float eps, bool silu) {
  if (!x.defined() || x.dtype() != DType::kF32 || x.rank() != 4 || !x.is_contiguous() || x.device() != Device::kCpu) {
    return invalid_argument("group_norm: x " + (x.defined() ? x.describe() : std::string("(undefined)")) +
                            " must be a contiguous F32 CPU tensor [T, H, W, C]");
  }
  const int64_t T = x.size(0), P = x.size(1) * x.size(2), C = x.size(3);
  if (groups < 1 || C % groups != 0) {
    return invalid_argument("group_norm: " + std::to_string(C) + " channels do not split into " +
                            std::to_string(groups) + " groups");
  }
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined() || p->dtype() != DType::kF32 || p->numel() != C || !p->is_contiguous()) {
      return invalid_argument("group_norm: weight and bias must be contiguous F32 [" + std::to_string(C) + "]");
    }
  }
  const int64_t G = groups, Cg = C / G;
  float* xd = x.data_as<float>();
  const float* wd = weight.data_as<const float>();
  const float* bd = bias.data_as<const float>();
  // Per (frame, group): the mean, then the variance around it (two passes, double sums).
  std::vector<float> mean(static_cast<size_t>(T * G)), rstd(static_cast<size_t>(T * G));
  parallel_for(0, T * G, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const float* base = xd + (s / G) * P * C + (s % G) * Cg;
      double sum = 0.0;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = 0; c < Cg; ++c) sum += base[p * C + c];
      const double m = sum / static_cast<double>(P * Cg);
      double sq = 0.0;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t c = 0; c < Cg; ++c) {
          const double d = base[p * C + c] - m;
          sq += d * d;
        }
      mean[s] = static_cast<float>(m);
      rstd[s] = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(P * Cg) + static_cast<double>(eps)));
    }
  });
  parallel_for(0, T * P, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = xd + r * C;
      const int64_t f = r / P;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t s = f * G + c / Cg;
        float v = (row[c] - mean[s]) * rstd[s] * wd[c] + bd[c];
        if (silu) v = v / (1.0f + portable_expf(-v));
        row[c] = v;
      }
    }
  });
  return ok_status();
}

}  // namespace vortex::vae
