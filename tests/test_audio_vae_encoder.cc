// The audio VAE encoder (ref2va's soundtracks) against the diffusers reference on the committed
// random weights (tests/golden/audio_vae_*/encode.safetensors, tools/golden/make_audio_vae_encoder_golden.py):
// every stage of the DAC encoder, the pre_block, the posterior mean and the pipeline's normalised
// channel-major rows; and its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "media/audio_resample.h"
#include "models/vae/audio_vae.h"
#include "models/vae/audio_vae_encoder.h"

namespace vortex {
namespace {

// fp32 throughout; only the summation order differs from the reference.
constexpr double kParityBound = 1e-5;

Result<vae::AudioVaeEncoder> golden_encoder(const std::string& folder) {
  const std::string path = test::golden_path(folder + "/diffusers.safetensors");
  VORTEX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  VORTEX_ASSIGN_OR_RETURN(const vae::AudioVaeConfig config, vae::resolve_audio_vae_config(path, file));
  vae::NamedTensors tensors;
  for (const std::string& name : file.names()) {
    VORTEX_ASSIGN_OR_RETURN(Tensor t, file.get(name));
    tensors.emplace_back(name, t);
  }
  return vae::assemble_audio_vae_encoder(tensors, config);
}

class AudioVaeEncoderParity : public testing::TestWithParam<std::string> {};

TEST_P(AudioVaeEncoderParity, EveryStageMatchesTheReference) {
  const std::string folder = GetParam();
  auto encoder = golden_encoder(folder);
  ASSERT_TRUE(encoder.ok()) << encoder.status().to_string();
  auto io = SafetensorsFile::open(test::golden_path(folder + "/encode.safetensors"));
  ASSERT_TRUE(io.ok()) << io.status().to_string();
  std::vector<std::pair<std::string, Tensor>> seen;
  vae::AudioVaeObserver observer = [&](const std::string& n, const Tensor& t) { seen.emplace_back(n, t.clone()); };
  auto rows = vae::encode_audio(*encoder, io->get("in.waveform")->contiguous(), &observer);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  int compared = 0;
  for (const auto& [name, value] : seen) {  // forward order: the first failure is the first divergence
    auto ref = io->get("out." + name);
    ASSERT_TRUE(ref.ok()) << name;
    // The reference's [B, C, T] is this encoder's [B, T, C] transposed; its pre_block runs time-major too.
    const Tensor mine = name == "pre_block" ? value : *value.permute({0, 2, 1});
    ASSERT_EQ(mine.shape(), ref->shape()) << name;
    const double err = test::rel_l2(mine.contiguous(), ref->contiguous());
    ++compared;
    ASSERT_LE(err, kParityBound) << "first diverging intermediate: " << name << " (rel-L2 " << err << ")";
    RecordProperty(name, std::to_string(err));
  }
  EXPECT_GE(compared, 6);
  const Tensor want = io->get("out.rows")->contiguous();
  ASSERT_EQ(rows->shape(), want.shape());
  const double err = test::rel_l2(*rows, want);
  std::printf("%s: soundtrack rows %s rel-L2 %.3e from the reference\n", folder.c_str(), rows->describe().c_str(), err);
  EXPECT_LE(err, kParityBound);
}

INSTANTIATE_TEST_SUITE_P(Goldens, AudioVaeEncoderParity, testing::Values("audio_vae_tiny", "audio_vae_small"));

TEST(AudioVaeEncoder, RefusalsAreNamed) {
  auto encoder = golden_encoder("audio_vae_tiny");
  ASSERT_TRUE(encoder.ok()) << encoder.status().to_string();
  const auto refused = [&](const Tensor& wave, const std::string& needle) {
    auto r = vae::encode_audio(*encoder, wave);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  refused(Tensor::zeros({1, 40}, DType::kF32), "must be stereo [2, samples >= 1]");
  refused(Tensor::zeros({2, 0}, DType::kF32), "must be stereo");
  Tensor nan = Tensor::zeros({2, 40}, DType::kF32);
  nan.data_as<float>()[40 + 7] = std::nanf("");
  refused(nan, "sample 7 of channel 1 is not finite");
  // A decoder-only checkpoint has no encoder to assemble.
  const vae::AudioVaeConfig config = encoder->config;
  auto decoder_only = vae::assemble_audio_vae_encoder(vae::synthetic_audio_vae_tensors(config, 1, false), config);
  ASSERT_FALSE(decoder_only.ok());
  EXPECT_NE(decoder_only.status().message().find("encoder.block.0"), std::string::npos)
      << decoder_only.status().message();
}

// The pipeline's normalisation before the encode: truncated at the generated duration, a mono
// waveform on both channels, another rate resampled onto the VAE's.
TEST(AudioVaeEncoder, ReferenceSoundtracksAreTruncatedAndUpmixed) {
  auto encoder = vae::load_audio_vae_encoder(test::golden_path("audio_vae_small/diffusers.safetensors"));
  ASSERT_TRUE(encoder.ok()) << encoder.status().to_string();
  auto io = SafetensorsFile::open(test::golden_path("audio_vae_small/encode.safetensors"));
  ASSERT_TRUE(io.ok());
  const Tensor wave = io->get("in.waveform")->contiguous();
  const int rate = encoder->config.sampling_rate;
  // Longer than the waveform: nothing is cut, the reference's rows.
  auto whole = vae::encode_reference_soundtrack(*encoder, wave, rate, 10.0);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_LE(test::rel_l2(*whole, io->get("out.rows")->contiguous()), kParityBound);
  // Cut at int(seconds · rate) samples: the encode of the first samples.
  const double seconds = 50.0 / rate;
  auto cut = vae::encode_reference_soundtrack(*encoder, wave, rate, seconds);
  ASSERT_TRUE(cut.ok());
  Tensor first = Tensor::empty({2, 50}, DType::kF32);
  for (int c = 0; c < 2; ++c) {
    std::memcpy(first.data_as<float>() + c * 50, wave.data_as<const float>() + c * wave.size(1), 50 * sizeof(float));
  }
  auto want = vae::encode_audio(*encoder, first);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(test::rel_l2(*cut, *want), 0.0);
  // Mono: the one channel on both, the encode of that stereo waveform. (Not "both halves of the
  // rows equal": OpenBLAS may round a row by its position in the GEMM.)
  auto left = wave.slice(0, 0, 1);
  auto mono = vae::encode_reference_soundtrack(*encoder, left->contiguous(), rate, 10.0);
  ASSERT_TRUE(mono.ok());
  Tensor both = Tensor::empty({2, wave.size(1)}, DType::kF32);
  for (int c = 0; c < 2; ++c) {
    std::memcpy(both.data_as<float>() + c * wave.size(1), wave.data_as<const float>(), wave.size(1) * sizeof(float));
  }
  EXPECT_EQ(test::rel_l2(*mono, test::must(vae::encode_audio(*encoder, both))), 0.0);
  // Another rate: resampled onto the VAE's (media::resample_audio), then encoded; sized alike.
  auto resampled = vae::encode_reference_soundtrack(*encoder, wave, 44100, 10.0);
  ASSERT_TRUE(resampled.ok()) << resampled.status().to_string();
  const Tensor at_vae_rate = test::must(media::resample_audio(wave, 44100, rate));
  EXPECT_EQ(test::rel_l2(*resampled, test::must(vae::encode_audio(*encoder, at_vae_rate))), 0.0);
  EXPECT_EQ(test::must(vae::reference_soundtrack_samples(encoder->config, wave, 44100, 10.0)), at_vae_rate.size(1));
  auto no_rate = vae::encode_reference_soundtrack(*encoder, wave, 0, 10.0);
  ASSERT_FALSE(no_rate.ok());
  EXPECT_NE(no_rate.status().message().find("sample rate 0 Hz"), std::string::npos);
  auto three = vae::encode_reference_soundtrack(*encoder, Tensor::zeros({3, 10}, DType::kF32), rate, 10.0);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("mono or stereo"), std::string::npos);
}

}  // namespace
}  // namespace vortex
