// The video VAE encoder on the GPU (see cuda_video_vae_encoder.h): weights, the activation plan of
// a chunk, the causal convs as gathers and GEMMs, and encode_video_chunk's module order.
#include "models/vae/cuda_video_vae_encoder.h"

#include <algorithm>
#include <string>

#include "cuda/elementwise.h"
#include "cuda/vae_conv3d.h"
#include "cuda/vae_video_layout.h"

namespace vortex::vae {

namespace {

constexpr size_t kWorkspaceBytes = 64u << 20;
constexpr size_t kSlack = cuda::DeviceArena::kAlignment;
// The gather rows of one GEMM: at most 64 Mi floats (256 MB). A 256 x 256 tile's widest conv
// (128 channels, 9 real taps of a keyframe) needs 75 M of them, so it runs in two row blocks.
constexpr int64_t kGatherCapFloats = int64_t{1} << 26;
// Levels whose input has at most this many pixels a tile run on every tile of a keyframe at once.
constexpr int64_t kBatchPixels = 4096;
// `cur` when x is the batch's input rather than one of the three rotating buffers.
constexpr int kBatchBuffer = 3;

// The first of the three rotating buffers that holds neither `a` nor `b`.
int free_buffer(int a, int b = -1) {
  for (int i = 0; i < 3; ++i) {
    if (i != a && i != b) return i;
  }
  return -1;  // unreachable: three buffers, at most two taken
}

bool is_direct(const Conv3dGeometry& g) {
  return g.kt == 1 && g.kh == 1 && g.kw == 1 && g.st == 1 && g.sh == 1 && g.sw == 1 && g.pad_top == 0 &&
         g.pad_bottom == 0 && g.pad_left == 0 && g.pad_right == 0 && g.temporal_padding == 0;
}

// [clips·T_out, H_out, W_out, C] out of a conv on `clips` clips stacked in x [clips·T, H, W, C_in],
// with the CPU's refusals.
Result<Shape> conv_output_shape(int64_t out_channels, const Conv3dGeometry& g, const Shape& x, int64_t clips) {
  VORTEX_ASSIGN_OR_RETURN(Shape out, conv3d_output_shape(g, out_channels, {x[0] / clips, x[1], x[2], x[3]},
                                                         x.to_string()));
  out[0] *= clips;
  return out;
}

// The first `shape.numel()` floats of a flat device buffer, as a contiguous tensor of `shape`.
Result<Tensor> view_of(const Tensor& buffer, const Shape& shape) {
  if (shape.numel() > buffer.numel()) {
    return internal_error("video VAE encoder: " + shape.to_string() + " does not fit its buffer");
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor prefix, buffer.slice(0, 0, shape.numel()));
  return prefix.reshape(shape);
}

Result<Tensor> rows_of(const Tensor& t) { return t.reshape({t.numel() / t.size(3), t.size(3)}); }

}  // namespace

Result<std::unique_ptr<CudaVideoVaeEncoder>> CudaVideoVaeEncoder::create(const VideoVaeEncoder& vae,
                                                                         cudaStream_t stream,
                                                                         std::optional<cuda::VaeConvVariant> variant) {
  VORTEX_RETURN_IF_ERROR(cuda::require_hopper_device("the video VAE encoder on --device cuda"));
  std::unique_ptr<CudaVideoVaeEncoder> e(new CudaVideoVaeEncoder());
  e->config_ = vae.config;
  e->tiling_ = vae.tiling;
  e->stream_ = stream;
  if (variant) {
    e->conv_variant_ = *variant;
  } else {
    VORTEX_ASSIGN_OR_RETURN(e->conv_variant_, cuda::vae_conv_variant_from_env());
  }
  VORTEX_RETURN_IF_ERROR(e->upload(vae));
  VORTEX_ASSIGN_OR_RETURN(e->workspace_, cuda::DeviceArena::create(kWorkspaceBytes + kSlack));
  VORTEX_ASSIGN_OR_RETURN(e->gemm_, cuda::GemmRunner::create(e->workspace_, kWorkspaceBytes));
  return e;
}

Status CudaVideoVaeEncoder::upload(const VideoVaeEncoder& vae) {
  // Every host tensor of the encoder, in module order: first to size the arena, then to copy.
  // The warp-specialized conv also keeps its weights' tf32 low parts (split once, here).
  const bool split_weights = conv_variant_ == cuda::VaeConvVariant::kTf32x3Ws;
  std::vector<const Tensor*> host;
  size_t low_part_bytes = 0;
  const auto conv_tensors = [&](const CausalConv3d& c) {
    host.push_back(&c.weight);
    host.push_back(&c.bias);
    if (split_weights && implicit(c)) {
      low_part_bytes += cuda::DeviceArena::bytes_for(c.weight.shape(), DType::kF32);
    }
  };
  conv_tensors(vae.conv_in);
  for (const VideoEncoderLevel& level : vae.levels) {
    for (const VideoEncoderResnet& r : level.resnets) {
      for (const Tensor* t : {&r.norm1_weight, &r.norm1_bias, &r.norm2_weight, &r.norm2_bias}) host.push_back(t);
      conv_tensors(r.conv1);
      conv_tensors(r.conv2);
      if (r.has_shortcut) conv_tensors(r.conv_shortcut);
    }
    if (level.has_downsampler) conv_tensors(level.downsampler);
  }
  host.push_back(&vae.norm_out_weight);
  host.push_back(&vae.norm_out_bias);
  conv_tensors(vae.conv_out);
  conv_tensors(vae.quant_conv);
  size_t bytes = 0;
  for (const Tensor* t : host) {
    if (!t->defined() || t->dtype() != DType::kF32) {
      return invalid_argument("video VAE encoder: every weight must be an assembled F32 tensor");
    }
    bytes += cuda::DeviceArena::bytes_for(t->shape(), DType::kF32);
  }
  VORTEX_ASSIGN_OR_RETURN(weights_, cuda::DeviceArena::create(bytes + low_part_bytes + kSlack));

  const auto tensor = [&](const Tensor& t) -> Result<Tensor> {
    VORTEX_ASSIGN_OR_RETURN(Tensor d, weights_.alloc(t.shape(), DType::kF32));
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device_staged(t, d, stream_));
    return d;
  };
  const auto conv = [&](const CausalConv3d& c) -> Result<Conv> {
    Conv d;
    d.in_channels = c.in_channels;
    d.out_channels = c.out_channels;
    d.geometry = c.geometry;
    VORTEX_ASSIGN_OR_RETURN(d.weight, tensor(c.weight));
    VORTEX_ASSIGN_OR_RETURN(d.bias, tensor(c.bias));
    if (split_weights && implicit(d)) {
      VORTEX_ASSIGN_OR_RETURN(d.weight_lo, weights_.alloc(d.weight.shape(), DType::kF32));
      VORTEX_RETURN_IF_ERROR(cuda::split_conv_weight_tf32(d.weight.view(), d.weight_lo.view(), stream_));
    }
    return d;
  };
  VORTEX_ASSIGN_OR_RETURN(conv_in_, conv(vae.conv_in));
  for (const VideoEncoderLevel& level : vae.levels) {
    Level l;
    for (const VideoEncoderResnet& r : level.resnets) {
      Resnet d;
      VORTEX_ASSIGN_OR_RETURN(d.norm1_weight, tensor(r.norm1_weight));
      VORTEX_ASSIGN_OR_RETURN(d.norm1_bias, tensor(r.norm1_bias));
      VORTEX_ASSIGN_OR_RETURN(d.norm2_weight, tensor(r.norm2_weight));
      VORTEX_ASSIGN_OR_RETURN(d.norm2_bias, tensor(r.norm2_bias));
      VORTEX_ASSIGN_OR_RETURN(d.conv1, conv(r.conv1));
      VORTEX_ASSIGN_OR_RETURN(d.conv2, conv(r.conv2));
      d.has_shortcut = r.has_shortcut;
      if (r.has_shortcut) {
        VORTEX_ASSIGN_OR_RETURN(d.conv_shortcut, conv(r.conv_shortcut));
      }
      l.resnets.push_back(std::move(d));
    }
    l.has_downsampler = level.has_downsampler;
    if (level.has_downsampler) {
      VORTEX_ASSIGN_OR_RETURN(l.downsampler, conv(level.downsampler));
    }
    levels_.push_back(std::move(l));
  }
  VORTEX_ASSIGN_OR_RETURN(norm_out_weight_, tensor(vae.norm_out_weight));
  VORTEX_ASSIGN_OR_RETURN(norm_out_bias_, tensor(vae.norm_out_bias));
  VORTEX_ASSIGN_OR_RETURN(conv_out_, conv(vae.conv_out));
  VORTEX_ASSIGN_OR_RETURN(quant_conv_, conv(vae.quant_conv));
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ok_status();
}

