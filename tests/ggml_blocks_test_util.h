// Random GGUF quantized blocks for the tests (CPU: test_quantized_layout.cc; GPU:
// test_gpu_dequantize_weights.cc): every code byte random, the f16 scales and mins random but finite
// (NaN payloads need not survive the host's and the device's multiplies alike; no file holds them).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "formats/gguf.h"
#include "vortex/tensor.h"

namespace vortex::test_util {

// U8 [rows, cols / block values · block bytes]: `rows` rows of `cols` values (whole blocks) of `type`.
inline Tensor random_ggml_blocks(uint32_t type, int64_t rows, int64_t cols, uint64_t seed) {
  const int64_t block_bytes = ggml_block_bytes(type), blocks_per_row = cols / ggml_block_values(type);
  Tensor t = Tensor::empty({rows, blocks_per_row * block_bytes}, DType::kU8);
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) bytes[i] = static_cast<uint8_t>(philox_block(seed, 1, static_cast<uint64_t>(i)).v[0]);
  for (int64_t b = 0; b < rows * blocks_per_row; ++b) {
    for (const int field : ggml_f16_fields(type)) {
      // Within [2^-14, 2^1) in magnitude (subnormals too, for small codes), either sign.
      const uint32_t r = philox_block(seed, 2, static_cast<uint64_t>(b * 4 + field)).v[0];
      const float v = std::ldexp(1.0f + static_cast<float>(r & 0x3FF) / 1024.0f, static_cast<int>((r >> 10) % 16) - 15);
      const uint16_t h = static_cast<uint16_t>(f32_to_f16_bits((r >> 20) & 1 ? -v : v));
      bytes[b * block_bytes + field] = static_cast<uint8_t>(h & 0xFF);
      bytes[b * block_bytes + field + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  return t;
}

// The quantized types formats/gguf.h dequantizes.
inline std::vector<uint32_t> ggml_quantized_types() {
  return {kGgmlQ4_0, kGgmlQ4_1, kGgmlQ5_0, kGgmlQ5_1, kGgmlQ8_0, kGgmlQ2_K, kGgmlQ3_K, kGgmlQ4_K, kGgmlQ5_K, kGgmlQ6_K};
}

}  // namespace vortex::test_util
