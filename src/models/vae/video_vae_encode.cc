// The video VAE encoder's forward: the causal CNN on one clip or tile, spatial tiles with linear
// blends, temporal clips with the trailing latent frames dropped, and the keyframe conditioning's
// posterior sample.
#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/portable_math.h"
#include "models/vae/video_vae_encoder.h"

namespace vortex::vae {

namespace {

// [C, T, H, W] ↔ [T, H, W, C] (the encoder's ops run channels-last, conv3d.h).
Tensor to_channels_last(const Tensor& x) { return x.permute({1, 2, 3, 0})->contiguous(); }
Tensor to_channels_first(const Tensor& x) { return x.permute({3, 0, 1, 2})->contiguous(); }

struct Emitter {
  const VideoEncoderObserver* observer = nullptr;
  bool active() const { return observer != nullptr && *observer; }
  // x channels-last; the observer sees [C, T, H, W].
  void operator()(const std::string& name, const Tensor& x) const {
    if (active()) (*observer)(name, to_channels_first(x));
  }
};

Result<Tensor> resnet_forward(const VideoEncoderResnet& r, const VideoVaeConfig& c, const Tensor& x) {
  Tensor h = x.clone();
  VORTEX_RETURN_IF_ERROR(frame_group_norm(h, r.norm1_weight, r.norm1_bias, c.norm_num_groups, c.norm_eps, true));
  VORTEX_ASSIGN_OR_RETURN(h, causal_conv3d(r.conv1, h));
  VORTEX_RETURN_IF_ERROR(frame_group_norm(h, r.norm2_weight, r.norm2_bias, c.norm_num_groups, c.norm_eps, true));
  VORTEX_ASSIGN_OR_RETURN(h, causal_conv3d(r.conv2, h));
  Tensor residual = x;
  if (r.has_shortcut) {
    VORTEX_ASSIGN_OR_RETURN(residual, causal_conv3d(r.conv_shortcut, x));
  }
  float* hd = h.data_as<float>();
  const float* rd = residual.data_as<const float>();
  parallel_for(0, h.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) hd[i] = rd[i] + hd[i];
  }, 1 << 14);
  return h;
}

// A height or width the encoder takes: a multiple of the spatial ratio with at least two latent
// cells (the reflect pads of the last level need them). "" when it does, else why not.
std::string extent_problem(int64_t n, int64_t r, const char* which) {
  if (n % r == 0 && n >= 2 * r) return "";
  return std::string(which) + " " + std::to_string(n) + " must be a multiple of " + std::to_string(r) +
         " and at least " + std::to_string(2 * r);
}

std::string describe_window(const PixelWindow& w) {
  return "(rows " + std::to_string(w.y0) + " + " + std::to_string(w.height) + ", columns " + std::to_string(w.x0) +
         " + " + std::to_string(w.width) + ")";
}

bool inside(const PixelWindow& w, const Tensor& clip) {
  return clip.rank() == 4 && w.y0 >= 0 && w.x0 >= 0 && w.height >= 1 && w.width >= 1 &&
         w.y0 + w.height <= clip.size(2) && w.x0 + w.width <= clip.size(3);
}

}  // namespace

Status check_video_encoder_pixels(const VideoVaeConfig& c, const Tensor& pixels) {
  if (!pixels.defined() || pixels.dtype() != DType::kF32 || pixels.rank() != 4 || !pixels.is_contiguous() ||
      pixels.device() != Device::kCpu) {
    return invalid_argument("video VAE encode: pixels " + (pixels.defined() ? pixels.describe() : "(undefined)") +
                            " must be a contiguous F32 CPU tensor [" + std::to_string(c.in_channels) + ", T, H, W]");
  }
  if (pixels.size(0) != c.in_channels) {
    return invalid_argument("video VAE encode: pixels " + pixels.describe() + " have " +
                            std::to_string(pixels.size(0)) + " channels, the encoder reads " +
                            std::to_string(c.in_channels));
  }
  if (pixels.size(1) < 1) return invalid_argument("video VAE encode: pixels " + pixels.describe() + " hold no frame");
  for (int d : {2, 3}) {
    const std::string problem = extent_problem(pixels.size(d), c.spatial_ratio(), d == 2 ? "height" : "width");
    if (!problem.empty()) return invalid_argument("video VAE encode: pixels " + pixels.describe() + ": " + problem);
  }
  return ok_status();
}

