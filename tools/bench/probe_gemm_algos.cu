// Probe: does cuBLASLt's heuristic leave speed on the table for the H3 block's bf16 GEMMs? For each
// of the canonical block's four linears it asks the heuristic for up to 32 algorithms under the
// plan gemm.cc builds (bf16 in and out, fp32 compute, no bias as in the block unless --bias, a
// 64 MB workspace unless --workspace-mb), times each and compares its output bits with the first
// candidate's, the one gemm.cc keeps. A faster candidate that is bit for bit the first could be
// chosen without changing any result; one that is not would change the bf16 program's bits. The
// last row is cuBLAS's own default (cublasGemmEx, CUBLAS_GEMM_DEFAULT, the path PyTorch's
// F.linear takes), with the same bit comparison.
//
// Timing: short bursts (median of 20 after 3 warm-ups, the clock near its maximum), or with
// --sustained the median of 20 after a second of back-to-back runs, at the clock the 700 W cap
// holds (the block's condition).
//
//   <build>/probe_gemm_algos [M] [--bias] [--sustained] [--workspace-mb N]   (built with the tests;
//   default M = 37810 tokens)
//
// Shapes as gemm.cc hands them to the column-major library: A = the weight [I, O] (op T, m = O
// output channels), B = the activations [I, M] (n = M tokens), D = [O, M].
#include <cublas_v2.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kCandidates = 32;
constexpr int kWarmup = 3, kRuns = 20;

struct Options {
  int m = 37810;
  bool bias = false;
  bool sustained = false;
  size_t workspace = size_t{64} << 20;
};

// The median of kRuns timed runs of `run`, after kWarmup runs or, sustained, after a second of them.
template <typename Run>
double median_ms(const Options& o, Run run, cudaEvent_t start, cudaEvent_t stop) {
  if (o.sustained) {
    CHECK_CUDA(cudaEventRecord(start));
    float elapsed = 0.0f;
    while (elapsed < 1000.0f) {
      for (int r = 0; r < 10; ++r) run();
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      CHECK_CUDA(cudaEventElapsedTime(&elapsed, start, stop));
    }
  } else {
    for (int r = 0; r < kWarmup; ++r) run();
  }
  std::vector<float> ms(kRuns);
  for (float& t : ms) {
    CHECK_CUDA(cudaEventRecord(start));
    run();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
  }
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[kRuns / 2 - 1] + ms[kRuns / 2]);
}

__global__ void fill(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xFFFFu) / 65535.0f - 0.5f) * scale);
  }
}

__global__ void count_differences(const uint16_t* a, const uint16_t* b, size_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    local += a[i] != b[i];
  }
  if (local) atomicAdd(count, local);
}

struct Linear {
  const char* name;
  int i, o;
};

