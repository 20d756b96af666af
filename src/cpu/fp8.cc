#include "cpu/fp8.h"

#include <array>
#include <cstring>

#include "core/dtype.h"
#include "core/parallel.h"
#include "cpu/elementwise.h"
#include "cpu/fp8_scale.h"
#include "cpu/norm.h"
#include "cpu/rows.h"

namespace vortex::cpu {

namespace {

// Every e4m3 code's value, so the linear's inner loop is a table lookup.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_bits_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

Status check_matrix(const TensorView& t, const std::string& what) {
  if (t.rank() != 2) return invalid_argument(what + ": must be 2-D, got " + t.shape.to_string());
  return ok_status();
}

Status check_codes_input(const TensorView& t, const std::string& what) {
  if (t.device != Device::kCpu) return invalid_argument(what + ": CPU backend got a device tensor");
  if (t.dtype != DType::kF8E4M3) {
    return invalid_argument(what + ": dtype " + dtype_name(t.dtype) + " (expected F8_E4M3)");
  }
  if (t.rank() != 2 || t.strides[1] != 1) {
    return invalid_argument(what + ": must be 2-D with unit column stride, got " + t.shape.to_string() +
                            " strides " + t.strides.to_string());
  }
  return ok_status();
}

Status check_scale_vector(const TensorView& t, int64_t n, const std::string& what) {
  if (t.device != Device::kCpu) return invalid_argument(what + ": CPU backend got a device tensor");
  if (t.dtype != DType::kF32) return invalid_argument(what + ": dtype " + dtype_name(t.dtype) + " (expected F32)");
  if (t.rank() != 1 || t.shape[0] != n || t.strides[0] != 1) {
    return invalid_argument(what + ": must be [" + std::to_string(n) + "] with unit stride, got " +
                            t.shape.to_string());
  }
  return ok_status();
}

}  // namespace

Status check_fp8_rows_output(const TensorView& codes, const TensorView& scales, int64_t rows, int64_t cols,
                             Device device, const std::string& op) {
  const std::string where =
      device == Device::kCpu ? "CPU backend got a device tensor" : "CUDA backend got a host tensor";
  if (codes.device != device) return invalid_argument(op + " codes: " + where);
  if (codes.dtype != DType::kF8E4M3) {
    return invalid_argument(op + " codes: dtype " + dtype_name(codes.dtype) + " (expected F8_E4M3)");
  }
  if (codes.rank() != 2 || codes.shape[0] != rows || codes.shape[1] != cols || codes.strides[1] != 1 ||
      codes.strides[0] < cols) {
    return invalid_argument(op + " codes: must be [" + std::to_string(rows) + ", " + std::to_string(cols) +
                            "] with unit column stride, got " + codes.shape.to_string() + " strides " +
                            codes.strides.to_string());
  }
  if (codes.data == nullptr && rows > 0) return invalid_argument(op + " codes: null data pointer");
  if (scales.device != device) return invalid_argument(op + " scales: " + where);
  if (scales.dtype != DType::kF32) {
    return invalid_argument(op + " scales: dtype " + dtype_name(scales.dtype) + " (expected F32)");
  }
  if (scales.rank() != 1 || scales.shape[0] != rows || scales.strides[0] != 1) {
    return invalid_argument(op + " scales: must be [" + std::to_string(rows) + "] with unit stride, got " +
                            scales.shape.to_string());
  }
  if (scales.data == nullptr && rows > 0) return invalid_argument(op + " scales: null data pointer");
  return ok_status();
}

Status quantize_rows_fp8(const TensorView& x, const TensorView& codes, const TensorView& scales) {
  VORTEX_RETURN_IF_ERROR(check_activation(x, "quantize_rows_fp8 input"));
  VORTEX_RETURN_IF_ERROR(check_matrix(x, "quantize_rows_fp8 input"));
  const int64_t n = x.shape[0], c = x.shape[1];
  if (c < 1) return invalid_argument("quantize_rows_fp8 input: rows must have at least one column");
  VORTEX_RETURN_IF_ERROR(check_fp8_rows_output(codes, scales, n, c, Device::kCpu, "quantize_rows_fp8"));
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    std::vector<float> v(c);
    for (int64_t r = begin; r < end; ++r) {
      load_row(row_ptr(x, r), x.dtype, c, v.data());
      uint32_t amax = 0;
      for (int64_t k = 0; k < c; ++k) amax = fp8_max_bits(amax, fp8_abs_bits(v[k]));
      const Fp8RowScale s = fp8_row_scale(amax);
      uint8_t* dst = static_cast<uint8_t*>(codes.data) + r * codes.strides[0];
      for (int64_t k = 0; k < c; ++k) dst[k] = fp8_quantize(v[k], s);
      static_cast<float*>(scales.data)[r] = s.scale;
    }
  }, 16);
  return ok_status();
}

