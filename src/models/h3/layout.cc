#include "models/h3/layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace vortex::h3 {

namespace {

// Rotary-time constants of the reference pipeline: one latent frame spans 5/3 x (1, 4, 4, 4, 4)
// rotary units, mirroring the VAE's 17-frames-to-5-latents grouping; spatial axes are normalised
// by the square root of the latent area and scaled by 32.
constexpr double kFrameRescale = 5.0 / 3.0;
constexpr int kFramesPerLatent[5] = {1, 4, 4, 4, 4};
constexpr double kSpatialScale = 32.0;

// numpy.linspace(left, left + ratio, n, endpoint=False) * 32, bit for bit: numpy computes
// step = (stop - start) / n, then i * step + start.
std::vector<double> spatial_grid(int dim, int patch, double sqrt_area) {
  const double ratio = static_cast<double>(dim) / sqrt_area;
  const double left = (1.0 - ratio) / 2.0;
  const double stop = left + ratio;
  const int n = dim / patch;
  const double step = (stop - left) / n;
  std::vector<double> grid(n);
  for (int i = 0; i < n; ++i) grid[i] = (static_cast<double>(i) * step + left) * kSpatialScale;
  return grid;
}

// origin + [0, cumsum(spans[:-1])], summed sequentially in float64 as torch.cumsum does.
std::vector<double> temporal_grid(int latent_frames, double origin) {
  std::vector<double> times(latent_frames);
  double sum = 0.0;
  for (int f = 0; f < latent_frames; ++f) {
    times[f] = origin + sum;
    sum += kFrameRescale * kFramesPerLatent[f % 5];
  }
  return times;
}

// Python's built-in sum() of floats as CPython 3.12 and later compute it (Neumaier's compensated
// sum, the compensation added at the end), which is how the reference advances its clock past a
// video reference. It differs in the last bit from a plain loop (Python 3.11's sum) from 16 frame
// spans on, and from numpy's pairwise sum (a keyframe anchored last) as well.
double python_float_sum(const double* values, int64_t n) {
  if (n == 0) return 0.0;
  double sum = values[0], compensation = 0.0;
  for (int64_t i = 1; i < n; ++i) {
    const double x = values[i], t = sum + x;
    compensation += std::fabs(sum) >= std::fabs(x) ? (sum - t) + x : (x - t) + sum;
    sum = t;
  }
  return compensation != 0.0 && std::isfinite(compensation) ? sum + compensation : sum;
}

// The (h, w) rotary axes of one latent frame of h x w latents, normalised by its own area.
struct FrameGrid {
  std::vector<double> h, w;
};
FrameGrid frame_grid(int latent_height, int latent_width, int ph, int pw) {
  const double sqrt_area = std::sqrt(static_cast<double>(latent_height) * latent_width);
  return {spatial_grid(latent_height, ph, sqrt_area), spatial_grid(latent_width, pw, sqrt_area)};
}

// Text rows are text, or a picture's vision tokens (tagged video).
Status check_text_tags(const std::vector<int32_t>& text_tags) {
  for (size_t i = 0; i < text_tags.size(); ++i) {
    if (text_tags[i] != kTextTag && text_tags[i] != kVideoTag) {
      return invalid_argument("text row " + std::to_string(i) + ": tag " + std::to_string(text_tags[i]) +
                              " is neither text (" + std::to_string(kTextTag) + ") nor a picture token (" +
                              std::to_string(kVideoTag) + ")");
    }
  }
  return ok_status();
}

}  // namespace

