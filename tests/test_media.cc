// Media writers: WAV (always built), PNG and MP4 (only with VORTEX_HAVE_MEDIA; skipped otherwise).
// Files are read back independently: the WAV header by hand, PNGs with libpng's decoder, MP4s
// with ffprobe (skipped when it is not installed).
#include <gtest/gtest.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "media/media_common.h"
#include "media/wav.h"
#include "safetensors_test_util.h"

#ifdef VORTEX_HAVE_MEDIA
#include <png.h>

#include "media/mp4.h"
#include "media/png.h"
#endif

namespace vortex {
namespace {

namespace fs = std::filesystem;
using test_util::read_bytes;
using test_util::TempDir;
using test_util::write_bytes;

void expect_error(const Status& status, StatusCode code, const std::vector<std::string>& needles) {
  ASSERT_FALSE(status.ok()) << "expected an error containing '" << needles.front() << "'";
  EXPECT_EQ(status.code(), code) << status.to_string();
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << status.to_string();
  for (const std::string& needle : needles) {
    EXPECT_NE(status.message().find(needle), std::string::npos) << "missing '" << needle << "' in: " << status.message();
  }
}

// Names in `dir`, sorted: a failed write must leave exactly what was there before.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

uint32_t le(const std::string& bytes, size_t at, int width) {
  uint32_t v = 0;
  for (int i = 0; i < width; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

Tensor uniform(const Shape& shape, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

// ---- WAV -----------------------------------------------------------------------------------------

TEST(MediaWav, RoundTripHeaderAndClippedRoundedSamples) {
  TempDir dir;
  const std::string path = dir.file("a.wav");
  // [2, 4]: exact values, rounding half away from zero, clipping on both sides.
  const Tensor audio = Tensor::from_f32({0.0f, 0.5f, -0.5f, 1.5f,  //
                                         1.0f, -1.0f, -7.0f, 0.25f},
                                        {2, 4});
  ASSERT_TRUE(media::write_wav(path, audio, 32000).ok());
  const std::string b = read_bytes(path);
  ASSERT_EQ(b.size(), 44u + 2 * 4 * 2);
  EXPECT_EQ(b.substr(0, 4), "RIFF");
  EXPECT_EQ(le(b, 4, 4), b.size() - 8);
  EXPECT_EQ(b.substr(8, 8), "WAVEfmt ");
  EXPECT_EQ(le(b, 16, 4), 16u);
  EXPECT_EQ(le(b, 20, 2), 1u);  // PCM
  EXPECT_EQ(le(b, 22, 2), 2u);  // channels
  EXPECT_EQ(le(b, 24, 4), 32000u);
  EXPECT_EQ(le(b, 28, 4), 32000u * 4);
  EXPECT_EQ(le(b, 32, 2), 4u);   // block align
  EXPECT_EQ(le(b, 34, 2), 16u);  // bits
  EXPECT_EQ(b.substr(36, 4), "data");
  EXPECT_EQ(le(b, 40, 4), 16u);
  // Interleaved L R L R ...: 0.5 * 32767 = 16383.5 -> 16384.
  const int16_t want[] = {0, 32767, 16384, -32767, -16384, -32767, 32767, 8192};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(static_cast<int16_t>(le(b, 44 + 2 * i, 2)), want[i]) << "sample " << i;
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"a.wav"});
}

TEST(MediaWav, MonoBf16AndStridedInput) {
  TempDir dir;
  const Tensor base = Tensor::from_f32({0.25f, 9.0f, -0.75f, 9.0f}, {1, 4});
  ASSERT_TRUE(media::write_wav(dir.file("s.wav"), *base.slice(1, 0, 3), 8000).ok());
  EXPECT_EQ(le(read_bytes(dir.file("s.wav")), 22, 2), 1u);
  const Tensor bf16 = *Tensor::from_f32({0.5f, -0.5f}, {1, 2}).to(DType::kBF16);
  ASSERT_TRUE(media::write_wav(dir.file("b.wav"), bf16, 8000).ok());
  const std::string b = read_bytes(dir.file("b.wav"));
  EXPECT_EQ(static_cast<int16_t>(le(b, 44, 2)), 16384);
  EXPECT_EQ(static_cast<int16_t>(le(b, 46, 2)), -16384);
}

TEST(MediaWav, BadInputNamesTheFieldAndWritesNothing) {
  TempDir dir;
  const std::string path = dir.file("bad.wav");
  expect_error(media::write_wav(path, Tensor::zeros({2, 3, 4}, DType::kF32), 32000), StatusCode::kInvalidArgument,
               {"audio", "rank 3"});
  expect_error(media::write_wav(path, Tensor::zeros({3, 4}, DType::kF32), 32000), StatusCode::kInvalidArgument,
               {"audio", "dim 0 (channels) is 3"});
  expect_error(media::write_wav(path, Tensor::zeros({2, 4}, DType::kI32), 32000), StatusCode::kInvalidArgument,
               {"audio", "dtype I32"});
  expect_error(media::write_wav(path, Tensor::zeros({2, 4}, DType::kF32), 0), StatusCode::kInvalidArgument,
               {"sample_rate 0"});
  Tensor nan = Tensor::zeros({2, 4}, DType::kF32);
  nan.data_as<float>()[6] = std::nanf("");
  expect_error(media::write_wav(path, nan, 32000), StatusCode::kInvalidArgument, {"audio", "element 6 [1, 2]", "NaN"});
  EXPECT_TRUE(listing(dir.path()).empty());
}

TEST(MediaWav, FailedRenameOrMissingDirectoryLeavesNothingBehind) {
  TempDir dir;
  // Renaming a file over a non-empty directory fails after every byte has been written.
  fs::create_directories(dir.path() / "taken" / "inside");
  const Status s = media::write_wav(dir.file("taken"), Tensor::zeros({2, 8}, DType::kF32), 32000);
  expect_error(s, StatusCode::kIoError, {"rename"});
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"taken"});
  expect_error(media::write_wav(dir.file("no/such/dir/a.wav"), Tensor::zeros({2, 8}, DType::kF32), 32000),
               StatusCode::kIoError, {"cannot create"});
}

#ifndef VORTEX_HAVE_MEDIA

TEST(MediaPngMp4, NeedsLibpngAndLibav) { GTEST_SKIP() << "built without libpng/libav* (VORTEX_HAVE_MEDIA off)"; }

#else

// ---- PNG -----------------------------------------------------------------------------------------

// Decodes a PNG as 8-bit RGB with libpng's simplified API: [H * W * 3] plus the size.
std::vector<uint8_t> decode_png(const std::string& path, int* width, int* height) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) return {};
  image.format = PNG_FORMAT_RGB;
  std::vector<uint8_t> rgb(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr)) return {};
  *width = static_cast<int>(image.width);
  *height = static_cast<int>(image.height);
  return rgb;
}

