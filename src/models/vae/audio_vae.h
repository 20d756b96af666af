// The H3 audio VAE decoder on the CPU (fp32), at parity with diffusers' AutoencoderKLMiniMaxH3Audio
// (its encoder, for ref2va's soundtracks: audio_vae_encoder.h).
//
// Weights: the diffusers state dict, whose names are the original checkpoint's (the conversion is
// a passthrough): weight-normed convolutions as `weight_g` / `weight_v` (a fused `weight` in their
// place is accepted too), the resamplers' Kaiser-sinc `filter` buffers, the frozen
// `zero_k_bias`. The schema covers the whole autoencoder; the decoder's tensors are required, the
// encoder side (encoder, pre_block, mean_proj, logs_proj) may be absent as a whole, and what is
// present is checked: a missing or unexpected tensor or a wrong shape is a one-line error naming it.
//
// decode_audio runs what the reference pipeline runs after the denoise loop:
//   rows [2, A, C] (stereo channel-major, as the transformer emits them; [2·A, C] reshaped)
//   → de-normalise x·std + mean per latent channel
//   → dec_in_proj (1x1 conv C → latent_dim)
//   → BigVGAN: conv_pre (k7); per stage i: ups[i] (transposed conv, stride rate_i, kernel k_i,
//     padding (k_i - rate_i)/2), then the mean of the AMP blocks of every resblock kernel size
//     (summed in order, divided by their count); an AMP block is, per dilation d,
//     h += conv2(act2(conv1_d(act1(h)))) with conv1_d of dilation d and "same" padding
//     (k·d - d)/2 and conv2 of dilation 1, each act an alias-free SnakeBeta (upsample 2x,
//     snake_beta, downsample 2x)
//   → alias-free SnakeBeta → conv_post (k7, one channel, no bias) → clamp to [-1, 1]
//   → waveform [2, samples], samples = A · hop (800 at 32 kHz in the release).
// Internally activations are time-major [B, T, C], so the decoder input needs no transpose.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "formats/safetensors.h"
#include "models/vae/activations.h"
#include "models/vae/audio_vae_config.h"
#include "models/vae/conv1d.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// ---- schema ------------------------------------------------------------------------------------

enum class AudioVaePart { kEncoder, kDecoder };

struct AudioVaeTensorSpec {
  std::string name;  // state-dict name
  Shape shape;
  AudioVaePart part;
};

// Every tensor of the autoencoder's state dict for `config`, in module order.
std::vector<AudioVaeTensorSpec> audio_vae_schema(const AudioVaeConfig& config);

// Checks names and shapes (see the file comment). Float dtypes only (F32, BF16, F16).
Status validate_audio_vae_tensors(const NamedTensors& tensors, const AudioVaeConfig& config);

// ---- weights -----------------------------------------------------------------------------------

// Upsample 2x → SnakeBeta → downsample 2x.
struct AliasFreeSnake {
  SnakeParams snake;
  std::vector<float> up_filter;    // upsample.filter
  std::vector<float> down_filter;  // downsample.lowpass.filter
};

struct AmpBlock {
  std::vector<int> dilations;
  std::vector<Conv1d> convs1, convs2;  // one pair per dilation
  std::vector<AliasFreeSnake> acts;    // 2 per dilation: act1 before convs1, act2 before convs2
};

struct AudioDecoderWeights {
  Conv1d dec_in_proj;
  Conv1d conv_pre;
  std::vector<ConvTranspose1d> ups;
  std::vector<AmpBlock> resblocks;  // stage-major: resblocks[i * num_kernels + j]
  AliasFreeSnake activation_post;
  Conv1d conv_post;
};

struct AudioVae {
  AudioVaeConfig config;
  AudioDecoderWeights decoder;
};

// Builds the decoder from state-dict tensors (validated first). Weight norm is fused here.
Result<AudioVae> assemble_audio_vae(const NamedTensors& tensors, const AudioVaeConfig& config);

// The config for a checkpoint at `path` (a .safetensors file or its folder): config.json beside
// it, read as diffusers' when it is, else as the original wrapper together with the metadata file
// it names (source_metadata_path, default metadata.json; see audio_vae_config_from_original), else
// the `config` metadata key of the file.
Result<AudioVaeConfig> resolve_audio_vae_config(const std::string& path, const SafetensorsFile& file);