Result<LatentGeometry> resolve_geometry(const VideoGeometry& video, const H3Config& config) {
  const int multiple = kVaeSpatialRatio * config.patch_size[2];
  const int multiple_h = kVaeSpatialRatio * config.patch_size[1];
  if (video.height <= 0 || video.height % multiple_h != 0) {
    return invalid_argument("height " + std::to_string(video.height) + " must be a positive multiple of " +
                            std::to_string(multiple_h));
  }
  if (video.width <= 0 || video.width % multiple != 0) {
    return invalid_argument("width " + std::to_string(video.width) + " must be a positive multiple of " +
                            std::to_string(multiple));
  }
  if (video.num_frames < kVaeLatentsPerChunk || video.num_frames % kVaeFramesPerChunk != kVaeLatentsPerChunk) {
    int next = std::max(video.num_frames, kVaeLatentsPerChunk);
    while (next % kVaeFramesPerChunk != kVaeLatentsPerChunk) ++next;
    return invalid_argument("frames " + std::to_string(video.num_frames) +
                            " must be of the form 17n + 5 (the video VAE's chunking); nearest above: " +
                            std::to_string(next));
  }
  LatentGeometry g;
  g.latent_frames = (video.num_frames - kVaeLatentsPerChunk) / kVaeFramesPerChunk * kVaeLatentsPerChunk + 2;
  g.latent_height = video.height / kVaeSpatialRatio;
  g.latent_width = video.width / kVaeSpatialRatio;
  // round(frames / fps * 40) in float64, rounding half to even like Python's round().
  g.audio_latents = static_cast<int>(std::nearbyint(static_cast<double>(video.num_frames) / kFps *
                                                    kAudioLatentsPerSecond));
  if (g.latent_frames % config.patch_size[0] != 0) {
    return invalid_argument("latent frames " + std::to_string(g.latent_frames) + " not divisible by patch_size[0]");
  }
  return g;
}

Result<PackedLayout> canonical_t2va_layout(const H3Config& config) {
  VORTEX_ASSIGN_OR_RETURN(const LatentGeometry geometry, resolve_geometry(VideoGeometry{}, config));
  return build_t2va_layout(kCanonicalTextTokens, geometry, config);
}

double numpy_pairwise_sum(const double* a, int64_t n) {
  // numpy's pairwise_sum: below 8 values a plain loop; up to 128 eight running sums combined as a
  // tree, then the tail; above that the halves (the first a multiple of 8) recursively.
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_pairwise_sum(a, n2) + numpy_pairwise_sum(a + n2, n - n2);
}

Result<PackedLayout> build_t2va_layout(int64_t num_text, const LatentGeometry& g, const H3Config& config) {
  if (num_text < 0) return invalid_argument("number of text rows must be >= 0");
  return build_keyframe_layout(std::vector<int32_t>(static_cast<size_t>(num_text), kTextTag), g, config, {});
}

