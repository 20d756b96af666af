// The H3 video VAE encoder on one GPU: encode_video_chunk's program (video_vae_encoder.h) in fp32
// on the CUDA backend, inside the CPU's clips, tiles and stitching (encode_video_moments_with).
//
// Numerics: the CPU program's in fp32. Every conv with a multiple of 32 input and 128 output
// channels (all but conv_in and conv_out) is an implicit GEMM on tensor cores whose tf32x3 products
// and round-to-nearest accumulation across k-blocks give fp32 sums (cuda::conv3d_implicit, ~3e-7
// rel-L2 from exact sums); conv_in and conv_out are an im2col gather of the real temporal taps
// (cuda/vae_conv3d.h) and an fp32 cuBLASLt GEMM (no TF32); each with the bias in its epilogue.
// GroupNorm sums in double and applies in explicitly rounded fp32; the residual adds are fp32. Only
// the convs' summation order and SiLU's expf differ from the CPU, so the moments agree with the
// CPU's to ~1e-6 rel-L2 (tests/gpu/test_gpu_video_vae_encoder.cc states the bound) and the
// conditioning latents, rounded through fp16, mostly bit for bit. The implicit GEMM is the
// warp-specialized kernel on weights split into tf32 parts at upload; VORTEX_VARIANT_VAE_CONV=tf32x3
// runs the lockstep kernel of the same bits on the raw weights (~1.35x slower, 0.7 GB less),
// `gemm` every conv as the gather and the fp32 GEMM (the earlier path, 2-3x slower). kTf32, given to
// create() by --vae-encode-precision tf32 (or VORTEX_VARIANT_VAE_CONV=tf32), is the warp-specialized
// kernel with one tf32 product of the raw weights: approximate, the moments ~2.4e-4 rel-L2 from
// fp32's (as diffusers' default TF32 convolutions), 0.57-0.69x the time (bench/notes/video_vae_encoder.md).
//
// Batching: the tiles of a keyframe are encoded apart, but from the first level whose input has at
// most 4096 pixels a tile (the release: level 2, 64 x 64) they run together, as the frames of one
// batch: those levels' GEMMs have 28 x more rows (a 256 x 256 tile's last levels alone have 256,
// too few to fill the GPU) and launch 28 x less often. GroupNorm is per frame and the convs read
// each tile's own frames, so the batch changes nothing but the GEMMs' row counts (and with them,
// maybe, cuBLASLt's algorithm and summation order). A clip of several frames runs on its own.
//
// Memory: the weights in one arena (the release encoder: see weight_bytes(); tf32x3-ws adds the
// implicit convs' tf32 low parts, about as much again); one activation
// arena sized for the largest set of chunks seen so far: three activation buffers of the largest
// activation of one tile before the batch or of the batch after it, the batch's input, the clip's
// pixels as uploaded (channels first; each tile is gathered out of them), one tile's pixels
// channels-last, GroupNorm's scratch and the gather rows of the convs the implicit GEMM does not
// take (capped at 256 MB: longer frames are gathered and multiplied in row blocks).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/profiler.h"
#include "cuda/runtime.h"
#include "cuda/vae_conv3d.h"
#include "models/vae/video_vae_encoder.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

class CudaVideoVaeEncoder {
 public:
  // Uploads an assembled encoder (load_video_vae_encoder / assemble_video_vae_encoder); keeps its
  // tiling as the default one. The convs are computed as `variant` says; without one, as
  // VORTEX_VARIANT_VAE_CONV says (tf32x3-ws when unset; a bad value is refused by name).
  static Result<std::unique_ptr<CudaVideoVaeEncoder>> create(const VideoVaeEncoder& vae, cudaStream_t stream = nullptr,
                                                             std::optional<cuda::VaeConvVariant> variant = std::nullopt);

  const VideoVaeConfig& config() const { return config_; }
  const VideoTiling& tiling() const { return tiling_; }
  cuda::VaeConvVariant conv_variant() const { return conv_variant_; }

  // VideoChunkEncoder's contract (a host clip and its windows in, host moments out, each window
  // encoded on its own); the observer sees the same intermediates in the same order as the CPU's.
  Result<std::vector<Tensor>> encode_chunks(const Tensor& clip, const std::vector<PixelWindow>& windows,
                                            const VideoEncoderObserver* observer = nullptr);
  // encode_video_moments's contract. Without `tiling`, the checkpoint's.
  Result<Tensor> encode_moments(const Tensor& pixels, const VideoTiling& tiling,
                                const VideoEncoderObserver* observer = nullptr);
  Result<Tensor> encode_moments(const Tensor& pixels);

