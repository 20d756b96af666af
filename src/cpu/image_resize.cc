#include "cpu/image_resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "core/parallel.h"
#include "core/portable_math.h"

namespace vortex::cpu {

namespace {

constexpr int kPillowPrecisionBits = 32 - 8 - 2;

// Pillow calls the C library's sin; core/portable_math.h's is within a few double ulp of it, far
// below what the coefficients' 22-bit fixed point keeps (the golden test holds them bit for bit).
double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= std::numbers::pi;
  return portable_sin(x) / x;
}

constexpr double kLanczosSupport = 3.0;
double lanczos(double x) {
  return (-kLanczosSupport <= x && x < kLanczosSupport) ? sinc(x) * sinc(x / kLanczosSupport) : 0.0;
}

// PyTorch's antialiased bicubic filter, written as aten writes it (the golden test holds the
// rounding of each step).
constexpr double kCubicSupport = 2.0;
double keys_cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

// One axis's taps: output pixel i reads inputs [first[i], first[i] + count[i]) with fixed-point
// weights coeff[i · ksize + k] of `precision` fraction bits.
struct AxisTaps {
  int64_t ksize = 0;
  int precision = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> coeff;
};

// How an axis's normalised double weights become integers.
enum class FixedPoint {
  kPillow,      // 22 fraction bits
  kTorchInt16,  // the most bits for which the largest weight fits an int16
};

int torch_int16_precision(const std::vector<double>& weights) {
  const double w_max = *std::max_element(weights.begin(), weights.end());
  int p = 0;
  for (; p < 22; ++p) {
    if (static_cast<int>(0.5 + w_max * static_cast<double>(1 << (p + 1))) >= (1 << 15)) break;
  }
  return p;
}

AxisTaps axis_taps(int64_t in_size, int64_t out_size, double (*filter)(double), double filter_support,
                   FixedPoint fixed_point) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = filter_support * filterscale;
  AxisTaps t;
  t.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  // The normalised weights, zero past each pixel's count (PyTorch's largest weight is taken over these).
  std::vector<double> weights(static_cast<size_t>(out_size * t.ksize), 0.0);
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = (static_cast<double>(i) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int64_t xmin = std::max<int64_t>(0, static_cast<int64_t>(center - support + 0.5));
    const int64_t xmax = std::min<int64_t>(in_size, static_cast<int64_t>(center + support + 0.5)) - xmin;
    double* w = weights.data() + i * t.ksize;
    double sum = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      w[x] = filter((static_cast<double>(x + xmin) - center + 0.5) * ss);
      sum += w[x];
    }
    if (sum != 0.0) {
      for (int64_t x = 0; x < xmax; ++x) w[x] /= sum;
    }
    t.first[i] = xmin;
    t.count[i] = xmax;
  }
  t.precision = fixed_point == FixedPoint::kPillow ? kPillowPrecisionBits : torch_int16_precision(weights);
  const double one = static_cast<double>(1 << t.precision);
  t.coeff.resize(weights.size());
  for (size_t k = 0; k < weights.size(); ++k) {
    const double v = weights[k];
    t.coeff[k] = static_cast<int32_t>(v < 0 ? -0.5 + v * one : 0.5 + v * one);
  }
  return t;
}

// A pass's sum (which started at the rounding half) back to 8 bits: the shift, clipped to [0, 255].
inline uint8_t clip8(int32_t v, int precision) {
  return static_cast<uint8_t>(std::clamp(v >> precision, 0, 255));
}

// Rows [row0, row0 + rows) of src [H, W, 3] resampled along W into dst [rows, out_w, 3].
void horizontal(const uint8_t* src, int64_t W, int64_t row0, int64_t rows, const AxisTaps& t, int64_t out_w,
                uint8_t* dst) {
  const int32_t half = 1 << (t.precision - 1);
  parallel_for(0, rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* line = src + (row0 + r) * W * 3;
      for (int64_t i = 0; i < out_w; ++i) {
        const int32_t* k = t.coeff.data() + i * t.ksize;
        int32_t s[3] = {half, half, half};
        for (int64_t x = 0; x < t.count[i]; ++x) {
          const uint8_t* p = line + (t.first[i] + x) * 3;
          for (int c = 0; c < 3; ++c) s[c] += static_cast<int32_t>(p[c]) * k[x];
        }
        for (int c = 0; c < 3; ++c) dst[(r * out_w + i) * 3 + c] = clip8(s[c], t.precision);
      }
    }
  });
}

