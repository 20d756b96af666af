// The H3 video VAE encoder on the CPU (fp32), at parity with diffusers' AutoencoderKLMiniMaxH3
// encode path and the pipeline's keyframe conditioning (encode_vae_condition).
//
// Weights: the diffusers state dict. The encoder's tensors (`encoder.*`, `quant_conv.*`) are
// required and checked by name and shape; decoder-side tensors are accepted and ignored. The
// original checkpoint's CompVis names (encoder.down.<i>.block.<j>, nin_shortcut, downsample) load
// too, renamed as the conversion script renames them.
//
// encode_video_chunk (the reference's quant_conv(encoder(x)) for one clip or tile), on pixels
// x [3, T, H, W] (ImageNet-normalised RGB):
//   conv_in (3x3x3, reflect 1, causal 2) → per level i: layers_per_block resnets
//   (GroupNorm → SiLU → conv 3x3x3 → GroupNorm → SiLU → conv 3x3x3, plus the input, through a
//   1x1x1 conv_shortcut when the width changes) and, where the level's spatial · temporal factor
//   exceeds 1, a downsampler (reflect pad of one row / column at the bottom / right when the
//   spatial factor is 2, then a 3x3x3 conv with stride (t, s, s), causal 2, no spatial pad) →
//   GroupNorm → SiLU → conv_out (3x3x3 → 2·latent_channels) → quant_conv (1x1x1).
//   Every GroupNorm is per frame (conv3d.h). Output: moments [2·C, T', H/r, W/r], mean first.
//
// encode_video_moments (the reference's _encode): one frame goes through encode_video_clip alone
// (one latent frame); a clip is padded with copies of its last frame to a multiple of clip_length,
// each clip_length-frame clip encoded on its own (fresh causal zeros), the moments concatenated
// and the last token_drop latent frames dropped (17n + 5 frames → 5n + 2 latents in the release).
// encode_video_clip tiles space when tiling is on (the release's default): tiles of tile_height x
// tile_width pixels laid out by split_tiles, each encoded whole, the moments stitched with the
// decoder's linear blends (each tile blended with the unblended tile above and to its left over
// overlap / r latent cells, then cropped).
//
// sample_video_condition (encode_vae_condition after the encode): logvar clamped to [-30, 20],
// z = mean + exp(0.5 · logvar) · eps, rounded through fp16, then (z - latents_mean) / latents_std
// per channel. The reference draws eps from a CPU torch generator seeded 42 for every keyframe;
// the caller passes it (the pipeline its own seeded noise, tests the reference's draw).
#pragma once

#include <functional>
#include <vector>

#include "models/vae/conv3d.h"
#include "models/vae/video_vae.h"

