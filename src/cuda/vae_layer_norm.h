// LayerNorm on the GPU: the video VAE decoder's norm_out and the Qwen3-VL vision tower's norms,
// with the CPU reference's numerics (models/vae/video_vae.h video_layer_norm, cpu::layer_norm).
#pragma once

#include <cuda_runtime.h>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// y[n, :] = R(((x[n, :] - mean) · rstd) · weight + bias) over the last dim C, with the mean and the
// biased variance accumulated in double, rstd = 1 / sqrt(var + eps) in fp32. x: F32 or BF16 [N, C]
// device view (any row stride, unit column stride); weight, bias: F32 [C] contiguous; y: F32 or
// BF16 [N, C] (R rounds to its dtype). x and y may alias when they have the same dtype.
Status layer_norm(const TensorView& x, const TensorView& weight, const TensorView& bias, float eps,
                  const TensorView& y, cudaStream_t stream);

}  // namespace vortex::cuda
