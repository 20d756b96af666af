// GGUF quantized weights dequantized on the device (dequantize_ggml_weight in dequantize_weights.h).
//
// One thread per output value: it finds its value's block and the bytes inside it that hold the
// code, the scale and the min, and repeats the host's arithmetic (formats/gguf.cc) product by
// product with __fmul_rn / __fadd_rn / __fsub_rn, so that no multiply-add is fused and every
// value has the host's fp32 bits. A block's few header bytes are read by all its threads from L1;
// the writes are coalesced, and the upload before this kernel is what a load waits on.
#include <string>

#include "core/dtype.h"
#include "cuda/dequantize_weights.h"
#include "cuda/runtime.h"
#include "formats/gguf.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return f16_bits_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

// Value e of one block (Q4_0 ... Q8_0: 32 values; k-quants: 256), as formats/gguf.cc computes it.
template <uint32_t kType>
__device__ __forceinline__ float block_value(const uint8_t* b, int e) {
  if constexpr (kType == kGgmlQ4_0 || kType == kGgmlQ4_1) {
    const bool with_min = kType == kGgmlQ4_1;
    const uint8_t byte = b[(with_min ? 4 : 2) + (e & 15)];
    const int q = e < 16 ? (byte & 0xF) : (byte >> 4);
    if (with_min) return __fadd_rn(__fmul_rn(static_cast<float>(q), half_at(b)), half_at(b + 2));
    return __fmul_rn(static_cast<float>(q - 8), half_at(b));
  } else if constexpr (kType == kGgmlQ5_0 || kType == kGgmlQ5_1) {
    // The fifth bit of value e is bit e of the 32-bit qh.
    const bool with_min = kType == kGgmlQ5_1;
    const uint8_t* qh = b + (with_min ? 4 : 2);
    const uint8_t byte = qh[4 + (e & 15)];
    const int q = (e < 16 ? (byte & 0xF) : (byte >> 4)) | (((qh[e >> 3] >> (e & 7)) & 1) << 4);
    if (with_min) return __fadd_rn(__fmul_rn(static_cast<float>(q), half_at(b)), half_at(b + 2));
    return __fmul_rn(static_cast<float>(q - 16), half_at(b));
  } else if constexpr (kType == kGgmlQ8_0) {
    return __fmul_rn(static_cast<float>(static_cast<int8_t>(b[2 + e])), half_at(b));
  } else if constexpr (kType == kGgmlQ2_K || kType == kGgmlQ3_K) {
    // Two halves of 128; in each, four bit-pair shifts of 32, each two runs of 16 with one scale.
    const int n = e >> 7, shift = ((e & 127) >> 5) * 2, run = (e >> 4) & 1, l = e & 15;
    const int group = n * 8 + shift + run;
    if constexpr (kType == kGgmlQ2_K) {
      const uint8_t sc = b[group];
      const int q = (b[16 + n * 32 + l + 16 * run] >> shift) & 3;
      const float dl = __fmul_rn(half_at(b + 80), static_cast<float>(sc & 0xF));
      const float ml = __fmul_rn(half_at(b + 82), static_cast<float>(sc >> 4));
      return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
    } else {
      const uint8_t* s = b + 96;
      const int low = group < 8 ? (s[group] & 0xF) : (s[group - 8] >> 4);
      const int high = (s[8 + group % 4] >> (2 * (group / 4))) & 3;
      const int scale = (low | (high << 4)) - 32;
      const int at = l + 16 * run;
      const int hbit = n * 4 + shift / 2;
      const int q = ((b[32 + n * 32 + at] >> shift) & 3) - (((b[at] >> hbit) & 1) ? 0 : 4);
      return __fmul_rn(__fmul_rn(half_at(b + 108), static_cast<float>(scale)), static_cast<float>(q));
    }
  } else if constexpr (kType == kGgmlQ4_K || kType == kGgmlQ5_K) {
    // Four chunks of 64: the low nibbles of 32 bytes with scale 2c, then their high nibbles with 2c + 1.
    const bool five_bits = kType == kGgmlQ5_K;
    const int c = e >> 6, upper = (e >> 5) & 1, l = e & 31;
    const uint8_t* scales = b + 4;
    const int j = 2 * c + upper;
    int sc, m;
    if (j < 4) {
      sc = scales[j] & 63;
      m = scales[j + 4] & 63;
    } else {
      sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
      m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
    const uint8_t byte = b[(five_bits ? 48 : 16) + c * 32 + l];
    int q = upper ? (byte >> 4) : (byte & 0xF);
    if (five_bits && ((b[16 + l] >> j) & 1)) q += 16;
    const float d = __fmul_rn(half_at(b), static_cast<float>(sc));
    const float dm = __fmul_rn(half_at(b + 2), static_cast<float>(m));
    return __fsub_rn(__fmul_rn(d, static_cast<float>(q)), dm);
  } else {
    static_assert(kType == kGgmlQ6_K);
    // Two halves of 128, each four quarters of 32: quarter p takes the low (p < 2) or high nibble of
    // ql[l + 32 · (p & 1)] and bits 2p, 2p + 1 of qh[l].
    const int n = e >> 7, p = (e & 127) >> 5, l = e & 31;
    const uint8_t ql = b[n * 64 + l + 32 * (p & 1)];
    const int nibble = p >= 2 ? (ql >> 4) : (ql & 0xF);
    const int q = (nibble | (((b[128 + n * 32 + l] >> (2 * p)) & 3) << 4)) - 32;
    const auto sc = static_cast<int8_t>(b[192 + n * 8 + l / 16 + 2 * p]);
    return __fmul_rn(__fmul_rn(half_at(b + 208), static_cast<float>(sc)), static_cast<float>(q));
  }
}

template <uint32_t kType>
__global__ void ggml_kernel(const uint8_t* blocks, int64_t n, void* out, bool bf16) {
  constexpr int kValues = kType == kGgmlQ4_0 || kType == kGgmlQ4_1 || kType == kGgmlQ5_0 || kType == kGgmlQ5_1 ||
                                  kType == kGgmlQ8_0
                              ? 32
                              : 256;
  constexpr int kBytes = kType == kGgmlQ4_0   ? 18
                         : kType == kGgmlQ4_1 ? 20
                         : kType == kGgmlQ5_0 ? 22
                         : kType == kGgmlQ5_1 ? 24
                         : kType == kGgmlQ8_0 ? 34
                         : kType == kGgmlQ2_K ? 84
                         : kType == kGgmlQ3_K ? 110
                         : kType == kGgmlQ4_K ? 144
                         : kType == kGgmlQ5_K ? 176
                                              : 210;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = block_value<kType>(blocks + (i / kValues) * kBytes, static_cast<int>(i % kValues));
    if (bf16) {
      static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

template <uint32_t kType>
void launch(const uint8_t* blocks, int64_t n, void* out, bool bf16, cudaStream_t stream) {
  const int64_t ctas = (n + kThreads - 1) / kThreads;
  // Enough CTAs to fill the device several times over; the loop covers the rest.
  const int grid = static_cast<int>(ctas < 132 * 16 ? ctas : 132 * 16);
  ggml_kernel<kType><<<grid, kThreads, 0, stream>>>(blocks, n, out, bf16);
}

}  // namespace

Status dequantize_ggml_weight(const Tensor& blocks, uint32_t type, const Tensor& out, cudaStream_t stream) {
  if (!ggml_type_supported(type) || ggml_type_is_float(type)) {
    return invalid_argument("dequantize_ggml_weight: " + ggml_type_name(type) +
                            " is not a quantized type dequantized here (Q4_0 ... Q8_0, Q2_K ... Q6_K)");
  }
  const int64_t block_bytes = ggml_block_bytes(type);
  if (blocks.device() != Device::kCuda || !blocks.is_contiguous() || blocks.dtype() != DType::kU8 ||
      blocks.rank() != 2 || blocks.size(1) % block_bytes != 0) {
    return invalid_argument("dequantize_ggml_weight: blocks must be contiguous device U8 [rows, a multiple of " +
                            std::to_string(block_bytes) + " (" + ggml_type_name(type) + ")], not " + blocks.describe());
  }
  const Shape shape{blocks.size(0), ggml_row_values(type, blocks.size(1))};
  if (out.device() != Device::kCuda || !out.is_contiguous() || out.shape() != shape ||
      (out.dtype() != DType::kF32 && out.dtype() != DType::kBF16)) {
    return invalid_argument("dequantize_ggml_weight: the output must be a contiguous device F32 or BF16 " +
                            shape.to_string() + ", not " + out.describe());
  }
  const int64_t n = shape.numel();
  if (n == 0) return ok_status();
  const auto* data = static_cast<const uint8_t*>(blocks.data());
  const bool bf16 = out.dtype() == DType::kBF16;
  switch (type) {
    case kGgmlQ4_0: launch<kGgmlQ4_0>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ4_1: launch<kGgmlQ4_1>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ5_0: launch<kGgmlQ5_0>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ5_1: launch<kGgmlQ5_1>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ8_0: launch<kGgmlQ8_0>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ2_K: launch<kGgmlQ2_K>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ3_K: launch<kGgmlQ3_K>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ4_K: launch<kGgmlQ4_K>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ5_K: launch<kGgmlQ5_K>(data, n, out.data(), bf16, stream); break;
    case kGgmlQ6_K: launch<kGgmlQ6_K>(data, n, out.data(), bf16, stream); break;
  }
  VORTEX_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

}  // namespace vortex::cuda
