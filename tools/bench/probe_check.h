// The probes' error exits (tools/bench/probe_*.cu): a failed CUDA or cuBLASLt call prints what
// failed and where, and ends the probe with status 1.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                                       \
  do {                                                                      \
    cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                 \
      std::printf("cuda %s at line %d\n", cudaGetErrorString(e), __LINE__); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)
#define CHECK_LT(x)                                                \
  do {                                                             \
    cublasStatus_t s = (x);                                        \
    if (s != CUBLAS_STATUS_SUCCESS) {                              \
      std::printf("cublasLt status %d at line %d\n", s, __LINE__); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)
