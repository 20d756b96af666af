// Damaged media files never crash the readers: a WAV, a PNG and an MP4 that our writers made,
// with random bytes flipped (mostly in the headers, where the parsers live) and random
// truncations, each read back. Whatever a reader accepts must be a well-formed result; whatever
// it refuses must come back as a one-line Status. These are the files a user hands to
// `generate --reference / --first-frame` and to `vortex serve` as multipart parts, so a crash here
// would take a server down.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "cli_test_util.h"
#include "fuzz_test_util.h"
#include "media/wav.h"

#if defined(VORTEX_HAVE_MEDIA)
#include "media/mp4.h"
#include "media/png.h"
#include "media/video_reader.h"
#endif

namespace vortex {
namespace {

using test_util::fuzz_reader;
using test_util::TempDir;

TEST(MediaFuzz, DamagedWavesAreReadOrRefusedNeverCrash) {
  TempDir dir;
  Tensor audio = Tensor::empty({2, 400}, DType::kF32);
  for (int64_t i = 0; i < audio.numel(); ++i) audio.data_as<float>()[i] = 0.5f * std::sin(0.1f * static_cast<float>(i));
  const std::string good_path = dir.file("good.wav");
  ASSERT_TRUE(media::write_wav(good_path, audio, 32000).ok());
  const std::string good = test_util::read_bytes(good_path);

  std::mt19937 rng(2026);
  fuzz_reader(good, 44, 2000, rng, dir.file("fuzz.wav"), media::read_wav, [](const media::Waveform& wave) {
    const Tensor& s = wave.samples;
    ASSERT_EQ(s.dtype(), DType::kF32);
    ASSERT_EQ(s.rank(), 2);
    EXPECT_GE(s.size(0), 1);
    EXPECT_GE(s.size(1), 1);
    EXPECT_GT(wave.sample_rate, 0);
  });
}

#if defined(VORTEX_HAVE_MEDIA)

// PNG's CRC-32 (ISO 3309, reflected, polynomial 0xEDB88320) of `n` bytes.
uint32_t png_crc(const char* bytes, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= static_cast<uint8_t>(bytes[i]);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// Rewrites every chunk's CRC that the chunk walk from byte 8 reaches, so that a flipped byte
// gets past libpng's checksum into the decoder proper.
void fix_png_crcs(std::string& png) {
  size_t at = 8;
  while (at + 12 <= png.size()) {
    const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(png[i])); };
    const uint64_t length = (byte(at) << 24) | (byte(at + 1) << 16) | (byte(at + 2) << 8) | byte(at + 3);
    if (at + 12 + length > png.size()) return;
    const uint32_t crc = png_crc(png.data() + at + 4, 4 + length);
    for (int k = 0; k < 4; ++k) png[at + 8 + length + k] = static_cast<char>((crc >> (24 - 8 * k)) & 0xff);
    at += 12 + length;
  }
}

TEST(MediaFuzz, DamagedPngsAreReadOrRefusedNeverCrash) {
  TempDir dir;
  Tensor frame = Tensor::empty({13, 17, 3}, DType::kU8);
  for (int64_t i = 0; i < frame.numel(); ++i) frame.data_as<uint8_t>()[i] = static_cast<uint8_t>(i * 37);
  const std::string good_path = dir.file("good.png");
  ASSERT_TRUE(media::write_png(good_path, frame).ok());
  const std::string good = test_util::read_bytes(good_path);

  // The signature, IHDR and the first chunk headers sit in the first 64 bytes. Every other image
  // gets its checksums mended, or libpng would refuse every flip at the CRC; flips in the pixel
  // data behind mended checksums decode.
  std::mt19937 rng(77);
  fuzz_reader(
      good, 64, 2000, rng, dir.file("fuzz.png"), media::read_png_rgb8,
      [](const Tensor& rgb) {
        ASSERT_EQ(rgb.dtype(), DType::kU8);
        ASSERT_EQ(rgb.rank(), 3);
        EXPECT_EQ(rgb.size(2), 3);
        EXPECT_GE(rgb.size(0), 1);
        EXPECT_GE(rgb.size(1), 1);
      },
      [](std::string& image, int iter) {
        if (iter % 2 == 1) fix_png_crcs(image);
      });
}

TEST(MediaFuzz, DamagedMp4sAreReadOrRefusedNeverCrash) {
  TempDir dir;
  const int64_t F = 6, H = 32, W = 48;
  Tensor video = Tensor::empty({3, F, H, W}, DType::kF32);
  for (int64_t i = 0; i < video.numel(); ++i) {
    video.data_as<float>()[i] = 0.5f + 0.4f * std::sin(0.013f * static_cast<float>(i));
  }
  const int rate = 32000, fps = 24;
  Tensor audio = Tensor::empty({2, F * rate / fps}, DType::kF32);
  for (int64_t i = 0; i < audio.numel(); ++i) {
    audio.data_as<float>()[i] = 0.3f * std::sin(0.05f * static_cast<float>(i));
  }
  const std::string good_path = dir.file("good.mp4");
  ASSERT_TRUE(media::write_mp4(good_path, video, fps, &audio, rate, {}).ok());
  const std::string good = test_util::read_bytes(good_path);

  // faststart puts the index (moov) first: the first kilobytes are the container's tables.
  std::mt19937 rng(4242);
  fuzz_reader(good, 4096, 1000, rng, dir.file("fuzz.mp4"),
              [](const std::string& path) { return media::read_video(path); },
              [](const media::DecodedVideo& decoded) {
                const Tensor& frames = decoded.frames;
                ASSERT_EQ(frames.dtype(), DType::kU8);
                ASSERT_EQ(frames.rank(), 4);
                EXPECT_EQ(frames.size(3), 3);
                EXPECT_GE(frames.size(0), 1);
                EXPECT_EQ(decoded.frame_count, frames.size(0));
                EXPECT_TRUE(std::isfinite(decoded.fps) && decoded.fps > 0) << decoded.fps;
                if (decoded.audio.defined()) {
                  ASSERT_EQ(decoded.audio.rank(), 2);
                  EXPECT_GT(decoded.sample_rate, 0);
                }
              });
}

#endif  // VORTEX_HAVE_MEDIA

}  // namespace
}  // namespace vortex
