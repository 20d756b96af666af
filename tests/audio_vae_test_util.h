// Naive double-precision versions of the audio VAE's ops, written straight from the reference's
// definitions (PyTorch layouts, explicit padding, scatter for transposed convolutions), for the
// tests to compare the CPU code with. Sequences are time-major [B, T, C] like the library's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "vortex/tensor.h"

namespace vortex::test {

struct Seq {
  int64_t B = 0, T = 0, C = 0;
  std::vector<double> v;  // [B, T, C]
  Seq() = default;
  Seq(int64_t b, int64_t t, int64_t c) : B(b), T(t), C(c), v(static_cast<size_t>(b * t * c), 0.0) {}
  double& at(int64_t b, int64_t t, int64_t c) { return v[(b * T + t) * C + c]; }
  double at(int64_t b, int64_t t, int64_t c) const { return v[(b * T + t) * C + c]; }
};

inline Seq seq_from(const Tensor& t) {  // [B, T, C] any float tensor
  Seq s(t.size(0), t.size(1), t.size(2));
  for (int64_t i = 0; i < t.numel(); ++i) s.v[i] = element_as_double(t, i);
  return s;
}

inline Tensor tensor_from(const Seq& s) {
  std::vector<float> f(s.v.begin(), s.v.end());
  return Tensor::from_f32(f, {s.B, s.T, s.C});
}

inline std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = element_as_double(t, i);
  return out;
}

inline Tensor random_tensor(std::mt19937& rng, const Shape& shape, float scale = 1.0f, float offset = 0.0f) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = offset + scale * normal(rng);
  return t;
}

// PyTorch Conv1d: w [O, C, K], bias [O] or empty. Also returns Σ|terms| per output in `mag`.
inline Seq naive_conv1d(const Seq& x, const std::vector<double>& w, const std::vector<double>& bias, int64_t O,
                        int64_t K, int64_t stride, int64_t dilation, int64_t padding, Seq* mag = nullptr) {
  const int64_t T_out = (x.T + 2 * padding - dilation * (K - 1) - 1) / stride + 1;
  Seq y(x.B, T_out, O);
  if (mag) *mag = Seq(x.B, T_out, O);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t t = 0; t < T_out; ++t)
      for (int64_t o = 0; o < O; ++o) {
        double acc = bias.empty() ? 0.0 : bias[o], m = std::abs(acc);
        for (int64_t c = 0; c < x.C; ++c)
          for (int64_t k = 0; k < K; ++k) {
            const int64_t i = t * stride + k * dilation - padding;
            if (i < 0 || i >= x.T) continue;
            const double term = w[(o * x.C + c) * K + k] * x.at(b, i, c);
            acc += term;
            m += std::abs(term);
          }
        y.at(b, t, o) = acc;
        if (mag) mag->at(b, t, o) = m;
      }
  return y;
}

// PyTorch ConvTranspose1d: w [C, O, K]; scatter into the full output, then drop `padding` each side.
inline Seq naive_conv_transpose1d(const Seq& x, const std::vector<double>& w, const std::vector<double>& bias,
                                  int64_t O, int64_t K, int64_t stride, int64_t padding, Seq* mag = nullptr) {
  const int64_t full = (x.T - 1) * stride + K;
  Seq f(x.B, full, O), fm(x.B, full, O);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t i = 0; i < x.T; ++i)
      for (int64_t c = 0; c < x.C; ++c)
        for (int64_t o = 0; o < O; ++o)
          for (int64_t k = 0; k < K; ++k) {
            const double term = w[(c * O + o) * K + k] * x.at(b, i, c);
            f.at(b, i * stride + k, o) += term;
            fm.at(b, i * stride + k, o) += std::abs(term);
          }
  const int64_t T_out = full - 2 * padding;
  Seq y(x.B, T_out, O);
  if (mag) *mag = Seq(x.B, T_out, O);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t t = 0; t < T_out; ++t)
      for (int64_t o = 0; o < O; ++o) {
        y.at(b, t, o) = f.at(b, t + padding, o) + (bias.empty() ? 0.0 : bias[o]);
        if (mag) mag->at(b, t, o) = fm.at(b, t + padding, o) + (bias.empty() ? 0.0 : std::abs(bias[o]));
      }
  return y;
}

inline Seq replicate_pad(const Seq& x, int64_t left, int64_t right) {
  Seq y(x.B, x.T + left + right, x.C);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t t = 0; t < y.T; ++t)
      for (int64_t c = 0; c < x.C; ++c) y.at(b, t, c) = x.at(b, std::clamp<int64_t>(t - left, 0, x.T - 1), c);
  return y;
}

// The reference's UpSample1d: replicate pad, depthwise transposed conv, × ratio, crop.
inline Seq naive_upsample(const Seq& x, const std::vector<double>& f, int64_t ratio) {
  const int64_t K = static_cast<int64_t>(f.size());
  const int64_t pad = K / ratio - 1;
  const int64_t pad_left = pad * ratio + (K - ratio) / 2, pad_right = pad * ratio + (K - ratio + 1) / 2;
  const Seq xp = replicate_pad(x, pad, pad);
  const int64_t full = (xp.T - 1) * ratio + K;
  Seq u(x.B, full, x.C);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t i = 0; i < xp.T; ++i)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < x.C; ++c) u.at(b, i * ratio + k, c) += f[k] * xp.at(b, i, c);
  Seq y(x.B, full - pad_left - pad_right, x.C);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t t = 0; t < y.T; ++t)
      for (int64_t c = 0; c < x.C; ++c) y.at(b, t, c) = ratio * u.at(b, t + pad_left, c);
  return y;
}

// The reference's LowPassFilter1d with a stride: replicate pad, depthwise strided correlation.
inline Seq naive_downsample(const Seq& x, const std::vector<double>& f, int64_t ratio) {
  const int64_t K = static_cast<int64_t>(f.size());
  const Seq xp = replicate_pad(x, K / 2 - (K % 2 == 0 ? 1 : 0), K / 2);
  const int64_t T_out = (xp.T - K) / ratio + 1;
  Seq y(x.B, T_out, x.C);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t t = 0; t < T_out; ++t)
      for (int64_t c = 0; c < x.C; ++c) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += f[k] * xp.at(b, t * ratio + k, c);
        y.at(b, t, c) = acc;
      }
  return y;
}

// x + m·sin(f·x)² per channel.
inline Seq naive_snake(Seq x, const std::vector<double>& f, const std::vector<double>& m) {
  for (int64_t i = 0; i < static_cast<int64_t>(x.v.size()); ++i) {
    const int64_t c = i % x.C;
    const double s = std::sin(f[c] * x.v[i]);
    x.v[i] = x.v[i] + m[c] * s * s;
  }
  return x;
}

// torch.nn.utils.weight_norm(dim=0) in double.
inline std::vector<double> naive_weight_norm(const std::vector<double>& g, const std::vector<double>& v) {
  const size_t n = g.size(), row = v.size() / n;
  std::vector<double> w(v.size());
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (size_t j = 0; j < row; ++j) s += v[i * row + j] * v[i * row + j];
    for (size_t j = 0; j < row; ++j) w[i * row + j] = v[i * row + j] * g[i] / std::sqrt(s);
  }
  return w;
}

inline double seq_rel_l2(const Seq& a, const Seq& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.v.size(); ++i) {
    num += (a.v[i] - ref.v[i]) * (a.v[i] - ref.v[i]);
    den += ref.v[i] * ref.v[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace vortex::test
