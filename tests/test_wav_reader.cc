// The WAVE reader (ref2va's audio references): what the writer writes reads back, every PCM and
// float width converts as ffmpeg's conversion to planar float does, foreign chunks are skipped,
// and malformed files are one error naming the byte or field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "cli_test_util.h"
#include "media/wav.h"

namespace vortex {
namespace {

using test_util::TempDir;

void put(std::string& s, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}

// A WAVE file of `format` / `bits` / `channels` at 16 kHz around `data`, with an odd-sized LIST
// chunk before it.
std::string wave_file(int format, int bits, int channels, const std::string& data, bool extensible = false) {
  std::string fmt;
  put(fmt, extensible ? 0xFFFE : format, 2);
  put(fmt, channels, 2);
  put(fmt, 16000, 4);
  put(fmt, 16000 * channels * bits / 8, 4);
  put(fmt, channels * bits / 8, 2);
  put(fmt, bits, 2);
  if (extensible) {
    put(fmt, 22, 2);
    put(fmt, bits, 2);
    put(fmt, 0, 4);
    put(fmt, format, 2);
    fmt += std::string(14, '\0');
  }
  std::string body = "WAVE";
  body += "fmt ";
  put(body, static_cast<uint32_t>(fmt.size()), 4);
  body += fmt;
  body += "LIST";
  put(body, 3, 4);
  body += std::string("abc") + '\0';  // padded to even
  body += "data";
  put(body, static_cast<uint32_t>(data.size()), 4);
  body += data;
  std::string file = "RIFF";
  put(file, static_cast<uint32_t>(body.size()), 4);
  return file + body;
}

Result<media::Waveform> read_bytes_as_wav(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.file("in.wav");
  test_util::write_bytes(path, bytes);
  return media::read_wav(path);
}

TEST(WavReader, WhatTheWriterWritesReadsBack) {
  TempDir dir;
  Tensor audio = Tensor::empty({2, 5}, DType::kF32);
  const float values[10] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 0.25f, -0.125f, 0.999f, 0.001f, -0.75f};
  for (int i = 0; i < 10; ++i) audio.data_as<float>()[i] = values[i];
  ASSERT_TRUE(media::write_wav(dir.file("a.wav"), audio, 32000).ok());
  auto w = media::read_wav(dir.file("a.wav"));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->sample_rate, 32000);
  ASSERT_EQ(w->samples.shape(), Shape({2, 5}));
  for (int i = 0; i < 10; ++i) {
    const float s16 = std::round(values[i] * 32767.0f);
    EXPECT_EQ(w->samples.data_as<const float>()[i], s16 / 32768.0f) << i;
  }
}

TEST(WavReader, EveryWidthConvertsAsFfmpegDoes) {
  TempDir dir;
  std::string u8 = {static_cast<char>(0), static_cast<char>(128), static_cast<char>(255)};
  auto a = read_bytes_as_wav(dir, wave_file(1, 8, 1, u8));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->samples.data_as<const float>()[0], -1.0f);
  EXPECT_EQ(a->samples.data_as<const float>()[1], 0.0f);
  EXPECT_EQ(a->samples.data_as<const float>()[2], 127.0f / 128.0f);
  std::string s24;
  put(s24, 0x400000, 3);  // 2^22: 0.5
  put(s24, 0xC00000, 3);  // -2^22: -0.5
  auto b = read_bytes_as_wav(dir, wave_file(1, 24, 2, s24, /*extensible=*/true));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_EQ(b->samples.shape(), Shape({2, 1}));
  EXPECT_EQ(b->samples.data_as<const float>()[0], 0.5f);
  EXPECT_EQ(b->samples.data_as<const float>()[1], -0.5f);
  std::string f32;
  const float x = 0.3f;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  put(f32, bits, 4);
  auto c = read_bytes_as_wav(dir, wave_file(3, 32, 1, f32));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->samples.data_as<const float>()[0], 0.3f);
  EXPECT_EQ(c->sample_rate, 16000);
  // A data chunk cut short keeps its whole frames.
  std::string s16;
  put(s16, 0x4000, 2);
  put(s16, 0x2000, 2);
  std::string cut = wave_file(1, 16, 1, s16);
  cut.resize(cut.size() - 1);
  auto d = read_bytes_as_wav(dir, cut);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->samples.shape(), Shape({1, 1}));
  EXPECT_EQ(d->samples.data_as<const float>()[0], 0.5f);
}

TEST(WavReader, MalformedFilesAreNamed) {
  TempDir dir;
  const auto refused = [&](const std::string& bytes, const std::string& needle) {
    auto w = read_bytes_as_wav(dir, bytes);
    ASSERT_FALSE(w.ok()) << needle;
    EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status().message();
  };
  refused("not a wave file at all", "byte 0: not a RIFF/WAVE file");
  std::string s16;
  put(s16, 1, 2);
  refused(wave_file(2, 4, 1, s16), "format 2 with 4 bits is not PCM");
  refused(wave_file(1, 12, 1, s16), "format 1 with 12 bits");
  refused(wave_file(1, 16, 1, ""), "no samples");
  std::string no_data = wave_file(1, 16, 1, s16);
  no_data.resize(no_data.find("data"));
  refused(no_data, "no 'data' chunk");
  std::string short_list = wave_file(1, 16, 1, s16);
  short_list.resize(short_list.find("LIST") + 9);
  refused(short_list, "chunk 'LIST' of 3 bytes runs past the end of the file");
  // A damaged tag is shown escaped: the message stays on one line.
  std::string bad_tag = short_list;
  bad_tag[bad_tag.find("LIST") + 2] = '\n';
  refused(bad_tag, "chunk 'LI\\x0AT' of 3 bytes runs past the end of the file");
  EXPECT_EQ(media::read_wav(dir.file("none.wav")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace vortex
