// The attention fallback for shapes the tensor-core kernel does not take (head dims other than
// 64 / 128, views not 16-byte aligned): same contract and numerics as attention.h — fp32 scores
// and online softmax (over chunks of 32 keys, one per lane), P rounded to bf16 before the PV
// product, output rounded once — one warp per (query row, head), no tensor cores. For tests and
// small models; the canonical shapes never use it. The same kernel, causal and with grouped
// key/value heads, is the text encoder's attention where v0 does not apply.
#pragma once

#include <cuda_runtime.h>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

constexpr int64_t kFallbackMaxHeadDim = 256;

// Operands already validated by attention(): BF16 device [N, H, D] views, unit stride on D.
Status attention_fallback(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          float scale, cudaStream_t stream);

// cuda::causal_attention (attention.h) on the fallback's kernel, operands already validated there:
// the path for head dims other than 64 / 128 and views not 16-byte aligned.
Status causal_attention_fallback(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                 float scale, cudaStream_t stream);

}  // namespace vortex::cuda
