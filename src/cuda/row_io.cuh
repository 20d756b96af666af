// Shared plumbing of the row-wise kernels (norm.cu, elementwise.cu): how a device view is handed
// to a kernel, vector loads of F32/BF16 rows into fp32 registers and stores back with the bf16
// rounding of core/dtype.h, the host checks every op runs first, and the 2-D launch shape of the
// ops without a reduction.
//
// Vector width: a kernel instantiated with V = kVec moves 8 consecutive elements per access
// (16 bytes of bf16, or two 16-byte accesses of f32); V = 1 is the scalar fallback for views whose
// base, row strides or widths are not 16-byte multiples. The dtype of each operand is a runtime
// flag rather than a template argument: the branch is uniform across the grid, costs nothing next
// to the memory traffic, and keeps the instantiations at two per kernel whatever the dtype mix.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda::detail {

constexpr int kVec = 8;            // elements per vector access
constexpr int64_t kVecAlign = 16;  // bytes: the widest global access (ld.global.v4.b32)

// A device view as the kernels see it: base pointer, element strides of dims 0 and 1 (stride1 is
// only used by the rank-3 [N, H, D] views), and the dtype (F32 or BF16; checked on the host).
struct Operand {
  char* data;
  int64_t stride0;
  int64_t stride1;
  bool bf16;
};

// ---- device side ---------------------------------------------------------------------------------

__device__ __forceinline__ int elem_bytes(bool bf16) { return bf16 ? 2 : 4; }

__device__ __forceinline__ char* row_ptr(const Operand& o, int64_t i) {
  return o.data + i * o.stride0 * elem_bytes(o.bf16);
}
__device__ __forceinline__ char* row_ptr(const Operand& o, int64_t i, int64_t j) {
  return o.data + (i * o.stride0 + j * o.stride1) * elem_bytes(o.bf16);
}

