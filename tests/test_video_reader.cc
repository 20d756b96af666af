// The video reader (media/video_reader.h) on files our MP4 writer makes: frame count, rate, size
// and pixels, the soundtrack's channels, rate and length; a duration cap; and the refusals. H.264 at
// crf 0 is lossless in YUV, but 4:2:0 chroma and the two conversions are not: measured 1.37 8-bit
// steps mean absolute error on a smooth field (bound 2; decoding with the wrong matrix, BT.601 for
// the writer's BT.709, gives 5.4). A display-matrix rotation (ffmpeg's `rotate` tag on a copy of such
// a file) is undone as ffmpeg's own player does, checked against the ffmpeg binary's autorotated
// decode. The colour conversion is the ffmpeg binary's bit for bit for three matrix / range tags. Not
// checked here: PyAV's own rgb24 bits (neither of our machines has PyAV; the GPU machine's Python
// lacks it too).
#include <gtest/gtest.h>

#if defined(VORTEX_HAVE_MEDIA)

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "cli_test_util.h"
#include "media/mp4.h"
#include "media/video_reader.h"
#include "media/wav.h"
#include "must.h"

namespace vortex::media {
namespace {

using test::must;

// A smooth moving field, RGB planes [3, F, H, W] in [0, 1].
Tensor moving_field(int64_t frames, int64_t h, int64_t w) {
  Tensor t = Tensor::empty({3, frames, h, w}, DType::kF32);
  float* p = t.data_as<float>();
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t f = 0; f < frames; ++f)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          *p++ = 0.5f + 0.4f * static_cast<float>(std::sin(0.02 * (x + 4 * f) + 0.03 * y + c));
  return t;
}

TEST(VideoReader, ReadsBackWhatTheWriterWrote) {
  test_util::TempDir tmp;
  const std::string path = (tmp.path() / "clip.mp4").string();
  const int64_t F = 30, H = 64, W = 96;
  const Tensor video = moving_field(F, H, W);
  const int rate = 32000;
  Tensor audio = Tensor::empty({2, F * rate / 30}, DType::kF32);
  for (int64_t i = 0; i < audio.numel(); ++i) {
    audio.data_as<float>()[i] = 0.3f * static_cast<float>(std::sin(0.05 * static_cast<double>(i % audio.size(1))));
  }
  Mp4Options options;
  options.crf = 0;
  must(write_mp4(path, video, 30, &audio, rate, options));

  const DecodedVideo d = must(read_video(path));
  EXPECT_EQ(d.frames.shape(), Shape({F, H, W, 3}));
  EXPECT_DOUBLE_EQ(d.fps, 30.0);
  EXPECT_EQ(d.quarter_turns, 0);
  double err = 0;
  const uint8_t* got = d.frames.data_as<const uint8_t>();
  const float* want = video.data_as<const float>();
  for (int64_t f = 0; f < F; ++f)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x)
        for (int64_t c = 0; c < 3; ++c) {
          const double ref = std::round(want[((c * F + f) * H + y) * W + x] * 255.0);
          err += std::abs(got[((f * H + y) * W + x) * 3 + c] - ref);
        }
  err /= static_cast<double>(F * H * W * 3);
  EXPECT_LT(err, 2.0) << "mean absolute error in 8-bit steps";
  std::printf("mean absolute pixel error after H.264 crf 0 (4:2:0): %.3f\n", err);

  ASSERT_TRUE(d.audio.defined());
  EXPECT_EQ(d.audio.size(0), 2);
  EXPECT_EQ(d.sample_rate, rate);
  EXPECT_NEAR(static_cast<double>(d.audio.size(1)), static_cast<double>(audio.size(1)), 2048.0);

  // A duration cap stops the decode early: the frames starting within 0.2 s at 30 fps, and one more.
  EXPECT_EQ(must(read_video(path, 0.2)).frames.size(0), 7);
}

