// A transformer block under the `fp8` recipe on the CPU (LinearRecipe::kFp8): the program of the
// CUDA model's fp8 block (cuda_block_fp8.cc), op for op, with the cpu/fp8.h references of its
// kernels, so that the GPU recipe has a reference to be compared with. The block's program is the
// bf16 one; only the four linears differ, each reading e4m3 activations from the op that produces
// them:
//
//   norm1 + modulation            -> e4m3, a scale per token -> QKV   (rms_norm_fused_quantize_fp8)
//   attention output              -> e4m3, a scale per 128 tokens × head -> out proj
//                                    (quantize_blocks_fp8, linear_fp8_blocks)
//   residual + norm2 + modulation -> e4m3, per token -> FC1           (rms_norm_fused_quantize_fp8)
//   SwiGLU                        -> e4m3, per token -> FC2           (swiglu_quantize_fp8)
//
// then the gated FFN residual in bf16. The refiner, which has no AdaLN, keeps the bf16 program
// here as on the GPU.
#include <algorithm>
#include <utility>

#include "cpu/elementwise.h"
#include "cpu/fp8.h"
#include "models/h3/tensor_views.h"
#include "models/h3/transformer.h"

namespace vortex::h3 {

// The fused QKV is quantized as one [3·inner, C] matrix (rows q_all; k_all; v_all), as the CUDA
// loader stacks it: per-output-channel scales make that the same as quantizing q, k, v apart. The
// out projection's weight takes a scale per output channel and 128 inputs (its activations' scales
// are per 128 tokens × one head).
Status H3Transformer::quantize_block_fp8(const BlockWeights& w, Block& b) {
  const std::pair<const LinearWeights*, Linear*> plain[] = {{&w.qkv, &b.qkv}, {&w.fc1, &b.fc1}, {&w.fc2, &b.fc2}};
  cpu::Fp8Rows* codes[] = {&b.fp8.qkv, &b.fp8.fc1, &b.fp8.fc2};
  for (int i = 0; i < 3; ++i) {
    VORTEX_ASSIGN_OR_RETURN(*codes[i], cpu::quantize_weight_fp8(plain[i].first->weight.view()));
    plain[i].second->bias = plain[i].first->bias;
  }
  VORTEX_ASSIGN_OR_RETURN(b.fp8.out, cpu::quantize_blocks_fp8(w.out.weight.view(), cpu::Fp8BlockLayout::kRows));
  b.out.bias = w.out.bias;
  return ok_status();
}

Status H3Transformer::transformer_block_fp8(const Block& b, Tensor& x, const Tensor& silu_temb,
                                            const std::vector<int32_t>& rows, const PreparedRequest& request,
                                            AttentionMode mode) const {
  const H3Config& c = config();
  const int64_t n = x.size(0), C = c.hidden_size, inner = c.inner_dim(), F = c.ffn_dim;
  const float eps = static_cast<float>(c.norm_eps);
  VORTEX_ASSIGN_OR_RETURN(Tensor mod, block_modulation(b, silu_temb));
  const TensorView shift1 = columns(mod, 0, C), scale1 = columns(mod, C, C), gate1 = columns(mod, 2 * C, C);
  const TensorView shift2 = columns(mod, 3 * C, C), scale2 = columns(mod, 4 * C, C);
  const TensorView n1 = b.norm1.view(), n2 = b.norm2.view();
  // One code buffer as wide as the widest GEMM input, read through column views, as on the GPU.
  Tensor codes = Tensor::empty({n, std::max({C, inner, F})}, DType::kF8E4M3);
  Tensor scales = Tensor::empty({n}, DType::kF32);
  Tensor tile_scales = Tensor::empty(cpu::fp8_block_scales(cpu::Fp8BlockLayout::kTiles, n, inner).shape, DType::kF32);
  const TensorView sv = scales.view();
  Tensor qkv = Tensor::empty({n, 3 * inner}, dtype());
  Tensor attn = Tensor::empty({n, inner}, dtype());
  Tensor branch = Tensor::empty({n, C}, dtype());
  Tensor u = Tensor::empty({n, 2 * F}, dtype());
  const TensorView branch_view = branch.view();
  auto gemm = [&](const cpu::Fp8Rows& w, const Linear& l, int64_t width, const Tensor& y) -> Status {
    const TensorView bias = l.bias.defined() ? l.bias.view() : TensorView();
    return cpu::linear_fp8(columns(codes, 0, width), sv, w.codes.view(), w.scales.view(),
                           l.bias.defined() ? &bias : nullptr, y.view());
  };

  const cpu::Fp8NormFusion first{nullptr, nullptr, nullptr, &shift1, &scale1, &rows};
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm_fused_quantize_fp8(x.view(), &n1, eps, first, columns(codes, 0, C), sv));
  VORTEX_RETURN_IF_ERROR(gemm(b.fp8.qkv, b.qkv, C, qkv));
  VORTEX_RETURN_IF_ERROR(attention_core(b, qkv, &request.rope_cos, &request.rope_sin, mode, attn));
  VORTEX_RETURN_IF_ERROR(
      cpu::quantize_blocks_fp8(attn.view(), cpu::Fp8BlockLayout::kTiles, columns(codes, 0, inner), tile_scales.view()));
  {
    const TensorView bias = b.out.bias.defined() ? b.out.bias.view() : TensorView();
    VORTEX_RETURN_IF_ERROR(cpu::linear_fp8_blocks(columns(codes, 0, inner), tile_scales.view(), b.fp8.out.codes.view(),
                                                  b.fp8.out.scales.view(), b.out.bias.defined() ? &bias : nullptr,
                                                  branch.view()));
  }
  const cpu::Fp8NormFusion second{&branch_view, &gate1, &rows, &shift2, &scale2, &rows};
  VORTEX_RETURN_IF_ERROR(cpu::rms_norm_fused_quantize_fp8(x.view(), &n2, eps, second, columns(codes, 0, C), sv));
  VORTEX_RETURN_IF_ERROR(gemm(b.fp8.fc1, b.fc1, C, u));
  VORTEX_RETURN_IF_ERROR(cpu::swiglu_quantize_fp8(u.view(), columns(codes, 0, F), sv));
  VORTEX_RETURN_IF_ERROR(gemm(b.fp8.fc2, b.fc2, F, branch));
  return cpu::gated_residual(x.view(), columns(mod, 5 * C, C), rows, branch_view);
}

}  // namespace vortex::h3