bool CudaVideoVaeEncoder::implicit(const Conv3dGeometry& g, int64_t in_channels, int64_t out_channels) const {
  return conv_variant_ != cuda::VaeConvVariant::kGatherGemm && !is_direct(g) &&
         cuda::conv3d_implicit_supports(in_channels, out_channels);
}

Result<CudaVideoVaeEncoder::Plan> CudaVideoVaeEncoder::plan(const Shape& pixels, int64_t clips) const {
  Plan p;
  p.clips = clips;
  p.batch_level = levels_.size();
  Shape s{pixels[1], pixels[2], pixels[3], pixels[0]};
  p.pixel_floats = s.numel();
  int64_t per = 1;  // the chunks an activation holds: one before the batch, `clips` from it on
  const auto step = [&](const Conv& c) -> Status {
    VORTEX_ASSIGN_OR_RETURN(Shape out, conv_output_shape(c.out_channels, c.geometry, s, per));
    const Conv3dGeometry& g = c.geometry;
    if (!is_direct(g) && !implicit(c)) {
      p.gather_floats = std::max(p.gather_floats, per * out[1] * out[2] * g.kt * g.kh * g.kw * c.in_channels);
    }
    p.activation_floats = std::max(p.activation_floats, out.numel());
    p.frames = std::max(p.frames, out[0]);
    s = out;
    return ok_status();
  };
  VORTEX_RETURN_IF_ERROR(step(conv_in_));
  for (size_t i = 0; i < levels_.size(); ++i) {
    if (clips > 1 && per == 1 && s[1] * s[2] <= kBatchPixels) {
      p.batch_level = i;
      per = clips;
      s = Shape{clips * s[0], s[1], s[2], s[3]};
      p.batch_input = s;
      p.activation_floats = std::max(p.activation_floats, s.numel());
      p.frames = std::max(p.frames, s[0]);
    }
    for (const Resnet& r : levels_[i].resnets) {
      const Shape in = s;
      VORTEX_RETURN_IF_ERROR(step(r.conv1));
      VORTEX_RETURN_IF_ERROR(step(r.conv2));
      if (r.has_shortcut) {
        const Shape out = s;
        s = in;
        VORTEX_RETURN_IF_ERROR(step(r.conv_shortcut));
        if (s != out) return internal_error("video VAE encoder: a resnet's shortcut and body disagree");
      }
    }
    if (levels_[i].has_downsampler) VORTEX_RETURN_IF_ERROR(step(levels_[i].downsampler));
  }
  if (clips > 1 && per == 1) {  // no level small enough: the output convs run batched
    per = clips;
    s = Shape{clips * s[0], s[1], s[2], s[3]};
    p.batch_input = s;
    p.activation_floats = std::max(p.activation_floats, s.numel());
    p.frames = std::max(p.frames, s[0]);
  }
  VORTEX_RETURN_IF_ERROR(step(conv_out_));
  VORTEX_RETURN_IF_ERROR(step(quant_conv_));
  return p;
}

