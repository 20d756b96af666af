// Attention in the `int8fp8` mode on Hopper (DESIGN section 3): the numerics of the CPU reference
// cpu/attention_int8fp8.h — K smoothed by its per-head mean, int8 Q (per 64 rows) and K (per 128
// rows) with per-block scales, e4m3 V with per-(head, channel) scales, scores from exact int32
// products, online softmax in fp32 over tiles of 128 keys, P quantized as e4m3(448·P), per-tile
// P·V sums added to the running output in fp32, bf16 output rounded once. A quantized mode: its
// error against `exact` is reported by its tests; it is never the default.
//
// Two passes (both on `stream`):
//   quantize   (attention_int8fp8_quantize.cu, two launches) bf16 q, k, v → the workspace below:
//              per-head K column sums (fp64, fixed order) and V column maxima with Q's int8 rows,
//              then int8 K rows and the e4m3 Vᵀ that the fp8 tensor-core product needs (its B
//              operand must be K-major).
//   attention  (attention_int8fp8.cu) TMA producer warpgroup + three consumer warpgroups:
//              S = Q8·K8ᵀ by wgmma m64n128k32 s8 → s32, softmax, O += P8·V8 by wgmma e4m3 → f32
//              into a per-tile accumulator, in two channel halves.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernel_timeline.h"
#include "cuda/runtime.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

constexpr int kInt8Fp8HeadDim = 128;
constexpr int kInt8Fp8QBlock = 64;    // rows per Q scale (cpu::kInt8Fp8QBlock)
constexpr int kInt8Fp8KBlock = 128;   // rows per K scale and keys per softmax tile (cpu::kInt8Fp8KBlock)
constexpr int kInt8Fp8RowPad = 128;   // Nq and Nk are padded to multiples of this (zero rows)

// Where key j of a tile sits in its row of Vᵀ: keys are permuted within groups of 16 so that the
// fp32 accumulator layout of S (keys 8i + 2t, +1 in thread t of a quad) packs straight into the
// e4m3 A fragments of P·V (bytes 4t .. 4t+3 of each 16-key half of a k32 step):
// key 8a + 2t + b (a, b ∈ {0, 1}, t < 4) of a group goes to slot 4t + 2a + b.
__host__ __device__ constexpr int int8fp8_vt_slot(int key) {
  return (key & ~15) | (((key & 7) >> 1) << 2) | (((key >> 3) & 1) << 1) | (key & 1);
}

// The quantized operands in device memory (one allocation, carved up by int8fp8_workspace).
struct Int8Fp8Workspace {
  int64_t nq = 0, nk = 0, heads = 0;
  int64_t nq_pad = 0, nk_pad = 0;  // Nq, Nk rounded up to kInt8Fp8RowPad
  int chunks = 0;                  // row chunks of the K-sum / V-max pass
  int8_t* q = nullptr;             // [H, Nq_pad, 128] int8, zero past Nq
  int8_t* k = nullptr;             // [H, Nk_pad, 128] int8 of k − mean, zero past Nk
  uint8_t* vt = nullptr;           // [H, 128, Nk_pad] e4m3 of vᵀ, key j at int8fp8_vt_slot(j)
  float* q_scale = nullptr;        // [H, Nq_pad / 64]
  float* k_scale = nullptr;        // [H, Nk_pad / 128]
  float* v_scale = nullptr;        // [H, 128]
  float* k_mean = nullptr;         // [H, 128]
  double* k_partial = nullptr;     // [chunks, H, 128] column sums of K per row chunk
  float* v_partial = nullptr;      // [chunks, H, 128] column maxima of |V| per row chunk
  float* v_amax = nullptr;         // [H, 128] max |v| per column
  unsigned* stats_done = nullptr;  // [H] row chunks summed so far (the last one reduces them)
};

// Bytes int8fp8_workspace takes from an arena (every part 256-byte aligned).
size_t int8fp8_workspace_bytes(int64_t nq, int64_t nk, int64_t heads);

// Allocates a workspace for [Nq, H, 128] queries against [Nk, H, 128] keys in `arena`.
Result<Int8Fp8Workspace> int8fp8_workspace(DeviceArena& arena, int64_t nq, int64_t nk, int64_t heads);

// The quantize pass. q: [Nq, H, 128]; k, v: [Nk, H, 128]; BF16 device views with unit stride on D,
// any N / H strides (the column slices of a fused QKV buffer), every pointer and N / H stride a
// multiple of 16 bytes; shapes must match the workspace.
Status quantize_int8fp8(const TensorView& q, const TensorView& k, const TensorView& v, const Int8Fp8Workspace& ws,
                        cudaStream_t stream);

