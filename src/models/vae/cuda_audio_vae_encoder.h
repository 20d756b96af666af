// The H3 audio VAE encoder on one GPU: encode_audio's program (audio_vae_encoder.h) in fp32 on the
// CUDA backend — the DAC encoder (convolutions, plain snakes, residual adds), the pre_block (layer
// norms, the causal attention with its head mean and pooling, the gated GELU MLP), mean_proj and the
// latents' normalisation — for ref2va's soundtracks.
//
// fp32 throughout, as the CPU encoder and the reference (the DAC stack degrades in bf16).
// Convolutions are im2col + one fp32 cuBLASLt GEMM (no TF32) against the packed weight, the
// decoder's (cuda::conv1d). Against the CPU only summation orders, sinf and tanh differ.
//
// Memory: the weights live in one arena; one activation arena is sized per padded waveform length
// on the first encode of that length: three stage buffers of the largest [2, T, C] the DAC stack
// makes, the im2col scratch (at most CudaAudioVaeOptions::im2col_budget_bytes: longer convolutions
// run in row blocks) and the pre_block's narrow rows.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/runtime.h"
#include "models/vae/audio_vae_encoder.h"
#include "models/vae/cuda_audio_vae.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

class CudaAudioVaeEncoder {
 public:
  // Uploads an assembled encoder (load_audio_vae_encoder / assemble_audio_vae_encoder).
  static Result<std::unique_ptr<CudaAudioVaeEncoder>> create(const AudioVaeEncoder& encoder,
                                                             const CudaAudioVaeOptions& options = {},
                                                             cudaStream_t stream = nullptr);

  const AudioVaeConfig& config() const { return config_; }

  // encode_audio's contract: waveform F32 [2, S >= 1] (host), finite, at config().sampling_rate;
  // returns the normalised rows, host F32 [2 · A, latent_channels].
  Result<Tensor> encode(const Tensor& waveform);
  // The same, leaving the rows in the activation arena (a device tensor valid until the next
  // encode): what a benchmark times.
  Result<Tensor> encode_on_device(const Tensor& waveform);

  size_t weight_bytes() const { return weights_.used(); }
  size_t activation_peak_bytes() const { return activations_.peak(); }

 private:
  using Conv = DeviceConv1d;
  struct Snake {
    Tensor frequency, magnitude;  // F32 [C]
  };
  struct ResidualUnit {
    Snake snake1, snake2;
    Conv conv1, conv2;
  };
  struct Block {
    std::vector<ResidualUnit> units;
    Snake snake;
    Conv down;
  };
  struct Linear {
    Tensor weight, bias;  // F32 [O, I], [O]
  };
  struct Norm {
    Tensor weight, bias;  // F32 [C]
  };
  struct Encoder {
    Conv stem, conv_out, mean_proj;
    std::vector<Block> blocks;
    Snake snake_out;
    Norm norm1, norm2, norm3, mlp_norm;
    Linear qkv, attn_proj, proj, w0, w1, w2;
    Tensor latents_mean, latents_std;  // F32 [latent_channels]
  };

  CudaAudioVaeEncoder() = default;
  Status upload(const AudioVaeEncoder& encoder);
  Status linear(const Linear& l, const Tensor& x, const Tensor& y);

  AudioVaeConfig config_;
  CudaAudioVaeOptions options_;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceArena weights_, workspace_, activations_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  Encoder encoder_;
  // This length's activation arena's tensors: the waveform, three stage buffers, the im2col
  // scratch, and the pre_block's narrow rows [2·A, at most 2·latent_channels].
  static constexpr int kNarrowBuffers = 8;
  struct Buffers {
    Tensor waveform;
    Tensor stage[3];
    Tensor columns;
    Tensor narrow[kNarrowBuffers];
  } buffers_;
};

}  // namespace vortex::vae
