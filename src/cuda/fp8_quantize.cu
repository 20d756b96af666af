// e4m3 row quantizers of the `fp8` recipe (contract: cuda/fp8_quantize.h; rule: cpu/fp8_scale.h).
//
//   quantize_rows_fp8            h = x
//   rms_norm_fused_quantize_fp8  x = R(x + R(gate[g]·branch)) or R(x + branch)   (optional, written back)
//                                h = R((x · inv) · w),  inv = 1 / sqrt(Σx² / C + eps)
//                                h = R(R(h · R(1 + scale[t])) + shift[t])         (optional)
//   swiglu_quantize_fp8          h = R(value · R(silu(gate)))
// and then, per row, codes = e4m3(h · inv_scale) and scale = amax(|h|) / 448 (R rounds to bf16;
// the residual rounds to x's dtype, as gated_residual does).
//
// One kernel template serves the three ops through a "source" that yields h for a vector of
// elements. A team of T threads owns a row, and thread `lane` owns the vectors lane, lane + T,
// lane + 2T, ... of V elements (V = 8 with 16-byte loads, or V = 1 for views that are not 16-byte
// aligned). A row takes up to three passes:
//   1. norm sources only: the residual update (written back to x) and the sum of squares. The sum
//      is an fma chain over the thread's vectors in order, then an xor-shuffle tree over
//      min(T, 32) lanes, then (T > 32) the warp partials added in warp order by every thread. This
//      is rms_norm's order (norm.cu), and T and V are chosen by its rules (norm_row_layout in
//      norm_layout.h and the vector test in rms_norm_fused_quantize_fp8), so inv, and with it
//      every h, is bitwise the unfused value.
//   2. h for each element and the row's amax, taken as the max of |h|'s bits (order-free, and NaN
//      sorts above everything).
//   3. scale and reciprocal by fp8_row_scale, codes written as 8-byte words (V = 8 with aligned
//      codes) or bytes, and the scale written by lane 0.
// Cached instantiations keep the thread's vectors in registers between passes (norm.cu's register
// cache: 24 values in vectors, 8 scalars). Rows too wide for that re-read x in passes 2 and 3 (after
// pass 1 wrote the residual back, so they read the updated row) and recompute the same bits.
//
// SwiGLU rows wider than that cache get a kernel of their own (swiglu_quantize_cached_kernel; on
// packed bf16 pairs for bf16 input, swiglu_quantize_cached_bf16_kernel), and the fused norm on bf16
// operands (the fp8 blocks') one that computes on packed bf16 pairs (fp8_rows_bf16_kernel), with
// the same layout and bits.
//
// Teams: T <= 32 lanes share a warp, and 256-thread blocks hold 256 / T rows (narrow rows). Wider
// rows get one block of T threads per row (T a multiple of 32, up to 512: the 5376-channel rows
// take 224 threads of 3 vectors each). Rows are grid-strided, and every thread of a block runs
// the same number of iterations, so the shuffles and barriers are always reached by all.
#include "cuda/fp8_quantize.h"

#include <algorithm>
#include <string>

#include "cpu/fp8.h"
#include "cpu/fp8_scale.h"
#include "cuda/elementwise.h"
#include "cuda/fp8_amax.cuh"
#include "cuda/norm_layout.h"
#include "cuda/row_io.cuh"
#include "cuda/row_math.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

using detail::Operand;

// Teams and the register cache follow rms_norm's row layout (norm_layout.h): a block of the
// block layout holds up to kNormBlockMaxThreads threads.
constexpr int kMaxWarps = kNormBlockMaxThreads / 32;

struct CodesOut {
  uint8_t* codes;  // [N, C]
  int64_t stride;  // elements (bytes) between rows
  bool words;      // codes base and row stride are multiples of 8: V = 8 stores one 8-byte word
  float* scales;   // [N]
};

// ---- sources ---------------------------------------------------------------------------------------

struct PlainSource {
  static constexpr bool kNormalizes = false;
  Operand x;

  struct Row {
    const char* x;
  };
  __device__ Row row(int64_t r) const { return {detail::row_ptr(x, r)}; }
  template <int V>
  __device__ void load(const Row& row, int64_t e, float (&v)[V]) const {
    detail::load_vec<V>(row.x, x.bf16, e, v);
  }
  template <int V>
  __device__ void finish(const Row&, int64_t, float (&)[V], float) const {}
};

struct SwigluSource {
  static constexpr bool kNormalizes = false;
  Operand u;  // [N, 2F]
  int64_t f;