// R: rounds v as if stored in the output dtype and read back (identity for F32).
// bf16 rounding on the device: the hardware's round-to-nearest-even conversion (cvt.rn.bf16.f32,
// subnormals kept) rather than core/dtype.h's integer sequence, which left the elementwise kernels
// ALU-bound (ncu, canonical block: qk_norm_rope at 76% ALU and 13% of the DRAM bandwidth). Bit for
// bit f32_to_bf16_bits, NaNs included: both write the canonical NaN 0x7FFF
// (tests/gpu/test_gpu_bf16_rounding.cu runs all 2^32 inputs).
__device__ __forceinline__ uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
// Two values in one conversion (cvt.rn.bf16x2.f32), `lo` in the low half: the same bits as two
// bf16_bits calls.
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
// Two bf16 values in one word: 1.0 twice, and bf16_bits's NaN twice.
constexpr uint32_t kBf16OnePair = 0x3F803F80u;
constexpr uint32_t kBf16NanPair = 0x7FFF7FFFu;
// The halves of a bf16 pair widened to fp32 (exact), the low half first in memory.
__device__ __forceinline__ float bf16x2_low(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16x2_high(uint32_t pair) { return __uint_as_float(pair & 0xFFFF0000u); }
// Two elements' rounded product or sum in one instruction (mul.rn / add.rn .bf16x2, sm_90): each
// half is RNE_bf16 of the exact result, which is exactly what the fp32 operation followed by a
// bf16 rounding gives on bf16 operands, R(a·b) and R(a + b): the fp32 product of two bf16 values
// is exact (or below bf16's subnormal grid), and an fp32 sum that rounds loses only bits far below
// bf16's rounding point. tests/gpu/test_gpu_bf16_rounding.cu checks it on all 2^32 operand pairs.
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t bf16x2_add(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// Two floats to e4m3 in one hardware conversion (cvt.rn.satfinite.e4m3x2.f32), `lo` in the low
// byte: RNE, saturating at ±448. Bit for bit core/dtype.h's f32_to_e4m3_bits on every float that is
// not a NaN (tests/gpu/test_gpu_e4m3_rounding.cu, all 2^32 patterns); callers pass no NaN.
__device__ __forceinline__ uint32_t e4m3x2_bits(float lo, float hi) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
}
__device__ __forceinline__ float round_bf16_device(float v) {
  return __uint_as_float(static_cast<uint32_t>(bf16_bits(v)) << 16);
}

__device__ __forceinline__ float round_out(bool bf16, float v) { return bf16 ? round_bf16_device(v) : v; }

__device__ __forceinline__ float quiet_nan() { return __uint_as_float(0x7FC00000u); }

// Loads elements [e, e + V) of the row at p. V == kVec needs p + e 16-byte aligned.
template <int V>
__device__ __forceinline__ void load_vec(const char* p, bool bf16, int64_t e, float (&out)[V]) {
  if (bf16) {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(p) + e;
    if constexpr (V % 8 == 0) {
#pragma unroll
      for (int q = 0; q < V / 8; ++q) {
        const uint4 raw = reinterpret_cast<const uint4*>(b)[q];
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          out[8 * q + 2 * k] = __uint_as_float(w[k] << 16);  // little endian: first element low
          out[8 * q + 2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = bf16_bits_to_f32(b[k]);
    }
  } else {
    const float* f = reinterpret_cast<const float*>(p) + e;
    if constexpr (V % 4 == 0) {
#pragma unroll
      for (int q = 0; q < V / 4; ++q) {
        const float4 raw = reinterpret_cast<const float4*>(f)[q];
        out[4 * q] = raw.x;
        out[4 * q + 1] = raw.y;
        out[4 * q + 2] = raw.z;
        out[4 * q + 3] = raw.w;
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = f[k];
    }
  }
}

// Stores v into elements [e, e + V) of the row at p, rounding to bf16 (RNE) for a BF16 operand.
template <int V>
__device__ __forceinline__ void store_vec(char* p, bool bf16, int64_t e, const float (&v)[V]) {
  if (bf16) {
    uint16_t* b = reinterpret_cast<uint16_t*>(p) + e;
    if constexpr (V % 8 == 0) {
#pragma unroll
      for (int q = 0; q < V / 8; ++q) {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = bf16x2_bits(v[8 * q + 2 * k], v[8 * q + 2 * k + 1]);
        reinterpret_cast<uint4*>(b)[q] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) b[k] = bf16_bits(v[k]);
    }
  } else {
    float* f = reinterpret_cast<float*>(p) + e;
    if constexpr (V % 4 == 0) {
#pragma unroll
      for (int q = 0; q < V / 4; ++q) {
        reinterpret_cast<float4*>(f)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) f[k] = v[k];
    }
  }
}

// ---- host side -----------------------------------------------------------------------------------

// The device counterpart of cpu::check_activation: a device view, F32 or BF16, unit innermost stride.
inline Status check_device_activation(const TensorView& t, const char* what) {
  if (t.device != Device::kCuda) return invalid_argument(std::string(what) + ": CUDA backend got a host tensor");
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
    return invalid_argument(std::string(what) + ": dtype " + dtype_name(t.dtype) + " (expected F32 or BF16)");
  }
  if (t.rank() > 0 && t.strides[t.rank() - 1] != 1) {
    return invalid_argument(std::string(what) + ": innermost dimension must be contiguous");
  }
  if (t.data == nullptr && t.numel() > 0) return invalid_argument(std::string(what) + ": null data pointer");
  return ok_status();
}

inline Operand make_operand(const TensorView& t) {
  return Operand{static_cast<char*>(t.data), t.rank() > 1 ? t.strides[0] : 0, t.rank() > 2 ? t.strides[1] : 0,
                 t.dtype == DType::kBF16};
}

// True when every vector access of width kVec into this view is 16-byte aligned, given that the
// kernels start vectors at multiples of kVec elements from the row start: the base and every outer
// stride must be 16-byte multiples. (Widths are the caller's concern.)
inline bool vec_aligned(const TensorView& t) {
  const int64_t esize = static_cast<int64_t>(dtype_size(t.dtype));
  if (reinterpret_cast<uintptr_t>(t.data) % kVecAlign != 0) return false;
  for (int d = 0; d + 1 < t.rank(); ++d) {
    if (t.shape[d] > 1 && (t.strides[d] * esize) % kVecAlign != 0) return false;
  }
  return true;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Launch shape of the ops without a reduction: blockDim.x threads cover a row's `units` (vectors
// of V elements) and blockDim.y rows share a 256-thread block, so short rows (a head's rotary half,
// a 24-channel test row) still fill blocks. Kernels loop over rows with a grid stride, so the grid
// never exceeds the 65535 limit of gridDim.y.
struct RowLaunch {
  dim3 grid;
  dim3 block;
};

inline RowLaunch row_launch(int64_t rows, int64_t units) {
  constexpr int64_t kThreads = 256;
  RowLaunch l;
  int64_t x;
  if (units >= 32) {
    // Split the row over as few blocks as possible, then balance the threads between them: a
    // 5376-channel bf16 row has 672 vectors -> 3 blocks of 224 threads, none idle.
    const int64_t blocks = ceil_div(units, kThreads);
    x = ceil_div(ceil_div(units, blocks), 32) * 32;
    l.grid.x = static_cast<unsigned>(blocks);
  } else {
    x = 1;
    while (x < units) x *= 2;
    l.grid.x = 1;
  }
  const int64_t y = kThreads / x >= 1 ? kThreads / x : 1;
  l.block = dim3(static_cast<unsigned>(x), static_cast<unsigned>(y), 1);
  l.grid.y = static_cast<unsigned>(std::min<int64_t>(ceil_div(rows, y), 65535));
  l.grid.z = 1;
  return l;
}

}  // namespace vortex::cuda::detail
