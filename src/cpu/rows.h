// Row access helpers for the CPU reference: load a row of any activation dtype into fp32,
// store fp32 back with the one rounding the storage dtype implies (DESIGN section 3).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

// F32 and BF16 are the activation dtypes of the reference program.
inline Status check_activation(const TensorView& t, const char* what) {
  if (t.device != Device::kCpu) return invalid_argument(std::string(what) + ": CPU backend got a device tensor");
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
    return invalid_argument(std::string(what) + ": dtype " + dtype_name(t.dtype) + " (expected F32 or BF16)");
  }
  if (t.rank() > 0 && t.strides[t.rank() - 1] != 1) {
    return invalid_argument(std::string(what) + ": innermost dimension must be contiguous");
  }
  return ok_status();
}

// Rounds v as if stored in `dtype` and read back.
inline float round_to(DType dtype, float v) { return dtype == DType::kBF16 ? round_bf16(v) : v; }

// Address of element (i, 0) of a rank-2 view, or (i, j, 0) of a rank-3 view.
inline char* row_ptr(const TensorView& t, int64_t i) {
  return static_cast<char*>(t.data) + i * t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
}
inline char* row_ptr(const TensorView& t, int64_t i, int64_t j) {
  return static_cast<char*>(t.data) +
         (i * t.strides[0] + j * t.strides[1]) * static_cast<int64_t>(dtype_size(t.dtype));
}

inline void load_row(const char* p, DType dtype, int64_t n, float* out) {
  if (dtype == DType::kF32) {
    const float* f = reinterpret_cast<const float*>(p);
    for (int64_t i = 0; i < n; ++i) out[i] = f[i];
  } else {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(b[i]);
  }
}

inline void store_row(const float* in, int64_t n, char* p, DType dtype) {
  if (dtype == DType::kF32) {
    float* f = reinterpret_cast<float*>(p);
    for (int64_t i = 0; i < n; ++i) f[i] = in[i];
  } else {
    uint16_t* b = reinterpret_cast<uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) b[i] = f32_to_bf16_bits(in[i]);
  }
}

// Reads element i of a contiguous rank-1 F32/BF16 vector (norm weights, biases).
inline float load_scalar(const TensorView& t, int64_t i) {
  return t.dtype == DType::kF32 ? static_cast<const float*>(t.data)[i * t.strides[0]]
                                : bf16_bits_to_f32(static_cast<const uint16_t*>(t.data)[i * t.strides[0]]);
}

}  // namespace vortex::cpu
