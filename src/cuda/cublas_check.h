// cuBLAS / cuBLASLt errors as Status: the failed call, the library's name for the error and file:line.
// The names come from cuBLASLt's own functions, so code that links only libcublasLt can use it.
#pragma once

#include <cublasLt.h>

#include <string>

#include "vortex/status.h"

namespace vortex::cuda {

inline Status cublas_status(cublasStatus_t status, const char* expr, const char* file, int line) {
  return device_error(std::string(cublasLtGetStatusName(status)) + " (" + cublasLtGetStatusString(status) + ") from " +
                      expr + " at " + file + ":" + std::to_string(line));
}

}  // namespace vortex::cuda

// Returns a device_error Status naming the failed call and its file:line.
#define VORTEX_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                         \
    cublasStatus_t vortex_cublas_status_ = (expr);                                             \
    if (vortex_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                        \
      return ::vortex::cuda::cublas_status(vortex_cublas_status_, #expr, __FILE__, __LINE__);  \
  } while (0)