Result<PackedLayout> build_keyframe_layout(const std::vector<int32_t>& text_tags, const LatentGeometry& g,
                                           const H3Config& config, const std::vector<KeyframeAnchor>& anchors) {
  const int ph = config.patch_size[1], pw = config.patch_size[2], pt = config.patch_size[0];
  const int64_t num_text = static_cast<int64_t>(text_tags.size());
  if (g.latent_height % ph != 0 || g.latent_width % pw != 0 || g.latent_frames % pt != 0) {
    return invalid_argument("latent geometry " + std::to_string(g.latent_frames) + "x" +
                            std::to_string(g.latent_height) + "x" + std::to_string(g.latent_width) +
                            " is not divisible by the patch size");
  }
  VORTEX_RETURN_IF_ERROR(check_text_tags(text_tags));
  const int rows_h = g.latent_height / ph, rows_w = g.latent_width / pw;
  const int64_t rows_per_frame = static_cast<int64_t>(rows_h) * rows_w;
  const int frames = g.latent_frames / pt;

  PackedLayout layout;
  layout.num_text = num_text;
  layout.num_condition = static_cast<int64_t>(anchors.size()) * rows_per_frame;
  layout.num_audio = static_cast<int64_t>(g.audio_latents) * kAudioChannels;
  layout.num_video = layout.num_condition + frames * rows_per_frame;
  layout.num_rows = layout.num_text + layout.num_audio + layout.num_video;
  layout.positions.assign(static_cast<size_t>(layout.num_rows) * 3, 0.0);
  layout.tags.assign(static_cast<size_t>(layout.num_rows), kTextTag);

  const int64_t condition_start = num_text;
  const int64_t audio_start = condition_start + layout.num_condition;
  const int64_t video_start = audio_start + layout.num_audio;
  auto pos = [&](int64_t row, int axis) -> double& { return layout.positions[row * 3 + axis]; };

  // Text rows sit on the time axis at their row index; media continue the clock from there.
  for (int64_t i = 0; i < num_text; ++i) {
    pos(i, 0) = static_cast<double>(i);
    layout.tags[i] = text_tags[i];
    layout.text_indices.push_back(i);
  }

  const double sqrt_area = std::sqrt(static_cast<double>(g.latent_height) * g.latent_width);
  const std::vector<double> h_grid = spatial_grid(g.latent_height, ph, sqrt_area);
  const std::vector<double> w_grid = spatial_grid(g.latent_width, pw, sqrt_area);
  const double origin = static_cast<double>(num_text);
  const auto place_frame = [&](int64_t first_row, double time) {
    for (int y = 0; y < rows_h; ++y) {
      for (int x = 0; x < rows_w; ++x) {
        const int64_t row = first_row + static_cast<int64_t>(y) * rows_w + x;
        pos(row, 0) = time;
        pos(row, 1) = h_grid[y];
        pos(row, 2) = w_grid[x];
        layout.tags[row] = kVideoTag;
        layout.video_indices.push_back(row);
      }
    }
  };

  std::vector<double> spans(static_cast<size_t>(frames));
  for (int f = 0; f < frames; ++f) spans[f] = kFrameRescale * kFramesPerLatent[f % 5];
  const double last_time = origin + numpy_pairwise_sum(spans.data(), frames) - kFrameRescale;
  for (size_t k = 0; k < anchors.size(); ++k) {
    place_frame(condition_start + static_cast<int64_t>(k) * rows_per_frame,
                anchors[k] == KeyframeAnchor::kFirst ? origin : last_time);
  }

  // Audio: channel-major blocks, one rotary unit per latent (40/s = 24 fps x 5/3), no height,
  // width pinned to the two extremes of the video's width grid (left channel, right channel).
  for (int64_t r = 0; r < layout.num_audio; ++r) {
    const int64_t row = audio_start + r;
    const int64_t channel = r / g.audio_latents;
    pos(row, 0) = origin + static_cast<double>(r % g.audio_latents);
    pos(row, 2) = channel == 0 ? w_grid.front() : w_grid.back();
    layout.tags[row] = kAudioTag;
    layout.audio_indices.push_back(row);
  }

  const std::vector<double> times = temporal_grid(frames, origin);
  for (int f = 0; f < frames; ++f) place_frame(video_start + f * rows_per_frame, times[f]);
  return layout;
}

namespace {

Status check_reference(const ReferenceBlock& r, size_t index, const H3Config& config) {
  const std::string name = "reference " + std::to_string(index + 1);
  const bool visual = r.kind != ReferenceKind::kAudio;
  if (visual) {
    if (r.latent_frames < 1 || r.latent_height < 1 || r.latent_width < 1 ||
        r.latent_frames % config.patch_size[0] != 0 || r.latent_height % config.patch_size[1] != 0 ||
        r.latent_width % config.patch_size[2] != 0) {
      return invalid_argument(name + ": latent geometry " + std::to_string(r.latent_frames) + "x" +
                              std::to_string(r.latent_height) + "x" + std::to_string(r.latent_width) +
                              " is empty or not divisible by the patch size");
    }
  } else if (r.latent_frames != 0 || r.latent_height != 0 || r.latent_width != 0) {
    return invalid_argument(name + ": an audio reference has no video latents");
  }
  if (r.kind == ReferenceKind::kImage && (r.latent_frames != 1 || r.audio_latents != 0)) {
    return invalid_argument(name + ": an image reference is one latent frame without sound");
  }
  if (r.kind == ReferenceKind::kAudio && r.audio_latents < 1) {
    return invalid_argument(name + ": an audio reference needs at least one audio latent");
  }
  if (r.audio_latents < 0) return invalid_argument(name + ": negative audio latents");
  return ok_status();
}

}  // namespace

