// The audio VAE's snake activations on the GPU (numerics: models/vae/activations.h): the BigVGAN
// decoder's alias-free one, fused — upsample 2x (Kaiser-sinc transposed depthwise conv), SnakeBeta,
// low-pass downsample 2x (models/vae/resample.h), the upsampled signal never in global memory — and
// the DAC encoder's plain one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

constexpr int kSnakeRatio = 2;  // up- and downsampling factor (the decoder's only one)
constexpr int kSnakeMaxTaps = 16;

// The upsampler's and the downsampler's taps (the checkpoint's `filter` buffers), kept on the host
// and passed by value with each launch.
struct SnakeFilters {
  float up[kSnakeMaxTaps] = {};
  float down[kSnakeMaxTaps] = {};
  int up_taps = 0, down_taps = 0;
};

// 2 <= taps <= kSnakeMaxTaps each; invalid_argument otherwise.
Result<SnakeFilters> make_snake_filters(const std::vector<float>& up, const std::vector<float>& down);

// Output samples of the fused activation for `length` input samples (lowpass_downsample_length of 2·length).
int64_t alias_free_snake_length(const SnakeFilters& filters, int64_t length);

// y = downsample(snake(upsample(x))) with snake(u) = u + magnitude[c] · sin(frequency[c] · u)².
// x: [B, T, C], y: [B, alias_free_snake_length(T), C], contiguous F32 device tensors (no overlap);
// frequency, magnitude: F32 device arrays [C].
Status alias_free_snake(const TensorView& x, const float* frequency, const float* magnitude,
                        const SnakeFilters& filters, const TensorView& y, cudaStream_t stream);

// y = x + magnitude[c] · sin(frequency[c] · x)², vae::apply_snake's roundings. x, y: contiguous F32
// device tensors of the same shape, channels last (x == y is in place); frequency, magnitude: F32
// device arrays of x's last dim.
Status snake(const TensorView& x, const float* frequency, const float* magnitude, const TensorView& y,
             cudaStream_t stream);

}  // namespace vortex::cuda
