// The H3 video VAE decoder on one GPU: decode_video's program (video_vae.h) on the CUDA backend —
// the same temporal chunks with their cross-fade, the same blended spatial tiles, the ViT decoder
// per tile, the ImageNet de-normalisation and the clamp.
//
// Two numeric modes (CudaVideoVaeOptions::dtype):
//   kBF16 (default)  the reference pipeline's decode recipe (float16 autocast over fp32 weights)
//                    at bf16, the precision of the backend's GEMMs and attention: the transformer
//                    blocks' linears, attention and proj_out take bf16 operands with fp32
//                    accumulation, and results are rounded to bf16 where autocast materialises a
//                    half-precision tensor — the normed block inputs, q/k/v (again after the
//                    per-head norm and after RoPE), the attention output, both branch outputs, the
//                    FFN's hidden layer before and after the SwiGLU, and proj_out's input. The
//                    residual stream, the norms' statistics, post_quant_conv, proj_in, proj_out's
//                    output and all stitching stay fp32 (autocast keeps the stream fp32 too; the
//                    output stays fp32 rather than half because nothing downstream gains from
//                    rounding it). A CPU emulation of this program on the test preset is 2.5e-3
//                    rel-L2 from the fp32 decoder's output.
//   kF32             the CPU decoder's fp32 program: fp32 cuBLASLt GEMMs (no TF32) and an fp32
//                    attention kernel (cuda/vae_attention_f32.h); only summation order, expf and
//                    rsqrt differ from the CPU, and the stitching is bit-identical for equal tiles.
//
// Memory: the weights live in one arena; one activation arena is sized per latent shape and
// tiling on the first decode of that shape (a later decode that needs no more reuses it). It holds
// the latents, one tile's activations, the decoded tiles of two consecutive chunks (the
// cross-fade reads the previous chunk's) and the finished frames, which stay on the device until
// the end. The transformer's working set is one tile's whatever the clip's size; only the latents
// and frames grow with the clip. See cuda_video_vae_memory, and the canonical figures in the .cc.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/runtime.h"
#include "models/vae/video_vae.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

struct CudaVideoVaeOptions {
  DType dtype = DType::kBF16;  // kBF16 or kF32 (see the file comment)
};

// Device bytes of a decode, by arena.
struct CudaVideoVaeMemory {
  size_t weights = 0;      // every decoder weight, in the mode's storage dtypes
  size_t activations = 0;  // the activation arena for one latent shape and tiling
  size_t workspace = 0;    // the cuBLASLt workspace
  size_t total() const { return weights + activations + workspace; }
};

// The arenas a decode of latents `latent_shape` ([C, T, H, W]) with `tiling` needs; the same
// checks as a decode (invalid_argument naming the field).
Result<CudaVideoVaeMemory> cuda_video_vae_memory(const VideoVaeConfig& config, DType dtype, const Shape& latent_shape,
                                                 const VideoTiling& tiling);

class CudaVideoVae {
 public:
  // Uploads an assembled decoder (load_video_vae / assemble_video_vae); keeps its tiling as the
  // default one. The weights are converted to the mode's storage dtypes on the way.
  static Result<std::unique_ptr<CudaVideoVae>> create(const VideoVae& vae, const CudaVideoVaeOptions& options = {},
                                                      cudaStream_t stream = nullptr);
  // Deterministic synthetic weights made on the device for `config` (the benchmark's: normal
  // draws of the Philox sampler, fan-in-scaled matrices, unit norm weights, small biases, register
  // tokens and residual scales), with the release's tiling.
  static Result<std::unique_ptr<CudaVideoVae>> create_synthetic(const VideoVaeConfig& config, uint64_t seed,
                                                                const CudaVideoVaeOptions& options = {},
                                                                cudaStream_t stream = nullptr);

  const VideoVaeConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  const VideoTiling& tiling() const { return tiling_; }
  cudaStream_t stream() const { return stream_; }

  // decode_video's contract: latents [C, T, H, W] host F32 / BF16 / F16, normalised as the
  // transformer emits them (checked with validate_video_latents, the tiling with validate_tiling);
  // returns host F32 [3, F, H·p, W·p] in [0, 1]. Without `tiling`, the checkpoint's.
  Result<Tensor> decode(const Tensor& latents);
  Result<Tensor> decode(const Tensor& latents, const VideoTiling& tiling);
  // The same, leaving the frames in the activation arena (a device tensor valid until the next
  // decode): what the benchmark times.
  Result<Tensor> decode_on_device(const Tensor& latents, const VideoTiling& tiling);

  size_t weight_bytes() const { return weights_.used(); }
  // High-water marks of the activation arena and the cuBLASLt workspace arena so far.
  size_t activation_peak_bytes() const { return activations_.peak(); }
  size_t workspace_bytes() const { return workspace_.capacity(); }

  // The weights under their state-dict names and shapes, in the storage dtypes (for peers that
  // rebuild the reference on the same weights).
  Result<NamedTensors> download_weights() const;

 private:
  struct Linear {
    Tensor weight, bias;  // device [O, I], [O]
  };
  struct Block {
    Tensor norm1, norm2, scale1, scale2;  // F32 [dim]
    Linear qkv;                           // [3·dim, dim]: to_q, to_k, to_v rows
    Linear out, ff_in, ff_out;
  };
  // One tile's activations; rows for the largest tile of the current plan.
  struct TileBuffers {
    Tensor tokens, post_quant;  // F32 [N, C]
    Tensor x;                   // F32 [N + R + 1, dim]: the residual stream
    Tensor h, qkv, attn, branch, ff_hidden, ff_gated;  // activation dtype
    Tensor rope_cos, rope_sin;  // F32 [N + R + 1, rope_dim]
    Tensor zero_rows;           // I32 [N + R + 1]: row index 0 of every token into the [1, dim] residual scales
  };
  using Filler = std::function<Status(const std::string& name, const Tensor& dst)>;

  CudaVideoVae() = default;
  static Result<std::unique_ptr<CudaVideoVae>> build(const VideoVaeConfig& config, const CudaVideoVaeOptions& options,
                                                     cudaStream_t stream, const Filler& fill);
  Status load_weights(const Filler& fill);
  Status linear(const Linear& l, const TensorView& x, const TensorView& y);
  // `pending`: the block before, whose last residual update b's first norm adds (null for the first).
  Status block_forward(const Block& b, const Tensor& x, const Block* pending);
  Status decode_tile(const Tensor& z, int64_t t0, int64_t frames, int64_t y0, int64_t x0, int64_t h, int64_t w,
                     const Tensor& out);
  Status upload_rope(int64_t frames, int64_t h, int64_t w);

  VideoVaeConfig config_;
  VideoTiling tiling_;
  DType dtype_ = DType::kBF16;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceArena weights_, workspace_, activations_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  std::vector<std::pair<std::string, Tensor>> named_;  // state-dict name -> device tensor, schema order
  Linear post_quant_conv_, proj_in_, proj_out_;
  Tensor register_tokens_, norm_out_weight_, norm_out_bias_;
  std::vector<Block> blocks_;
  TileBuffers tile_;
  int64_t rope_key_[3] = {-1, -1, -1};  // (frames, h, w) of the tables in tile_.rope_*
};

}  // namespace vortex::vae
