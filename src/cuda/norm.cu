// RMSNorm family on the GPU (contract: cuda/elementwise.h; numerics: cpu/norm.h).
//
//   rms_norm:        y = R(x * inv * weight),  inv = 1 / sqrt(sum(x^2) / C + eps); or, rounded
//                    before the weight too (kBeforeWeight, the text encoder's), y = R(R(x * inv) * weight)
//   adaln_modulate:  y = R(R(x * R(1 + scale[row])) + shift[row])
//   rms_norm_fused:  the block-boundary sequence in one pass (NormFusion): an optional residual
//                    update first (x = R(x + R(gate[row]·branch)), or R(x + branch), written back
//                    to x), then rms_norm of the updated row, then an optional adaln_modulate of the
//                    rounded norm output. Each step rounds exactly where the separate op does, and
//                    the reduction runs in the same threads and order as rms_norm's, so the fused
//                    pass is bitwise equal to the three launches it replaces.
//   head_norm_rope:  the per-head q or k norm and its RoPE in one launch (qk_norm_rope: both):
//                    each (token, head) row is normalised as rms_norm's group kernel does (same
//                    lanes, same order), and the rounded values are rotated in registers, the
//                    partner channel fetched from the lane that holds it; bitwise equal to
//                    rms_norm + apply_rope.
//
// rms_norm variants (chosen by row width, not selectable: both compute the same thing):
//   group  G lanes of a warp per row (G = 1..32, a power of two), for rows of up to 32·4 vectors
//          (C <= 1024 with 16-byte vectors): the per-head q/k norm (D = 128 -> 16 lanes, two
//          (token, head) rows per warp) and the narrow test shapes.
//   block  one block per row for wide rows (the 5376-channel block norms: 224 threads of 3 bf16
//          vectors each); falls back to re-reading the row from global memory (L1/L2-resident)
//          when it does not fit in the per-thread register cache.
// Both keep the row in registers between the reduction and the write, so x is read from memory
// once, and may alias y. rms_norm_fused with a fusion and bf16 operands on the cached block layout
// (the bf16 block's norms) runs the block variant on packed bf16 pairs (rms_norm_fused_bf16_kernel):
// the same layout, order and bits.
//
// Numerics against the CPU: the sum of squares is accumulated in fp32 (fma per element, then a
// shuffle tree across lanes and, in the block variant, a fixed-order sum of the warp partials),
// where the CPU sums in double in index order; so inv may differ from the CPU's in its last fp32
// bits. Everything after the sum rounds exactly as the CPU does: the mean and eps in fp32 with
// IEEE division, 1 / sqrt with the correctly rounded __fsqrt_rn / __fdiv_rn, then two fp32
// products (x·inv)·w and one rounding to y's dtype. adaln_modulate has no reduction and no
// transcendental: it matches the CPU bit for bit.
#include "cuda/elementwise.h"

#include "cuda/norm_layout.h"
#include "cuda/row_io.cuh"
#include "cuda/row_math.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

using detail::Operand;

// Layouts and their constants: norm_layout.h. Two of the block layout's largest blocks per SM cap the kernel at 64 registers. Without the cap ptxas takes 104, which
// leaves room for only 2 of the 224-thread blocks the 5376-wide rows launch, and the norm then runs
// at about 1 TB/s, latency-bound. With the cap, 4 blocks fit.
constexpr int kNormBlockMinBlocks = 2;

// Residual kinds of a fused norm: the flag is uniform across the grid (as the dtype flags are).
enum ResidualKind : int { kNoResidual = 0, kPlainResidual = 1, kGatedResidual = 2 };

struct RmsNormParams {
  Operand x, y;        // rank 2: row r is x[r]; rank 3: row r is x[r / inner, r % inner]
  const char* weight;  // [C] or null
  int64_t weight_stride;
  bool weight_bf16;
  int64_t rows;        // N, or N·H for a rank-3 view
  int64_t inner;       // 1, or H
  int64_t vecs;        // C / V
  int c;
  float eps;
  bool round_before_weight;  // RmsNormRounding::kBeforeWeight: R(R(x·inv)·w); no fusion takes it
  // Fusions (rank 2 only): the residual update before the norm, the modulation after it.
  int residual;                     // ResidualKind
  Operand branch, gate;             // branch [N, C]; gate [R, C]
  const int32_t* gate_row;          // [N]
  int64_t gate_rows;
  bool modulate;
  Operand shift, scale;             // [R', C]
  const int32_t* mod_row;           // [N]
  int64_t mod_rows;
};

__device__ __forceinline__ const char* norm_src(const RmsNormParams& p, int64_t r) {
  return p.inner == 1 ? detail::row_ptr(p.x, r) : detail::row_ptr(p.x, r / p.inner, r % p.inner);
}
__device__ __forceinline__ char* norm_dst(const RmsNormParams& p, int64_t r) {
  return p.inner == 1 ? detail::row_ptr(p.y, r) : detail::row_ptr(p.y, r / p.inner, r % p.inner);
}


