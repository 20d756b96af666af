// Data movement of the video VAE decode on the GPU (numerics: models/vae/video_vae_decode.cc):
// latent boxes gathered into token rows for one tile, and decoded tiles composed into finished
// frames — spatial blends between tiles, the temporal cross-fade between chunks, the ImageNet
// de-normalisation and the clamp — in one pass per chunk.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// tokens[n, c] = z[c, t0 + t, y0 + y, x0 + x] for n = (t·h + y)·w + x: z is an F32 [C, T, H, W]
// contiguous device tensor, tokens an F32 [frames·h·w, C] contiguous device view (h, w: the box).
// With the whole of z as the box it is the channels-first → channels-last permute, which the
// encoder's pixel upload uses too.
Status gather_latent_tokens(const TensorView& z, int64_t t0, int64_t y0, int64_t x0, int64_t h, int64_t w,
                            const TensorView& tokens, cudaStream_t stream);

// The spatial tile layout of a decode, the same for every chunk (all pixel units). Device arrays:
//   row_tile [height]: the tile row whose kept rows hold pixel row y (the last one pasted there);
//   row_start [ny]: the pixel row where tile row i is pasted; row_blend [ny]: the rows it blends
//   with the tile above (row_blend[0] = 0); likewise col_tile [width], col_start, col_blend [nx].
// Every tile is tile_h x tile_w latents of the decoder output: `channels` colour planes,
// patch_t x patch x patch pixels per latent.
struct VaeTileGrid {
  const int32_t* row_tile = nullptr;
  const int32_t* row_start = nullptr;
  const int32_t* row_blend = nullptr;
  const int32_t* col_tile = nullptr;
  const int32_t* col_start = nullptr;
  const int32_t* col_blend = nullptr;
  int ny = 0, nx = 0;
  int tile_h = 0, tile_w = 0;
  int height = 0, width = 0;
  int channels = 0, patch = 0, patch_t = 0;
};

// The decoded tiles of one temporal chunk: tile (i, j) at tiles + (i·nx + j)·T·tile_h·tile_w·pv,
// the decoder's proj_out rows [T·tile_h·tile_w, pv] (token (t, y, x) row-major, value
// ((c·patch_t + a)·patch + b)·patch + d for pixel (c, t·patch_t + a, y·patch + b, x·patch + d)),
// pv = channels·patch_t·patch².
struct VaeDecodedChunk {
  const float* tiles = nullptr;
  int64_t latent_frames = 0;  // T
};

// What one call writes: frames [out_frame, out_frame + count) of `frames` (F32 [channels, F,
// height, width] contiguous device tensor) are frames [src_frame, src_frame + count) of `chunk`,
// stitched; the first `blend` of them are cross-faded with frames [prev_frame, prev_frame + blend)
// of `prev` as blend_linear does (weight k / blend on the new chunk); every value is then
// de-normalised with the ImageNet statistics and clamped to [0, 1].
struct VaeFrameSpan {
  int64_t out_frame = 0, count = 0, src_frame = 0;
  int64_t blend = 0, prev_frame = 0;
};

Status compose_frames(const VaeTileGrid& grid, const VaeDecodedChunk& chunk, const VaeDecodedChunk* prev,
                      const VaeFrameSpan& span, const TensorView& frames, cudaStream_t stream);

}  // namespace vortex::cuda
