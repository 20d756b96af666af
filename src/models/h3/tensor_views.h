// Views into 2-D activation buffers, shared by the CPU and CUDA programs: the q/k/v heads inside a
// fused QKV output and the shift/scale/gate columns of a modulation table are views, never copies;
// so are a request's first rows of a buffer sized for more, and buffers sharing one region.
#pragma once

#include <cstddef>
#include <cstdint>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

// A [N, heads, head_dim] view of columns [column, column + heads * head_dim) of a 2-D tensor.
inline TensorView heads_view(const Tensor& t, int64_t column, int64_t heads, int64_t head_dim) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + column * static_cast<int64_t>(dtype_size(t.dtype()));
  v.shape = Shape({t.size(0), heads, head_dim});
  v.strides = Shape({t.strides()[0], head_dim, 1});
  return v;
}

// Columns [column, column + width) of a 2-D tensor.
inline TensorView columns(const Tensor& t, int64_t column, int64_t width) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + column * static_cast<int64_t>(dtype_size(t.dtype()));
  v.shape = Shape({t.size(0), width});
  return v;
}

// The first `rows` rows of a buffer.
inline Result<Tensor> rows_of(const Tensor& t, int64_t rows) { return t.slice(0, 0, rows); }

// A tensor of another shape and dtype over bytes [byte_offset, ...) of `buffer` (same storage).
inline Result<Tensor> alias(const Tensor& buffer, const Shape& shape, DType dtype, size_t byte_offset) {
  const size_t esize = dtype_size(dtype);
  const size_t start = static_cast<size_t>(buffer.offset()) * dtype_size(buffer.dtype()) + byte_offset;
  if (byte_offset + static_cast<size_t>(shape.numel()) * esize > buffer.nbytes() || start % esize != 0) {
    return internal_error("alias of " + shape.to_string() + " does not fit in " + buffer.describe());
  }
  return Tensor::from_storage(buffer.storage(), shape, dtype, static_cast<int64_t>(start / esize));
}

}  // namespace vortex::h3
