// Fp8GemmRunner: the fp8 recipe's linear through cuBLASLt (contract in gemm_fp8.h).
//
// As in gemm.cc, the row-major y[M, N] = qa[M, K] · qw[N, K]ᵀ is handed to the column-major
// library as its transpose:
//
//   Yᵀ[N, M] = op(A) · B,  A = qw seen as column-major [K, N] (ld = qw's row stride), op(A) = Aᵀ
//                          B = qa seen as column-major [K, M] (ld = qa's row stride)
//                          D = y  seen as column-major [N, M] (ld = y's row stride)
//
// so cuBLAS's m = N (output channels), n = M (tokens), k = K, in the (T, N) form that fp8 requires
// (both operands K-major). With CUBLASLT_MATRIX_SCALE_OUTER_VEC_32F on A and B, cuBLASLt multiplies
// D[i, j] by A_scale[i] · B_scale[j] for i < m and j < n. A_scale therefore takes the weight's
// per-channel scales sw (length N), and B_scale takes the activations' per-token scales sa
// (length M). The descriptor attributes, and why each is set:
//   COMPUTE_32F, SCALE_TYPE 32F  fp32 accumulation; alpha = 1 and beta = 0 as fp32
//   TRANSA = T, TRANSB = N       the TN form, the only one cuBLASLt's fp8 kernels implement
//   A/B_SCALE_MODE = OUTER_VEC   the per-channel / per-token scale vectors of the recipe (linear_blocks:
//                                VEC128 on the weight, BLK128x128 on the activations)
//   A/B_SCALE_POINTER            sw and sa, set on every call (the plan is shared across calls)
//   FAST_ACCUM = 0               Hopper's fp8 MMA adds with reduced precision inside an
//                                instruction; without fast accumulation cuBLASLt promotes partial
//                                sums to fp32 registers regularly, which is what "fp32 accumulate"
//                                means here (the default, set explicitly so it is visible)
//   EPILOGUE = BIAS, BIAS_DATA_TYPE = 16BF, BIAS_POINTER
//                                a bias[N] along D's rows (y's columns). cuBLASLt's fp8 kernels
//                                take a bf16 bias for bf16 and fp32 outputs alike
// Plans (descriptors, layouts, the chosen algorithm; cublaslt_plan.h) are cached per (shape,
// strides, output dtype, bias, pointer alignments), as in GemmRunner.
#include "cuda/gemm_fp8.h"

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "cpu/fp8_blocks.h"
#include "cuda/cublas_check.h"
#include "cuda/cublaslt_plan.h"
#include "cuda/fp8_blocks.h"
#include "cuda/fp8_quantize.h"

namespace vortex::cuda {
namespace {

constexpr int64_t kFp8Alignment = 16;     // bytes: fp8 operands' pointers and leading dimensions
constexpr int64_t kFp8DimMultiple = 16;   // K and N

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kFp8Alignment == 0; }

struct PlanKey {
  int64_t m, k, n, lda, ldw, ldy;
  DType out_dtype;
  bool has_bias;
  bool block_scales;  // linear_blocks: VEC128 weight scales, BLK128x128 activation scales
  uint32_t align_a, align_w, align_y, align_bias;

  auto tie() const {
    return std::tie(m, k, n, lda, ldw, ldy, out_dtype, has_bias, block_scales, align_a, align_w, align_y, align_bias);
  }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

// The per-call pointers of a plan's descriptor.
struct CallPointers {
  const void* sw;    // A_SCALE_POINTER
  const void* sa;    // B_SCALE_POINTER
  const void* bias;  // BIAS_POINTER, or null
};

Status set_pointers(cublasLtMatmulDesc_t desc, const CallPointers& p) {
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.sw, sizeof(p.sw)));
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.sa, sizeof(p.sa)));
  if (p.bias) {
    VORTEX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  }
  return ok_status();
}

}  // namespace

// Not thread-safe, one linear at a time (the descriptors' pointers are set per call and the
// workspace is shared): concurrent streams need one runner each.
struct Fp8GemmRunner::Impl {
  LtSession session;
  std::map<PlanKey, std::unique_ptr<LtPlan>> plans;  // destroyed before the session's handle

  Result<LtPlan*> plan_for(const PlanKey& key, const CallPointers& pointers);
};

