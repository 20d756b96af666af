// The video VAE decode's layout kernels (contract: vae_video_layout.h):
//
//   gather_latent_tokens  tokens[n, c] = z[c, t0 + t, y0 + y, x0 + x]        (one tile's decoder input)
//   compose_frames        frame = clamp(denorm(cross_fade(stitch(tiles))))   (one chunk's finished frames)
//
// One variant each. compose_frames reads every pixel straight from the decoder's proj_out rows of
// its tile (the reference's unpatchify is only an index map), blends it with the tile above and
// the tile to its left where their overlaps reach it — each blend with the unblended neighbour,
// as the reference stitches — cross-fades it with the previous chunk's frame, de-normalises and
// clamps. Each step is the CPU decoder's fp32 operation sequence in explicitly rounded intrinsics,
// so for the same tiles the frames are bit-identical to the CPU's. Threads run along a pixel row,
// so the frame writes are coalesced; tile reads come in runs of `patch` floats.
#include "cuda/vae_video_layout.h"

#include <algorithm>
#include <string>

#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;
// The pipeline's pixel statistics (models/vae/video_vae_decode.cc).
__constant__ float kImagenetMean[3] = {0.485f, 0.456f, 0.406f};
__constant__ float kImagenetStd[3] = {0.229f, 0.224f, 0.225f};

// ---- gather_latent_tokens ------------------------------------------------------------------------

struct GatherParams {
  const float* z;  // [C, T, H, W]
  float* tokens;   // [frames·h·w, C]
  int64_t T, H, W, C;
  int64_t t0, y0, x0, h, w, n;
};

__global__ void gather_latent_tokens_kernel(GatherParams p) {
  const int64_t total = p.n * p.C;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = e / p.C, c = e % p.C;
    const int64_t t = n / (p.h * p.w), y = n / p.w % p.h, x = n % p.w;
    p.tokens[e] = p.z[((c * p.T + p.t0 + t) * p.H + p.y0 + y) * p.W + p.x0 + x];
  }
}

// ---- compose_frames ------------------------------------------------------------------------------

struct ComposeParams {
  VaeTileGrid g;
  VaeDecodedChunk cur, prev;
  VaeFrameSpan span;
  float* frames;  // [channels, F, height, width]
  int64_t total_frames;
};

// blend_linear's step k of e: a · (1 - k/e) + b · (k/e).
__device__ __forceinline__ float blend(float a, float b, int64_t k, int64_t e) {
  const float wb = __fdiv_rn(static_cast<float>(k), static_cast<float>(e));
  const float wa = __fsub_rn(1.0f, wb);
  return __fadd_rn(__fmul_rn(a, wa), __fmul_rn(b, wb));
}

// Pixel (py, px) of frame f, colour c, of tile (i, j): an index into its proj_out rows.
__device__ __forceinline__ float tile_pixel(const VaeTileGrid& g, const VaeDecodedChunk& chunk, int i, int j, int c,
                                            int64_t f, int py, int px) {
  const int p = g.patch, pt = g.patch_t;
  const int64_t pv = static_cast<int64_t>(g.channels) * pt * p * p;
  const int64_t tokens = chunk.latent_frames * g.tile_h * g.tile_w;
  const float* tile = chunk.tiles + (static_cast<int64_t>(i) * g.nx + j) * tokens * pv;
  const int64_t token = (f / pt * g.tile_h + py / p) * g.tile_w + px / p;
  return tile[token * pv + ((c * pt + f % pt) * p + py % p) * p + px % p];
}

// The stitched clip's pixel: the owning tile, blended with the unblended tile above, then with the
// unblended tile to the left (the reference's order).
__device__ float stitched(const VaeTileGrid& g, const VaeDecodedChunk& chunk, int c, int64_t f, int y, int x) {
  const int i = g.row_tile[y], j = g.col_tile[x];
  const int py = y - g.row_start[i], px = x - g.col_start[j];
  float v = tile_pixel(g, chunk, i, j, c, f, py, px);
  if (py < g.row_blend[i]) {
    const int e = g.row_blend[i];
    v = blend(tile_pixel(g, chunk, i - 1, j, c, f, g.tile_h * g.patch - e + py, px), v, py, e);
  }
  if (px < g.col_blend[j]) {
    const int e = g.col_blend[j];
    v = blend(tile_pixel(g, chunk, i, j - 1, c, f, py, g.tile_w * g.patch - e + px), v, px, e);
  }
  return v;
}