TEST(MediaPng, F32PlanesRoundTripClippedAndRounded) {
  TempDir dir;
  const Tensor frame = uniform({3, 5, 7}, -0.2f, 1.2f, 3);  // [3, H, W], some out of range
  ASSERT_TRUE(media::write_png(dir.file("f.png"), frame).ok());
  int w = 0, h = 0;
  const std::vector<uint8_t> rgb = decode_png(dir.file("f.png"), &w, &h);
  ASSERT_EQ(w, 7);
  ASSERT_EQ(h, 5);
  const float* p = frame.data_as<const float>();
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 7; ++x) {
      for (int c = 0; c < 3; ++c) {
        const float v = std::clamp(p[(c * 5 + y) * 7 + x], 0.0f, 1.0f);
        ASSERT_EQ(rgb[(y * 7 + x) * 3 + c], static_cast<int>(std::floor(v * 255.0f + 0.5f))) << y << "," << x << "," << c;
      }
    }
  }
  EXPECT_EQ(media::unit_to_u8(0.5f), 128);  // 127.5 rounds up
}

TEST(MediaPng, U8InterleavedStridedViewIsWrittenAsIs) {
  TempDir dir;
  Tensor base = Tensor::empty({4, 6, 3}, DType::kU8);
  for (int64_t i = 0; i < base.numel(); ++i) base.data_as<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  const Tensor view = *base.slice(1, 1, 5);  // [4, 4, 3], not contiguous
  ASSERT_FALSE(view.is_contiguous());
  ASSERT_TRUE(media::write_png(dir.file("u.png"), view).ok());
  int w = 0, h = 0;
  const std::vector<uint8_t> rgb = decode_png(dir.file("u.png"), &w, &h);
  ASSERT_EQ(w, 4);
  ASSERT_EQ(h, 4);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) {
      for (int c = 0; c < 3; ++c) ASSERT_EQ(rgb[(y * 4 + x) * 3 + c], static_cast<uint8_t>(((y * 6 + x + 1) * 3 + c) * 7));
    }
  }
}