Result<LtPlan*> Fp8GemmRunner::Impl::plan_for(const PlanKey& key, const CallPointers& pointers) {
  auto found = plans.find(key);
  if (found != plans.end()) return found->second.get();

  auto plan = std::make_unique<LtPlan>();
  VORTEX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  // A is the weight, B the activations (see the top of the file).
  const int32_t a_mode = key.block_scales ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const int32_t b_mode =
      key.block_scales ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
  const int8_t fast_accum = 0;
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
  if (key.has_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    VORTEX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    const int32_t bias_type = CUDA_R_16BF;
    VORTEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                       sizeof(bias_type)));
  }
  VORTEX_RETURN_IF_ERROR(set_pointers(plan->desc, pointers));
  const cudaDataType_t out_type = key.out_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  VORTEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, key.k, key.n, key.ldw));
  VORTEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, key.k, key.m, key.lda));
  VORTEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, out_type, key.n, key.m, key.ldy));

  // A is the weight, B the activations, D the output.
  VORTEX_RETURN_IF_ERROR(lt_choose_algorithm(session, *plan, {key.align_w, key.align_a, key.align_y}, [&] {
    return "fp8 linear M=" + std::to_string(key.m) + " K=" + std::to_string(key.k) + " N=" + std::to_string(key.n) +
           " lda=" + std::to_string(key.lda) + " ldw=" + std::to_string(key.ldw) + " ldy=" + std::to_string(key.ldy) +
           " ->" + dtype_name(key.out_dtype) + (key.has_bias ? " with bias" : "") +
           (key.block_scales ? " (128-wide block scales)" : "");
  }));
  LtPlan* raw = plan.get();
  plans.emplace(key, std::move(plan));
  return raw;
}

Result<std::unique_ptr<Fp8GemmRunner>> Fp8GemmRunner::create(DeviceArena& arena, size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  VORTEX_RETURN_IF_ERROR(impl->session.init(arena, workspace_bytes));
  return std::unique_ptr<Fp8GemmRunner>(new Fp8GemmRunner(std::move(impl)));
}

Fp8GemmRunner::Fp8GemmRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Fp8GemmRunner::~Fp8GemmRunner() = default;

size_t Fp8GemmRunner::cached_plans() const { return impl_->plans.size(); }

Status Fp8GemmRunner::linear(const TensorView& qa, const TensorView& sa, const Fp8Weight& w, const TensorView* bias,
                             const TensorView& y, cudaStream_t stream) {
  return linear(qa, sa, w.codes.view(), w.scales.view(), bias, y, stream);
}

Status Fp8GemmRunner::linear(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                             const TensorView* bias, const TensorView& y, cudaStream_t stream) {
  return run(qa, sa, qw, sw, bias, y, false, stream);
}

Status Fp8GemmRunner::linear_blocks(const TensorView& qa, const TensorView& sa, const TensorView& qw,
                                    const TensorView& sw, const TensorView* bias, const TensorView& y,
                                    cudaStream_t stream) {
  return run(qa, sa, qw, sw, bias, y, true, stream);
}

Status Fp8GemmRunner::linear_blocks(const TensorView& qa, const TensorView& sa, const Fp8Weight& w,
                                    const TensorView* bias, const TensorView& y, cudaStream_t stream) {
  return linear_blocks(qa, sa, w.codes.view(), w.scales.view(), bias, y, stream);
}