  size_t weight_bytes() const { return weights_.used(); }
  size_t activation_bytes() const { return activations_.capacity(); }

  // Device time of the encodes while set, by op and stage ("gemm, level 1", "gather, level 0",
  // "group_norm, output", "pixels upload", ...); null stops it. Each section costs two events.
  void set_profiler(cuda::SectionProfiler* profiler) { profiler_ = profiler; }

 private:
  struct Conv {
    int64_t in_channels = 0, out_channels = 0;
    Conv3dGeometry geometry;
    Tensor weight, bias;  // device F32 [O, kt·kh·kw·C], [O]
    // tf32x3-ws's implicit convs: weight holds the tf32 high parts and weight_lo the low parts
    // (cuda::split_conv_weight_tf32); undefined otherwise.
    Tensor weight_lo;
  };
  struct Resnet {
    Tensor norm1_weight, norm1_bias, norm2_weight, norm2_bias;
    Conv conv1, conv2;
    bool has_shortcut = false;
    Conv conv_shortcut;
  };
  struct Level {
    std::vector<Resnet> resnets;
    bool has_downsampler = false;
    Conv downsampler;
  };
  // How a set of chunks of one shape runs: levels [0, batch_level) one chunk at a time, the rest
  // (and the output convs) on `clips` chunks at once, and what that needs.
  struct Plan {
    size_t batch_level = 0;
    int64_t clips = 1;
    Shape batch_input;              // [clips·T, h, w, C] at batch_level
    int64_t activation_floats = 0;  // the largest activation (a tile's, or the batch's)
    int64_t gather_floats = 0;      // the largest gather (before the cap)
    int64_t frames = 0;             // the most frames an activation has (GroupNorm's scratch)
    int64_t pixel_floats = 0;       // a window's pixels, channels-last
    int64_t clip_floats = 0;        // the whole clip's, as uploaded (channels first)
  };
  using Emit = std::function<Status(const std::string& name, const Tensor& x, int64_t first_chunk, int64_t clips)>;

  CudaVideoVaeEncoder() = default;
  Status upload(const VideoVaeEncoder& vae);
  // Whether a conv of this geometry and widths runs as cuda::conv3d_implicit (else a gather and a
  // GEMM, or a GEMM alone).
  bool implicit(const Conv3dGeometry& g, int64_t in_channels, int64_t out_channels) const;
  // The same for a conv on the device (Conv) or on the host (CausalConv3d, before its upload).
  template <class AnyConv>
  bool implicit(const AnyConv& c) const {
    return implicit(c.geometry, c.in_channels, c.out_channels);
  }
  Result<Plan> plan(const Shape& pixels, int64_t clips) const;
  // Grows the activation arena (losing its contents) where it does not hold what the plan needs.
  Status reserve(const Plan& plan);
  // y = conv(x) on `clips` clips stacked in x [clips·T, H, W, C]; y [clips·T_out, ...] sized by
  // the caller (from conv_output_shape). Several clips need T_out = 1.
  Status conv(const Conv& c, const Tensor& x, const Tensor& y, int64_t clips);
  Result<Tensor> conv_into(const Conv& c, const Tensor& x, int buffer, int64_t clips);
  Status group_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y);
  // Levels [begin, end) on x (held by buffer `cur`, or the batch input), in place of x and cur.
  Status run_levels(size_t begin, size_t end, Tensor& x, int& cur, int64_t first_chunk, int64_t clips,
                    const Emit& emit);

  VideoVaeConfig config_;
  VideoTiling tiling_;
  cudaStream_t stream_ = nullptr;
  cuda::VaeConvVariant conv_variant_ = cuda::VaeConvVariant::kTf32x3Ws;
  cuda::DeviceArena weights_, workspace_, activations_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  Conv conv_in_, conv_out_, quant_conv_;
  std::vector<Level> levels_;
  Tensor norm_out_weight_, norm_out_bias_;
  // The activation arena's buffers (device F32, flat): three that rotate, the batch's input, the
  // uploaded clip and the window gathered out of it.
  Tensor pixels_buffer_, clip_buffer_, gather_buffer_, norm_scratch_, batch_buffer_;
  Tensor buffers_[3];
  Plan reserved_;
  cuda::SectionProfiler* profiler_ = nullptr;
  std::string stage_;  // the sections' stage: "conv_in", "level <i>", "output"
};

}  // namespace vortex::vae
