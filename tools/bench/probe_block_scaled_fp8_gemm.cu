// Probe: does cuBLASLt on this GPU run the out-projection's fp8 GEMM with 128-wide block scales
// (one scale per token and 128 input channels, i.e. per (token, head) of the attention output),
// and at what cost against the per-token / per-channel scaling the fp8 recipe uses now? The
// answer decides whether the attention kernels can write e4m3 codes with per-(token, head) scales
// in their epilogue (issue #5, bench/notes/block.md). Timing only: codes are random, scales 1.
//
//   <build>/probe_block_scaled_fp8_gemm [M K N]   (built with the tests; default: the canonical
//                                                  out projection, 37810 x 7168 -> 7168)
//
// Shapes as gemm_fp8.cc hands them to the column-major library: A = weight [K, N] (op T),
// B = activations [K, M], D = [N, M] bf16. Prints, per scale-mode pair, whether the heuristic
// found an algorithm, the median of 20 runs, and the largest difference from the outer-vector run.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("cuda %s at %d\n", cudaGetErrorString(e), __LINE__); std::exit(1); } } while (0)

struct Mode { const char* name; int32_t a, b; };

int main(int argc, char** argv) {
  const int64_t m = argc > 3 ? std::atoll(argv[1]) : 37810, k = argc > 3 ? std::atoll(argv[2]) : 7168,
                n = argc > 3 ? std::atoll(argv[3]) : 7168;
  std::vector<uint8_t> host_a(static_cast<size_t>(k * n)), host_b(static_cast<size_t>(k * m));
  uint32_t state = 12345;
  auto next_code = [&]() { state = state * 1664525u + 1013904223u; return static_cast<uint8_t>((state >> 24) & 0x77); };
  for (auto& c : host_a) c = next_code();  // |code| < 448 and never NaN (0x7F / 0xFF excluded)
  for (auto& c : host_b) c = next_code();
  uint8_t *a, *b; __nv_bfloat16 *d, *d_ref; float* scales; void* workspace;
  const size_t scale_count = static_cast<size_t>((k / 128 + 1) * (std::max(m, n) + 128));
  CHECK_CUDA(cudaMalloc(&a, host_a.size())); CHECK_CUDA(cudaMalloc(&b, host_b.size()));
  CHECK_CUDA(cudaMalloc(&d, sizeof(__nv_bfloat16) * m * n)); CHECK_CUDA(cudaMalloc(&d_ref, sizeof(__nv_bfloat16) * m * n));
  CHECK_CUDA(cudaMalloc(&scales, sizeof(float) * scale_count));
  const size_t workspace_bytes = 64u << 20;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_CUDA(cudaMemcpy(a, host_a.data(), host_a.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b, host_b.data(), host_b.size(), cudaMemcpyHostToDevice));
  std::vector<float> ones(scale_count, 1.0f);
  CHECK_CUDA(cudaMemcpy(scales, ones.data(), sizeof(float) * scale_count, cudaMemcpyHostToDevice));

  cublasLtHandle_t lt; cublasLtCreate(&lt);
  const Mode modes[] = {{"outer-vec x outer-vec (the recipe now)", CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F},
                        {"weight blk128x128 x activation vec128", CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F},
                        {"weight vec128 x activation blk128x128", CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F},
                        {"weight vec128 x activation vec128", CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F}};
  cudaStream_t stream; cudaStreamCreate(&stream);
  cudaEvent_t start, stop; cudaEventCreate(&start); cudaEventCreate(&stop);
  std::vector<__nv_bfloat16> ref(static_cast<size_t>(m * n)), got(static_cast<size_t>(m * n));
  for (int i = 0; i < 4; ++i) {
    const Mode& mode = modes[i];
    cublasLtMatmulDesc_t desc; cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode.a, sizeof(mode.a));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode.b, sizeof(mode.b));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales, sizeof(scales));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales, sizeof(scales));
    const int8_t fast_accum = 0;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum));
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n);
    cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
    cublasLtMatmulHeuristicResult_t heuristic{}; int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
      std::printf("%-42s no algorithm (status %d, found %d)\n", mode.name, static_cast<int>(hs), found);
      continue;
    }
    const float alpha = 1.0f, beta = 0.0f;
    __nv_bfloat16* out = i == 0 ? d_ref : d;
    auto run = [&]() { return cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, out, ld, out, ld, &heuristic.algo, workspace, workspace_bytes, stream); };
    const cublasStatus_t rs = run();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (rs != CUBLAS_STATUS_SUCCESS) { std::printf("%-42s matmul failed (status %d)\n", mode.name, static_cast<int>(rs)); continue; }
    std::vector<float> ms;
    for (int rep = 0; rep < 20; ++rep) {
      cudaEventRecord(start, stream); run(); cudaEventRecord(stop, stream); cudaEventSynchronize(stop);
      float t = 0; cudaEventElapsedTime(&t, start, stop); ms.push_back(t);
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
    std::printf("%-42s median %.3f ms (min %.3f, %.0f TFLOP/s), max rel diff vs outer-vec %.2e\n", mode.name,
                ms[ms.size() / 2], ms[0], 2.0 * m * n * k / (ms[ms.size() / 2] * 1e-3) / 1e12, max_diff);
  }
  return 0;
}