  struct Row {
    const char* u;
  };
  __device__ Row row(int64_t r) const { return {detail::row_ptr(u, r)}; }
  template <int V>
  __device__ void load(const Row& row, int64_t e, float (&v)[V]) const {
    float gate[V];
    detail::load_vec<V>(row.u, u.bf16, e, v);
    detail::load_vec<V>(row.u, u.bf16, f + e, gate);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v[k] = detail::round_bf16_device(__fmul_rn(v[k], detail::round_bf16_device(detail::silu_f32(gate[k]))));
    }
  }
  template <int V>
  __device__ void finish(const Row&, int64_t, float (&)[V], float) const {}
};

// Residual kinds of the fused norm (norm.cu's): the flag is uniform across the grid.
enum ResidualKind : int { kNoResidual = 0, kPlainResidual = 1, kGatedResidual = 2 };

struct NormSource {
  static constexpr bool kNormalizes = true;
  Operand x;                 // [N, C]; a fused residual writes the updated rows back
  const char* weight;        // [C] or null
  int64_t weight_stride;
  bool weight_bf16;
  int residual;              // ResidualKind
  Operand branch, gate;      // branch [N, C]; gate [R, C]
  const int32_t* gate_row;   // [N]
  int64_t gate_rows;
  bool modulate;
  Operand shift, scale;      // [R', C]
  const int32_t* mod_row;    // [N]
  int64_t mod_rows;
  float eps;
  int c;

