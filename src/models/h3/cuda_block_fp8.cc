// A transformer block under the `fp8` recipe (LinearRecipe::kFp8). The block's program is the
// bf16 one; only the four linears differ. Each takes e4m3 activations written by the kernel that
// produces them, and no bf16 copy of those activations is written:
//
//   norm1 + modulation   -> e4m3, a scale per token -> QKV        (rms_norm_fused_quantize_fp8)
//   attention output     -> e4m3, a scale per 128 tokens × head -> out proj (linear_blocks)
//                           (the attention kernels quantize their own output tiles; where no
//                           such kernel applies, quantize_blocks_fp8 reads the bf16 output)
//   residual + norm2 + modulation -> e4m3, per token -> FC1       (rms_norm_fused_quantize_fp8)
//   SwiGLU               -> e4m3, per token -> FC2                (swiglu_quantize_fp8)
//
// The bf16 values those kernels quantize are bitwise the bf16 path's, so the recipe's error is the
// quantisation and the fp8 GEMMs alone (bench h3-block states it against the bf16 block).
#include "cpu/fp8_blocks.h"
#include "cuda/elementwise.h"
#include "cuda/fp8_quantize.h"
#include "cuda/gemm_fp8.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/tensor_views.h"

namespace vortex::h3 {

Status CudaH3Transformer::block_forward_fp8(const Block& b, const Tensor& x, const Tensor& adaln_rows,
                                            AttentionMode mode, const PendingResidual* pending_in,
                                            PendingResidual* pending_out) {
  const H3Config& c = config_;
  const int64_t n = x.size(0), C = c.hidden_size, inner = c.inner_dim(), F = c.ffn_dim;
  const float eps = static_cast<float>(c.norm_eps);
  VORTEX_ASSIGN_OR_RETURN(Tensor mod, block_modulation(b));
  const int32_t* rows = adaln_rows.data_as<int32_t>();  // the block's rows' (this rank's)
  const TensorView n1 = b.norm1.view(), n2 = b.norm2.view();
  VORTEX_ASSIGN_OR_RETURN(Tensor codes, codes_.slice(0, 0, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor scales, code_scales_.slice(0, 0, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor tile_scales,
                          tile_scales_.slice(0, 0, cpu::fp8_block_scales(cpu::Fp8BlockLayout::kTiles, n, inner).row_blocks));
  const TensorView sv = scales.view();
  VORTEX_ASSIGN_OR_RETURN(Tensor qkv, work_.qkv.slice(0, 0, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor attn, work_.attn.slice(0, 0, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor branch, work_.branch.slice(0, 0, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor u, work_.fc1.slice(0, 0, n));
  auto gemm = [&](const char* section, const cuda::Fp8Weight& w, const Linear& l, int64_t width,
                  const Tensor& y) -> Status {
    cuda::SectionScope scope(profiler_, section, stream_);
    const TensorView bias = l.bias.defined() ? l.bias.view() : TensorView();
    return fp8_gemm_->linear(columns(codes, 0, width), sv, w, l.bias.defined() ? &bias : nullptr, y.view(), stream_);
  };

  const TensorView shift1 = columns(mod, 0, C), scale1 = columns(mod, C, C), gate1 = columns(mod, 2 * C, C);
  const TensorView shift2 = columns(mod, 3 * C, C), scale2 = columns(mod, 4 * C, C), branch_view = branch.view();
  {
    cuda::SectionScope scope(profiler_, pending_in ? "residual_norm_modulate_quantize" : "norm_modulate_quantize",
                             stream_);
    const cuda::NormFusion first =
        pending_in ? cuda::NormFusion{&pending_in->branch, &pending_in->gate, rows, &shift1, &scale1, rows}
                   : cuda::NormFusion{nullptr, nullptr, nullptr, &shift1, &scale1, rows};
    VORTEX_RETURN_IF_ERROR(
        cuda::rms_norm_fused_quantize_fp8(x.view(), &n1, eps, first, columns(codes, 0, C), sv, stream_));
  }
  VORTEX_RETURN_IF_ERROR(gemm("gemm_qkv", b.fp8.qkv, b.qkv, C, qkv));
  E4m3Tiles attn_codes{TensorView(), tile_scales.view()};
  VORTEX_RETURN_IF_ERROR(attention_core(b, qkv, /*rope=*/true, mode, attn, &attn_codes));
  {
    cuda::SectionScope scope(profiler_, "gemm_out", stream_);
    const TensorView bias = b.out.bias.defined() ? b.out.bias.view() : TensorView();
    VORTEX_RETURN_IF_ERROR(fp8_gemm_->linear_blocks(attn_codes.codes, attn_codes.scales, b.fp8.out,
                                                    b.out.bias.defined() ? &bias : nullptr, branch.view(), stream_));
  }
  {
    cuda::SectionScope scope(profiler_, "residual_norm_modulate_quantize", stream_);
    const cuda::NormFusion second{&branch_view, &gate1, rows, &shift2, &scale2, rows};
    VORTEX_RETURN_IF_ERROR(
        cuda::rms_norm_fused_quantize_fp8(x.view(), &n2, eps, second, columns(codes, 0, C), sv, stream_));
  }
  VORTEX_RETURN_IF_ERROR(gemm("gemm_fc1", b.fp8.fc1, b.fc1, C, u));
  {
    cuda::SectionScope scope(profiler_, "swiglu_quantize", stream_);
    VORTEX_RETURN_IF_ERROR(cuda::swiglu_quantize_fp8(u.view(), columns(codes, 0, F), sv, stream_));
  }
  VORTEX_RETURN_IF_ERROR(gemm("gemm_fc2", b.fp8.fc2, b.fc2, F, branch));
  const TensorView gate2 = columns(mod, 5 * C, C);
  if (pending_out) {
    *pending_out = {branch_view, gate2};
    return ok_status();
  }
  cuda::SectionScope scope(profiler_, "residual", stream_);
  return cuda::gated_residual(x.view(), gate2, rows, branch_view, stream_);
}

}  // namespace vortex::h3
