// The H3 video VAE decoder on the CPU (fp32), at parity with diffusers' AutoencoderKLMiniMaxH3
// decode path and the pipeline's MiniMaxH3VideoDecodeStep.
//
// Weights: the diffusers state dict. The decoder's tensors (`post_quant_conv.*`, `decoder.*`)
// are required and checked by name and shape; encoder-side tensors (`encoder.*`, `quant_conv.*`)
// are accepted and ignored. A missing or unexpected tensor or a wrong shape is a one-line error
// naming it.
//
// decode_video_chunk (the reference's decoder(post_quant_conv(z)) for one clip or tile):
//   z [C, T, H, W] → post_quant_conv (1x1x1, C → C) → tokens [T·H·W, C] (t, then h, then w)
//   → proj_in (C → dim) → append R register tokens and one all-zero token
//   → 3-axis RoPE: per axis of size S, coordinate 2·(i + 0.5)/S - 1 (registers and the zero token
//     at 0); inv_freq[k] = 1 / theta^(k · 6 / rope_dim), k < rope_dim / 6; angles 2π · coord ·
//     inv_freq concatenated (t, h, w) and duplicated, rotating the first rope_dim channels of
//     each head rotate-half style
//   → per block: x += scale1 ⊙ attn(rmsnorm1(x)); x += scale2 ⊙ ff(rmsnorm2(x)), RMSNorms with a
//     weight, attention with biased Q/K/V/out, per-head weightless RMSNorm on q and k before the
//     RoPE, softmax scale 1/sqrt(head_dim); ff = Linear(dim → 2·ffn, stored [value; gate]) →
//     value · silu(gate) → Linear(ffn → dim)
//   → LayerNorm (weight, bias) → proj_out (dim → 3 · pt · p · p) → drop registers
//   → unpatchify: pixel [c, t·pt + a, h·p + b, w·p + d] = token (t, h, w), value ((c·pt + a)·p + b)·p + d.
//
// decode_video (the pipeline after the denoise loop):
//   latents [C, T, H, W] → x · std + mean → temporal chunks of tokens_chunk_size + token_overlap
//   latents (stride tokens_chunk_size), each spatially tiled (see VideoTiling), decoded and
//   stitched with linear blends; each chunk's frames are cut after frame_pre_padding, its tail is
//   cross-faded into the next chunk over frame_overlap frames → x · imagenet_std + imagenet_mean,
//   clamped to [0, 1] → F32 [3, F, H·p, W·p], F = 17n + 5 for T = 5n + 2 in the release.
// The reference pipeline runs the decode under fp16 autocast on CUDA; this is its fp32 math.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/gemm.h"
#include "models/vae/audio_vae_config.h"
#include "models/vae/video_vae_config.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The video VAE's pixel convention (the pipeline's pixel_mean / pixel_std): the encoder reads
// (rgb - mean) / std, the decoder's output is de-normalised with x · std + mean.
inline constexpr float kImagenetMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kImagenetStd[3] = {0.229f, 0.224f, 0.225f};

// ---- schema ------------------------------------------------------------------------------------

struct VideoVaeTensorSpec {
  std::string name;  // state-dict name
  Shape shape;
};

// The decoder's tensors of the state dict for `config`, in module order.
std::vector<VideoVaeTensorSpec> video_vae_decoder_schema(const VideoVaeConfig& config);

// Checks names and shapes (see the file comment). Float dtypes only (F32, BF16, F16).
Status validate_video_vae_tensors(const NamedTensors& tensors, const VideoVaeConfig& config);

// ---- weights -----------------------------------------------------------------------------------

struct VideoLinear {
  cpu::PackedWeight weight;  // [O, I] fp32
  Tensor bias;               // [O] fp32
};

struct VideoVitBlock {
  Tensor norm1, norm2;  // [dim] fp32
  VideoLinear to_q, to_k, to_v, to_out;
  Tensor scale1, scale2;  // [dim] fp32
  VideoLinear ff_in;      // [2·ffn, dim], [value; gate]
  VideoLinear ff_out;     // [dim, ffn]
};

