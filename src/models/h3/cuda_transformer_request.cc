// What a request sets up on the CUDA model before its steps (cuda_transformer.h): the layout's
// indices and RoPE tables, the refined text stream (prepare), and each step's AdaLN rows and time
// embedding (upload_step_tables).
#include <cmath>
#include <cstring>
#include <string>

#include "cuda/elementwise.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/tensor_views.h"

namespace vortex::h3 {

Status CudaH3Transformer::prepare(const PackedLayout& layout, const Tensor& text_states) {
  const H3Config& c = config_;
  if (layout.num_rows > max_rows_) {
    return invalid_argument("request has " + std::to_string(layout.num_rows) + " rows; this model was sized for " +
                            std::to_string(max_rows_));
  }
  if (text_states.rank() != 2 || text_states.size(0) != layout.num_text || text_states.size(1) != c.text_dim) {
    return invalid_argument("text states must be [" + std::to_string(layout.num_text) + ", " +
                            std::to_string(c.text_dim) + "], got " + text_states.describe());
  }
  for (int64_t i = 0; i < text_states.numel(); ++i) {
    if (!std::isfinite(element_as_double(text_states, i))) {
      return invalid_argument("text states: non-finite value at element " + std::to_string(i) + " (row " +
                              std::to_string(i / c.text_dim) + ")");
    }
  }
  const int64_t rows = layout.num_rows;
  if (sequence_parallel_ && sequence_parallel_->row_end(rows) == sequence_parallel_->row_begin(rows)) {
    return invalid_argument("request has " + std::to_string(layout.num_rows) +
                            " rows: too few to split over these GPUs (a row per GPU at least)");
  }
  layout_ = &layout;
  Tensor cos, sin;
  rope_tables(c, layout.positions, cos, sin);
  VORTEX_ASSIGN_OR_RETURN(Tensor cos_dev, rows_of(rope_cos_, layout.num_rows));
  VORTEX_ASSIGN_OR_RETURN(Tensor sin_dev, rows_of(rope_sin_, layout.num_rows));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(cos, cos_dev, stream_));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(sin, sin_dev, stream_));
  for (auto [indices, target] : {std::pair{&layout.text_indices, &text_idx_}, std::pair{&layout.audio_indices, &audio_idx_},
                                 std::pair{&layout.video_indices, &video_idx_}}) {
    if (indices->empty()) continue;
    const int64_t n = static_cast<int64_t>(indices->size());
    VORTEX_ASSIGN_OR_RETURN(Tensor dst, rows_of(*target, n));
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(Tensor::from_i64(*indices, {n}), dst, stream_));
  }
  // Context embedder + refiner + final norm over the text rows: fixed for the whole request.
  VORTEX_ASSIGN_OR_RETURN(Tensor text_host, text_states.to(DType::kBF16));
  // The refined text stream lives for the whole request in its own small arena, sized for this
  // request's text rows (not the model's max_rows).
  const size_t text_bytes = static_cast<size_t>(std::max<int64_t>(layout.num_text, 1) * c.hidden_size) * 2;
  if (text_arena_.capacity() < text_bytes) {
    text_tokens_ = Tensor();
    text_arena_ = cuda::DeviceArena();
    VORTEX_ASSIGN_OR_RETURN(text_arena_, cuda::DeviceArena::create(text_bytes));
    VORTEX_ASSIGN_OR_RETURN(text_tokens_, text_arena_.alloc({std::max<int64_t>(layout.num_text, 1), c.hidden_size},
                                                            DType::kBF16));
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor text, rows_of(text_tokens_, layout.num_text));
  if (layout.num_text > 0) VORTEX_RETURN_IF_ERROR(refine_text(text_host, text));
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ok_status();
}

