// The Qwen3-VL vision tower's elementwise ops on the GPU (cuda_qwen3_vision_encoder.h), with the
// CPU program's numerics (qwen3_vision_encoder.h):
//
//   gelu:            y = R(0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))))   kTanh
//                    y = R(0.5·x·(1 + erf(x / √2)))                        kErf
//                    in double from the stored x, as cpu::gelu
//   rope_widened:    x[:D] = R(x·cos + rotate_half(x)·sin), every product and the sum in fp32,
//                    rounded once to x's bf16 (the reference widens q and k to fp32 for the RoPE)
#pragma once

#include <cuda_runtime.h>

#include "cpu/elementwise.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// x, y: BF16 [N, C] device views with unit column stride (may alias).
Status gelu(const TensorView& x, const TensorView& y, cpu::GeluApproximation approximation, cudaStream_t stream);

// In place on x: BF16 [N, H, D] device view, unit stride on D, D even; cos, sin: F32 [N, D] contiguous.
Status rope_widened(const TensorView& x, const TensorView& cos, const TensorView& sin, cudaStream_t stream);

}  // namespace vortex::cuda
