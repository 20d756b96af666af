#include "cpu/gemm.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "cpu/rows.h"

#if VORTEX_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace vortex::cpu {
namespace {

// ---- kLoops: register-tiled kernel --------------------------------------------------------------
//
// BLIS-style blocking: a kKc x kNc block of op(B) is packed into panels of kNr columns (k-major,
// so one k step reads kNr consecutive floats), and kMr rows of A at a time are multiplied against
// each panel with kMr x kNr accumulators held in registers (12 of the 16 AVX2 registers, 2 more
// for the B row, 1 for the broadcast A value). Panels are the outer loop, so one panel (16 KiB)
// stays in L1 while every row group of A streams past it; the packed block (512 KiB) fits L2.
// kKc = 256 measured faster than 128 or 512 on this machine (AVX2 path, ~55 GFLOP/s a core).
constexpr int kMr = 6;
constexpr int kNr = 16;
constexpr int64_t kKc = 256;
constexpr int64_t kNc = 512;

// Eight floats; GCC and Clang compile arithmetic on it to one AVX instruction. The library is built
// with -ffp-contract=off, so `acc += x * b` rounds the product and then the sum (no FMA): the bits
// of every kLoops element are that chain's, which the device LoRA merge (cuda/lora_merge.h) repeats.
using V8 = float __attribute__((vector_size(32)));

inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store8(float* p, V8 v) { std::memcpy(p, &v, sizeof(v)); }

// Packs op(B)[pc : pc+kc, jc : jc+nc] into panels of kNr columns, zero-padding the last panel.
void pack_b(bool b_transposed, const float* b, int64_t ldb, int64_t pc, int64_t kc, int64_t jc,
            int64_t nc, float* packed) {
  for (int64_t p0 = 0; p0 < nc; p0 += kNr) {
    float* panel = packed + p0 * kc;
    const int64_t cols = std::min<int64_t>(kNr, nc - p0);
    if (cols < kNr) std::fill(panel, panel + kc * kNr, 0.0f);
    // Read B along its rows in both layouts.
    if (b_transposed) {
      for (int64_t j = 0; j < cols; ++j) {
        const float* src = b + (jc + p0 + j) * ldb + pc;  // B[col, pc:]
        for (int64_t kk = 0; kk < kc; ++kk) panel[kk * kNr + j] = src[kk];
      }
    } else {
      for (int64_t kk = 0; kk < kc; ++kk) {
        const float* src = b + (pc + kk) * ldb + jc + p0;  // B[pc + kk, cols of this panel]
        std::copy(src, src + cols, panel + kk * kNr);
      }
    }
  }
}

// C[0:R, 0:cols] (+)= A[0:R, 0:kc] · panel. `first` starts from zero instead of C (the first k
// block); `alpha` is applied after the last k block. Accumulating each C element in one chain
// over k keeps the sum order independent of the tiling.
template <int R>
void micro_kernel(int64_t kc, const float* a, int64_t lda, const float* panel, float* c,
                  int64_t ldc, int64_t cols, bool first, bool last, float alpha) {
  V8 acc[R][2];
  for (int r = 0; r < R; ++r) {
    if (first) {
      acc[r][0] = V8{};
      acc[r][1] = V8{};
    } else if (cols == kNr) {
      acc[r][0] = load8(c + r * ldc);
      acc[r][1] = load8(c + r * ldc + 8);
    } else {
      float tmp[kNr] = {};
      std::copy(c + r * ldc, c + r * ldc + cols, tmp);
      acc[r][0] = load8(tmp);
      acc[r][1] = load8(tmp + 8);
    }
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const V8 b0 = load8(panel + kk * kNr);
    const V8 b1 = load8(panel + kk * kNr + 8);
    for (int r = 0; r < R; ++r) {
      const float x = a[r * lda + kk];
      acc[r][0] += x * b0;
      acc[r][1] += x * b1;
    }
  }
  for (int r = 0; r < R; ++r) {
    if (last) {
      acc[r][0] *= alpha;
      acc[r][1] *= alpha;
    }
    if (cols == kNr) {
      store8(c + r * ldc, acc[r][0]);
      store8(c + r * ldc + 8, acc[r][1]);
    } else {
      float tmp[kNr];
      store8(tmp, acc[r][0]);
      store8(tmp + 8, acc[r][1]);
      std::copy(tmp, tmp + cols, c + r * ldc);
    }
  }
}

using MicroKernel = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t,
                             bool, bool, float);
