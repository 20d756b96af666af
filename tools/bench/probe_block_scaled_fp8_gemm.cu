// Probe: cuBLASLt's fp8 GEMM with 128-wide block scales on this GPU, for the out projection's
// planned recipe (cpu/fp8_blocks.h, bench/notes/block.md): which scale-mode pairs have an
// algorithm, what they cost against the outer-vector scaling the fp8 recipe uses now, and in which
// memory layout cuBLASLt reads the block scales.
//
//   <build>/probe_block_scaled_fp8_gemm [M K N]   (built with the tests; default: the canonical
//                                                  out projection, 37810 x 7168 -> 7168)
//
// Shapes as gemm_fp8.cc hands them to the column-major library: A = the weight [K, N] (op T,
// m = N output channels), B = the activations [K, M] (n = M tokens), D = [N, M].
// 1. Timing, per scale-mode pair: random codes, unit scales; whether the heuristic found an
//    algorithm, the median of 20 runs, the largest difference from the outer-vector run.
// 2. Layout, for weight VEC128 × activation BLK128x128 on a small product (384 tokens, K 384,
//    256 channels) with a different power-of-two scale per block: the result under each candidate
//    layout of the two scale arrays against the product computed here in double. Logical scales
//    are sw[n][kb] (channel n, K block kb) and sa[mb][kb] (token block mb); the layout whose error
//    is at the level of the fp8 products' accumulation error (1.2e-3 of max |y| on the H200,
//    against 0.75-0.95 for a misread layout) is the one cuBLASLt reads. Found: weight
//    [K/128][N], activation [M/128][round_up(K/128, 4)] (cpu::Fp8BlockLayout).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"

namespace {

constexpr size_t kWorkspaceBytes = 64u << 20;

// Codes whose magnitude stays below 448 and that are never NaN (0x7F / 0xFF excluded).
std::vector<uint8_t> random_codes(size_t count, uint32_t seed) {
  std::vector<uint8_t> codes(count);
  for (auto& c : codes) {
    seed = seed * 1664525u + 1013904223u;
    c = static_cast<uint8_t>((seed >> 24) & 0x77);
  }
  return codes;
}

double e4m3_value(uint8_t code) {
  const int sign = code & 0x80 ? -1 : 1, exponent = (code >> 3) & 0xF, mantissa = code & 7;
  if (exponent == 0) return sign * std::ldexp(mantissa, -9);
  return sign * std::ldexp(8 + mantissa, exponent - 10);
}

// One fp8 GEMM D = op(A)·B with the given scale modes and scale pointers; returns the plan's
// heuristic result in `found`.
struct Gemm {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool found = false;

  Gemm(cublasLtHandle_t handle, int64_t m, int64_t k, int64_t n, int32_t mode_a, int32_t mode_b, const float* sa,
       const float* sb, cudaDataType_t out_type)
      : lt(handle) {
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
    const int8_t fast_accum = 0;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum));
    // A is the weight [K, N] (op T: m = N), B the activations [K, M] (n = M), D [N, M].
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&ld, out_type, n, m, n);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes,
                                         sizeof(kWorkspaceBytes));
    int count = 0;
    found = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &count) ==
                CUBLAS_STATUS_SUCCESS &&
            count > 0;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~Gemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
  }
  cublasStatus_t run(const uint8_t* w, const uint8_t* x, void* d, void* workspace, cudaStream_t stream) const {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, d, ld, d, ld, &heuristic.algo, workspace,
                          kWorkspaceBytes, stream);
  }
};