// Writes `pixels` (rows of `channels` bytes) with libpng's simplified API in `format`.
bool encode_png_file(const std::string& path, const std::vector<uint8_t>& pixels, int width, int height,
                     uint32_t format) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = format;
  return png_image_write_to_file(&image, path.c_str(), 0, pixels.data(), 0, nullptr) != 0;
}

TEST(MediaPngRead, RgbRoundTripsAndGrayExpands) {
  TempDir dir;
  Tensor rgb = Tensor::empty({5, 7, 3}, DType::kU8);
  for (int64_t i = 0; i < rgb.numel(); ++i) rgb.data_as<uint8_t>()[i] = static_cast<uint8_t>(i * 11 + 3);
  ASSERT_TRUE(media::write_png(dir.file("rgb.png"), rgb).ok());
  auto back = media::read_png_rgb8(dir.file("rgb.png"));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->shape(), (Shape{5, 7, 3}));
  EXPECT_EQ(std::memcmp(back->data(), rgb.data(), rgb.nbytes()), 0);

  std::vector<uint8_t> gray(4 * 3);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i * 20);
  ASSERT_TRUE(encode_png_file(dir.file("gray.png"), gray, 4, 3, PNG_FORMAT_GRAY));
  auto g = media::read_png_rgb8(dir.file("gray.png"));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_EQ(g->shape(), (Shape{3, 4, 3}));
  for (int64_t i = 0; i < 12; ++i) {
    for (int c = 0; c < 3; ++c) ASSERT_EQ(g->data_as<uint8_t>()[i * 3 + c], gray[i]) << i;
  }
}

