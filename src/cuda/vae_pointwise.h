// Pointwise ops of the audio VAE on the GPU that the shared elementwise family (cuda/elementwise.h)
// does not have: the decoder's mean over an upsampling stage's AMP blocks (a division, as the
// reference divides) and the waveform's final clamp; the encoder's pre_block head mean and pooling,
// its gated GELU and the latents' normalisation (models/vae/audio_vae_encoder.h). Each is the CPU's
// sequence of fp32 operations, in its order.
#pragma once

#include <cuda_runtime.h>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// x = x / divisor, in place; x a contiguous F32 device tensor. Bit-identical to the CPU's fp32 division.
Status divide_by(const TensorView& x, float divisor, cudaStream_t stream);

// x = clamp(x, lo, hi) with std::clamp's comparisons (NaN stays NaN), in place; x a contiguous F32
// device tensor.
Status clamp(const TensorView& x, float lo, float hi, cudaStream_t stream);

// pooled[r, i] = mean over w in [floor(i·W / out), ceil((i + 1)·W / out)) of (Σ_h x[r, h·W + w]) / heads,
// W = x's width / heads: the heads' outputs averaged, then adaptively average-pooled to `out`
// values (the sums sequential, each divided once). x: F32 [R, heads·W], pooled: F32 [R, out <= W],
// contiguous device tensors.
Status heads_mean_pool(const TensorView& x, int64_t heads, const TensorView& pooled, cudaStream_t stream);

// gate = gelu_tanh(gate) · value: the GELU in double from the stored value, rounded to fp32 (as
// cpu::gelu), then the fp32 product. gate, value: contiguous F32 device tensors of one shape.
Status gelu_tanh_gate(const TensorView& gate, const TensorView& value, cudaStream_t stream);

// x[r, c] = (x[r, c] - mean[c]) / std[c], in place; x a contiguous F32 device tensor [R, C]; mean,
// std: F32 device arrays [C].
Status normalize_channels(const TensorView& x, const float* mean, const float* std, cudaStream_t stream);

}  // namespace vortex::cuda
