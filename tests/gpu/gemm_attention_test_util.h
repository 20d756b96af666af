// What the GEMM and attention GPU tests need beyond gpu_test_util.h: device-side random fills for
// multi-gigabyte operands, downloads of a few rows of a strided device matrix, the cancellation
// allowance of the bf16 GEMM bound, the order check of an attention kernel's timeline, and the
// check of an attention kernel's e4m3 output tiles. Holds a kernel: include it from .cu files only.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "cpu/fp8_blocks.h"
#include "cuda/fp8_blocks.h"
#include "cuda/kernel_timeline.h"
#include "cuda/runtime.h"
#include "must.h"
#include "vortex/tensor.h"

namespace vortex::test {

// ---- device fills: a hash of (seed, index), so a multi-gigabyte operand takes milliseconds ----

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// dst[i] = uniform in [-amplitude, amplitude), from the top 24 bits of the hash.
template <class T>
__global__ void fill_uniform_kernel(T* dst, int64_t count, uint64_t seed, float amplitude) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
    const uint64_t h = splitmix64(seed * 0x100000001B3ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
    if constexpr (sizeof(T) == 4) {
      dst[i] = u * amplitude;
    } else {
      dst[i] = f32_to_bf16_bits(u * amplitude);
    }
  }
}

// Fills a contiguous F32 or BF16 device tensor with uniform values (variance amplitude²/3).
inline Status fill_uniform(const Tensor& t, uint64_t seed, float amplitude, cudaStream_t stream) {
  constexpr int kBlock = 256, kGrid = 4096;  // grid-stride loop: any size in one launch
  if (t.dtype() == DType::kF32) {
    fill_uniform_kernel<float><<<kGrid, kBlock, 0, stream>>>(t.data_as<float>(), t.numel(), seed, amplitude);
  } else {
    fill_uniform_kernel<uint16_t><<<kGrid, kBlock, 0, stream>>>(t.data_as<uint16_t>(), t.numel(), seed, amplitude);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

// Rows [row0, row0 + rows), columns [col0, col0 + cols) of a device matrix at `data` with row
// stride `row_stride` (elements), as a contiguous host tensor [rows, cols].
inline Tensor download_2d(const void* data, DType dtype, int64_t row_stride, int64_t row0, int64_t rows, int64_t col0,
                          int64_t cols) {
  const size_t esize = dtype_size(dtype);
  Tensor host = Tensor::empty({rows, cols}, dtype);
  const char* src = static_cast<const char*>(data) + (row0 * row_stride + col0) * static_cast<int64_t>(esize);
  EXPECT_EQ(cudaMemcpy2D(host.data(), cols * esize, src, row_stride * esize, cols * esize, rows, cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// Elements of two same-shape contiguous bf16 tensors more than 1 ulp apart by more than
// 2^-8 · rms(want), one ulp of a typical element. A GEMM output more than 1 ulp from the CPU's is
// allowed only where cancellation made it small, which keeps its error under this.
inline int64_t count_gross_bf16(const Tensor& got, const Tensor& want) {
  const auto ordered = [](uint16_t b) -> int64_t { return (b & 0x8000u) ? -int64_t{b & 0x7FFFu} : int64_t{b}; };
  const uint16_t* g = got.data_as<uint16_t>();
  const uint16_t* w = want.data_as<uint16_t>();
  const int64_t n = want.numel();
  double sum2 = 0.0;
  for (int64_t i = 0; i < n; ++i) sum2 += static_cast<double>(bf16_bits_to_f32(w[i])) * bf16_bits_to_f32(w[i]);
  const double bound = std::ldexp(std::sqrt(sum2 / static_cast<double>(n > 0 ? n : 1)), -8);
  int64_t gross = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ordered(g[i]) - ordered(w[i]) <= 1 && ordered(w[i]) - ordered(g[i]) <= 1) continue;
    const double e = static_cast<double>(bf16_bits_to_f32(g[i])) - bf16_bits_to_f32(w[i]);
    if (!(std::fabs(e) <= bound)) ++gross;
  }
  return gross;
}

// Marks of a kernel timeline that are missing or out of program order: within every tile t >= 1
// each mark is positive and not before the previous one, tile t+1's first not before tile t's last;
// tile 0 holds no marks.
inline int64_t timeline_marks_out_of_order(const cuda::KernelTimeline& t) {
  const int events = static_cast<int>(t.events.size());
  int64_t bad = 0;
  for (int w = 0; w < t.warps; ++w) {
    for (int e = 0; e < events; ++e) bad += t.at(w, 0, e) != 0;
    for (int tile = 1; tile < t.tiles; ++tile) {
      long long previous = 0;
      for (int e = 0; e < events; ++e) {
        const long long at = t.at(w, tile, e);
        bad += at <= 0 || at < previous;
        previous = at;
      }
      if (tile + 1 < t.tiles) bad += t.at(w, tile + 1, 0) < previous;
    }
  }
  return bad;
}

// CTA records of a kernel timeline that are missing or out of order: each CTA's SM one of the
// current device's and its marks positive and in program order (start, first tile, sweep done,
// end) on both clocks.
inline int64_t cta_records_out_of_order(const cuda::KernelTimeline& t) {
  int device = 0, sm_count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return static_cast<int64_t>(t.ctas.size());
  }
  int64_t bad = 0;
  for (const cuda::CtaSpan& c : t.ctas) {
    bad += c.sm < 0 || c.sm >= sm_count;
    for (int m = 0; m < cuda::kCtaMarks; ++m) {
      bad += c.ns[m] <= 0 || c.cycles[m] <= 0;
      if (m > 0) bad += c.ns[m] < c.ns[m - 1] || c.cycles[m] < c.cycles[m - 1];
    }
  }
  return bad;
}

// An attention kernel's e4m3 output (the fp8 recipe's out-projection input) against
// quantize_blocks_fp8 (kTiles) of its bf16 output `out` [Nq, H, 128] (device): `run(codes, scales)`
// writes the e4m3 output into a codes view of the first H·128 columns of a wider buffer (whose
// other bytes hold a sentinel and must keep it) and into scales that start as NaN (so the layout's
// padding must be written). Codes and scales must equal the quantizer's bit for bit. Allocates
// from `arena`.
template <class Run>
void expect_e4m3_tiles_of(const Tensor& out, cuda::DeviceArena& arena, Run run, const std::string& label,
                          cudaStream_t stream) {
  constexpr unsigned char kSentinel = 0x5A;
  constexpr int64_t kPad = 16;
  const int64_t rows = out.size(0), width = out.size(1) * out.size(2);
  const Shape scale_shape = cpu::fp8_block_scales(cpu::Fp8BlockLayout::kTiles, rows, width).shape;
  const Tensor want_codes = must(arena.alloc({rows, width}, DType::kF8E4M3));
  const Tensor want_scales = must(arena.alloc(scale_shape, DType::kF32));
  must(cuda::quantize_blocks_fp8(must(out.reshape({rows, width})).view(), cpu::Fp8BlockLayout::kTiles,
                                 want_codes.view(), want_scales.view(), stream));
  const Tensor codes_full = must(arena.alloc({rows, width + kPad}, DType::kF8E4M3));
  ASSERT_EQ(cudaMemsetAsync(codes_full.data(), kSentinel, codes_full.nbytes(), stream), cudaSuccess);
  const Tensor scales = must(arena.alloc(scale_shape, DType::kF32));
  ASSERT_EQ(cudaMemsetAsync(scales.data(), 0xff, scales.nbytes(), stream), cudaSuccess);
  TensorView codes = codes_full.view();
  codes.shape = Shape({rows, width});
  must(run(codes, scales.view()));

  const Tensor got = must(cuda::download(codes_full, stream)), want = must(cuda::download(want_codes, stream));
  const Tensor got_s = must(cuda::download(scales, stream)), want_s = must(cuda::download(want_scales, stream));
  int64_t bad_codes = 0, clobbered = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < width + kPad; ++col) {
      const uint8_t g = got.data_as<uint8_t>()[r * (width + kPad) + col];
      if (col < width) {
        bad_codes += g != want.data_as<uint8_t>()[r * width + col];
      } else {
        clobbered += g != kSentinel;
      }
    }
  }
  EXPECT_EQ(bad_codes, 0) << label << ": codes differ from quantize_blocks_fp8 of the bf16 output";
  EXPECT_EQ(clobbered, 0) << label << ": bytes written outside the codes view";
  EXPECT_EQ(std::memcmp(got_s.data(), want_s.data(), got_s.nbytes()), 0) << label << ": scales differ";
}

}  // namespace vortex::test