Status Fp8GemmRunner::run(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                          const TensorView* bias, const TensorView& y, bool block_scales, cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    std::string message = std::string(block_scales ? "cuda linear_fp8_blocks: " : "cuda linear_fp8: ") + what + " (" +
                          describe_view("qa", qa) + ", " +
                          describe_view("sa", sa) + ", " + describe_view("qw", qw) + ", " + describe_view("sw", sw) +
                          ", " + describe_view("y", y);
    if (bias) message += ", " + describe_view("bias", *bias);
    return invalid_argument(message + ")");
  };
  for (const TensorView* t : {&qa, &sa, &qw, &sw, &y}) {
    if (t->device != Device::kCuda) return bad("every operand must be on the device");
  }
  if (bias && bias->device != Device::kCuda) return bad("every operand must be on the device");
  // An fp8 operand: [rows, K] e4m3 with unit column stride; then (after the shapes, so that a bad
  // K is reported as such) a 16-byte aligned base and row stride.
  const auto fp8_rows_ok = [](const TensorView& t) {
    return t.dtype == DType::kF8E4M3 && t.rank() == 2 && t.strides[1] == 1 && t.strides[0] >= t.shape[1];
  };
  const auto fp8_aligned = [](const TensorView& t) { return t.strides[0] % kFp8Alignment == 0 && aligned(t.data); };
  if (!fp8_rows_ok(qa)) return bad("activation codes qa must be F8_E4M3 [M, K] with unit column stride");
  if (!fp8_rows_ok(qw)) return bad("weight codes qw must be F8_E4M3 [N, K] with unit column stride");
  const int64_t m = qa.shape[0], k = qa.shape[1], n = qw.shape[0];
  if (qw.shape[1] != k) return bad("weight codes qw and activation codes qa differ in K");
  if (k < kFp8DimMultiple || k % kFp8DimMultiple != 0) return bad("K must be a positive multiple of 16");
  if (n < kFp8DimMultiple || n % kFp8DimMultiple != 0) return bad("N (weight rows) must be a positive multiple of 16");
  if (!fp8_aligned(qa)) return bad("activation codes qa need a 16-byte aligned base and row stride");
  if (!fp8_aligned(qw)) return bad("weight codes qw need a 16-byte aligned base and row stride");
  if (block_scales) {
    // One scale per 128 tokens × 128 inputs (sa, kTiles) and per output channel × 128 inputs (sw,
    // kRows), in the layouts of cpu/fp8_blocks.h, which are the ones cuBLASLt reads.
    const auto blocks_ok = [](const TensorView& t, const Shape& shape) {
      return t.dtype == DType::kF32 && t.shape == shape && t.is_contiguous() && aligned(t.data);
    };
    if (k % 128 != 0) return bad("K must be a multiple of 128 for block scales");
    const Shape sa_shape = cpu::fp8_block_scales(cpu::Fp8BlockLayout::kTiles, m, k).shape;
    const Shape sw_shape = cpu::fp8_block_scales(cpu::Fp8BlockLayout::kRows, n, k).shape;
    if (!blocks_ok(sa, sa_shape)) {
      return bad("activation scales sa must be a contiguous F32 " + sa_shape.to_string() +
                 " (cpu::Fp8BlockLayout::kTiles), 16-byte aligned");
    }
    if (!blocks_ok(sw, sw_shape)) {
      return bad("weight scales sw must be a contiguous F32 " + sw_shape.to_string() +
                 " (cpu::Fp8BlockLayout::kRows), 16-byte aligned");
    }
  } else {
    const auto scales_ok = [](const TensorView& t, int64_t len) {
      return t.dtype == DType::kF32 && t.rank() == 1 && t.shape[0] == len && t.strides[0] == 1 && aligned(t.data);
    };
    if (!scales_ok(sa, m)) return bad("activation scales sa must be F32 [M], unit stride, 16-byte aligned");
    if (!scales_ok(sw, n)) return bad("weight scales sw must be F32 [N], unit stride, 16-byte aligned");
  }
  if (y.dtype != DType::kBF16 && y.dtype != DType::kF32) return bad("output y must be BF16 or F32");
  const int64_t y_esize = static_cast<int64_t>(dtype_size(y.dtype));
  if (y.rank() != 2 || y.shape[0] != m || y.shape[1] != n || y.strides[1] != 1 || y.strides[0] < n ||
      (y.strides[0] * y_esize) % kFp8Alignment != 0 || !aligned(y.data)) {
    return bad("output y must be [M, N], unit column stride, 16-byte aligned base and row stride");
  }
  if (bias && (bias->dtype != DType::kBF16 || bias->rank() != 1 || bias->shape[0] != n || bias->strides[0] != 1 ||
               !aligned(bias->data))) {
    return bad("bias must be BF16 [N], unit stride, 16-byte aligned (cuBLASLt's fp8 epilogue takes a bf16 bias)");
  }
  if (m == 0) return ok_status();

  const PlanKey key{m,
                    k,
                    n,
                    qa.strides[0],
                    qw.strides[0],
                    y.strides[0],
                    y.dtype,
                    bias != nullptr,
                    block_scales,
                    lt_alignment_of(qa.data),
                    lt_alignment_of(qw.data),
                    lt_alignment_of(y.data),
                    bias ? lt_alignment_of(bias->data) : kLtMaxAlignment};
  const CallPointers pointers{sw.data, sa.data, bias ? bias->data : nullptr};
  VORTEX_ASSIGN_OR_RETURN(LtPlan * plan, impl_->plan_for(key, pointers));
  VORTEX_RETURN_IF_ERROR(set_pointers(plan->desc, pointers));
  const float alpha = 1.0f, beta = 0.0f;
  const LtSession& lt = impl_->session;
  VORTEX_CUBLAS_CHECK(cublasLtMatmul(lt.handle, plan->desc, &alpha, qw.data, plan->a, qa.data, plan->b, &beta,
                                     y.data, plan->d, y.data, plan->d, &plan->algo, lt.workspace, lt.workspace_bytes,
                                     stream));
  return ok_status();
}

