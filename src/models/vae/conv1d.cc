#include "models/vae/conv1d.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"

namespace vortex::vae {

namespace {

// Scratch for one tile's gathered inputs (4 MiB): bounds memory per thread, while tiles stay tall
// enough that packing the weight block once per tile is cheap next to the tile's multiply.
constexpr int64_t kTileScratchFloats = int64_t{1} << 20;
constexpr int64_t kMaxTileRows = 256;
constexpr int64_t kMinTileRows = 16;
// Column blocks are whole multiples of the GEMM kernel's 16-wide panels.
constexpr int64_t kColumnQuantum = 16;

Status check_activation(const char* op, const Tensor& x, int64_t channels) {
  if (!x.defined() || x.dtype() != DType::kF32 || x.rank() != 3 || !x.is_contiguous() || x.device() != Device::kCpu) {
    return invalid_argument(std::string(op) + ": x " + (x.defined() ? x.describe() : std::string("(undefined)")) +
                            " must be a contiguous F32 CPU tensor [B, T, C]");
  }
  if (x.size(2) != channels) {
    return invalid_argument(std::string(op) + ": x " + x.describe() + " has " + std::to_string(x.size(2)) +
                            " channels, the weight expects " + std::to_string(channels));
  }
  return ok_status();
}

}  // namespace

Result<Tensor> conv_tensor_f32(const std::string& what, const Tensor& t) {
  if (!t.defined()) return invalid_argument("tensor '" + what + "' is undefined");
  if (t.device() != Device::kCpu || !dtype_is_float(t.dtype())) {
    return invalid_argument("tensor '" + what + "': " + t.describe() + " must be a float CPU tensor");
  }
  if (t.dtype() == DType::kF32) return t.contiguous();
  return t.to(DType::kF32);
}

int64_t conv_column_block(int64_t row_tiles, int64_t out) {
  int64_t cols = cpu::few_rows_tile_columns(row_tiles, out);
  if (cols >= out) return out;
  cols = (cols + kColumnQuantum - 1) / kColumnQuantum * kColumnQuantum;
  return std::clamp<int64_t>(cols, 1, out);
}

int64_t conv1d_output_length(const Conv1dShape& s, int64_t length) {
  const int64_t span = length + 2 * s.padding - s.dilation * (s.kernel - 1) - 1;
  if (span < 0) return 0;
  return span / s.stride + 1;
}

Result<Conv1d> make_conv1d(const std::string& what, const Tensor& weight, const Tensor& bias, int64_t stride,
                           int64_t dilation, int64_t padding) {
  if (!weight.defined() || weight.rank() != 3) {
    return invalid_argument("tensor '" + what + "' must be a conv1d weight [O, C, K]");
  }
  if (stride < 1 || dilation < 1 || padding < 0) {
    return invalid_argument("conv1d '" + what + "': stride and dilation must be >= 1, padding >= 0");
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor w, conv_tensor_f32(what, weight));
  Conv1d conv;
  conv.shape = {w.size(1), w.size(0), w.size(2), stride, dilation, padding};
  const int64_t O = w.size(0), C = w.size(1), K = w.size(2);
  conv.weight = Tensor::empty({O, K * C}, DType::kF32);
  const float* src = w.data_as<float>();
  float* dst = conv.weight.data_as<float>();
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < K; ++k) dst[o * K * C + k * C + c] = src[(o * C + c) * K + k];
  if (bias.defined()) {
    if (bias.rank() != 1 || bias.size(0) != O) {
      return invalid_argument("conv1d '" + what + "': bias " + bias.describe() + " must be [" + std::to_string(O) +
                              "]");
    }
    VORTEX_ASSIGN_OR_RETURN(conv.bias, conv_tensor_f32(what + " bias", bias));
  }
  return conv;
}

