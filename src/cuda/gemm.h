// GEMMs through cuBLASLt: the linear layers of every model.
//
//   y[N, O] = x[N, I] · w[O, I]ᵀ (+ bias[O])
//
// bf16 x / w with fp32 accumulation and a bf16 or fp32 y (rounded once, in the epilogue), and
// the fp32 islands (patch projections, time MLP, output heads) in true fp32 (CUBLAS_COMPUTE_32F,
// no TF32), with fp32 bias. Row-major tensors are passed to the column-major library as their
// transposes. Plans (matmul descriptors, layouts and the heuristic's chosen algorithm) are cached
// per (shape, strides, dtypes, bias) in the GemmRunner, so a step loop never asks the heuristic
// twice; the workspace is allocated once at creation.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "cuda/runtime.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

class GemmRunner {
 public:
  static Result<std::unique_ptr<GemmRunner>> create(DeviceArena& arena, size_t workspace_bytes = 64u << 20);
  ~GemmRunner();

  // x: [N, I] (row stride >= I, unit column stride), w: [O, I] (row stride >= I, unit column
  // stride: a column range of a wider weight, as a causal conv's real taps), bias: [O] or null,
  // y: [N, O] (row stride >= O). Supported: (x, w, y) = (bf16, bf16, bf16|f32) or (f32, f32, f32).
  // bias dtype: bf16 for a bf16 y (rounded like the reference's bf16 linear), f32 otherwise.
  Status linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
                cudaStream_t stream);

  size_t cached_plans() const;

 private:
  struct Impl;
  explicit GemmRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vortex::cuda
