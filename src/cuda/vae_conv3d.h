// The video VAE encoder's ops on the GPU (fp32, channels-last activations x[T, H, W, C]), with the
// CPU reference's numerics (models/vae/conv3d.h):
//
//   conv3d_gather: one output frame's im2col rows for a causal 3D convolution — the reflect-padded
//     spatial taps of the temporal taps [a0, kt) that read real frames (the ones before read the
//     causal zeros and are left out of the sum, as on the CPU). A GEMM of these rows with the
//     weight's columns [a0·kh·kw·C, kt·kh·kw·C) is the convolution of those output rows.
//   conv3d_implicit: the same convolution (gather rows times the real taps' weight columns, plus
//     the bias) for every output frame at once, without writing the rows: an implicit GEMM on
//     tensor cores (wgmma, vae_conv3d_tc.cu), each fp32 operand split into two tf32 parts.
//   frame_group_norm: GroupNorm over each frame on its own, the mean and the biased variance
//     summed in double (the variance around the double mean), then the CPU's fp32 operation
//     sequence, optionally followed by SiLU (x / (1 + expf(-x))).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

struct Conv3dTaps {
  int64_t kt = 1, kh = 1, kw = 1;
  int64_t st = 1, sh = 1, sw = 1;
  int64_t pad_top = 0, pad_left = 0;  // reflect; the bottom / right pads only shape H_out / W_out
  int64_t temporal_padding = 0;       // zero frames in front
};

// cols[r, k] for the output pixels [r0, r0 + rows) of output frame `frame` of `clips` clips of T
// frames stacked in x: row r0 + r is pixel p = (r0 + r) mod (h_out·w_out) (row-major over
// [h_out, w_out]) of clip n = (r0 + r) / (h_out·w_out), and k = ((ta - a0)·kh + b)·kw + d)·C + c
// reads x[n·T + frame·st + ta - temporal_padding, reflect(ho·sh + b - pad_top),
// reflect(wo·sw + d - pad_left), c] for ta in [a0, kt). The clips are encoded apart (tiles of a
// keyframe, batched); with one clip the rows are one frame's.
// x: F32 [clips·T, H, W, C] contiguous device; cols: F32 [rows, (kt - a0)·kh·kw·C] contiguous device.
Status conv3d_gather(const TensorView& x, int64_t clips, const Conv3dTaps& taps, int64_t h_out, int64_t w_out,
                     int64_t frame, int64_t a0, int64_t r0, const TensorView& cols, cudaStream_t stream);

// How the encoder computes a causal conv (VORTEX_VARIANT_VAE_CONV): kTf32x3Ws (the default),
// kTf32x3 and kTf32 run conv3d_implicit where it applies (conv3d_implicit_supports) and
// kGatherGemm's path elsewhere; kGatherGemm is conv3d_gather and an fp32 cuBLASLt GEMM everywhere.
// kTf32x3 is ~3e-7 rel-L2 from exact sums (vae_conv3d_tc.cu), as close as the fp32 GEMM;
// kTf32x3Ws is the warp-specialized kernel of the same bits on a weight split at load
// (split_conv_weight_tf32: ~0.7 GB more weights for the release encoder, ~27% less time);
// kTf32 (one tf32 product, ~8e-4 a conv, approximate; the warp-specialized kernel without the split)
// is --vae-encode-precision tf32's.
enum class VaeConvVariant { kTf32x3, kTf32x3Ws, kTf32, kGatherGemm };
Result<VaeConvVariant> vae_conv_variant_from_env();

// Whether conv3d_implicit takes a conv of these widths: C a multiple of 32, O of 128 (every conv
// of the release's encoder but conv_in's 3 input and conv_out's 48 output channels).
bool conv3d_implicit_supports(int64_t in_channels, int64_t out_channels);

// y[f·clips·h_out·w_out + r, o] = bias[o] + Σ_k cols_f[r, k] · weight[o, a0_f·kh·kw·C + k] for every
// output frame f of `clips` clips of T frames stacked in x, where cols_f are conv3d_gather's rows
// of frame f (all of them) and a0_f = clamp(temporal_padding − f·st, 0, kt) its first real tap.
// x: F32 [clips·T, H, W, C] contiguous; weight: F32 [O, kt·kh·kw·C] contiguous; bias: F32 [O];
// y: F32 [T_out·clips·h_out·w_out, O] contiguous (several clips need T_out = 1); all device,
// 16-byte aligned. `variant` is kTf32x3, kTf32x3Ws or kTf32. kTf32x3Ws takes the weight as
// split_conv_weight_tf32 leaves it (weight its high parts, weight_lo its low parts, the same
// layout); the others take the raw weight and weight_lo = nullptr. kTf32x3Ws and kTf32 (the
// warp-specialized kernel) run `ctas` persistent CTAs that walk the 128 x 128 output tiles between
// them (0: one an SM; the tests give fewer, so that each walks several tiles).
Status conv3d_implicit(const TensorView& x, int64_t clips, const Conv3dTaps& taps, int64_t h_out, int64_t w_out,
                       const TensorView& weight, const TensorView* weight_lo, const TensorView& bias,
                       const TensorView& y, VaeConvVariant variant, cudaStream_t stream, int ctas = 0);

// Splits a conv weight once for kTf32x3Ws: each value w becomes its tf32 rounding hi (in place)
// and lo = tf32(w − hi), the parts every tf32x3 kernel makes of B (the same roundings, so the same
// products). weight, lo: contiguous F32 device tensors of one shape.
Status split_conv_weight_tf32(const TensorView& weight, const TensorView& lo, cudaStream_t stream);

// Doubles of scratch frame_group_norm needs for `frames` frames of `groups` groups.
int64_t frame_group_norm_scratch(int64_t frames, int64_t groups);

// y = GroupNorm(x) per frame (then SiLU when `silu`); x, y: F32 [T, H, W, C] contiguous device
// (y may be x); weight, bias: F32 [C] device; scratch: F64 device, at least
// frame_group_norm_scratch(T, groups) elements.
Status frame_group_norm(const TensorView& x, const TensorView& weight, const TensorView& bias, int64_t groups,
                        float eps, bool silu, const TensorView& scratch, const TensorView& y, cudaStream_t stream);

}  // namespace vortex::cuda
