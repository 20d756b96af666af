// The audio VAE decoder on the GPU (see cuda_audio_vae.h).
//
// Device memory of the canonical decode (207 latents x 2 channels -> 2 x 165,600 samples, 5.175 s
// at 32 kHz, release config), from cuda_audio_vae_memory (tests/gpu/test_gpu_audio_vae.cc prints
// it): weights 0.260 GB (fp32, weight norm fused), activations 0.191 GB, cuBLASLt workspace
// 0.067 GB: 0.52 GB in all. The activations are five stage buffers of 2.65 M floats, the 117 MB
// im2col of an 11-tap convolution (2·T rows of 11·C values, the same at every stage after the
// first) and the upsamplers' product.
#include "models/vae/cuda_audio_vae.h"

#include <algorithm>

#include "cuda/elementwise.h"
#include "cuda/vae_conv1d.h"
#include "cuda/vae_pointwise.h"
#include "models/vae/resample.h"

namespace vortex::vae {

namespace {

static_assert(cuda::kSnakeRatio == kAliasFreeRatio, "the fused snake resamples by the decoder's ratio");

constexpr size_t kWorkspaceBytes = 64u << 20;
constexpr size_t kSlack = cuda::DeviceArena::kAlignment;

size_t aligned_floats(int64_t n) { return (static_cast<size_t>(n) * 4 + kSlack - 1) / kSlack * kSlack; }

size_t aligned_bytes(const Tensor& t) {
  return t.defined() ? (t.nbytes() + kSlack - 1) / kSlack * kSlack : 0;
}

// Element counts a decode of A latents needs: the largest [B, T, C] tensor, the im2col scratch of
// the largest convolution (capped by the budget: larger ones run in row blocks), the largest
// transposed-convolution product. `D` is AudioDecoderWeights or the device decoder (same member
// names); the fused snake keeps lengths (12-tap filters, the schema's), so only convolutions count.
struct AudioPlan {
  int64_t stage = 0, columns = 0, product = 0;
};

template <class D>
Result<AudioPlan> plan_audio(const D& d, int kernels, int64_t batch, int64_t frames, int64_t budget_floats) {
  AudioPlan p;
  int64_t T = frames;
  const auto conv = [&](const Conv1dShape& k, int64_t length) -> Result<int64_t> {
    const int64_t out = conv1d_output_length(k, length);
    if (out < 1) return invalid_argument("audio latents: " + std::to_string(frames) + " frames are too few to decode");
    p.stage = std::max(p.stage, batch * out * k.out_channels);
    p.columns = std::max(p.columns, conv1d_columns_floats(k, batch * out, budget_floats));
    return out;
  };
  VORTEX_ASSIGN_OR_RETURN(T, conv(d.dec_in_proj.shape, T));
  VORTEX_ASSIGN_OR_RETURN(T, conv(d.conv_pre.shape, T));
  for (size_t i = 0; i < d.ups.size(); ++i) {
    const ConvTranspose1dShape& s = d.ups[i].shape;
    p.product = std::max(p.product, batch * T * s.kernel * s.out_channels);
    T = conv_transpose1d_output_length(s, T);
    p.stage = std::max(p.stage, batch * T * s.out_channels);
    for (int j = 0; j < kernels; ++j) {
      const auto& amp = d.resblocks[i * kernels + j];
      for (size_t m = 0; m < amp.convs1.size(); ++m) {
        VORTEX_ASSIGN_OR_RETURN(const int64_t inner, conv(amp.convs1[m].shape, T));
        VORTEX_ASSIGN_OR_RETURN(const int64_t out, conv(amp.convs2[m].shape, inner));
        if (out != T) return internal_error("audio AMP block changes the length " + std::to_string(T));
      }
    }
  }
  VORTEX_ASSIGN_OR_RETURN(T, conv(d.conv_post.shape, T));
  return p;
}

size_t activation_bytes(const AudioPlan& p, int64_t latent_elements) {
  return aligned_floats(latent_elements) + 5 * aligned_floats(p.stage) +
         aligned_floats(std::max<int64_t>(p.columns, 1)) + aligned_floats(std::max<int64_t>(p.product, 1));
}

Result<Tensor> shaped(const Tensor& flat, int64_t b, int64_t t, int64_t c) {
  if (b * t * c > flat.numel()) return internal_error("audio stage buffer too small for [" + std::to_string(b) + ", " +
                                                      std::to_string(t) + ", " + std::to_string(c) + "]");
  VORTEX_ASSIGN_OR_RETURN(Tensor s, flat.slice(0, 0, b * t * c));
  return s.reshape({b, t, c});
}

size_t decoder_weight_bytes(const AudioDecoderWeights& d) {
  const auto conv_bytes = [](const auto& k) { return aligned_bytes(k.weight) + aligned_bytes(k.bias); };
  const auto snake_bytes = [](const AliasFreeSnake& s) { return 2 * aligned_floats(s.snake.channels()); };
  size_t bytes = conv_bytes(d.dec_in_proj) + conv_bytes(d.conv_pre) + conv_bytes(d.conv_post) +
                 snake_bytes(d.activation_post);
  for (const auto& u : d.ups) bytes += conv_bytes(u);
  for (const auto& amp : d.resblocks) {
    for (size_t i = 0; i < amp.convs1.size(); ++i) bytes += conv_bytes(amp.convs1[i]) + conv_bytes(amp.convs2[i]);
    for (const auto& a : amp.acts) bytes += snake_bytes(a);
  }
  return bytes;
}

}  // namespace

Result<DeviceConv1d> upload_conv1d(const Conv1d& conv, cuda::DeviceArena& arena, cudaStream_t stream) {
  DeviceConv1d out;
  out.shape = conv.shape;
  VORTEX_ASSIGN_OR_RETURN(out.weight, cuda::upload(conv.weight.contiguous(), arena, stream));
  if (conv.bias.defined()) {
    VORTEX_ASSIGN_OR_RETURN(out.bias, cuda::upload(conv.bias.contiguous(), arena, stream));
  }
  return out;
}

Status run_conv1d(cuda::GemmRunner& gemm, const DeviceConv1d& conv, const Tensor& x, const Tensor& columns,
                  const Tensor& y, cudaStream_t stream) {
  const Conv1dShape& s = conv.shape;
  const TensorView bias = conv.bias.defined() ? conv.bias.view() : TensorView();
  const cuda::Conv1dGeometry geometry{s.kernel, s.stride, s.dilation, s.padding, y.size(1)};
  return cuda::conv1d(gemm, x.view(), geometry, conv.weight.view(), conv.bias.defined() ? &bias : nullptr,
                      columns.view(), y.view(), stream);
}

int64_t conv1d_columns_floats(const Conv1dShape& s, int64_t rows, int64_t budget_floats) {
  if (s.kernel == 1 && s.stride == 1 && s.padding == 0) return 0;
  const int64_t width = s.kernel * s.in_channels;
  return std::min(rows, std::max<int64_t>(1, budget_floats / width)) * width;
}

Result<CudaAudioVaeMemory> cuda_audio_vae_memory(const AudioVae& vae, int64_t latent_frames,
                                                 const CudaAudioVaeOptions& options) {
  VORTEX_RETURN_IF_ERROR(check_audio_latent_shape(vae.config, {2, latent_frames, vae.config.latent_channels}));
  VORTEX_ASSIGN_OR_RETURN(const AudioPlan p, plan_audio(vae.decoder, vae.config.num_kernels(), 2, latent_frames,
                                                        static_cast<int64_t>(options.im2col_budget_bytes / 4)));
  CudaAudioVaeMemory m;
  m.weights = decoder_weight_bytes(vae.decoder);
  m.activations = activation_bytes(p, 2 * latent_frames * vae.config.latent_channels);
  m.workspace = kWorkspaceBytes + kSlack;
  return m;
}

Result<std::unique_ptr<CudaAudioVae>> CudaAudioVae::create(const AudioVae& vae, const CudaAudioVaeOptions& options,
                                                           cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(vae.config.validate());
  if (options.im2col_budget_bytes < 4) return invalid_argument("audio VAE on CUDA: im2col budget below one float");
  std::unique_ptr<CudaAudioVae> model(new CudaAudioVae());
  model->config_ = vae.config;
  model->options_ = options;
  model->stream_ = stream;
  VORTEX_RETURN_IF_ERROR(model->upload(vae));
  VORTEX_ASSIGN_OR_RETURN(model->workspace_, cuda::DeviceArena::create(kWorkspaceBytes + kSlack));
  VORTEX_ASSIGN_OR_RETURN(model->gemm_, cuda::GemmRunner::create(model->workspace_, kWorkspaceBytes));
  return model;
}

Status CudaAudioVae::upload(const AudioVae& vae) {
  VORTEX_ASSIGN_OR_RETURN(weights_, cuda::DeviceArena::create(decoder_weight_bytes(vae.decoder) + kSlack));
  const auto tensor = [&](const Tensor& host) -> Result<Tensor> {
    if (!host.defined()) return Tensor();
    return cuda::upload(host.contiguous(), weights_, stream_);
  };
  const auto conv = [&](const Conv1d& k) { return upload_conv1d(k, weights_, stream_); };
  const auto snake = [&](const AliasFreeSnake& a) -> Result<Snake> {
    Snake s;
    const int64_t C = a.snake.channels();
    VORTEX_ASSIGN_OR_RETURN(s.frequency, tensor(Tensor::from_f32(a.snake.frequency, {C})));
    VORTEX_ASSIGN_OR_RETURN(s.magnitude, tensor(Tensor::from_f32(a.snake.magnitude, {C})));
    VORTEX_ASSIGN_OR_RETURN(s.filters, cuda::make_snake_filters(a.up_filter, a.down_filter));
    return s;
  };
  const AudioDecoderWeights& d = vae.decoder;
  VORTEX_ASSIGN_OR_RETURN(decoder_.dec_in_proj, conv(d.dec_in_proj));
  VORTEX_ASSIGN_OR_RETURN(decoder_.conv_pre, conv(d.conv_pre));
  for (const ConvTranspose1d& u : d.ups) {
    ConvTranspose t;
    t.shape = u.shape;
    VORTEX_ASSIGN_OR_RETURN(t.weight, tensor(u.weight));
    VORTEX_ASSIGN_OR_RETURN(t.bias, tensor(u.bias));
    decoder_.ups.push_back(std::move(t));
  }
  for (const AmpBlock& block : d.resblocks) {
    Amp amp;
    for (size_t m = 0; m < block.convs1.size(); ++m) {
      VORTEX_ASSIGN_OR_RETURN(Conv c1, conv(block.convs1[m]));
      VORTEX_ASSIGN_OR_RETURN(Conv c2, conv(block.convs2[m]));
      amp.convs1.push_back(std::move(c1));
      amp.convs2.push_back(std::move(c2));
    }
    for (const AliasFreeSnake& a : block.acts) {
      VORTEX_ASSIGN_OR_RETURN(Snake s, snake(a));
      amp.acts.push_back(std::move(s));
    }
    decoder_.resblocks.push_back(std::move(amp));
  }
  VORTEX_ASSIGN_OR_RETURN(decoder_.activation_post, snake(d.activation_post));
  VORTEX_ASSIGN_OR_RETURN(decoder_.conv_post, conv(d.conv_post));
  return ok_status();
}

Status CudaAudioVae::conv_transpose(const ConvTranspose& c, const Tensor& x, const Tensor& y) {
  const int64_t B = x.size(0), T = x.size(1), K = c.shape.kernel, O = c.shape.out_channels;
  VORTEX_ASSIGN_OR_RETURN(Tensor x2, x.reshape({B * T, c.shape.in_channels}));
  VORTEX_ASSIGN_OR_RETURN(Tensor flat, buffers_.product.slice(0, 0, B * T * K * O));
  VORTEX_ASSIGN_OR_RETURN(Tensor z, flat.reshape({B * T, K * O}));
  VORTEX_RETURN_IF_ERROR(gemm_->linear(x2.view(), c.weight.view(), nullptr, z.view(), stream_));
  const float* bias = c.bias.defined() ? c.bias.data_as<float>() : nullptr;
  return cuda::conv_transpose1d_overlap_add(z.view(), B, K, c.shape.stride, c.shape.padding, bias, y.view(), stream_);
}

Status CudaAudioVae::snake(const Snake& s, const Tensor& x, const Tensor& y) {
  if (s.frequency.numel() != x.size(2)) {
    return internal_error("audio snake has " + std::to_string(s.frequency.numel()) + " channels, its input " +
                          x.describe());
  }
  return cuda::alias_free_snake(x.view(), s.frequency.data_as<float>(), s.magnitude.data_as<float>(), s.filters,
                                y.view(), stream_);
}

Result<Tensor> CudaAudioVae::decode(const Tensor& latents) {
  VORTEX_ASSIGN_OR_RETURN(Tensor wave, decode_on_device(latents));
  return cuda::download(wave, stream_);
}

Result<Tensor> CudaAudioVae::decode_on_device(const Tensor& latents) {
  const AudioVaeConfig& c = config_;
  VORTEX_RETURN_IF_ERROR(validate_audio_latents(c, latents));
  if (static_cast<int64_t>(c.latents_mean.size()) != c.latent_channels ||
      static_cast<int64_t>(c.latents_std.size()) != c.latent_channels) {
    return invalid_argument("audio VAE config: latents_mean / latents_std must have latent_channels entries");
  }
  const int64_t B = latents.size(0), A = latents.size(1), Cl = c.latent_channels;
  // The pipeline's de-normalisation on the host, as decode_audio does it (fp32, two roundings).
  Tensor x = latents.dtype() == DType::kF32 ? latents.clone() : latents.contiguous().to(DType::kF32).value();
  float* xd = x.data_as<float>();
  for (int64_t r = 0; r < B * A; ++r) {
    for (int64_t k = 0; k < Cl; ++k) xd[r * Cl + k] = xd[r * Cl + k] * c.latents_std[k] + c.latents_mean[k];
  }

  // The activation arena for this length: made (or grown) once per length.
  VORTEX_ASSIGN_OR_RETURN(const AudioPlan plan, plan_audio(decoder_, c.num_kernels(), B, A,
                                                           static_cast<int64_t>(options_.im2col_budget_bytes / 4)));
  const size_t needed = activation_bytes(plan, x.numel());
  if (activations_.capacity() < needed) {
    activations_ = cuda::DeviceArena();  // free the smaller one first
    VORTEX_ASSIGN_OR_RETURN(activations_, cuda::DeviceArena::create(needed));
  }
  activations_.release_to(0);
  Buffers& buf = buffers_;
  VORTEX_ASSIGN_OR_RETURN(buf.latents, activations_.alloc(x.shape(), DType::kF32));
  for (Tensor& stage : buf.stage) {
    VORTEX_ASSIGN_OR_RETURN(stage, activations_.alloc({plan.stage}, DType::kF32));
  }
  VORTEX_ASSIGN_OR_RETURN(buf.columns, activations_.alloc({std::max<int64_t>(plan.columns, 1)}, DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(buf.product, activations_.alloc({std::max<int64_t>(plan.product, 1)}, DType::kF32));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(x, buf.latents, stream_));

  // Stage buffers: 0 the upsampler's output (read by every AMP block of the stage), 1 and 2 an AMP
  // block's running value and its next one, 3 the activations, 4 the stage's sum of blocks.
  const auto run_conv = [&](const Conv& k, const Tensor& in, const Tensor& flat) -> Result<Tensor> {
    const int64_t T_out = conv1d_output_length(k.shape, in.size(1));
    VORTEX_ASSIGN_OR_RETURN(Tensor y, shaped(flat, B, T_out, k.shape.out_channels));
    VORTEX_RETURN_IF_ERROR(run_conv1d(*gemm_, k, in, buf.columns, y, stream_));
    return y;
  };
  const auto run_snake = [&](const Snake& s, const Tensor& in) -> Result<Tensor> {
    VORTEX_ASSIGN_OR_RETURN(Tensor y, shaped(buf.stage[3], B, cuda::alias_free_snake_length(s.filters, in.size(1)),
                                             in.size(2)));
    VORTEX_RETURN_IF_ERROR(snake(s, in, y));
    return y;
  };
  const auto rows = [](const Tensor& t) { return t.reshape({t.size(0) * t.size(1), t.size(2)}); };
  const Decoder& d = decoder_;
  VORTEX_ASSIGN_OR_RETURN(Tensor h, run_conv(d.dec_in_proj, buf.latents, buf.stage[1]));
  VORTEX_ASSIGN_OR_RETURN(h, run_conv(d.conv_pre, h, buf.stage[2]));
  const int kernels = c.num_kernels();
  for (size_t i = 0; i < d.ups.size(); ++i) {
    const ConvTranspose& up = d.ups[i];
    const int64_t T = conv_transpose1d_output_length(up.shape, h.size(1)), C = up.shape.out_channels;
    VORTEX_ASSIGN_OR_RETURN(const Tensor in, shaped(buf.stage[0], B, T, C));
    VORTEX_RETURN_IF_ERROR(conv_transpose(up, h, in));
    VORTEX_ASSIGN_OR_RETURN(const Tensor sum, shaped(buf.stage[4], B, T, C));
    VORTEX_ASSIGN_OR_RETURN(const Tensor sum_rows, rows(sum));
    for (int j = 0; j < kernels; ++j) {
      const Amp& amp = d.resblocks[i * kernels + j];
      Tensor cur = in;
      int next = 1;
      for (size_t m = 0; m < amp.convs1.size(); ++m) {
        VORTEX_ASSIGN_OR_RETURN(Tensor a, run_snake(amp.acts[2 * m], cur));
        VORTEX_ASSIGN_OR_RETURN(Tensor r, run_conv(amp.convs1[m], a, buf.stage[next]));
        VORTEX_ASSIGN_OR_RETURN(a, run_snake(amp.acts[2 * m + 1], r));
        VORTEX_ASSIGN_OR_RETURN(r, run_conv(amp.convs2[m], a, buf.stage[next]));
        if (r.shape() != cur.shape()) {
          return internal_error("audio AMP block: residual " + r.describe() + " does not match " + cur.describe());
        }
        VORTEX_ASSIGN_OR_RETURN(const Tensor r_rows, rows(r));
        VORTEX_ASSIGN_OR_RETURN(const Tensor cur_rows, rows(cur));
        VORTEX_RETURN_IF_ERROR(cuda::residual_add(r_rows.view(), cur_rows.view(), stream_));
        cur = r;
        next = 3 - next;
      }
      if (j == 0) {
        VORTEX_CUDA_CHECK(cudaMemcpyAsync(sum.data(), cur.data(), sum.nbytes(), cudaMemcpyDeviceToDevice, stream_));
      } else {
        VORTEX_ASSIGN_OR_RETURN(const Tensor cur_rows, rows(cur));
        VORTEX_RETURN_IF_ERROR(cuda::residual_add(sum_rows.view(), cur_rows.view(), stream_));
      }
    }
    // The reference divides by the block count (not a multiply by its reciprocal).
    VORTEX_RETURN_IF_ERROR(cuda::divide_by(sum.view(), static_cast<float>(kernels), stream_));
    h = sum;
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor a, run_snake(d.activation_post, h));
  VORTEX_ASSIGN_OR_RETURN(Tensor wave, run_conv(d.conv_post, a, buf.stage[1]));
  VORTEX_RETURN_IF_ERROR(cuda::clamp(wave.view(), -1.0f, 1.0f, stream_));
  return wave.reshape({B, wave.size(1) * wave.size(2)});
}

}  // namespace vortex::vae
