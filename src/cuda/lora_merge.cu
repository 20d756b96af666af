// LoRA merge on the device (see lora_merge.h for the arithmetic it reproduces).
//
// Three kernels. `merge_kernel` gives each thread one column of kRowsPerThread rows and walks the
// terms in order, each term's chain over the rank in order, with the rows' up factors staged in
// shared memory kRankChunk at a time, rank-major so that one rank step's 16 factors are four
// 16-byte broadcast reads for every thread of the CTA, and down read coalesced along the columns.
// A DoRA term's row factors must exist before any element of its row is scaled, and its norm is a
// sequential double chain over the row, so they come first, a band of rows at a time:
// `dora_sum_kernel` computes the term's deltas as merge_kernel does and writes each W + delta in
// double into scratch column-major (a thread's 16 rows are 128 contiguous bytes), so that
// `row_norm_kernel` stages a CTA's 32 rows of 32 columns at a time (each column's rows one coalesced
// 256-byte piece) and chains each row in column order, a lane a row. (Read row-major, one thread per
// row, every load of the chain was its own sector: ~40 ms of a block's switch.) Explicit __fmul_rn /
// __fadd_rn / __fma_rn keep nvcc from contracting anything the host rounds twice.
#include "cuda/lora_merge.h"

#include <cuda_pipeline.h>

#include <algorithm>

#include "core/dtype.h"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 128;       // columns per CTA of the merge and delta kernels
constexpr int kRowsPerThread = 16;  // rows per CTA (and per thread) of the merge and delta kernels
constexpr int kRankChunk = 32;      // up factors staged per pass
constexpr int64_t kScratchValues = int64_t(1) << 24;  // a DoRA band's sums, doubles: 128 MB at most

enum class Elem { kF32, kBF16, kF16 };

template <Elem kElem>
__device__ __forceinline__ float load_element(const void* data, int64_t i) {
  if constexpr (kElem == Elem::kF32) return static_cast<const float*>(data)[i];
  if constexpr (kElem == Elem::kBF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(data)[i]);
  if constexpr (kElem == Elem::kF16) return f16_bits_to_f32(static_cast<const uint16_t*>(data)[i]);
}

template <Elem kElem>
__device__ __forceinline__ void store_element(void* data, int64_t i, float v) {
  if constexpr (kElem == Elem::kF32) static_cast<float*>(data)[i] = v;
  if constexpr (kElem == Elem::kBF16) static_cast<uint16_t*>(data)[i] = f32_to_bf16_bits(v);
}

struct DeviceTerm {
  const float* up;
  const float* down;
  const float* row_factor;  // DoRA's f per row; null for a plain term
  int64_t rank;
  float scale;
};

// The terms travel as a kernel parameter (2.6 KB, under the 4 KB every launch takes), so a merge
// needs no table copied from the host and nothing to wait for before returning.
struct TermList {
  DeviceTerm term[kMaxLoraMergeTerms];
  int count;
};

