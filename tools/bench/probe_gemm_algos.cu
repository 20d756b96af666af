// Probe: does cuBLASLt's heuristic leave speed on the table for the H3 block's bf16 GEMMs? For each
// of the canonical block's four linears it asks the heuristic for up to 32 algorithms under the
// plan gemm.cc builds (bf16 in and out, fp32 compute, no bias as in the block unless --bias, a
// 64 MB workspace unless --workspace-mb), times each and compares its output bits with the first
// candidate's, the one gemm.cc keeps. A faster candidate that is bit for bit the first could be
// chosen without changing any result; one that is not would change the bf16 program's bits. The
// last row is cuBLAS's own default (cublasGemmEx, CUBLAS_GEMM_DEFAULT, the path PyTorch's
// F.linear takes), with the same bit comparison.
//
// --fp8: the same for the fp8 recipe's plans (gemm_fp8.cc): e4m3 codes, bf16 out, one scale per
// row of each operand, and for the out projection the 128-wide block scales the attention epilogue
// writes. The scales are 1 (they do not change the kernels' speed); no cuBLAS default row.
//
// --search: also the configurations the heuristic does not offer: every algorithm id's tiles and
// stages under seven cluster shapes, each accepted by cublasLtMatmulAlgoCheck. Each is timed
// briefly (dropped after one run when that is over 1.25× the heuristic's first; the search of one
// linear stops after kSearchSeconds, and the listing says how far it got). The kSearchKeep
// fastest, and the fastest of every other cluster shape, join the heuristic's candidates for the
// full timing and bit comparison. Output is line-buffered, so a run cut short by a timeout still
// shows what it measured.
//
// Timing: short bursts (median of 20 after 3 warm-ups, the clock near its maximum), or with
// --sustained the median of 20 after a second of back-to-back runs, at the clock the 700 W cap
// holds (the block's condition).
//
//   <build>/probe_gemm_algos [M] [--fp8] [--search] [--bias] [--sustained] [--workspace-mb N]
//   (built with the tests; default M = 37810 tokens)
//
// Shapes as gemm.cc hands them to the column-major library: A = the weight [I, O] (op T, m = O
// output channels), B = the activations [I, M] (n = M tokens), D = [O, M].
#include <cublas_v2.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kCandidates = 32;
constexpr int kWarmup = 3, kRuns = 20;
constexpr int kSearchKeep = 4;
constexpr double kSearchSeconds = 40.0;

struct Options {
  int m = 37810;
  bool fp8 = false;
  bool search = false;
  bool bias = false;
  bool sustained = false;
  size_t workspace = size_t{64} << 20;
};

// One timed run, in ms.
template <typename Run>
float timed_ms(Run run, cudaEvent_t start, cudaEvent_t stop) {
  float t = 0.0f;
  CHECK_CUDA(cudaEventRecord(start));
  run();
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
  return t;
}

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
  for (float& t : ms) t = timed_ms(run, start, stop);
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[kRuns / 2 - 1] + ms[kRuns / 2]);
}

// One configuration to time. The library's result type is an unnamed struct, which nvcc's front end
// cannot hold in a std::vector; this names it.
struct Candidate {
  cublasLtMatmulHeuristicResult_t result;
};

struct Ranked {
  double ms;
  size_t index;
  bool operator<(const Ranked& other) const { return ms < other.ms; }
};

// A short median to rank the searched configurations: one warm-up and one timed run; past
// `give_up_ms` that run is the answer, otherwise the median of it and four more.
template <typename Run>
double quick_ms(Run run, cudaEvent_t start, cudaEvent_t stop, double give_up_ms) {
  run();
  std::vector<float> ms = {timed_ms(run, start, stop)};
  if (ms[0] > give_up_ms) return ms[0];
  for (int r = 0; r < 4; ++r) ms.push_back(timed_ms(run, start, stop));
  std::sort(ms.begin(), ms.end());
  return ms[2];
}

// A capability list of an initialised algorithm (tile or stage ids), or {0} (undefined: the
// library's choice) when it has none.
std::vector<uint32_t> capability_ids(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attribute) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attribute, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) {
    return {0};
  }
  std::vector<uint32_t> ids(bytes / sizeof(uint32_t));
  CHECK_LT(cublasLtMatmulAlgoCapGetAttribute(&algo, attribute, ids.data(), bytes, &bytes));
  return ids;
}