TEST(MediaPngRead, AlphaTruncationAndNonPngAreOneLineErrors) {
  TempDir dir;
  std::vector<uint8_t> rgba(2 * 2 * 4, 200);
  ASSERT_TRUE(encode_png_file(dir.file("rgba.png"), rgba, 2, 2, PNG_FORMAT_RGBA));
  expect_error(media::read_png_rgb8(dir.file("rgba.png")).status(), StatusCode::kInvalidArgument, std::vector<std::string>{"rgba.png", "alpha"});
  // A valid file cut short: the error names the file and where the data ended.
  Tensor rgb = Tensor::zeros({64, 64, 3}, DType::kU8);
  for (int64_t i = 0; i < rgb.numel(); ++i) rgb.data_as<uint8_t>()[i] = static_cast<uint8_t>(i * 37);
  ASSERT_TRUE(media::write_png(dir.file("whole.png"), rgb).ok());
  std::ifstream in(dir.file("whole.png"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_bytes(dir.file("cut.png"), bytes.substr(0, bytes.size() / 2));
  expect_error(media::read_png_rgb8(dir.file("cut.png")).status(), StatusCode::kInvalidArgument, std::vector<std::string>{"cut.png", "near byte"});
  write_bytes(dir.file("text.png"), "hello, not an image");
  expect_error(media::read_png_rgb8(dir.file("text.png")).status(), StatusCode::kInvalidArgument, std::vector<std::string>{"PNG signature"});
  EXPECT_EQ(media::read_png_rgb8(dir.file("missing.png")).status().code(), StatusCode::kNotFound);
}

TEST(MediaPng, FramesAreNumberedAndMatchTheirSlice) {
  TempDir dir;
  const Tensor video = uniform({3, 3, 4, 6}, 0.0f, 1.0f, 5);  // [3, F, H, W]
  const std::string out = (dir.path() / "frames").string();
  ASSERT_TRUE(media::write_png_frames(out, video).ok());
  EXPECT_EQ(listing(out), (std::vector<std::string>{"frame_00000.png", "frame_00001.png", "frame_00002.png"}));
  int w = 0, h = 0;
  const std::vector<uint8_t> rgb = decode_png(out + "/frame_00002.png", &w, &h);
  ASSERT_EQ(rgb.size(), 4u * 6 * 3);
  const float* p = video.data_as<const float>();
  for (int i = 0; i < 24; ++i) {
    for (int c = 0; c < 3; ++c) ASSERT_EQ(rgb[i * 3 + c], media::unit_to_u8(p[(c * 3 + 2) * 24 + i]));
  }
}

TEST(MediaPng, BadInputNamesTheFieldAndWritesNothing) {
  TempDir dir;
  expect_error(media::write_png(dir.file("a.png"), Tensor::zeros({4, 2, 2}, DType::kF32)),
               StatusCode::kInvalidArgument, {"frame", "[4, 2, 2]"});
  expect_error(media::write_png(dir.file("a.png"), Tensor::zeros({2, 2, 4}, DType::kU8)),
               StatusCode::kInvalidArgument, {"frame", "u8 [H, W, 3]"});
  expect_error(media::write_png(dir.file("a.png"), Tensor::zeros({2, 2}, DType::kF32)), StatusCode::kInvalidArgument,
               {"frame", "rank 2"});
  Tensor video = Tensor::zeros({3, 4, 2, 2}, DType::kF32);
  video.data_as<float>()[video.numel() - 1] = INFINITY;  // the last element of the last frame
  expect_error(media::write_png_frames(dir.file("frames"), video), StatusCode::kInvalidArgument,
               {"video", "element 47 [2, 3, 1, 1]", "+inf"});
  EXPECT_TRUE(listing(dir.path()).empty());
}

// ---- MP4 -----------------------------------------------------------------------------------------

constexpr int kFps = 24;
constexpr int kRate = 32000;

// F frames of a diagonal gradient moving right by 4 pixels a frame: [3, F, H, W].
Tensor moving_gradient(int frames, int height, int width) {
  Tensor v = Tensor::empty({3, frames, height, width}, DType::kF32);
  float* p = v.data_as<float>();
  for (int c = 0; c < 3; ++c) {
    for (int f = 0; f < frames; ++f) {
      for (int y = 0; y < height; ++y) {
        for (int x = 0; x < width; ++x) {
          const float u = static_cast<float>((x + 4 * f) % width) / width, w = static_cast<float>(y) / height;
          *p++ = c == 0 ? u : (c == 1 ? w : 0.5f * (u + w));
        }
      }
    }
  }
  return v;
}

// A 440 Hz tone, the right channel at half amplitude: [C, samples].
Tensor tone(int channels, int64_t samples, int rate) {
  Tensor a = Tensor::empty({channels, samples}, DType::kF32);
  for (int c = 0; c < channels; ++c) {
    for (int64_t s = 0; s < samples; ++s) {
      a.data_as<float>()[c * samples + s] = (c == 0 ? 0.5f : 0.25f) * std::sin(2.0 * M_PI * 440.0 * s / rate);
    }
  }
  return a;
}

bool have_ffprobe() { return std::system("command -v ffprobe >/dev/null 2>&1") == 0; }

// ffprobe's JSON for `path` (streams with counted packets, format), or null when it fails.
nlohmann::json probe(const std::string& path) {
  const std::string cmd = "ffprobe -v error -count_packets -show_streams -show_format -of json '" + path + "'";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return nullptr;
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) text.append(buf, n);
  if (::pclose(pipe) != 0) return nullptr;
  return nlohmann::json::parse(text, nullptr, false);
}

const nlohmann::json* stream_of(const nlohmann::json& info, const std::string& type, int* count) {
  const nlohmann::json* found = nullptr;
  *count = 0;
  for (const auto& s : info["streams"]) {
    if (s.value("codec_type", "") == type) {
      ++*count;
      found = &s;
    }
  }
  return found;
}

double number(const nlohmann::json& j, const std::string& key) { return std::stod(j.value(key, "nan")); }

// Durations must come out at frames / fps. The tolerance is 0.1 ms: the audio is a whole number
// of samples (29333 for 22 frames at 32 kHz, 10 us short of 22/24 s), the video exact in mov's
// 1/12288 time base, and ffprobe prints microseconds. The audio sample count is checked exactly.
constexpr double kDurationTolerance = 1e-4;

TEST(MediaMp4, SyntheticClipProbesAsH264AndStereoAacOfTheRightLength) {
  if (!have_ffprobe()) GTEST_SKIP() << "ffprobe not installed";
  TempDir dir;
  const std::string path = dir.file("clip.mp4");
  const int frames = 22;
  const Tensor video = moving_gradient(frames, 96, 128);
  const Tensor audio = tone(2, frames * kRate / kFps, kRate);  // 29333 samples, 1/3 sample short
  const Status s = media::write_mp4(path, video, kFps, &audio, kRate, {});
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"clip.mp4"});

  const nlohmann::json info = probe(path);
  ASSERT_FALSE(info.is_null());
  int n_video = 0, n_audio = 0;
  const nlohmann::json* v = stream_of(info, "video", &n_video);
  const nlohmann::json* a = stream_of(info, "audio", &n_audio);
  ASSERT_EQ(n_video, 1) << info.dump();
  ASSERT_EQ(n_audio, 1) << info.dump();
  EXPECT_EQ(v->value("codec_name", ""), "h264");
  EXPECT_EQ(v->value("pix_fmt", ""), "yuv420p");
  EXPECT_EQ(v->value("width", 0), 128);
  EXPECT_EQ(v->value("height", 0), 96);
  EXPECT_EQ(v->value("color_space", ""), "bt709");
  EXPECT_EQ(v->value("r_frame_rate", ""), "24/1");
  EXPECT_EQ(v->value("nb_frames", ""), "22");
  EXPECT_EQ(v->value("nb_read_packets", ""), "22");
  EXPECT_NEAR(number(*v, "duration"), 22.0 / kFps, kDurationTolerance);
  EXPECT_EQ(a->value("codec_name", ""), "aac");
  EXPECT_EQ(a->value("channels", 0), 2);
  EXPECT_EQ(a->value("sample_rate", ""), "32000");  // kept: AAC allows 32 kHz
  EXPECT_NEAR(number(*a, "duration"), 22.0 / kFps, kDurationTolerance);
  EXPECT_EQ(a->value("duration_ts", 0), 29333) << "samples at 1/32000";
  EXPECT_NEAR(number(info["format"], "duration"), 22.0 / kFps, kDurationTolerance);
  EXPECT_EQ(info["format"].value("format_name", "").find("mp4"), 4u) << "mov,mp4,m4a,...";
  // faststart: the index (moov) comes before the media data (mdat).
  const std::string bytes = read_bytes(path);
  EXPECT_LT(bytes.find("moov"), bytes.find("mdat"));
}

