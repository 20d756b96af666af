// The `fp8` recipe's linear through cuBLASLt (DESIGN section 3; reference: cpu::linear_fp8):
//
//   y[M, N] = R(((Σ_k qa[m, k] · qw[n, k]) · sa[m]) · sw[n] + bias[n])
//
// qa are e4m3 activation codes with one fp32 scale per token (sa), and qw are e4m3 weight codes
// with one fp32 scale per output channel (sw), both as cpu/fp8_scale.h defines them. Products
// are accumulated in fp32 (no fast accumulation), and y (bf16 or fp32) is rounded once, in the
// epilogue. cuBLASLt's outer-vector scaling mode applies both scale vectors there.
//
// cuBLASLt's fp8 kernels need the "TN" form and 16-byte alignment. Hence K and N must be
// multiples of 16; qa, qw and y 16-byte aligned with row strides that are 16-byte multiples; the
// scale vectors and the bias 16-byte aligned. M (tokens) is free. Operands outside these rules
// are refused as invalid_argument rather than handed to a kernel that might compute garbage.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "cuda/runtime.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// A linear's weight in the fp8 recipe, in device memory.
struct Fp8Weight {
  Tensor codes;   // [O, I] F8_E4M3, contiguous
  Tensor scales;  // [O] F32 (quantize_weight_fp8), or [I / 128, O] F32 (quantize_weight_fp8_blocks)
};

// Quantizes a weight [O, I] (F32 or BF16, contiguous, on the host or the device) per output
// channel into `arena`. The result is bitwise cpu::quantize_weight_fp8's. A host weight is staged
// through a bf16/f32 scratch copy at the top of the arena, which is released before returning;
// the call synchronises `stream`.
Result<Fp8Weight> quantize_weight_fp8(const Tensor& w, DeviceArena& arena, cudaStream_t stream);
// The same with one scale per output channel and 128 inputs (cpu::Fp8BlockLayout::kRows), the
// weight of a block-scaled linear (linear_blocks); I a multiple of 128. Bitwise
// cpu::quantize_blocks_fp8's.
Result<Fp8Weight> quantize_weight_fp8_blocks(const Tensor& w, DeviceArena& arena, cudaStream_t stream);

class Fp8GemmRunner {
 public:
  static Result<std::unique_ptr<Fp8GemmRunner>> create(DeviceArena& arena, size_t workspace_bytes = 64u << 20);
  ~Fp8GemmRunner();

  // qa: [M, K] F8_E4M3 (row stride >= K), sa: [M] F32; qw: [N, K] F8_E4M3 (row stride >= K),
  // sw: [N] F32; bias: [N] BF16 or null (cuBLASLt's fp8 epilogue takes a bf16 bias for both
  // output types); y: [M, N] BF16 or F32 (row stride >= N).
  Status linear(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                const TensorView* bias, const TensorView& y, cudaStream_t stream);
  Status linear(const TensorView& qa, const TensorView& sa, const Fp8Weight& w, const TensorView* bias,
                const TensorView& y, cudaStream_t stream);

  // The block-scaled linear (cpu::linear_fp8_blocks): sa one scale per 128 tokens × 128 inputs
  // (cpu::Fp8BlockLayout::kTiles), sw one per output channel × 128 inputs (kRows); K a multiple of
  // 128. cuBLASLt's VEC128 (weight) × BLK128x128 (activation) scaling, the pair sm_90 offers, with
  // the scale layouts tools/bench/probe_block_scaled_fp8_gemm.cu found it to read.
  Status linear_blocks(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                       const TensorView* bias, const TensorView& y, cudaStream_t stream);
  Status linear_blocks(const TensorView& qa, const TensorView& sa, const Fp8Weight& w, const TensorView* bias,
                       const TensorView& y, cudaStream_t stream);

  size_t cached_plans() const;

 private:
  Status run(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
             const TensorView* bias, const TensorView& y, bool block_scales, cudaStream_t stream);
  struct Impl;
  explicit Fp8GemmRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vortex::cuda