template <int V>
__device__ __forceinline__ void load_weight(const RmsNormParams& p, int64_t e, float (&w)[V]) {
  if (p.weight == nullptr) {
#pragma unroll
    for (int k = 0; k < V; ++k) w[k] = 1.0f;
  } else if constexpr (V > 1) {
    detail::load_vec<V>(p.weight, p.weight_bf16, e, w);  // the host chose V > 1 only for unit stride
  } else {
    detail::load_vec<1>(p.weight, p.weight_bf16, e * p.weight_stride, w);
  }
}

// Loads elements [e, e + V) of row r of x; with a fused residual, applies it with
// gated_residual's / residual_add's operations, writes the rounded row back to x and returns the
// rounded values (what a separate norm would read). A gate index outside [0, R) gives NaN, as in
// gated_residual.
template <int V>
__device__ __forceinline__ void load_row(const RmsNormParams& p, const char* src, int64_t r, int64_t e, float (&v)[V]) {
  detail::load_vec<V>(src, p.x.bf16, e, v);
  if (p.residual == kNoResidual) return;
  float b[V];
  detail::load_vec<V>(detail::row_ptr(p.branch, r), p.branch.bf16, e, b);
  if (p.residual == kGatedResidual) {
    const int32_t t = p.gate_row[r];
    if (t < 0 || t >= p.gate_rows) {
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = detail::quiet_nan();
    } else {
      float g[V];
      detail::load_vec<V>(detail::row_ptr(p.gate, t), p.gate.bf16, e, g);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = detail::gated_residual_value(p.x.bf16, v[k], g[k], b[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = detail::residual_value(p.x.bf16, v[k], b[k]);
  }
  detail::store_vec<V>(const_cast<char*>(src), p.x.bf16, e, v);
}

// y = R(x·inv·w), then with a fused modulation y = R(R(y·R(1 + scale)) + shift) as adaln_modulate
// computes it from the stored (rounded) norm output.
template <int V>
__device__ __forceinline__ void normalize_store(const RmsNormParams& p, char* dst, int64_t r, int64_t e,
                                                const float (&v)[V], float inv) {
  float w[V], out[V];
  load_weight<V>(p, e, w);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float normed = __fmul_rn(v[k], inv);
    out[k] = __fmul_rn(p.round_before_weight ? detail::round_out(p.y.bf16, normed) : normed, w[k]);
  }
  if (p.modulate) {
    const bool bf16 = p.y.bf16;
    const int32_t t = p.mod_row[r];
    if (t < 0 || t >= p.mod_rows) {
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = detail::quiet_nan();
    } else {
      float sh[V], sc[V];
      detail::load_vec<V>(detail::row_ptr(p.shift, t), p.shift.bf16, e, sh);
      detail::load_vec<V>(detail::row_ptr(p.scale, t), p.scale.bf16, e, sc);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        out[k] = detail::modulate_value(bf16, detail::round_out(bf16, out[k]), sh[k], sc[k]);
      }
    }
  }
  detail::store_vec<V>(dst, p.y.bf16, e, out);
}

template <int V>
__device__ __forceinline__ float sum_squares(const float (&v)[V], float acc) {
#pragma unroll
  for (int k = 0; k < V; ++k) acc = fmaf(v[k], v[k], acc);
  return acc;
}

// G lanes per row, each caching up to PER_LANE vectors; a block holds kNormThreads / G rows. The
// row loop bound depends only on the block, so every lane of a warp reaches the shuffles together.
template <int V, int PER_LANE>
__global__ void __launch_bounds__(kNormThreads) rms_norm_group_kernel(RmsNormParams p, int group) {
  const int lane = threadIdx.x % group;
  const int64_t rows_per_block = kNormThreads / group;
  for (int64_t r0 = blockIdx.x * rows_per_block; r0 < p.rows; r0 += gridDim.x * rows_per_block) {
    const int64_t r = r0 + threadIdx.x / group;
    const bool active = r < p.rows;
    float v[PER_LANE][V];
    float ss = 0.0f;
    if (active) {
      const char* src = norm_src(p, r);
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q) {
        const int64_t vec = lane + q * group;
        if (vec < p.vecs) {
          load_row<V>(p, src, r, vec * V, v[q]);
          ss = sum_squares<V>(v[q], ss);
        }
      }
    }
    for (int offset = group / 2; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, offset);
    if (active) {
      const float inv = detail::inv_rms(ss, p.c, p.eps);
      char* dst = norm_dst(p, r);
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q) {
        const int64_t vec = lane + q * group;
        if (vec < p.vecs) normalize_store<V>(p, dst, r, vec * V, v[q], inv);
      }
    }
  }
}

// Sum over the block in a fixed order: shuffle tree within each warp, then every thread adds the
// warp partials 0, 1, ... itself (no second broadcast barrier). All threads must call it.
__device__ __forceinline__ float block_sum(float s, float* warp_sums) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, offset);
  const int warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums is rewritten by the next row
  return total;
}

