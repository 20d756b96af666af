// The Qwen3-VL vision tower: an image's pixels in, the features that stand in for its
// `<|image_pad|>` tokens out, plus the DeepStack features the language model adds to those rows
// after its first decoder layers (qwen3_text_encoder.h). One image at a time: the reference
// attends within each image only, so a batch of images is the same work image by image.
//
// The image processor (Qwen2VLImageProcessor, torchvision backend) first: the image is brought to
// the size the processor's smart_resize asks for (sides multiples of patch · merge, area in
// [min_pixels, max_pixels]) by the processor's resize, torchvision's bicubic antialiased resize on
// the 8-bit pixels (cpu::resize_bicubic_rgb8, bit for bit); H3's keyframe canvas already has that
// size with the released settings. Then pixels (x − mean/rescale) / (std/rescale) in fp32, cut
// into patch · patch squares in merge × merge blocks (block-major: the blocks in raster order, the
// patches of a block in raster order), each flattened as (channel, time, y, x) with the image
// repeated over the temporal patch.
//
// The tower (bf16, rounding where the reference rounds):
//   x = R(patches · Wpatch + b) + R(pos)            pos: the learned side × side grid, bilinearly
//                                                   resampled to the patch grid (align_corners)
//   per block:  x = R(x + proj(attn(rope(q), rope(k), v))),   q, k, v = qkv(LN1(x))
//               x = R(x + fc2(gelu_tanh(fc1(LN2(x)))))
//               after the blocks named in deepstack_visual_indexes: a DeepStack merger
//   merged = fc2(gelu(fc1(view(LN(x), [P/4, 4C]))))          the main merger (norm per patch)
//   deepstack = fc2(gelu(fc1(LN(view(x, [P/4, 4C])))))       the DeepStack mergers (norm per block)
// The attention is non-causal over the image's patches, scale head_dim^-1/2, with a 2-D RoPE in
// fp32 (rotate-half over the whole head; the first half of each half's frequencies follow the patch
// row, the second the column) and its result rounded once to bf16.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::text {

constexpr float kVisionNormEps = 1e-6f;  // every LayerNorm of the tower and its mergers

struct Qwen3VisionConfig {
  int64_t depth = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t heads = 0;
  int64_t in_channels = 3;
  int64_t patch = 0;
  int64_t merge = 0;
  int64_t temporal_patch = 0;
  int64_t out_hidden = 0;
  int64_t num_position_embeddings = 0;
  int64_t position_grid_side = 0;  // sqrt(num_position_embeddings)
  std::vector<int64_t> deepstack_layers;
  double rope_theta = 10000.0;

  int64_t head_dim() const { return hidden / heads; }
  int64_t patch_values() const { return in_channels * temporal_patch * patch * patch; }
  // From a Qwen3-VL config.json's `vision_config`; errors name the field.
  static Result<Qwen3VisionConfig> from_json(const nlohmann::json& config, const std::string& where);
};

// The image processor's settings (preprocessor_config.json).
struct Qwen3ImageProcessorConfig {
  int64_t patch = 0;
  int64_t merge = 0;
  int64_t temporal_patch = 0;
  int64_t min_pixels = 0;
  int64_t max_pixels = 0;
  double rescale_factor = 1.0 / 255.0;
  std::array<double, 3> mean{0.5, 0.5, 0.5};
  std::array<double, 3> std{0.5, 0.5, 0.5};

  static Result<Qwen3ImageProcessorConfig> from_json(const nlohmann::json& config, const std::string& where);
  // smart_resize: the size the processor brings a height × width image to.
  Result<std::array<int64_t, 2>> target_size(int64_t height, int64_t width) const;
};

// The video processor's settings (video_preprocessor_config.json, Qwen3VLVideoProcessor): the
// image processor's normalisation, and a pixel budget over all of a video's sampled frames:
// smart_resize bounds round(frames / temporal_patch) · temporal_patch · h · w by [min_pixels,
// max_pixels] (the uncapped rule the pipeline's transformers runs by default).
struct Qwen3VideoProcessorConfig {
  int64_t patch = 0;
  int64_t merge = 0;
  int64_t temporal_patch = 0;
  int64_t min_pixels = 0;
  int64_t max_pixels = 0;
  double rescale_factor = 1.0 / 255.0;
  std::array<double, 3> mean{0.5, 0.5, 0.5};
  std::array<double, 3> std{0.5, 0.5, 0.5};

  static Result<Qwen3VideoProcessorConfig> from_json(const nlohmann::json& config, const std::string& where);
  Result<std::array<int64_t, 2>> target_size(int64_t frames, int64_t height, int64_t width) const;
};

// An image's patch grid (in patches) and the number of tokens it becomes.
struct VisionGrid {
  int64_t height = 0;
  int64_t width = 0;
  int64_t merge = 1;
  int64_t patches() const { return height * width; }
  int64_t tokens() const { return patches() / (merge * merge); }
};