// A phone's portrait clip is stored sideways with a display matrix. ffmpeg shows it upright by
// applying the matrix (av_display_rotation_get's counterclockwise angle); read_video's frames are
// what the ffmpeg binary's autorotated rgb24 decode gives, for each quarter turn. (The reference
// pipeline's _decode_video_file turns the other way: np.rot90(k = -round(rotation / 90)), which
// stands a 90° clip on its head; we follow ffmpeg, which its comment says it meant to reproduce.)
TEST(VideoReader, ARotatedClipIsUprightAsFfmpegShowsIt) {
  if (std::system("ffmpeg -version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no ffmpeg binary (scripts/deps installs it)";
  test_util::TempDir tmp;
  const std::string source = (tmp.path() / "source.mp4").string();
  const int64_t H = 32, W = 48;
  Mp4Options options;
  options.crf = 0;
  must(write_mp4(source, moving_field(2, H, W), 24, nullptr, 0, options));
  for (const int tag : {90, 180, 270}) {
    SCOPED_TRACE("rotate=" + std::to_string(tag));
    const std::string rotated = (tmp.path() / ("r" + std::to_string(tag) + ".mp4")).string();
    const std::string raw = (tmp.path() / ("r" + std::to_string(tag) + ".rgb")).string();
    ASSERT_EQ(std::system(("ffmpeg -loglevel error -y -i " + source + " -c copy -metadata:s:v:0 rotate=" +
                           std::to_string(tag) + " " + rotated)
                              .c_str()),
              0);
    ASSERT_EQ(std::system(("ffmpeg -loglevel error -y -i " + rotated + " -frames:v 1 -f rawvideo -pix_fmt rgb24 " + raw)
                              .c_str()),
              0);
    const DecodedVideo d = must(read_video(rotated));
    const Shape upright = tag == 180 ? Shape({2, H, W, 3}) : Shape({2, W, H, 3});
    ASSERT_EQ(d.frames.shape(), upright);
    const std::string shown = test_util::read_bytes(raw);
    ASSERT_EQ(shown.size(), static_cast<size_t>(H * W * 3));
    double err = 0;
    for (size_t i = 0; i < shown.size(); ++i) {
      err += std::abs(static_cast<int>(d.frames.data_as<const uint8_t>()[i]) - static_cast<uint8_t>(shown[i]));
    }
    err /= static_cast<double>(shown.size());
    EXPECT_LT(err, 1.0) << "mean absolute difference from ffmpeg's upright frame, in 8-bit steps";
  }
}

// The colour conversion PyAV's to_ndarray(format="rgb24") asks libswscale for: the frame's own matrix
// and range (tagged BT.709 limited, untagged (swscale's default, BT.601), BT.601 full range from a
// yuvj420p stream). read_video's frames are the bits the ffmpeg binary's rgb24 decode gives with the
// same libswscale, bilinear or its default flags (at the frame's own size the scaler's filter does not
// enter). PyAV itself is on neither of our machines, so its own bits (its bundled FFmpeg) are not checked.
TEST(VideoReader, ColoursAreConvertedWithTheFramesOwnMatrixAndRange) {
  if (std::system("ffmpeg -version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no ffmpeg binary (scripts/deps installs it)";
  test_util::TempDir tmp;
  struct Clip {
    const char* name;
    const char* encode;  // ffmpeg options for libx264
  };
  for (const Clip clip : {Clip{"bt709", "-pix_fmt yuv420p -colorspace bt709 -color_primaries bt709 -color_trc bt709 "
                                        "-color_range tv"},
                          Clip{"untagged", "-pix_fmt yuv420p"},
                          Clip{"full601", "-pix_fmt yuvj420p -colorspace bt470bg -color_range pc"}}) {
    SCOPED_TRACE(clip.name);
    const std::string mp4 = (tmp.path() / (std::string(clip.name) + ".mp4")).string();
    const std::string raw = (tmp.path() / (std::string(clip.name) + ".rgb")).string();
    ASSERT_EQ(std::system(("ffmpeg -loglevel error -y -f lavfi -i testsrc2=size=96x64:rate=24 -frames:v 4 -c:v libx264 "
                           "-crf 12 " + std::string(clip.encode) + " " + mp4)
                              .c_str()),
              0);
    const DecodedVideo d = must(read_video(mp4));
    ASSERT_EQ(d.frames.shape(), Shape({4, 64, 96, 3}));
    for (const char* flags : {"", "-sws_flags bilinear "}) {
      ASSERT_EQ(std::system(("ffmpeg -loglevel error -y -i " + mp4 + " " + flags + "-f rawvideo -pix_fmt rgb24 " + raw)
                                .c_str()),
                0);
      const std::string shown = test_util::read_bytes(raw);
      ASSERT_EQ(shown.size(), static_cast<size_t>(d.frames.nbytes()));
      int64_t differing = 0;
      for (size_t i = 0; i < shown.size(); ++i) {
        differing += d.frames.data_as<const uint8_t>()[i] != static_cast<uint8_t>(shown[i]);
      }
      EXPECT_EQ(differing, 0) << "bytes unlike ffmpeg's rgb24 decode " << flags;
    }
  }
}

TEST(VideoReader, SilentVideosHaveNoSoundtrack) {
  test_util::TempDir tmp;
  const std::string path = (tmp.path() / "silent.mp4").string();
  must(write_mp4(path, moving_field(5, 32, 32), 24, nullptr, 0));
  const DecodedVideo d = must(read_video(path));
  EXPECT_EQ(d.frames.size(0), 5);
  EXPECT_DOUBLE_EQ(d.fps, 24.0);
  EXPECT_FALSE(d.audio.defined());
}

TEST(VideoReader, RefusalsNameTheFile) {
  test_util::TempDir tmp;
  const std::string missing = (tmp.path() / "absent.mp4").string();
  const auto absent = read_video(missing);
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(absent.status().message().find(missing), std::string::npos) << absent.status().message();
  const std::string wav = (tmp.path() / "voice.wav").string();
  must(write_wav(wav, Tensor::zeros({1, 3200}, DType::kF32), 32000));
  const auto sound_only = read_video(wav);
  ASSERT_FALSE(sound_only.ok());
  EXPECT_NE(sound_only.status().message().find("no video stream"), std::string::npos) << sound_only.status().message();
  // A missing file is not_found; bytes libav cannot read are corrupt_data, with libav's own last
  // error line in the message (and nothing of libav's on stderr).
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound) << absent.status().to_string();
  const std::string junk = (tmp.path() / "junk.mp4").string();
  test_util::write_bytes(junk, "not a video at all");
  const auto unreadable = read_video(junk);
  ASSERT_FALSE(unreadable.ok());
  EXPECT_EQ(unreadable.status().code(), StatusCode::kCorruptData) << unreadable.status().to_string();
  EXPECT_NE(unreadable.status().message().find(junk + ": avformat_open_input failed"), std::string::npos)
      << unreadable.status().message();
}

}  // namespace
}  // namespace vortex::media

#endif  // VORTEX_HAVE_MEDIA
