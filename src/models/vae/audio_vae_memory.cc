// Host memory of the CPU audio decode: decode_audio's allocations replayed in program order
// (audio_vae.cc, conv1d.cc, resample.cc), so that the peak is the one the code reaches. A change to
// the decode's buffers must change this file too (tests/test_vae_memory.cc measures the process's
// peak RSS and fails when the two drift apart).
#include <algorithm>
#include <array>

#include "models/vae/audio_vae.h"
#include "models/vae/resample.h"

namespace vortex::vae {

namespace {

enum Holder { kWeights, kLatents, kActivations, kScratch, kHolders };

constexpr int64_t kF32 = 4;
// conv1d.cc's im2col tiling: scratch floats per tile, tile rows, column panel width.
constexpr int64_t kTileScratchFloats = int64_t{1} << 20;
constexpr int64_t kMaxTileRows = 256;
constexpr int64_t kMinTileRows = 16;
constexpr int64_t kColumnQuantum = 16;

class Ledger {
 public:
  void alloc(Holder h, int64_t bytes, const char* step) {
    now_[h] += static_cast<size_t>(bytes);
    size_t total = 0;
    for (size_t b : now_) total += b;
    if (total > peak_total_) {
      peak_total_ = total;
      peak_ = now_;
      step_ = step;
    }
  }
  void drop(Holder h, int64_t bytes) { now_[h] -= static_cast<size_t>(bytes); }

  AudioVaeCpuMemory peak() const {
    AudioVaeCpuMemory m;
    m.weights = peak_[kWeights];
    m.latents = peak_[kLatents];
    m.activations = peak_[kActivations];
    m.scratch = peak_[kScratch];
    m.peak = step_;
    return m;
  }

 private:
  std::array<size_t, kHolders> now_{}, peak_{};
  size_t peak_total_ = 0;
  std::string step_;
};

class DecodeReplay {
 public:
  DecodeReplay(const AudioVaeConfig& c, int threads) : c_(c), threads_(threads) {}

  // decode_audio and decode_audio_latents. Activations are [2, T, C] fp32; `h` is the decoder's
  // running tensor, T its length.
  AudioVaeCpuMemory run(int64_t A) {
    int64_t weights = 0;  // weight norm is fused at assembly: weight_g is not kept
    for (const auto& spec : audio_vae_schema(c_)) {
      const std::string& n = spec.name;
      const bool gain = n.size() >= 9 && n.compare(n.size() - 9, 9, ".weight_g") == 0;
      if (spec.part == AudioVaePart::kDecoder && !gain) weights += spec.shape.numel() * kF32;
    }
    L_.alloc(kWeights, weights, "weights");
    L_.alloc(kLatents, kB * A * c_.latent_channels * kF32, "de-normalising the latents");
    int64_t T = A;
    int64_t h = conv(1, c_.latent_channels, c_.latent_dim, T, 1, 0, "dec_in_proj");
    const int64_t pre = conv(7, c_.latent_dim, c_.decoder_dim, T, 1, 3, "conv_pre");
    L_.drop(kActivations, h);
    h = pre;
    for (int i = 0; i < c_.num_upsamples(); ++i) {
      const int64_t C = c_.stage_channels(i + 1), K = c_.decoder_kernel_sizes[i], rate = c_.decoder_rates[i];
      // conv_transpose1d: Z = x · W [2·T, K·O], then the output gathered from it.
      const int64_t z = kB * T * K * C * kF32;
      L_.alloc(kActivations, z, "an upsampler");
      T = (T - 1) * rate - 2 * ((K - rate) / 2) + K;
      const int64_t up = kB * T * C * kF32;
      L_.alloc(kActivations, up, "an upsampler");
      L_.drop(kActivations, z);
      L_.drop(kActivations, h);
      h = up;
      // The first block's output becomes the stage's sum; the others are added into it and go.
      int64_t sum = 0;
      for (int j = 0; j < c_.num_kernels(); ++j) {
        const int64_t block = amp_block(j, T, C);
        if (j == 0) {
          sum = block;
        } else {
          L_.drop(kActivations, block);
        }
      }
      if (sum > 0) L_.drop(kActivations, h);  // else the sum is the stage input itself
    }
    const int64_t act = alias_free_snake(T, c_.stage_channels(c_.num_upsamples()), "activation_post");
    L_.drop(kActivations, h);
    conv(7, c_.stage_channels(c_.num_upsamples()), 1, T, 1, 3, "conv_post");
    L_.drop(kActivations, act);
    return L_.peak();
  }

