// What a CudaH3Transformer needs from the other ranks when it is one rank of a sequence-parallel
// group (dist/ulysses.h implements it over NCCL; dist/sequence_parallel_h3.h builds the group).
// Each rank runs every transformer block on its contiguous range of the packed sequence's rows;
// everything per row (norms, modulation, the linears, RoPE) stays local, and only attention, which
// needs every row of a head, and the final residual stream, which the output heads read whole,
// cross ranks. The input projections, the text refiner and the output heads run on every rank over
// all rows (small next to the blocks), so each rank's outputs are the whole request's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/runtime.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

class SequenceParallelPeer {
 public:
  virtual ~SequenceParallelPeer() = default;
  // This rank's rows [begin, end) of an n-row request.
  virtual int64_t row_begin(int64_t n) const = 0;
  virtual int64_t row_end(int64_t n) const = 0;
  // The most rows this rank takes of any request of up to max_rows rows (what its blocks' working
  // buffers hold).
  virtual int64_t max_rows_per_rank(int64_t max_rows) const = 0;
  // The heads whose attention this rank computes, over every row (its int8fp8 workspace's).
  virtual int64_t attention_heads() const = 0;
  // Attention over all n rows: qkv holds this rank's rows of the fused projection (BF16
  // [rows, 3·inner], q and k normed and rotated), attn receives this rank's rows of the output.
  // int8fp8_scratch: null for exact attention; else the int8fp8 mode with its workspace taken from
  // there (cuda::attention_int8fp8). Everything is queued on `stream` (the model's, which a CUDA
  // graph capture swaps).
  virtual Status attention(int64_t n, const TensorView& qkv, const TensorView& attn, float scale,
                           cuda::DeviceArena* int8fp8_scratch, cudaStream_t stream) = 0;
  // x: BF16 [n, C] on the device, contiguous, holding this rank's rows; afterwards every rank's
  // rows (each exactly as its rank computed it).
  virtual Status gather_rows(int64_t n, const TensorView& x, cudaStream_t stream) = 0;
};

}  // namespace vortex::h3