struct VideoVae {
  VideoVaeConfig config;
  VideoLinear post_quant_conv;  // the 1x1x1 conv as a [C, C] linear
  VideoLinear proj_in;
  Tensor register_tokens;  // [R, dim] fp32
  std::vector<VideoVitBlock> blocks;
  Tensor norm_out_weight, norm_out_bias;  // [dim] fp32
  VideoLinear proj_out;
  // The checkpoint's decode tiling: the release's unless an original wrapper config says otherwise.
  VideoTiling tiling;
};

// Builds the decoder from state-dict tensors (validated first); every weight is widened to fp32.
Result<VideoVae> assemble_video_vae(const NamedTensors& tensors, const VideoVaeConfig& config);

// Loads a decoder from a safetensors file or a folder (diffusion_pytorch_model.safetensors, its
// sharded .index.json, or model.safetensors). The config is config.json beside the file / inside the
// folder (diffusers field names), else the file's `config` metadata key. The original checkpoint's
// own configs load too (see OriginalVideoVaeConfig): `path` is then its video_vae folder (holding
// the wrapper config.json; the weights are source_path/source_safetensors_path), the source model's
// folder or a weights file in it (the wrapper is read from the folder above). Tensors in the
// original layout (decoder.x_embedder, fused per-head-interleaved attn.to_qkv, attn.to_out, ff.w1
// stored [gate; up], ff.w2, decoder.mask_token) are converted as
// scripts/convert_minimax_h3_to_diffusers.py does. Errors are one line naming the file and the
// tensor or config field.
Result<VideoVae> load_video_vae(const std::string& path);

// Deterministic pseudo-random decoder weights, reproducible bit for bit in Python
// (tools/golden/make_video_vae_golden.py) so that goldens need not carry them. For the tensor named
// n and its element e: h = splitmix64(fnv1a64(n) + seed · 0x9E3779B97F4A7C15 + e) (mod 2^64),
// v = fp32((h >> 40) / 2^23 - 1) in [-1, 1); value = v · fp32(scale) with scale 1/sqrt(fan_in) for
// matrices (post_quant_conv's fan-in is C), 0.5 for biases, register tokens, scale1 / scale2 and
// the LayerNorm bias; norm weights are 1 + 0.25 · v.
NamedTensors synthetic_video_vae_tensors(const VideoVaeConfig& config, uint64_t seed);

// ---- forward -----------------------------------------------------------------------------------

// Called with intermediates, named after the reference module that produced them:
// decode_video_chunk: "post_quant_conv" [C, T, H, W], "decoder.proj_in" [N, dim] (patch tokens
// only), "decoder.rope.cos" / "decoder.rope.sin" [N + R + 1, rope_dim], "decoder.transformer_blocks.<i>"
// [N + R + 1, dim], "decoder.norm_out", "decoder.proj_out" [N + R + 1, 3·pt·p·p], "decoder" [3, T·pt,
// H·p, W·p]. decode_video: "latents" (de-normalised), "clip.<i>" (chunk i's stitched decode),
// "decoded" (all frames before the pixel de-normalisation) and "frames". Chunk-level names are
// emitted for every chunk and tile of a decode_video, in order. Tensors are valid during the call.
using VideoVaeObserver = std::function<void(const std::string& name, const Tensor& value)>;

// z: F32 [C, T, H, W], de-normalised. Returns the decoder's output F32 [out_channels, T·pt, H·p, W·p]
// (ImageNet-normalised RGB, unclamped).
Result<Tensor> decode_video_chunk(const VideoVae& vae, const Tensor& z, const VideoVaeObserver* observer = nullptr);

// The reference's tile layout along one axis of `length` pixels: starts, and the overlap after
// each tile but the last (see the .cc for the rule).
struct TileSplit {
  std::vector<int64_t> starts;
  int64_t tile = 0;
  std::vector<int64_t> overlaps;
};
TileSplit split_tiles(int64_t length, int64_t tile_size, int64_t min_overlap, int64_t ratio);

