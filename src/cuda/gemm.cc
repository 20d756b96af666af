// GemmRunner: the linear layers through cuBLASLt (contract in gemm.h).
//
// cuBLASLt is column-major. A row-major matrix with row stride ld is, to it, the column-major
// transpose with leading dimension ld, so y[N, O] = x[N, I] · w[O, I]ᵀ is computed as
//
//   Yᵀ[O, N] = op(A) · B,  A = w seen as column-major [I, O] (ld ldw), op(A) = Aᵀ = w[O, I]
//                          B = x seen as column-major [I, N] (ld ldx)
//                          D = y seen as column-major [O, N] (ld ldy)
//
// that is m = O, n = N, k = I with (transa, transb) = (T, N) — the "TN" form every cuBLASLt
// kernel family supports. The bias epilogue adds a vector of length m = O along D's rows, which
// is y's per-column bias. Its element type defaults to D's type (bf16 for a bf16 y, f32 for an
// f32 y), which is exactly the contract, so no conversion is needed.
//
// Plans are cached per shape, strides, dtypes, bias and pointer alignments (cublaslt_plan.h). The
// heuristic also reads the bias pointer (for its alignment), so it is set before the algorithm is
// chosen and again on every call.
#include "cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "cuda/cublas_check.h"
#include "cuda/cublaslt_plan.h"

namespace vortex::cuda {
namespace {

struct PlanKey {
  int64_t n, i, o, ldx, ldw, ldy;
  DType in_dtype, out_dtype;
  bool has_bias;
  uint32_t align_x, align_w, align_y, align_bias;

  auto tie() const {
    return std::tie(n, i, o, ldx, ldw, ldy, in_dtype, out_dtype, has_bias, align_x, align_w, align_y, align_bias);
  }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

cudaDataType_t cuda_type(DType dtype) { return dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

bool is_2d_rows(const TensorView& t) { return t.rank() == 2 && t.strides[1] == 1 && t.strides[0] >= t.shape[1]; }

}  // namespace

// Not thread-safe, and one linear at a time: the plans' bias pointers are set per call and every
// call shares the one workspace, so concurrent calls (or streams not ordered with each other)
// need one runner each.
struct GemmRunner::Impl {
  LtSession session;
  std::map<PlanKey, std::unique_ptr<LtPlan>> plans;

  Result<LtPlan*> plan_for(const PlanKey& key, const void* bias);
};

Result<LtPlan*> GemmRunner::Impl::plan_for(const PlanKey& key, const void* bias) {
  auto found = plans.find(key);
  if (found != plans.end()) return found->second.get();

  auto plan = std::make_unique<LtPlan>();
  const cudaDataType_t in_type = cuda_type(key.in_dtype);
  const cudaDataType_t out_type = cuda_type(key.out_dtype);
  // CUBLAS_COMPUTE_32F: fp32 accumulation, and for fp32 inputs true fp32 products (the _FAST_TF32
  // compute type, never requested here, is what would allow TF32).
  VORTEX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  VORTEX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  if (key.has_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    VORTEX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    VORTEX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  VORTEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, in_type, key.i, key.o, key.ldw));
  VORTEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, in_type, key.i, key.n, key.ldx));
  VORTEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, out_type, key.o, key.n, key.ldy));

  // A is the weight, B the activations, D the output.
  VORTEX_RETURN_IF_ERROR(lt_choose_algorithm(session, *plan, {key.align_w, key.align_x, key.align_y}, [&] {
    return "linear N=" + std::to_string(key.n) + " I=" + std::to_string(key.i) + " O=" + std::to_string(key.o) +
           " ldx=" + std::to_string(key.ldx) + " ldw=" + std::to_string(key.ldw) + " ldy=" + std::to_string(key.ldy) +
           " " + dtype_name(key.in_dtype) + "->" + dtype_name(key.out_dtype) + (key.has_bias ? " with bias" : "");
  }));
  LtPlan* raw = plan.get();
  plans.emplace(key, std::move(plan));
  return raw;
}

