// The audio VAE's 1-D convolutions on the GPU (numerics: models/vae/conv1d.h), and their gather
// halves: a convolution is im2col then one fp32 GEMM (cuda/gemm.h) against the weight packed [O, K·C]; a
// transposed convolution is one fp32 GEMM Z = x · W (W packed [K·O, C]) then the overlap-add of Z
// into the output samples. Activations are time-major [B, T, C], F32, contiguous, on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

struct Conv1dGeometry {
  int64_t kernel = 1, stride = 1, dilation = 1, padding = 0;
  int64_t out_length = 0;  // T_out of conv1d_output_length
};

// col[r - row0, k·C + c] = x[b, t·stride + k·dilation - padding, c] (0 outside [0, T)) for the
// output rows r = b·T_out + t in [row0, row0 + col rows). x: [B, T, C]; col: [rows, K·C].
Status conv1d_im2col(const TensorView& x, const Conv1dGeometry& geometry, int64_t row0, const TensorView& col,
                     cudaStream_t stream);

// y[b, t, o] = (Σ over k ≡ t + padding (mod stride), ascending, of Z[b·T + (t + padding - k) / stride, k·O + o]
//              for source rows in [0, T)) + bias[o], summed from 0 in that order (conv_transpose1d's).
// z: [B·T, K·O]; bias: F32 [O] device array or null; y: [B, T_out, O].
Status conv_transpose1d_overlap_add(const TensorView& z, int64_t batch, int64_t kernel, int64_t stride,
                                    int64_t padding, const float* bias, const TensorView& y, cudaStream_t stream);

// y [B, T_out, O] = conv1d(x [B, T, C]) with the weight packed [O, K·C] and an F32 bias [O] or null:
// one GEMM when the convolution is 1x1, stride 1, unpadded; otherwise im2col into `columns` (a
// contiguous F32 device scratch of at least K·C floats; the output rows that do not fit at once
// run in row blocks) and one GEMM per block. geometry.out_length is y's T_out.
Status conv1d(GemmRunner& gemm, const TensorView& x, const Conv1dGeometry& geometry, const TensorView& weight,
              const TensorView* bias, const TensorView& columns, const TensorView& y, cudaStream_t stream);

}  // namespace vortex::cuda