struct VisionFeatures {
  VisionGrid grid;
  Tensor merged;                   // [tokens, out_hidden] BF16: the image-pad rows' embeddings
  std::vector<Tensor> deepstack;   // one [tokens, out_hidden] BF16 per deepstack layer, in order
};

class Qwen3VisionEncoder {
 public:
  // `model_path`: the Qwen3-VL folder (config.json with vision_config, the weights under
  // `model.visual.`); `processor_path`: preprocessor_config.json, or a folder holding it.
  static Result<Qwen3VisionEncoder> load(const std::string& model_path, const std::string& processor_path);

  // The patch grid of a height × width image: its smart_resize size in patches.
  Result<VisionGrid> grid_for(int64_t height, int64_t width) const;
  // rgb: U8 [H, W, 3]. F32 [patches, patch_values()]: the processor's pixel_values, the image
  // resized first where smart_resize changes its size.
  Result<Tensor> image_patches(const Tensor& rgb, VisionGrid* grid) const;

  // A video's vision blocks: the grid of each block of a video of `frames` sampled frames at
  // height × width (one block per temporal_patch frames, each its own attention span, as the
  // reference's per-frame cu_seqlens make it), at the frames' smart_resize size for that many
  // sampled frames; no video processor settings beside the image processor's is an error naming it.
  Result<VisionGrid> video_grid_for(int64_t frames, int64_t height, int64_t width) const;
  // frames: temporal_patch U8 [H, W, 3] of one block, in order, all of one size (the video's),
  // resized to the grid's where that differs. F32 [grid.patches(), patch_values()]: that block's
  // rows of the video processor's pixel_values_videos.
  Result<Tensor> video_block_patches(const std::vector<Tensor>& frames, const VisionGrid& grid) const;

  // The whole tower on one image's patches (F32 or BF16 [grid.patches(), patch_values()]).
  Result<VisionFeatures> encode(const Tensor& patches, const VisionGrid& grid) const;
  // rgb → image_patches → encode.
  Result<VisionFeatures> encode_image(const Tensor& rgb) const;

  // The steps, for tests and the CUDA port: the patch and position embeddings, BF16
  // [patches, hidden]; then blocks [first, last) on x in place, deepstack features appended.
  Result<Tensor> embed(const Tensor& patches, const VisionGrid& grid) const;
  Status run_blocks(Tensor& x, const VisionGrid& grid, int64_t first, int64_t last,
                    std::vector<Tensor>* deepstack) const;

  // The pieces of embed and run_blocks the CUDA port (cuda_qwen3_vision_encoder.h) shares: the
  // patches-against-grid check, the resampled position embeddings (BF16 [patches, hidden], added
  // to the patch embeddings) and the 2-D RoPE tables (F32 [patches, head_dim]).
  Status check_patches(const Tensor& patches, const VisionGrid& grid) const;
  Result<Tensor> position_rows(const VisionGrid& grid) const;
  struct RopeTables {
    Tensor cos, sin;
  };
  RopeTables rope_tables(const VisionGrid& grid) const;

  const Qwen3VisionConfig& config() const { return config_; }
  const Qwen3ImageProcessorConfig& processor() const { return processor_; }

  struct Block {
    Tensor norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b, norm2_w, norm2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  struct Merger {
    Tensor norm_w, norm_b, fc1_w, fc1_b, fc2_w, fc2_b;
    bool norm_after_shuffle = false;  // DeepStack mergers normalise the [P/4, 4C] view
  };
  const Tensor& patch_weight() const { return patch_w_; }
  const Tensor& patch_bias() const { return patch_b_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  const Merger& merger() const { return merger_; }
  const std::vector<Merger>& deepstack_mergers() const { return deepstack_mergers_; }

 private:
  Result<Tensor> merge(const Merger& merger, const Tensor& x) const;
  // From processor_config.json's nested settings or video_preprocessor_config.json beside the
  // image processor's file; when there are none (or they are unusable) videos are refused with why.
  void load_video_processor(const std::string& processor_file, const nlohmann::json& processor_json);
  // Each temporal slot t of every patch from frames[t] (resized to the grid's size where theirs
  // differs), normalised with these settings.
  Result<Tensor> frame_patches(const std::vector<Tensor>& frames, const VisionGrid& grid, double rescale_factor,
                               const std::array<double, 3>& mean, const std::array<double, 3>& std) const;

  Qwen3VisionConfig config_;
  Qwen3ImageProcessorConfig processor_;
  Qwen3VideoProcessorConfig video_processor_;
  Status video_processor_error_ = ok_status();  // why videos are refused, when they are
  Tensor patch_w_;  // [hidden, patch_values()]
  Tensor patch_b_;
  Tensor pos_embed_;  // [num_position_embeddings, hidden]
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_mergers_;
};

}  // namespace vortex::text