constexpr MicroKernel kMicroKernels[kMr + 1] = {nullptr,         micro_kernel<1>, micro_kernel<2>,
                                                micro_kernel<3>, micro_kernel<4>, micro_kernel<5>,
                                                micro_kernel<6>};

void matmul_loops(bool b_transposed, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  // One buffer per thread, reused across calls: attention calls this once per query block.
  thread_local std::vector<float> packed;
  packed.resize(static_cast<size_t>(kKc * ((kNc + kNr - 1) / kNr * kNr)));
  for (int64_t jc = 0; jc < n; jc += kNc) {
    const int64_t nc = std::min(kNc, n - jc);
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc);
      pack_b(b_transposed, b, ldb, pc, kc, jc, nc, packed.data());
      const bool first = pc == 0;
      const bool last = pc + kc == k;
      for (int64_t p0 = 0; p0 < nc; p0 += kNr) {
        for (int64_t i0 = 0; i0 < m; i0 += kMr) {
          const int rows = static_cast<int>(std::min<int64_t>(kMr, m - i0));
          kMicroKernels[rows](kc, a + i0 * lda + pc, lda, packed.data() + p0 * kc,
                              c + i0 * ldc + jc + p0, ldc, std::min<int64_t>(kNr, nc - p0), first,
                              last, alpha);
        }
      }
    }
  }
}

// ---- kBlas --------------------------------------------------------------------------------------

#if VORTEX_HAVE_OPENBLAS
void pin_openblas_to_one_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// OpenBLAS picks its kernels from the CPU model at load time; a model it does not know (this
// 0.3.21 calls an Emerald Rapids "Prescott") gets generic SSE3 kernels that kLoops outruns.
bool openblas_has_avx2_kernels() {
  std::string core = openblas_get_corename();
  for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* name : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"}) {
    if (core == name) return true;
  }
  return false;
}
#endif

// ---- linear -------------------------------------------------------------------------------------

std::string describe(const TensorView& t) {
  return std::string(dtype_name(t.dtype)) + t.shape.to_string();
}

bool is_f32_or_bf16(DType d) { return d == DType::kF32 || d == DType::kBF16; }

Status check_matrix(const char* op, const char* name, const TensorView& t, int rank) {
  if (t.device != Device::kCpu) {
    return invalid_argument(std::string(op) + ": " + name + " " + describe(t) +
                            " is not on the CPU");
  }
  if (!is_f32_or_bf16(t.dtype)) {
    return invalid_argument(std::string(op) + ": " + name + " " + describe(t) +
                            " must be F32 or BF16");
  }
  if (t.rank() != rank) {
    return invalid_argument(std::string(op) + ": " + name + " " + describe(t) + " must have rank " +
                            std::to_string(rank));
  }
  if (t.shape[rank - 1] > 1 && t.strides[rank - 1] != 1) {
    return invalid_argument(std::string(op) + ": " + name + " " + describe(t) +
                            " needs unit stride in its last dim, has " +
                            std::to_string(t.strides[rank - 1]));
  }
  return ok_status();
}

// The geometry of one linear call: tiles are (row block, column block) pairs, numbered
// column-block-major so that a thread's contiguous range of tiles mostly shares one column block
// and widens its BF16 weight rows once.
struct LinearPlan {
  int64_t n, in, out;
  int64_t tile_rows, tile_cols;
  int64_t row_blocks, col_blocks;
};

// Rows per tile: each tile packs its B block once, so more rows amortise the packing; beyond a few
// hundred rows A no longer stays in L2. 256 measured at or near the best for both variants.
constexpr int64_t kTileRows = 256;
// A BF16 weight is widened one column block at a time; this bounds that scratch (4 MiB).
constexpr int64_t kWeightBlockFloats = int64_t{1} << 20;
// Tiles a call of few rows is cut into at least (a machine of more threads leaves some idle on
// those small calls).
constexpr int64_t kFewRowsTiles = 64;

}  // namespace

int64_t few_rows_tile_columns(int64_t row_blocks, int64_t out) {
  if (row_blocks >= kFewRowsTiles) return out;
  const int64_t per_row_block = (kFewRowsTiles + row_blocks - 1) / std::max<int64_t>(row_blocks, 1);
  return (out + per_row_block - 1) / per_row_block;
}