namespace {

// Quantizes w into fresh codes and scales of `scale_shape` in `arena` with `quantize` (a device
// pass over a device view); a host weight goes through a scratch copy at the top of the arena.
template <typename Quantize>
Result<Fp8Weight> quantize_weight(const Tensor& w, const Shape& scale_shape, DeviceArena& arena, cudaStream_t stream,
                                  const std::string& op, Quantize quantize) {
  if (w.rank() != 2 || (w.dtype() != DType::kF32 && w.dtype() != DType::kBF16) || !w.is_contiguous()) {
    return invalid_argument(op + " weight: must be a contiguous F32 or BF16 [O, I], got " + w.describe());
  }
  Fp8Weight out;
  VORTEX_ASSIGN_OR_RETURN(out.codes, arena.alloc(w.shape(), DType::kF8E4M3));
  VORTEX_ASSIGN_OR_RETURN(out.scales, arena.alloc(scale_shape, DType::kF32));
  if (w.device() == Device::kCuda) {
    VORTEX_RETURN_IF_ERROR(quantize(w.view(), out).with_context(op + " weight"));
    return out;
  }
  // The scratch copy sits above the codes and scales, so releasing it leaves them in place.
  const size_t mark = arena.mark();
  const auto quantize_from_host = [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(Tensor scratch, arena.alloc(w.shape(), w.dtype()));
    VORTEX_RETURN_IF_ERROR(copy_to_device_staged(w, scratch, stream));
    VORTEX_RETURN_IF_ERROR(quantize(scratch.view(), out).with_context(op + " weight"));
    // The kernel must finish reading the scratch before the arena hands its memory out again.
    VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream));
    return ok_status();
  };
  const Status status = quantize_from_host();
  // After a failure, copies or the kernel may still be in flight into or out of the scratch:
  // wait for them (best effort; the first error is the one reported) before releasing it.
  if (!status.ok()) cudaStreamSynchronize(stream);
  arena.release_to(mark);
  if (!status.ok()) return status;
  return out;
}

}  // namespace

Result<Fp8Weight> quantize_weight_fp8(const Tensor& w, DeviceArena& arena, cudaStream_t stream) {
  const Shape scale_shape = w.rank() == 2 ? Shape({w.size(0)}) : Shape();
  return quantize_weight(w, scale_shape, arena, stream, "quantize_weight_fp8",
                         [&](const TensorView& x, const Fp8Weight& out) {
                           return quantize_rows_fp8(x, out.codes.view(), out.scales.view(), stream);
                         });
}

Result<Fp8Weight> quantize_weight_fp8_blocks(const Tensor& w, DeviceArena& arena, cudaStream_t stream) {
  const std::string op = "quantize_weight_fp8_blocks";
  if (w.rank() == 2 && (w.size(1) < 1 || w.size(1) % cpu::kFp8BlockCols != 0)) {
    return invalid_argument(op + " weight: " + std::to_string(w.size(1)) + " inputs, not a positive multiple of " +
                            std::to_string(cpu::kFp8BlockCols));
  }
  const Shape scale_shape =
      w.rank() == 2 ? cpu::fp8_block_scales(cpu::Fp8BlockLayout::kRows, w.size(0), w.size(1)).shape : Shape();
  return quantize_weight(w, scale_shape, arena, stream, op, [&](const TensorView& x, const Fp8Weight& out) {
    return quantize_blocks_fp8(x, cpu::Fp8BlockLayout::kRows, out.codes.view(), out.scales.view(), stream);
  });
}

}  // namespace vortex::cuda