  // A table index outside [0, R) makes the row NaN, as gated_residual and adaln_modulate do.
  struct Row {
    char* x;
    const char* branch;
    const char* gate;
    const char* shift;
    const char* scale;
    bool bad_gate, bad_mod;
  };
  __device__ Row row(int64_t r) const {
    Row out{detail::row_ptr(x, r), nullptr, nullptr, nullptr, nullptr, false, false};
    residual_rows(r, out);
    modulation_rows(r, out);
    return out;
  }
  // The two halves of row(): pass 1's operands and pass 2's (fp8_rows_bf16_kernel looks them up
  // when it needs them, to hold fewer pointers at a time).
  __device__ void residual_rows(int64_t r, Row& out) const {
    if (residual != kNoResidual) out.branch = detail::row_ptr(branch, r);
    if (residual == kGatedResidual) {
      const int32_t t = gate_row[r];
      out.bad_gate = t < 0 || t >= gate_rows;
      if (!out.bad_gate) out.gate = detail::row_ptr(gate, t);
    }
  }
  __device__ void modulation_rows(int64_t r, Row& out) const {
    if (modulate) {
      const int32_t t = mod_row[r];
      out.bad_mod = t < 0 || t >= mod_rows;
      if (!out.bad_mod) {
        out.shift = detail::row_ptr(shift, t);
        out.scale = detail::row_ptr(scale, t);
      }
    }
  }
  // Pass 1: x with the residual applied (gated_residual's / residual_add's operations) and written
  // back; norm.cu's load_row.
  template <int V>
  __device__ void load_first(const Row& row, int64_t e, float (&v)[V]) const {
    detail::load_vec<V>(row.x, x.bf16, e, v);
    if (residual == kNoResidual) return;
    float b[V];
    detail::load_vec<V>(row.branch, branch.bf16, e, b);
    if (residual == kGatedResidual) {
      if (row.bad_gate) {
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = detail::quiet_nan();
      } else {
        float g[V];
        detail::load_vec<V>(row.gate, gate.bf16, e, g);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = detail::gated_residual_value(x.bf16, v[k], g[k], b[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = detail::residual_value(x.bf16, v[k], b[k]);
    }
    detail::store_vec<V>(row.x, x.bf16, e, v);
  }
  // Passes 2 and 3 of the re-reading kernel: the (already updated) row.
  template <int V>
  __device__ void load(const Row& row, int64_t e, float (&v)[V]) const {
    detail::load_vec<V>(row.x, x.bf16, e, v);
  }
  __device__ float inv_rms(float sum_sq) const { return detail::inv_rms(sum_sq, c, eps); }
  // x → h: rms_norm's (x · inv) · w rounded to bf16, then adaln_modulate's three bf16 roundings.
  template <int V>
  __device__ void finish(const Row& row, int64_t e, float (&v)[V], float inv) const {
    float w[V];
    if (weight == nullptr) {
#pragma unroll
      for (int k = 0; k < V; ++k) w[k] = 1.0f;
    } else if constexpr (V > 1) {
      detail::load_vec<V>(weight, weight_bf16, e, w);  // V > 1 only for a unit-stride, aligned weight
    } else {
      detail::load_vec<1>(weight, weight_bf16, e * weight_stride, w);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = detail::round_bf16_device(__fmul_rn(__fmul_rn(v[k], inv), w[k]));
    if (!modulate) return;
    if (row.bad_mod) {
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = detail::quiet_nan();
      return;
    }
    float sh[V], sc[V];
    detail::load_vec<V>(row.shift, shift.bf16, e, sh);
    detail::load_vec<V>(row.scale, scale.bf16, e, sc);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = detail::modulate_value(true, v[k], sh[k], sc[k]);
  }
};

// ---- team reductions -------------------------------------------------------------------------------

// rms_norm's sum: xor tree over min(T, 32) lanes; for T > 32 every thread then adds the warp
// partials in warp order (norm.cu's block_sum). All threads of the block must call it.
__device__ __forceinline__ float team_sum(float s, int team, float* warp_sums) {
  const int width = team < 32 ? team : 32;
  for (int offset = width / 2; offset > 0; offset /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, offset);
  if (team <= 32) return s;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < team / 32; ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums is rewritten by the next row
  return total;
}

template <int V>
__device__ __forceinline__ float sum_squares(const float (&v)[V], float acc) {
#pragma unroll
  for (int k = 0; k < V; ++k) acc = fmaf(v[k], v[k], acc);
  return acc;
}

// fp8_quantize (cpu/fp8_scale.h) of each element: e4m3(h · inv) by the hardware conversion, which
// equals f32_to_e4m3_bits on every non-NaN input; a finite row has no NaN (its amax would not be
// finite), and a non-finite row is all kE4m3NanCode, as fp8_quantize writes it.
template <int V>
__device__ __forceinline__ void store_codes(const CodesOut& out, uint8_t* dst, int64_t e, const float (&h)[V],
                                            const Fp8RowScale& s) {
  uint32_t pairs[(V + 1) / 2];
#pragma unroll
  for (int k = 0; k < V; k += 2) {
    pairs[k / 2] = s.finite ? detail::e4m3x2_bits(fp8_mul_rn(h[k], s.inv), k + 1 < V ? fp8_mul_rn(h[k + 1], s.inv) : 0.0f)
                            : kE4m3NanCode * 0x0101u;
  }
  if constexpr (V == 8) {
    if (out.words) {
      *reinterpret_cast<uint2*>(dst + e) = make_uint2(pairs[0] | (pairs[1] << 16), pairs[2] | (pairs[3] << 16));
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) dst[e + k] = static_cast<uint8_t>(pairs[k / 2] >> (8 * (k % 2)));
}

// ---- the kernel ------------------------------------------------------------------------------------

// 80 registers: without a cap ptxas takes 106 (the norm source) and a 224-thread block of a
// 5376-wide row fits only twice per SM, latency-bound (the fp8 block's producers measured 2-2.5x
// the bf16 ones). At 80, three fit, with a few spilled bytes; at 64 the spills grow to 340 B.
template <class Source, int V, bool CACHED>
__global__ void __maxnreg__(80) fp8_rows_kernel(Source src, CodesOut out, int64_t rows, int64_t vecs,
                                                            int team) {
  __shared__ float warp_sums[kMaxWarps];
  __shared__ uint32_t warp_max[kMaxWarps];
  // Room for either layout's vectors: kNormGroupMaxVecs per lane of a team, the register cache per
  // thread of a block (norm_row_layout never gives a thread more).
  constexpr int kCache =
      !CACHED ? 1 : (norm_block_cache_vecs(V) > kNormGroupMaxVecs ? norm_block_cache_vecs(V) : kNormGroupMaxVecs);
  const int lane = static_cast<int>(threadIdx.x) % team;
  const int64_t rows_per_block = blockDim.x / team;
  for (int64_t r0 = blockIdx.x * rows_per_block; r0 < rows; r0 += gridDim.x * rows_per_block) {
    const int64_t r = r0 + threadIdx.x / team;
    const bool active = r < rows;
    typename Source::Row row{};
    if (active) row = src.row(r);
    float h[kCache][V];

    float inv = 0.0f;
    if constexpr (Source::kNormalizes) {
      float ss = 0.0f;
      if (active) {
        if constexpr (CACHED) {
#pragma unroll
          for (int q = 0; q < kCache; ++q) {
            const int64_t vec = lane + static_cast<int64_t>(q) * team;
            if (vec < vecs) {
              src.load_first(row, vec * V, h[q]);
              ss = sum_squares<V>(h[q], ss);
            }
          }
        } else {
          for (int64_t vec = lane; vec < vecs; vec += team) {
            src.load_first(row, vec * V, h[0]);
            ss = sum_squares<V>(h[0], ss);
          }
        }
      }
      inv = src.inv_rms(team_sum(ss, team, warp_sums));
    }

    uint32_t amax = 0;
    if (active) {
      if constexpr (CACHED) {
#pragma unroll
        for (int q = 0; q < kCache; ++q) {
          const int64_t vec = lane + static_cast<int64_t>(q) * team;
          if (vec < vecs) {
            if constexpr (!Source::kNormalizes) src.load(row, vec * V, h[q]);
            src.finish(row, vec * V, h[q], inv);
            amax = detail::amax_bits<V>(h[q], amax);
          }
        }
      } else {
        for (int64_t vec = lane; vec < vecs; vec += team) {
          src.load(row, vec * V, h[0]);
          src.finish(row, vec * V, h[0], inv);
          amax = detail::amax_bits<V>(h[0], amax);
        }
      }
    }
    const Fp8RowScale s = fp8_row_scale(detail::team_max(amax, team, warp_max));

    if (active) {
      uint8_t* dst = out.codes + r * out.stride;
      if (lane == 0) out.scales[r] = s.scale;
      if constexpr (CACHED) {
#pragma unroll
        for (int q = 0; q < kCache; ++q) {
          const int64_t vec = lane + static_cast<int64_t>(q) * team;
          if (vec < vecs) store_codes<V>(out, dst, vec * V, h[q], s);
        }
      } else {
        for (int64_t vec = lane; vec < vecs; vec += team) {
          src.load(row, vec * V, h[0]);
          src.finish(row, vec * V, h[0], inv);
          store_codes<V>(out, dst, vec * V, h[0], s);
        }
      }
    }
  }
}

// ---- the all-bf16 norm kernel -------------------------------------------------------------------------

// fp8_rows_kernel<NormSource, 8, true> for bf16 operands (x, branch, gate, shift, scale and the
// weight; every fp8 block's): the same layout, passes and bits, on packed bf16 pairs. The steps the
// program rounds to bf16 from bf16 operands (the residual R(x + R(gate · branch)), the modulation
// R(R(h · R(1 + scale)) + shift)) are one mul.rn / add.rn .bf16x2 per two elements, which equal
// the fp32 step plus its rounding (row_io.cuh's bf16x2_mul / bf16x2_add); the norm's fp32 product
// (x · inv) · w is rounded two at a time by one cvt.rn.bf16x2.f32; the register cache holds bf16
// pairs (h is bf16 by definition), and the amax is the max of the pairs' magnitude bits, which
// orders them as the widened floats' bits do. The generic kernel spends ~45 instructions per
// element on the fp32 round trips and holds fp32 values: 80 registers, a third of the SM's warps.
// Capped at 56 registers: five 224-thread blocks of a 5376-wide row per SM (the gated and
// modulated instance spills 4 bytes there; uncapped, ptxas takes 62, and four fit).
using detail::bf16x2_high;
using detail::bf16x2_low;

__device__ __forceinline__ uint4 load_bf16x8(const char* row, int64_t e) {
  return *reinterpret_cast<const uint4*>(row + 2 * e);
}

template <int kResidual, bool kModulate>
__global__ void __maxnreg__(56) fp8_rows_bf16_kernel(NormSource src, CodesOut out,
                                                                             int64_t rows, int64_t vecs, int team) {
  __shared__ float warp_sums[kMaxWarps];
  __shared__ uint32_t warp_max[kMaxWarps];
  constexpr int kCache = norm_block_cache_vecs(8) > kNormGroupMaxVecs ? norm_block_cache_vecs(8) : kNormGroupMaxVecs;
  const int lane = static_cast<int>(threadIdx.x) % team;
  const int64_t rows_per_block = blockDim.x / team;
  for (int64_t r0 = blockIdx.x * rows_per_block; r0 < rows; r0 += gridDim.x * rows_per_block) {
    const int64_t r = r0 + threadIdx.x / team;
    const bool active = r < rows;
    uint32_t h[kCache][4];

    // Pass 1: the residual, written back, and the sum of squares in rms_norm's order.
    float ss = 0.0f;
    if (active) {
      NormSource::Row row{detail::row_ptr(src.x, r), nullptr, nullptr, nullptr, nullptr, false, false};
      src.residual_rows(r, row);
#pragma unroll
      for (int q = 0; q < kCache; ++q) {
        const int64_t vec = lane + static_cast<int64_t>(q) * team;
        if (vec >= vecs) continue;
        const uint4 xv = load_bf16x8(row.x, vec * 8);
        uint32_t v[4] = {xv.x, xv.y, xv.z, xv.w};
        if constexpr (kResidual != kNoResidual) {
          const uint4 bv = load_bf16x8(row.branch, vec * 8);
          const uint32_t b[4] = {bv.x, bv.y, bv.z, bv.w};
          detail::residual_pairs<kResidual == kGatedResidual>(
              v, b, row.bad_gate, [&] { return __ldg(reinterpret_cast<const uint4*>(row.gate) + vec); });
          *reinterpret_cast<uint4*>(row.x + 16 * vec) = make_uint4(v[0], v[1], v[2], v[3]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          ss = fmaf(bf16x2_low(v[i]), bf16x2_low(v[i]), ss);
          ss = fmaf(bf16x2_high(v[i]), bf16x2_high(v[i]), ss);
          h[q][i] = v[i];
        }
      }
    }
    const float inv = src.inv_rms(team_sum(ss, team, warp_sums));

    // Pass 2: h = R((x · inv) · w), then the modulation; the amax of |h| on the pairs.
    uint32_t amax_pairs = 0;
    if (active) {
      NormSource::Row row{};
      src.modulation_rows(r, row);
#pragma unroll
      for (int q = 0; q < kCache; ++q) {
        const int64_t vec = lane + static_cast<int64_t>(q) * team;
        if (vec >= vecs) continue;
        uint32_t w[4] = {detail::kBf16OnePair, detail::kBf16OnePair, detail::kBf16OnePair, detail::kBf16OnePair};
        if (src.weight != nullptr) {
          const uint4 wv = __ldg(reinterpret_cast<const uint4*>(src.weight) + vec);
          w[0] = wv.x, w[1] = wv.y, w[2] = wv.z, w[3] = wv.w;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) h[q][i] = detail::norm_pair(h[q][i], inv, w[i]);
        if constexpr (kModulate) {
          if (row.bad_mod) {
#pragma unroll
            for (int i = 0; i < 4; ++i) h[q][i] = detail::kBf16NanPair;
          } else {
            const uint4 shv = __ldg(reinterpret_cast<const uint4*>(row.shift) + vec);
            const uint4 scv = __ldg(reinterpret_cast<const uint4*>(row.scale) + vec);
            const uint32_t sh[4] = {shv.x, shv.y, shv.z, shv.w}, sc[4] = {scv.x, scv.y, scv.z, scv.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              h[q][i] = detail::modulate_pair(h[q][i], sh[i], sc[i]);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) amax_pairs = __vmaxu2(amax_pairs, h[q][i] & 0x7FFF7FFFu);
      }
    }
    const uint32_t amax = max(amax_pairs & 0xFFFFu, amax_pairs >> 16) << 16;
    const Fp8RowScale s = fp8_row_scale(detail::team_max(amax, team, warp_max));

    // Pass 3: the codes.
    if (active) {
      uint8_t* dst = out.codes + r * out.stride;
      if (lane == 0) out.scales[r] = s.scale;
#pragma unroll
      for (int q = 0; q < kCache; ++q) {
        const int64_t vec = lane + static_cast<int64_t>(q) * team;
        if (vec >= vecs) continue;
        float f[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) f[2 * i] = bf16x2_low(h[q][i]), f[2 * i + 1] = bf16x2_high(h[q][i]);
        store_codes<8>(out, dst, vec * 8, f, s);
      }
    }
  }
}

// SwiGLU's own layout for rows the shared one would re-read (more vectors than the register
// cache holds at 512 threads: the 14336-wide FFN rows). SwiGLU has no sum whose order must match
// another kernel's (the row amax is order-free), so one block per row gets as many threads as
// kSwigluCachedVecs vectors each need, and each thread keeps its h values as bf16 bits, which
// is exact: h is rounded to bf16 by its definition. The row is read once instead of twice.
//
// kBf16Pairs (bf16 input, the fp8 block's case) computes on packed bf16 pairs (row_math.cuh's
// swiglu_pair), the amax on the pairs' bits. The same bits, with half the conversions of one value
// at a time: they share the exp2 unit with silu's expf and division (bench/notes/attention.md,
// "The conversions share the exp2 unit").
constexpr int kSwigluCachedVecs = 4;
constexpr int kSwigluMaxThreads = 1024;

template <bool kBf16Pairs>
__device__ __forceinline__ void swiglu_quantize_cached_rows(const SwigluSource& src, const CodesOut& out, int64_t rows,
                                                            int64_t vecs, uint32_t* warp_max) {
  constexpr int V = detail::kVec;
  const int team = static_cast<int>(blockDim.x), lane = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block: every thread syncs
    const SwigluSource::Row row = src.row(r);
    uint32_t packed[kSwigluCachedVecs][V / 2];
    uint32_t amax = 0, amax_pairs = 0;
#pragma unroll
    for (int q = 0; q < kSwigluCachedVecs; ++q) {
      const int64_t vec = lane + static_cast<int64_t>(q) * team;
      if (vec < vecs) {
        if constexpr (kBf16Pairs) {
          const uint16_t* u = reinterpret_cast<const uint16_t*>(row.u);
          const uint4 vv = *reinterpret_cast<const uint4*>(u + vec * V);
          const uint4 gv = *reinterpret_cast<const uint4*>(u + src.f + vec * V);
          const uint32_t value[V / 2] = {vv.x, vv.y, vv.z, vv.w}, gate[V / 2] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
          for (int k = 0; k < V / 2; ++k) {
            packed[q][k] = detail::swiglu_pair(value[k], gate[k]);
            amax_pairs = __vmaxu2(amax_pairs, packed[q][k] & 0x7FFF7FFFu);
          }
        } else {
          float h[V];
          src.load<V>(row, vec * V, h);
          amax = detail::amax_bits<V>(h, amax);
#pragma unroll
          for (int k = 0; k < V / 2; ++k) {
            packed[q][k] = (__float_as_uint(h[2 * k]) >> 16) | (__float_as_uint(h[2 * k + 1]) & 0xFFFF0000u);
          }
        }
      }
    }
    // A pair's halves are bf16 bits: their max, shifted up, is the max of the fp32 bits.
    if constexpr (kBf16Pairs) amax = max(amax_pairs & 0xFFFFu, amax_pairs >> 16) << 16;
    const Fp8RowScale s = fp8_row_scale(detail::team_max(amax, team, warp_max));
    uint8_t* dst = out.codes + r * out.stride;
    if (lane == 0) out.scales[r] = s.scale;
#pragma unroll
    for (int q = 0; q < kSwigluCachedVecs; ++q) {
      const int64_t vec = lane + static_cast<int64_t>(q) * team;
      if (vec < vecs) {
        float h[V];
#pragma unroll
        for (int k = 0; k < V / 2; ++k) {
          h[2 * k] = bf16x2_low(packed[q][k]);
          h[2 * k + 1] = bf16x2_high(packed[q][k]);
        }
        store_codes<V>(out, dst, vec * V, h, s);
      }
    }
  }
}

__global__ void __launch_bounds__(kSwigluMaxThreads) swiglu_quantize_cached_kernel(SwigluSource src, CodesOut out,
                                                                                   int64_t rows, int64_t vecs) {
  __shared__ uint32_t warp_max[kSwigluMaxThreads / 32];
  swiglu_quantize_cached_rows<false>(src, out, rows, vecs, warp_max);
}

// 40 registers (ptxas takes 53 uncapped; 20 bytes spill at 40): three 448-thread blocks of a
// 14336-wide row per SM instead of two. 48 is not enough: a block's 14 warps spread 4-4-3-3 over
// the SM's four 16K-register partitions, so a third block needs 11 warps of 48 (16.9K) on two.
// ncu, canonical fp8 block: 1.16 ms (64 registers, the scalar steps) → 1.03 (48) → 0.87 ms (40).
__global__ void __maxnreg__(40) swiglu_quantize_cached_bf16_kernel(SwigluSource src, CodesOut out, int64_t rows,
                                                                   int64_t vecs) {
  __shared__ uint32_t warp_max[kSwigluMaxThreads / 32];
  swiglu_quantize_cached_rows<true>(src, out, rows, vecs, warp_max);
}

// ---- launch ----------------------------------------------------------------------------------------

template <class Source, int V>
void launch_width(const Source& src, const CodesOut& out, int64_t rows, int64_t vecs, const NormRowLayout& l,
                  cudaStream_t stream) {
  if (l.cached) {
    fp8_rows_kernel<Source, V, true><<<l.grid, l.block, 0, stream>>>(src, out, rows, vecs, l.lanes);
  } else {
    fp8_rows_kernel<Source, V, false><<<l.grid, l.block, 0, stream>>>(src, out, rows, vecs, l.lanes);
  }
}

template <class Source>
Status launch_fp8_rows(const Source& src, const CodesOut& out, int64_t rows, int64_t cols, bool vec,
                       cudaStream_t stream) {
  if (rows == 0) return ok_status();
  const int v = vec ? detail::kVec : 1;
  const int64_t vecs = cols / v;
  const NormRowLayout l = norm_row_layout(rows, vecs, v);
  if (vec) {
    launch_width<Source, detail::kVec>(src, out, rows, vecs, l, stream);
  } else {
    launch_width<Source, 1>(src, out, rows, vecs, l, stream);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

void launch_bf16_norm(const NormSource& src, const CodesOut& out, int64_t rows, int64_t vecs, const NormRowLayout& l,
                      cudaStream_t stream) {
  const auto run = [&](auto kernel) { kernel<<<l.grid, l.block, 0, stream>>>(src, out, rows, vecs, l.lanes); };
  if (src.residual == kGatedResidual) {
    src.modulate ? run(fp8_rows_bf16_kernel<kGatedResidual, true>) : run(fp8_rows_bf16_kernel<kGatedResidual, false>);
  } else if (src.residual == kPlainResidual) {
    src.modulate ? run(fp8_rows_bf16_kernel<kPlainResidual, true>) : run(fp8_rows_bf16_kernel<kPlainResidual, false>);
  } else {
    src.modulate ? run(fp8_rows_bf16_kernel<kNoResidual, true>) : run(fp8_rows_bf16_kernel<kNoResidual, false>);
  }
}

Status check_matrix_input(const TensorView& x, const std::string& what) {
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, what.c_str()));
  if (x.rank() != 2) return invalid_argument(what + ": must be 2-D, got " + x.shape.to_string());
  if (x.shape[1] < 1) return invalid_argument(what + ": rows must have at least one column");
  return ok_status();
}

Result<CodesOut> codes_out(const TensorView& codes, const TensorView& scales, int64_t rows, int64_t cols,
                           const std::string& op) {
  VORTEX_RETURN_IF_ERROR(cpu::check_fp8_rows_output(codes, scales, rows, cols, Device::kCuda, op));
  const bool words = reinterpret_cast<uintptr_t>(codes.data) % 8 == 0 && (rows <= 1 || codes.strides[0] % 8 == 0);
  return CodesOut{static_cast<uint8_t*>(codes.data), codes.strides[0], words, static_cast<float*>(scales.data)};
}

}  // namespace

Status quantize_rows_fp8(const TensorView& x, const TensorView& codes, const TensorView& scales,
                         cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check_matrix_input(x, "quantize_rows_fp8 input"));
  const int64_t n = x.shape[0], c = x.shape[1];
  VORTEX_ASSIGN_OR_RETURN(const CodesOut out, codes_out(codes, scales, n, c, "quantize_rows_fp8"));
  const bool vec = c % detail::kVec == 0 && detail::vec_aligned(x);
  return launch_fp8_rows(PlainSource{detail::make_operand(x)}, out, n, c, vec, stream);
}

Status rms_norm_fused_quantize_fp8(const TensorView& x, const TensorView* weight, float eps, const NormFusion& fusion,
                                   const TensorView& codes, const TensorView& scales, cudaStream_t stream) {
  const std::string op = "rms_norm_fused_quantize_fp8";
  VORTEX_RETURN_IF_ERROR(check_matrix_input(x, op + " input"));
  const int64_t n = x.shape[0], c = x.shape[1];
  if (c > INT32_MAX) return invalid_argument(op + " input: last dim " + std::to_string(c) + " too large");
  if (weight) {
    if (weight->device != Device::kCuda || (weight->dtype != DType::kF32 && weight->dtype != DType::kBF16) ||
        weight->data == nullptr) {
      return invalid_argument(op + " weight: must be an F32 or BF16 device tensor, got " +
                              std::string(dtype_name(weight->dtype)) + " on " + device_name(weight->device));
    }
    if (weight->rank() != 1 || weight->shape[0] != c) {
      return invalid_argument(op + " weight: " + weight->shape.to_string() + " does not match last dim " +
                              std::to_string(c));
    }
  }
  const auto check_table = [&](const TensorView* t, const int32_t* row, const std::string& what) -> Status {
    VORTEX_RETURN_IF_ERROR(detail::check_device_activation(*t, what.c_str()));
    if (t->rank() != 2 || t->shape[1] != c) {
      return invalid_argument(what + ": " + t->shape.to_string() + " must be [R, " + std::to_string(c) + "]");
    }
    if (row == nullptr && n > 0) return invalid_argument(what + ": null row-index pointer");
    return ok_status();
  };
  NormSource src{};
  src.x = detail::make_operand(x);
  src.weight = weight ? static_cast<const char*>(weight->data) : nullptr;
  src.weight_stride = weight ? weight->strides[0] : 0;
  src.weight_bf16 = weight && weight->dtype == DType::kBF16;
  src.eps = eps;
  src.c = static_cast<int>(c);
  if (fusion.gate && !fusion.branch) return invalid_argument(op + " gate: given without a residual branch");
  if (fusion.branch) {
    VORTEX_RETURN_IF_ERROR(detail::check_device_activation(*fusion.branch, (op + " branch").c_str()));
    if (fusion.branch->shape != x.shape) {
      return invalid_argument(op + " branch: " + fusion.branch->shape.to_string() + " does not match input " +
                              x.shape.to_string());
    }
    src.residual = kPlainResidual;
    src.branch = detail::make_operand(*fusion.branch);
    if (fusion.gate) {
      VORTEX_RETURN_IF_ERROR(check_table(fusion.gate, fusion.gate_row, op + " gate"));
      src.residual = kGatedResidual;
      src.gate = detail::make_operand(*fusion.gate);
      src.gate_row = fusion.gate_row;
      src.gate_rows = fusion.gate->shape[0];
    }
  }
  if (static_cast<bool>(fusion.shift) != static_cast<bool>(fusion.scale)) {
    return invalid_argument(op + " shift: modulation needs both shift and scale");
  }
  if (fusion.shift) {
    VORTEX_RETURN_IF_ERROR(check_table(fusion.shift, fusion.mod_row, op + " shift"));
    VORTEX_RETURN_IF_ERROR(check_table(fusion.scale, fusion.mod_row, op + " scale"));
    if (fusion.scale->shape != fusion.shift->shape) {
      return invalid_argument(op + " scale: " + fusion.scale->shape.to_string() + " must match shift " +
                              fusion.shift->shape.to_string());
    }
    src.modulate = true;
    src.shift = detail::make_operand(*fusion.shift);
    src.scale = detail::make_operand(*fusion.scale);
    src.mod_row = fusion.mod_row;
    src.mod_rows = fusion.shift->shape[0];
  }
  VORTEX_ASSIGN_OR_RETURN(const CodesOut out, codes_out(codes, scales, n, c, op));
  // rms_norm_fused's vector rule, with its (bf16, arena) output taken as aligned.
  const bool weight_vec = !weight || (weight->strides[0] == 1 && detail::vec_aligned(*weight));
  const bool fusion_vec = (!fusion.branch || detail::vec_aligned(*fusion.branch)) &&
                          (!fusion.gate || detail::vec_aligned(*fusion.gate)) &&
                          (!fusion.shift || (detail::vec_aligned(*fusion.shift) && detail::vec_aligned(*fusion.scale)));
  const bool vec = c % detail::kVec == 0 && detail::vec_aligned(x) && weight_vec && fusion_vec;
  const bool all_bf16 = x.dtype == DType::kBF16 && (!weight || weight->dtype == DType::kBF16) &&
                        (!fusion.branch || fusion.branch->dtype == DType::kBF16) &&
                        (!fusion.gate || fusion.gate->dtype == DType::kBF16) &&
                        (!fusion.shift || (fusion.shift->dtype == DType::kBF16 && fusion.scale->dtype == DType::kBF16));
  if (vec && all_bf16 && n > 0) {
    const NormRowLayout l = norm_row_layout(n, c / detail::kVec, detail::kVec);
    if (l.cached) {
      launch_bf16_norm(src, out, n, c / detail::kVec, l, stream);
      VORTEX_CUDA_CHECK_LAUNCH();
      return ok_status();
    }
  }
  return launch_fp8_rows(src, out, n, c, vec, stream);
}

Status swiglu_quantize_fp8(const TensorView& u, const TensorView& codes, const TensorView& scales,
                           cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check_matrix_input(u, "swiglu_quantize_fp8 input"));
  if (u.shape[1] % 2 != 0) {
    return invalid_argument("swiglu_quantize_fp8 input: must be [N, 2F], got " + u.shape.to_string());
  }
  const int64_t n = u.shape[0], f = u.shape[1] / 2;
  VORTEX_ASSIGN_OR_RETURN(const CodesOut out, codes_out(codes, scales, n, f, "swiglu_quantize_fp8"));
  const bool vec = f % detail::kVec == 0 && detail::vec_aligned(u);
  const SwigluSource src{detail::make_operand(u), f};
  const int64_t vecs = f / detail::kVec;
  if (vec && n > 0 && !norm_row_layout(n, vecs, detail::kVec).cached &&
      vecs <= int64_t{kSwigluMaxThreads} * kSwigluCachedVecs) {
    const int64_t threads = detail::ceil_div(detail::ceil_div(vecs, kSwigluCachedVecs), 32) * 32;
    const dim3 grid(static_cast<unsigned>(std::min(n, kNormMaxGrid))), block(static_cast<unsigned>(threads));
    if (u.dtype == DType::kBF16) {
      swiglu_quantize_cached_bf16_kernel<<<grid, block, 0, stream>>>(src, out, n, vecs);
    } else {
      swiglu_quantize_cached_kernel<<<grid, block, 0, stream>>>(src, out, n, vecs);
    }
    VORTEX_CUDA_CHECK_LAUNCH();
    return ok_status();
  }
  return launch_fp8_rows(src, out, n, f, vec, stream);
}

}  // namespace vortex::cuda