Status CudaH3Transformer::refine_text(const Tensor& text_host, const Tensor& text) {
  const H3Config& c = config_;
  const int64_t n = text.size(0), C = c.hidden_size, inner = c.inner_dim(), F = c.ffn_dim;
  // The raw text states live in the SwiGLU output's memory (the context embedder reads them before
  // the refiner's FFN writes it) where they fit. The refiner works in the blocks' buffers where the
  // text rows fit them: every rank refines all the text rows, which can be more than its share of
  // a short request's rows. Otherwise in memory of this call's own.
  const bool own_input = n * c.text_dim > work_.swiglu.numel();
  const bool own_buffers = n > work_.h.size(0);
  const int64_t widths[] = {C, C, 3 * inner, inner, 2 * F, F};  // BlockBuffers' order
  size_t bytes = own_input ? static_cast<size_t>(n * c.text_dim) * 2 + cuda::DeviceArena::kAlignment : 0;
  if (own_buffers) {
    for (const int64_t w : widths) bytes += static_cast<size_t>(n * w) * 2 + cuda::DeviceArena::kAlignment;
  }
  cuda::DeviceArena scratch;
  if (bytes > 0) {
    VORTEX_ASSIGN_OR_RETURN(scratch, cuda::DeviceArena::create(bytes));
  }
  Tensor text_in;
  if (own_input) {
    VORTEX_ASSIGN_OR_RETURN(text_in, scratch.alloc({n, c.text_dim}, DType::kBF16));
  } else {
    VORTEX_ASSIGN_OR_RETURN(text_in, alias(work_.swiglu, {n, c.text_dim}, DType::kBF16, 0));
  }
  BlockBuffers own;
  Tensor* const buffers[] = {&own.h, &own.branch, &own.qkv, &own.attn, &own.fc1, &own.swiglu};
  for (int i = 0; own_buffers && i < 6; ++i) {
    VORTEX_ASSIGN_OR_RETURN(*buffers[i], scratch.alloc({n, widths[i]}, DType::kBF16));
  }
  if (own_buffers) std::swap(work_, own);
  const Status status = [&]() -> Status {
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(text_host, text_in, stream_));
    VORTEX_RETURN_IF_ERROR(linear(context_embedder_, text_in, text));
    for (const Block& b : refiner_) VORTEX_RETURN_IF_ERROR(block_forward(b, text, nullptr));
    const TensorView w = refiner_final_norm_.view();
    return cuda::rms_norm(text.view(), &w, static_cast<float>(c.final_norm_eps), text.view(), stream_);
  }();
  if (own_buffers) std::swap(work_, own);
  // `scratch` is freed on return: what was queued must be done with it.
  const cudaError_t synced = cudaStreamSynchronize(stream_);
  VORTEX_RETURN_IF_ERROR(status);
  VORTEX_CUDA_CHECK(synced);
  return ok_status();
}

Status CudaH3Transformer::upload_step_tables(const RowTimesteps& timesteps) {
  if (!layout_) return invalid_argument("upload_step_tables before prepare");
  const PackedLayout& layout = *layout_;
  const int64_t T = static_cast<int64_t>(timesteps.timesteps.size()), N = layout.num_rows;
  if (T < 1 || T > silu_temb_.size(0) || static_cast<int64_t>(timesteps.row_index.size()) != N) {
    return invalid_argument("row timesteps: " + std::to_string(T) + " distinct values for " +
                            std::to_string(timesteps.row_index.size()) + " rows (expected 1.." +
                            std::to_string(silu_temb_.size(0)) + " values and " + std::to_string(N) + " rows)");
  }
  std::vector<int32_t> adaln(N);
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = timesteps.row_index[i];
    if (t < 0 || t >= T) return invalid_argument("row " + std::to_string(i) + ": timestep index out of range");
    adaln[i] = t * kNumModalities + layout.tags[i];
  }
  num_timesteps_ = T;
  VORTEX_ASSIGN_OR_RETURN(Tensor silu_dev, rows_of(silu_temb_, T));
  if (adaln_tables_ == AdaLnTables::kPerRequest) {
    // The step's AdaLN tables and silu(temb), computed once by plan_steps().
    VORTEX_RETURN_IF_ERROR(select_planned_step(timesteps.timesteps, silu_dev));
  } else {
    VORTEX_ASSIGN_OR_RETURN(Tensor silu_bf16, silu_time_embedding(timesteps.timesteps));
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(silu_bf16, silu_dev, stream_));
  }
  Tensor adaln_host = Tensor::empty({N}, DType::kI32), rows_host = Tensor::empty({N}, DType::kI32);
  std::memcpy(adaln_host.data(), adaln.data(), N * sizeof(int32_t));
  std::memcpy(rows_host.data(), timesteps.row_index.data(), N * sizeof(int32_t));
  VORTEX_ASSIGN_OR_RETURN(Tensor adaln_dev, rows_of(adaln_rows_, N));
  VORTEX_ASSIGN_OR_RETURN(Tensor rows_dev, rows_of(timestep_rows_, N));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(adaln_host, adaln_dev, stream_));
  return cuda::copy_to_device(rows_host, rows_dev, stream_);
}

}  // namespace vortex::h3