// Building blocks, exposed for the op-level tests.
// LayerNorm over the last dim of x [N, C] (biased variance), fp32.
Result<Tensor> video_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
// The decoder's RoPE tables for a T x H x W latent grid: cos, sin [T·H·W + R + 1, rope_dim]. The GPU
// decoder reads them too: pow, cos and sin are core/portable_math.h's, not libm's.
std::pair<Tensor, Tensor> video_rope_tables(const VideoVaeConfig& config, int64_t T, int64_t H, int64_t W);
// The reference's _stitch_tiles: tiles[i][j] F32 [C, F, h, w] cut at (ys.starts[i], xs.starts[j]) of
// an axis split by split_tiles, in units `divisor` times finer than the tiles' cells (1 for decoded
// pixels, the spatial ratio for encoded latents). Each tile is blended (blend_linear) with the
// unblended tile above over ys.overlaps[i - 1] / divisor rows and with the unblended tile to its left,
// then cropped by the overlap it shares with the next tile down / right. Returns [C, F, height, width].
Result<Tensor> stitch_tiles(const std::vector<std::vector<Tensor>>& tiles, const TileSplit& ys, const TileSplit& xs,
                            int64_t divisor, int64_t height, int64_t width);
// b with its first e = min(|a|, |b|, extent) entries along `dim` replaced by
// a[-e + k] · (1 - k/e) + b[k] · (k/e); a and b contiguous F32 of equal shape but along `dim`.
Result<Tensor> blend_linear(const Tensor& a, const Tensor& b, int64_t extent, int dim);

// ---- input checks, shared by every decoder of these latents (CPU and CUDA) ---------------------
// Errors are invalid_argument "<name>: ...", naming the dim or element at fault, so that a caller
// can check a request before spending any time on it.

// [latent_channels, T, H, W] with T a count the reference decodes without padding (5n + 2,
// n >= 1, in the release) and H, W >= 1.
Status check_video_latent_shape(const VideoVaeConfig& config, const Shape& shape,
                                const std::string& name = "video latents");

// The shape as above, an F32, BF16 or F16 CPU tensor, and every value finite: the first NaN or
// infinity is named by its element [c, t, h, w] and latent frame.
Status validate_video_latents(const VideoVaeConfig& config, const Tensor& latents,
                              const std::string& name = "video latents");

// Whether the soundtrack decoded from `audio_latent_frames` latents fits the picture decoded from
// `video_latent_frames` latents at `fps`: the MP4 writer's rule (the lengths agree within one
// video frame), checked before either decoder runs.
Status check_soundtrack_length(const VideoVaeConfig& video, int64_t video_latent_frames, const AudioVaeConfig& audio,
                               int64_t audio_latent_frames, int fps);

// latents: [C, T, H, W] (F32, BF16 or F16), normalised as the transformer produces them; checked
// with validate_video_latents first. Returns F32 [3, F, H·p, W·p] in [0, 1]. Without `tiling`,
// the checkpoint's own (vae.tiling).
Result<Tensor> decode_video(const VideoVae& vae, const Tensor& latents, const VideoTiling& tiling,
                            const VideoVaeObserver* observer = nullptr);
Result<Tensor> decode_video(const VideoVae& vae, const Tensor& latents);

// ---- host memory of a decode -------------------------------------------------------------------

// Host bytes alive at the peak of decode_video (no observer), by what holds them.
struct VideoVaeCpuMemory {
  size_t weights = 0;  // the assembled decoder: every weight in fp32
  size_t latents = 0;  // the de-normalised fp32 latents, the current chunk's and tile's slices
  size_t frames = 0;   // finished chunk frames, the cross-fade tail, the concatenated output
  size_t clip = 0;     // the current chunk's decoded tiles, its stitched clip, cuts and blends
  size_t tile = 0;     // one tile's transformer activations (residual stream, q/k/v, FFN hidden)
  size_t scratch = 0;  // per-thread attention scratch (K, V of one head, one query block's scores)
  std::string peak;    // the step of the decode where the peak falls
  size_t total() const { return weights + latents + frames + clip + tile + scratch; }
};

// The peak of decoding latents of `latent_shape` ([C, T, H, W]) with `tiling` on `threads`
// threads (core/parallel.h's num_threads() for this process), found by replaying decode_video's
// allocations and frees in order (video_vae_memory.cc), for latents of any float dtype. Counted:
// every tensor and per-thread vector the decode holds, at its exact size. Not counted: the
// caller's latents, per-row vectors of a few KB, and what the allocator keeps of freed buffers
// (glibc's heap can hold on to a chunk's decoded tiles: README.md has the canonical figure). The
// same checks as a decode (invalid_argument naming the field).
Result<VideoVaeCpuMemory> video_vae_cpu_memory(const VideoVaeConfig& config, const Shape& latent_shape,
                                               const VideoTiling& tiling, int threads);

}  // namespace vortex::vae