Result<Tensor> conv1d(const Conv1d& conv, const Tensor& x, cpu::GemmVariant variant) {
  const Conv1dShape& s = conv.shape;
  VORTEX_RETURN_IF_ERROR(check_activation("conv1d", x, s.in_channels));
  if (!cpu::gemm_variant_available(variant)) return unimplemented("conv1d: GEMM variant not in this build");
  const int64_t B = x.size(0), T = x.size(1), C = s.in_channels, O = s.out_channels, K = s.kernel;
  const int64_t T_out = conv1d_output_length(s, T);
  if (T_out < 1) {
    return invalid_argument("conv1d: x " + x.describe() + " is shorter than the kernel's reach (" +
                            std::to_string(s.dilation * (s.kernel - 1) + 1) + " samples with padding " +
                            std::to_string(s.padding) + ")");
  }
  Tensor y = Tensor::empty({B, T_out, O}, DType::kF32);
  const int64_t KC = K * C;
  const bool direct = K == 1 && s.stride == 1 && s.padding == 0;
  const int64_t tile_rows =
      std::min(T_out, direct ? kMaxTileRows
                             : std::clamp(kTileScratchFloats / std::max<int64_t>(KC, 1), kMinTileRows, kMaxTileRows));
  const int64_t row_blocks = (T_out + tile_rows - 1) / tile_rows;
  const int64_t cols_per_block = conv_column_block(B * row_blocks, O);
  const int64_t col_blocks = (O + cols_per_block - 1) / cols_per_block;

  const float* xd = x.data_as<const float>();
  const float* wd = conv.weight.data_as<const float>();
  const float* bd = conv.bias.defined() ? conv.bias.data_as<const float>() : nullptr;
  float* yd = y.data_as<float>();
  parallel_for(0, B * row_blocks * col_blocks, [&](int64_t t0, int64_t t1) {
    std::vector<float> col;
    int64_t gathered = -1;  // the (batch, row block) whose inputs `col` holds
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t cb = t % col_blocks, brb = t / col_blocks;
      const int64_t b = brb / row_blocks, r0 = (brb % row_blocks) * tile_rows;
      const int64_t rows = std::min(tile_rows, T_out - r0);
      const int64_t c0 = cb * cols_per_block, cols = std::min(cols_per_block, O - c0);
      const float* xb = xd + b * T * C;
      const float* a = xb + r0 * C;
      int64_t lda = C;
      if (!direct) {
        if (gathered != brb) {
          col.resize(static_cast<size_t>(rows * KC));
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t base = (r0 + r) * s.stride - s.padding;
            for (int64_t k = 0; k < K; ++k) {
              const int64_t src = base + k * s.dilation;
              float* dst = col.data() + r * KC + k * C;
              if (src >= 0 && src < T) {
                std::memcpy(dst, xb + src * C, static_cast<size_t>(C) * sizeof(float));
              } else {
                std::fill(dst, dst + C, 0.0f);
              }
            }
          }
          gathered = brb;
        }
        a = col.data();
        lda = KC;
      }
      float* c = yd + (b * T_out + r0) * O + c0;
      cpu::matmul_f32(variant, true, rows, cols, KC, 1.0f, a, std::max<int64_t>(lda, 1), wd + c0 * KC,
                      std::max<int64_t>(KC, 1), c, O);
      if (bd != nullptr) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < cols; ++j) c[r * O + j] += bd[c0 + j];
      }
    }
  });
  return y;
}

int64_t conv_transpose1d_output_length(const ConvTranspose1dShape& s, int64_t length) {
  return (length - 1) * s.stride - 2 * s.padding + s.kernel;
}

Result<ConvTranspose1d> make_conv_transpose1d(const std::string& what, const Tensor& weight, const Tensor& bias,
                                              int64_t stride, int64_t padding) {
  if (!weight.defined() || weight.rank() != 3) {
    return invalid_argument("tensor '" + what + "' must be a conv_transpose1d weight [C_in, C_out, K]");
  }
  if (stride < 1 || padding < 0) {
    return invalid_argument("conv_transpose1d '" + what + "': stride must be >= 1, padding >= 0");
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor w, conv_tensor_f32(what, weight));
  ConvTranspose1d conv;
  const int64_t C = w.size(0), O = w.size(1), K = w.size(2);
  conv.shape = {C, O, K, stride, padding};
  conv.weight = Tensor::empty({K * O, C}, DType::kF32);
  const float* src = w.data_as<float>();
  float* dst = conv.weight.data_as<float>();
  for (int64_t c = 0; c < C; ++c)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < K; ++k) dst[(k * O + o) * C + c] = src[(c * O + o) * K + k];
  if (bias.defined()) {
    if (bias.rank() != 1 || bias.size(0) != O) {
      return invalid_argument("conv_transpose1d '" + what + "': bias " + bias.describe() + " must be [" +
                              std::to_string(O) + "]");
    }
    VORTEX_ASSIGN_OR_RETURN(conv.bias, conv_tensor_f32(what + " bias", bias));
  }
  return conv;
}

