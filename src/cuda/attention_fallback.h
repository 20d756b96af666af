// The attention fallback for shapes the tensor-core kernel does not take (head dims other than
// 64 / 128, views not 16-byte aligned): same contract and numerics as attention.h — fp32 scores
// and online softmax (over chunks of 32 keys, one per lane), P rounded to bf16 before the PV
// product, output rounded once — one warp per (query row, head), no tensor cores. For tests and
// small models; the canonical shapes never use it. The same kernel, causal and with grouped
// key/value heads, is the text encoder's attention (prompts of tens to a few thousand tokens). With
// one key per iteration (a shuffle tree per key) eight released-width layers took 22.0 ms on a
// 512-token prompt against transformers' 14.8 ms; chunks of 32 keys take one tree per chunk.
#pragma once

#include <cuda_runtime.h>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

constexpr int64_t kFallbackMaxHeadDim = 256;

// Operands already validated by attention(): BF16 device [N, H, D] views, unit stride on D.
Status attention_fallback(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          float scale, cudaStream_t stream);

// Causal attention with grouped keys and values, cpu::causal_attention's contract: q, out
// [N, H, D], k, v [N, Hkv, D] BF16 device views (unit stride on D, any N / H strides), H a multiple
// of Hkv, D <= kFallbackMaxHeadDim; query i sees keys 0 ..= i and query head h reads k/v head
// h / (H / Hkv). The fallback's numerics (online softmax; P in bf16 for the PV product).
Status causal_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        float scale, cudaStream_t stream);

}  // namespace vortex::cuda
