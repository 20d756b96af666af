// The H3 video VAE encoder on one GPU: encode_video_chunk's program (video_vae_encoder.h) in fp32
// on the CUDA backend, inside the CPU's clips, tiles and stitching (encode_video_moments_with).
//
// Numerics: the CPU program's. Each causal conv is an im2col gather of the real temporal taps
// (cuda/vae_conv3d.h) and an fp32 cuBLASLt GEMM (no TF32) against those taps' weight columns with
// the bias in the epilogue; GroupNorm sums in double and applies in explicitly rounded fp32; the
// residual adds are fp32. Only the GEMMs' summation order and SiLU's expf differ from the CPU, so
// the moments agree with the CPU's to ~1e-6 rel-L2 (tests/gpu/test_gpu_video_vae_encoder.cc
// states the bound) and the conditioning latents, rounded through fp16, mostly bit for bit.
//
// Memory: the weights in one arena (the release encoder: see weight_bytes()); one activation
// arena sized for the largest chunk seen so far: three activation buffers of the largest
// [T, H, W, C] the chunk reaches, the chunk's pixels, GroupNorm's scratch and the gather rows
// (capped at 256 MB: longer frames are gathered and multiplied in row blocks).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/runtime.h"
#include "models/vae/video_vae_encoder.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

class CudaVideoVaeEncoder {
 public:
  // Uploads an assembled encoder (load_video_vae_encoder / assemble_video_vae_encoder); keeps its
  // tiling as the default one.
  static Result<std::unique_ptr<CudaVideoVaeEncoder>> create(const VideoVaeEncoder& vae, cudaStream_t stream = nullptr);

  const VideoVaeConfig& config() const { return config_; }
  const VideoTiling& tiling() const { return tiling_; }

  // encode_video_chunk's contract (host pixels in, host moments out); the observer sees the same
  // intermediates.
  Result<Tensor> encode_chunk(const Tensor& pixels, const VideoEncoderObserver* observer = nullptr);
  // encode_video_moments's contract. Without `tiling`, the checkpoint's.
  Result<Tensor> encode_moments(const Tensor& pixels, const VideoTiling& tiling,
                                const VideoEncoderObserver* observer = nullptr);
  Result<Tensor> encode_moments(const Tensor& pixels);

  size_t weight_bytes() const { return weights_.used(); }
  size_t activation_bytes() const { return activations_.capacity(); }

 private:
  struct Conv {
    int64_t in_channels = 0, out_channels = 0;
    Conv3dGeometry geometry;
    Tensor weight, bias;  // device F32 [O, kt·kh·kw·C], [O]
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
  // What one chunk of [T, H, W] pixels needs.
  struct ChunkNeeds {
    int64_t activation_floats = 0;  // the largest activation
    int64_t gather_floats = 0;      // the largest gather (before the cap)
    int64_t frames = 0;             // the most frames an activation has (GroupNorm's scratch)
  };

  CudaVideoVaeEncoder() = default;
  Status upload(const VideoVaeEncoder& vae);
  Result<ChunkNeeds> chunk_needs(const Shape& pixels) const;
  Status reserve(const ChunkNeeds& needs);
  // y = conv(x); x, y contiguous [T, H, W, C] device views; y sized by the caller.
  Status conv(const Conv& c, const Tensor& x, Tensor& y);
  Status group_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y);
  Result<Tensor> conv_output(const Conv& c, const Tensor& x, int which);

  VideoVaeConfig config_;
  VideoTiling tiling_;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceArena weights_, workspace_, activations_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  Conv conv_in_, conv_out_, quant_conv_;
  std::vector<Level> levels_;
  Tensor norm_out_weight_, norm_out_bias_;
  // The activation arena's buffers (device F32, flat).
  Tensor pixels_buffer_, gather_buffer_, norm_scratch_;
  Tensor buffers_[3];
  ChunkNeeds reserved_;
};

}  // namespace vortex::vae
