// Band-limited resampling (see audio_resample.h).
//
// With both rates divided by their gcd (from = F, to = T), output sample b·T + j is a dot product
// of the input around b·F with the filter of phase j: the sinc of the lower rate (times 0.99),
// Hann-windowed over 6 of its zero crossings each side, sampled at that phase's offsets. So the
// filters are T rows of 2·width + F taps, and each block of F input samples yields T outputs.
#include "media/audio_resample.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/portable_math.h"
#include "media/media_common.h"

namespace vortex::media {

namespace {

constexpr int kZeroCrossings = 6;  // torchaudio's lowpass_filter_width
constexpr double kRolloff = 0.99;
constexpr double kPi = 3.141592653589793;  // Python's math.pi

struct SincFilter {
  int64_t from = 0;   // the source rate over the gcd: input samples per block
  int64_t to = 0;     // the target rate over the gcd: output samples (phases) per block
  int64_t width = 0;  // taps each side beyond a block
  int64_t taps = 0;   // 2 · width + from
  std::vector<float> weights;  // [to, taps]
};

// The filter as torchaudio builds it for a float32 waveform with no explicit kernel dtype: the tap
// offsets k / F in float64, the phase offsets -j / T in float32 (an integer range divided), their
// sum, clamp, window and sinc in float64, then one rounding to float32.
SincFilter make_filter(int from_rate, int to_rate) {
  const int g = std::gcd(from_rate, to_rate);
  SincFilter f;
  f.from = from_rate / g;
  f.to = to_rate / g;
  const double base = static_cast<double>(std::min(f.from, f.to)) * kRolloff;
  f.width = static_cast<int64_t>(std::ceil(static_cast<double>(kZeroCrossings * f.from) / base));
  f.taps = 2 * f.width + f.from;
  f.weights.resize(static_cast<size_t>(f.to * f.taps));
  const double scale = base / static_cast<double>(f.from);
  for (int64_t j = 0; j < f.to; ++j) {
    const float phase = static_cast<float>(-j) / static_cast<float>(f.to);
    for (int64_t k = 0; k < f.taps; ++k) {
      const double offset = static_cast<double>(k - f.width) / static_cast<double>(f.from);
      double t = (static_cast<double>(phase) + offset) * base;
      t = std::clamp(t, -static_cast<double>(kZeroCrossings), static_cast<double>(kZeroCrossings));
      const double c = portable_cos(t * kPi / kZeroCrossings / 2);
      const double window = c * c;
      const double x = t * kPi;
      const double sinc = x == 0.0 ? 1.0 : portable_sin(x) / x;
      f.weights[static_cast<size_t>(j * f.taps + k)] = static_cast<float>(sinc * (window * scale));
    }
  }
  return f;
}

Status check_rate(int rate, const char* which) {
  if (rate < 1 || rate > kMaxResampleRate) {
    return invalid_argument(std::string("resample: ") + which + " rate " + std::to_string(rate) +
                            " Hz is outside 1.." + std::to_string(kMaxResampleRate));
  }
  return ok_status();
}

}  // namespace

int64_t resampled_length(int64_t samples, int from_rate, int to_rate) {
  const int64_t g = std::gcd(from_rate, to_rate);
  const int64_t from = from_rate / g;
  const int64_t to = to_rate / g;
  return (samples * to + from - 1) / from;
}

Result<Tensor> resample_audio(const Tensor& waveform, int from_rate, int to_rate) {
  VORTEX_RETURN_IF_ERROR(check_rate(from_rate, "source"));
  VORTEX_RETURN_IF_ERROR(check_rate(to_rate, "target"));
  VORTEX_ASSIGN_OR_RETURN(const Tensor src, host_f32(waveform, "resample: waveform", 2));
  const int64_t channels = src.size(0);
  const int64_t length = src.size(1);
  if (length < 1) return invalid_argument("resample: waveform " + src.describe() + " has no samples");
  VORTEX_RETURN_IF_ERROR(check_finite(src, "resample: waveform"));
  if (from_rate == to_rate) return src;

  const SincFilter f = make_filter(from_rate, to_rate);
  const int64_t out_length = resampled_length(length, from_rate, to_rate);
  Tensor out = Tensor::empty({channels, out_length}, DType::kF32);
  const float* in = src.data_as<const float>();
  float* dst = out.data_as<float>();
  // The input is zero-padded by `width` on the left (and enough on the right); output n = b·T + j
  // reads padded samples b·F .. b·F + taps - 1, i.e. input samples from b·F - width.
  parallel_for(0, channels * out_length, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t c = i / out_length;
      const int64_t n = i % out_length;
      const int64_t block = n / f.to;
      const int64_t phase = n % f.to;
      const int64_t first = block * f.from - f.width;
      const int64_t k_begin = std::max<int64_t>(0, -first);
      const int64_t k_end = std::min<int64_t>(f.taps, length - first);
      const float* taps = f.weights.data() + phase * f.taps;
      const float* x = in + c * length;  // sample first + k is x[first + k]
      double acc = 0.0;
      for (int64_t k = k_begin; k < k_end; ++k) {
        acc += static_cast<double>(taps[k]) * static_cast<double>(x[first + k]);
      }
      dst[i] = static_cast<float>(acc);
    }
  }, 1024);
  return out;
}

}  // namespace vortex::media