void probe(cublasLtHandle_t lt, cublasHandle_t blas, void* workspace, const Options& o, const Linear& linear) {
  const int m = o.m;
  const size_t workspace_bytes = o.workspace;
  const size_t w_elems = static_cast<size_t>(linear.i) * linear.o, x_elems = static_cast<size_t>(linear.i) * m,
               y_elems = static_cast<size_t>(linear.o) * m;
  __nv_bfloat16 *w, *x, *bias, *y, *reference;
  unsigned long long* differing_d;
  CHECK_CUDA(cudaMalloc(&w, w_elems * 2));
  CHECK_CUDA(cudaMalloc(&reference, y_elems * 2));
  CHECK_CUDA(cudaMalloc(&differing_d, sizeof(unsigned long long)));
  CHECK_CUDA(cudaMalloc(&x, x_elems * 2));
  CHECK_CUDA(cudaMalloc(&bias, static_cast<size_t>(linear.o) * 2));
  CHECK_CUDA(cudaMalloc(&y, y_elems * 2));
  fill<<<1024, 256>>>(w, w_elems, 1, 0.05f);
  fill<<<1024, 256>>>(x, x_elems, 2, 2.0f);
  fill<<<64, 256>>>(bias, linear.o, 3, 0.1f);

  cublasLtMatmulDesc_t desc;
  CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  if (o.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  cublasLtMatrixLayout_t a, b, d;
  CHECK_LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, linear.i, linear.o, linear.i));
  CHECK_LT(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, linear.i, m, linear.i));
  CHECK_LT(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, linear.o, m, linear.o));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_workspace = workspace_bytes;
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                sizeof(max_workspace)));
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int count = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, pref, kCandidates, results, &count));

  const float alpha = 1.0f, beta = 0.0f;
  const double flops = 2.0 * m * linear.i * linear.o;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::printf("%s: M %d, I %d, O %d, %d candidates (%s, %s, workspace %zu MB)\n", linear.name, m, linear.i, linear.o,
              count, o.bias ? "bias" : "no bias", o.sustained ? "sustained" : "bursts", workspace_bytes >> 20);
  for (int c = 0; c < count; ++c) {
    if (results[c].state != CUBLAS_STATUS_SUCCESS || results[c].workspaceSize > workspace_bytes) continue;
    const cublasLtMatmulAlgo_t* algo = &results[c].algo;
    const auto run = [&] {
      return cublasLtMatmul(lt, desc, &alpha, w, a, x, b, &beta, y, d, y, d, algo, workspace, workspace_bytes, nullptr);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) {
      std::printf("  #%-2d fails to run\n", c);
      continue;
    }
    const double median = median_ms(o, [&] { CHECK_LT(run()); }, start, stop);
    unsigned long long differing = 0;
    if (c == 0) {
      CHECK_CUDA(cudaMemcpy(reference, y, y_elems * 2, cudaMemcpyDeviceToDevice));
    } else {
      CHECK_CUDA(cudaMemset(differing_d, 0, sizeof(differing)));
      count_differences<<<1024, 256>>>(reinterpret_cast<const uint16_t*>(y), reinterpret_cast<const uint16_t*>(reference),
                                       y_elems, differing_d);
      CHECK_CUDA(cudaMemcpy(&differing, differing_d, sizeof(differing), cudaMemcpyDeviceToHost));
    }
    int tile = 0, stages = 0, splitk = 0, reduction = 0, cluster = 0;
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof(reduction),
                                         nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster),
                                         nullptr);
    std::printf("  #%-2d %8.3f ms %6.0f TFLOP/s  tile %3d stages %3d splitk %2d reduction %d cluster %2d  ws %7zu  %s\n",
                c, median, flops / (median * 1e-3) / 1e12, tile, stages, splitk, reduction, cluster,
                static_cast<size_t>(results[c].workspaceSize),
                c == 0 ? "(kept by gemm.cc)" : (differing == 0 ? "same bits" : "different bits"));
    if (c > 0 && differing > 0) std::printf("        %llu of %zu outputs differ\n", differing, y_elems);
  }
  if (!o.bias) {  // cuBLAS's own choice for the same product (no bias epilogue in cublasGemmEx)
    const auto run = [&] {
      CHECK_LT(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, linear.o, m, linear.i, &alpha, w, CUDA_R_16BF, linear.i, x,
                            CUDA_R_16BF, linear.i, &beta, y, CUDA_R_16BF, linear.o, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    };
    const double median = median_ms(o, run, start, stop);
    unsigned long long differing = 0;
    CHECK_CUDA(cudaMemset(differing_d, 0, sizeof(differing)));
    count_differences<<<1024, 256>>>(reinterpret_cast<const uint16_t*>(y), reinterpret_cast<const uint16_t*>(reference),
                                     y_elems, differing_d);
    CHECK_CUDA(cudaMemcpy(&differing, differing_d, sizeof(differing), cudaMemcpyDeviceToHost));
    std::printf("  cuBLAS default %8.3f ms %6.0f TFLOP/s  %s\n", median, flops / (median * 1e-3) / 1e12,
                differing == 0 ? "same bits" : "different bits");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(d);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatmulDescDestroy(desc);
  cudaFree(w);
  cudaFree(x);
  cudaFree(bias);
  cudaFree(y);
  cudaFree(reference);
  cudaFree(differing_d);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--bias") == 0) {
      o.bias = true;
    } else if (std::strcmp(argv[a], "--sustained") == 0) {
      o.sustained = true;
    } else if (std::strcmp(argv[a], "--workspace-mb") == 0 && a + 1 < argc) {
      o.workspace = static_cast<size_t>(std::atoi(argv[++a])) << 20;
    } else {
      o.m = std::atoi(argv[a]);
      if (o.m <= 0) {
        std::printf("usage: probe_gemm_algos [M > 0] [--bias] [--sustained] [--workspace-mb N]\n");
        return 2;
      }
    }
  }
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cublasHandle_t blas;
  CHECK_LT(cublasCreate(&blas));
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, o.workspace));
  CHECK_LT(cublasSetWorkspace(blas, workspace, o.workspace));
  // The canonical block (hidden 5376, 56 heads of 128, FFN 14336; SwiGLU's FC1 is 2 × 14336 wide).
  const Linear linears[] = {{"qkv", 5376, 3 * 7168}, {"out", 7168, 5376}, {"fc1", 5376, 2 * 14336}, {"fc2", 14336, 5376}};
  for (const Linear& linear : linears) probe(lt, blas, workspace, o, linear);
  cudaFree(workspace);
  cublasDestroy(blas);
  cublasLtDestroy(lt);
  return 0;
}