// Where a tile id comes in the search: the large tiles a product of this size is likely to want
// first (128x256, 256x128, 128x128, 128x192, 192x128, ...), every other tile after them.
int tile_rank(uint32_t tile) {
  const uint32_t preferred[] = {CUBLASLT_MATMUL_TILE_128x256, CUBLASLT_MATMUL_TILE_256x128, CUBLASLT_MATMUL_TILE_128x128,
                                CUBLASLT_MATMUL_TILE_128x192, CUBLASLT_MATMUL_TILE_192x128, CUBLASLT_MATMUL_TILE_128x160,
                                CUBLASLT_MATMUL_TILE_160x128, CUBLASLT_MATMUL_TILE_64x256,  CUBLASLT_MATMUL_TILE_256x64,
                                CUBLASLT_MATMUL_TILE_64x128,  CUBLASLT_MATMUL_TILE_128x64};
  for (int r = 0; r < static_cast<int>(sizeof(preferred) / sizeof(preferred[0])); ++r) {
    if (preferred[r] == tile) return r;
  }
  return 1000;
}

// Every configuration cublasLtMatmulAlgoCheck accepts for the plan: each algorithm id's tiles and
// stages (only the AUTO stage kinds where the algorithm lists any) under seven cluster shapes,
// the preferred tiles first (tile_rank).
std::vector<Candidate> enumerate_configs(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, cudaDataType_t in_type,
                                         size_t workspace_bytes) {
  int ids[128];
  int id_count = 0;
  CHECK_LT(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, in_type, in_type, CUDA_R_16BF, CUDA_R_16BF, 128,
                                    ids, &id_count));
  const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x4x1};
  std::vector<Candidate> found;
  for (int i = 0; i < id_count; ++i) {
    cublasLtMatmulAlgo_t algo;
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, in_type, in_type, CUDA_R_16BF, CUDA_R_16BF, ids[i],
                               &algo) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    const std::vector<uint32_t> tiles = capability_ids(algo, CUBLASLT_ALGO_CAP_TILE_IDS);
    std::vector<uint32_t> stages = capability_ids(algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
    std::vector<uint32_t> auto_stages;
    for (uint32_t s : stages) {
      if (s >= CUBLASLT_MATMUL_STAGES_8xAUTO && s <= CUBLASLT_MATMUL_STAGES_768xAUTO) auto_stages.push_back(s);
    }
    if (!auto_stages.empty()) stages = auto_stages;
    for (uint32_t tile : tiles) {
      for (uint32_t stage : stages) {
        for (uint16_t cluster : clusters) {
          cublasLtMatmulAlgo_t config = algo;
          cublasLtMatmulAlgoConfigSetAttribute(&config, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
          cublasLtMatmulAlgoConfigSetAttribute(&config, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof(stage));
          cublasLtMatmulAlgoConfigSetAttribute(&config, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster));
          cublasLtMatmulHeuristicResult_t result{};
          if (cublasLtMatmulAlgoCheck(lt, desc, a, b, d, d, &config, &result) != CUBLAS_STATUS_SUCCESS ||
              result.workspaceSize > workspace_bytes) {
            continue;
          }
          result.algo = config;
          result.state = CUBLAS_STATUS_SUCCESS;
          found.push_back({result});
        }
      }
    }
  }
  const auto tile_of = [](const Candidate& c) {
    uint32_t tile = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&c.result.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), nullptr);
    return tile;
  };
  std::stable_sort(found.begin(), found.end(), [&](const Candidate& l, const Candidate& r) {
    return tile_rank(tile_of(l)) < tile_rank(tile_of(r));
  });
  return found;
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

// e4m3 codes spread over the finite range (0x7F / 0xFF, the NaNs, become zero).
__global__ void fill_e4m3(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const uint8_t code = static_cast<uint8_t>(h & 0xBFu);  // exponent ≤ 7: |value| ≤ 1.875
    p[i] = (code & 0x7Fu) == 0x7Fu ? 0 : code;
  }
}

__global__ void fill_ones(float* p, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) p[i] = 1.0f;
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
  bool block_scales;  // the fp8 recipe's out projection: 128-wide block scales (gemm_fp8.cc)
};