// The quantize pass without Q: K's smoothing and int8 rows, V's e4m3 Vᵀ (quantize_int8fp8 is this
// and Q's rows). k, v as quantize_int8fp8's.
Status quantize_int8fp8_kv(const TensorView& k, const TensorView& v, const Int8Fp8Workspace& ws, cudaStream_t stream);

// Q's producer fused with its quantization: from the raw rows q (the QKV projection's output, as
// quantize_int8fp8 takes it), RMSNorm over D with `weight` (F32 or BF16 [128], or null) and `eps`,
// then RoPE (cos, sin: F32 [Nq, rot], rot a multiple of 16 up to 128; both or neither), into
// ws.q and ws.q_scale: bit for bit what head_norm_rope (cuda/elementwise.h) followed by
// quantize_int8fp8 writes there. q is only read: its bf16 norm output is never written.
Status norm_rope_quantize_q_int8fp8(const TensorView& q, const TensorView* weight, float eps, const TensorView* cos,
                                    const TensorView* sin, const Int8Fp8Workspace& ws, cudaStream_t stream);

// The attention pass over a quantized workspace. out: [Nq, H, 128] BF16 device view, unit stride
// on D, pointer and N / H strides a multiple of 4 bytes; must not overlap the workspace.
// scale: the softmax scale, finite and > 0. unimplemented when the driver offers no tensor-map
// encoder (nothing launched). cluster_ctas: how many CTAs share each K / Vᵀ load by TMA multicast
// (1 or 2), or 0 for attention_int8fp8_cluster_ctas's choice; the output is the same bit for bit
// (the tests give it to hold the pair to one CTA per block).
Status attention_int8fp8_quantized(const Int8Fp8Workspace& ws, const TensorView& out, float scale,
                                   cudaStream_t stream, int cluster_ctas = 0);

// The attention pass's choice of CTAs per K / Vᵀ load: a pair for long sweeps (≥ 2^33 query-key
// pairs over all heads), where it saves power under the card's cap; one otherwise.
int attention_int8fp8_cluster_ctas(int64_t nq, int64_t nk, int64_t heads);

// The attention pass with its output quantized in the kernel for the fp8 recipe's out projection
// (cpu/fp8_blocks.h): each block of 128 queries × one head becomes e4m3 codes with one fp32 scale,
// bit for bit quantize_blocks_fp8 (cpu::Fp8BlockLayout::kTiles) applied to
// attention_int8fp8_quantized's bf16 output; no bf16 output is written. codes: F8_E4M3 [Nq, H·128]
// device view, unit column stride, pointer and row stride multiples of 2 bytes; scales: contiguous
// F32 [ceil(Nq / 128), round_up(H, 4)] (the kTiles layout; its padding is written 0). cluster_ctas:
// 0 or 2 — this output always runs in pairs of CTAs sharing each K / Vᵀ load, since a pair's
// middle scale block straddles its two 192-query CTAs; 1 is refused.
Status attention_int8fp8_quantized_e4m3(const Int8Fp8Workspace& ws, const TensorView& codes, const TensorView& scales,
                                        float scale, cudaStream_t stream, int cluster_ctas = 0);

// Both passes: out[i, h, :] ≈ Σ_j softmax_j(scale · q[i, h, :] · k[j, h, :]) · v[j, h, :] in the
// int8fp8 mode. q, k, v, out as above (D = 128, Nq, Nk >= 1). The workspace
// (int8fp8_workspace_bytes) is taken from `scratch` and handed back before returning: the arena is
// stream-ordered scratch, so later users of that memory must run on `stream` (or after it).
Status attention_int8fp8(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         float scale, DeviceArena& scratch, cudaStream_t stream);

// Diagnostics (cuda/kernel_timeline.h): the attention pass's timeline instance, arguments as
// attention_int8fp8_quantized. Its events per key tile t: the second half of (P·V)_{t−2} retired
// and P_{t−1} in place; K_t and Vᵀ_{t−1} landed; the issue slot begins; Q·K_tᵀ and the first half
// of (P·V)_{t−1} issued; S_t landed; its softmax done; the first half landed; the second half
// issued and P_t packed. The CTA is the middle query block of the middle head. Every CTA of the
// grid also records its CtaMarks (KernelTimeline::ctas). cluster_ctas as for the attention pass.
Result<KernelTimeline> attention_int8fp8_timeline(const Int8Fp8Workspace& ws, const TensorView& out, float scale,
                                                  cudaStream_t stream, int cluster_ctas = 0);

// Registers, spills and shared memory of the int8fp8 attention kernel instance for clusters of
// `cluster_ctas` (for bench manifests).
Result<KernelResources> attention_int8fp8_resources(int cluster_ctas);

}  // namespace vortex::cuda