// round(scale · chain) for rows [r0, r0 + rows_here) of column c into delta[] (rows past
// rows_here get 0 factors and are not used). Every thread of the CTA must call it (it stages the up
// factors); `live` says whether this thread's column exists.
__device__ __forceinline__ void term_deltas(const DeviceTerm& term, int64_t r0, int rows_here, int64_t cols,
                                            int64_t c, bool live, float4 (&up_tile)[kRankChunk][kRowsPerThread / 4],
                                            float (&delta)[kRowsPerThread]) {
  float chain[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) chain[i] = 0.0f;
  for (int64_t k0 = 0; k0 < term.rank; k0 += kRankChunk) {
    const int chunk = static_cast<int>(term.rank - k0 < kRankChunk ? term.rank - k0 : kRankChunk);
    __syncthreads();  // the previous chunk's readers are done
    float* tile = reinterpret_cast<float*>(up_tile);
    for (int idx = threadIdx.x; idx < kRowsPerThread * kRankChunk; idx += blockDim.x) {
      const int i = idx / kRankChunk, k = idx % kRankChunk;  // consecutive threads read along a row of up
      tile[k * kRowsPerThread + i] = i < rows_here && k < chunk ? term.up[(r0 + i) * term.rank + k0 + k] : 0.0f;
    }
    __syncthreads();
    if (live) {
      for (int k = 0; k < chunk; ++k) {
        const float d = term.down[(k0 + k) * cols + c];
#pragma unroll
        for (int q = 0; q < kRowsPerThread / 4; ++q) {
          const float4 u = up_tile[k][q];
          chain[4 * q + 0] = __fadd_rn(chain[4 * q + 0], __fmul_rn(u.x, d));
          chain[4 * q + 1] = __fadd_rn(chain[4 * q + 1], __fmul_rn(u.y, d));
          chain[4 * q + 2] = __fadd_rn(chain[4 * q + 2], __fmul_rn(u.z, d));
          chain[4 * q + 3] = __fadd_rn(chain[4 * q + 3], __fmul_rn(u.w, d));
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) delta[i] = __fmul_rn(chain[i], term.scale);
}

// This thread's column and the CTA's rows of a [rows, cols] grid of kThreads x kRowsPerThread tiles.
struct ColumnTile {
  int64_t c, r0;
  int rows_here;
  bool live;  // whether the column exists
};
__device__ __forceinline__ ColumnTile column_tile(int64_t rows, int64_t cols) {
  ColumnTile t;
  t.c = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  t.r0 = blockIdx.y * int64_t(kRowsPerThread);
  t.rows_here = static_cast<int>(rows - t.r0 < kRowsPerThread ? rows - t.r0 : kRowsPerThread);
  t.live = t.c < cols;
  return t;
}

template <Elem kIn, Elem kOut>
__global__ void __launch_bounds__(kThreads) merge_kernel(const void* weight, void* out, int64_t rows, int64_t cols,
                                                         const __grid_constant__ TermList terms) {
  __shared__ float4 up_tile[kRankChunk][kRowsPerThread / 4];
  const auto [c, r0, rows_here, live] = column_tile(rows, cols);
  float acc[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) acc[i] = live && i < rows_here ? load_element<kIn>(weight, (r0 + i) * cols + c) : 0.0f;
  for (int t = 0; t < terms.count; ++t) {
    const DeviceTerm& term = terms.term[t];
    float delta[kRowsPerThread];
    term_deltas(term, r0, rows_here, cols, c, live, up_tile, delta);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const float sum = __fadd_rn(acc[i], delta[i]);
      acc[i] = term.row_factor == nullptr ? sum : __fmul_rn(i < rows_here ? term.row_factor[r0 + i] : 0.0f, sum);
    }
  }
  if (!live) return;
  for (int i = 0; i < rows_here; ++i) store_element<kOut>(out, (r0 + i) * cols + c, acc[i]);
}

// For rows [band0, band0 + band_rows) of one term: sums[c · stride + local] = double(W[r,c]) +
// double(delta[r,c]), local = r − band0. `stride` is a multiple of kRowsPerThread (and of kNormRows),
// so a thread's rows are 16 aligned doubles.
template <Elem kIn>
__global__ void __launch_bounds__(kThreads) dora_sum_kernel(const void* weight, DeviceTerm term, int64_t band0,
                                                            int64_t band_rows, int64_t stride, int64_t cols,
                                                            double* sums) {
  __shared__ float4 up_tile[kRankChunk][kRowsPerThread / 4];
  const auto [c, local0, rows_here, live] = column_tile(band_rows, cols);
  float delta[kRowsPerThread];
  term_deltas(term, band0 + local0, rows_here, cols, c, live, up_tile, delta);
  if (!live) return;
  double v[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const float w = i < rows_here ? load_element<kIn>(weight, (band0 + local0 + i) * cols + c) : 0.0f;
    v[i] = __dadd_rn(static_cast<double>(w), static_cast<double>(delta[i]));
  }
  double* column = sums + c * stride + local0;
  if (rows_here == kRowsPerThread) {
    auto* pairs = reinterpret_cast<double2*>(column);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; i += 2) pairs[i / 2] = make_double2(v[i], v[i + 1]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    if (i < rows_here) column[i] = v[i];
  }
}

// f[r] = m[r] / sqrt(Σ_c sums[c, r]²), one double FMA chain in column order per row of the band; a
// row whose sum is 0 lowers *zero_row to its index instead (and gets a NaN factor). A CTA owns
// kNormRows rows: all its threads stage tiles of their sums into shared memory kNormStages - 1
// tiles ahead (cp.async), and its first warp runs the chains, a lane a row. A band has only a few
// thousand rows, so each chain's loads must be far ahead of it: with 16 loads ahead and no staging,
// one thread a row, a band took ~350 µs for 5,376 columns (ncu), every step waiting on memory.
constexpr int kNormRows = 32;
constexpr int kNormCols = 32;  // columns per staged tile: 8 KB
constexpr int kNormStages = 4;
constexpr int kNormThreads = 128;

__global__ void __launch_bounds__(kNormThreads)
    row_norm_kernel(const double* sums, const float* magnitude, int64_t band0, int64_t band_rows, int64_t stride,
                    int64_t cols, float* row_factor, unsigned long long* zero_row) {
  __shared__ __align__(16) double tile[kNormStages][kNormCols][kNormRows];
  const int64_t local0 = blockIdx.x * int64_t(kNormRows);
  const int64_t tiles = (cols + kNormCols - 1) / kNormCols;
  // Tile t's columns into its stage, 16 bytes (two rows) a copy; one commit group per tile, empty
  // past the last, so that every wait counts the same groups.
  const auto stage_tile = [&](int64_t t) {
    if (t < tiles) {
      double(*stage)[kNormRows] = tile[t % kNormStages];
      for (int q = threadIdx.x; q < kNormCols * kNormRows / 2; q += kNormThreads) {
        const int col = q / (kNormRows / 2), row = 2 * (q % (kNormRows / 2));
        const int64_t c = t * kNormCols + col;
        if (c < cols) __pipeline_memcpy_async(&stage[col][row], sums + c * stride + local0 + row, 16);
      }
    }
    __pipeline_commit();
  };
  for (int t = 0; t < kNormStages - 1; ++t) stage_tile(t);
  const int lane = threadIdx.x;
  double sum = 0.0;
  for (int64_t t = 0; t < tiles; ++t) {
    __pipeline_wait_prior(kNormStages - 2);  // this thread's copies of tile t have landed
    __syncthreads();  // everyone's have, and the stage refilled next was chained in the last round
    stage_tile(t + kNormStages - 1);
    if (lane < kNormRows) {
      const double(*stage)[kNormRows] = tile[t % kNormStages];
      const int64_t here = cols - t * kNormCols;
      if (here >= kNormCols) {
#pragma unroll
        for (int j = 0; j < kNormCols; ++j) sum = __fma_rn(stage[j][lane], stage[j][lane], sum);
      } else {
        for (int j = 0; j < here; ++j) sum = __fma_rn(stage[j][lane], stage[j][lane], sum);
      }
    }
  }
  const int64_t local = local0 + lane;
  if (lane >= kNormRows || local >= band_rows) return;
  const int64_t r = band0 + local;
  if (sum == 0.0) {
    atomicMin(zero_row, static_cast<unsigned long long>(r));
    row_factor[r] = __int_as_float(0x7fc00000);  // NaN: the row cannot be scaled, and says so
    return;
  }
  row_factor[r] = __double2float_rn(__ddiv_rn(static_cast<double>(magnitude[r]), __dsqrt_rn(sum)));
}

template <Elem kIn>
void launch_dora_factors(const void* weight, const DeviceTerm& term, const float* magnitude, int64_t rows,
                         int64_t cols, double* sums, int64_t band, int64_t stride, float* row_factor,
                         unsigned long long* zero_row, cudaStream_t stream) {
  for (int64_t band0 = 0; band0 < rows; band0 += band) {
    const int64_t band_rows = std::min(band, rows - band0);
    const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                    static_cast<unsigned>((band_rows + kRowsPerThread - 1) / kRowsPerThread));
    dora_sum_kernel<kIn><<<grid, kThreads, 0, stream>>>(weight, term, band0, band_rows, stride, cols, sums);
    row_norm_kernel<<<static_cast<unsigned>((band_rows + kNormRows - 1) / kNormRows), kNormThreads, 0, stream>>>(
        sums, magnitude, band0, band_rows, stride, cols, row_factor, zero_row);
  }
}

template <Elem kIn>
void launch_merge(const void* weight, const Tensor& out, int64_t rows, int64_t cols, const TermList& terms,
                  cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>((rows + kRowsPerThread - 1) / kRowsPerThread));
  if (out.dtype() == DType::kBF16) {
    merge_kernel<kIn, Elem::kBF16><<<grid, kThreads, 0, stream>>>(weight, out.data(), rows, cols, terms);
  } else {
    merge_kernel<kIn, Elem::kF32><<<grid, kThreads, 0, stream>>>(weight, out.data(), rows, cols, terms);
  }
}