Result<Tensor> conv_transpose1d(const ConvTranspose1d& conv, const Tensor& x, cpu::GemmVariant variant) {
  const ConvTranspose1dShape& s = conv.shape;
  VORTEX_RETURN_IF_ERROR(check_activation("conv_transpose1d", x, s.in_channels));
  const int64_t B = x.size(0), T = x.size(1), O = s.out_channels, K = s.kernel;
  const int64_t T_out = conv_transpose1d_output_length(s, T);
  if (T < 1 || T_out < 1) {
    return invalid_argument("conv_transpose1d: x " + x.describe() + " gives no output samples");
  }
  // Z[b·T + i, k·O + o] = Σ_c x[b, i, c] · w[c, o, k]
  Tensor z = Tensor::empty({B * T, K * O}, DType::kF32);
  VORTEX_ASSIGN_OR_RETURN(Tensor x2, x.reshape({B * T, s.in_channels}));
  VORTEX_RETURN_IF_ERROR(cpu::linear(x2.view(), conv.weight.view(), nullptr, z.view(), variant));

  Tensor y = Tensor::empty({B, T_out, O}, DType::kF32);
  const float* zd = z.data_as<const float>();
  const float* bd = conv.bias.defined() ? conv.bias.data_as<const float>() : nullptr;
  float* yd = y.data_as<float>();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(O, 1));
  parallel_for(
      0, B * T_out,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t b = r / T_out, t = r % T_out;
          float* out = yd + r * O;
          std::fill(out, out + O, 0.0f);
          const int64_t full = t + s.padding;  // index into the unpadded (full) output
          for (int64_t k = full % s.stride; k < K; k += s.stride) {
            const int64_t i = (full - k) / s.stride;
            if (i < 0) break;  // i only falls as k grows
            if (i >= T) continue;
            const float* zr = zd + (b * T + i) * K * O + k * O;
            for (int64_t o = 0; o < O; ++o) out[o] += zr[o];
          }
          if (bd != nullptr) {
            for (int64_t o = 0; o < O; ++o) out[o] += bd[o];
          }
        }
      },
      grain);
  return y;
}

Result<Tensor> fuse_weight_norm(const std::string& what, const Tensor& g, const Tensor& v) {
  if (!g.defined() || !v.defined() || v.rank() < 1) {
    return invalid_argument("weight norm '" + what + "': weight_g and weight_v are required");
  }
  const int64_t n = v.size(0);
  if (g.numel() != n || g.size(0) != n) {
    return invalid_argument("weight norm '" + what + "': weight_g " + g.describe() +
                            " must hold one value per row of " + "weight_v " + v.describe());
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor gf, conv_tensor_f32(what + ".weight_g", g));
  VORTEX_ASSIGN_OR_RETURN(Tensor vf, conv_tensor_f32(what + ".weight_v", v));
  Tensor w = Tensor::empty(v.shape(), DType::kF32);
  const int64_t row = n == 0 ? 0 : v.numel() / n;
  const float* gd = gf.data_as<const float>();
  const float* vd = vf.data_as<const float>();
  float* wd = w.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < row; ++j) sum += double(vd[i * row + j]) * vd[i * row + j];
    const float scale = gd[i] / static_cast<float>(std::sqrt(sum));
    for (int64_t j = 0; j < row; ++j) wd[i * row + j] = vd[i * row + j] * scale;
  }
  return w;
}

}  // namespace vortex::vae