// src [H, W, 3] resampled along H (taps offset by `row0`, the first row src holds) into dst [out_h, W, 3].
void vertical(const uint8_t* src, int64_t W, int64_t row0, const AxisTaps& t, int64_t out_h, uint8_t* dst) {
  const int32_t half = 1 << (t.precision - 1);
  parallel_for(0, out_h, [&](int64_t y0, int64_t y1) {
    for (int64_t y = y0; y < y1; ++y) {
      const int32_t* k = t.coeff.data() + y * t.ksize;
      for (int64_t j = 0; j < W; ++j) {
        int32_t s[3] = {half, half, half};
        for (int64_t x = 0; x < t.count[y]; ++x) {
          const uint8_t* p = src + ((t.first[y] - row0 + x) * W + j) * 3;
          for (int c = 0; c < 3; ++c) s[c] += static_cast<int32_t>(p[c]) * k[x];
        }
        for (int c = 0; c < 3; ++c) dst[(y * W + j) * 3 + c] = clip8(s[c], t.precision);
      }
    }
  });
}

Result<Tensor> resize_rgb8(const Tensor& rgb, int64_t height, int64_t width, double (*filter)(double),
                           double filter_support, FixedPoint fixed_point) {
  if (!rgb.defined() || rgb.dtype() != DType::kU8 || rgb.rank() != 3 || rgb.size(2) != 3 || !rgb.is_contiguous() ||
      rgb.size(0) < 1 || rgb.size(1) < 1) {
    return invalid_argument("resize: image " + (rgb.defined() ? rgb.describe() : std::string("(undefined)")) +
                            " must be a contiguous U8 [H, W, 3] with H, W >= 1");
  }
  if (height < 1 || width < 1) {
    return invalid_argument("resize: target " + std::to_string(width) + "x" + std::to_string(height) +
                            " must be at least 1x1");
  }
  const int64_t H = rgb.size(0), W = rgb.size(1);
  const uint8_t* src = rgb.data_as<const uint8_t>();
  const AxisTaps vt = axis_taps(H, height, filter, filter_support, fixed_point);
  // The rows the vertical pass reads: only those go through the horizontal pass.
  const int64_t first_row = vt.first[0], last_row = vt.first[height - 1] + vt.count[height - 1];
  Tensor tmp;
  int64_t row0 = 0, tmp_w = W;
  if (width != W) {
    const AxisTaps ht = axis_taps(W, width, filter, filter_support, fixed_point);
    tmp = Tensor::empty({last_row - first_row, width, 3}, DType::kU8);
    horizontal(src, W, first_row, last_row - first_row, ht, width, tmp.data_as<uint8_t>());
    src = tmp.data_as<const uint8_t>();
    row0 = first_row;
    tmp_w = width;
  }
  Tensor out = Tensor::empty({height, width, 3}, DType::kU8);
  if (height != H) {
    vertical(src, tmp_w, row0, vt, height, out.data_as<uint8_t>());
  } else {
    std::memcpy(out.data(), src, static_cast<size_t>(out.nbytes()));
  }
  return out;
}

}  // namespace

Result<Tensor> resize_lanczos_rgb8(const Tensor& rgb, int64_t height, int64_t width) {
  return resize_rgb8(rgb, height, width, lanczos, kLanczosSupport, FixedPoint::kPillow);
}

Result<Tensor> resize_bicubic_rgb8(const Tensor& rgb, int64_t height, int64_t width) {
  return resize_rgb8(rgb, height, width, keys_cubic, kCubicSupport, FixedPoint::kTorchInt16);
}

}  // namespace vortex::cpu