 private:
  static constexpr int64_t kB = 2;  // stereo: two batch items

  // conv1d: the output, and one im2col scratch per parallel_for chunk while it runs. Returns the
  // output's bytes, left allocated.
  int64_t conv(int64_t K, int64_t C, int64_t O, int64_t T, int64_t dilation, int64_t padding, const char* step) {
    const int64_t T_out = conv1d_output_length({C, O, K, 1, dilation, padding}, T);
    const int64_t y = kB * T_out * O * kF32;
    L_.alloc(kActivations, y, step);
    if (K != 1 || padding != 0) {
      const int64_t KC = K * C;
      const int64_t rows = std::min(T_out, std::clamp(kTileScratchFloats / KC, kMinTileRows, kMaxTileRows));
      const int64_t row_tiles = kB * ((T_out + rows - 1) / rows);
      int64_t cols = O;  // conv1d.cc: conv_column_block, enough tiles for every thread
      if (row_tiles < threads_) {
        const int64_t per_row_tile = (threads_ + row_tiles - 1) / row_tiles;
        cols = ((O + per_row_tile - 1) / per_row_tile + kColumnQuantum - 1) / kColumnQuantum * kColumnQuantum;
        cols = std::clamp<int64_t>(cols, 1, O);
      }
      const int64_t chunks = std::min<int64_t>(threads_, row_tiles * ((O + cols - 1) / cols));
      const int64_t scratch = chunks * rows * KC * kF32;
      L_.alloc(kScratch, scratch, step);
      L_.drop(kScratch, scratch);
    }
    return y;
  }

  // Upsample 2x (new), snake in place, downsample 2x (new); the upsampled tensor goes. Returns the
  // output's bytes, left allocated.
  int64_t alias_free_snake(int64_t T, int64_t C, const char* step) {
    const int64_t up = kB * 2 * T * C * kF32;
    L_.alloc(kActivations, up, step);
    const int64_t down = kB * lowpass_downsample_length(2 * T, kAliasFreeTaps, kAliasFreeRatio) * C * kF32;
    L_.alloc(kActivations, down, step);
    L_.drop(kActivations, up);
    return down;
  }

  // amp_block on the stage input (held by the caller): per dilation h = conv2(act(conv1(act(h)))) + h.
  // Returns the bytes of a new output, left allocated, or 0 when the block returns its input.
  int64_t amp_block(int j, int64_t T, int64_t C) {
    const int64_t k = c_.resblock_kernel_sizes[j];
    int64_t h = 0;  // bytes of h once it is no longer the stage input
    for (int d : c_.resblock_dilation_sizes[j]) {
      int64_t r = alias_free_snake(T, C, "an AMP block");
      const int64_t c1 = conv(k, C, C, T, d, (k * d - d) / 2, "an AMP block");
      L_.drop(kActivations, r);
      r = alias_free_snake(T, C, "an AMP block");
      L_.drop(kActivations, c1);
      const int64_t c2 = conv(k, C, C, T, 1, (k - 1) / 2, "an AMP block");
      L_.drop(kActivations, r);
      if (h > 0) L_.drop(kActivations, h);
      h = c2;
    }
    return h;
  }

  const AudioVaeConfig& c_;
  const int threads_;
  Ledger L_;
};

}  // namespace

Result<AudioVaeCpuMemory> audio_vae_cpu_memory(const AudioVaeConfig& config, int64_t latent_frames, int threads) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  VORTEX_RETURN_IF_ERROR(check_audio_latent_shape(config, Shape{2, latent_frames, config.latent_channels}));
  if (threads < 1) return invalid_argument("audio VAE memory: threads " + std::to_string(threads) + " must be >= 1");
  return DecodeReplay(config, threads).run(latent_frames);
}

}  // namespace vortex::vae