// One block per row. CACHED: each thread keeps its <= norm_block_cache_vecs(V) vectors in registers;
// otherwise the second pass re-reads x (x may alias y: each element is read and then written by
// the same thread, after the whole row has been summed).
template <int V, bool CACHED>
__global__ void __launch_bounds__(kNormBlockMaxThreads, kNormBlockMinBlocks) rms_norm_block_kernel(RmsNormParams p) {
  __shared__ float warp_sums[kNormBlockMaxThreads / 32];
  constexpr int kCache = CACHED ? norm_block_cache_vecs(V) : 1;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const char* src = norm_src(p, r);
    float v[kCache][V];
    float ss = 0.0f;
    if constexpr (CACHED) {
#pragma unroll
      for (int q = 0; q < kCache; ++q) {
        const int64_t vec = threadIdx.x + static_cast<int64_t>(q) * blockDim.x;
        if (vec < p.vecs) {
          load_row<V>(p, src, r, vec * V, v[q]);
          ss = sum_squares<V>(v[q], ss);
        }
      }
    } else {
      for (int64_t vec = threadIdx.x; vec < p.vecs; vec += blockDim.x) {
        load_row<V>(p, src, r, vec * V, v[0]);
        ss = sum_squares<V>(v[0], ss);
      }
    }
    const float inv = detail::inv_rms(block_sum(ss, warp_sums), p.c, p.eps);
    char* dst = norm_dst(p, r);
    if constexpr (CACHED) {
#pragma unroll
      for (int q = 0; q < kCache; ++q) {
        const int64_t vec = threadIdx.x + static_cast<int64_t>(q) * blockDim.x;
        if (vec < p.vecs) normalize_store<V>(p, dst, r, vec * V, v[q], inv);
      }
    } else {
      // The second pass re-reads x, which already holds the residual-updated row (each element
      // was written by this thread in the first pass).
      for (int64_t vec = threadIdx.x; vec < p.vecs; vec += blockDim.x) {
        detail::load_vec<V>(src, p.x.bf16, vec * V, v[0]);
        normalize_store<V>(p, dst, r, vec * V, v[0], inv);
      }
    }
  }
}

