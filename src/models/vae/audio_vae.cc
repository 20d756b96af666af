// The audio VAE decoder forward (CPU, fp32): de-normalisation, dec_in_proj and BigVGAN.
#include "models/vae/audio_vae.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "models/vae/resample.h"

namespace vortex::vae {

namespace {

constexpr int64_t kElementGrain = 16384;

struct Emitter {
  const AudioVaeObserver* observer = nullptr;
  void operator()(const std::string& name, const Tensor& value) const {
    if (observer != nullptr && *observer) (*observer)(name, value);
  }
};

// a += b, elementwise (same shape, contiguous F32).
void add_into(Tensor& a, const Tensor& b) {
  float* ad = a.data_as<float>();
  const float* bd = b.data_as<const float>();
  parallel_for(
      0, a.numel(),
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) ad[i] = ad[i] + bd[i];
      },
      kElementGrain);
}

// Upsample 2x, SnakeBeta, downsample 2x.
Result<Tensor> alias_free_snake(const AliasFreeSnake& a, const Tensor& x, const Emitter& emit,
                                const std::string& name) {
  VORTEX_ASSIGN_OR_RETURN(Tensor up, upsample_1d(x, a.up_filter, kAliasFreeRatio));
  emit(name + ".upsample", up);
  VORTEX_RETURN_IF_ERROR(apply_snake(a.snake, up));
  emit(name + ".act", up);
  VORTEX_ASSIGN_OR_RETURN(Tensor down, lowpass_downsample_1d(up, a.down_filter, kAliasFreeRatio));
  emit(name, down);
  return down;
}

// BigVGAN's AMPBlock1: per dilation, h = conv2(act2(conv1(act1(h)))) + h.
Result<Tensor> amp_block(const AmpBlock& block, const Tensor& x, const Emitter& emit, const std::string& name) {
  Tensor h = x;
  for (size_t m = 0; m < block.dilations.size(); ++m) {
    const std::string act = name + ".activations.";
    VORTEX_ASSIGN_OR_RETURN(Tensor r, alias_free_snake(block.acts[2 * m], h, emit, act + std::to_string(2 * m)));
    VORTEX_ASSIGN_OR_RETURN(r, conv1d(block.convs1[m], r));
    emit(name + ".convs1." + std::to_string(m), r);
    VORTEX_ASSIGN_OR_RETURN(r, alias_free_snake(block.acts[2 * m + 1], r, emit, act + std::to_string(2 * m + 1)));
    VORTEX_ASSIGN_OR_RETURN(r, conv1d(block.convs2[m], r));
    emit(name + ".convs2." + std::to_string(m), r);
    if (r.shape() != h.shape()) {
      return internal_error(name + ": residual " + r.describe() + " does not match " + h.describe());
    }
    add_into(r, h);
    h = std::move(r);
  }
  return h;
}

}  // namespace

Result<Tensor> decode_audio_latents(const AudioVae& vae, const Tensor& latents, const AudioVaeObserver* observer) {
  const AudioVaeConfig& c = vae.config;
  const AudioDecoderWeights& d = vae.decoder;
  if (!latents.defined() || latents.dtype() != DType::kF32 || latents.rank() != 3 || !latents.is_contiguous() ||
      latents.device() != Device::kCpu) {
    return invalid_argument("latents: " + (latents.defined() ? latents.describe() : std::string("(undefined)")) +
                            " must be a contiguous F32 CPU tensor [B, T, latent_channels]");
  }
  if (latents.size(2) != c.latent_channels || latents.size(1) < 1) {
    return invalid_argument("latents: " + latents.describe() + " must be [B, T >= 1, " +
                            std::to_string(c.latent_channels) + "]");
  }
  const Emitter emit{observer};
  emit("latents", latents);
  VORTEX_ASSIGN_OR_RETURN(Tensor h, conv1d(d.dec_in_proj, latents));
  emit("dec_in_proj", h);
  VORTEX_ASSIGN_OR_RETURN(h, conv1d(d.conv_pre, h));
  emit("decoder.conv_pre", h);
  const int kernels = c.num_kernels();
  for (int i = 0; i < c.num_upsamples(); ++i) {
    VORTEX_ASSIGN_OR_RETURN(h, conv_transpose1d(d.ups[i], h));
    emit("decoder.ups." + std::to_string(i), h);
    Tensor sum;
    for (int j = 0; j < kernels; ++j) {
      const int n = i * kernels + j;
      const std::string name = "decoder.resblocks." + std::to_string(n);
      VORTEX_ASSIGN_OR_RETURN(Tensor block, amp_block(d.resblocks[n], h, emit, name));
      emit(name, block);
      if (j == 0) {
        sum = std::move(block);
      } else {
        add_into(sum, block);
      }
    }
    // The reference divides (not multiplies by the reciprocal): the same rounding here.
    const float count = static_cast<float>(kernels);
    float* sd = sum.data_as<float>();
    parallel_for(
        0, sum.numel(),
        [&](int64_t i0, int64_t i1) {
          for (int64_t k = i0; k < i1; ++k) sd[k] = sd[k] / count;
        },
        kElementGrain);
    h = std::move(sum);
    emit("decoder.stage." + std::to_string(i), h);
  }
  VORTEX_ASSIGN_OR_RETURN(h, alias_free_snake(d.activation_post, h, emit, "decoder.activation_post"));
  VORTEX_ASSIGN_OR_RETURN(h, conv1d(d.conv_post, h));
  emit("decoder.conv_post", h);
  VORTEX_ASSIGN_OR_RETURN(Tensor wave, h.reshape({h.size(0), h.size(1)}));
  float* wd = wave.data_as<float>();
  for (int64_t k = 0; k < wave.numel(); ++k) wd[k] = std::clamp(wd[k], -1.0f, 1.0f);  // NaN stays NaN, as torch.clamp
  emit("waveform", wave);
  return wave;
}

