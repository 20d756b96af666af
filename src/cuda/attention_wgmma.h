// Exact attention, variant v1 (internal to the attention family; callers use attention.h): the
// Hopper kernel — TMA producer warpgroup, two wgmma consumer warpgroups — for head dims 128 and 64.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_timeline.h"
#include "cuda/runtime.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// Same contract and numerics as attention() (attention.h) for operands it has already validated,
// restricted to D = 128 or 64 with every pointer and N / H stride a multiple of 16 bytes (D = 64:
// the video VAE decoder's heads, which attention() sends here since 72fb8b1). Returns
// unimplemented, having launched nothing, when the driver offers no tensor-map encoder or rejects
// the views' tensor maps; the caller then runs v0. cluster_ctas: how many CTAs share each K / V
// load (1 or 2), or 0 for attention_wgmma_cluster_ctas's choice; the tests give it to hold the
// two paths bitwise equal. Anything else is invalid_argument.
Status attention_wgmma(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       float scale, cudaStream_t stream, int cluster_ctas = 0);

// How many CTAs (1 or 2) share each K / V load by TMA multicast at this size: 2 for long sweeps,
// where the power cap sets the clock and the saved L2 traffic raises it (attention_wgmma.cu).
// Either way the output is the same bits.
int attention_wgmma_cluster_ctas(int64_t nq, int64_t nk, int64_t heads);

// The same with the output quantized for the fp8 recipe's out projection (attention.h's
// attention_quantized_e4m3, which validates the operands and writes the scales' padding): codes
// [Nq, H·128] F8_E4M3, scales in cpu::Fp8BlockLayout::kTiles; D = 128 only. unimplemented and
// cluster_ctas as above.
Status attention_wgmma_quantized_e4m3(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& codes, const TensorView& scales, float scale,
                                      cudaStream_t stream, int cluster_ctas = 0);

// Diagnostics (cuda/kernel_timeline.h): the v1 kernel's timeline instance, arguments as
// attention_wgmma. Its events per key tile t: K_t and V_{t−1} landed; the issue slot begins;
// Q·K_tᵀ and P_{t−1}·V_{t−1} issued; S_t landed; the weights of each thread's first row done;
// P_{t−1}·V_{t−1} landed; the second row's weights done and P_t packed. The CTA is the middle
// query block of the middle head. Every CTA of the grid also records its CtaMarks
// (KernelTimeline::ctas). cluster_ctas as for attention_wgmma; D = 128 only.
Result<KernelTimeline> attention_wgmma_timeline(const TensorView& q, const TensorView& k, const TensorView& v,
                                                const TensorView& out, float scale, cudaStream_t stream,
                                                int cluster_ctas = 0);

// Registers, spills and shared memory of the v1 kernel instance for clusters of `cluster_ctas`
// (for bench manifests).
Result<KernelResources> attention_wgmma_resources(int cluster_ctas);

}  // namespace vortex::cuda
