// Exact attention in fp32 on the GPU: the fp32 program of cpu/attention.h (fp32 q, k, v, scores,
// softmax, accumulation and output; nothing rounded to bf16), for the video VAE decoder's f32 mode,
// whose output is checked against the CPU decoder tightly, and (causal) the audio VAE encoder. The bf16 path (cuda/attention.h) is the
// fast one; this kernel runs on CUDA cores.
#pragma once

#include <cuda_runtime.h>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

constexpr int64_t kAttentionF32MaxHeadDim = 256;

// out[i, h, :] = Σ_j softmax_j(scale · q[i, h, :] · k[j, h, :]) · v[j, h, :].
// q, out: [Nq, H, D]; k, v: [Nk, H, D]; F32 device views with unit stride on D and any strides on N
// and H (column slices of a fused QKV output are the normal case). D <= kAttentionF32MaxHeadDim,
// Nq, Nk >= 1, scale finite and > 0; out must not overlap q, k or v. Otherwise invalid_argument.
Status attention_f32(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out, float scale,
                     cudaStream_t stream);

// The same over keys j <= i only (cpu::causal_attention's mask; the masked weights are exactly zero),
// for the audio VAE encoder's pre_block. Nq == Nk.
Status causal_attention_f32(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            float scale, cudaStream_t stream);

}  // namespace vortex::cuda
