// The video VAE's full decode: latent de-normalisation, temporal chunks with cross-fades, spatial
// tiles with linear blends (the reference's layout), ImageNet de-normalisation and the clamp.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/parallel.h"
#include "models/vae/video_vae.h"

namespace vortex::vae {

namespace {

struct Emitter {
  const VideoVaeObserver* observer = nullptr;
  void operator()(const std::string& name, const Tensor& value) const {
    if (observer != nullptr && *observer) (*observer)(name, value);
  }
};

// Copies src [C, F, h, w] into dst [C, F, H, W] at (row, col), keeping the first `rows` x `cols`.
void paste(const Tensor& src, int64_t rows, int64_t cols, Tensor& dst, int64_t row, int64_t col) {
  const int64_t CF = src.size(0) * src.size(1), sh = src.size(2), sw = src.size(3);
  const int64_t DH = dst.size(2), DW = dst.size(3);
  const float* s = src.data_as<const float>();
  float* d = dst.data_as<float>();
  parallel_for(0, CF, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t r = 0; r < rows; ++r) std::copy_n(s + (p * sh + r) * sw, cols, d + (p * DH + row + r) * DW + col);
    }
  });
}

Result<Tensor> concat_frames(const std::vector<Tensor>& parts) {
  int64_t frames = 0;
  for (const Tensor& t : parts) frames += t.size(1);
  const int64_t C = parts[0].size(0), H = parts[0].size(2), W = parts[0].size(3), plane = H * W;
  Tensor out = Tensor::empty({C, frames, H, W}, DType::kF32);
  float* d = out.data_as<float>();
  int64_t f0 = 0;
  for (const Tensor& t : parts) {
    const int64_t F = t.size(1);
    const float* s = t.data_as<const float>();
    for (int64_t ch = 0; ch < C; ++ch) std::copy_n(s + ch * F * plane, F * plane, d + (ch * frames + f0) * plane);
    f0 += F;
  }
  return out;
}

Result<Tensor> slice_copy(const Tensor& t, int dim, int64_t start, int64_t end) {
  end = std::min(end, t.size(dim));
  start = std::min(start, end);
  VORTEX_ASSIGN_OR_RETURN(Tensor s, t.slice(dim, start, end));
  return s.contiguous();
}

// The reference's decode of one temporal clip: whole, or tiled and stitched.
Result<Tensor> decode_clip(const VideoVae& vae, const Tensor& z, const VideoTiling& tiling,
                           const VideoVaeObserver* observer) {
  const int64_t r = vae.config.spatial_ratio();
  const int64_t height = z.size(2) * r, width = z.size(3) * r;
  if (!tiling.enabled) return decode_video_chunk(vae, z, observer);
  const TileSplit ys = split_tiles(height, tiling.tile_height, tiling.min_overlap_height, r);
  const TileSplit xs = split_tiles(width, tiling.tile_width, tiling.min_overlap_width, r);
  std::vector<std::vector<Tensor>> tiles(ys.starts.size());
  for (size_t i = 0; i < ys.starts.size(); ++i) {
    for (size_t j = 0; j < xs.starts.size(); ++j) {
      VORTEX_ASSIGN_OR_RETURN(Tensor rows, slice_copy(z, 2, ys.starts[i] / r, ys.starts[i] / r + ys.tile / r));
      VORTEX_ASSIGN_OR_RETURN(Tensor tile, slice_copy(rows, 3, xs.starts[j] / r, xs.starts[j] / r + xs.tile / r));
      VORTEX_ASSIGN_OR_RETURN(Tensor decoded, decode_video_chunk(vae, tile, observer));
      tiles[i].push_back(std::move(decoded));
    }
  }
  return stitch_tiles(tiles, ys, xs, 1, height, width);
}

}  // namespace

TileSplit split_tiles(int64_t length, int64_t tile_size, int64_t min_overlap, int64_t ratio) {
  TileSplit s;
  if (tile_size >= length) {
    s.starts = {0};
    s.tile = length;
    return s;
  }
  int64_t n = (length + tile_size - 1) / tile_size;
  while (tile_size * n - min_overlap * (n - 1) - length < 0) ++n;
  s.tile = tile_size;
  s.overlaps.assign(static_cast<size_t>(n - 1), min_overlap);
  const int64_t slack = tile_size * n - min_overlap * (n - 1) - length;
  // The slack widens the overlaps round-robin, one latent (ratio pixels) at a time.
  for (int64_t i = 0; i < slack / ratio; ++i) s.overlaps[static_cast<size_t>(i % (n - 1))] += ratio;
  s.starts = {0};
  for (int64_t i = 0; i + 1 < n; ++i) s.starts.push_back(s.starts.back() + tile_size - s.overlaps[i]);
  return s;
}