Status CudaVideoVaeEncoder::reserve(const Plan& p) {
  const int64_t batch_floats = p.clips > 1 ? p.batch_input.numel() : 1;
  const int64_t reserved_batch = reserved_.clips > 1 ? reserved_.batch_input.numel() : 1;
  if (p.activation_floats <= reserved_.activation_floats && p.gather_floats <= reserved_.gather_floats &&
      p.frames <= reserved_.frames && p.pixel_floats <= reserved_.pixel_floats &&
      p.clip_floats <= reserved_.clip_floats && batch_floats <= reserved_batch && pixels_buffer_.defined()) {
    return ok_status();
  }
  Plan n = p;  // never smaller than before: a later, smaller set reuses the arena
  n.activation_floats = std::max(p.activation_floats, reserved_.activation_floats);
  n.gather_floats = std::max(p.gather_floats, reserved_.gather_floats);
  n.frames = std::max(p.frames, reserved_.frames);
  n.pixel_floats = std::max(p.pixel_floats, reserved_.pixel_floats);
  n.clip_floats = std::max(p.clip_floats, reserved_.clip_floats);
  if (reserved_batch > batch_floats) n.batch_input = reserved_.batch_input, n.clips = reserved_.clips;
  const Shape activation{n.activation_floats}, gather{std::clamp<int64_t>(n.gather_floats, 1, kGatherCapFloats)};
  const Shape pixel{n.pixel_floats}, clip{std::max<int64_t>(n.clip_floats, 1)};
  const Shape batch{n.clips > 1 ? n.batch_input.numel() : 1};
  const Shape scratch{cuda::frame_group_norm_scratch(n.frames, config_.norm_num_groups)};
  const size_t bytes = 3 * cuda::DeviceArena::bytes_for(activation, DType::kF32) +
                       cuda::DeviceArena::bytes_for(batch, DType::kF32) +
                       cuda::DeviceArena::bytes_for(pixel, DType::kF32) +
                       cuda::DeviceArena::bytes_for(clip, DType::kF32) +
                       cuda::DeviceArena::bytes_for(gather, DType::kF32) +
                       cuda::DeviceArena::bytes_for(scratch, DType::kF64) + 8 * kSlack;
  for (Tensor& b : buffers_) b = Tensor();
  pixels_buffer_ = clip_buffer_ = gather_buffer_ = norm_scratch_ = batch_buffer_ = Tensor();
  activations_ = cuda::DeviceArena();
  VORTEX_ASSIGN_OR_RETURN(activations_, cuda::DeviceArena::create(bytes));
  for (Tensor& b : buffers_) {
    VORTEX_ASSIGN_OR_RETURN(b, activations_.alloc(activation, DType::kF32));
  }
  VORTEX_ASSIGN_OR_RETURN(batch_buffer_, activations_.alloc(batch, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(pixels_buffer_, activations_.alloc(pixel, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(clip_buffer_, activations_.alloc(clip, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(gather_buffer_, activations_.alloc(gather, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(norm_scratch_, activations_.alloc(scratch, DType::kF64));
  reserved_ = n;
  return ok_status();
}

Status CudaVideoVaeEncoder::conv(const Conv& c, const Tensor& x, const Tensor& y, int64_t clips) {
  const Conv3dGeometry& g = c.geometry;
  const int64_t C = c.in_channels, O = c.out_channels;
  VORTEX_ASSIGN_OR_RETURN(Tensor y_rows, rows_of(y));
  const TensorView bias = c.bias.view();
  const std::string gemm_section = "gemm, " + stage_, gather_section = "gather, " + stage_;
  if (is_direct(g)) {
    VORTEX_ASSIGN_OR_RETURN(Tensor x_rows, rows_of(x));
    const cuda::SectionScope section(profiler_, gemm_section.c_str(), stream_);
    return gemm_->linear(x_rows.view(), c.weight.view(), &bias, y_rows.view(), stream_);
  }
  const int64_t T_out = y.size(0) / clips, plane = y.size(1) * y.size(2);
  if (clips > 1 && T_out != 1) return internal_error("video VAE encoder: batched clips must have one output frame");
  const cuda::Conv3dTaps taps{g.kt, g.kh, g.kw, g.st, g.sh, g.sw, g.pad_top, g.pad_left, g.temporal_padding};
  if (implicit(c)) {  // every output frame in one launch, no rows written
    const std::string section = "conv, " + stage_;
    const cuda::SectionScope scope(profiler_, section.c_str(), stream_);
    const TensorView weight_lo = c.weight_lo.defined() ? c.weight_lo.view() : TensorView{};
    return cuda::conv3d_implicit(x.view(), clips, taps, y.size(1), y.size(2), c.weight.view(),
                                 c.weight_lo.defined() ? &weight_lo : nullptr, bias, y_rows.view(), conv_variant_,
                                 stream_);
  }
  // One output frame of one clip, or the one output frame of every clip: contiguous rows of y.
  const int64_t frame_rows = clips * plane;
  const int64_t spatial = g.kh * g.kw, KC = g.kt * spatial * C;
  for (int64_t f = 0; f < T_out; ++f) {
    // Temporal taps [a0, kt) read real frames; the ones before read the causal zeros.
    const int64_t a0 = std::clamp<int64_t>(g.temporal_padding - f * g.st, 0, g.kt);
    if (a0 == g.kt) return internal_error("video VAE encoder: an output frame reads only causal zeros");
    const int64_t k_begin = a0 * spatial * C, k_len = KC - k_begin;
    const int64_t block_rows = std::min(frame_rows, std::max<int64_t>(1, gather_buffer_.numel() / k_len));
    TensorView w = c.weight.view();
    w.data = static_cast<float*>(w.data) + k_begin;
    w.shape = Shape{O, k_len};
    for (int64_t r0 = 0; r0 < frame_rows; r0 += block_rows) {
      const int64_t rows = std::min(block_rows, frame_rows - r0);
      VORTEX_ASSIGN_OR_RETURN(Tensor cols, view_of(gather_buffer_, {rows, k_len}));
      {
        const cuda::SectionScope section(profiler_, gather_section.c_str(), stream_);
        VORTEX_RETURN_IF_ERROR(
            cuda::conv3d_gather(x.view(), clips, taps, y.size(1), y.size(2), f, a0, r0, cols.view(), stream_));
      }
      VORTEX_ASSIGN_OR_RETURN(Tensor out, y_rows.slice(0, f * plane + r0, f * plane + r0 + rows));
      const cuda::SectionScope section(profiler_, gemm_section.c_str(), stream_);
      VORTEX_RETURN_IF_ERROR(gemm_->linear(cols.view(), w, &bias, out.view(), stream_));
    }
  }
  return ok_status();
}

Result<Tensor> CudaVideoVaeEncoder::conv_into(const Conv& c, const Tensor& x, int buffer, int64_t clips) {
  VORTEX_ASSIGN_OR_RETURN(Shape shape, conv_output_shape(c.out_channels, c.geometry, x.shape(), clips));
  VORTEX_ASSIGN_OR_RETURN(Tensor y, view_of(buffers_[buffer], shape));
  VORTEX_RETURN_IF_ERROR(conv(c, x, y, clips));
  return y;
}

Status CudaVideoVaeEncoder::group_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) {
  const std::string name = "group_norm, " + stage_;
  const cuda::SectionScope section(profiler_, name.c_str(), stream_);
  return cuda::frame_group_norm(x.view(), weight.view(), bias.view(), config_.norm_num_groups, config_.norm_eps,
                                /*silu=*/true, norm_scratch_.view(), y.view(), stream_);
}

Status CudaVideoVaeEncoder::run_levels(size_t begin, size_t end, Tensor& x, int& cur, int64_t first_chunk,
                                       int64_t clips, const Emit& emit) {
  for (size_t i = begin; i < end; ++i) {
    const Level& level = levels_[i];
    stage_ = "level " + std::to_string(i);
    for (const Resnet& r : level.resnets) {
      const int b = free_buffer(cur), c = free_buffer(cur, b);
      VORTEX_ASSIGN_OR_RETURN(Tensor normed, view_of(buffers_[b], x.shape()));
      VORTEX_RETURN_IF_ERROR(group_norm(x, r.norm1_weight, r.norm1_bias, normed));
      VORTEX_ASSIGN_OR_RETURN(Tensor h, conv_into(r.conv1, normed, c, clips));
      VORTEX_RETURN_IF_ERROR(group_norm(h, r.norm2_weight, r.norm2_bias, h));
      VORTEX_ASSIGN_OR_RETURN(Tensor body, conv_into(r.conv2, h, b, clips));
      Tensor residual = x;
      if (r.has_shortcut) {
        VORTEX_ASSIGN_OR_RETURN(residual, conv_into(r.conv_shortcut, x, c, clips));
      }
      VORTEX_ASSIGN_OR_RETURN(Tensor body_rows, rows_of(body));
      VORTEX_ASSIGN_OR_RETURN(Tensor residual_rows, rows_of(residual));
      {
        const std::string name = "residual, " + stage_;
        const cuda::SectionScope section(profiler_, name.c_str(), stream_);
        VORTEX_RETURN_IF_ERROR(cuda::residual_add(body_rows.view(), residual_rows.view(), stream_));
      }
      x = body;
      cur = b;
    }
    if (level.has_downsampler) {
      cur = free_buffer(cur);
      VORTEX_ASSIGN_OR_RETURN(x, conv_into(level.downsampler, x, cur, clips));
    }
    VORTEX_RETURN_IF_ERROR(emit("encoder.down_blocks." + std::to_string(i), x, first_chunk, clips));
  }
  return ok_status();
}

Result<std::vector<Tensor>> CudaVideoVaeEncoder::encode_chunks(const Tensor& clip,
                                                               const std::vector<PixelWindow>& windows,
                                                               const VideoEncoderObserver* observer) {
  VORTEX_RETURN_IF_ERROR(check_video_encoder_windows(config_, clip, windows));
  const int64_t count = static_cast<int64_t>(windows.size());
  std::vector<Tensor> out(windows.size());
  if (count == 0) return out;
  // Per chunk, what the observer is owed, in the CPU's order (the batch emits for all chunks at once).
  const bool observed = observer != nullptr && *observer;
  std::vector<std::vector<std::pair<std::string, Tensor>>> owed(windows.size());
  const Emit emit = [&](const std::string& name, const Tensor& x, int64_t first, int64_t clips) -> Status {
    if (!observed) return ok_status();
    VORTEX_ASSIGN_OR_RETURN(Tensor host, cuda::download(x, stream_));
    const int64_t frames = host.size(0) / clips;
    for (int64_t k = 0; k < clips; ++k) {
      VORTEX_ASSIGN_OR_RETURN(Tensor part, host.slice(0, k * frames, (k + 1) * frames));
      VORTEX_ASSIGN_OR_RETURN(Tensor channels_first, part.permute({3, 0, 1, 2}));
      owed[first + k].emplace_back(name, channels_first.contiguous());
    }
    return ok_status();
  };
  const int64_t C = clip.size(0), T = clip.size(1), H = windows[0].height, W = windows[0].width;
  const Shape window_shape{C, T, H, W};
  // Single frames (a keyframe's tiles) run as one batch; the tiles of a clip one at a time.
  const int64_t group = T == 1 ? count : 1;
  // The arena is sized once, for the first group: a later group is never larger (only the last
  // can be smaller), and growing the arena then would lose the uploaded clip.
  {
    VORTEX_ASSIGN_OR_RETURN(Plan largest, plan(window_shape, group));
    largest.clip_floats = clip.numel();
    VORTEX_RETURN_IF_ERROR(reserve(largest));
  }
  // The clip goes up once, as it is (channels first), and each window is gathered out of it
  // channels-last on the GPU: no host copies of the tiles (with their overlaps a clip's tiles are
  // 374 MB against its 210 MB) and no host permute (0.2-0.35 s a clip).
  VORTEX_ASSIGN_OR_RETURN(Tensor planes, view_of(clip_buffer_, clip.shape()));
  {
    const cuda::SectionScope section(profiler_, "pixels upload", stream_);
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device_staged(clip, planes, stream_));
  }
  for (int64_t g0 = 0; g0 < count; g0 += group) {
    const int64_t n = std::min(group, count - g0);
    VORTEX_ASSIGN_OR_RETURN(const Plan p, plan(window_shape, n));  // its batch level and input
    Tensor x;
    int cur = 0;
    for (int64_t k = 0; k < n; ++k) {
      const PixelWindow& window = windows[g0 + k];
      VORTEX_ASSIGN_OR_RETURN(Tensor px, view_of(pixels_buffer_, Shape{T, H, W, C}));
      {
        const cuda::SectionScope section(profiler_, "pixels gather", stream_);
        VORTEX_ASSIGN_OR_RETURN(Tensor pixel_rows, view_of(pixels_buffer_, Shape{T * H * W, C}));
        VORTEX_RETURN_IF_ERROR(
            cuda::gather_latent_tokens(planes.view(), 0, window.y0, window.x0, H, W, pixel_rows.view(), stream_));
      }
      cur = 0;
      stage_ = "conv_in";
      VORTEX_ASSIGN_OR_RETURN(x, conv_into(conv_in_, px, cur, 1));
      VORTEX_RETURN_IF_ERROR(emit("encoder.conv_in", x, g0 + k, 1));
      VORTEX_RETURN_IF_ERROR(run_levels(0, p.batch_level, x, cur, g0 + k, 1, emit));
      if (n > 1) {  // into the batch, chunk k's frames after the ones before it
        const size_t bytes = static_cast<size_t>(x.numel()) * sizeof(float);
        const cuda::SectionScope section(profiler_, "batch copies", stream_);
        VORTEX_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(batch_buffer_.data()) + k * bytes, x.data(), bytes,
                                          cudaMemcpyDeviceToDevice, stream_));
      }
    }
    if (n > 1) {
      VORTEX_ASSIGN_OR_RETURN(x, view_of(batch_buffer_, p.batch_input));
      cur = kBatchBuffer;
    }
    VORTEX_RETURN_IF_ERROR(run_levels(p.batch_level, levels_.size(), x, cur, g0, n, emit));
    const int b = free_buffer(cur), c = free_buffer(cur, b);
    stage_ = "output";
    VORTEX_ASSIGN_OR_RETURN(Tensor normed, view_of(buffers_[b], x.shape()));
    VORTEX_RETURN_IF_ERROR(group_norm(x, norm_out_weight_, norm_out_bias_, normed));
    VORTEX_ASSIGN_OR_RETURN(Tensor conv_out, conv_into(conv_out_, normed, c, n));
    VORTEX_RETURN_IF_ERROR(emit("encoder.conv_out", conv_out, g0, n));
    VORTEX_ASSIGN_OR_RETURN(Tensor moments, conv_into(quant_conv_, conv_out, free_buffer(c), n));
    VORTEX_RETURN_IF_ERROR(emit("quant_conv", moments, g0, n));
    VORTEX_ASSIGN_OR_RETURN(Tensor host, cuda::download(moments, stream_));
    const int64_t frames_out = host.size(0) / n;
    for (int64_t k = 0; k < n; ++k) {
      VORTEX_ASSIGN_OR_RETURN(Tensor part, host.slice(0, k * frames_out, (k + 1) * frames_out));
      VORTEX_ASSIGN_OR_RETURN(Tensor channels_first, part.permute({3, 0, 1, 2}));
      out[g0 + k] = channels_first.contiguous();
    }
  }
  for (const auto& chunk : owed) {
    for (const auto& [name, value] : chunk) (*observer)(name, value);
  }
  return out;
}

Result<Tensor> CudaVideoVaeEncoder::encode_moments(const Tensor& pixels, const VideoTiling& tiling,
                                                   const VideoEncoderObserver* observer) {
  const VideoChunkEncoder on_the_gpu = [&](const Tensor& clip, const std::vector<PixelWindow>& windows) {
    return encode_chunks(clip, windows, observer);
  };
  return encode_video_moments_with(config_, on_the_gpu, pixels, tiling, observer);
}

Result<Tensor> CudaVideoVaeEncoder::encode_moments(const Tensor& pixels) { return encode_moments(pixels, tiling_); }

}  // namespace vortex::vae