namespace {

LinearPlan plan_linear(int64_t n, int64_t in, int64_t out, bool widen_weight) {
  LinearPlan p{n, in, out, std::min(n, kTileRows), out, 0, 0};
  p.row_blocks = (n + p.tile_rows - 1) / p.tile_rows;
  if (widen_weight) {
    p.tile_cols = std::max<int64_t>(kNr, kWeightBlockFloats / std::max<int64_t>(in, 1));
  }
  // Few rows (time embedding, modulation): the columns split so the threads share the call.
  p.tile_cols = std::min(p.tile_cols, few_rows_tile_columns(p.row_blocks, out));
  p.tile_cols = std::max<int64_t>(1, std::min(p.tile_cols, out));
  if (p.tile_cols < out) p.tile_cols = (p.tile_cols + kNr - 1) / kNr * kNr;  // whole panels
  p.col_blocks = (out + p.tile_cols - 1) / p.tile_cols;
  return p;
}

// Runs the tiles [t0, t1) of a linear call; scratch lives for the whole range.
void run_linear_tiles(const LinearPlan& p, const TensorView& x, const TensorView& w,
                      const std::vector<float>& bias, const TensorView& y, GemmVariant variant,
                      int64_t t0, int64_t t1) {
  std::vector<float> x_block, w_block, y_block;
  int64_t widened_col_block = -1;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t cb = t / p.row_blocks;
    const int64_t rb = t % p.row_blocks;
    const int64_t r0 = rb * p.tile_rows, rows = std::min(p.tile_rows, p.n - r0);
    const int64_t c0 = cb * p.tile_cols, cols = std::min(p.tile_cols, p.out - c0);

    // B = w[c0 : c0+cols, :], fp32. cblas wants every leading dimension >= its row length.
    const float* b = static_cast<const float*>(w.data) + c0 * p.in;
    if (w.dtype == DType::kBF16) {
      if (widened_col_block != cb) {
        w_block.resize(static_cast<size_t>(cols * p.in));
        load_row(row_ptr(w, c0), w.dtype, cols * p.in, w_block.data());
        widened_col_block = cb;
      }
      b = w_block.data();
    }
    const int64_t ldb = std::max<int64_t>(p.in, 1);

    const float* a = reinterpret_cast<const float*>(row_ptr(x, r0));
    int64_t lda = x.strides[0];
    if (x.dtype != DType::kF32 || lda < p.in) {
      x_block.resize(static_cast<size_t>(rows * p.in));
      for (int64_t r = 0; r < rows; ++r) {
        load_row(row_ptr(x, r0 + r), x.dtype, p.in, x_block.data() + r * p.in);
      }
      a = x_block.data();
      lda = p.in;
    }
    lda = std::max<int64_t>(lda, 1);

    // An F32 y takes the product in place; a BF16 y goes through fp32 scratch, rounded once.
    const bool direct = y.dtype == DType::kF32 && (rows == 1 || y.strides[0] >= cols);
    float* c;
    int64_t ldc;
    if (direct) {
      c = reinterpret_cast<float*>(row_ptr(y, r0)) + c0;
      ldc = std::max<int64_t>(y.strides[0], cols);
    } else {
      y_block.resize(static_cast<size_t>(rows * cols));
      c = y_block.data();
      ldc = cols;
    }
    matmul_f32(variant, true, rows, cols, p.in, 1.0f, a, lda, b, ldb, c, ldc);

    for (int64_t r = 0; r < rows; ++r) {
      float* acc = c + r * ldc;
      if (!bias.empty()) {
        for (int64_t j = 0; j < cols; ++j) acc[j] += bias[c0 + j];
      }
      if (!direct) store_row(acc, cols, row_ptr(y, r0 + r, c0), y.dtype);
    }
  }
}

}  // namespace

const char* gemm_variant_name(GemmVariant variant) {
  return variant == GemmVariant::kBlas ? "blas" : "loops";
}

bool gemm_variant_available(GemmVariant variant) {
#if VORTEX_HAVE_OPENBLAS
  return true;
#else
  return variant == GemmVariant::kLoops;
#endif
}