Result<Tensor> stitch_tiles(const std::vector<std::vector<Tensor>>& tiles, const TileSplit& ys, const TileSplit& xs,
                            int64_t divisor, int64_t height, int64_t width) {
  if (tiles.size() == 1 && tiles[0].size() == 1) return tiles[0][0];
  const Tensor& first = tiles[0][0];
  Tensor out = Tensor::empty({first.size(0), first.size(1), height, width}, DType::kF32);
  // Each tile is blended with the unblended tile above and the unblended tile to its left, then
  // loses the overlap it shares with the next tile down / right.
  for (size_t i = 0; i < tiles.size(); ++i) {
    for (size_t j = 0; j < tiles[i].size(); ++j) {
      Tensor tile = tiles[i][j];
      if (i > 0) {
        VORTEX_ASSIGN_OR_RETURN(tile, blend_linear(tiles[i - 1][j], tile, ys.overlaps[i - 1] / divisor, 2));
      }
      if (j > 0) {
        VORTEX_ASSIGN_OR_RETURN(tile, blend_linear(tiles[i][j - 1], tile, xs.overlaps[j - 1] / divisor, 3));
      }
      const int64_t rows = tile.size(2) - (i + 1 < tiles.size() ? ys.overlaps[i] / divisor : 0);
      const int64_t cols = tile.size(3) - (j + 1 < tiles[i].size() ? xs.overlaps[j] / divisor : 0);
      paste(tile, rows, cols, out, ys.starts[i] / divisor, xs.starts[j] / divisor);
    }
  }
  return out;
}

Result<Tensor> blend_linear(const Tensor& a, const Tensor& b, int64_t extent, int dim) {
  if (a.rank() != b.rank() || dim < 0 || dim >= a.rank()) return invalid_argument("blend: rank mismatch");
  for (int d = 0; d < a.rank(); ++d) {
    if (d != dim && a.size(d) != b.size(d)) {
      return invalid_argument("blend: " + a.describe() + " and " + b.describe() + " differ off the blend dim");
    }
  }
  const int64_t e = std::min({a.size(dim), b.size(dim), extent});
  Tensor out = b.clone();
  if (e <= 0) return out;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= a.size(d);
  for (int d = dim + 1; d < a.rank(); ++d) inner *= a.size(d);
  const int64_t la = a.size(dim), lb = b.size(dim);
  const float* ad = a.data_as<const float>();
  const float* bd = b.data_as<const float>();
  float* od = out.data_as<float>();
  parallel_for(0, outer * e, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t o = p / e, k = p % e;
      const float wb = static_cast<float>(k) / static_cast<float>(e);
      const float wa = 1.0f - wb;
      const float* ar = ad + (o * la + la - e + k) * inner;
      const float* br = bd + (o * lb + k) * inner;
      float* orow = od + (o * lb + k) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        const float x = ar[i] * wa, y = br[i] * wb;
        orow[i] = x + y;
      }
    }
  });
  return out;
}

Status check_video_latent_shape(const VideoVaeConfig& c, const Shape& shape, const std::string& name) {
  if (shape.rank() != 4) {
    return invalid_argument(name + ": shape " + shape.to_string() + " must be [C, T, H, W] = [" +
                            std::to_string(c.latent_channels) + ", frames, height / " +
                            std::to_string(c.spatial_ratio()) + ", width / " + std::to_string(c.spatial_ratio()) + "]");
  }
  if (shape[0] != c.latent_channels) {
    return invalid_argument(name + ": shape " + shape.to_string() + " has " + std::to_string(shape[0]) +
                            " channels (dim 0) but the video VAE has " + std::to_string(c.latent_channels));
  }
  if (c.decoded_frames(shape[1]) < 0) {
    const int chunk = c.tokens_chunk_size();
    return invalid_argument(name + ": shape " + shape.to_string() + " has frames " + std::to_string(shape[1]) +
                            " (dim 1), not " + std::to_string(chunk) + "n + " +
                            std::to_string(chunk - c.token_drop % chunk) + " with n >= 1");
  }
  if (shape[2] < 1 || shape[3] < 1) {
    return invalid_argument(name + ": shape " + shape.to_string() + " has an empty height or width (dims 2, 3)");
  }
  return ok_status();
}

Status validate_video_latents(const VideoVaeConfig& c, const Tensor& latents, const std::string& name) {
  if (!latents.defined()) return invalid_argument(name + ": undefined tensor");
  if (latents.device() != Device::kCpu || !dtype_is_float(latents.dtype()) || latents.dtype() == DType::kF64) {
    return invalid_argument(name + ": " + latents.describe() + " must be an F32, BF16 or F16 CPU tensor");
  }
  VORTEX_RETURN_IF_ERROR(check_video_latent_shape(c, latents.shape(), name));
  const Tensor x = latents.dtype() == DType::kF32 ? latents.contiguous() : latents.contiguous().to(DType::kF32).value();
  const int64_t T = x.size(1), H = x.size(2), W = x.size(3);
  const float* d = x.data_as<const float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (!std::isfinite(d[i])) {
      const int64_t t = i / (H * W) % T;
      return invalid_argument(name + ": non-finite value " + std::to_string(d[i]) + " at [" +
                              std::to_string(i / (T * H * W)) + ", " + std::to_string(t) + ", " +
                              std::to_string(i / W % H) + ", " + std::to_string(i % W) + "] (latent frame " +
                              std::to_string(t) + " of " + std::to_string(T) + ")");
    }
  }
  return ok_status();
}