void probe(cublasLtHandle_t lt, cublasHandle_t blas, void* workspace, const Options& o, const Linear& linear) {
  const int m = o.m;
  const size_t workspace_bytes = o.workspace;
  const size_t w_elems = static_cast<size_t>(linear.i) * linear.o, x_elems = static_cast<size_t>(linear.i) * m,
               y_elems = static_cast<size_t>(linear.o) * m;
  const size_t in_bytes = o.fp8 ? 1 : 2;
  void *w, *x;
  __nv_bfloat16 *bias, *y, *reference;
  unsigned long long* differing_d;
  CHECK_CUDA(cudaMalloc(&w, w_elems * in_bytes));
  CHECK_CUDA(cudaMalloc(&reference, y_elems * 2));
  CHECK_CUDA(cudaMalloc(&differing_d, sizeof(unsigned long long)));
  CHECK_CUDA(cudaMalloc(&x, x_elems * in_bytes));
  CHECK_CUDA(cudaMalloc(&bias, static_cast<size_t>(linear.o) * 2));
  CHECK_CUDA(cudaMalloc(&y, y_elems * 2));
  // fp8 scales: at most one per element of either operand covers every mode's layout.
  float *scale_w = nullptr, *scale_x = nullptr;
  if (o.fp8) {
    CHECK_CUDA(cudaMalloc(&scale_w, w_elems * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&scale_x, x_elems * sizeof(float)));
    fill_e4m3<<<1024, 256>>>(static_cast<uint8_t*>(w), w_elems, 1);
    fill_e4m3<<<1024, 256>>>(static_cast<uint8_t*>(x), x_elems, 2);
    fill_ones<<<1024, 256>>>(scale_w, w_elems);
    fill_ones<<<1024, 256>>>(scale_x, x_elems);
  } else {
    fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(w), w_elems, 1, 0.05f);
    fill<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x), x_elems, 2, 2.0f);
  }
  fill<<<64, 256>>>(bias, linear.o, 3, 0.1f);

  cublasLtMatmulDesc_t desc;
  CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  if (o.fp8) {  // gemm_fp8.cc's attributes: A is the weight, B the activations
    const int32_t a_mode =
        linear.block_scales ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const int32_t b_mode =
        linear.block_scales ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const int8_t fast_accum = 0;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_w, sizeof(scale_w)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_x, sizeof(scale_x)));
  }
  if (o.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    const int32_t bias_type = CUDA_R_16BF;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  cublasLtMatrixLayout_t a, b, d;
  const cudaDataType_t in_type = o.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  CHECK_LT(cublasLtMatrixLayoutCreate(&a, in_type, linear.i, linear.o, linear.i));
  CHECK_LT(cublasLtMatrixLayoutCreate(&b, in_type, linear.i, m, linear.i));
  CHECK_LT(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, linear.o, m, linear.o));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_workspace = workspace_bytes;
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                sizeof(max_workspace)));
  cublasLtMatmulHeuristicResult_t offered[kCandidates] = {};
  int offered_count = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, pref, kCandidates, offered, &offered_count));
  std::vector<Candidate> results;
  for (int c = 0; c < offered_count; ++c) results.push_back({offered[c]});

  const float alpha = 1.0f, beta = 0.0f;
  const double flops = 2.0 * m * linear.i * linear.o;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  if (o.search) {
    std::vector<Candidate> searched = enumerate_configs(lt, desc, a, b, d, in_type, workspace_bytes);
    const auto run_with = [&](const cublasLtMatmulAlgo_t* algo) {
      return cublasLtMatmul(lt, desc, &alpha, w, a, x, b, &beta, y, d, y, d, algo, workspace, workspace_bytes, nullptr);
    };
    double baseline_ms = 1e30;
    if (!results.empty() && run_with(&results[0].result.algo) == CUBLAS_STATUS_SUCCESS) {
      baseline_ms = quick_ms([&] { CHECK_LT(run_with(&results[0].result.algo)); }, start, stop, 1e30);
    }
    std::vector<Ranked> ranked;
    const auto began = std::chrono::steady_clock::now();
    const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(); };
    size_t tried = 0;
    for (size_t c = 0; c < searched.size() && elapsed() < kSearchSeconds; ++c, ++tried) {
      const cublasLtMatmulAlgo_t* algo = &searched[c].result.algo;
      if (run_with(algo) != CUBLAS_STATUS_SUCCESS) continue;
      ranked.push_back({quick_ms([&] { CHECK_LT(run_with(algo)); }, start, stop, 1.25 * baseline_ms), c});
    }
    std::sort(ranked.begin(), ranked.end());
    std::printf("%s: %zu configurations accepted, %zu tried in %.0f s, %zu ran; heuristic's first %.3f ms; the "
                "fastest %d and the fastest of each other cluster shape go on (quick medians",
                linear.name, searched.size(), tried, elapsed(), ranked.size(), baseline_ms, kSearchKeep);
    // Bursts do not show what a configuration draws from the 700 W cap (a cluster that multicasts
    // its operands reads less from L2), so each cluster shape's fastest is timed again as well.
    std::vector<uint16_t> shapes_kept;
    for (size_t r = 0; r < ranked.size(); ++r) {
      uint16_t cluster = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&searched[ranked[r].index].result.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                           &cluster, sizeof(cluster), nullptr);
      const bool new_shape = std::find(shapes_kept.begin(), shapes_kept.end(), cluster) == shapes_kept.end();
      if (r >= static_cast<size_t>(kSearchKeep) && !new_shape) continue;
      if (new_shape) shapes_kept.push_back(cluster);
      std::printf(" %.3f", ranked[r].ms);
      results.push_back(searched[ranked[r].index]);
    }
    std::printf(" ms)\n");
  }
  const int count = static_cast<int>(results.size());
  std::printf("%s: M %d, I %d, O %d, %d candidates (%s, %s, %s, workspace %zu MB)\n", linear.name, m, linear.i,
              linear.o, count, o.fp8 ? (linear.block_scales ? "e4m3, block scales" : "e4m3, row scales") : "bf16",
              o.bias ? "bias" : "no bias", o.sustained ? "sustained" : "bursts", workspace_bytes >> 20);
  for (int c = 0; c < count; ++c) {
    if (results[c].result.state != CUBLAS_STATUS_SUCCESS || results[c].result.workspaceSize > workspace_bytes) continue;
    const cublasLtMatmulAlgo_t* algo = &results[c].result.algo;
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
    int algo_id = 0, tile = 0, stages = 0, splitk = 0, reduction = 0;
    uint16_t cluster = 0;
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof(algo_id), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof(reduction),
                                         nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster),
                                         nullptr);
    std::printf("  #%-2d %8.3f ms %6.0f TFLOP/s  algo %2d tile %3d stages %3d splitk %2d reduction %d cluster %2d  "
                "ws %7zu  %s%s\n",
                c, median, flops / (median * 1e-3) / 1e12, algo_id, tile, stages, splitk, reduction, cluster,
                static_cast<size_t>(results[c].result.workspaceSize),
                c == 0 ? "(kept by gemm.cc)" : (differing == 0 ? "same bits" : "different bits"),
                c >= offered_count ? ", searched" : "");
    if (c > 0 && differing > 0) std::printf("        %llu of %zu outputs differ\n", differing, y_elems);
  }
  if (!o.bias && !o.fp8) {  // cuBLAS's own choice for the same product (no bias epilogue in cublasGemmEx)
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
  cudaFree(scale_w);
  cudaFree(scale_x);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--fp8") == 0) {
      o.fp8 = true;
    } else if (std::strcmp(argv[a], "--search") == 0) {
      o.search = true;
    } else if (std::strcmp(argv[a], "--bias") == 0) {
      o.bias = true;
    } else if (std::strcmp(argv[a], "--sustained") == 0) {
      o.sustained = true;
    } else if (std::strcmp(argv[a], "--workspace-mb") == 0 && a + 1 < argc) {
      o.workspace = static_cast<size_t>(std::atoi(argv[++a])) << 20;
    } else {
      o.m = std::atoi(argv[a]);
      if (o.m <= 0) {
        std::printf("usage: probe_gemm_algos [M > 0] [--fp8] [--search] [--bias] [--sustained] [--workspace-mb N]\n");
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
  const Linear linears[] = {{"qkv", 5376, 3 * 7168, false},
                            {"out", 7168, 5376, o.fp8},
                            {"fc1", 5376, 2 * 14336, false},
                            {"fc2", 14336, 5376, false}};
  for (const Linear& linear : linears) probe(lt, blas, workspace, o, linear);
  cudaFree(workspace);
  cublasDestroy(blas);
  cublasLtDestroy(lt);
  return 0;
}