Status check_video_encoder_windows(const VideoVaeConfig& c, const Tensor& clip,
                                   const std::vector<PixelWindow>& windows) {
  VORTEX_RETURN_IF_ERROR(check_video_encoder_pixels(c, clip));
  const int64_t r = c.spatial_ratio();
  for (size_t k = 0; k < windows.size(); ++k) {
    const PixelWindow& w = windows[k];
    const std::string name = "video VAE encode: window " + std::to_string(k) + " " + describe_window(w);
    if (!inside(w, clip)) return invalid_argument(name + " is not inside the pixels " + clip.describe());
    if (w.height != windows[0].height || w.width != windows[0].width) {
      return invalid_argument(name + " differs in size from window 0");
    }
    for (const std::string& problem : {extent_problem(w.height, r, "height"), extent_problem(w.width, r, "width")}) {
      if (!problem.empty()) return invalid_argument(name + ": " + problem);
    }
  }
  return ok_status();
}

Result<Tensor> cut_window(const Tensor& clip, const PixelWindow& w) {
  if (!inside(w, clip)) {
    return invalid_argument("video VAE encode: a window " + describe_window(w) + " is not inside the pixels " +
                            clip.describe());
  }
  if (w.y0 == 0 && w.x0 == 0 && w.height == clip.size(2) && w.width == clip.size(3)) return clip;
  VORTEX_ASSIGN_OR_RETURN(Tensor rows, clip.slice(2, w.y0, w.y0 + w.height));
  VORTEX_ASSIGN_OR_RETURN(Tensor window, rows.slice(3, w.x0, w.x0 + w.width));
  return window.contiguous();
}

namespace {

// One temporal clip: whole, or tiled and stitched.
Result<Tensor> encode_clip(const VideoVaeConfig& c, const VideoChunkEncoder& encode_chunks, const Tensor& pixels,
                           const VideoTiling& tiling) {
  const int64_t r = c.spatial_ratio();
  const int64_t height = pixels.size(2), width = pixels.size(3);
  if (!tiling.enabled) {
    VORTEX_ASSIGN_OR_RETURN(std::vector<Tensor> whole, encode_chunks(pixels, {PixelWindow{0, 0, height, width}}));
    if (whole.size() != 1) return internal_error("video VAE encode: one chunk in, " + std::to_string(whole.size()) + " out");
    return whole[0];
  }
  const TileSplit ys = split_tiles(height, tiling.tile_height, tiling.min_overlap_height, r);
  const TileSplit xs = split_tiles(width, tiling.tile_width, tiling.min_overlap_width, r);
  std::vector<PixelWindow> windows;
  for (const int64_t y0 : ys.starts) {
    for (const int64_t x0 : xs.starts) windows.push_back({y0, x0, ys.tile, xs.tile});
  }
  VORTEX_ASSIGN_OR_RETURN(std::vector<Tensor> moments, encode_chunks(pixels, windows));
  if (moments.size() != windows.size()) {
    return internal_error("video VAE encode: " + std::to_string(windows.size()) + " tiles in, " +
                          std::to_string(moments.size()) + " out");
  }
  std::vector<std::vector<Tensor>> tiles(ys.starts.size());
  for (size_t k = 0; k < moments.size(); ++k) tiles[k / xs.starts.size()].push_back(std::move(moments[k]));
  return stitch_tiles(tiles, ys, xs, r, height / r, width / r);
}

}  // namespace