Status check_soundtrack_length(const VideoVaeConfig& video, int64_t video_latent_frames, const AudioVaeConfig& audio,
                               int64_t audio_latent_frames, int fps) {
  const int64_t frames = video.decoded_frames(video_latent_frames);
  const int64_t samples = audio.decoded_samples(audio_latent_frames);
  const int64_t rate = audio.sampling_rate;
  if (frames < 0 || fps <= 0) return invalid_argument("soundtrack check: no picture length to compare with");
  // |samples / rate - frames / fps| <= 1 / fps, in integers (samples · fps stays far below 2^63).
  if (std::llabs(samples * fps - frames * rate) > rate) {
    const int64_t expected = (frames * rate * 2 + fps) / (2 * int64_t(fps));
    return invalid_argument("soundtrack: " + std::to_string(audio_latent_frames) + " audio latents decode to " +
                            std::to_string(samples) + " samples at " + std::to_string(rate) +
                            " Hz, which do not match the video's " + std::to_string(frames) + " frames at " +
                            std::to_string(fps) + " fps (expected " + std::to_string(expected) +
                            " samples, give or take one frame)");
  }
  return ok_status();
}

Result<Tensor> decode_video(const VideoVae& vae, const Tensor& latents) {
  return decode_video(vae, latents, vae.tiling);
}

Result<Tensor> decode_video(const VideoVae& vae, const Tensor& latents, const VideoTiling& tiling,
                            const VideoVaeObserver* observer) {
  const VideoVaeConfig& c = vae.config;
  const Emitter emit{observer};
  VORTEX_RETURN_IF_ERROR(validate_video_latents(c, latents));
  VORTEX_RETURN_IF_ERROR(validate_tiling(tiling, c.spatial_ratio()));
  const int64_t T = latents.size(1), H = latents.size(2), W = latents.size(3);
  Tensor x = latents.dtype() == DType::kF32 ? latents.clone() : latents.contiguous().to(DType::kF32).value();
  float* xd = x.data_as<float>();
  const int64_t plane = T * H * W;
  for (int64_t ch = 0; ch < c.latent_channels; ++ch) {
    for (int64_t i = 0; i < plane; ++i) xd[ch * plane + i] = xd[ch * plane + i] * c.latents_std[ch] + c.latents_mean[ch];
  }
  emit("latents", x);

  const int64_t chunk = c.tokens_chunk_size(), pt = c.temporal_ratio();
  const int64_t chunk_frames = chunk * pt, pre = c.frame_pre_padding();
  const int64_t num_chunks = (T + c.token_drop) / chunk - (c.token_drop > 0 ? 1 : 0);
  std::vector<Tensor> parts;
  Tensor overlap;
  for (int64_t i = 0; i < num_chunks; ++i) {
    VORTEX_ASSIGN_OR_RETURN(Tensor z, slice_copy(x, 1, i * chunk, i * chunk + chunk + c.token_overlap()));
    VORTEX_ASSIGN_OR_RETURN(Tensor clip, decode_clip(vae, z, tiling, observer));
    emit("clip." + std::to_string(i), clip);
    for (int j = 0; j < (c.token_drop > 0 ? 2 : 1); ++j) {
      VORTEX_ASSIGN_OR_RETURN(Tensor part, slice_copy(clip, 1, j * chunk_frames, (j + 1) * chunk_frames));
      VORTEX_ASSIGN_OR_RETURN(part, slice_copy(part, 1, pre, part.size(1)));
      if (j == 0) {
        if (overlap.defined()) {
          VORTEX_ASSIGN_OR_RETURN(part, blend_linear(overlap, part, c.frame_overlap(), 1));
        }
        parts.push_back(std::move(part));
      } else {
        overlap = std::move(part);
      }
    }
  }
  if (overlap.defined()) parts.push_back(overlap);
  VORTEX_ASSIGN_OR_RETURN(Tensor video, concat_frames(parts));
  emit("decoded", video);

  const int64_t frame_plane = video.size(1) * video.size(2) * video.size(3);
  float* vd = video.data_as<float>();
  for (int64_t ch = 0; ch < video.size(0); ++ch) {
    const float mean = kImagenetMean[ch % 3], std = kImagenetStd[ch % 3];
    parallel_for(
        ch * frame_plane, (ch + 1) * frame_plane,
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const float scaled = vd[i] * std;
            vd[i] = std::clamp(scaled + mean, 0.0f, 1.0f);
          }
        },
        16384);
  }
  emit("frames", video);
  return video;
}

}  // namespace vortex::vae
