// Elementwise ops of the H3 block on the GPU (contract: cuda/elementwise.h; numerics:
// cpu/elementwise.h and the row scatter/gather of models/h3/transformer.cc). R rounds to the
// output dtype (bf16 RNE; identity for F32).
//
//   swiglu:          y = R(value * R(silu(gate)))           u = [value | gate]
//   gated_residual:  x = R(x + R(gate[row] * branch))
//   residual_add:    x = R(x + branch)
//   apply_rope:      x[:rot] = R(R(x * R(cos)) + R(rotate_half(x) * R(sin)))   per (token, head)
//   scatter_rows / gather_rows:  a row copy through an int64 index, converting the dtype
//   silu:            y = R(x / (1 + exp(-x))) over a contiguous F32 tensor
//   fill_zero:       cudaMemsetAsync
//
// One variant each. Launch shape: the 2-D grid of detail::row_launch (threads across a row's
// 16-byte vectors, several short rows per block, rows grid-strided); the scalar instantiation
// (V = 1) serves views that are not 16-byte aligned. Every product or sum the CPU rounds is an
// explicitly rounded intrinsic, so nvcc cannot contract it into an fma: all ops but the two with
// exp match the CPU bit for bit; swiglu and silu differ only where CUDA's expf and the host's
// expf disagree in the last fp32 bits.
#include "cuda/elementwise.h"

#include "cuda/row_io.cuh"
#include "cuda/row_math.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

using detail::Operand;


// ---- swiglu --------------------------------------------------------------------------------------

struct SwigluParams {
  Operand u, y;  // u: [N, 2F], y: [N, F]
  int64_t rows, f, vecs;
};

// kBf16Pairs (bf16 u and y, 16-byte vectors: the bf16 block's case) computes on packed bf16
// pairs (row_math.cuh's swiglu_pair): the same bits with half the conversions, which share the
// exp2 unit with silu's expf and division. The F32-input instance is the test's independent path.
template <int V, bool kBf16Pairs>
__global__ void swiglu_kernel(SwigluParams p) {
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec >= p.vecs) return;
  const int64_t e = vec * V;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; i < p.rows;
       i += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const char* src = detail::row_ptr(p.u, i);
    if constexpr (kBf16Pairs) {
      static_assert(V == 8, "one 16-byte vector of each half");
      const uint4 vv = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(src) + e);
      const uint4 gv = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(src) + p.f + e);
      const uint32_t value[4] = {vv.x, vv.y, vv.z, vv.w}, gate[4] = {gv.x, gv.y, gv.z, gv.w};
      uint32_t y[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) y[k] = detail::swiglu_pair(value[k], gate[k]);
      *reinterpret_cast<uint4*>(reinterpret_cast<uint16_t*>(detail::row_ptr(p.y, i)) + e) =
          make_uint4(y[0], y[1], y[2], y[3]);
    } else {
      float value[V], gate[V];
      detail::load_vec<V>(src, p.u.bf16, e, value);
      detail::load_vec<V>(src, p.u.bf16, p.f + e, gate);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        value[k] = __fmul_rn(value[k], detail::round_out(p.y.bf16, detail::silu_f32(gate[k])));
      }
      detail::store_vec<V>(detail::row_ptr(p.y, i), p.y.bf16, e, value);
    }
  }
}

// ---- gated_residual / residual_add ---------------------------------------------------------------

struct ResidualParams {
  Operand x, branch, gate;  // x, branch: [N, C]; gate: [R, C] (GATED only)
  const int32_t* row;       // [N] (GATED only)
  int64_t rows, table_rows, vecs;
};