// rms_norm_block_kernel<8, true> for rms_norm_fused with a residual or a modulation and bf16
// operands throughout (the bf16 block's two norms): the same layout, reduction order and bits, on
// packed bf16 pairs. The steps that round bf16 operands to bf16 (the residual R(x + R(gate ·
// branch)) or R(x + branch), the modulation R(R(h · R(1 + scale)) + shift)) are one mul.rn /
// add.rn .bf16x2 per two elements, the fp32 step plus its rounding (row_io.cuh); the norm's fp32
// product (x · inv) · w is rounded two at a time by one conversion. The generic kernel rounds one
// element at a time, and those conversions share the exp2 unit (16 per clock per SM) that the
// norm then waits on. The separate launches (gated_residual, rms_norm, adaln_modulate) keep the
// scalar steps: tests/gpu/test_gpu_norm_fused.cu holds this kernel to them bit for bit.
template <int kResidual, bool kModulate>
__global__ void __launch_bounds__(kNormBlockMaxThreads, kNormBlockMinBlocks) rms_norm_fused_bf16_kernel(RmsNormParams p) {
  constexpr int kCache = norm_block_cache_vecs(8);
  __shared__ float warp_sums[kNormBlockMaxThreads / 32];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    char* x = detail::row_ptr(p.x, r);
    uint32_t h[kCache][4];
    float ss = 0.0f;
    // Pass 1: the residual, written back to x, and the sum of squares in rms_norm's order.
    const char* branch = kResidual != kNoResidual ? detail::row_ptr(p.branch, r) : nullptr;
    const int32_t gate_row = kResidual == kGatedResidual ? p.gate_row[r] : 0;
    const bool bad_gate = gate_row < 0 || gate_row >= p.gate_rows;
#pragma unroll
    for (int q = 0; q < kCache; ++q) {
      const int64_t vec = threadIdx.x + static_cast<int64_t>(q) * blockDim.x;
      if (vec >= p.vecs) continue;
      const uint4 xv = reinterpret_cast<const uint4*>(x)[vec];
      uint32_t v[4] = {xv.x, xv.y, xv.z, xv.w};
      if constexpr (kResidual != kNoResidual) {
        const uint4 bv = reinterpret_cast<const uint4*>(branch)[vec];
        const uint32_t b[4] = {bv.x, bv.y, bv.z, bv.w};
        detail::residual_pairs<kResidual == kGatedResidual>(v, b, bad_gate, [&] {
          return reinterpret_cast<const uint4*>(detail::row_ptr(p.gate, gate_row))[vec];
        });
        reinterpret_cast<uint4*>(x)[vec] = make_uint4(v[0], v[1], v[2], v[3]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ss = fmaf(detail::bf16x2_low(v[i]), detail::bf16x2_low(v[i]), ss);
        ss = fmaf(detail::bf16x2_high(v[i]), detail::bf16x2_high(v[i]), ss);
        h[q][i] = v[i];
      }
    }
    const float inv = detail::inv_rms(block_sum(ss, warp_sums), p.c, p.eps);

    // Pass 2: y = R((x · inv) · w), then the modulation.
    char* y = detail::row_ptr(p.y, r);
    const int32_t mod_row = kModulate ? p.mod_row[r] : 0;
    const bool bad_mod = mod_row < 0 || mod_row >= p.mod_rows;
#pragma unroll
    for (int q = 0; q < kCache; ++q) {
      const int64_t vec = threadIdx.x + static_cast<int64_t>(q) * blockDim.x;
      if (vec >= p.vecs) continue;
      uint32_t w[4] = {detail::kBf16OnePair, detail::kBf16OnePair, detail::kBf16OnePair, detail::kBf16OnePair};
      if (p.weight != nullptr) {
        const uint4 wv = __ldg(reinterpret_cast<const uint4*>(p.weight) + vec);
        w[0] = wv.x, w[1] = wv.y, w[2] = wv.z, w[3] = wv.w;
      }
      uint32_t out[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = detail::norm_pair(h[q][i], inv, w[i]);
      if constexpr (kModulate) {
        if (bad_mod) {
#pragma unroll
          for (int i = 0; i < 4; ++i) out[i] = detail::kBf16NanPair;
        } else {
          const uint4 shv = reinterpret_cast<const uint4*>(detail::row_ptr(p.shift, mod_row))[vec];
          const uint4 scv = reinterpret_cast<const uint4*>(detail::row_ptr(p.scale, mod_row))[vec];
          const uint32_t sh[4] = {shv.x, shv.y, shv.z, shv.w}, sc[4] = {scv.x, scv.y, scv.z, scv.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            out[i] = detail::modulate_pair(out[i], sh[i], sc[i]);
          }
        }
      }
      reinterpret_cast<uint4*>(y)[vec] = make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
}

// Launches rms_norm_fused_bf16_kernel when it applies (a fusion, bf16 operands with 16-byte vectors,
// a weight that is bf16 or none, rows the register-cached block layout takes); false otherwise.
bool launch_fused_bf16(const RmsNormParams& p, cudaStream_t stream) {
  const bool bf16 = p.x.bf16 && p.y.bf16 && (p.weight == nullptr || p.weight_bf16) &&
                    (p.residual == kNoResidual || p.branch.bf16) && (p.residual != kGatedResidual || p.gate.bf16) &&
                    (!p.modulate || (p.shift.bf16 && p.scale.bf16));
  if (!bf16 || p.inner != 1 || (p.residual == kNoResidual && !p.modulate)) return false;
  const NormRowLayout l = norm_row_layout(p.rows, p.vecs, detail::kVec);
  if (l.group || !l.cached) return false;
  const auto run = [&](auto kernel) { kernel<<<l.grid, l.block, 0, stream>>>(p); };
  if (p.residual == kGatedResidual) {
    p.modulate ? run(rms_norm_fused_bf16_kernel<kGatedResidual, true>) : run(rms_norm_fused_bf16_kernel<kGatedResidual, false>);
  } else if (p.residual == kPlainResidual) {
    p.modulate ? run(rms_norm_fused_bf16_kernel<kPlainResidual, true>) : run(rms_norm_fused_bf16_kernel<kPlainResidual, false>);
  } else {
    run(rms_norm_fused_bf16_kernel<kNoResidual, true>);
  }
  return true;
}

template <int V>
Status launch_rms_norm(RmsNormParams p, cudaStream_t stream) {
  p.vecs = p.c / V;
  const NormRowLayout l = norm_row_layout(p.rows, p.vecs, V);
  if (l.group) {
    // One vector per lane while the warp has room (more loads in flight per row), else 32 lanes
    // with up to kNormGroupMaxVecs vectors each.
    if (p.vecs <= l.lanes) {
      rms_norm_group_kernel<V, 1><<<l.grid, l.block, 0, stream>>>(p, l.lanes);
    } else {
      rms_norm_group_kernel<V, kNormGroupMaxVecs><<<l.grid, l.block, 0, stream>>>(p, l.lanes);
    }
  } else if (l.cached) {
    rms_norm_block_kernel<V, true><<<l.grid, l.block, 0, stream>>>(p);
  } else {
    rms_norm_block_kernel<V, false><<<l.grid, l.block, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

struct ModulateParams {
  Operand x, y, shift, scale;  // x, y: [N, C]; shift, scale: [R, C]
  const int32_t* row;          // [N] indices into the table rows
  int64_t rows, table_rows, vecs;
};

// A row whose table index is outside [0, R) is written as NaN: the host cannot check device
// indices without a synchronisation, and NaN makes the bad row visible instead of reading wild
// memory.
template <int V>
__global__ void adaln_modulate_kernel(ModulateParams p) {
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec >= p.vecs) return;
  const int64_t e = vec * V;
  const bool out_bf16 = p.y.bf16;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; i < p.rows;
       i += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int32_t t = p.row[i];
    float v[V];
    if (t < 0 || t >= p.table_rows) {
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = detail::quiet_nan();
    } else {
      float sh[V], sc[V];
      detail::load_vec<V>(detail::row_ptr(p.x, i), p.x.bf16, e, v);
      detail::load_vec<V>(detail::row_ptr(p.shift, t), p.shift.bf16, e, sh);
      detail::load_vec<V>(detail::row_ptr(p.scale, t), p.scale.bf16, e, sc);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = detail::modulate_value(out_bf16, v[k], sh[k], sc[k]);
    }
    detail::store_vec<V>(detail::row_ptr(p.y, i), out_bf16, e, v);
  }
}

// Checks the fused operands against x [N, C] and fills their part of the kernel parameters.
Status set_fusion(const NormFusion& f, const TensorView& x, const TensorView& y, RmsNormParams& p) {
  const bool any = f.branch || f.gate || f.shift || f.scale;
  if (!any) return ok_status();
  if (x.rank() != 2) return invalid_argument("rms_norm_fused: fusions need an [N, C] input, got " + x.shape.to_string());
  const int64_t n = x.shape[0], c = x.shape[1];
  auto check_table = [&](const TensorView* t, const int32_t* row, const char* what) -> Status {
    VORTEX_RETURN_IF_ERROR(detail::check_device_activation(*t, what));
    if (t->rank() != 2 || t->shape[1] != c) {
      return invalid_argument(std::string(what) + ": " + t->shape.to_string() + " must be [R, " + std::to_string(c) +
                              "]");
    }
    if (row == nullptr && n > 0) return invalid_argument(std::string(what) + ": null row-index pointer");
    return ok_status();
  };
  if (f.gate && !f.branch) return invalid_argument("rms_norm_fused gate: given without a residual branch");
  if (f.branch) {
    VORTEX_RETURN_IF_ERROR(detail::check_device_activation(*f.branch, "rms_norm_fused branch"));
    if (f.branch->shape != x.shape) {
      return invalid_argument("rms_norm_fused branch: " + f.branch->shape.to_string() + " does not match input " +
                              x.shape.to_string());
    }
    if (x.data == y.data) return invalid_argument("rms_norm_fused: the residual update needs an output apart from x");
    p.branch = detail::make_operand(*f.branch);
    p.residual = kPlainResidual;
    if (f.gate) {
      VORTEX_RETURN_IF_ERROR(check_table(f.gate, f.gate_row, "rms_norm_fused gate"));
      p.residual = kGatedResidual;
      p.gate = detail::make_operand(*f.gate);
      p.gate_row = f.gate_row;
      p.gate_rows = f.gate->shape[0];
    }
  }
  if (static_cast<bool>(f.shift) != static_cast<bool>(f.scale)) {
    return invalid_argument("rms_norm_fused: modulation needs both shift and scale");
  }
  if (f.shift) {
    VORTEX_RETURN_IF_ERROR(check_table(f.shift, f.mod_row, "rms_norm_fused shift"));
    VORTEX_RETURN_IF_ERROR(check_table(f.scale, f.mod_row, "rms_norm_fused scale"));
    if (f.scale->shape != f.shift->shape) {
      return invalid_argument("rms_norm_fused scale: " + f.scale->shape.to_string() + " must match shift " +
                              f.shift->shape.to_string());
    }
    p.modulate = true;
    p.shift = detail::make_operand(*f.shift);
    p.scale = detail::make_operand(*f.scale);
    p.mod_row = f.mod_row;
    p.mod_rows = f.shift->shape[0];
  }
  return ok_status();
}

// ---- qk_norm_rope --------------------------------------------------------------------------------

struct QkNormRopeParams {
  RmsNormParams t;       // q or k: a rank-3 [N, H, D] view (rows = N·H, inner = H), V = kVec, one vector per lane
  const float* cos;      // [N, rot] contiguous, or null (no RoPE)
  const float* sin;
  int rot_vecs;          // rot / 2 / V: lanes [0, r) hold the first half, [r, 2r) its partners
  int group;             // lanes per row, as rms_norm's group kernel picks for D / V vectors
  int rows_per_thread;   // heads of one token a thread normalises: 1..kHeadRowsPerThread
  int64_t chunks;        // head chunks per token: ceil(H / (rows per block · rows_per_thread))
};

// Heads of one token a thread normalises (qk_norm_rope_kernel says why two).
constexpr int kHeadRowsPerThread = 2;

// The per-row steps after the norm, rotating this lane's V channels against the partner lane's
// from this lane's side (row_math.cuh: rope_bf16x2), so a token's rounded, signed factors serve
// all of its heads. BF16 rows go two channels per instruction; F32 rows have no rounding to fold.
template <int V>
struct RopeFactors {
  float cos[V], sin[V];      // F32: cos and ±sin
  uint32_t cos2[V / 2], sin2[V / 2];  // BF16: R(cos) and ±R(sin) pairs
};

template <int V, bool kBf16>
__device__ __forceinline__ void load_rope_factors(const QkNormRopeParams& params, int64_t token, int lane,
                                                  RopeFactors<V>& f) {
  const int64_t rot = 2 * static_cast<int64_t>(params.rot_vecs) * V;
  float c[V], sn[V];
  detail::load_vec<V>(reinterpret_cast<const char*>(params.cos + token * rot), false, lane * V, c);
  detail::load_vec<V>(reinterpret_cast<const char*>(params.sin + token * rot), false, lane * V, sn);
  const bool low = lane < params.rot_vecs;
  if constexpr (kBf16) {
    detail::rope_factors_bf16x2<V / 2>(c, sn, low, f.cos2, f.sin2);
  } else {
    const float sign = low ? -1.0f : 1.0f;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      f.cos[e] = c[e];
      f.sin[e] = sign * sn[e];
    }
  }
}

// Normalises one row's V channels (inv: the row's 1 / rms), rotates them when `rotates` and stores
// them; every lane of the warp calls it (the partner shuffle), `active` ones store.
template <int V, bool kBf16>
__device__ __forceinline__ void norm_rope_store(const float (&v)[V], const float (&w)[V], float inv, bool active,
                                                bool rotates, const RopeFactors<V>& f, int partner_lane, char* dst,
                                                int64_t e0) {
  if constexpr (kBf16) {
    uint32_t normed[V / 2], other[V / 2];
#pragma unroll
    for (int e = 0; e < V / 2; ++e) {
      normed[e] = detail::bf16x2_bits(__fmul_rn(__fmul_rn(v[2 * e], inv), w[2 * e]),
                                      __fmul_rn(__fmul_rn(v[2 * e + 1], inv), w[2 * e + 1]));
    }
#pragma unroll
    for (int e = 0; e < V / 2; ++e) other[e] = __shfl_sync(0xFFFFFFFFu, normed[e], partner_lane);
    if (!active) return;
    if (rotates) {
#pragma unroll
      for (int e = 0; e < V / 2; ++e) {
        normed[e] = detail::rope_bf16x2(normed[e], other[e], f.cos2[e], f.sin2[e]);
      }
    }
    static_assert(V == 8, "one 16-byte store per lane");
    *reinterpret_cast<uint4*>(reinterpret_cast<uint16_t*>(dst) + e0) = make_uint4(normed[0], normed[1], normed[2], normed[3]);
  } else {
    float normed[V], other[V];
#pragma unroll
    for (int e = 0; e < V; ++e) normed[e] = __fmul_rn(__fmul_rn(v[e], inv), w[e]);
#pragma unroll
    for (int e = 0; e < V; ++e) other[e] = __shfl_sync(0xFFFFFFFFu, normed[e], partner_lane);
    if (!active) return;
    if (rotates) {
#pragma unroll
      for (int e = 0; e < V; ++e) normed[e] = __fadd_rn(__fmul_rn(normed[e], f.cos[e]), __fmul_rn(other[e], f.sin[e]));
    }
    detail::store_vec<V>(dst, false, e0, normed);
  }
}

// One work item is one token's chunk of heads: thread (slot, lane) takes heads chunk·S·R + slot +
// k·S for k < R (S = kNormThreads / group rows per pass). Two rows per thread: their loads are in
// flight together, and the token's rope factors and the weight slice are loaded once for both (one
// row per thread was issue- and latency-bound at 0.89 ms per canonical q or k; four rows took 112
// registers, 2 blocks per SM, and ran slower than two at 3). Each row is normalised as rms_norm's
// group kernel does it (same lanes, same fma order, same shuffle tree), so the result is bitwise
// rms_norm + apply_rope. The loop bounds depend only on the block, so whole warps reach the
// shuffles; inactive lanes carry values nobody stores. kBf16: the tensor's dtype (in place, so
// input and output share it) as a template argument, so the loads and stores carry no runtime
// dtype test.
template <int V, bool kBf16>
__global__ void __launch_bounds__(kNormThreads, 3) qk_norm_rope_kernel(QkNormRopeParams params) {
  const RmsNormParams& p = params.t;
  const int group = params.group, lane = threadIdx.x % group;
  const int slot = threadIdx.x / group, slots = kNormThreads / group;
  const int rows_per_thread = params.rows_per_thread;
  const int64_t heads = p.inner, tokens = p.rows / p.inner;
  const int r = params.rot_vecs;
  const int partner = lane < r ? lane + r : (lane < 2 * r ? lane - r : lane);
  const int partner_lane = static_cast<int>(threadIdx.x % 32) - lane + partner;
  const bool in_row = lane < p.vecs;
  const bool rotates = params.cos != nullptr && lane < 2 * r;
  float w[V];
  if (in_row) load_weight<V>(p, lane * V, w);
  for (int64_t item = blockIdx.x; item < tokens * params.chunks; item += gridDim.x) {
    const int64_t token = item / params.chunks;
    const int64_t head0 = (item % params.chunks) * slots * rows_per_thread + slot;
    float v[kHeadRowsPerThread][V];
#pragma unroll
    for (int k = 0; k < kHeadRowsPerThread; ++k) {
      if (k < rows_per_thread && head0 + k * slots < heads && in_row) {
        detail::load_vec<V>(detail::row_ptr(p.x, token, head0 + k * slots), kBf16, lane * V, v[k]);
      }
    }
    RopeFactors<V> factors;
    if (rotates) load_rope_factors<V, kBf16>(params, token, lane, factors);
#pragma unroll
    for (int k = 0; k < kHeadRowsPerThread; ++k) {
      if (k >= rows_per_thread) break;
      const int64_t h = head0 + k * slots;
      const bool active = h < heads && in_row;
      float ss = 0.0f;
      if (active) ss = sum_squares<V>(v[k], ss);
      for (int offset = group / 2; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, offset);
      const float inv = detail::inv_rms(ss, p.c, p.eps);
      norm_rope_store<V, kBf16>(v[k], w, inv, active, rotates, factors, partner_lane,
                                active ? detail::row_ptr(p.y, token, h) : nullptr, lane * V);
    }
  }
}

// rms_norm and rms_norm_fused: the checks, the parameters and the launch.
Status rms_norm_impl(const TensorView& x, const TensorView* weight, float eps, const NormFusion& fusion,
                     cpu::RmsNormRounding rounding, const TensorView& y, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, "rms_norm input"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(y, "rms_norm output"));
  if (x.shape != y.shape || (x.rank() != 2 && x.rank() != 3)) {
    return invalid_argument("rms_norm: input " + x.shape.to_string() + " and output " + y.shape.to_string() +
                            " must match and be rank 2 or 3");
  }
  const int64_t c = x.shape[x.rank() - 1];
  if (weight) {
    if (weight->device != Device::kCuda || (weight->dtype != DType::kF32 && weight->dtype != DType::kBF16) ||
        weight->data == nullptr) {
      return invalid_argument("rms_norm weight: must be an F32 or BF16 device tensor, got " +
                              std::string(dtype_name(weight->dtype)) + " on " + device_name(weight->device));
    }
    if (weight->rank() != 1 || weight->shape[0] != c) {
      return invalid_argument("rms_norm weight: " + weight->shape.to_string() + " does not match last dim " +
                              std::to_string(c));
    }
  }
  if (c > INT32_MAX) return invalid_argument("rms_norm input: last dim " + std::to_string(c) + " too large");
  const int64_t inner = x.rank() == 3 ? x.shape[1] : 1;
  RmsNormParams p{};
  p.x = detail::make_operand(x);
  p.y = detail::make_operand(y);
  p.weight = weight ? static_cast<const char*>(weight->data) : nullptr;
  p.weight_stride = weight ? weight->strides[0] : 0;
  p.weight_bf16 = weight && weight->dtype == DType::kBF16;
  p.rows = x.shape[0] * inner;
  p.inner = inner;
  p.c = static_cast<int>(c);
  p.eps = eps;
  p.round_before_weight = rounding == cpu::RmsNormRounding::kBeforeWeight;
  VORTEX_RETURN_IF_ERROR(set_fusion(fusion, x, y, p));
  if (p.rows == 0 || c == 0) return ok_status();
  const bool weight_vec = !weight || (weight->strides[0] == 1 && detail::vec_aligned(*weight));
  const bool fusion_vec = (!fusion.branch || detail::vec_aligned(*fusion.branch)) &&
                          (!fusion.gate || detail::vec_aligned(*fusion.gate)) &&
                          (!fusion.shift || (detail::vec_aligned(*fusion.shift) && detail::vec_aligned(*fusion.scale)));
  if (c % detail::kVec == 0 && detail::vec_aligned(x) && detail::vec_aligned(y) && weight_vec && fusion_vec) {
    p.vecs = c / detail::kVec;
    if (launch_fused_bf16(p, stream)) {
      VORTEX_CUDA_CHECK_LAUNCH();
      return ok_status();
    }
    return launch_rms_norm<detail::kVec>(p, stream);
  }
  return launch_rms_norm<1>(p, stream);
}

}  // namespace

Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y, cudaStream_t stream,
                cpu::RmsNormRounding rounding) {
  return rms_norm_impl(x, weight, eps, NormFusion{}, rounding, y, stream);
}