Status check_audio_latent_shape(const AudioVaeConfig& c, const Shape& shape, const std::string& name) {
  const int64_t C = c.latent_channels;
  const std::string expected = "[2 (stereo), A (frames), " + std::to_string(C) + " (latent channels)]";
  const std::string is = name + ": shape " + shape.to_string();
  if (shape.rank() != 3) {
    if (shape.rank() == 2 && shape[1] == C && shape[0] % 2 == 0) {
      return invalid_argument(is + " must have rank 3: " + expected + "; these look like the packed [2·A, " +
                              std::to_string(C) + "] rows, to be reshaped to [2, A, " + std::to_string(C) + "]");
    }
    return invalid_argument(is + " must have rank 3: " + expected);
  }
  if (shape[0] != 2) {
    const std::string hint = shape[1] == 2 ? " (it looks frame-major [A, 2, C]; stereo comes first)" : "";
    return invalid_argument(is + ": stereo dim (dim 0) must be 2 (left rows then right rows), expected " + expected +
                            hint);
  }
  if (shape[2] != C) {
    const std::string hint = shape[1] == C ? " (it looks channel-first [2, C, A]; channels come last)" : "";
    return invalid_argument(is + ": channel dim (dim 2) must be latent_channels = " + std::to_string(C) + hint);
  }
  if (shape[1] < 1) return invalid_argument(is + ": frame dim (dim 1) is empty");
  return ok_status();
}

Status validate_audio_latents(const AudioVaeConfig& c, const Tensor& latents, const std::string& name) {
  if (!latents.defined()) return invalid_argument(name + ": undefined tensor");
  if (latents.device() != Device::kCpu || !dtype_is_float(latents.dtype()) || latents.dtype() == DType::kF64) {
    return invalid_argument(name + ": " + latents.describe() + " must be an F32, BF16 or F16 CPU tensor");
  }
  VORTEX_RETURN_IF_ERROR(check_audio_latent_shape(c, latents.shape(), name));
  const Tensor x = latents.dtype() == DType::kF32 ? latents.contiguous() : latents.contiguous().to(DType::kF32).value();
  const int64_t A = x.size(1), C = x.size(2);
  const float* d = x.data_as<const float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (!std::isfinite(d[i])) {
      const int64_t s = i / (A * C), a = i / C % A;
      return invalid_argument(name + ": non-finite value " + std::to_string(d[i]) + " at [" + std::to_string(s) + ", " +
                              std::to_string(a) + ", " + std::to_string(i % C) + "] (" +
                              (s == 0 ? "left" : "right") + " channel, latent frame " + std::to_string(a) + " of " +
                              std::to_string(A) + ")");
    }
  }
  return ok_status();
}

Result<Tensor> decode_audio(const AudioVae& vae, const Tensor& latents, const AudioVaeObserver* observer) {
  const AudioVaeConfig& c = vae.config;
  VORTEX_RETURN_IF_ERROR(validate_audio_latents(c, latents));
  if (static_cast<int64_t>(c.latents_mean.size()) != c.latent_channels ||
      static_cast<int64_t>(c.latents_std.size()) != c.latent_channels) {
    return invalid_argument("audio VAE config: latents_mean / latents_std must have latent_channels entries");
  }
  Tensor x = latents.dtype() == DType::kF32 ? latents.clone() : latents.contiguous().to(DType::kF32).value();
  // The pipeline's de-normalisation, in fp32: one rounding for the product, one for the sum.
  const int64_t C = c.latent_channels;
  float* xd = x.data_as<float>();
  const float* mean = c.latents_mean.data();
  const float* std_dev = c.latents_std.data();
  parallel_for(
      0, x.numel() / C,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          float* row = xd + r * C;
          for (int64_t k = 0; k < C; ++k) {
            const float scaled = row[k] * std_dev[k];
            row[k] = scaled + mean[k];
          }
        }
      },
      std::max<int64_t>(1, kElementGrain / C));
  return decode_audio_latents(vae, x, observer);
}

}  // namespace vortex::vae