// grid.y walks (channel, frame) planes, grid.x the pixels of a plane.
__global__ void __launch_bounds__(kThreads) compose_frames_kernel(ComposeParams p) {
  const VaeTileGrid& g = p.g;
  const int64_t plane = static_cast<int64_t>(g.height) * g.width;
  for (int64_t q = blockIdx.y; q < g.channels * p.span.count; q += gridDim.y) {
    const int c = static_cast<int>(q / p.span.count);
    const int64_t k = q % p.span.count;
    float* out = p.frames + (c * p.total_frames + p.span.out_frame + k) * plane;
    for (int64_t pix = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pix < plane;
         pix += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int y = static_cast<int>(pix / g.width), x = static_cast<int>(pix % g.width);
      float v = stitched(g, p.cur, c, p.span.src_frame + k, y, x);
      if (k < p.span.blend) v = blend(stitched(g, p.prev, c, p.span.prev_frame + k, y, x), v, k, p.span.blend);
      const float scaled = __fadd_rn(__fmul_rn(v, kImagenetStd[c % 3]), kImagenetMean[c % 3]);
      // std::clamp's comparisons: NaN passes through, as on the CPU.
      out[pix] = scaled < 0.0f ? 0.0f : (1.0f < scaled ? 1.0f : scaled);
    }
  }
}

int blocks_for(int64_t work) { return static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, 132 * 8)); }

bool f32_device_contiguous(const TensorView& t) {
  return t.device == Device::kCuda && t.dtype == DType::kF32 && t.is_contiguous();
}

}  // namespace

Status gather_latent_tokens(const TensorView& z, int64_t t0, int64_t y0, int64_t x0, int64_t h, int64_t w,
                            const TensorView& tokens, cudaStream_t stream) {
  if (!f32_device_contiguous(z) || z.rank() != 4 || !f32_device_contiguous(tokens) || tokens.rank() != 2) {
    return invalid_argument("gather_latent_tokens: z must be contiguous F32 [C, T, H, W] and tokens contiguous F32 "
                            "[N, C], on the device");
  }
  const int64_t C = z.shape[0], T = z.shape[1], H = z.shape[2], W = z.shape[3];
  if (h < 1 || w < 1 || tokens.shape[1] != C || tokens.shape[0] % (h * w) != 0) {
    return invalid_argument("gather_latent_tokens: tokens " + tokens.shape.to_string() + " is not [frames·" +
                            std::to_string(h) + "·" + std::to_string(w) + ", " + std::to_string(C) + "]");
  }
  const int64_t frames = tokens.shape[0] / (h * w);
  if (t0 < 0 || y0 < 0 || x0 < 0 || t0 + frames > T || y0 + h > H || x0 + w > W) {
    return invalid_argument("gather_latent_tokens: box outside the latents " + z.shape.to_string());
  }
  if (tokens.shape[0] == 0) return ok_status();
  GatherParams p{static_cast<const float*>(z.data), static_cast<float*>(tokens.data), T, H, W, C, t0, y0, x0, h, w,
                 tokens.shape[0]};
  gather_latent_tokens_kernel<<<blocks_for(p.n * C), kThreads, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status compose_frames(const VaeTileGrid& grid, const VaeDecodedChunk& chunk, const VaeDecodedChunk* prev,
                      const VaeFrameSpan& span, const TensorView& frames, cudaStream_t stream) {
  if (!f32_device_contiguous(frames) || frames.rank() != 4 || frames.shape[0] != grid.channels ||
      frames.shape[2] != grid.height || frames.shape[3] != grid.width) {
    return invalid_argument("compose_frames: frames must be contiguous F32 [" + std::to_string(grid.channels) +
                            ", F, " + std::to_string(grid.height) + ", " + std::to_string(grid.width) +
                            "] on the device, got " + frames.shape.to_string());
  }
  const int64_t clip_frames = chunk.latent_frames * grid.patch_t;
  if (span.count < 0 || span.out_frame < 0 || span.out_frame + span.count > frames.shape[1] || span.src_frame < 0 ||
      span.src_frame + span.count > clip_frames) {
    return invalid_argument("compose_frames: frames [" + std::to_string(span.out_frame) + ", +" +
                            std::to_string(span.count) + ") from chunk frame " + std::to_string(span.src_frame) +
                            " do not fit");
  }
  if (span.blend < 0 || span.blend > span.count ||
      (span.blend > 0 && (prev == nullptr || span.prev_frame < 0 ||
                          span.prev_frame + span.blend > prev->latent_frames * grid.patch_t))) {
    return invalid_argument("compose_frames: cross-fade of " + std::to_string(span.blend) +
                            " frames without those frames in the previous chunk");
  }
  if (span.count == 0) return ok_status();
  ComposeParams p{};
  p.g = grid;
  p.cur = chunk;
  if (prev != nullptr) p.prev = *prev;
  p.span = span;
  p.frames = static_cast<float*>(frames.data);
  p.total_frames = frames.shape[1];
  const int64_t plane = static_cast<int64_t>(grid.height) * grid.width;
  const dim3 blocks(static_cast<unsigned>((plane + kThreads - 1) / kThreads),
                    static_cast<unsigned>(std::min<int64_t>(grid.channels * span.count, kMaxGridY)));
  compose_frames_kernel<<<blocks, kThreads, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