Result<std::unique_ptr<GemmRunner>> GemmRunner::create(DeviceArena& arena, size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  VORTEX_RETURN_IF_ERROR(impl->session.init(arena, workspace_bytes));
  return std::unique_ptr<GemmRunner>(new GemmRunner(std::move(impl)));
}

GemmRunner::GemmRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmRunner::~GemmRunner() = default;

size_t GemmRunner::cached_plans() const { return impl_->plans.size(); }

Status GemmRunner::linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
                          cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    std::string message = "cuda linear: " + what + " (" + describe_view("x", x) + ", " + describe_view("w", w) +
                          ", " + describe_view("y", y);
    if (bias) message += ", " + describe_view("bias", *bias);
    return invalid_argument(message + ")");
  };
  for (const TensorView* t : {&x, &w, &y}) {
    if (t->device != Device::kCuda) return bad("every operand must be on the device");
  }
  if (bias && bias->device != Device::kCuda) return bad("every operand must be on the device");
  if (!is_2d_rows(x)) return bad("x must be 2-D [N, I] with unit column stride and row stride >= I");
  if (!is_2d_rows(y)) return bad("y must be 2-D [N, O] with unit column stride and row stride >= O");
  if (!is_2d_rows(w)) return bad("w must be 2-D [O, I] with unit column stride and row stride >= I");
  const int64_t n = x.shape[0], in = x.shape[1], out = w.shape[0];
  if (w.shape[1] != in || y.shape[0] != n || y.shape[1] != out) return bad("shapes do not agree");
  if (in < 1 || out < 1) return bad("I and O must be >= 1");
  const bool bf16_in = x.dtype == DType::kBF16 && w.dtype == DType::kBF16 &&
                       (y.dtype == DType::kBF16 || y.dtype == DType::kF32);
  const bool f32_in = x.dtype == DType::kF32 && w.dtype == DType::kF32 && y.dtype == DType::kF32;
  if (!bf16_in && !f32_in) return bad("supported dtypes are (bf16, bf16, bf16|f32) and (f32, f32, f32)");
  if (bias) {
    if (bias->rank() != 1 || bias->shape[0] != out || bias->strides[0] != 1) return bad("bias must be [O], unit stride");
    if (bias->dtype != y.dtype) return bad("bias dtype must match y's (bf16 for a bf16 y, f32 otherwise)");
  }
  if (n == 0) return ok_status();
  // Measured on the H200 (cuBLASLt 13.0): with a bf16 y and the bias epilogue, views that are not
  // 16-byte aligned (pointer or row stride) get an algorithm from the heuristic that writes wrong
  // values, although the alignment preferences say what the buffers have. Every bf16 linear with
  // a bias in the model is aligned; refuse the rest rather than compute garbage.
  if (bias && y.dtype == DType::kBF16) {
    const auto aligned = [](const TensorView& t) {
      return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
             (t.rank() < 2 || (t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype))) % 16 == 0);
    };
    if (!aligned(x) || !aligned(y) || !aligned(*bias)) {
      return bad("a bf16 y with a bias needs 16-byte aligned x, y and bias (pointers and row strides)");
    }
  }

  const PlanKey key{n,
                    in,
                    out,
                    x.strides[0],
                    w.strides[0],
                    y.strides[0],
                    x.dtype,
                    y.dtype,
                    bias != nullptr,
                    lt_alignment_of(x.data),
                    lt_alignment_of(w.data),
                    lt_alignment_of(y.data),
                    bias ? lt_alignment_of(bias->data) : kLtMaxAlignment};
  VORTEX_ASSIGN_OR_RETURN(LtPlan * plan, impl_->plan_for(key, bias ? bias->data : nullptr));
  if (bias) {
    const void* pointer = bias->data;
    VORTEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pointer,
                                                       sizeof(pointer)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  const LtSession& lt = impl_->session;
  VORTEX_CUBLAS_CHECK(cublasLtMatmul(lt.handle, plan->desc, &alpha, w.data, plan->a, x.data, plan->b, &beta, y.data,
                                     plan->d, y.data, plan->d, &plan->algo, lt.workspace, lt.workspace_bytes, stream));
  return ok_status();
}

}  // namespace vortex::cuda