Status rms_norm_fused(const TensorView& x, const TensorView* weight, float eps, const NormFusion& fusion,
                      const TensorView& y, cudaStream_t stream) {
  return rms_norm_impl(x, weight, eps, fusion, cpu::RmsNormRounding::kOnce, y, stream);
}

Status adaln_modulate(const TensorView& x, const TensorView& shift, const TensorView& scale, const int32_t* row,
                      const TensorView& y, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, "adaln_modulate input"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(y, "adaln_modulate output"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(shift, "adaln_modulate shift"));
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(scale, "adaln_modulate scale"));
  if (x.rank() != 2 || x.shape != y.shape) {
    return invalid_argument("adaln_modulate: input " + x.shape.to_string() + " and output " + y.shape.to_string() +
                            " must match and be [N, C]");
  }
  const int64_t n = x.shape[0], c = x.shape[1];
  if (shift.rank() != 2 || shift.shape[1] != c) {
    return invalid_argument("adaln_modulate shift: " + shift.shape.to_string() + " must be [R, " + std::to_string(c) +
                            "]");
  }
  if (scale.rank() != 2 || scale.shape != shift.shape) {
    return invalid_argument("adaln_modulate scale: " + scale.shape.to_string() + " must match shift " +
                            shift.shape.to_string());
  }
  if (row == nullptr && n > 0) return invalid_argument("adaln_modulate row: null row-index pointer");
  if (n == 0 || c == 0) return ok_status();
  ModulateParams p{detail::make_operand(x), detail::make_operand(y), detail::make_operand(shift),
                   detail::make_operand(scale), row, n, shift.shape[0], 0};
  const bool vec = c % detail::kVec == 0 && detail::vec_aligned(x) && detail::vec_aligned(y) &&
                   detail::vec_aligned(shift) && detail::vec_aligned(scale);
  if (vec) {
    p.vecs = c / detail::kVec;
    const detail::RowLaunch l = detail::row_launch(n, p.vecs);
    adaln_modulate_kernel<detail::kVec><<<l.grid, l.block, 0, stream>>>(p);
  } else {
    p.vecs = c;
    const detail::RowLaunch l = detail::row_launch(n, p.vecs);
    adaln_modulate_kernel<1><<<l.grid, l.block, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status head_norm_rope(const TensorView& x, const TensorView* weight, float eps, const TensorView* cos,
                      const TensorView* sin, cudaStream_t stream) {
  if (static_cast<bool>(cos) != static_cast<bool>(sin)) return invalid_argument("head_norm_rope: cos without sin");
  // Argument checks and the fallback both come from the separate ops: the fused kernel runs only
  // where it reproduces them exactly (vector loads, one vector per lane, whole vectors per half).
  const auto separate = [&]() -> Status {
    VORTEX_RETURN_IF_ERROR(rms_norm(x, weight, eps, x, stream));
    return cos ? apply_rope(x, *cos, *sin, stream) : ok_status();
  };
  if (x.rank() != 3 || x.device != Device::kCuda) return separate();
  const int64_t d = x.shape[2], vecs = d / detail::kVec;
  bool fits = d % detail::kVec == 0 && vecs <= 32 && detail::vec_aligned(x);
  if (weight) {
    fits = fits && weight->device == Device::kCuda && weight->rank() == 1 && weight->shape[0] == d &&
           weight->strides[0] == 1 && (weight->dtype == DType::kF32 || weight->dtype == DType::kBF16) &&
           detail::vec_aligned(*weight);
  }
  int64_t rot = 0;
  if (cos) {
    rot = cos->rank() == 2 ? cos->shape[1] : -1;
    fits = fits && cos->rank() == 2 && sin->shape == cos->shape && cos->shape[0] == x.shape[0] && rot <= d &&
           (rot / 2) % detail::kVec == 0 && rot % 2 == 0 && cos->dtype == DType::kF32 && sin->dtype == DType::kF32 &&
           cos->is_contiguous() && sin->is_contiguous() && cos->device == Device::kCuda;
  }
  if (!fits) return separate();
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, "head_norm_rope x"));
  if (x.shape[0] * x.shape[1] == 0 || d == 0) return ok_status();
  QkNormRopeParams params{};
  params.cos = cos ? static_cast<const float*>(cos->data) : nullptr;
  params.sin = sin ? static_cast<const float*>(sin->data) : nullptr;
  params.rot_vecs = static_cast<int>(rot / 2 / detail::kVec);
  // rms_norm's group layout for this width (vecs <= 32 lanes: one vector per lane).
  const NormRowLayout l = norm_row_layout(x.shape[0] * x.shape[1], vecs, detail::kVec);
  params.group = l.lanes;
  const int64_t slots = kNormThreads / l.lanes;
  params.rows_per_thread = static_cast<int>(std::min<int64_t>(kHeadRowsPerThread, detail::ceil_div(x.shape[1], slots)));
  params.chunks = detail::ceil_div(x.shape[1], slots * params.rows_per_thread);
  const unsigned grid = static_cast<unsigned>(std::min(x.shape[0] * params.chunks, kNormMaxGrid));
  RmsNormParams& p = params.t;
  p.x = p.y = detail::make_operand(x);
  p.weight = weight ? static_cast<const char*>(weight->data) : nullptr;
  p.weight_stride = 1;
  p.weight_bf16 = weight && weight->dtype == DType::kBF16;
  p.inner = x.shape[1];
  p.rows = x.shape[0] * p.inner;
  p.vecs = vecs;
  p.c = static_cast<int>(d);
  p.eps = eps;
  if (x.dtype == DType::kBF16) {
    qk_norm_rope_kernel<detail::kVec, true><<<grid, kNormThreads, 0, stream>>>(params);
  } else {
    qk_norm_rope_kernel<detail::kVec, false><<<grid, kNormThreads, 0, stream>>>(params);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status qk_norm_rope(const TensorView& q, const TensorView& k, const TensorView* q_weight, const TensorView* k_weight,
                    float eps, const TensorView* cos, const TensorView* sin, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(head_norm_rope(q, q_weight, eps, cos, sin, stream));
  return head_norm_rope(k, k_weight, eps, cos, sin, stream);
}

}  // namespace vortex::cuda