Status check_arguments(const Tensor& weight, const Tensor& out, const std::vector<LoraMergeTerm>& terms) {
  const auto device_matrix = [](const Tensor& t) {
    return t.device() == Device::kCuda && t.is_contiguous() && t.rank() == 2;
  };
  if (!device_matrix(weight) ||
      (weight.dtype() != DType::kF32 && weight.dtype() != DType::kBF16 && weight.dtype() != DType::kF16)) {
    return invalid_argument("lora_merge: weight " + weight.describe() + " must be a contiguous 2-D F32, BF16 or F16 device tensor");
  }
  if (!device_matrix(out) || out.shape() != weight.shape() || (out.dtype() != DType::kF32 && out.dtype() != DType::kBF16)) {
    return invalid_argument("lora_merge: out " + out.describe() + " must be a contiguous F32 or BF16 device tensor of weight's shape " +
                            weight.shape().to_string());
  }
  if (out.data() == weight.data() && out.dtype() != weight.dtype()) {
    return invalid_argument("lora_merge: out is weight's memory with another dtype");
  }
  if (terms.size() > static_cast<size_t>(kMaxLoraMergeTerms)) {
    return invalid_argument("lora_merge: " + std::to_string(terms.size()) + " terms, more than the " +
                            std::to_string(kMaxLoraMergeTerms) + " one merge takes");
  }
  for (size_t t = 0; t < terms.size(); ++t) {
    if (terms[t].rank < 1 || terms[t].up == nullptr || terms[t].down == nullptr) {
      return invalid_argument("lora_merge: term " + std::to_string(t) + " has no factors");
    }
  }
  return ok_status();
}

