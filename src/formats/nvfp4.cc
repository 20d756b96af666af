#include "formats/nvfp4.h"

#include <string>

#include "core/dtype.h"
#include "core/parallel.h"

namespace vortex {

namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

Shape nvfp4_tiled_scale_shape(int64_t rows, int64_t block_cols) {
  return Shape{round_up(rows, 128), round_up(block_cols, 4)};
}

Result<Tensor> dequantize_nvfp4(const Tensor& packed, const Tensor& block_scales, Nvfp4ScaleLayout layout,
                                float tensor_scale, DType into) {
  if (into != DType::kF32 && into != DType::kBF16) {
    return invalid_argument(std::string("NVFP4 weights dequantize into F32 or BF16, not ") + dtype_name(into));
  }
  if (packed.dtype() != DType::kU8 || packed.rank() != 2) {
    return invalid_argument("an NVFP4 weight is U8 [O, I/2] (two e2m1 codes a byte), not " +
                            std::string(dtype_name(packed.dtype())) + " " + packed.shape().to_string());
  }
  const int64_t rows = packed.size(0), cols = 2 * packed.size(1);
  if (cols % kNvfp4BlockSize != 0) {
    return invalid_argument("an NVFP4 weight's rows hold whole blocks of 16 elements; " + std::to_string(cols) +
                            " elements a row (" + packed.shape().to_string() + " packed) do not");
  }
  const int64_t block_cols = cols / kNvfp4BlockSize;
  const Shape want = layout == Nvfp4ScaleLayout::kTiled ? nvfp4_tiled_scale_shape(rows, block_cols)
                                                        : Shape{rows, block_cols};
  if (block_scales.dtype() != DType::kF8E4M3 || block_scales.shape() != want) {
    return invalid_argument("the block scales are " + std::string(dtype_name(block_scales.dtype())) + " " +
                            block_scales.shape().to_string() + ", not F8_E4M3 " + want.to_string() + " (" +
                            (layout == Nvfp4ScaleLayout::kTiled ? "cuBLAS's tiled layout" : "row-major") + ")");
  }
  const Tensor codes = packed.contiguous();
  const Tensor scales = block_scales.contiguous();
  const auto* code_bytes = static_cast<const uint8_t*>(codes.data());
  const auto* scale_bytes = static_cast<const uint8_t*>(scales.data());
  float e2m1_of[16];
  for (int c = 0; c < 16; ++c) e2m1_of[c] = e2m1_code_to_f32(static_cast<uint8_t>(c));
  Tensor out = Tensor::empty({rows, cols}, into);
  parallel_for(0, rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < block_cols; ++b) {
        const int64_t at = layout == Nvfp4ScaleLayout::kTiled ? nvfp4_tiled_scale_index(r, b, block_cols)
                                                              : r * block_cols + b;
        const float scale = tensor_scale * e4m3_bits_to_f32(scale_bytes[at]);
        for (int64_t k = 0; k < kNvfp4BlockSize; ++k) {
          const int64_t i = b * kNvfp4BlockSize + k;
          const uint8_t byte = code_bytes[r * (cols / 2) + i / 2];
          const float v = e2m1_of[(i % 2 == 0) ? (byte & 0xF) : (byte >> 4)] * scale;
          if (into == DType::kF32) {
            out.data_as<float>()[r * cols + i] = v;
          } else {
            out.data_as<uint16_t>()[r * cols + i] = f32_to_bf16_bits(v);
          }
        }
      }
    }
  });
  return out;
}

}  // namespace vortex
