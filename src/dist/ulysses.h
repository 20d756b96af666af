// Sequence-parallel attention for one rank of a LocalGpuGroup (DeepSpeed-Ulysses): every rank
// holds a contiguous range of the packed sequence's rows; attention needs every row of a head.
// Two all-to-alls move the work between the two layouts:
//
//   gather_heads:  this rank's rows of the fused q | k | v projection, [n_r, 3·H·D]
//                  → every row of this rank's H/P heads, full_qkv [N, 3·(H/P)·D] (q | k | v)
//   attention:     cuda::attention over N rows for H/P heads, into full_attn [N, (H/P)·D]
//   scatter_heads: full_attn → this rank's rows of all H heads, [n_r, H·D]
//
// The attention kernel sees the same N keys and queries of a head on any number of ranks, so a
// head's output is bit for bit the single-GPU one; the exchanges only move bytes. Rank r's head
// group is heads [r·H/P, (r+1)·H/P). Ranks take rows [begin_r, end_r) in order, so what rank s
// receives from rank r lands at rows [begin_r, end_r) of its full buffers without reordering; the
// columns of another rank's heads are packed into a staging buffer first (NCCL sends contiguous
// bytes), one 2-D copy per q / k / v part and peer.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda/runtime.h"
#include "dist/local_gpu_group.h"
#include "models/h3/sequence_parallel.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::dist {

struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Ranges start at multiples of this many rows where every rank gets at least one such block: the
// fp8 recipe quantizes the attention output in tiles of 128 tokens, which then are the one-GPU
// tiles on every rank.
constexpr int64_t kRowGranule = 128;

// `rows` rows over `ranks` ranks in contiguous ranges, in rank order: whole kRowGranule blocks (the
// last one short) when rows >= kRowGranule · ranks, else single rows; the first ranks one block
// longer where they do not divide evenly. A rank gets no rows only when rows < ranks.
std::vector<RowRange> partition_rows(int64_t rows, int ranks);
// The most rows any rank takes of any request of 1..max_rows rows: the first rank's share of
// max_rows (the shares grow with the rows, and the first rank's is the longest).
int64_t max_rows_per_rank(int64_t max_rows, int ranks);

class UlyssesAttention : public h3::SequenceParallelPeer {
 public:
  // Buffers for up to `max_rows` rows on `rank`'s device (call with it current). heads must be a
  // multiple of the group's size. Each call queues its copies, collectives and kernel on the
  // stream it is given.
  static Result<std::unique_ptr<UlyssesAttention>> create(LocalGpuGroup& group, int rank, int64_t max_rows,
                                                          int64_t heads, int64_t head_dim);

  // The request's N rows are split as partition_rows(N, P).
  int64_t row_begin(int64_t rows) const override;
  int64_t row_end(int64_t rows) const override;
  int64_t max_rows_per_rank(int64_t max_rows) const override {
    return dist::max_rows_per_rank(max_rows, group_->size());
  }
  int64_t attention_heads() const override { return local_heads_; }
  // qkv is this rank's rows of the fused projection (BF16 [n_r, 3·H·D] on the device, unit column
  // stride, q and k already normed and rotated), attn receives this rank's rows of the output
  // (BF16 [n_r, H·D]). The exact kernel of cuda::attention (VORTEX_VARIANT_ATTENTION as there), or
  // with int8fp8_scratch cuda::attention_int8fp8 (its per-head quantization sees every row of the
  // head, as on one GPU).
  Status attention(int64_t rows, const TensorView& qkv, const TensorView& attn, float scale,
                   cuda::DeviceArena* int8fp8_scratch, cudaStream_t stream) override;
  // x: BF16 [N, C] contiguous on the device holding this rank's rows; every rank's afterwards.
  Status gather_rows(int64_t rows, const TensorView& x, cudaStream_t stream) override;

  // The two exchanges on their own (attention runs both around the kernel), for tests.
  Status gather_heads(int64_t rows, const TensorView& qkv, cudaStream_t stream);
  Status scatter_heads(int64_t rows, const TensorView& attn, cudaStream_t stream);
  // [max_rows, 3·(H/P)·D] and [max_rows, (H/P)·D]: the first N rows are the request's.
  const Tensor& full_qkv() const { return full_qkv_; }
  const Tensor& full_attn() const { return full_attn_; }

  int64_t local_heads() const { return local_heads_; }
  size_t device_bytes() const { return arena_.capacity(); }

 private:
  UlyssesAttention() = default;
  Status check(const char* op, int64_t rows, const TensorView& t, int64_t cols) const;

  LocalGpuGroup* group_ = nullptr;
  int rank_ = 0;
  int64_t max_rows_ = 0, heads_ = 0, head_dim_ = 0, local_heads_ = 0;
  cuda::DeviceArena arena_;
  Tensor full_qkv_, full_attn_;
  // Per peer (indexed by rank; this rank's own entry unused): the packed q | k | v columns of its
  // heads for this rank's rows, and the attention rows it returns for them.
  std::vector<Tensor> send_qkv_, recv_attn_;
};

}  // namespace vortex::dist
