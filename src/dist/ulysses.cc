#include "dist/ulysses.h"

#include <algorithm>

#include "cuda/attention.h"
#include "cuda/attention_int8fp8.h"
#include "models/h3/tensor_views.h"

namespace vortex::dist {

std::vector<RowRange> partition_rows(int64_t rows, int ranks) {
  std::vector<RowRange> split(static_cast<size_t>(ranks));
  const int64_t granule = rows >= kRowGranule * ranks ? kRowGranule : 1;
  const int64_t blocks = (rows + granule - 1) / granule, base = blocks / ranks, longer = blocks % ranks;
  int64_t begin = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t end = std::min(rows, begin + (base + (r < longer ? 1 : 0)) * granule);
    split[r] = {begin, end};
    begin = end;
  }
  return split;
}

int64_t max_rows_per_rank(int64_t max_rows, int ranks) { return partition_rows(max_rows, ranks)[0].size(); }

Result<std::unique_ptr<UlyssesAttention>> UlyssesAttention::create(LocalGpuGroup& group, int rank,
                                                                   int64_t max_rows, int64_t heads, int64_t head_dim) {
  const int P = group.size();
  if (rank < 0 || rank >= P) return invalid_argument("sequence-parallel attention: no rank " + std::to_string(rank));
  if (heads < 1 || heads % P != 0) {
    return invalid_argument("sequence-parallel attention: " + std::to_string(heads) + " heads do not split over " +
                            std::to_string(P) + " GPUs (the GPU count must divide the head count)");
  }
  if (max_rows < 1 || head_dim < 1) return invalid_argument("sequence-parallel attention: empty shape");
  std::unique_ptr<UlyssesAttention> u(new UlyssesAttention());
  u->group_ = &group;
  u->rank_ = rank;
  u->max_rows_ = max_rows;
  u->heads_ = heads;
  u->head_dim_ = head_dim;
  u->local_heads_ = heads / P;
  const int64_t w = u->local_heads_ * head_dim, my_rows_max = dist::max_rows_per_rank(max_rows, P);
  const size_t align = cuda::DeviceArena::kAlignment;
  const auto bytes = [&](int64_t elements) { return (static_cast<size_t>(elements) * 2 + align - 1) / align * align; };
  const size_t total = bytes(max_rows * 3 * w) + bytes(max_rows * w) +
                       static_cast<size_t>(P - 1) * (bytes(my_rows_max * 3 * w) + bytes(my_rows_max * w)) + align;
  VORTEX_ASSIGN_OR_RETURN(u->arena_, cuda::DeviceArena::create(total));
  VORTEX_ASSIGN_OR_RETURN(u->full_qkv_, u->arena_.alloc({max_rows, 3 * w}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(u->full_attn_, u->arena_.alloc({max_rows, w}, DType::kBF16));
  u->send_qkv_.resize(P);
  u->recv_attn_.resize(P);
  for (int s = 0; s < P; ++s) {
    if (s == rank) continue;
    VORTEX_ASSIGN_OR_RETURN(u->send_qkv_[s], u->arena_.alloc({my_rows_max, 3 * w}, DType::kBF16));
    VORTEX_ASSIGN_OR_RETURN(u->recv_attn_[s], u->arena_.alloc({my_rows_max, w}, DType::kBF16));
  }
  return u;
}

Status UlyssesAttention::check(const char* op, int64_t rows, const TensorView& t, int64_t cols) const {
  const std::string name = std::string("sequence-parallel ") + op;
  if (rows < group_->size() || rows > max_rows_) {
    return invalid_argument(name + ": " + std::to_string(rows) + " rows; sized for " + std::to_string(group_->size()) +
                            ".." + std::to_string(max_rows_) + " (a row per GPU at least)");
  }
  const int64_t mine = partition_rows(rows, group_->size())[rank_].size();
  if (t.device != Device::kCuda || t.dtype != DType::kBF16 || t.rank() != 2 || t.shape[0] != mine ||
      t.shape[1] != cols || t.strides[1] != 1 || (mine > 1 && t.strides[0] < cols)) {
    return invalid_argument(name + ": rank " + std::to_string(rank_) + " needs BF16 [" + std::to_string(mine) + ", " +
                            std::to_string(cols) + "] rows on the device with unit column stride, got " +
                            cuda::describe_view("it", t));
  }
  return ok_status();
}

Status UlyssesAttention::gather_heads(int64_t rows, const TensorView& qkv, cudaStream_t stream) {
  const int64_t HD = heads_ * head_dim_, w = local_heads_ * head_dim_;
  VORTEX_RETURN_IF_ERROR(check("gather_heads", rows, qkv, 3 * HD));
  const int P = group_->size();
  const std::vector<RowRange> split = partition_rows(rows, P);
  const RowRange mine = split[rank_];
  const auto* src = static_cast<const uint16_t*>(qkv.data);
  const size_t src_pitch = static_cast<size_t>(qkv.shape[0] > 1 ? qkv.strides[0] : 3 * HD) * 2;
  auto* full = static_cast<uint16_t*>(full_qkv_.data());
  // Rank s's heads of q, k and v: into this rank's rows of the full buffer (s = this rank) or
  // into the staging buffer sent to s.
  for (int s = 0; s < P; ++s) {
    uint16_t* dst = s == rank_ ? full + mine.begin * 3 * w : static_cast<uint16_t*>(send_qkv_[s].data());
    for (int part = 0; part < 3; ++part) {
      VORTEX_CUDA_CHECK(cudaMemcpy2DAsync(dst + part * w, static_cast<size_t>(3 * w) * 2, src + part * HD + s * w,
                                          src_pitch, static_cast<size_t>(w) * 2, static_cast<size_t>(mine.size()),
                                          cudaMemcpyDeviceToDevice, stream));
    }
  }
  std::vector<Transfer> transfers;
  for (int s = 0; s < P; ++s) {
    if (s == rank_) continue;
    transfers.push_back({s, send_qkv_[s].data(), static_cast<size_t>(mine.size() * 3 * w) * 2,
                         full + split[s].begin * 3 * w, static_cast<size_t>(split[s].size() * 3 * w) * 2});
  }
  return group_->exchange(rank_, transfers, stream);
}

Status UlyssesAttention::scatter_heads(int64_t rows, const TensorView& attn, cudaStream_t stream) {
  const int64_t HD = heads_ * head_dim_, w = local_heads_ * head_dim_;
  VORTEX_RETURN_IF_ERROR(check("scatter_heads", rows, attn, HD));
  const int P = group_->size();
  const std::vector<RowRange> split = partition_rows(rows, P);
  const RowRange mine = split[rank_];
  auto* dst = static_cast<uint16_t*>(attn.data);
  const size_t dst_pitch = static_cast<size_t>(attn.shape[0] > 1 ? attn.strides[0] : HD) * 2;
  const auto* full = static_cast<const uint16_t*>(full_attn_.data());
  std::vector<Transfer> transfers;
  for (int s = 0; s < P; ++s) {
    if (s == rank_) continue;
    transfers.push_back({s, full + split[s].begin * w, static_cast<size_t>(split[s].size() * w) * 2,
                         recv_attn_[s].data(), static_cast<size_t>(mine.size() * w) * 2});
  }
  VORTEX_RETURN_IF_ERROR(group_->exchange(rank_, transfers, stream));
  // Head group s's columns of this rank's rows: from this rank's own rows of the full output, or
  // from what rank s returned.
  for (int s = 0; s < P; ++s) {
    const uint16_t* src = s == rank_ ? full + mine.begin * w : static_cast<const uint16_t*>(recv_attn_[s].data());
    VORTEX_CUDA_CHECK(cudaMemcpy2DAsync(dst + s * w, dst_pitch, src, static_cast<size_t>(w) * 2,
                                        static_cast<size_t>(w) * 2, static_cast<size_t>(mine.size()),
                                        cudaMemcpyDeviceToDevice, stream));
  }
  return ok_status();
}

int64_t UlyssesAttention::row_begin(int64_t rows) const { return partition_rows(rows, group_->size())[rank_].begin; }
int64_t UlyssesAttention::row_end(int64_t rows) const { return partition_rows(rows, group_->size())[rank_].end; }

Status UlyssesAttention::gather_rows(int64_t rows, const TensorView& x, cudaStream_t stream) {
  if (rows < 1 || rows > max_rows_ || x.device != Device::kCuda || x.dtype != DType::kBF16 || x.rank() != 2 ||
      x.shape[0] != rows || !x.is_contiguous()) {
    return invalid_argument("sequence-parallel gather_rows: needs BF16 [" + std::to_string(rows) +
                            ", C] contiguous on the device, got " + cuda::describe_view("x", x));
  }
  const int P = group_->size();
  if (P == 1) return ok_status();
  const std::vector<RowRange> split = partition_rows(rows, P);
  const int64_t C = x.shape[1];
  auto* base = static_cast<uint16_t*>(x.data);
  std::vector<Transfer> transfers;
  for (int s = 0; s < P; ++s) {
    if (s == rank_) continue;
    transfers.push_back({s, base + split[rank_].begin * C, static_cast<size_t>(split[rank_].size() * C) * 2,
                         base + split[s].begin * C, static_cast<size_t>(split[s].size() * C) * 2});
  }
  return group_->exchange(rank_, transfers, stream);
}

Status UlyssesAttention::attention(int64_t rows, const TensorView& qkv, const TensorView& attn, float scale,
                                   cuda::DeviceArena* int8fp8_scratch, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check("attention", rows, attn, heads_ * head_dim_));
  VORTEX_RETURN_IF_ERROR(gather_heads(rows, qkv, stream));
  VORTEX_ASSIGN_OR_RETURN(Tensor full_qkv, full_qkv_.slice(0, 0, rows));
  VORTEX_ASSIGN_OR_RETURN(Tensor full_attn, full_attn_.slice(0, 0, rows));
  const int64_t H = local_heads_, D = head_dim_, w = H * D;
  const TensorView q = h3::heads_view(full_qkv, 0, H, D), k = h3::heads_view(full_qkv, w, H, D);
  const TensorView v = h3::heads_view(full_qkv, 2 * w, H, D), out = h3::heads_view(full_attn, 0, H, D);
  VORTEX_RETURN_IF_ERROR(int8fp8_scratch ? cuda::attention_int8fp8(q, k, v, out, scale, *int8fp8_scratch, stream)
                                         : cuda::attention(q, k, v, out, scale, stream));
  return scatter_heads(rows, attn, stream);
}

}  // namespace vortex::dist