Result<PackedLayout> build_ref2va_layout(const std::vector<int32_t>& text_tags,
                                         const std::vector<ReferenceBlock>& references, const LatentGeometry& g,
                                         const H3Config& config) {
  // The target's own checks (patch divisibility, text tags) and row counts.
  VORTEX_ASSIGN_OR_RETURN(const PackedLayout target, build_keyframe_layout(text_tags, g, config, {}));
  const int pt = config.patch_size[0], ph = config.patch_size[1], pw = config.patch_size[2];
  int64_t reference_video = 0, reference_audio = 0;
  for (size_t k = 0; k < references.size(); ++k) {
    const ReferenceBlock& r = references[k];
    VORTEX_RETURN_IF_ERROR(check_reference(r, k, config));
    if (r.kind != ReferenceKind::kAudio) {
      reference_video += static_cast<int64_t>(r.latent_frames / pt) * (r.latent_height / ph) * (r.latent_width / pw);
    }
    reference_audio += static_cast<int64_t>(r.audio_latents) * kAudioChannels;
  }

  PackedLayout layout;
  layout.num_text = target.num_text;
  layout.num_condition = reference_video;
  layout.num_condition_audio = reference_audio;
  layout.num_audio = target.num_audio + reference_audio;
  layout.num_video = target.num_video + reference_video;
  layout.num_rows = layout.num_text + layout.num_audio + layout.num_video;
  layout.positions.assign(static_cast<size_t>(layout.num_rows) * 3, 0.0);
  layout.tags.assign(static_cast<size_t>(layout.num_rows), kTextTag);
  layout.text_indices = target.text_indices;
  for (int64_t i = 0; i < layout.num_text; ++i) {
    layout.positions[i * 3] = static_cast<double>(i);
    layout.tags[i] = text_tags[i];
  }

  int64_t cursor = layout.num_text;
  // Frames of h x w latents at `cursor`, frame f at times[f], on that size's own (h, w) grid.
  const auto place_frames = [&](const FrameGrid& grid, const std::vector<double>& times) {
    for (double time : times) {
      for (double y : grid.h) {
        for (double x : grid.w) {
          double* p = &layout.positions[cursor * 3];
          p[0] = time;
          p[1] = y;
          p[2] = x;
          layout.tags[cursor] = kVideoTag;
          layout.video_indices.push_back(cursor++);
        }
      }
    }
  };
  // Channel-major soundtrack rows at `cursor`: one rotary unit per latent from `origin`, no height,
  // the width pinned to the extremes of the width grid of the block they belong to.
  const auto place_audio = [&](int latents, double origin, const std::vector<double>& w_grid) {
    for (int c = 0; c < kAudioChannels; ++c) {
      for (int a = 0; a < latents; ++a) {
        double* p = &layout.positions[cursor * 3];
        p[0] = origin + static_cast<double>(a);
        p[2] = c == 0 ? w_grid.front() : w_grid.back();
        layout.tags[cursor] = kAudioTag;
        layout.audio_indices.push_back(cursor++);
      }
    }
  };

  const FrameGrid target_grid = frame_grid(g.latent_height, g.latent_width, ph, pw);
  double clock = static_cast<double>(layout.num_text);
  for (const ReferenceBlock& r : references) {
    if (r.kind == ReferenceKind::kAudio) {
      place_audio(r.audio_latents, clock, target_grid.w);
      clock += static_cast<double>(r.audio_latents);
      continue;
    }
    const FrameGrid grid = frame_grid(r.latent_height, r.latent_width, ph, pw);
    const int frames = r.latent_frames / pt;
    if (r.kind == ReferenceKind::kImage) {
      // A single frame: one integer rotary slot, not a latent frame's 5/3 units.
      place_frames(grid, {clock});
      clock += 1.0;
      continue;
    }
    place_audio(r.audio_latents, clock, grid.w);
    place_frames(grid, temporal_grid(frames, clock));
    std::vector<double> spans(static_cast<size_t>(frames));
    for (int f = 0; f < frames; ++f) spans[f] = kFrameRescale * kFramesPerLatent[f % 5];
    clock += std::max(static_cast<double>(r.audio_latents), python_float_sum(spans.data(), frames));
  }
  place_audio(g.audio_latents, clock, target_grid.w);
  place_frames(target_grid, temporal_grid(g.latent_frames / pt, clock));
  return layout;
}

