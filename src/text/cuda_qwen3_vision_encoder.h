// The Qwen3-VL vision tower on the GPU: Qwen3VisionEncoder's program (qwen3_vision_encoder.h) with
// its weights resident on the device, for keyframes encoded next to the CUDA text encoder.
//
// The same ops at the same rounding points as the CPU program: the patch embedding as a cuBLASLt
// bf16 GEMM with its bias, the resampled position rows (built on the host, exactly the CPU's)
// added and rounded, LayerNorm (cuda::layer_norm: statistics in double), the qkv / proj / fc1 / fc2
// linears with their biases, the 2-D RoPE in fp32 rounded once (cuda::rope_widened), non-causal
// attention (cuda::attention: the released head dim 72 on v0's tensor-core kernel), GELU in
// double, and the mergers. The results differ from the CPU only by summation order (GEMM k order,
// the online softmax): tests/gpu/test_gpu_vision_encoder.cc states the bound.
//
// Memory: every block's and merger's linear in bf16 (the released tower: ~1.2 GB), the norms in
// fp32, per encode an arena sized for the image's patches, and the position rows and RoPE tables
// of the last patch grid seen (every keyframe of a request, and every request at one canvas, has
// the same grid; building them on the host took most of an encode).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/profiler.h"
#include "cuda/runtime.h"
#include "text/qwen3_vision_encoder.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::text {

class CudaQwen3VisionEncoder {
 public:
  // Uploads `host`'s weights (it must outlive this object: the position rows and RoPE tables are
  // built by it). The linear weights must be BF16 (the released checkpoint's); another dtype is
  // refused by name.
  static Result<std::unique_ptr<CudaQwen3VisionEncoder>> create(const Qwen3VisionEncoder& host,
                                                                cudaStream_t stream = nullptr);

  // Qwen3VisionEncoder::encode's contract; the features come back to the host.
  Result<VisionFeatures> encode(const Tensor& patches, const VisionGrid& grid);
  // rgb → the host's image_patches → encode.
  Result<VisionFeatures> encode_image(const Tensor& rgb);

  size_t weight_bytes() const { return weights_.used(); }
  // Brackets each stage of later encodes with CUDA events (the bench's breakdown); nullptr stops.
  // Host stages (the pixels' conversion, the tables' build) are seen as the gaps they leave on
  // the stream, so they read true only while the stream has nothing else queued.
  void set_profiler(cuda::SectionProfiler* profiler) { profiler_ = profiler; }

 private:
  struct Linear {
    Tensor w, b;  // BF16 [O, I], BF16 [O]
  };
  struct Norm {
    Tensor w, b;  // F32 [C]
  };
  struct Block {
    Norm norm1, norm2;
    Linear qkv, proj, fc1, fc2;
  };
  struct Merger {
    Norm norm;
    Linear fc1, fc2;
    bool norm_after_shuffle = false;
  };

  CudaQwen3VisionEncoder() = default;
  Status upload();
  // Makes pos_ / cos_ / sin_ those of `grid`.
  Status ensure_grid_tables(const VisionGrid& grid);
  Result<Linear> upload_linear(const Tensor& w, const Tensor& b, const std::string& name);
  Result<Norm> upload_norm(const Tensor& w, const Tensor& b);
  Result<Merger> upload_merger(const Qwen3VisionEncoder::Merger& m, const std::string& name);
  // merged (or a DeepStack feature) from the residual stream x [patches, C], through `scratch`.
  Status merge(const Merger& m, const Tensor& x, const Tensor& normed, const Tensor& hidden, const Tensor& out);

  const Qwen3VisionEncoder* host_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cuda::SectionProfiler* profiler_ = nullptr;
  cuda::DeviceArena weights_, workspace_, activations_, grid_tables_;
  VisionGrid tables_grid_{0, 0, 0};
  Tensor pos_, cos_, sin_;  // BF16 [patches, hidden]; F32 [patches, head_dim] twice
  std::unique_ptr<cuda::GemmRunner> gemm_;
  Linear patch_;
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
};

}  // namespace vortex::text