void time_modes(cublasLtHandle_t lt, int64_t m, int64_t k, int64_t n, void* workspace, cudaStream_t stream) {
  const std::vector<uint8_t> host_w = random_codes(static_cast<size_t>(k * n), 12345),
                             host_x = random_codes(static_cast<size_t>(k * m), 54321);
  uint8_t *w, *x;
  __nv_bfloat16 *d, *d_ref;
  float* scales;
  const size_t scale_count = static_cast<size_t>((k / 128 + 1) * (std::max(m, n) + 128));
  CHECK_CUDA(cudaMalloc(&w, host_w.size()));
  CHECK_CUDA(cudaMalloc(&x, host_x.size()));
  CHECK_CUDA(cudaMalloc(&d, sizeof(__nv_bfloat16) * m * n));
  CHECK_CUDA(cudaMalloc(&d_ref, sizeof(__nv_bfloat16) * m * n));
  CHECK_CUDA(cudaMalloc(&scales, sizeof(float) * scale_count));
  CHECK_CUDA(cudaMemcpy(w, host_w.data(), host_w.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(x, host_x.data(), host_x.size(), cudaMemcpyHostToDevice));
  const std::vector<float> ones(scale_count, 1.0f);
  CHECK_CUDA(cudaMemcpy(scales, ones.data(), sizeof(float) * scale_count, cudaMemcpyHostToDevice));
  struct Mode {
    const char* name;
    int32_t a, b;
  };
  const Mode modes[] = {
      {"outer-vec x outer-vec (the recipe now)", CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
       CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F},
      {"weight blk128x128 x activation vec128", CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
       CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F},
      {"weight vec128 x activation blk128x128", CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
       CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F},
      {"weight vec128 x activation vec128", CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
       CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F}};
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<__nv_bfloat16> ref(static_cast<size_t>(m * n)), got(static_cast<size_t>(m * n));
  for (int i = 0; i < 4; ++i) {
    const Gemm gemm(lt, m, k, n, modes[i].a, modes[i].b, scales, scales, CUDA_R_16BF);
    if (!gemm.found) {
      std::printf("%-42s no algorithm\n", modes[i].name);
      continue;
    }
    __nv_bfloat16* out = i == 0 ? d_ref : d;
    const cublasStatus_t status = gemm.run(w, x, out, workspace, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (status != CUBLAS_STATUS_SUCCESS) {
      std::printf("%-42s matmul failed (status %d)\n", modes[i].name, static_cast<int>(status));
      continue;
    }
    std::vector<float> ms;
    for (int rep = 0; rep < 20; ++rep) {
      cudaEventRecord(start, stream);
      gemm.run(w, x, out, workspace, stream);
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float t = 0;
      cudaEventElapsedTime(&t, start, stop);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    double max_diff = 0;
    if (i == 0) {
      CHECK_CUDA(cudaMemcpy(ref.data(), d_ref, sizeof(__nv_bfloat16) * m * n, cudaMemcpyDeviceToHost));
    } else {
      CHECK_CUDA(cudaMemcpy(got.data(), d, sizeof(__nv_bfloat16) * m * n, cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < got.size(); ++j) {
        const double r = __bfloat162float(ref[j]), g = __bfloat162float(got[j]);
        max_diff = std::max(max_diff, std::fabs(r - g) / std::max(1.0, std::fabs(r)));
      }
    }
    std::printf("%-42s median %.3f ms (min %.3f, %.0f TFLOP/s), max rel diff vs outer-vec %.2e\n", modes[i].name,
                ms[ms.size() / 2], ms[0], 2.0 * m * n * k / (ms[ms.size() / 2] * 1e-3) / 1e12, max_diff);
  }
  cudaFree(w);
  cudaFree(x);
  cudaFree(d);
  cudaFree(d_ref);
  cudaFree(scales);
}

void find_layout(cublasLtHandle_t lt, void* workspace, cudaStream_t stream) {
  const int64_t m = 384, k = 384, n = 256, kb = k / 128, mb = m / 128;
  const std::vector<uint8_t> host_w = random_codes(static_cast<size_t>(k * n), 777),
                             host_x = random_codes(static_cast<size_t>(k * m), 888);
  // Logical scales, a different power of two per block so that a misplaced one shows.
  std::vector<float> sw(static_cast<size_t>(n * kb)), sa(static_cast<size_t>(mb * kb));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t b = 0; b < kb; ++b) sw[j * kb + b] = std::ldexp(1.0f, static_cast<int>((j * 3 + b) % 5) - 2);
  }
  for (int64_t t = 0; t < mb; ++t) {
    for (int64_t b = 0; b < kb; ++b) sa[t * kb + b] = std::ldexp(1.0f, static_cast<int>((t * 2 + b * 5) % 7) - 3);
  }
  std::vector<double> want(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t b = 0; b < kb; ++b) {
        double partial = 0.0;
        for (int64_t i = b * 128; i < (b + 1) * 128; ++i) {
          partial += e4m3_value(host_x[r * k + i]) * e4m3_value(host_w[j * k + i]);
        }
        acc += partial * sw[j * kb + b] * sa[(r / 128) * kb + b];
      }
      want[r * n + j] = acc;
    }
  }
  uint8_t *w, *x;
  float *d, *dev_sw, *dev_sa;
  CHECK_CUDA(cudaMalloc(&w, host_w.size()));
  CHECK_CUDA(cudaMalloc(&x, host_x.size()));
  CHECK_CUDA(cudaMalloc(&d, sizeof(float) * m * n));
  CHECK_CUDA(cudaMalloc(&dev_sw, sizeof(float) * sw.size()));
  CHECK_CUDA(cudaMalloc(&dev_sa, sizeof(float) * static_cast<size_t>(mb * ((kb + 3) / 4 * 4))));
  CHECK_CUDA(cudaMemcpy(w, host_w.data(), host_w.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(x, host_x.data(), host_x.size(), cudaMemcpyHostToDevice));
  std::vector<float> got(static_cast<size_t>(m * n));
  // Activation candidates: K blocks fastest (row stride kb, or kb padded to a multiple of 4, the
  // padding 0), or token blocks fastest.
  const int64_t kb_pad4 = (kb + 3) / 4 * 4;
  const char* act_names[] = {"activation scales [M/128][K/128]", "activation scales [M/128][round_up(K/128, 4)]",
                             "activation scales [K/128][M/128]"};
  for (const bool weight_k_fastest : {true, false}) {
    for (int act_layout = 0; act_layout < 3; ++act_layout) {
      std::vector<float> lw(sw.size()), la(static_cast<size_t>(mb * kb_pad4), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t b = 0; b < kb; ++b) lw[weight_k_fastest ? j * kb + b : b * n + j] = sw[j * kb + b];
      }
      for (int64_t t = 0; t < mb; ++t) {
        for (int64_t b = 0; b < kb; ++b) {
          la[act_layout == 0 ? t * kb + b : act_layout == 1 ? t * kb_pad4 + b : b * mb + t] = sa[t * kb + b];
        }
      }
      CHECK_CUDA(cudaMemcpy(dev_sw, lw.data(), sizeof(float) * lw.size(), cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(dev_sa, la.data(), sizeof(float) * la.size(), cudaMemcpyHostToDevice));
      const Gemm gemm(lt, m, k, n, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                      dev_sw, dev_sa, CUDA_R_32F);
      const char* name_w = weight_k_fastest ? "weight scales [N][K/128]" : "weight scales [K/128][N]";
      const char* name_a = act_names[act_layout];
      if (!gemm.found) {
        std::printf("layout %s, %s: no algorithm (fp32 output)\n", name_w, name_a);
        continue;
      }
      const cublasStatus_t status = gemm.run(w, x, d, workspace, stream);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (status != CUBLAS_STATUS_SUCCESS) {
        std::printf("layout %s, %s: matmul failed (status %d)\n", name_w, name_a, static_cast<int>(status));
        continue;
      }
      CHECK_CUDA(cudaMemcpy(got.data(), d, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
      double max_err = 0.0, max_ref = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_err = std::max(max_err, std::fabs(got[i] - want[i]));
        max_ref = std::max(max_ref, std::fabs(want[i]));
      }
      std::printf("layout %s, %s: max |error| / max |y| = %.2e%s\n", name_w, name_a, max_err / max_ref,
                  max_err / max_ref < 1e-2 ? "  <- matches" : "");
    }
  }
  cudaFree(w);
  cudaFree(x);
  cudaFree(d);
  cudaFree(dev_sw);
  cudaFree(dev_sa);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t m = argc > 3 ? std::atoll(argv[1]) : 37810, k = argc > 3 ? std::atoll(argv[2]) : 7168,
                n = argc > 3 ? std::atoll(argv[3]) : 7168;
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasLtCreate failed\n");
    return 1;
  }
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, kWorkspaceBytes));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  time_modes(lt, m, k, n, workspace, stream);
  find_layout(lt, workspace, stream);
  cublasLtDestroy(lt);
  return 0;
}