// A row whose gate index is outside [0, R) becomes NaN (see adaln_modulate in norm.cu).
template <int V, bool GATED>
__global__ void residual_kernel(ResidualParams p) {
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec >= p.vecs) return;
  const int64_t e = vec * V;
  const bool out_bf16 = p.x.bf16;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; i < p.rows;
       i += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    char* dst = detail::row_ptr(p.x, i);
    float v[V], b[V];
    detail::load_vec<V>(dst, p.x.bf16, e, v);
    detail::load_vec<V>(detail::row_ptr(p.branch, i), p.branch.bf16, e, b);
    if constexpr (GATED) {
      const int32_t t = p.row[i];
      if (t < 0 || t >= p.table_rows) {
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = detail::quiet_nan();
      } else {
        float g[V];
        detail::load_vec<V>(detail::row_ptr(p.gate, t), p.gate.bf16, e, g);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          v[k] = detail::gated_residual_value(out_bf16, v[k], g[k], b[k]);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = detail::residual_value(out_bf16, v[k], b[k]);
    }
    detail::store_vec<V>(dst, out_bf16, e, v);
  }
}

// ---- apply_rope ----------------------------------------------------------------------------------

struct RopeParams {
  Operand x;               // [N, H, D], in place
  const float* cos;        // [N, rot], contiguous
  const float* sin;
  int64_t rows, heads, rot, half;
  int64_t vecs_per_head;   // half / V
};

// Each thread owns channels [k, k + V) and their partners [half + k, half + k + V) of one
// (token, head), so the in-place rotation reads both halves before writing either.
template <int V>
__global__ void apply_rope_kernel(RopeParams p) {
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= p.heads * p.vecs_per_head) return;
  const int64_t h = unit / p.vecs_per_head;
  const int64_t k0 = (unit % p.vecs_per_head) * V;
  const bool bf16 = p.x.bf16;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; i < p.rows;
       i += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    char* row = detail::row_ptr(p.x, i, h);
    const char* cos_row = reinterpret_cast<const char*>(p.cos + i * p.rot);
    const char* sin_row = reinterpret_cast<const char*>(p.sin + i * p.rot);
    float lo[V], hi[V], c_lo[V], c_hi[V], s_lo[V], s_hi[V];
    detail::load_vec<V>(row, bf16, k0, lo);
    detail::load_vec<V>(row, bf16, p.half + k0, hi);
    detail::load_vec<V>(cos_row, false, k0, c_lo);
    detail::load_vec<V>(cos_row, false, p.half + k0, c_hi);
    detail::load_vec<V>(sin_row, false, k0, s_lo);
    detail::load_vec<V>(sin_row, false, p.half + k0, s_hi);
    float out_lo[V], out_hi[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      out_lo[k] = detail::rope_low(bf16, lo[k], hi[k], c_lo[k], s_lo[k]);
      out_hi[k] = detail::rope_high(bf16, lo[k], hi[k], c_hi[k], s_hi[k]);
    }
    detail::store_vec<V>(row, bf16, k0, out_lo);
    detail::store_vec<V>(row, bf16, p.half + k0, out_hi);
  }
}

// ---- scatter_rows / gather_rows ------------------------------------------------------------------

struct RowCopyParams {
  Operand src, out;
  const int64_t* index;
  int64_t rows;        // index length: src rows (scatter) or out rows (gather)
  int64_t index_limit; // rows of the indexed tensor: out (scatter) or src (gather)
  int64_t vecs;
};

// Scatter skips an index outside [0, limit) (there is no row to mark); gather writes NaN for it.
template <int V, bool SCATTER>
__global__ void row_copy_kernel(RowCopyParams p) {
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec >= p.vecs) return;
  const int64_t e = vec * V;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; i < p.rows;
       i += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t t = p.index[i];
    const bool valid = t >= 0 && t < p.index_limit;
    float v[V];
    if constexpr (SCATTER) {
      if (!valid) continue;
      detail::load_vec<V>(detail::row_ptr(p.src, i), p.src.bf16, e, v);
      detail::store_vec<V>(detail::row_ptr(p.out, t), p.out.bf16, e, v);
    } else {
      if (valid) {
        detail::load_vec<V>(detail::row_ptr(p.src, t), p.src.bf16, e, v);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = detail::quiet_nan();
      }
      detail::store_vec<V>(detail::row_ptr(p.out, i), p.out.bf16, e, v);
    }
  }
}

