#include "models/vae/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "core/parallel.h"
#include "core/portable_math.h"

namespace vortex::vae {

namespace {

// The most taps one output sums (a decoder filter has 12).
constexpr int kMaxTaps = 64;

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
  return portable_sin(std::numbers::pi * x) / (std::numbers::pi * x);
}

Status check_input(const char* op, const Tensor& x, const std::vector<float>& filter, int ratio) {
  if (!x.defined() || x.dtype() != DType::kF32 || x.rank() != 3 || !x.is_contiguous() || x.size(1) < 1) {
    return invalid_argument(std::string(op) + ": x " + (x.defined() ? x.describe() : std::string("(undefined)")) +
                            " must be a contiguous F32 tensor [B, T >= 1, C]");
  }
  if (ratio < 1 || static_cast<int64_t>(filter.size()) < ratio || filter.size() > kMaxTaps) {
    return invalid_argument(std::string(op) + ": needs ratio >= 1 and ratio to " + std::to_string(kMaxTaps) +
                            " filter taps, got ratio " + std::to_string(ratio) + " and " +
                            std::to_string(filter.size()) + " taps");
  }
  return ok_status();
}

int64_t clamp_index(int64_t i, int64_t n) { return std::clamp<int64_t>(i, 0, n - 1); }

// Eight floats (GCC vector extension; one AVX register with -march=x86-64-v3).
using V8 = float __attribute__((vector_size(32)));

// out[c] = Σ_j taps[j] · rows[j][c], summed from 0 in j order for every channel: the same
// arithmetic as a scalar loop, eight channels at a time in registers.
void weighted_sum(int n, const float* taps, const float* const* rows, int64_t C, float* out) {
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    V8 acc = {};
    for (int j = 0; j < n; ++j) {
      V8 x;
      std::memcpy(&x, rows[j] + c, sizeof(x));
      acc = acc + taps[j] * x;
    }
    std::memcpy(out + c, &acc, sizeof(acc));
  }
  for (; c < C; ++c) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc = acc + taps[j] * rows[j][c];
    out[c] = acc;
  }
}

}  // namespace

std::vector<float> kaiser_sinc_filter(double cutoff, double half_width, int kernel_size) {
  const int half = kernel_size / 2;
  const double attenuation = 2.285 * (half - 1) * std::numbers::pi * (4 * half_width) + 7.95;
  double beta = 0.0;
  if (attenuation > 50.0) {
    beta = 0.1102 * (attenuation - 8.7);
  } else if (attenuation >= 21.0) {
    beta = 0.5842 * portable_exp(0.4 * portable_log(attenuation - 21.0)) + 0.07886 * (attenuation - 21.0);
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
        float taps[kMaxTaps];
        const float* rows[kMaxTaps];
        // Output n is sample m = n + pad_left of the uncropped transposed convolution, m = q·ratio + phase:
        // taps k = phase + i·ratio read padded input q - i. Stepped, not divided, row to row.
        int64_t b = r0 / T_out, n = r0 % T_out;
        int64_t q = (n + pad_left) / ratio, phase = (n + pad_left) % ratio;
        for (int64_t r = r0; r < r1; ++r) {
          int count = 0;
          for (int64_t k = phase, j = q; k < K && j >= 0; k += ratio, --j) {
            if (j >= padded) continue;
            taps[count] = filter[k];
            rows[count++] = xd + (b * T + clamp_index(j - pad, T)) * C;
          }
          float* out = yd + r * C;
          weighted_sum(count, taps, rows, C, out);
          for (int64_t c = 0; c < C; ++c) out[c] = gain * out[c];
          if (++n == T_out) {
            n = 0;
            ++b;
            q = pad_left / ratio;
            phase = pad_left % ratio;
          } else if (++phase == ratio) {
            phase = 0;
            ++q;
          }
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
        const float* rows[kMaxTaps];
        int64_t b = r0 / T_out, m = r0 % T_out;
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t k = 0; k < K; ++k) rows[k] = xd + (b * T + clamp_index(m * ratio + k - pad_left, T)) * C;
          weighted_sum(static_cast<int>(K), filter.data(), rows, C, yd + r * C);
          if (++m == T_out) {
            m = 0;
            ++b;
          }
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)));
  return y;
}

}  // namespace vortex::vae