Result<Fp8Rows> quantize_rows_fp8(const TensorView& x) {
  VORTEX_RETURN_IF_ERROR(check_matrix(x, "quantize_rows_fp8 input"));
  Fp8Rows out{Tensor::empty(x.shape, DType::kF8E4M3), Tensor::empty({x.shape[0]}, DType::kF32)};
  VORTEX_RETURN_IF_ERROR(quantize_rows_fp8(x, out.codes.view(), out.scales.view()));
  return out;
}

Result<Fp8Rows> quantize_weight_fp8(const TensorView& w) {
  VORTEX_RETURN_IF_ERROR(check_matrix(w, "quantize_weight_fp8 weight"));
  Result<Fp8Rows> out = quantize_rows_fp8(w);
  if (!out.ok()) return out.status().with_context("quantize_weight_fp8 weight");
  return out;
}

Status rms_norm_fused_quantize_fp8(const TensorView& x, const TensorView* weight, float eps,
                                   const Fp8NormFusion& fusion, const TensorView& codes, const TensorView& scales) {
  const std::string op = "rms_norm_fused_quantize_fp8";
  VORTEX_RETURN_IF_ERROR(check_activation(x, "rms_norm_fused_quantize_fp8 input"));
  VORTEX_RETURN_IF_ERROR(check_matrix(x, op + " input"));
  VORTEX_RETURN_IF_ERROR(check_fp8_rows_output(codes, scales, x.shape[0], x.shape[1], Device::kCpu, op));
  if (fusion.gate && (!fusion.branch || !fusion.gate_row)) {
    return invalid_argument(op + " gate: needs a residual branch and gate row indices");
  }
  if (static_cast<bool>(fusion.shift) != static_cast<bool>(fusion.scale) || (fusion.shift && !fusion.mod_row)) {
    return invalid_argument(op + " shift: modulation needs shift, scale and row indices together");
  }
  const int64_t n = x.shape[0], c = x.shape[1];
  // The residual goes into a copy of x that replaces x only once every step has succeeded, so a
  // refused call leaves x as it was.
  Tensor updated = Tensor::empty({n, c}, x.dtype);
  const size_t row_bytes = static_cast<size_t>(c) * dtype_size(x.dtype);
  for (int64_t r = 0; r < n; ++r) std::memcpy(row_ptr(updated.view(), r), row_ptr(x, r), row_bytes);
  if (fusion.branch) {
    VORTEX_RETURN_IF_ERROR(fusion.gate
                               ? gated_residual(updated.view(), *fusion.gate, *fusion.gate_row, *fusion.branch)
                               : residual_add(updated.view(), *fusion.branch));
  }
  Tensor h = Tensor::empty({n, c}, DType::kBF16);
  VORTEX_RETURN_IF_ERROR(rms_norm(updated.view(), weight, eps, h.view()));
  if (fusion.shift) {
    VORTEX_RETURN_IF_ERROR(adaln_modulate(h.view(), *fusion.shift, *fusion.scale, *fusion.mod_row, h.view()));
  }
  VORTEX_RETURN_IF_ERROR(quantize_rows_fp8(h.view(), codes, scales));
  for (int64_t r = 0; r < n; ++r) std::memcpy(row_ptr(x, r), row_ptr(updated.view(), r), row_bytes);
  return ok_status();
}

