#include "cuda/cublaslt_plan.h"

#include <utility>

#include "cuda/cublas_check.h"

namespace vortex::cuda {

namespace {

// Candidate algorithms asked of the heuristic; the first that fits the workspace is kept. Eight
// is enough that one fits whenever any does (they come best first, and most need little or none).
constexpr int kHeuristicRequests = 8;

struct PreferenceHandle {
  cublasLtMatmulPreference_t pref = nullptr;
  ~PreferenceHandle() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
};

}  // namespace

uint32_t lt_alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 1;
  while (a < kLtMaxAlignment && address % (2 * a) == 0) a *= 2;
  return a;
}

LtSession::~LtSession() {
  if (handle) cublasLtDestroy(handle);
}

Status LtSession::init(DeviceArena& arena, size_t bytes) {
  if (bytes > 0) {
    VORTEX_ASSIGN_OR_RETURN(workspace_tensor, arena.alloc(Shape({static_cast<int64_t>(bytes)}), DType::kU8));
    workspace = workspace_tensor.data();
    workspace_bytes = bytes;
  }
  VORTEX_CUBLAS_CHECK(cublasLtCreate(&handle));
  return ok_status();
}

LtPlan::~LtPlan() {
  if (d) cublasLtMatrixLayoutDestroy(d);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (desc) cublasLtMatmulDescDestroy(desc);
}

Status lt_choose_algorithm(const LtSession& session, LtPlan& plan, LtAlignments alignments,
                           const std::function<std::string()>& describe) {
  PreferenceHandle pref;
  VORTEX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.pref));
  const uint64_t max_workspace = session.workspace_bytes;
  VORTEX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &max_workspace, sizeof(max_workspace)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> minimum[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignments.a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignments.b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignments.d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignments.d},
  };
  for (const auto& [attribute, value] : minimum) {
    VORTEX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.pref, attribute, &value, sizeof(value)));
  }

  cublasLtMatmulHeuristicResult_t results[kHeuristicRequests] = {};
  int count = 0;
  VORTEX_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(session.handle, plan.desc, plan.a, plan.b, plan.d, plan.d,
                                                     pref.pref, kHeuristicRequests, results, &count));
  for (int r = 0; r < count; ++r) {
    if (results[r].state == CUBLAS_STATUS_SUCCESS && results[r].workspaceSize <= session.workspace_bytes) {
      plan.algo = results[r].algo;
      return ok_status();
    }
  }
  return unimplemented("cuBLASLt offers no algorithm for " + describe() + " within " +
                       std::to_string(session.workspace_bytes) + " workspace bytes");
}

}  // namespace vortex::cuda