GemmVariant default_gemm_variant() {
  static const GemmVariant chosen = [] {
    if (const char* env = std::getenv("VORTEX_VARIANT_CPU_GEMM")) {
      const std::string name = env;
      if (name == "loops") return GemmVariant::kLoops;
      if (name == "blas" && gemm_variant_available(GemmVariant::kBlas)) return GemmVariant::kBlas;
    }
#if VORTEX_HAVE_OPENBLAS
    if (openblas_has_avx2_kernels()) return GemmVariant::kBlas;
#endif
    return GemmVariant::kLoops;
  }();
  return chosen;
}

void matmul_f32(GemmVariant variant, bool b_transposed, int64_t m, int64_t n, int64_t k,
                float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
#if VORTEX_HAVE_OPENBLAS
  if (variant == GemmVariant::kBlas) {
    pin_openblas_to_one_thread();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                static_cast<blasint>(lda), b, static_cast<blasint>(ldb), 0.0f, c,
                static_cast<blasint>(ldc));
    return;
  }
#endif
  matmul_loops(b_transposed, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

Result<PackedWeight> PackedWeight::pack(const Tensor& w) {
  if (w.device() != Device::kCpu || w.rank() != 2 || !is_f32_or_bf16(w.dtype())) {
    return invalid_argument("PackedWeight: w " + w.describe() +
                            " must be a 2-D F32 or BF16 CPU tensor");
  }
  if (w.dtype() == DType::kF32) return PackedWeight(w.contiguous());
  const Tensor src = w.contiguous();
  Tensor packed = Tensor::empty(w.shape(), DType::kF32);
  const int64_t cols = w.size(1);
  parallel_for(0, w.size(0), [&](int64_t r0, int64_t r1) {
    load_row(row_ptr(src.view(), r0), DType::kBF16, (r1 - r0) * cols,
             packed.data_as<float>() + r0 * cols);
  });
  return PackedWeight(std::move(packed));
}

Status linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
              GemmVariant variant) {
  VORTEX_RETURN_IF_ERROR(check_matrix("linear", "x", x, 2));
  VORTEX_RETURN_IF_ERROR(check_matrix("linear", "w", w, 2));
  VORTEX_RETURN_IF_ERROR(check_matrix("linear", "y", y, 2));
  const int64_t n = x.shape[0], in = x.shape[1], out = w.shape[0];
  if (!w.is_contiguous()) {
    return invalid_argument("linear: w " + describe(w) + " must be contiguous (row-major [O, I])");
  }
  if (w.shape[1] != in) {
    return invalid_argument("linear: x " + describe(x) + " and w " + describe(w) +
                            " differ in input features (x[N, I] · w[O, I]ᵀ)");
  }
  if (y.shape[0] != n || y.shape[1] != out) {
    return invalid_argument("linear: y " + describe(y) + " must be [" + std::to_string(n) + ", " +
                            std::to_string(out) + "] for x " + describe(x) + " and w " +
                            describe(w));
  }
  std::vector<float> bias_f32;
  if (bias != nullptr) {
    VORTEX_RETURN_IF_ERROR(check_matrix("linear", "bias", *bias, 1));
    if (bias->shape[0] != out) {
      return invalid_argument("linear: bias " + describe(*bias) + " must be [" +
                              std::to_string(out) + "] for w " + describe(w));
    }
    bias_f32.resize(static_cast<size_t>(out));
    load_row(static_cast<const char*>(bias->data), bias->dtype, out, bias_f32.data());
  }
  if (!gemm_variant_available(variant)) {
    return unimplemented(std::string("linear: GEMM variant '") + gemm_variant_name(variant) +
                         "' is not in this build");
  }
  if (n == 0 || out == 0) return ok_status();

  const LinearPlan plan = plan_linear(n, in, out, w.dtype == DType::kBF16);
  parallel_for(0, plan.row_blocks * plan.col_blocks, [&](int64_t t0, int64_t t1) {
    run_linear_tiles(plan, x, w, bias_f32, y, variant, t0, t1);
  });
  return ok_status();
}

Status linear(const TensorView& x, const PackedWeight& w, const TensorView* bias,
              const TensorView& y, GemmVariant variant) {
  if (!w.weight().defined()) return invalid_argument("linear: w is an empty PackedWeight");
  return linear(x, w.weight().view(), bias, y, variant);
}

}  // namespace vortex::cpu