// Opens a .safetensors file, or a folder holding the weights an original wrapper config.json names
// (source_safetensors_path), diffusion_pytorch_model.safetensors (diffusers) or model.safetensors
// (original), resolves its config and assembles the decoder.
Result<AudioVae> load_audio_vae(const std::string& path);

// Deterministic random weights in the state-dict layout (for tests and benchmarks): fan-in-scaled
// normal convolutions, weight_g near 1, small biases and snake parameters, and the reference's
// own Kaiser-sinc filters.
NamedTensors synthetic_audio_vae_tensors(const AudioVaeConfig& config, uint64_t seed, bool with_encoder = true);

// ---- forward -----------------------------------------------------------------------------------

// Called with every intermediate the decoder produces, time-major [B, T, C] (the reference's
// [B, C, T] transposed), named after the reference module that produced it: "latents" (the
// de-normalised decoder input), "dec_in_proj", "decoder.conv_pre", "decoder.ups.<i>",
// "decoder.resblocks.<n>" (and, inside them, "...activations.<a>.upsample", "...act",
// "...activations.<a>", "...convs1.<m>", "...convs2.<m>"), "decoder.stage.<i>" (the mean of stage i's AMP blocks),
// "decoder.activation_post", "decoder.conv_post" (before the clamp) and "waveform" ([B, S]).
// The tensor is only valid during the call.
using AudioVaeObserver = std::function<void(const std::string& name, const Tensor& value)>;

// Decodes de-normalised latents x[B, T, C] (time-major); returns the waveform [B, samples].
Result<Tensor> decode_audio_latents(const AudioVae& vae, const Tensor& latents,
                                    const AudioVaeObserver* observer = nullptr);

// ---- input checks, shared by every decoder of these latents (CPU and CUDA) ---------------------
// Errors are invalid_argument "<name>: ...", naming the dim or element at fault; a tensor in a
// layout that is merely transposed or flattened ([2·A, C] rows, [A, 2, C], [2, C, A]) is told so.

// [2 (stereo), A >= 1 (latent frames), latent_channels].
Status check_audio_latent_shape(const AudioVaeConfig& config, const Shape& shape, const std::string& name = "latents");

// The shape as above, an F32, BF16 or F16 CPU tensor, and every value finite: the first NaN or
// infinity is named by its element [s, a, c], stereo channel and latent frame.
Status validate_audio_latents(const AudioVaeConfig& config, const Tensor& latents, const std::string& name = "latents");

// latents: [2, A, latent_channels] (F32, BF16 or F16), stereo channel-major rows as the transformer
// emits them; checked with validate_audio_latents first. Returns the stereo waveform F32
// [2, A · hop] at config.sampling_rate, in [-1, 1].
Result<Tensor> decode_audio(const AudioVae& vae, const Tensor& latents, const AudioVaeObserver* observer = nullptr);

// ---- host memory of a decode -------------------------------------------------------------------

// Host bytes alive at the peak of decode_audio (no observer), by what holds them.
struct AudioVaeCpuMemory {
  size_t weights = 0;      // the assembled decoder (fused fp32 convolutions, snake parameters, filters)
  size_t latents = 0;      // the de-normalised fp32 latents
  size_t activations = 0;  // the stage input, the AMP blocks' running sums and their activation chain
  size_t scratch = 0;      // per-thread im2col columns of the convolutions
  std::string peak;        // the step of the decode where the peak falls
  size_t total() const { return weights + latents + activations + scratch; }
};

// The peak of decoding `latent_frames` stereo latents on `threads` threads (core/parallel.h's
// num_threads() for this process), found by replaying decode_audio's allocations and frees in
// order (audio_vae_memory.cc); what is counted is as for video_vae_cpu_memory. The same checks as
// a decode (invalid_argument naming the field).
Result<AudioVaeCpuMemory> audio_vae_cpu_memory(const AudioVaeConfig& config, int64_t latent_frames, int threads);

}  // namespace vortex::vae