Status swiglu_quantize_fp8(const TensorView& u, const TensorView& codes, const TensorView& scales) {
  VORTEX_RETURN_IF_ERROR(check_activation(u, "swiglu_quantize_fp8 input"));
  if (u.rank() != 2 || u.shape[1] % 2 != 0) {
    return invalid_argument("swiglu_quantize_fp8 input: must be [N, 2F], got " + u.shape.to_string());
  }
  const int64_t n = u.shape[0], f = u.shape[1] / 2;
  VORTEX_RETURN_IF_ERROR(check_fp8_rows_output(codes, scales, n, f, Device::kCpu, "swiglu_quantize_fp8"));
  Tensor h = Tensor::empty({n, f}, DType::kBF16);
  VORTEX_RETURN_IF_ERROR(swiglu(u, h.view()));
  return quantize_rows_fp8(h.view(), codes, scales);
}

Status linear_fp8(const TensorView& qa, const TensorView& sa, const TensorView& qw, const TensorView& sw,
                  const TensorView* bias, const TensorView& y) {
  VORTEX_RETURN_IF_ERROR(check_codes_input(qa, "linear_fp8 activation codes"));
  VORTEX_RETURN_IF_ERROR(check_codes_input(qw, "linear_fp8 weight codes"));
  const int64_t m = qa.shape[0], k = qa.shape[1], n = qw.shape[0];
  if (qw.shape[1] != k) {
    return invalid_argument("linear_fp8 weight codes: " + qw.shape.to_string() + " does not match activation codes " +
                            qa.shape.to_string() + " in K");
  }
  VORTEX_RETURN_IF_ERROR(check_scale_vector(sa, m, "linear_fp8 activation scales"));
  VORTEX_RETURN_IF_ERROR(check_scale_vector(sw, n, "linear_fp8 weight scales"));
  VORTEX_RETURN_IF_ERROR(check_activation(y, "linear_fp8 output"));
  if (y.rank() != 2 || y.shape[0] != m || y.shape[1] != n) {
    return invalid_argument("linear_fp8 output: must be [" + std::to_string(m) + ", " + std::to_string(n) + "], got " +
                            y.shape.to_string());
  }
  if (bias) {
    VORTEX_RETURN_IF_ERROR(check_activation(*bias, "linear_fp8 bias"));
    if (bias->rank() != 1 || bias->shape[0] != n) {
      return invalid_argument("linear_fp8 bias: must be [" + std::to_string(n) + "], got " + bias->shape.to_string());
    }
  }
  const std::array<float, 256>& value = e4m3_values();
  std::vector<float> w(static_cast<size_t>(n * k)), sw_v(n), b(n, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* src = static_cast<const uint8_t*>(qw.data) + j * qw.strides[0];
    for (int64_t i = 0; i < k; ++i) w[j * k + i] = value[src[i]];
    sw_v[j] = static_cast<const float*>(sw.data)[j];
    if (bias) b[j] = load_scalar(*bias, j);
  }
  const DType out = y.dtype;
  parallel_for(0, m, [&](int64_t begin, int64_t end) {
    std::vector<float> a(k), row(n);
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* src = static_cast<const uint8_t*>(qa.data) + r * qa.strides[0];
      for (int64_t i = 0; i < k; ++i) a[i] = value[src[i]];
      const float sa_r = static_cast<const float*>(sa.data)[r];
      for (int64_t j = 0; j < n; ++j) {
        const float* wj = w.data() + j * k;
        double acc = 0.0;
        for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(a[i] * wj[i]);  // the product is exact in fp32
        const float scaled = (static_cast<float>(acc) * sa_r) * sw_v[j];
        row[j] = round_to(out, bias ? scaled + b[j] : scaled);
      }
      store_row(row.data(), n, row_ptr(y, r), out);
    }
  });
  return ok_status();
}

}  // namespace vortex::cpu