RowTimesteps assign_row_timesteps(const PackedLayout& layout, float video_timestep, float audio_timestep) {
  // The reference compares the float timestep, widened, with the double 0.999 and stores the larger
  // in a float32 row.
  const float condition_timestep =
      static_cast<float>(std::max(static_cast<double>(video_timestep), kKeyframeNoiseAug));
  // A reference soundtrack conditions clean: t = 1.
  constexpr float kCleanTimestep = 1.0f;
  RowTimesteps out;
  out.timesteps = {video_timestep};
  if (layout.num_audio > 0) out.timesteps.push_back(audio_timestep);
  if (layout.num_condition > 0) out.timesteps.push_back(condition_timestep);
  if (layout.num_condition_audio > 0) out.timesteps.push_back(kCleanTimestep);
  std::sort(out.timesteps.begin(), out.timesteps.end());
  out.timesteps.erase(std::unique(out.timesteps.begin(), out.timesteps.end()), out.timesteps.end());
  const auto slot = [&](float t) {
    return static_cast<int32_t>(std::lower_bound(out.timesteps.begin(), out.timesteps.end(), t) -
                                out.timesteps.begin());
  };
  out.row_index.assign(static_cast<size_t>(layout.num_rows), slot(video_timestep));
  for (int64_t k = 0; k < layout.num_condition; ++k) out.row_index[layout.video_indices[k]] = slot(condition_timestep);
  for (size_t k = 0; k < layout.audio_indices.size(); ++k) {
    const bool reference = static_cast<int64_t>(k) < layout.num_condition_audio;
    out.row_index[layout.audio_indices[k]] = slot(reference ? kCleanTimestep : audio_timestep);
  }
  return out;
}

Result<Tensor> patchify_video(const Tensor& latents, const H3Config& config) {
  if (latents.rank() != 4 || latents.size(0) != config.in_channels) {
    return invalid_argument("video latents must be [" + std::to_string(config.in_channels) +
                            ", frames, height, width], got " + latents.describe());
  }
  const int64_t C = latents.size(0), F = latents.size(1), H = latents.size(2), W = latents.size(3);
  const int pt = config.patch_size[0], ph = config.patch_size[1], pw = config.patch_size[2];
  if (F % pt || H % ph || W % pw) {
    return invalid_argument("video latents " + latents.describe() + " are not divisible by the patch size");
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor src, latents.to(DType::kF32));
  const float* in = src.data_as<float>();
  const int64_t rows = (F / pt) * (H / ph) * (W / pw), width = C * pt * ph * pw;
  Tensor out = Tensor::empty({rows, width}, DType::kF32);
  float* o = out.data_as<float>();
  int64_t r = 0;
  for (int64_t f = 0; f < F / pt; ++f)
    for (int64_t y = 0; y < H / ph; ++y)
      for (int64_t x = 0; x < W / pw; ++x, ++r) {
        int64_t col = 0;
        for (int64_t c = 0; c < C; ++c)
          for (int a = 0; a < pt; ++a)
            for (int b = 0; b < ph; ++b)
              for (int d = 0; d < pw; ++d, ++col)
                o[r * width + col] = in[((c * F + f * pt + a) * H + y * ph + b) * W + x * pw + d];
      }
  return out;
}

Result<Tensor> unpatchify_video(const Tensor& rows, const LatentGeometry& g, const H3Config& config) {
  const int pt = config.patch_size[0], ph = config.patch_size[1], pw = config.patch_size[2];
  const int64_t C = config.in_channels, F = g.latent_frames, H = g.latent_height, W = g.latent_width;
  const int64_t n = (F / pt) * (H / ph) * (W / pw), width = C * pt * ph * pw;
  if (rows.rank() != 2 || rows.size(0) != n || rows.size(1) != width) {
    return invalid_argument("video rows must be [" + std::to_string(n) + ", " + std::to_string(width) + "], got " +
                            rows.describe());
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor src, rows.to(DType::kF32));
  const float* in = src.data_as<float>();
  Tensor out = Tensor::empty({C, F, H, W}, DType::kF32);
  float* o = out.data_as<float>();
  int64_t r = 0;
  for (int64_t f = 0; f < F / pt; ++f)
    for (int64_t y = 0; y < H / ph; ++y)
      for (int64_t x = 0; x < W / pw; ++x, ++r) {
        int64_t col = 0;
        for (int64_t c = 0; c < C; ++c)
          for (int a = 0; a < pt; ++a)
            for (int b = 0; b < ph; ++b)
              for (int d = 0; d < pw; ++d, ++col)
                o[((c * F + f * pt + a) * H + y * ph + b) * W + x * pw + d] = in[r * width + col];
      }
  return out;
}

}  // namespace vortex::h3
