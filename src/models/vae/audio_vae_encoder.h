// The H3 audio VAE encoder on the CPU (fp32), at parity with diffusers' AutoencoderKLMiniMaxH3Audio.encode
// as ref2va runs it on a reference soundtrack (MiniMaxH3Ref2VAReferenceEncoderStep):
//   waveform [2, S] at config.sampling_rate (the stereo channels are two batch items of the mono
//   autoencoder), right-padded with zeros to a multiple of the hop
//   → DAC encoder: conv k7 (1 → encoder_dim); per rate r: three residual units at dilations 1/3/9
//     (x + conv1x1(snake(conv_k7_d(snake(x))))), snake, conv k = 2r, stride r, padding ceil(r / 2)
//     doubling the channels; snake; conv k3 → latent_dim
//   → pre_block: h = proj(LN3(x)) + attn(LN1(x)), then h + mlp(LN2(h)), where attn is causal
//     attention over latent_dim / heads wide heads whose outputs are averaged over the heads and
//     adaptively average-pooled to latent_channels before a linear, and mlp is
//     w2(gelu_tanh(w0(LN(h))) · w1(LN(h)))
//   → mean_proj (1x1 conv): the posterior mean, taken as is (ref2va never samples a soundtrack)
//   → normalised (x - latents_mean) / latents_std per channel, packed channel-major:
//     rows [2 · A, latent_channels], A = ceil(S / hop).
// Snake here is DAC's x + (α + 1e-9)⁻¹ · sin(α·x)² (activations.h).
#pragma once

#include <string>
#include <vector>

#include "models/vae/activations.h"
#include "models/vae/audio_vae.h"
#include "models/vae/conv1d.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

struct AudioResidualUnit {
  SnakeParams snake1, snake2;
  Conv1d conv1, conv2;  // k7 dilated, then 1x1
};

struct AudioEncoderBlock {
  std::vector<AudioResidualUnit> units;  // dilations 1, 3, 9
  SnakeParams snake;
  Conv1d down;  // strided, doubling the channels
};

struct LayerNormWeights {
  Tensor weight, bias;  // F32 [C]
};

struct AudioVaeEncoder {
  AudioVaeConfig config;
  Conv1d stem;
  std::vector<AudioEncoderBlock> blocks;
  SnakeParams snake_out;
  Conv1d conv_out;
  // pre_block
  LayerNormWeights norm1, norm2, norm3, mlp_norm;
  Tensor qkv_weight, qkv_bias;  // F32 [3·D, D], [3·D] (q_bias, the zero k bias, v_bias)
  Tensor attn_proj_weight, attn_proj_bias, proj_weight, proj_bias;
  Tensor w0_weight, w0_bias, w1_weight, w1_bias, w2_weight, w2_bias;
  Conv1d mean_proj;
};

// The encoder side of the state dict (validated as a whole first; its tensors must be present).
Result<AudioVaeEncoder> assemble_audio_vae_encoder(const NamedTensors& tensors, const AudioVaeConfig& config);

// The encoder's input: waveform F32 [2, S >= 1], finite (checked, refusals name the sample),
// right-padded with zeros to a multiple of the hop, time-major: F32 [2, padded, 1].
Result<Tensor> padded_waveform(const AudioVaeConfig& config, const Tensor& waveform);

// Every intermediate as the reference's modules name them: "encoder.block.<i>" ([B, T, C] here, the
// reference's [B, C, T] transposed), "pre_block" ([B, T, latent]), "mean" ([B, T, latent]).
// waveform: F32 [2, S] (S >= 1), finite. Returns the normalised rows F32 [2 · A, latent_channels].
Result<Tensor> encode_audio(const AudioVaeEncoder& encoder, const Tensor& waveform,
                            const AudioVaeObserver* observer = nullptr);

// The encoder of the checkpoint at `path`, as load_audio_vae finds it (audio_vae.h); a checkpoint
// without the encoder's tensors is refused by name.
Result<AudioVaeEncoder> load_audio_vae_encoder(const std::string& path);

// A ref2va soundtrack as the pipeline normalises it (MiniMaxH3Ref2VASetupStep): waveform F32
// [channels 1 or 2, S] at `sample_rate` (1..768000 Hz), truncated there to
// int(max_seconds · sample_rate) samples (the generated duration), a mono one repeated onto both
// channels, resampled onto `vae_rate` as torchaudio does (media::resample_audio; untouched at that
// rate). Returns F32 [2, reference_soundtrack_samples].
Result<Tensor> normalize_reference_soundtrack(const Tensor& waveform, int sample_rate, int vae_rate,
                                              double max_seconds);

// normalize_reference_soundtrack onto the encoder's rate, then encode_audio.
Result<Tensor> encode_reference_soundtrack(const AudioVaeEncoder& encoder, const Tensor& waveform, int sample_rate,
                                           double max_seconds);

// The samples at the VAE's rate of such a waveform that encode_reference_soundtrack encodes (its
// checks; the encoded rows are ceil(samples / hop) latents per channel), for sizing a request
// before its encode.
Result<int64_t> reference_soundtrack_samples(const AudioVaeConfig& config, const Tensor& waveform, int sample_rate,
                                             double max_seconds);

}  // namespace vortex::vae
