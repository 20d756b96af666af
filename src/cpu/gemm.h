// CPU reference GEMM: the linear layer every model op uses, and the fp32 matmul under attention.
//
// linear: y[N, O] = x[N, I] · w[O, I]ᵀ + bias[O]. Inputs may be F32 or BF16; all math is fp32
// with fp32 accumulation in k order, and the result is rounded once, RNE, to y's dtype
// (DESIGN section 3). The work is cut into (row block, column block) tiles spread by
// parallel_for; each tile converts what it needs to fp32 and runs one single-threaded matmul.
//
// Variants (both ship; the checker compares them):
//   kBlas  — cblas_sgemm from OpenBLAS (builds with VORTEX_HAVE_OPENBLAS). OpenBLAS is pinned to
//            one thread: threads come from parallel_for tiles, which measured faster than
//            OpenBLAS's own threads here and never puts two pools on the same cores.
//   kLoops — a cache-blocked 6x16 register-tiled kernel in GCC vector extensions (AVX2 + FMA
//            with -march=x86-64-v3); always available.
#pragma once

#include <cstdint>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

enum class GemmVariant { kBlas, kLoops };

const char* gemm_variant_name(GemmVariant variant);  // "blas", "loops"
bool gemm_variant_available(GemmVariant variant);
// kBlas when this build has OpenBLAS and OpenBLAS runs a kernel of its own for this CPU,
// kLoops otherwise (an OpenBLAS that does not recognise the CPU runs generic SSE3 code, slower
// than kLoops). VORTEX_VARIANT_CPU_GEMM=blas|loops overrides it when that variant is available.
GemmVariant default_gemm_variant();

// C[M, N] = alpha · A[M, K] · op(B), op(B) = B[N, K]ᵀ when b_transposed else B[K, N]; all fp32,
// row-major with leading dimensions lda, ldb, ldc (elements, each >= its row length). C is
// overwritten (K == 0 gives zeros). Single-threaded: callers parallelise over output tiles.
// With kLoops every C element is one fp32 chain in k order (each product and each sum rounded: the
// library is built with -ffp-contract=off) whatever M, N and the tiling, so
// linear and attention results do not depend on the thread count. OpenBLAS promises no such
// thing (it may switch kernels by size, and picks them by CPU); its results are stable for the
// same shapes on the same CPU, so the callers cut their tiles independently of the thread count.
// Precondition: gemm_variant_available(variant).
void matmul_f32(GemmVariant variant, bool b_transposed, int64_t m, int64_t n, int64_t k,
                float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                int64_t ldc);

// Columns per tile for a call cut into `row_blocks` row tiles over `out` output columns, before
// the caller rounds them to its panel width: with fewer than 64 row tiles, few enough that there
// are at least 64 tiles for the threads to share; otherwise `out`. A fixed count, not the thread
// count: OpenBLAS picks its kernel by shape, so tiles that followed the threads made the results'
// bits depend on the machine's cores. linear() and the VAEs' conv1d cut their tiles with it.
int64_t few_rows_tile_columns(int64_t row_blocks, int64_t out);

// A weight prepared once for repeated linear calls: fp32 [O, I], row-major. A contiguous F32
// weight is shared, not copied; a BF16 weight is widened to a new fp32 tensor.
class PackedWeight {
 public:
  PackedWeight() = default;
  static Result<PackedWeight> pack(const Tensor& w);

  const Tensor& weight() const { return weight_; }
  int64_t out_features() const { return weight_.size(0); }
  int64_t in_features() const { return weight_.size(1); }

 private:
  explicit PackedWeight(Tensor weight) : weight_(std::move(weight)) {}
  Tensor weight_;
};

// y[N, O] = x[N, I] · w[O, I]ᵀ + bias[O] (bias may be null).
// x, y: F32 or BF16, 2-D, unit stride in the last dim, any row stride; y must not overlap x.
// w: F32 or BF16 contiguous [O, I]. bias: F32 or BF16 [O], unit stride.
// Errors (invalid_argument) name the operand and its shape; an unavailable variant gives
// unimplemented.
Status linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
              GemmVariant variant = default_gemm_variant());
Status linear(const TensorView& x, const PackedWeight& w, const TensorView* bias,
              const TensorView& y, GemmVariant variant = default_gemm_variant());

}  // namespace vortex::cpu
