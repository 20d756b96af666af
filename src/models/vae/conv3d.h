// The video VAE encoder's ops (CPU reference, fp32) on channels-last activations.
//
// Activations are x[T, H, W, C] contiguous F32: one row of C channels per pixel, so a convolution
// is a GEMM over pixel rows (PyTorch's [C, T, H, W] is a transpose of it).
//
//   causal_conv3d: the reference's MiniMaxH3VideoCausalConv3d (and its downsampler): the input is
//     padded by reflection in H and W (pad_top / pad_bottom rows, pad_left / pad_right columns;
//     reflect means the edge is not repeated: row -1 reads row 1), then `temporal_padding` zero
//     frames are put in front (a causal conv: nothing after the last frame), then an unpadded
//     strided convolution with bias:
//       y[t, h, w, o] = bias[o] + Σ_{a, b, d, c} wt[o, c, a, b, d] · xp[t·st + a, h·sh + b, w·sw + d, c]
//     with T_out = (T + temporal_padding - kt) / st + 1 and likewise for H and W.
//     Tiles of output pixels of one frame gather their inputs (im2col over the taps whose frame is
//     a real one, [rows, taps·C]) and run one cpu::matmul_f32 against the weight packed
//     [O, kt·kh·kw·C] (tap-major, channel fastest). Taps that read a zero frame are left out of
//     the sum: adding their exact zeros would not change it.
//   frame_group_norm: GroupNorm with `groups` groups over each frame on its own (the reference's
//     MiniMaxH3VideoGroupNorm folds T into the batch), biased variance, y = (x - mean) · rsqrt(var +
//     eps) · weight + bias, optionally followed by SiLU (x / (1 + exp(-x)), core/portable_math.h's
//     exp). The statistics are summed in double.
//
// The sums are fp32 in k order inside each GEMM (the kLoops kernel) or OpenBLAS's order; the
// reference's order differs, which parity tests bound by relative L2.
#pragma once

#include <cstdint>
#include <string>

#include "cpu/gemm.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

struct Conv3dGeometry {
  int64_t kt = 1, kh = 1, kw = 1;
  int64_t st = 1, sh = 1, sw = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;  // reflect
  int64_t temporal_padding = 0;                                       // zero frames in front
};

struct CausalConv3d {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  Conv3dGeometry geometry;
  Tensor weight;  // F32 [O, kt·kh·kw·C]: weight[o, ((a·kh + b)·kw + d)·C + c] = wt[o, c, a, b, d]
  Tensor bias;    // F32 [O]
};

// From PyTorch's Conv3d weight [O, C, kt, kh, kw] and bias [O] (any float dtype). The geometry's
// kernel sizes are taken from the weight. Errors name `what` (the tensor's checkpoint name).
Result<CausalConv3d> make_causal_conv3d(const std::string& what, const Tensor& weight, const Tensor& bias,
                                        Conv3dGeometry geometry);

// Output extent along one axis: (length + pads - kernel) / stride + 1, or < 1 when the input is
// too short for the kernel.
int64_t conv3d_output_length(int64_t length, int64_t pad_before, int64_t pad_after, int64_t kernel, int64_t stride);

// The output shape [T_out, H_out, W_out, out_channels] of a conv of geometry `g` on x of shape
// [T, H, W, C]; invalid_argument, naming the input as `what`, when an axis is not longer than its
// reflect pad or the input is smaller than the kernel (causal_conv3d's refusals).
Result<Shape> conv3d_output_shape(const Conv3dGeometry& g, int64_t out_channels, const Shape& x,
                                  const std::string& what);

// x: F32 [T, H, W, C] contiguous. Returns F32 [T_out, H_out, W_out, O]. Reflection needs every
// spatial pad to be smaller than its axis (as in PyTorch); a violation is an invalid_argument
// naming the axis.
Result<Tensor> causal_conv3d(const CausalConv3d& conv, const Tensor& x,
                             cpu::GemmVariant variant = cpu::default_gemm_variant());

// x: F32 [T, H, W, C] contiguous, changed in place; weight, bias: F32 [C]; C divisible by `groups`.
Status frame_group_norm(Tensor& x, const Tensor& weight, const Tensor& bias, int groups, float eps, bool silu);

}  // namespace vortex::vae
