#include "models/vae/resample.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/parallel.h"

namespace vortex::vae {

namespace {

// Modified Bessel function of the first kind, order 0, by its power series (converges for every
// x; the decoder's β is below 10, where 40 terms are far past double precision).
double bessel_i0(double x) {
  double term = 1.0, sum = 1.0;
  const double q = x * x / 4.0;
  for (int k = 1; k < 200; ++k) {
    term *= q / (double(k) * k);
    sum += term;
    if (term < sum * 1e-17) break;
  }
  return sum;
}

double sinc(double x) {
  if (x == 0.0) return 1.0;
  return std::sin(std::numbers::pi * x) / (std::numbers::pi * x);
}

Status check_input(const char* op, const Tensor& x, const std::vector<float>& filter, int ratio) {
  if (!x.defined() || x.dtype() != DType::kF32 || x.rank() != 3 || !x.is_contiguous() || x.size(1) < 1) {
    return invalid_argument(std::string(op) + ": x " + (x.defined() ? x.describe() : std::string("(undefined)")) +
                            " must be a contiguous F32 tensor [B, T >= 1, C]");
  }
  if (ratio < 1 || filter.empty() || static_cast<int64_t>(filter.size()) < ratio) {
    return invalid_argument(std::string(op) + ": needs ratio >= 1 and at least `ratio` filter taps, got ratio " +
                            std::to_string(ratio) + " and " + std::to_string(filter.size()) + " taps");
  }
  return ok_status();
}

int64_t clamp_index(int64_t i, int64_t n) { return std::clamp<int64_t>(i, 0, n - 1); }

}  // namespace

std::vector<float> kaiser_sinc_filter(double cutoff, double half_width, int kernel_size) {
  const int half = kernel_size / 2;
  const double attenuation = 2.285 * (half - 1) * std::numbers::pi * (4 * half_width) + 7.95;
  double beta = 0.0;
  if (attenuation > 50.0) {
    beta = 0.1102 * (attenuation - 8.7);
  } else if (attenuation >= 21.0) {
    beta = 0.5842 * std::pow(attenuation - 21.0, 0.4) + 0.07886 * (attenuation - 21.0);
  }
  std::vector<double> taps(static_cast<size_t>(kernel_size));
  double sum = 0.0;
  const double center = (kernel_size - 1) / 2.0;  // the symmetric (non-periodic) window's centre
  for (int n = 0; n < kernel_size; ++n) {
    double window = 1.0;
    if (kernel_size > 1) {
      const double r = (n - center) / center;
      window = bessel_i0(beta * std::sqrt(std::abs(1.0 - r * r))) / bessel_i0(beta);
    }
    const double time = kernel_size % 2 == 0 ? (n - half) + 0.5 : double(n - half);
    taps[n] = 2 * cutoff * window * sinc(2 * cutoff * time);
    sum += taps[n];
  }
  std::vector<float> out(taps.size());
  for (size_t n = 0; n < taps.size(); ++n) out[n] = static_cast<float>(taps[n] / sum);
  return out;
}

Result<Tensor> upsample_1d(const Tensor& x, const std::vector<float>& filter, int ratio) {
  VORTEX_RETURN_IF_ERROR(check_input("upsample_1d", x, filter, ratio));
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), K = static_cast<int64_t>(filter.size());
  const int64_t pad = K / ratio - 1;
  const int64_t pad_left = pad * ratio + (K - ratio) / 2;
  const int64_t padded = T + 2 * pad;
  const int64_t T_out = ratio * T;
  Tensor y = Tensor::empty({B, T_out, C}, DType::kF32);
  const float* xd = x.data_as<const float>();
  float* yd = y.data_as<float>();
  const float gain = static_cast<float>(ratio);
  parallel_for(
      0, B * T_out,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t b = r / T_out, n = r % T_out;
          float* out = yd + r * C;
          std::fill(out, out + C, 0.0f);
          const int64_t m = n + pad_left;  // index into the uncropped transposed-conv output
          for (int64_t k = m % ratio; k < K && k <= m; k += ratio) {
            const int64_t j = (m - k) / ratio;  // index into the padded input
            if (j >= padded) continue;
            const float tap = filter[k];
            const float* src = xd + (b * T + clamp_index(j - pad, T)) * C;
            for (int64_t c = 0; c < C; ++c) out[c] += tap * src[c];
          }
          for (int64_t c = 0; c < C; ++c) out[c] = gain * out[c];
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)));
  return y;
}

int64_t lowpass_downsample_length(int64_t length, int taps, int ratio) {
  const int64_t pad_left = taps / 2 - (taps % 2 == 0 ? 1 : 0), pad_right = taps / 2;
  const int64_t span = length + pad_left + pad_right - taps;
  return span < 0 ? 0 : span / ratio + 1;
}

Result<Tensor> lowpass_downsample_1d(const Tensor& x, const std::vector<float>& filter, int ratio) {
  VORTEX_RETURN_IF_ERROR(check_input("lowpass_downsample_1d", x, filter, ratio));
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), K = static_cast<int64_t>(filter.size());
  const int64_t pad_left = K / 2 - (K % 2 == 0 ? 1 : 0);
  const int64_t T_out = lowpass_downsample_length(T, static_cast<int>(K), ratio);
  Tensor y = Tensor::empty({B, T_out, C}, DType::kF32);
  const float* xd = x.data_as<const float>();
  float* yd = y.data_as<float>();
  parallel_for(
      0, B * T_out,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t b = r / T_out, m = r % T_out;
          float* out = yd + r * C;
          std::fill(out, out + C, 0.0f);
          for (int64_t k = 0; k < K; ++k) {
            const float tap = filter[k];
            const float* src = xd + (b * T + clamp_index(m * ratio + k - pad_left, T)) * C;
            for (int64_t c = 0; c < C; ++c) out[c] += tap * src[c];
          }
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)));
  return y;
}

}  // namespace vortex::vae