// ---- silu ----------------------------------------------------------------------------------------

constexpr int kFlatThreads = 256;
constexpr int64_t kFlatMaxBlocks = 8192;  // grid-stride beyond: ~60 blocks per SM on an H200

// The first `vecs` vectors of V elements, then the scalar tail [vecs·V, n).
template <int V>
__global__ void silu_kernel(const float* x, char* y, bool y_bf16, int64_t n, int64_t vecs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const char* src = reinterpret_cast<const char*>(x);
  for (int64_t vec = tid; vec < vecs; vec += stride) {
    float v[V];
    detail::load_vec<V>(src, false, vec * V, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = detail::silu_f32(v[k]);
    detail::store_vec<V>(y, y_bf16, vec * V, v);
  }
  for (int64_t e = vecs * V + tid; e < n; e += stride) {
    float v[1];
    detail::load_vec<1>(src, false, e, v);
    v[0] = detail::silu_f32(v[0]);
    detail::store_vec<1>(y, y_bf16, e, v);
  }
}

Status check_row_index(const void* index, int64_t n, const char* what) {
  if (index == nullptr && n > 0) return invalid_argument(std::string(what) + ": null index pointer");
  return ok_status();
}

Status check_rank2(const TensorView& t, const char* what) {
  if (t.rank() != 2) return invalid_argument(std::string(what) + ": must be rank 2, got " + t.shape.to_string());
  return ok_status();
}

}  // namespace

