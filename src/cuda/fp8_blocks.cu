// Block-scaled e4m3 quantizer (contract: cuda/fp8_blocks.h; rule: cpu/fp8_scale.h).
//
// One CTA of 256 threads per block of block_rows (128 or 1) rows × 128 columns: thread t takes the 8 columns
// from 8·(t % 16) of rows t / 16, t / 16 + 16, ... of the block. Pass 1 takes the amax by bits
// (fp8_amax.cuh) and reduces it over the CTA; pass 2 re-reads the
// block (it is L1/L2-resident: 32 KB for a bf16 128 × 128 tile) and writes the codes with the
// hardware conversion, which equals f32_to_e4m3_bits on every finite input; a non-finite block
// writes kE4m3NanCode everywhere, as cpu::quantize_blocks_fp8 does.
#include "cuda/fp8_blocks.h"

#include <string>

#include "cpu/fp8_blocks.h"
#include "cpu/fp8_scale.h"
#include "cuda/fp8_amax.cuh"
#include "cuda/row_io.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

using detail::Operand;

constexpr int kThreads = 256;
constexpr int kColumnGroups = cpu::kFp8BlockCols / detail::kVec;  // 16 groups of 8 columns
constexpr int kRowSlots = kThreads / kColumnGroups;                // rows a CTA covers per step

// kVector: 16-byte loads of 8 elements (x 16-byte aligned with 16-byte row strides), else scalar.
template <bool kVector>
__device__ __forceinline__ void load8(const Operand& x, int64_t row, int64_t col, float (&v)[8]) {
  const char* p = detail::row_ptr(x, row);
  if constexpr (kVector) {
    detail::load_vec<8>(p, x.bf16, col, v);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float one[1];
      detail::load_vec<1>(p, x.bf16, col + i, one);
      v[i] = one[0];
    }
  }
}

template <bool kVector>
__global__ void __launch_bounds__(kThreads) quantize_blocks_fp8_kernel(Operand x, int64_t rows, int64_t block_rows,
                                                                      uint8_t* codes, int64_t code_stride,
                                                                      bool code_words, float* scales,
                                                                      int64_t row_block_stride,
                                                                      int64_t col_block_stride) {
  __shared__ uint32_t warp_max[kThreads / 32];
  const int64_t col_block = blockIdx.x, row_block = blockIdx.y;
  const int group = static_cast<int>(threadIdx.x) % kColumnGroups, slot = static_cast<int>(threadIdx.x) / kColumnGroups;
  const int64_t r0 = row_block * block_rows, r1 = min(rows, r0 + block_rows);
  const int64_t col = col_block * cpu::kFp8BlockCols + detail::kVec * group;
  uint32_t amax = 0;
  for (int64_t r = r0 + slot; r < r1; r += kRowSlots) {
    float v[8];
    load8<kVector>(x, r, col, v);
    amax = detail::amax_bits<8>(v, amax);
  }
  const Fp8RowScale s = fp8_row_scale(detail::team_max(amax, kThreads, warp_max));
  if (threadIdx.x == 0) scales[row_block * row_block_stride + col_block * col_block_stride] = s.scale;
  for (int64_t r = r0 + slot; r < r1; r += kRowSlots) {
    float v[8];
    load8<kVector>(x, r, col, v);
    uint32_t pairs[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      pairs[i] = s.finite ? detail::e4m3x2_bits(fp8_mul_rn(v[2 * i], s.inv), fp8_mul_rn(v[2 * i + 1], s.inv))
                          : kE4m3NanCode * 0x0101u;
    }
    uint8_t* dst = codes + r * code_stride + col;
    if (code_words) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(pairs[0] | (pairs[1] << 16), pairs[2] | (pairs[3] << 16));
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) dst[i] = static_cast<uint8_t>(pairs[i / 2] >> (8 * (i % 2)));
    }
  }
}

}  // namespace

Status quantize_blocks_fp8(const TensorView& x, cpu::Fp8BlockLayout layout, const TensorView& codes,
                           const TensorView& scales, cudaStream_t stream) {
  const std::string op = "quantize_blocks_fp8";
  VORTEX_RETURN_IF_ERROR(detail::check_device_activation(x, "quantize_blocks_fp8 input"));
  if (x.rank() != 2) return invalid_argument(op + " input: must be 2-D, got " + x.shape.to_string());
  const int64_t n = x.shape[0], c = x.shape[1];
  if (c < 1 || c % cpu::kFp8BlockCols != 0) {
    return invalid_argument(op + " input: " + std::to_string(c) + " columns, not a positive multiple of " +
                            std::to_string(cpu::kFp8BlockCols));
  }
  VORTEX_RETURN_IF_ERROR(cpu::check_fp8_blocks_output(codes, scales, n, c, layout, Device::kCuda, op));
  if (n == 0) return ok_status();
  const cpu::Fp8BlockScales at = cpu::fp8_block_scales(layout, n, c);
  if (at.row_blocks > 65535) {
    return invalid_argument(op + " input: " + std::to_string(at.row_blocks) + " blocks of rows exceed the grid's 65535");
  }
  float* scale_ptr = static_cast<float*>(scales.data);
  if (layout == cpu::Fp8BlockLayout::kTiles) VORTEX_RETURN_IF_ERROR(zero_block_scale_padding(scales, n, c, stream));
  const bool code_words = reinterpret_cast<uintptr_t>(codes.data) % 8 == 0 && (n <= 1 || codes.strides[0] % 8 == 0);
  const dim3 grid(static_cast<unsigned>(at.col_blocks), static_cast<unsigned>(at.row_blocks));
  const Operand xo = detail::make_operand(x);
  uint8_t* code_ptr = static_cast<uint8_t*>(codes.data);
  if (detail::vec_aligned(x)) {
    quantize_blocks_fp8_kernel<true><<<grid, kThreads, 0, stream>>>(xo, n, at.block_rows, code_ptr, codes.strides[0],
                                                                     code_words, scale_ptr, at.row_block_stride,
                                                                     at.col_block_stride);
  } else {
    quantize_blocks_fp8_kernel<false><<<grid, kThreads, 0, stream>>>(xo, n, at.block_rows, code_ptr, codes.strides[0],
                                                                      code_words, scale_ptr, at.row_block_stride,
                                                                      at.col_block_stride);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

Status zero_block_scale_padding(const TensorView& scales, int64_t rows, int64_t cols, cudaStream_t stream) {
  const cpu::Fp8BlockScales at = cpu::fp8_block_scales(cpu::Fp8BlockLayout::kTiles, rows, cols);
  if (!at.padded() || at.row_blocks == 0) return ok_status();
  const int64_t used = at.col_blocks, stride = at.row_block_stride;
  VORTEX_CUDA_CHECK(cudaMemset2DAsync(static_cast<float*>(scales.data) + used, sizeof(float) * stride, 0,
                                      sizeof(float) * (stride - used), at.row_blocks, stream));
  return ok_status();
}

}  // namespace vortex::cuda