TEST(MediaMp4, OddRateIsResampledMonoAndSilentVideoWork) {
  if (!have_ffprobe()) GTEST_SKIP() << "ffprobe not installed";
  TempDir dir;
  const Tensor video = moving_gradient(6, 32, 48);
  // 40 kHz is no AAC rate: resampled to 44.1 kHz. One frame's worth longer than the video: cut.
  const Tensor mono = tone(1, 7 * 40000 / kFps, 40000);
  Status s = media::write_mp4(dir.file("mono.mp4"), video, kFps, &mono, 40000, {});
  ASSERT_TRUE(s.ok()) << s.to_string();
  nlohmann::json info = probe(dir.file("mono.mp4"));
  int n = 0;
  const nlohmann::json* a = stream_of(info, "audio", &n);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(a->value("channels", 0), 1);
  EXPECT_EQ(a->value("sample_rate", ""), "44100");
  EXPECT_NEAR(number(*a, "duration"), 6.0 / kFps, kDurationTolerance);
  EXPECT_EQ(a->value("duration_ts", 0), 11025) << "samples at 1/44100";

  media::Mp4Options fast;
  fast.preset = "ultrafast";
  fast.crf = 30;
  s = media::write_mp4(dir.file("silent.mp4"), video, kFps, nullptr, 0, fast);
  ASSERT_TRUE(s.ok()) << s.to_string();
  info = probe(dir.file("silent.mp4"));
  ASSERT_EQ(info["streams"].size(), 1u);
  EXPECT_EQ(info["streams"][0].value("nb_read_packets", ""), "6");
  EXPECT_NEAR(number(info["format"], "duration"), 6.0 / kFps, kDurationTolerance);
}

