// What the two cuBLASLt runners (gemm.cc: bf16 / f32, gemm_fp8.cc: e4m3) share: the handle and
// workspace they own, a plan (descriptors, layouts and the algorithm chosen for one problem), the
// pointer alignments that key a plan, and the algorithm choice itself.
//
// A plan depends on the pointers only through their alignment: the heuristic excludes kernels
// that need more alignment than the buffers have. So the alignments are part of each runner's plan
// key, and the pointers are set per call.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <functional>
#include <string>

#include "cuda/runtime.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// The largest alignment any cuBLASLt kernel asks for (and the preferences' default).
constexpr uint32_t kLtMaxAlignment = 256;

// The largest power of two (<= kLtMaxAlignment) that divides the address.
uint32_t lt_alignment_of(const void* p);

// The handle and the workspace one runner owns. Not thread-safe: one call at a time.
struct LtSession {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace_tensor;  // keeps the arena's storage alive as long as the runner
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  LtSession() = default;
  LtSession(const LtSession&) = delete;
  LtSession& operator=(const LtSession&) = delete;
  ~LtSession();
  // Takes `workspace_bytes` from the arena (none when 0) and creates the handle.
  Status init(DeviceArena& arena, size_t workspace_bytes);
};

// Owns the descriptors of one problem and the algorithm chosen for it.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan();
};

// Pointer alignments, in bytes, of A (the weight), B (the activations) and C = D (the output;
// beta = 0 still lets kernels read C's pointer).
struct LtAlignments {
  uint32_t a, b, d;
};

// Asks the heuristic for candidates for plan.desc / a / b / d within the session's workspace and
// the given alignments, and keeps the first that fits the workspace in plan.algo. None:
// unimplemented, with `describe()` naming the problem.
Status lt_choose_algorithm(const LtSession& session, LtPlan& plan, LtAlignments alignments,
                           const std::function<std::string()>& describe);

}  // namespace vortex::cuda
