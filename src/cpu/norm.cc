#include "cpu/norm.h"

#include <cmath>

#include "core/parallel.h"
#include "cpu/rows.h"

namespace vortex::cpu {

Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y,
                RmsNormRounding rounding) {
  VORTEX_RETURN_IF_ERROR(check_activation(x, "rms_norm input"));
  VORTEX_RETURN_IF_ERROR(check_activation(y, "rms_norm output"));
  if (x.shape != y.shape || (x.rank() != 2 && x.rank() != 3)) {
    return invalid_argument("rms_norm: input " + x.shape.to_string() + " and output " + y.shape.to_string() +
                            " must match and be rank 2 or 3");
  }
  const int64_t c = x.shape[x.rank() - 1];
  if (weight && (weight->rank() != 1 || weight->shape[0] != c)) {
    return invalid_argument("rms_norm: weight " + weight->shape.to_string() + " does not match last dim " +
                            std::to_string(c));
  }
  const int64_t inner = x.rank() == 3 ? x.shape[1] : 1;
  const int64_t rows = x.shape[0] * inner;
  std::vector<float> w(c, 1.0f);
  if (weight) for (int64_t i = 0; i < c; ++i) w[i] = load_scalar(*weight, i);
  const DType out = y.dtype;
  parallel_for(0, rows, [&](int64_t begin, int64_t end) {
    std::vector<float> v(c);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r / inner, j = r % inner;
      const char* src = x.rank() == 3 ? row_ptr(x, i, j) : row_ptr(x, i);
      char* dst = y.rank() == 3 ? row_ptr(y, i, j) : row_ptr(y, i);
      load_row(src, x.dtype, c, v.data());
      double sum = 0.0;
      for (int64_t k = 0; k < c; ++k) sum += static_cast<double>(v[k]) * v[k];
      const float inv = 1.0f / std::sqrt(static_cast<float>(sum / c) + eps);
      if (rounding == RmsNormRounding::kOnce) {
        for (int64_t k = 0; k < c; ++k) v[k] = round_to(out, (v[k] * inv) * w[k]);
      } else {
        for (int64_t k = 0; k < c; ++k) v[k] = round_to(out, round_to(out, v[k] * inv) * w[k]);
      }
      store_row(v.data(), c, dst, out);
    }
  }, 16);
  return ok_status();
}

Status layer_norm(const TensorView& x, const TensorView& weight, const TensorView& bias, float eps,
                  const TensorView& y) {
  VORTEX_RETURN_IF_ERROR(check_activation(x, "layer_norm input"));
  VORTEX_RETURN_IF_ERROR(check_activation(y, "layer_norm output"));
  if (x.rank() != 2 || y.shape != x.shape) {
    return invalid_argument("layer_norm: input " + x.shape.to_string() + " and output " + y.shape.to_string() +
                            " must match and be rank 2");
  }
  const int64_t n = x.shape[0], c = x.shape[1];
  for (const TensorView* t : {&weight, &bias}) {
    if (t->rank() != 1 || t->shape[0] != c) {
      return invalid_argument("layer_norm: weight / bias " + t->shape.to_string() + " does not match last dim " +
                              std::to_string(c));
    }
  }
  std::vector<float> w(c), b(c);
  for (int64_t i = 0; i < c; ++i) {
    w[i] = load_scalar(weight, i);
    b[i] = load_scalar(bias, i);
  }
  const DType out = y.dtype;
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    std::vector<float> v(c);
    for (int64_t r = begin; r < end; ++r) {
      load_row(row_ptr(x, r), x.dtype, c, v.data());
      double sum = 0.0;
      for (int64_t k = 0; k < c; ++k) sum += v[k];
      const double mean = sum / static_cast<double>(c);
      double sq = 0.0;
      for (int64_t k = 0; k < c; ++k) sq += (v[k] - mean) * (v[k] - mean);
      const float rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(c) + eps));
      const float m = static_cast<float>(mean);
      for (int64_t k = 0; k < c; ++k) v[k] = round_to(out, (v[k] - m) * rstd * w[k] + b[k]);
      store_row(v.data(), c, row_ptr(y, r), out);
    }
  }, 16);
  return ok_status();
}

Status adaln_modulate(const TensorView& x, const TensorView& shift, const TensorView& scale,
                      const std::vector<int32_t>& row, const TensorView& y) {
  VORTEX_RETURN_IF_ERROR(check_activation(x, "adaln_modulate input"));
  VORTEX_RETURN_IF_ERROR(check_activation(y, "adaln_modulate output"));
  VORTEX_RETURN_IF_ERROR(check_activation(shift, "adaln_modulate shift"));
  VORTEX_RETURN_IF_ERROR(check_activation(scale, "adaln_modulate scale"));
  const int64_t n = x.shape[0], c = x.shape[1];
  if (x.rank() != 2 || x.shape != y.shape || shift.shape[1] != c || scale.shape[1] != c ||
      shift.shape[0] != scale.shape[0] || static_cast<int64_t>(row.size()) != n) {
    return invalid_argument("adaln_modulate: shapes x " + x.shape.to_string() + ", shift " + shift.shape.to_string() +
                            ", scale " + scale.shape.to_string() + ", " + std::to_string(row.size()) + " row indices");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] < 0 || row[i] >= shift.shape[0]) {
      return invalid_argument("adaln_modulate: row index " + std::to_string(row[i]) + " at row " + std::to_string(i) +
                              " outside the table of " + std::to_string(shift.shape[0]) + " rows");
    }
  }
  const DType out = y.dtype;
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    std::vector<float> v(c), sh(c), sc(c);
    for (int64_t i = begin; i < end; ++i) {
      load_row(row_ptr(x, i), x.dtype, c, v.data());
      load_row(row_ptr(shift, row[i]), shift.dtype, c, sh.data());
      load_row(row_ptr(scale, row[i]), scale.dtype, c, sc.data());
      for (int64_t k = 0; k < c; ++k) {
        v[k] = round_to(out, round_to(out, v[k] * round_to(out, 1.0f + sc[k])) + sh[k]);
      }
      store_row(v.data(), c, row_ptr(y, i), out);
    }
  }, 16);
  return ok_status();
}

}  // namespace vortex::cpu