Status swiglu(const TensorView& u, const TensorView& y, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(u, "swiglu input"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(y, "swiglu output"));
  if (u.rank() != 2 || y.rank() != 2 || u.shape[0] != y.shape[0] || u.shape[1] != 2 * y.shape[1]) {
    return invalid_argument("swiglu: input " + u.shape.to_string() + " must be [N, 2F] for output " +
                            y.shape.to_string());
  }
  const int64_t n = y.shape[0], f = y.shape[1];
  if (n == 0 || f == 0) return ok_status();
  SwigluParams p{detail::make_operand(u), detail::make_operand(y), n, f, 0};
  const bool vec = f % detail::kVec == 0 && detail::vec_aligned(u) && detail::vec_aligned(y);
  p.vecs = vec ? f / detail::kVec : f;
  const detail::RowLaunch l = detail::row_launch(n, p.vecs);
  if (vec && u.dtype == DType::kBF16 && y.dtype == DType::kBF16) {
    swiglu_kernel<detail::kVec, true><<<l.grid, l.block, 0, stream>>>(p);
  } else if (vec) {
    swiglu_kernel<detail::kVec, false><<<l.grid, l.block, 0, stream>>>(p);
  } else {
    swiglu_kernel<1, false><<<l.grid, l.block, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status gated_residual(const TensorView& x, const TensorView& gate, const int32_t* row, const TensorView& branch,
                      cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, "gated_residual residual"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(gate, "gated_residual gate"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(branch, "gated_residual branch"));
  VORTEX_RETURN_IF_ERROR(check_rank2(x, "gated_residual residual"));
  VORTEX_RETURN_IF_ERROR(check_rank2(gate, "gated_residual gate"));
  const int64_t n = x.shape[0], c = x.shape[1];
  if (branch.shape != x.shape) {
    return invalid_argument("gated_residual branch: " + branch.shape.to_string() + " does not match residual " +
                            x.shape.to_string());
  }
  if (gate.shape[1] != c) {
    return invalid_argument("gated_residual gate: " + gate.shape.to_string() + " must be [R, " + std::to_string(c) +
                            "]");
  }
  VORTEX_RETURN_IF_ERROR(check_row_index(row, n, "gated_residual row"));
  if (n == 0 || c == 0) return ok_status();
  ResidualParams p{detail::make_operand(x), detail::make_operand(branch), detail::make_operand(gate), row, n,
                   gate.shape[0], 0};
  const bool vec = c % detail::kVec == 0 && detail::vec_aligned(x) && detail::vec_aligned(branch) &&
                   detail::vec_aligned(gate);
  p.vecs = vec ? c / detail::kVec : c;
  const detail::RowLaunch l = detail::row_launch(n, p.vecs);
  if (vec) {
    residual_kernel<detail::kVec, true><<<l.grid, l.block, 0, stream>>>(p);
  } else {
    residual_kernel<1, true><<<l.grid, l.block, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status residual_add(const TensorView& x, const TensorView& branch, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, "residual_add residual"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(branch, "residual_add branch"));
  VORTEX_RETURN_IF_ERROR(check_rank2(x, "residual_add residual"));
  if (branch.shape != x.shape) {
    return invalid_argument("residual_add branch: " + branch.shape.to_string() + " does not match residual " +
                            x.shape.to_string());
  }
  const int64_t n = x.shape[0], c = x.shape[1];
  if (n == 0 || c == 0) return ok_status();
  ResidualParams p{detail::make_operand(x), detail::make_operand(branch), Operand{}, nullptr, n, 0, 0};
  const bool vec = c % detail::kVec == 0 && detail::vec_aligned(x) && detail::vec_aligned(branch);
  p.vecs = vec ? c / detail::kVec : c;
  const detail::RowLaunch l = detail::row_launch(n, p.vecs);
  if (vec) {
    residual_kernel<detail::kVec, false><<<l.grid, l.block, 0, stream>>>(p);
  } else {
    residual_kernel<1, false><<<l.grid, l.block, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status apply_rope(const TensorView& x, const TensorView& cos, const TensorView& sin, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, "apply_rope input"));
  if (x.rank() != 3) return invalid_argument("apply_rope input: must be [N, H, D], got " + x.shape.to_string());
  const int64_t n = x.shape[0], heads = x.shape[1], d = x.shape[2];
  for (const auto& [t, what] : {std::pair{&cos, "apply_rope cos"}, std::pair{&sin, "apply_rope sin"}}) {
    if (t->device != Device::kCuda || t->dtype != DType::kF32 || t->rank() != 2 || t->shape[0] != n ||
        !t->is_contiguous() || (t->data == nullptr && t->numel() > 0)) {
      return invalid_argument(std::string(what) + ": must be a contiguous F32 device tensor [" + std::to_string(n) +
                              ", rotary], got " + dtype_name(t->dtype) + t->shape.to_string() + " on " +
                              device_name(t->device));
    }
  }
  if (sin.shape != cos.shape) {
    return invalid_argument("apply_rope sin: " + sin.shape.to_string() + " does not match cos " +
                            cos.shape.to_string());
  }
  const int64_t rot = cos.shape[1], half = rot / 2;
  if (rot > d || rot % 2 != 0) {
    return invalid_argument("apply_rope cos: rotary width " + std::to_string(rot) + " must be even and <= head dim " +
                            std::to_string(d));
  }
  if (n == 0 || heads == 0 || half == 0) return ok_status();
  RopeParams p{detail::make_operand(x), static_cast<const float*>(cos.data), static_cast<const float*>(sin.data),
               n, heads, rot, half, 0};
  // 16-byte vectors need both halves and both tables' rows to start on 16-byte boundaries: half
  // a multiple of 8 covers the offsets, vec_aligned the bases and the row strides.
  const bool vec = half % detail::kVec == 0 && detail::vec_aligned(x) && detail::vec_aligned(cos) &&
                   detail::vec_aligned(sin);
  p.vecs_per_head = vec ? half / detail::kVec : half;
  const detail::RowLaunch l = detail::row_launch(n, heads * p.vecs_per_head);
  if (vec) {
    apply_rope_kernel<detail::kVec><<<l.grid, l.block, 0, stream>>>(p);
  } else {
    apply_rope_kernel<1><<<l.grid, l.block, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

namespace {

template <bool SCATTER>
Status row_copy(const TensorView& src, const int64_t* index, const TensorView& out, cudaStream_t stream,
                const char* op) {
  const std::string name(op);
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(src, (name + " source").c_str()));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(out, (name + " output").c_str()));
  VORTEX_RETURN_IF_ERROR(check_rank2(src, (name + " source").c_str()));
  VORTEX_RETURN_IF_ERROR(check_rank2(out, (name + " output").c_str()));
  if (src.shape[1] != out.shape[1]) {
    return invalid_argument(name + ": source " + src.shape.to_string() + " and output " + out.shape.to_string() +
                            " differ in width");
  }
  const int64_t rows = SCATTER ? src.shape[0] : out.shape[0];
  const int64_t c = src.shape[1];
  VORTEX_RETURN_IF_ERROR(check_row_index(index, rows, (name + " index").c_str()));
  if (rows == 0 || c == 0) return ok_status();
  RowCopyParams p{detail::make_operand(src), detail::make_operand(out), index, rows,
                  SCATTER ? out.shape[0] : src.shape[0], 0};
  const bool vec = c % detail::kVec == 0 && detail::vec_aligned(src) && detail::vec_aligned(out);
  p.vecs = vec ? c / detail::kVec : c;
  const detail::RowLaunch l = detail::row_launch(rows, p.vecs);
  if (vec) {
    row_copy_kernel<detail::kVec, SCATTER><<<l.grid, l.block, 0, stream>>>(p);
  } else {
    row_copy_kernel<1, SCATTER><<<l.grid, l.block, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace

Status scatter_rows(const TensorView& src, const int64_t* index, const TensorView& out, cudaStream_t stream) {
  return row_copy<true>(src, index, out, stream, "scatter_rows");
}

Status gather_rows(const TensorView& src, const int64_t* index, const TensorView& out, cudaStream_t stream) {
  return row_copy<false>(src, index, out, stream, "gather_rows");
}

Status silu(const TensorView& x, const TensorView& y, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, "silu input"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(y, "silu output"));
  if (x.dtype != DType::kF32) return invalid_argument(std::string("silu input: dtype ") + dtype_name(x.dtype) +
                                                      " (expected F32)");
  if (x.shape != y.shape) {
    return invalid_argument("silu: input " + x.shape.to_string() + " and output " + y.shape.to_string() +
                            " must match");
  }
  if (!x.is_contiguous()) return invalid_argument("silu input: must be contiguous, got strides " + x.strides.to_string());
  if (!y.is_contiguous()) return invalid_argument("silu output: must be contiguous, got strides " + y.strides.to_string());
  const int64_t n = x.numel();
  if (n == 0) return ok_status();
  const bool vec = detail::vec_aligned(x) && detail::vec_aligned(y);
  const int64_t vecs = vec ? n / detail::kVec : 0;
  const int64_t work = vec ? std::max<int64_t>(vecs, n - vecs * detail::kVec) : n;
  const unsigned blocks = static_cast<unsigned>(std::min(detail::ceil_div(work, kFlatThreads), kFlatMaxBlocks));
  const float* src = static_cast<const float*>(x.data);
  char* dst = static_cast<char*>(y.data);
  const bool y_bf16 = y.dtype == DType::kBF16;
  if (vec) {
    silu_kernel<detail::kVec><<<blocks, kFlatThreads, 0, stream>>>(src, dst, y_bf16, n, vecs);
  } else {
    silu_kernel<1><<<blocks, kFlatThreads, 0, stream>>>(src, dst, y_bf16, n, n);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status fill_zero(const TensorView& x, cudaStream_t stream) {
  if (x.device != Device::kCuda) return invalid_argument("fill_zero: CUDA backend got a host tensor");
  if (!x.is_contiguous()) return invalid_argument("fill_zero: tensor " + x.shape.to_string() + " is not contiguous");
  const size_t bytes = static_cast<size_t>(x.numel()) * dtype_size(x.dtype);
  if (bytes == 0) return ok_status();
  if (x.data == nullptr) return invalid_argument("fill_zero: null data pointer");
  VORTEX_CUDA_CHECK(cudaMemsetAsync(x.data, 0, bytes, stream));
  return ok_status();
}

}  // namespace vortex::cuda
