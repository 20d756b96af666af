// Column views into 2-D activation buffers, shared by the CPU and CUDA programs: the q/k/v heads
// inside a fused QKV output and the shift/scale/gate columns of a modulation table are views,
// never copies.
#pragma once

#include <cstdint>

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

}  // namespace vortex::h3
