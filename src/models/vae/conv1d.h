// 1-D convolutions of the audio VAE (CPU reference, fp32), and weight-norm fusion.
//
// Activations are time-major: x[B, T, C] contiguous F32, one row of C channels per sample, so a
// convolution is a GEMM over rows (the PyTorch layout [B, C, T] is its transpose).
//
//   conv1d:            y[b, t, o] = bias[o] + Σ_{k, c} w[o, c, k] · x[b, t·s + k·d - p, c]
//                      (x is 0 outside [0, T)); T_out = floor((T + 2p - d·(K - 1) - 1) / s) + 1.
//                      Tiles of output rows gather their inputs (im2col, [rows, K·C], k-major)
//                      and run one cpu::matmul_f32 each against the weight packed [O, K·C];
//                      a 1x1 stride-1 unpadded convolution multiplies x directly.
//   conv_transpose1d:  PyTorch ConvTranspose1d (no output padding, no groups): every input
//                      sample scatters w[c, o, k] · x[b, i, c] to output i·s + k - p; here as
//                      Z = x · W (one cpu::linear, W[K·O, C]) then a gather per output sample,
//                      y[b, t, o] = bias[o] + Σ_{k ≡ t+p (mod s), 0 ≤ (t+p-k)/s < T} Z[b, (t+p-k)/s, k·O + o];
//                      T_out = (T - 1)·s - 2p + K.
//   fuse_weight_norm:  torch.nn.utils.weight_norm(dim=0): w = v · (g / ‖v‖), the 2-norm over
//                      every dim but the first (per output channel of a Conv1d, per input
//                      channel of a ConvTranspose1d, whose weight is [C_in, C_out, K]).
//
// The sums are fp32 in k order inside each GEMM (the kLoops kernel) or OpenBLAS's order; the
// reference's order differs, which parity tests bound by relative L2.
#pragma once

#include <cstdint>

#include "cpu/gemm.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

struct Conv1dShape {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t dilation = 1;
  int64_t padding = 0;
};

// The output length for an input of `length` samples; < 1 when the input is too short.
int64_t conv1d_output_length(const Conv1dShape& shape, int64_t length);

// Output columns per GEMM tile for a convolution cut into `row_tiles` tiles of output rows over
// `out` channels: cpu::few_rows_tile_columns rounded up to whole 16-wide panels (the last block
// takes the rest). A fixed function of the shape, never of the thread count, so that results do
// not depend on the machine's cores. conv1d and causal_conv3d cut their tiles with it.
int64_t conv_column_block(int64_t row_tiles, int64_t out);

// A float CPU tensor as contiguous F32 (converted when it is BF16 or F16); errors name `what`.
Result<Tensor> conv_tensor_f32(const std::string& what, const Tensor& t);

struct Conv1d {
  Conv1dShape shape;
  Tensor weight;  // F32 [O, K·C]: weight[o, k·C + c] = w[o, c, k]
  Tensor bias;    // F32 [O], or undefined
};

// From PyTorch's weight [O, C, K] (any float dtype; converted to F32) and bias [O] (undefined for
// none). Errors name `what` (the tensor's checkpoint name).
Result<Conv1d> make_conv1d(const std::string& what, const Tensor& weight, const Tensor& bias, int64_t stride,
                           int64_t dilation, int64_t padding);

// x: F32 [B, T, C] contiguous. Returns y: F32 [B, T_out, O].
Result<Tensor> conv1d(const Conv1d& conv, const Tensor& x, cpu::GemmVariant variant = cpu::default_gemm_variant());

struct ConvTranspose1dShape {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t padding = 0;
};

int64_t conv_transpose1d_output_length(const ConvTranspose1dShape& shape, int64_t length);

struct ConvTranspose1d {
  ConvTranspose1dShape shape;
  Tensor weight;  // F32 [K·O, C]: weight[k·O + o, c] = w[c, o, k]
  Tensor bias;    // F32 [O], or undefined
};

// From PyTorch's weight [C_in, C_out, K] and bias [C_out] (undefined for none).
Result<ConvTranspose1d> make_conv_transpose1d(const std::string& what, const Tensor& weight, const Tensor& bias,
                                              int64_t stride, int64_t padding);

// x: F32 [B, T, C_in] contiguous. Returns y: F32 [B, T_out, C_out].
Result<Tensor> conv_transpose1d(const ConvTranspose1d& conv, const Tensor& x,
                                cpu::GemmVariant variant = cpu::default_gemm_variant());

// g: [N, 1, ...] (N values), v: [N, ...]; any float dtypes. Returns F32 w with v's shape.
// The norm is accumulated in double, then g / ‖v‖ and the product are fp32 like the reference's.
Result<Tensor> fuse_weight_norm(const std::string& what, const Tensor& g, const Tensor& v);

}  // namespace vortex::vae
