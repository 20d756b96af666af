#include "cpu/elementwise.h"

#include <cmath>

#include "core/parallel.h"
#include "core/portable_math.h"
#include "cpu/rows.h"

namespace vortex::cpu {

namespace {
float silu(float g) { return g / (1.0f + portable_expf(-g)); }
}  // namespace

Status swiglu(const TensorView& u, const TensorView& y) {
  VORTEX_RETURN_IF_ERROR(check_activation(u, "swiglu input"));
  VORTEX_RETURN_IF_ERROR(check_activation(y, "swiglu output"));
  if (u.rank() != 2 || y.rank() != 2 || u.shape[0] != y.shape[0] || u.shape[1] != 2 * y.shape[1]) {
    return invalid_argument("swiglu: input " + u.shape.to_string() + " must be [N, 2F] for output " +
                            y.shape.to_string());
  }
  const int64_t n = y.shape[0], f = y.shape[1];
  const DType out = y.dtype;
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    std::vector<float> v(2 * f), r(f);
    for (int64_t i = begin; i < end; ++i) {
      load_row(row_ptr(u, i), u.dtype, 2 * f, v.data());
      for (int64_t k = 0; k < f; ++k) r[k] = round_to(out, v[k] * round_to(out, silu(v[f + k])));
      store_row(r.data(), f, row_ptr(y, i), out);
    }
  }, 16);
  return ok_status();
}

Status gelu(const TensorView& x, const TensorView& y, GeluApproximation approximation) {
  VORTEX_RETURN_IF_ERROR(check_activation(x, "gelu input"));
  VORTEX_RETURN_IF_ERROR(check_activation(y, "gelu output"));
  if (x.rank() != 2 || y.shape != x.shape) {
    return invalid_argument("gelu: input " + x.shape.to_string() + " and output " + y.shape.to_string() +
                            " must match and be rank 2");
  }
  constexpr double kSqrtTwoOverPi = 0.79788456080286536, kInvSqrtTwo = 0.70710678118654752;
  const int64_t n = x.shape[0], c = x.shape[1];
  const DType out = y.dtype;
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    std::vector<float> v(c);
    for (int64_t i = begin; i < end; ++i) {
      load_row(row_ptr(x, i), x.dtype, c, v.data());
      for (int64_t k = 0; k < c; ++k) {
        const double a = v[k];
        const double f = approximation == GeluApproximation::kTanh
                             ? portable_tanh(kSqrtTwoOverPi * (a + 0.044715 * a * a * a))
                             : portable_erf(a * kInvSqrtTwo);
        v[k] = round_to(out, static_cast<float>(0.5 * a * (1.0 + f)));
      }
      store_row(v.data(), c, row_ptr(y, i), out);
    }
  }, 16);
  return ok_status();
}

Status gated_residual(const TensorView& x, const TensorView& gate, const std::vector<int32_t>& row,
                      const TensorView& branch) {
  VORTEX_RETURN_IF_ERROR(check_activation(x, "gated_residual residual"));
  VORTEX_RETURN_IF_ERROR(check_activation(gate, "gated_residual gate"));
  VORTEX_RETURN_IF_ERROR(check_activation(branch, "gated_residual branch"));
  const int64_t n = x.shape[0], c = x.shape[1];
  if (x.rank() != 2 || branch.shape != x.shape || gate.shape[1] != c || static_cast<int64_t>(row.size()) != n) {
    return invalid_argument("gated_residual: shapes residual " + x.shape.to_string() + ", gate " +
                            gate.shape.to_string() + ", branch " + branch.shape.to_string());
  }
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] < 0 || row[i] >= gate.shape[0]) return invalid_argument("gated_residual: row index out of range");
  }
  const DType out = x.dtype;
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    std::vector<float> v(c), g(c), b(c);
    for (int64_t i = begin; i < end; ++i) {
      load_row(row_ptr(x, i), x.dtype, c, v.data());
      load_row(row_ptr(gate, row[i]), gate.dtype, c, g.data());
      load_row(row_ptr(branch, i), branch.dtype, c, b.data());
      for (int64_t k = 0; k < c; ++k) v[k] = round_to(out, v[k] + round_to(out, g[k] * b[k]));
      store_row(v.data(), c, row_ptr(x, i), out);
    }
  }, 16);
  return ok_status();
}

Status residual_add(const TensorView& x, const TensorView& branch) {
  VORTEX_RETURN_IF_ERROR(check_activation(x, "residual_add residual"));
  VORTEX_RETURN_IF_ERROR(check_activation(branch, "residual_add branch"));
  if (x.rank() != 2 || branch.shape != x.shape) {
    return invalid_argument("residual_add: residual " + x.shape.to_string() + " vs branch " + branch.shape.to_string());
  }
  const int64_t n = x.shape[0], c = x.shape[1];
  const DType out = x.dtype;
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    std::vector<float> v(c), b(c);
    for (int64_t i = begin; i < end; ++i) {
      load_row(row_ptr(x, i), x.dtype, c, v.data());
      load_row(row_ptr(branch, i), branch.dtype, c, b.data());
      for (int64_t k = 0; k < c; ++k) v[k] = round_to(out, v[k] + b[k]);
      store_row(v.data(), c, row_ptr(x, i), out);
    }
  }, 16);
  return ok_status();
}

Status apply_rope(const TensorView& x, const Tensor& cos, const Tensor& sin) {
  VORTEX_RETURN_IF_ERROR(check_activation(x, "apply_rope input"));
  if (x.rank() != 3) return invalid_argument("apply_rope: input must be [N, H, D], got " + x.shape.to_string());
  const int64_t n = x.shape[0], heads = x.shape[1], d = x.shape[2];
  if (cos.dtype() != DType::kF32 || sin.dtype() != DType::kF32 || cos.rank() != 2 || cos.shape() != sin.shape() ||
      cos.size(0) != n || !cos.is_contiguous() || !sin.is_contiguous()) {
    return invalid_argument("apply_rope: cos/sin must be contiguous F32 [" + std::to_string(n) + ", rotary], got " +
                            cos.describe() + " and " + sin.describe());
  }
  const int64_t rot = cos.size(1), half = rot / 2;
  if (rot > d || rot % 2 != 0) {
    return invalid_argument("apply_rope: rotary width " + std::to_string(rot) + " must be even and <= head dim " +
                            std::to_string(d));
  }
  const DType out = x.dtype;
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    std::vector<float> v(d), c(rot), s(rot), r(rot);
    for (int64_t i = begin; i < end; ++i) {
      // The reference casts the fp32 tables to the activation dtype before using them.
      for (int64_t k = 0; k < rot; ++k) {
        c[k] = round_to(out, cos.data_as<float>()[i * rot + k]);
        s[k] = round_to(out, sin.data_as<float>()[i * rot + k]);
      }
      for (int64_t h = 0; h < heads; ++h) {
        char* p = row_ptr(x, i, h);
        load_row(p, x.dtype, d, v.data());
        for (int64_t k = 0; k < rot; ++k) {
          const float rotated = k < half ? -v[k + half] : v[k - half];
          r[k] = round_to(out, round_to(out, v[k] * c[k]) + round_to(out, rotated * s[k]));
        }
        for (int64_t k = 0; k < rot; ++k) v[k] = r[k];
        store_row(v.data(), d, p, out);
      }
    }
  }, 8);
  return ok_status();
}

void silu_f32(Tensor& x) {
  float* p = x.data_as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = silu(p[i]);
}

}  // namespace vortex::cpu
