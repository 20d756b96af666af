// The H3 audio VAE decoder on one GPU: decode_audio's program (audio_vae.h) in fp32 on the CUDA
// backend — de-normalisation, dec_in_proj, BigVGAN (conv_pre, per stage a transposed convolution
// and the mean of its AMP blocks, each AMP convolution preceded by the fused alias-free SnakeBeta),
// the final activation, conv_post and the clamp.
//
// fp32 throughout, like the CPU decoder and the reference (whose weights are pinned to fp32: the
// DAC/BigVGAN stack degrades audibly in bf16). Convolutions are im2col + one fp32 cuBLASLt GEMM
// (no TF32) against the packed weight; transposed convolutions one GEMM and an overlap-add. Against
// the CPU only summation order and sinf differ (the GPU tests bound the rel-L2 by 1e-5).
//
// Memory: the weights live in one arena; one activation arena is sized per latent length on the
// first decode of that length: five stage buffers of the largest [2, T, C] the decoder produces,
// the im2col scratch (at most im2col_budget_bytes: longer inputs are convolved in row blocks) and
// the transposed convolutions' product. See cuda_audio_vae_memory.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/runtime.h"
#include "cuda/vae_snake.h"
#include "models/vae/audio_vae.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

struct CudaAudioVaeOptions {
  // The im2col scratch: 128 MiB holds the canonical decode's largest convolution (2 x 5,175 rows
  // of 11 x 256 values) in one block.
  size_t im2col_budget_bytes = size_t{128} << 20;
};

// A 1-D convolution of the audio VAE on the device (the decoder's and the encoder's): its shape,
// the packed weight [O, K·C] and the bias [O] (undefined for none).
struct DeviceConv1d {
  Conv1dShape shape;
  Tensor weight, bias;
};

// `conv` (models/vae/conv1d.h) uploaded into `arena`.
Result<DeviceConv1d> upload_conv1d(const Conv1d& conv, cuda::DeviceArena& arena, cudaStream_t stream);

// y [B, T_out, O] = conv(x [B, T, C]) by cuda::conv1d, im2col into `columns` (a flat F32 scratch).
Status run_conv1d(cuda::GemmRunner& gemm, const DeviceConv1d& conv, const Tensor& x, const Tensor& columns,
                  const Tensor& y, cudaStream_t stream);

// The im2col scratch (floats) a convolution of `rows` output rows needs under a budget of
// `budget_floats`: none for a 1x1, stride-1, unpadded one (a direct GEMM), else whole rows of K·C
// up to the budget (at least one; cuda::conv1d runs the rest in row blocks).
int64_t conv1d_columns_floats(const Conv1dShape& shape, int64_t rows, int64_t budget_floats);

struct CudaAudioVaeMemory {
  size_t weights = 0, activations = 0, workspace = 0;
  size_t total() const { return weights + activations + workspace; }
};

// The arenas a decode of `latent_frames` latents needs (invalid_argument when the config or the
// length is not decodable).
Result<CudaAudioVaeMemory> cuda_audio_vae_memory(const AudioVae& vae, int64_t latent_frames,
                                                 const CudaAudioVaeOptions& options = {});

class CudaAudioVae {
 public:
  // Uploads an assembled decoder (load_audio_vae / assemble_audio_vae; weight norm already fused).
  static Result<std::unique_ptr<CudaAudioVae>> create(const AudioVae& vae, const CudaAudioVaeOptions& options = {},
                                                      cudaStream_t stream = nullptr);

  const AudioVaeConfig& config() const { return config_; }
  cudaStream_t stream() const { return stream_; }

  // decode_audio's contract: latents [2, A, latent_channels] host F32 / BF16 / F16 (checked with
  // validate_audio_latents); returns the host F32 waveform [2, A · hop] in [-1, 1].
  Result<Tensor> decode(const Tensor& latents);
  // The same, leaving the waveform in the activation arena (a device tensor valid until the next
  // decode): what the benchmark times.
  Result<Tensor> decode_on_device(const Tensor& latents);

  size_t weight_bytes() const { return weights_.used(); }
  size_t activation_peak_bytes() const { return activations_.peak(); }
  size_t workspace_bytes() const { return workspace_.capacity(); }

 private:
  using Conv = DeviceConv1d;
  struct ConvTranspose {
    ConvTranspose1dShape shape;
    Tensor weight, bias;  // [K·O, C], [O] or undefined
  };
  struct Snake {
    Tensor frequency, magnitude;  // F32 [C]
    cuda::SnakeFilters filters;
  };
  struct Amp {
    std::vector<Conv> convs1, convs2;
    std::vector<Snake> acts;  // act1, act2 per dilation
  };
  // The device decoder, with AudioDecoderWeights' member names (the decode plan reads either).
  struct Decoder {
    Conv dec_in_proj, conv_pre, conv_post;
    std::vector<ConvTranspose> ups;
    std::vector<Amp> resblocks;  // stage-major
    Snake activation_post;
  };
  struct Buffers {
    Tensor latents;
    Tensor stage[5];  // flat F32: ups output, two running sums of an AMP block, activation, stage mean
    Tensor columns, product;
  };

  CudaAudioVae() = default;
  Status upload(const AudioVae& vae);
  Status conv_transpose(const ConvTranspose& c, const Tensor& x, const Tensor& y);
  Status snake(const Snake& s, const Tensor& x, const Tensor& y);

  AudioVaeConfig config_;
  CudaAudioVaeOptions options_;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceArena weights_, workspace_, activations_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  Decoder decoder_;
  Buffers buffers_;
};

}  // namespace vortex::vae
