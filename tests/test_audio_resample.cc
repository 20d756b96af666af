// The band-limited resampler of ref2va soundtracks: the pipeline's whole normalisation (cut at the
// soundtrack's rate, mono upmix, torchaudio's resampling) against the reference's on every case
// of tests/golden/soundtrack_resample.safetensors, the filter's properties on signals whose answer
// is known, and one-line refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "media/audio_resample.h"
#include "models/vae/audio_vae_encoder.h"

namespace vortex {
namespace {

// torchaudio convolves in float32 (up to ~460 taps for 44.1 kHz); these outputs are accumulated in
// float64, so they differ by the reference's own rounding: measured 2.4e-7 max, 8e-8 rel-L2.
constexpr double kResampleParity = 1e-6;

TEST(AudioResample, MatchesTheReferencePipelinesSoundtrackNormalisation) {
  auto io = SafetensorsFile::open(test::golden_path("soundtrack_resample.safetensors"));
  ASSERT_TRUE(io.ok()) << io.status().to_string();
  int cases = 0;
  for (int k = 0; io->get("case." + std::to_string(k) + ".in").ok(); ++k, ++cases) {
    const std::string name = "case." + std::to_string(k);
    const Tensor in = test::must(io->get(name + ".in")).contiguous();
    const Tensor want = test::must(io->get(name + ".out")).contiguous();
    const Tensor rates = test::must(io->get(name + ".rates")).contiguous();
    const int64_t* r = rates.data_as<const int64_t>();
    const double max_seconds = static_cast<double>(r[2]) / 1e6;
    auto got = vae::normalize_reference_soundtrack(in, static_cast<int>(r[0]), static_cast<int>(r[1]), max_seconds);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().to_string();
    ASSERT_EQ(got->shape(), want.shape()) << name << ": " << got->describe() << " vs " << want.describe();
    double max_abs = 0.0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(got->data_as<const float>()[i]) -
                                            want.data_as<const float>()[i]));
    }
    EXPECT_LE(max_abs, kResampleParity) << name << " (" << r[0] << " -> " << r[1] << " Hz)";
    EXPECT_LE(test::rel_l2(*got, want), kResampleParity) << name;
  }
  EXPECT_EQ(cases, 9);
}

// A tone well inside both bands comes through at the new rate with its amplitude (away from the
// zero-padded ends), for down- and upsampling and a strided view.
TEST(AudioResample, KeepsAnInBandToneAndItsLength) {
  for (const auto& [from, to] : {std::pair{44100, 32000}, std::pair{16000, 32000}, std::pair{96000, 32000}}) {
    const int64_t n = from / 10;
    Tensor wave = Tensor::empty({2, n}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(0.5 * std::sin(2 * M_PI * 440.0 * i / from));
      wave.data_as<float>()[i] = v;
      wave.data_as<float>()[n + i] = -v;
    }
    auto out = media::resample_audio(wave, from, to);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->size(1), media::resampled_length(n, from, to));
    EXPECT_EQ(out->size(1), to / 10);
    const float* y = out->data_as<const float>();
    for (int64_t i = 200; i < out->size(1) - 200; ++i) {
      const double want = 0.5 * std::sin(2 * M_PI * 440.0 * i / to);
      ASSERT_NEAR(y[i], want, 2e-3) << from << " -> " << to << " sample " << i;
      ASSERT_EQ(y[out->size(1) + i], -y[i]) << i;
    }
    // The right channel alone, as a strided view, resamples to the same bits.
    auto right = media::resample_audio(test::must(wave.slice(0, 1, 2)), from, to);
    ASSERT_TRUE(right.ok());
    for (int64_t i = 0; i < right->size(1); ++i) ASSERT_EQ(right->data_as<const float>()[i], y[out->size(1) + i]);
  }
  EXPECT_EQ(media::resampled_length(1, 44100, 32000), 1);
  EXPECT_EQ(media::resampled_length(441, 44100, 32000), 320);
  EXPECT_EQ(media::resampled_length(442, 44100, 32000), 321);
}

TEST(AudioResample, RefusesBadRatesAndWaveformsInOneLine) {
  const Tensor wave = Tensor::zeros({1, 8}, DType::kF32);
  auto expect_refused = [](const Result<Tensor>& r, const std::string& needle) {
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  };
  expect_refused(media::resample_audio(wave, 0, 32000), "source rate 0 Hz");
  expect_refused(media::resample_audio(wave, 44100, 800000), "target rate 800000 Hz");
  expect_refused(media::resample_audio(Tensor::zeros({1, 0}, DType::kF32), 44100, 32000), "no samples");
  expect_refused(media::resample_audio(Tensor::zeros({8}, DType::kF32), 44100, 32000), "waveform");
  Tensor bad = Tensor::zeros({1, 8}, DType::kF32);
  bad.data_as<float>()[3] = NAN;
  expect_refused(media::resample_audio(bad, 44100, 32000), "NaN");
  // Equal rates: the samples untouched.
  auto same = media::resample_audio(wave, 32000, 32000);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->shape(), wave.shape());
}

}  // namespace
}  // namespace vortex
