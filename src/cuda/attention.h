// Exact attention on the GPU (DESIGN section 3, mode `exact`): bf16 q, k, v; fp32 scores, softmax
// and accumulation; bf16 output rounded once.
//
//   out[i, h, :] = Σ_j softmax_j(scale · q[i, h, :] · k[j, h, :]) · v[j, h, :]
//
// Variants (VORTEX_VARIANT_ATTENTION=v0|v1|v2|v2-128 selects; v1 ships):
//   v0  tiled flash-style kernel on tensor cores (mma.sync bf16), online softmax in fp32,
//       P rounded to bf16 for the PV product as every flash kernel does. Head dims 64, 72 and 128 on
//       16-byte aligned rows; other head dims (<= 256) and unaligned views take the warp-per-row
//       fallback (attention_fallback.h) with the same numerics.
//   v1  (default) Hopper kernel for head dims 128 and 64 on 16-byte aligned views (attention_wgmma.h):
//       TMA producer warpgroup, two wgmma consumer warpgroups, FlashAttention-3 style, Q held in
//       registers; the same numerics. Every other case (head dim 72, odd dims, unaligned views, a driver
//       without tensor-map support) runs v0's path.
//   v2  v1 on a persistent grid (one CTA per SM looping over (query block, head) items, the next
//       item's loads under the last one's epilogue) with 176-key K/V tiles where they pad no
//       more keys than 128 (attention_wgmma_v2.h); the same numerics and the same fallback.
//   v2-128  v2 with v1's 128-key tiles everywhere: bitwise v1's output by another route (v2's
//       schedule, Q·Kᵀ from shared memory, every O rescale done). Measured 2.7% slower than v1
//       (bench/notes/attention.md); it stays as the reference the GPU test holds v1's bits to.
#pragma once

#include <cuda_runtime.h>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// q, out: [Nq, H, D]; k, v: [Nk, H, D]; all BF16 device views with unit stride in D and any
// strides on N and H (the q/k/v column slices of a fused QKV output [N, 3·H·D] are the normal case;
// out is typically a [N, H·D] buffer viewed as [N, H, D]). D <= 256. Nq, Nk >= 1, any value. The
// tensor-core kernels need D in {64, 72, 128} (v1: 128) and every pointer and N / H stride a multiple
// of 16 bytes. The variant is read from VORTEX_VARIANT_ATTENTION on every call.
// scale must be finite and > 0; otherwise invalid_argument. out must not overlap q, k, v.
Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out, float scale,
                 cudaStream_t stream);

enum class AttentionVariant { kV0, kV1, kV2, kV2Keys128 };

// The variant VORTEX_VARIANT_ATTENTION names ("v0", "v1", "v2", "v2-128"), v1 when it is unset or empty;
// unimplemented for any other value.
Result<AttentionVariant> attention_variant_from_env();

// For manifests: what the variant runs at the block's shapes (head dim 128, aligned views).
const char* attention_variant_description(AttentionVariant variant);

// attention() with the variant given instead of read from the environment (tests run every variant
// on the same inputs). `ran`, when given, receives the variant whose kernel actually ran: kV1 / kV2 /
// kV2Keys128 only when that wgmma kernel did (kV0 when it fell back).
Status attention_variant(AttentionVariant variant, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, float scale, cudaStream_t stream, AttentionVariant* ran = nullptr);

// The exact attention with its output quantized for the fp8 recipe's out projection
// (cpu/fp8_blocks.h): q [Nq, H, 128], k, v as attention(); codes F8_E4M3 [Nq, H·128] device view
// with unit column stride, pointer and row stride multiples of 2 bytes; scales contiguous F32 of
// cpu::fp8_block_scales(kTiles, Nq, H·128).shape (its padding is written 0). Each 128 queries × one
// head become e4m3 codes and one scale, bit for bit quantize_blocks_fp8 (kTiles) of the v1 kernel's
// bf16 output; no bf16 output is written. Runs the v1 kernel only: returns unimplemented, having
// launched nothing, when it does not apply (D ≠ 128, views not 16-byte aligned, no tensor-map
// encoder); the caller then runs attention() and quantize_blocks_fp8. Bad operands: invalid_argument.
Status attention_quantized_e4m3(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& codes, const TensorView& scales, float scale, cudaStream_t stream);

// Causal attention with grouped keys and values (cpu::causal_attention's contract; the text
// encoder's): q, out [N, H, D], k, v [N, Hkv, D] BF16 device views with unit stride on D and any N /
// H strides, H a multiple of Hkv, D <= 256, N >= 0; query i sees keys 0 ..= i and query head h reads
// k/v head h / (H / Hkv). Head dims 64, 72 and 128 on 16-byte aligned views run v0's tensor-core kernel
// with the causal mask (bench/notes/text_encoder.md), every other case the warp-per-row fallback;
// the same numerics as attention(). Bad operands: invalid_argument naming the operands.
Status causal_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        float scale, cudaStream_t stream);

}  // namespace vortex::cuda