TEST(MediaMp4, BadInputNamesTheFieldAndWritesNothing) {
  TempDir dir;
  const std::string path = dir.file("bad.mp4");
  const Tensor video = moving_gradient(4, 16, 16);
  const Tensor audio = tone(2, 4 * kRate / kFps, kRate);
  auto check = [&](const Status& s, const std::vector<std::string>& needles) {
    expect_error(s, StatusCode::kInvalidArgument, needles);
  };
  check(media::write_mp4(path, moving_gradient(4, 16, 15), kFps, nullptr, 0), {"video", "[3, 4, 16, 15]", "even"});
  check(media::write_mp4(path, Tensor::zeros({3, 4, 16}, DType::kF32), kFps, nullptr, 0), {"video", "rank 3"});
  check(media::write_mp4(path, Tensor::zeros({4, 4, 16, 16}, DType::kF32), kFps, nullptr, 0),
        {"video", "dim 0 (channels) is 4"});
  check(media::write_mp4(path, Tensor::zeros({3, 4, 16, 16}, DType::kU8), kFps, nullptr, 0), {"video", "dtype U8"});
  check(media::write_mp4(path, video, 0, nullptr, 0), {"fps 0"});
  check(media::write_mp4(path, video, kFps, &audio, 0), {"sample_rate 0"});
  const Tensor three = Tensor::zeros({3, 5333}, DType::kF32);
  check(media::write_mp4(path, video, kFps, &three, kRate), {"audio", "dim 0 (channels) is 3"});
  // Longer or shorter than the video by more than one frame (1333.3 samples here).
  const Tensor longer = tone(2, 5333 + 1334, kRate), shorter = tone(2, 5333 - 1334, kRate);
  check(media::write_mp4(path, video, kFps, &longer, kRate), {"audio", "6667 samples", "expected 5333"});
  check(media::write_mp4(path, video, kFps, &shorter, kRate), {"audio", "3999 samples"});
  Tensor nan_audio = audio.clone();
  nan_audio.data_as<float>()[5333 + 10] = std::nanf("");
  check(media::write_mp4(path, video, kFps, &nan_audio, kRate), {"audio", "element 5343 [1, 10]", "NaN"});
  media::Mp4Options bad;
  bad.crf = 52;
  check(media::write_mp4(path, video, kFps, nullptr, 0, bad), {"options.crf 52"});
  bad = {};
  bad.preset = "quick";
  check(media::write_mp4(path, video, kFps, nullptr, 0, bad), {"options.preset \"quick\""});
  bad = {};
  bad.video_encoder = "mpeg4";
  check(media::write_mp4(path, video, kFps, nullptr, 0, bad), {"options.video_encoder \"mpeg4\"", "H.264"});
  EXPECT_TRUE(listing(dir.path()).empty());
}

#if defined(__GLIBC__)
// libx264 reads heap bytes it never wrote (its lookahead, every preset but ultrafast): with a
// noisy clip, what earlier allocations left on the heap changed the file (by up to 3% of its
// size) until write_mp4 held the heap zero-filled while it encodes. glibc's perturb byte stands in
// for other heap histories here (another thread count, another job in the same server).
TEST(MediaMp4, TheSameFramesGiveTheSameBitsWhateverTheHeapHeld) {
  TempDir dir;
  Tensor video = moving_gradient(22, 32, 48);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
  for (int64_t i = 0; i < video.numel(); ++i) video.data_as<float>()[i] += noise(rng);
  std::string first;
  for (const int heap_fill : {0, 77, 165, 1}) {
    SCOPED_TRACE("perturb byte " + std::to_string(heap_fill));
    mallopt(M_PERTURB, heap_fill);
    const Status s = media::write_mp4(dir.file("clip.mp4"), video, kFps, nullptr, 0);
    mallopt(M_PERTURB, 0);
    ASSERT_TRUE(s.ok()) << s.to_string();
    const std::string bytes = read_bytes(dir.file("clip.mp4"));
    if (first.empty()) first = bytes;
    EXPECT_TRUE(bytes == first) << bytes.size() << " bytes, the first file " << first.size();
  }
}
#endif

TEST(MediaMp4, FailuresLeaveNoPartialFileAndKeepTheOldOne) {
  TempDir dir;
  const std::string path = dir.file("out.mp4");
  write_bytes(path, "previous contents");
  const Tensor audio = tone(2, 4 * kRate / kFps, kRate);
  // A NaN in the last frame is found before anything is encoded.
  Tensor video = moving_gradient(4, 16, 16);
  video.data_as<float>()[video.numel() - 1] = std::nanf("");
  expect_error(media::write_mp4(path, video, kFps, &audio, kRate), StatusCode::kInvalidArgument,
               {"video", "element 3071 [2, 3, 15, 15]", "NaN"});
  EXPECT_EQ(read_bytes(path), "previous contents");
  // A rename over a non-empty directory fails after the whole file was encoded and closed.
  fs::create_directories(dir.path() / "taken.mp4" / "inside");
  const Tensor good = moving_gradient(4, 16, 16);
  expect_error(media::write_mp4(dir.file("taken.mp4"), good, kFps, &audio, kRate), StatusCode::kIoError, {"rename"});
  // A missing directory fails at libav's open, named with libav's text.
  expect_error(media::write_mp4(dir.file("no/such/out.mp4"), good, kFps, &audio, kRate), StatusCode::kIoError,
               {"avio_open failed", "No such file or directory"});
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"out.mp4", "taken.mp4"}));
  EXPECT_EQ(read_bytes(path), "previous contents");
}

#endif  // VORTEX_HAVE_MEDIA

}  // namespace
}  // namespace vortex
