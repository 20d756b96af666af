// Exact attention, variant v2 (internal to the attention family; callers use attention.h): v1's
// Hopper kernel on a persistent grid, with 176-key K/V tiles where they pad no more keys than 128,
// or always 128-key tiles (bitwise v1).
#pragma once

#include <cuda_runtime.h>

#include "cuda/runtime.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// Same contract and numerics as attention() (attention.h) for operands it has already validated,
// restricted to D = 128 with every pointer and N / H stride a multiple of 16 bytes. Returns
// unimplemented, having launched nothing, when the driver offers no tensor-map encoder, rejects
// the views' tensor maps, or the work does not fit its int32 item count; the caller then runs v0.
// Key tiles: kFitted takes 176 keys unless that pads more keys than 128 (fewer fixed per-tile
// costs); kOfV1 always takes 128, v1's online-softmax tile boundaries, so the output is bitwise
// v1's (the same operations on the same tiles; only the CTA schedule differs).
enum class V2KeyTiles { kFitted, kOfV1 };

Status attention_wgmma_v2(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          float scale, cudaStream_t stream, V2KeyTiles tiles = V2KeyTiles::kFitted);

// The key-tile size v2 takes for nk keys (128 or 176) under `tiles`.
int attention_v2_key_tile(int64_t nk, V2KeyTiles tiles = V2KeyTiles::kFitted);

// Registers, spills and shared memory of the v2 kernel with the key tile used for `nk` keys.
Result<KernelResources> attention_v2_resources(int64_t nk, V2KeyTiles tiles = V2KeyTiles::kFitted);

}  // namespace vortex::cuda
