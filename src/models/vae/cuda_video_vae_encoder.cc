// The video VAE encoder on the GPU (see cuda_video_vae_encoder.h): weights, the activation plan of
// a chunk, the causal convs as gathers and GEMMs, and encode_video_chunk's module order.
#include "models/vae/cuda_video_vae_encoder.h"

#include <algorithm>
#include <string>

#include "cuda/elementwise.h"
#include "cuda/vae_conv3d.h"

namespace vortex::vae {

namespace {

constexpr size_t kWorkspaceBytes = 64u << 20;
constexpr size_t kSlack = cuda::DeviceArena::kAlignment;
// The gather rows of one GEMM: at most 64 Mi floats (256 MB). A 256 x 256 tile's widest conv
// (128 channels, 9 real taps of a keyframe) needs 75 M of them, so it runs in two row blocks.
constexpr int64_t kGatherCapFloats = int64_t{1} << 26;

bool is_direct(const Conv3dGeometry& g) {
  return g.kt == 1 && g.kh == 1 && g.kw == 1 && g.st == 1 && g.sh == 1 && g.sw == 1 && g.pad_top == 0 &&
         g.pad_bottom == 0 && g.pad_left == 0 && g.pad_right == 0 && g.temporal_padding == 0;
}

// [T, H, W, C] out of a conv on x [T, H, W, C_in], with the CPU's refusals (conv3d.cc).
Result<Shape> conv_output_shape(int64_t out_channels, const Conv3dGeometry& g, const Shape& x) {
  const int64_t T = x[0], H = x[1], W = x[2];
  if (std::max(g.pad_top, g.pad_bottom) >= H || std::max(g.pad_left, g.pad_right) >= W) {
    return invalid_argument("conv3d: x " + x.to_string() + " is too small for reflect padding " +
                            std::to_string(std::max({g.pad_top, g.pad_bottom, g.pad_left, g.pad_right})) +
                            " (each padded axis must be longer than its pad)");
  }
  const int64_t T_out = conv3d_output_length(T, g.temporal_padding, 0, g.kt, g.st);
  const int64_t H_out = conv3d_output_length(H, g.pad_top, g.pad_bottom, g.kh, g.sh);
  const int64_t W_out = conv3d_output_length(W, g.pad_left, g.pad_right, g.kw, g.sw);
  if (T_out < 1 || H_out < 1 || W_out < 1) {
    return invalid_argument("conv3d: x " + x.to_string() + " is smaller than the kernel [" + std::to_string(g.kt) +
                            ", " + std::to_string(g.kh) + ", " + std::to_string(g.kw) + "]");
  }
  return Shape{T_out, H_out, W_out, out_channels};
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
                                                                         cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(cuda::require_hopper_device("the video VAE encoder on --device cuda"));
  std::unique_ptr<CudaVideoVaeEncoder> e(new CudaVideoVaeEncoder());
  e->config_ = vae.config;
  e->tiling_ = vae.tiling;
  e->stream_ = stream;
  VORTEX_RETURN_IF_ERROR(e->upload(vae));
  VORTEX_ASSIGN_OR_RETURN(e->workspace_, cuda::DeviceArena::create(kWorkspaceBytes + kSlack));
  VORTEX_ASSIGN_OR_RETURN(e->gemm_, cuda::GemmRunner::create(e->workspace_, kWorkspaceBytes));
  return e;
}

Status CudaVideoVaeEncoder::upload(const VideoVaeEncoder& vae) {
  // Every host tensor of the encoder, in module order: first to size the arena, then to copy.
  std::vector<const Tensor*> host;
  const auto conv_tensors = [&](const CausalConv3d& c) {
    host.push_back(&c.weight);
    host.push_back(&c.bias);
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
  VORTEX_ASSIGN_OR_RETURN(weights_, cuda::DeviceArena::create(bytes + kSlack));

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

Result<CudaVideoVaeEncoder::ChunkNeeds> CudaVideoVaeEncoder::chunk_needs(const Shape& pixels) const {
  ChunkNeeds needs;
  Shape s{pixels[1], pixels[2], pixels[3], pixels[0]};
  needs.activation_floats = s.numel();  // the pixels' buffer is one of the four
  const auto step = [&](const Conv& c) -> Status {
    VORTEX_ASSIGN_OR_RETURN(Shape out, conv_output_shape(c.out_channels, c.geometry, s));
    const Conv3dGeometry& g = c.geometry;
    if (!is_direct(g)) {
      needs.gather_floats = std::max(needs.gather_floats, out[1] * out[2] * g.kt * g.kh * g.kw * c.in_channels);
    }
    needs.activation_floats = std::max(needs.activation_floats, out.numel());
    needs.frames = std::max(needs.frames, out[0]);
    s = out;
    return ok_status();
  };
  VORTEX_RETURN_IF_ERROR(step(conv_in_));
  for (const Level& level : levels_) {
    for (const Resnet& r : level.resnets) {
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
    if (level.has_downsampler) VORTEX_RETURN_IF_ERROR(step(level.downsampler));
  }
  VORTEX_RETURN_IF_ERROR(step(conv_out_));
  VORTEX_RETURN_IF_ERROR(step(quant_conv_));
  return needs;
}

Status CudaVideoVaeEncoder::reserve(const ChunkNeeds& needs) {
  if (needs.activation_floats <= reserved_.activation_floats && needs.gather_floats <= reserved_.gather_floats &&
      needs.frames <= reserved_.frames && pixels_buffer_.defined()) {
    return ok_status();
  }
  ChunkNeeds n{std::max(needs.activation_floats, reserved_.activation_floats),
               std::max(needs.gather_floats, reserved_.gather_floats), std::max(needs.frames, reserved_.frames)};
  const Shape activation{n.activation_floats}, gather{std::min(n.gather_floats, kGatherCapFloats)};
  const Shape scratch{cuda::frame_group_norm_scratch(n.frames, config_.norm_num_groups)};
  const size_t bytes = 4 * cuda::DeviceArena::bytes_for(activation, DType::kF32) +
                       cuda::DeviceArena::bytes_for(gather, DType::kF32) +
                       cuda::DeviceArena::bytes_for(scratch, DType::kF64) + 8 * kSlack;
  for (Tensor& b : buffers_) b = Tensor();
  pixels_buffer_ = gather_buffer_ = norm_scratch_ = Tensor();
  activations_ = cuda::DeviceArena();
  VORTEX_ASSIGN_OR_RETURN(activations_, cuda::DeviceArena::create(bytes));
  for (Tensor& b : buffers_) {
    VORTEX_ASSIGN_OR_RETURN(b, activations_.alloc(activation, DType::kF32));
  }
  VORTEX_ASSIGN_OR_RETURN(pixels_buffer_, activations_.alloc(activation, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(gather_buffer_, activations_.alloc(gather, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(norm_scratch_, activations_.alloc(scratch, DType::kF64));
  reserved_ = n;
  return ok_status();
}

Status CudaVideoVaeEncoder::conv(const Conv& c, const Tensor& x, Tensor& y) {
  const Conv3dGeometry& g = c.geometry;
  const int64_t C = c.in_channels, O = c.out_channels;
  VORTEX_ASSIGN_OR_RETURN(Tensor y_rows, rows_of(y));
  if (is_direct(g)) {
    VORTEX_ASSIGN_OR_RETURN(Tensor x_rows, rows_of(x));
    const TensorView bias = c.bias.view();
    return gemm_->linear(x_rows.view(), c.weight.view(), &bias, y_rows.view(), stream_);
  }
  const int64_t T_out = y.size(0), H_out = y.size(1), W_out = y.size(2), plane = H_out * W_out;
  const int64_t spatial = g.kh * g.kw, KC = g.kt * spatial * C;
  const cuda::Conv3dTaps taps{g.kt, g.kh, g.kw, g.st, g.sh, g.sw, g.pad_top, g.pad_left, g.temporal_padding};
  const TensorView bias = c.bias.view();
  for (int64_t f = 0; f < T_out; ++f) {
    // Temporal taps [a0, kt) read real frames; the ones before read the causal zeros.
    const int64_t a0 = std::clamp<int64_t>(g.temporal_padding - f * g.st, 0, g.kt);
    if (a0 == g.kt) return internal_error("video VAE encoder: an output frame reads only causal zeros");
    const int64_t k_begin = a0 * spatial * C, k_len = KC - k_begin;
    const int64_t block_rows = std::min(plane, std::max<int64_t>(1, gather_buffer_.numel() / k_len));
    TensorView w = c.weight.view();
    w.data = static_cast<float*>(w.data) + k_begin;
    w.shape = Shape{O, k_len};
    for (int64_t r0 = 0; r0 < plane; r0 += block_rows) {
      const int64_t rows = std::min(block_rows, plane - r0);
      VORTEX_ASSIGN_OR_RETURN(Tensor cols, view_of(gather_buffer_, {rows, k_len}));
      VORTEX_RETURN_IF_ERROR(cuda::conv3d_gather(x.view(), taps, H_out, W_out, f, a0, r0, cols.view(), stream_));
      VORTEX_ASSIGN_OR_RETURN(Tensor out, y_rows.slice(0, f * plane + r0, f * plane + r0 + rows));
      VORTEX_RETURN_IF_ERROR(gemm_->linear(cols.view(), w, &bias, out.view(), stream_));
    }
  }
  return ok_status();
}

Result<Tensor> CudaVideoVaeEncoder::conv_output(const Conv& c, const Tensor& x, int which) {
  VORTEX_ASSIGN_OR_RETURN(Shape shape, conv_output_shape(c.out_channels, c.geometry, x.shape()));
  VORTEX_ASSIGN_OR_RETURN(Tensor y, view_of(buffers_[which], shape));
  VORTEX_RETURN_IF_ERROR(conv(c, x, y));
  return y;
}

Status CudaVideoVaeEncoder::group_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y) {
  return cuda::frame_group_norm(x.view(), weight.view(), bias.view(), config_.norm_num_groups, config_.norm_eps,
                                /*silu=*/true, norm_scratch_.view(), y.view(), stream_);
}

Result<Tensor> CudaVideoVaeEncoder::encode_chunk(const Tensor& pixels, const VideoEncoderObserver* observer) {
  VORTEX_RETURN_IF_ERROR(check_video_encoder_pixels(config_, pixels));
  VORTEX_ASSIGN_OR_RETURN(ChunkNeeds needs, chunk_needs(pixels.shape()));
  VORTEX_RETURN_IF_ERROR(reserve(needs));
  const bool observed = observer != nullptr && *observer;
  const auto emit = [&](const std::string& name, const Tensor& x) -> Status {
    if (!observed) return ok_status();
    VORTEX_ASSIGN_OR_RETURN(Tensor host, cuda::download(x, stream_));
    VORTEX_ASSIGN_OR_RETURN(Tensor channels_first, host.permute({3, 0, 1, 2}));
    (*observer)(name, channels_first.contiguous());
    return ok_status();
  };

  VORTEX_ASSIGN_OR_RETURN(Tensor channels_last, pixels.permute({1, 2, 3, 0}));
  VORTEX_ASSIGN_OR_RETURN(Tensor px, view_of(pixels_buffer_, channels_last.shape()));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(channels_last.contiguous(), px, stream_));
  int cur = 0;
  VORTEX_ASSIGN_OR_RETURN(Tensor x, conv_output(conv_in_, px, cur));
  VORTEX_RETURN_IF_ERROR(emit("encoder.conv_in", x));
  for (size_t i = 0; i < levels_.size(); ++i) {
    const Level& level = levels_[i];
    for (const Resnet& r : level.resnets) {
      const int b = (cur + 1) % 3, c = (cur + 2) % 3;
      VORTEX_ASSIGN_OR_RETURN(Tensor normed, view_of(buffers_[b], x.shape()));
      VORTEX_RETURN_IF_ERROR(group_norm(x, r.norm1_weight, r.norm1_bias, normed));
      VORTEX_ASSIGN_OR_RETURN(Tensor h, conv_output(r.conv1, normed, c));
      VORTEX_RETURN_IF_ERROR(group_norm(h, r.norm2_weight, r.norm2_bias, h));
      VORTEX_ASSIGN_OR_RETURN(Tensor body, conv_output(r.conv2, h, b));
      Tensor residual = x;
      if (r.has_shortcut) {
        VORTEX_ASSIGN_OR_RETURN(residual, conv_output(r.conv_shortcut, x, c));
      }
      VORTEX_ASSIGN_OR_RETURN(Tensor body_rows, rows_of(body));
      VORTEX_ASSIGN_OR_RETURN(Tensor residual_rows, rows_of(residual));
      VORTEX_RETURN_IF_ERROR(cuda::residual_add(body_rows.view(), residual_rows.view(), stream_));
      x = body;
      cur = b;
    }
    if (level.has_downsampler) {
      cur = (cur + 1) % 3;
      VORTEX_ASSIGN_OR_RETURN(x, conv_output(level.downsampler, x, cur));
    }
    VORTEX_RETURN_IF_ERROR(emit("encoder.down_blocks." + std::to_string(i), x));
  }
  const int b = (cur + 1) % 3, c = (cur + 2) % 3;
  VORTEX_ASSIGN_OR_RETURN(Tensor normed, view_of(buffers_[b], x.shape()));
  VORTEX_RETURN_IF_ERROR(group_norm(x, norm_out_weight_, norm_out_bias_, normed));
  VORTEX_ASSIGN_OR_RETURN(Tensor out, conv_output(conv_out_, normed, c));
  VORTEX_RETURN_IF_ERROR(emit("encoder.conv_out", out));
  VORTEX_ASSIGN_OR_RETURN(Tensor moments, conv_output(quant_conv_, out, cur));
  VORTEX_RETURN_IF_ERROR(emit("quant_conv", moments));
  VORTEX_ASSIGN_OR_RETURN(Tensor host, cuda::download(moments, stream_));
  VORTEX_ASSIGN_OR_RETURN(Tensor channels_first, host.permute({3, 0, 1, 2}));
  return channels_first.contiguous();
}

Result<Tensor> CudaVideoVaeEncoder::encode_moments(const Tensor& pixels, const VideoTiling& tiling,
                                                   const VideoEncoderObserver* observer) {
  return encode_video_moments_with(
      config_, [&](const Tensor& chunk) { return encode_chunk(chunk, observer); }, pixels, tiling, observer);
}

Result<Tensor> CudaVideoVaeEncoder::encode_moments(const Tensor& pixels) { return encode_moments(pixels, tiling_); }

}  // namespace vortex::vae
