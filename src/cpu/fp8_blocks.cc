#include "cpu/fp8_blocks.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "cpu/fp8_scale.h"
#include "cpu/rows.h"

namespace vortex::cpu {

namespace {

int64_t blocks_of(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

Status check_codes(const TensorView& t, int64_t rows, int64_t cols, Device device, const std::string& what) {
  if (t.device != device) {
    return invalid_argument(what + (device == Device::kCpu ? ": CPU backend got a device tensor"
                                                           : ": CUDA backend got a host tensor"));
  }
  if (t.dtype != DType::kF8E4M3) return invalid_argument(what + ": dtype " + dtype_name(t.dtype) + " (expected F8_E4M3)");
  if (t.rank() != 2 || (rows >= 0 && t.shape[0] != rows) || (cols >= 0 && t.shape[1] != cols) || t.strides[1] != 1) {
    return invalid_argument(what + ": must be [" + (rows >= 0 ? std::to_string(rows) : std::string("N")) + ", " +
                            (cols >= 0 ? std::to_string(cols) : std::string("K")) +
                            "] with unit column stride, got " + t.shape.to_string() + " strides " +
                            t.strides.to_string());
  }
  if (t.data == nullptr && t.numel() > 0) return invalid_argument(what + ": null data pointer");
  return ok_status();
}

Status check_scales(const TensorView& t, const Shape& shape, Device device, const std::string& what) {
  if (t.device != device) {
    return invalid_argument(what + (device == Device::kCpu ? ": CPU backend got a device tensor"
                                                           : ": CUDA backend got a host tensor"));
  }
  if (t.dtype != DType::kF32) return invalid_argument(what + ": dtype " + dtype_name(t.dtype) + " (expected F32)");
  if (t.shape != shape || !t.is_contiguous()) {
    return invalid_argument(what + ": must be a contiguous " + shape.to_string() + ", got " + t.shape.to_string());
  }
  if (t.data == nullptr && t.numel() > 0) return invalid_argument(what + ": null data pointer");
  return ok_status();
}

Status check_block_width(int64_t cols, const std::string& what) {
  if (cols < 1 || cols % kFp8BlockCols != 0) {
    return invalid_argument(what + ": " + std::to_string(cols) + " columns, not a positive multiple of " +
                            std::to_string(kFp8BlockCols));
  }
  return ok_status();
}

}  // namespace

Fp8BlockScales fp8_block_scales(Fp8BlockLayout layout, int64_t rows, int64_t cols) {
  Fp8BlockScales s;
  s.col_blocks = cols / kFp8BlockCols;
  if (layout == Fp8BlockLayout::kTiles) {
    const int64_t padded_cols = (s.col_blocks + 3) / 4 * 4;
    s.block_rows = kFp8TileRows;
    s.row_blocks = blocks_of(rows, kFp8TileRows);
    s.row_block_stride = padded_cols;
    s.col_block_stride = 1;
    s.shape = Shape({s.row_blocks, padded_cols});
  } else {
    s.block_rows = 1;
    s.row_blocks = rows;
    s.row_block_stride = 1;
    s.col_block_stride = rows;
    s.shape = Shape({s.col_blocks, rows});
  }
  return s;
}

Status check_fp8_blocks_output(const TensorView& codes, const TensorView& scales, int64_t rows, int64_t cols,
                               Fp8BlockLayout layout, Device device, const std::string& op) {
  VORTEX_RETURN_IF_ERROR(check_codes(codes, rows, cols, device, op + " codes"));
  return check_scales(scales, fp8_block_scales(layout, rows, cols).shape, device, op + " scales");
}

Status quantize_blocks_fp8(const TensorView& x, Fp8BlockLayout layout, const TensorView& codes,
                           const TensorView& scales) {
  const std::string op = "quantize_blocks_fp8";
  VORTEX_RETURN_IF_ERROR(check_activation(x, "quantize_blocks_fp8 input"));
  if (x.rank() != 2) return invalid_argument(op + " input: must be 2-D, got " + x.shape.to_string());
  const int64_t n = x.shape[0], c = x.shape[1];
  VORTEX_RETURN_IF_ERROR(check_block_width(c, op + " input"));
  VORTEX_RETURN_IF_ERROR(check_fp8_blocks_output(codes, scales, n, c, layout, Device::kCpu, op));
  const Fp8BlockScales at = fp8_block_scales(layout, n, c);
  const int64_t block_rows = at.block_rows, col_blocks = at.col_blocks;
  float* scale_out = static_cast<float*>(scales.data);
  if (at.padded()) std::fill(scale_out, scale_out + at.shape.numel(), 0.0f);
  parallel_for(0, at.row_blocks, [&](int64_t begin, int64_t end) {
    std::vector<float> v(static_cast<size_t>(block_rows * c));
    std::vector<uint32_t> amax(static_cast<size_t>(col_blocks));
    std::vector<Fp8RowScale> s(static_cast<size_t>(col_blocks));
    for (int64_t rb = begin; rb < end; ++rb) {
      const int64_t r0 = rb * block_rows, rows = std::min(block_rows, n - r0);
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t i = 0; i < rows; ++i) {
        float* row = v.data() + i * c;
        load_row(row_ptr(x, r0 + i), x.dtype, c, row);
        for (int64_t k = 0; k < c; ++k) amax[k / kFp8BlockCols] = fp8_max_bits(amax[k / kFp8BlockCols], fp8_abs_bits(row[k]));
      }
      for (int64_t b = 0; b < col_blocks; ++b) {
        s[b] = fp8_row_scale(amax[b]);
        scale_out[rb * at.row_block_stride + b * at.col_block_stride] = s[b].scale;
      }
      for (int64_t i = 0; i < rows; ++i) {
        uint8_t* dst = static_cast<uint8_t*>(codes.data) + (r0 + i) * codes.strides[0];
        for (int64_t k = 0; k < c; ++k) dst[k] = fp8_quantize(v[i * c + k], s[k / kFp8BlockCols]);
      }
    }
  });
  return ok_status();
}

Result<Fp8Blocks> quantize_blocks_fp8(const TensorView& x, Fp8BlockLayout layout) {
  if (x.rank() != 2) return invalid_argument("quantize_blocks_fp8 input: must be 2-D, got " + x.shape.to_string());
  VORTEX_RETURN_IF_ERROR(check_block_width(x.shape[1], "quantize_blocks_fp8 input"));
  Fp8Blocks out{Tensor::empty(x.shape, DType::kF8E4M3),
                Tensor::empty(fp8_block_scales(layout, x.shape[0], x.shape[1]).shape, DType::kF32)};
  VORTEX_RETURN_IF_ERROR(quantize_blocks_fp8(x, layout, out.codes.view(), out.scales.view()));
  return out;
}

Status linear_fp8_blocks(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                         const TensorView* bias, const TensorView& y) {
  const std::string op = "linear_fp8_blocks";
  VORTEX_RETURN_IF_ERROR(check_codes(qa, -1, -1, Device::kCpu, op + " activation codes"));
  const int64_t m = qa.shape[0], k = qa.shape[1];
  VORTEX_RETURN_IF_ERROR(check_block_width(k, op + " activation codes"));
  VORTEX_RETURN_IF_ERROR(check_codes(qw, -1, k, Device::kCpu, op + " weight codes"));
  const int64_t n = qw.shape[0], kb = k / kFp8BlockCols;
  const Fp8BlockScales sa_at = fp8_block_scales(Fp8BlockLayout::kTiles, m, k);
  const Fp8BlockScales sw_at = fp8_block_scales(Fp8BlockLayout::kRows, n, k);
  VORTEX_RETURN_IF_ERROR(check_scales(sa, sa_at.shape, Device::kCpu, op + " activation scales"));
  VORTEX_RETURN_IF_ERROR(check_scales(sw, sw_at.shape, Device::kCpu, op + " weight scales"));
  VORTEX_RETURN_IF_ERROR(check_activation(y, "linear_fp8_blocks output"));
  if (y.rank() != 2 || y.shape[0] != m || y.shape[1] != n) {
    return invalid_argument(op + " output: must be [" + std::to_string(m) + ", " + std::to_string(n) + "], got " +
                            y.shape.to_string());
  }
  if (bias) {
    VORTEX_RETURN_IF_ERROR(check_activation(*bias, "linear_fp8_blocks bias"));
    if (bias->rank() != 1 || bias->shape[0] != n) {
      return invalid_argument(op + " bias: must be [" + std::to_string(n) + "], got " + bias->shape.to_string());
    }
  }
  std::vector<float> w(static_cast<size_t>(n * k)), b(static_cast<size_t>(n), 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* src = static_cast<const uint8_t*>(qw.data) + j * qw.strides[0];
    for (int64_t i = 0; i < k; ++i) w[j * k + i] = e4m3_bits_to_f32(src[i]);
    if (bias) b[j] = load_scalar(*bias, j);
  }
  const float* sa_v = static_cast<const float*>(sa.data);
  const float* sw_v = static_cast<const float*>(sw.data);
  const DType out = y.dtype;
  parallel_for(0, m, [&](int64_t begin, int64_t end) {
    std::vector<float> a(static_cast<size_t>(k)), row(static_cast<size_t>(n));
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* src = static_cast<const uint8_t*>(qa.data) + r * qa.strides[0];
      for (int64_t i = 0; i < k; ++i) a[i] = e4m3_bits_to_f32(src[i]);
      const float* sa_r = sa_v + (r / kFp8TileRows) * sa_at.row_block_stride;
      for (int64_t j = 0; j < n; ++j) {
        const float* wj = w.data() + j * k;
        double acc = 0.0;
        for (int64_t blk = 0; blk < kb; ++blk) {
          double partial = 0.0;  // exact: at most 128 exact fp32 products of e4m3 values
          for (int64_t i = blk * kFp8BlockCols; i < (blk + 1) * kFp8BlockCols; ++i) {
            partial += static_cast<double>(a[i] * wj[i]);
          }
          acc += partial * static_cast<double>(sa_r[blk]) * static_cast<double>(sw_v[blk * sw_at.col_block_stride + j]);
        }
        const float scaled = static_cast<float>(acc);
        row[j] = round_to(out, bias ? scaled + b[j] : scaled);
      }
      store_row(row.data(), n, row_ptr(y, r), out);
    }
  });
  return ok_status();
}

}  // namespace vortex::cpu