namespace vortex::vae {

struct VideoEncoderResnet {
  Tensor norm1_weight, norm1_bias, norm2_weight, norm2_bias;  // [C_in], [C_out] fp32
  CausalConv3d conv1, conv2;
  bool has_shortcut = false;
  CausalConv3d conv_shortcut;
};

struct VideoEncoderLevel {
  std::vector<VideoEncoderResnet> resnets;
  bool has_downsampler = false;
  CausalConv3d downsampler;
};

struct VideoVaeEncoder {
  VideoVaeConfig config;
  CausalConv3d conv_in;
  std::vector<VideoEncoderLevel> levels;
  Tensor norm_out_weight, norm_out_bias;
  CausalConv3d conv_out;
  CausalConv3d quant_conv;
  // The checkpoint's encode tiling (the decode's: the reference shares one set of tile sizes).
  VideoTiling tiling;
};

// The encoder's tensors of the state dict for `config`, in module order.
std::vector<VideoVaeTensorSpec> video_vae_encoder_schema(const VideoVaeConfig& config);

Status validate_video_vae_encoder_tensors(const NamedTensors& tensors, const VideoVaeConfig& config);

Result<VideoVaeEncoder> assemble_video_vae_encoder(const NamedTensors& tensors, const VideoVaeConfig& config);

// The files load_video_vae accepts (video_vae.h), for the encoder.
Result<VideoVaeEncoder> load_video_vae_encoder(const std::string& path);

// The rule of synthetic_video_vae_tensors over the encoder's schema (conv weights scaled by
// 1/sqrt(C_in · kt · kh · kw)); tools/golden/make_video_vae_encoder_golden.py rebuilds it.
NamedTensors synthetic_video_vae_encoder_tensors(const VideoVaeConfig& config, uint64_t seed);

// Intermediates, named after the reference module that produced them, as [C, T, H, W]:
// "encoder.conv_in", "encoder.down_blocks.<i>", "encoder.conv_out", "quant_conv" for every
// encode_video_chunk call (each clip and tile, in order), and "moments" for the stitched result
// of encode_video_moments.
using VideoEncoderObserver = VideoVaeObserver;

// pixels: F32 [in_channels, T, H, W] contiguous, H and W multiples of the spatial ratio with at
// least two latent cells each (the reflect pads of the last level need them). Returns F32
// [2·latent_channels, T', H/r, W/r].
Result<Tensor> encode_video_chunk(const VideoVaeEncoder& vae, const Tensor& pixels,
                                  const VideoEncoderObserver* observer = nullptr);

// The checks encode_video_chunk makes of its pixels (invalid_argument naming the tensor).
Status check_video_encoder_pixels(const VideoVaeConfig& config, const Tensor& pixels);

// A window of a clip: rows [y0, y0 + height) and columns [x0, x0 + width) of every frame (one
// tile, or the whole clip).
struct PixelWindow {
  int64_t y0 = 0, x0 = 0, height = 0, width = 0;
};

// The windows of one clip (its tiles, or the whole clip), all of one size, each encoded on its own
// (encode_video_chunk's contract on the window's pixels) and returned in order: the CPU's cut out
// and encoded one after the other, the GPU's gathered from one upload of the clip and batched
// (cuda_video_vae_encoder.h). clip: F32 [in_channels, T, H, W] contiguous, as encode_video_chunk's.
using VideoChunkEncoder =
    std::function<Result<std::vector<Tensor>>(const Tensor& clip, const std::vector<PixelWindow>& windows)>;

// The checks a chunk encoder makes: the clip's as check_video_encoder_pixels, and the windows all
// of one size, each inside the clip, that size one the encoder takes (invalid_argument naming the
// window by its index).
Status check_video_encoder_windows(const VideoVaeConfig& config, const Tensor& clip,
                                   const std::vector<PixelWindow>& windows);

// A window's pixels, contiguous F32 [C, T, height, width]; the window must lie inside the clip.
Result<Tensor> cut_window(const Tensor& clip, const PixelWindow& window);

// encode_video_moments around any chunk encoder: the clips, the tiles and their stitching, the
// dropped latent frames; the observer sees "moments".
Result<Tensor> encode_video_moments_with(const VideoVaeConfig& config, const VideoChunkEncoder& encode_chunks,
                                         const Tensor& pixels, const VideoTiling& tiling,
                                         const VideoEncoderObserver* observer = nullptr);

// pixels as above, T = 1 or any count >= 2. Without `tiling`, the checkpoint's own.
Result<Tensor> encode_video_moments(const VideoVaeEncoder& vae, const Tensor& pixels, const VideoTiling& tiling,
                                    const VideoEncoderObserver* observer = nullptr);
Result<Tensor> encode_video_moments(const VideoVaeEncoder& vae, const Tensor& pixels);

// moments: F32 [2·C, T, h, w]; eps: F32 [C, T, h, w]. Returns the normalised latents F32
// [C, T, h, w] the transformer reads.
Result<Tensor> sample_video_condition(const VideoVaeConfig& config, const Tensor& moments, const Tensor& eps);

// RGB8 pixels [H, W, 3] (row-major, as image decoders give them) → F32 [3, 1, H, W], or frames
// [F, H, W, 3] → F32 [3, F, H, W]: (v / 255 - imagenet_mean) / imagenet_std per channel, as the
// pipeline feeds the encoder.
Result<Tensor> keyframe_pixels(const Tensor& rgb8);

}  // namespace vortex::vae
