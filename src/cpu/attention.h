// CPU reference attention: exact multi-head softmax attention, full (bidirectional) or causal.
//
// out[i, h, :] = Σ_j softmax_j(scale · q[i, h, :] · k[j, h, :]) · v[j, h, :]
// All math is fp32: scores by fp32 GEMM, row max subtracted before exp, fp32 row sums, the
// weighted sum of v by fp32 GEMM and divided by the row sum at the end; the result is rounded
// once to out's dtype. When v is BF16, the unnormalised weights P = exp(s - max) are rounded to
// bf16 before the PV product, as the reference's bf16 attention (and every flash kernel) does.
// This is the `exact` attention mode of DESIGN section 3.
//
// Work items are (head, block of kQueryBlock queries), spread by parallel_for. A thread widens
// one head's K and V to contiguous fp32 when it reaches that head, and holds one block of
// scores [kQueryBlock, Nk]: memory is O(threads · Nk · (D + kQueryBlock)), never Nq · Nk.
#pragma once

#include "cpu/gemm.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

constexpr int64_t kQueryBlock = 64;

// q, out: [Nq, H, D]; k, v: [Nk, H, D] (Nk >= 1). Each F32 or BF16, any strides on the N and H
// dims (e.g. column slices of a fused QKV output [N, 3·H·D]) and unit stride on D.
// out must not overlap k or v. The GEMM variant is that of linear (gemm.h).
Status attention(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, float scale, GemmVariant variant = default_gemm_variant());

// Causal attention with grouped keys and values (the Qwen3 text encoder's): query i sees keys
// 0 ..= i (Nq == Nk), and query head h reads key/value head h / (H / Hkv). k, v: [N, Hkv, D] with
// H a multiple of Hkv. The masked weights are exactly zero; the rest is attention()'s arithmetic.
Status causal_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, float scale, GemmVariant variant = default_gemm_variant());

}  // namespace vortex::cpu