Result<Tensor> encode_video_chunk(const VideoVaeEncoder& vae, const Tensor& pixels,
                                  const VideoEncoderObserver* observer) {
  const VideoVaeConfig& c = vae.config;
  VORTEX_RETURN_IF_ERROR(check_video_encoder_pixels(c, pixels));
  const Emitter emit{observer};
  VORTEX_ASSIGN_OR_RETURN(Tensor x, causal_conv3d(vae.conv_in, to_channels_last(pixels)));
  emit("encoder.conv_in", x);
  for (size_t i = 0; i < vae.levels.size(); ++i) {
    const VideoEncoderLevel& level = vae.levels[i];
    for (const VideoEncoderResnet& r : level.resnets) {
      VORTEX_ASSIGN_OR_RETURN(x, resnet_forward(r, c, x));
    }
    if (level.has_downsampler) {
      VORTEX_ASSIGN_OR_RETURN(x, causal_conv3d(level.downsampler, x));
    }
    emit("encoder.down_blocks." + std::to_string(i), x);
  }
  VORTEX_RETURN_IF_ERROR(frame_group_norm(x, vae.norm_out_weight, vae.norm_out_bias, c.norm_num_groups, c.norm_eps, true));
  VORTEX_ASSIGN_OR_RETURN(x, causal_conv3d(vae.conv_out, x));
  emit("encoder.conv_out", x);
  VORTEX_ASSIGN_OR_RETURN(x, causal_conv3d(vae.quant_conv, x));
  emit("quant_conv", x);
  return to_channels_first(x);
}

Result<Tensor> encode_video_moments_with(const VideoVaeConfig& c, const VideoChunkEncoder& encode_chunks,
                                         const Tensor& pixels, const VideoTiling& tiling,
                                         const VideoEncoderObserver* observer) {
  VORTEX_RETURN_IF_ERROR(check_video_encoder_pixels(c, pixels));
  if (tiling.enabled) VORTEX_RETURN_IF_ERROR(validate_tiling(tiling, c.spatial_ratio()));
  const Emitter emit{observer};
  const int64_t T = pixels.size(1), L = c.clip_length;
  if (T == 1) {
    VORTEX_ASSIGN_OR_RETURN(Tensor moments, encode_clip(c, encode_chunks, pixels, tiling));
    if (emit.active()) (*observer)("moments", moments);
    return moments;
  }
  // Copies of the last frame up to whole clips; each clip encoded on its own.
  const int64_t clips = (T + L - 1) / L, C = pixels.size(0), plane = pixels.size(2) * pixels.size(3);
  std::vector<Tensor> parts;
  // Exactly one clip's frames are encoded as they are; otherwise each clip is copied into one
  // buffer that every clip reuses (encode_clip is done with its pixels on return): fresh pages cost
  // more than the copy (a 768 x 1344 clip's 210 MB took 0.8-1.3 s into new memory on a two-core
  // host, 13-16 ms into memory written before, one plane a task).
  Tensor clip = T == L ? pixels : Tensor::empty({C, L, pixels.size(2), pixels.size(3)}, DType::kF32);
  for (int64_t k = 0; k < clips; ++k) {
    if (T != L) {
      const float* s = pixels.data_as<const float>();
      float* d = clip.data_as<float>();
      parallel_for(
          0, C * L,
          [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
              const int64_t ch = i / L, src = std::min(k * L + i % L, T - 1);
              std::memcpy(d + i * plane, s + (ch * T + src) * plane, static_cast<size_t>(plane) * sizeof(float));
            }
          },
          1);
    }
    VORTEX_ASSIGN_OR_RETURN(Tensor moments, encode_clip(c, encode_chunks, clip, tiling));
    parts.push_back(std::move(moments));
  }
  const int64_t per_clip = parts[0].size(1), total = per_clip * clips, kept = total - c.token_drop;
  if (kept < 1) {
    return invalid_argument("video VAE encode: " + std::to_string(T) + " frames give " + std::to_string(total) +
                            " latent frames, no more than token_drop (" + std::to_string(c.token_drop) + ")");
  }
  const int64_t M = parts[0].size(0), cells = parts[0].size(2) * parts[0].size(3);
  Tensor out = Tensor::empty({M, kept, parts[0].size(2), parts[0].size(3)}, DType::kF32);
  float* d = out.data_as<float>();
  for (int64_t ch = 0; ch < M; ++ch) {
    for (int64_t f = 0; f < kept; ++f) {
      const float* s = parts[f / per_clip].data_as<const float>() + (ch * per_clip + f % per_clip) * cells;
      std::memcpy(d + (ch * kept + f) * cells, s, static_cast<size_t>(cells) * sizeof(float));
    }
  }
  if (emit.active()) (*observer)("moments", out);
  return out;
}

