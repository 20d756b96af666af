// The Qwen3-VL text encoder on the GPU: Qwen3TextEncoder's program (qwen3_text_encoder.h) with
// its layers' weights resident on the device, for prompts encoded next to a CUDA transformer.
//
// The same ops at the same rounding points as the CPU program: RMSNorm rounded before and after
// its weight (cuda::rms_norm, kBeforeWeight), cuBLASLt bf16 GEMMs rounded once, rotate-half RoPE
// over the whole head, causal grouped-query attention (cuda::causal_attention), SwiGLU and the
// residual sums. Two GEMMs are merged where the CPU runs them apart: q, k and v in one product
// with the three weights stacked, and up and gate in one ([up; gate], giving SwiGLU's
// [value | gate] directly); each output column is the same dot product either way. The results
// differ from the CPU only by summation order (GEMM k order, the norms' sums, the online softmax):
// tests/gpu/test_gpu_text_encoder.cc states the bound.
//
// Memory: every linear of layers [0, layer) in bf16 (the released encoder's 50 layers: ~49 GB),
// the norm weights, per encode an arena sized for its tokens, and the RoPE tables of the longest
// prompt so far (a row depends on its position only, so its first N rows serve any shorter prompt;
// built on the host for every encode they were ~7% of a 512-token one). The embedding table stays
// in host memory (memory-mapped); the prompt's rows are gathered there and uploaded.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/runtime.h"
#include "text/qwen3_text_encoder.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::text {

class CudaQwen3TextEncoder {
 public:
  // Uploads `host`'s layers (it must outlive this object: the embedding rows are read from it).
  // The linear weights must be BF16 (the released checkpoint's); an F32 one is refused by name.
  static Result<std::unique_ptr<CudaQwen3TextEncoder>> create(const Qwen3TextEncoder& host,
                                                              cudaStream_t stream = nullptr);

  // Qwen3TextEncoder::encode's contract: [ids.size(), hidden] BF16 on the host. With images, the
  // presentation's embedding rows are placed on the host, its multimodal RoPE tables are built
  // there for this encode, and the DeepStack features go up with the embeddings.
  Result<Tensor> encode(const std::vector<int32_t>& ids, const std::vector<VisionFeatures>& images = {});

  size_t weight_bytes() const { return weights_.used(); }

 private:
  struct Layer {
    Tensor input_norm, post_norm, q_norm, k_norm;  // [C], [C], [D], [D] as stored (BF16 or F32)
    Tensor qkv;      // BF16 [(H + 2·Hkv)·D, C]: q_proj, k_proj, v_proj rows
    Tensor o;        // BF16 [C, H·D]
    Tensor up_gate;  // BF16 [2F, C]: up_proj, gate_proj rows
    Tensor down;     // BF16 [C, F]
  };

  CudaQwen3TextEncoder() = default;
  Status upload_layers();
  // Makes rope_cos_ / rope_sin_ hold at least `rows` positions.
  Status ensure_rope_rows(int64_t rows);

  const Qwen3TextEncoder* host_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceArena weights_, workspace_, activations_, rope_;
  Tensor rope_cos_, rope_sin_;  // F32 [rows, D] on the device, Qwen3TextEncoder::rope_tables' values
  std::unique_ptr<cuda::GemmRunner> gemm_;
  std::vector<Layer> layers_;
};

}  // namespace vortex::text