// A DoRA band's rows: whole 16-row groups, as many as kScratchValues sums hold; its sums' column
// stride covers whole row_norm_kernel CTAs (which read kNormRows rows a column).
struct DoraBands {
  int64_t rows;
  int64_t stride;
};

DoraBands dora_bands(int64_t rows, int64_t cols) {
  const int64_t band =
      std::min(rows, std::max<int64_t>(kRowsPerThread, kScratchValues / cols / kRowsPerThread * kRowsPerThread));
  return {band, (band + kNormRows - 1) / kNormRows * kNormRows};
}

}  // namespace

size_t dora_workspace_bytes(int64_t rows, int64_t cols, const std::vector<LoraMergeTerm>& terms) {
  const auto dora_terms =
      std::count_if(terms.begin(), terms.end(), [](const LoraMergeTerm& t) { return t.magnitude != nullptr; });
  if (dora_terms == 0 || rows == 0 || cols == 0) return 0;
  const DoraBands bands = dora_bands(rows, cols);
  return static_cast<size_t>(dora_terms) * DeviceArena::bytes_for(Shape{rows}, DType::kF32) +
         DeviceArena::bytes_for(Shape{cols, bands.stride}, DType::kF64);
}

Status lora_merge(const Tensor& weight, const Tensor& out, const std::vector<LoraMergeTerm>& terms,
                  const Tensor& dora_workspace, unsigned long long* zero_rows, cudaStream_t stream) {
  VORTEX_RETURN_IF_ERROR(check_arguments(weight, out, terms));
  const int64_t rows = weight.size(0), cols = weight.size(1);
  if (rows == 0 || cols == 0) return ok_status();
  const DoraBands bands = dora_bands(rows, cols);
  const size_t need = dora_workspace_bytes(rows, cols, terms);
  DeviceArena arena;  // in the workspace: the DoRA terms' row factors and one band's sums
  Tensor sums;
  if (need > 0) {
    if (zero_rows == nullptr || !dora_workspace.defined() || dora_workspace.device() != Device::kCuda ||
        dora_workspace.nbytes() < need) {
      return invalid_argument("lora_merge: DoRA terms on " + weight.shape().to_string() +
                              " need a device workspace of " + std::to_string(need) +
                              " bytes and zero-row slots, got " +
                              (dora_workspace.defined() ? dora_workspace.describe() : std::string("none")));
    }
    VORTEX_ASSIGN_OR_RETURN(arena, DeviceArena::within(dora_workspace));
    VORTEX_ASSIGN_OR_RETURN(sums, arena.alloc(Shape{cols, bands.stride}, DType::kF64));
    VORTEX_CUDA_CHECK(cudaMemsetAsync(zero_rows, 0xFF, terms.size() * sizeof(*zero_rows), stream));  // no row yet
  }
  TermList list{};
  list.count = static_cast<int>(terms.size());
  for (size_t t = 0; t < terms.size(); ++t) {
    const LoraMergeTerm& term = terms[t];
    DeviceTerm d{term.up, term.down, nullptr, term.rank, term.scale};
    if (term.magnitude != nullptr) {
      VORTEX_ASSIGN_OR_RETURN(Tensor factors, arena.alloc(Shape{rows}, DType::kF32));
      d.row_factor = factors.data_as<float>();
      const auto launch = weight.dtype() == DType::kF32    ? launch_dora_factors<Elem::kF32>
                          : weight.dtype() == DType::kBF16 ? launch_dora_factors<Elem::kBF16>
                                                           : launch_dora_factors<Elem::kF16>;
      launch(weight.data(), d, term.magnitude, rows, cols, sums.data_as<double>(), bands.rows, bands.stride,
             factors.data_as<float>(), zero_rows + t, stream);
      VORTEX_CUDA_CHECK_LAUNCH();
    }
    list.term[t] = d;
  }
  if (weight.dtype() == DType::kF32) {
    launch_merge<Elem::kF32>(weight.data(), out, rows, cols, list, stream);
  } else if (weight.dtype() == DType::kBF16) {
    launch_merge<Elem::kBF16>(weight.data(), out, rows, cols, list, stream);
  } else {
    launch_merge<Elem::kF16>(weight.data(), out, rows, cols, list, stream);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