Result<Tensor> encode_video_moments(const VideoVaeEncoder& vae, const Tensor& pixels, const VideoTiling& tiling,
                                    const VideoEncoderObserver* observer) {
  const VideoChunkEncoder one_by_one = [&](const Tensor& clip,
                                           const std::vector<PixelWindow>& windows) -> Result<std::vector<Tensor>> {
    VORTEX_RETURN_IF_ERROR(check_video_encoder_windows(vae.config, clip, windows));
    std::vector<Tensor> out;
    for (const PixelWindow& window : windows) {
      VORTEX_ASSIGN_OR_RETURN(const Tensor pixels, cut_window(clip, window));
      VORTEX_ASSIGN_OR_RETURN(Tensor moments, encode_video_chunk(vae, pixels, observer));
      out.push_back(std::move(moments));
    }
    return out;
  };
  return encode_video_moments_with(vae.config, one_by_one, pixels, tiling, observer);
}

Result<Tensor> encode_video_moments(const VideoVaeEncoder& vae, const Tensor& pixels) {
  return encode_video_moments(vae, pixels, vae.tiling);
}

Result<Tensor> sample_video_condition(const VideoVaeConfig& c, const Tensor& moments, const Tensor& eps) {
  VORTEX_RETURN_IF_ERROR(c.validate());
  const int64_t C = c.latent_channels;
  if (!moments.defined() || moments.dtype() != DType::kF32 || moments.rank() != 4 || !moments.is_contiguous() ||
      moments.size(0) != 2 * C) {
    return invalid_argument("video condition: moments " + (moments.defined() ? moments.describe() : "(undefined)") +
                            " must be contiguous F32 [" + std::to_string(2 * C) + ", T, h, w]");
  }
  const Shape latent_shape{C, moments.size(1), moments.size(2), moments.size(3)};
  if (!eps.defined() || eps.dtype() != DType::kF32 || !eps.is_contiguous() || eps.shape() != latent_shape) {
    return invalid_argument("video condition: eps " + (eps.defined() ? eps.describe() : "(undefined)") +
                            " must be contiguous F32 " + latent_shape.to_string());
  }
  const int64_t cells = latent_shape[1] * latent_shape[2] * latent_shape[3];
  Tensor out = Tensor::empty(latent_shape, DType::kF32);
  const float* m = moments.data_as<const float>();
  const float* e = eps.data_as<const float>();
  float* o = out.data_as<float>();
  for (int64_t ch = 0; ch < C; ++ch) {
    const float mean = c.latents_mean[ch], std = c.latents_std[ch];
    for (int64_t i = 0; i < cells; ++i) {
      const float logvar = std::clamp(m[(C + ch) * cells + i], -30.0f, 20.0f);
      const float sigma = portable_expf(0.5f * logvar);
      const float z = f16_bits_to_f32(f32_to_f16_bits(m[ch * cells + i] + sigma * e[ch * cells + i]));
      o[ch * cells + i] = (z - mean) / std;
    }
  }
  return out;
}

Result<Tensor> keyframe_pixels(const Tensor& rgb8) {
  const bool frames = rgb8.defined() && rgb8.rank() == 4;
  if (!rgb8.defined() || rgb8.dtype() != DType::kU8 || (rgb8.rank() != 3 && !frames) ||
      rgb8.size(rgb8.rank() - 1) != 3 || !rgb8.is_contiguous()) {
    return invalid_argument("keyframe: pixels " + (rgb8.defined() ? rgb8.describe() : "(undefined)") +
                            " must be contiguous U8 [H, W, 3] or [F, H, W, 3] (RGB)");
  }
  const int64_t F = frames ? rgb8.size(0) : 1;
  const int64_t H = rgb8.size(frames ? 1 : 0), W = rgb8.size(frames ? 2 : 1), P = F * H * W;
  Tensor out = Tensor::empty({3, F, H, W}, DType::kF32);
  const uint8_t* s = rgb8.data_as<const uint8_t>();
  float* d = out.data_as<float>();
  for (int64_t ch = 0; ch < 3; ++ch) {
    for (int64_t p = 0; p < P; ++p) {
      d[ch * P + p] = (static_cast<float>(s[p * 3 + ch]) / 255.0f - kImagenetMean[ch]) / kImagenetStd[ch];
    }
  }
  return out;
}

}  // namespace vortex::vae
