// Pointwise ops of the audio VAE decode on the GPU that the shared elementwise family
// (cuda/elementwise.h) does not have: the mean over an upsampling stage's AMP blocks (a division,
// as the reference divides) and the waveform's final clamp.
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

}  // namespace vortex::cuda
