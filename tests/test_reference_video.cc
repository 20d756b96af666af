// A video reference onto H3's clock (reference_frame_sources, normalize_reference_video) and the
// conditioner's 2 fps reading of it (sample_video_frames, seconds_label): values worked out by hand,
// then the reference pipeline's own (tests/golden/reference_video.safetensors, made by
// tools/golden/make_reference_video_golden.py through MiniMaxH3Ref2VASetupStep and
// MiniMaxH3Ref2VATextEncoderStep).
#include <gtest/gtest.h>

#include <limits>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/h3/reference_video.h"
#include "must.h"
#include "text/video_sampling.h"

namespace vortex {
namespace {

using test::must;

TEST(ReferenceVideo, AtTwentyFourFpsFramesMapToThemselvesAndAreCut) {
  EXPECT_EQ(must(h3::reference_frame_sources(5, 24.0, 121)), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(must(h3::reference_frame_sources(200, 24.0, 3)), (std::vector<int64_t>{0, 1, 2}));
}

TEST(ReferenceVideo, OtherRatesDropAndDuplicateWholeFrames) {
  // 30 fps: slots floor(i * 0.8 + 0.5) = 0 1 2 2 3 4, the end 5 → repeats 1 1 0 1 1 1: frame 2 is dropped.
  EXPECT_EQ(must(h3::reference_frame_sources(6, 30.0, 121)), (std::vector<int64_t>{0, 1, 3, 4, 5}));
  // 12 fps: every frame twice.
  EXPECT_EQ(must(h3::reference_frame_sources(3, 12.0, 121)), (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
  // 16 fps: slots floor(i * 1.5 + 0.5) = 0 2 3 5 | 6 → repeats 2 1 2 1.
  EXPECT_EQ(must(h3::reference_frame_sources(4, 16.0, 121)), (std::vector<int64_t>{0, 0, 1, 2, 2, 3}));
  // Cut at the generated frame count.
  EXPECT_EQ(must(h3::reference_frame_sources(4, 16.0, 4)), (std::vector<int64_t>{0, 0, 1, 2}));
}

TEST(ReferenceVideo, BadRatesAndShapesAreNamed) {
  for (double fps : {0.0, -24.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    const auto r = h3::reference_frame_sources(10, fps, 121);
    ASSERT_FALSE(r.ok()) << fps;
    EXPECT_NE(r.status().message().find("positive frame rate"), std::string::npos) << r.status().message();
  }
  const auto planar = h3::normalize_reference_video(Tensor::zeros({4, 3, 64, 64}, DType::kU8), 24.0, 121);
  ASSERT_FALSE(planar.ok());
  EXPECT_NE(planar.status().message().find("[frames, height, width, 3]"), std::string::npos)
      << planar.status().message();
  EXPECT_FALSE(h3::normalize_reference_video(Tensor::zeros({0, 768, 768, 3}, DType::kU8), 24.0, 121).ok());
}

TEST(ReferenceVideo, FramesAtTheirCanvasPassThroughOnTheClock) {
  // 768 x 768 is its own canvas: only the frame rate changes the frames.
  Tensor frames = Tensor::zeros({3, 768, 768, 3}, DType::kU8);
  for (int64_t f = 0; f < 3; ++f) frames.data_as<uint8_t>()[f * 768 * 768 * 3 + 5] = static_cast<uint8_t>(10 + f);
  const Tensor out = must(h3::normalize_reference_video(frames, 12.0, 5));
  ASSERT_EQ(out.shape(), Shape({5, 768, 768, 3}));
  for (int64_t f = 0; f < 5; ++f) EXPECT_EQ(out.data_as<uint8_t>()[f * 768 * 768 * 3 + 5], 10 + f / 2) << f;
  // Another aspect goes onto the canvas its own aspect resolves to (720p → 768 x 1344).
  const Tensor wide = must(h3::normalize_reference_video(Tensor::zeros({2, 720, 1280, 3}, DType::kU8), 24.0, 121));
  EXPECT_EQ(wide.shape(), Shape({2, 768, 1344, 3}));
}

// Frame by frame, as the decoder feeds it: a 60 fps source shows frames 1, 3, 6, 8, ... (frame 0's
// slot is empty), frames past the cut are ignored, and a frame of another size or no frame at all
// is refused by name.
TEST(ReferenceVideo, TheNormalizerTakesFramesOneAtATime) {
  auto normalizer = must(h3::ReferenceVideoNormalizer::create(60.0, 4));
  for (int f = 0; f < 12; ++f) {
    Tensor frame = Tensor::zeros({768, 768, 3}, DType::kU8);
    frame.data_as<uint8_t>()[0] = static_cast<uint8_t>(f);
    must(normalizer.add(frame));
  }
  EXPECT_TRUE(normalizer.full());
  const Tensor out = must(normalizer.finish());
  ASSERT_EQ(out.shape(), Shape({4, 768, 768, 3}));
  const std::vector<int64_t> sources = must(h3::reference_frame_sources(12, 60.0, 4));
  for (int64_t f = 0; f < 4; ++f) EXPECT_EQ(out.data_as<uint8_t>()[f * 768 * 768 * 3], sources[f]) << f;
  EXPECT_EQ(sources, (std::vector<int64_t>{1, 3, 6, 8}));

  auto mixed = must(h3::ReferenceVideoNormalizer::create(24.0, 10));
  must(mixed.add(Tensor::zeros({768, 768, 3}, DType::kU8)));
  const Status other = mixed.add(Tensor::zeros({720, 1280, 3}, DType::kU8));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.message().find("frame 1"), std::string::npos) << other.message();
  auto empty = must(h3::ReferenceVideoNormalizer::create(24.0, 10));
  EXPECT_FALSE(empty.finish().ok());
  EXPECT_FALSE(h3::ReferenceVideoNormalizer::create(0.0, 10).ok());
  EXPECT_FALSE(h3::ReferenceVideoNormalizer::create(24.0, 0).ok());
}

TEST(VideoSampling, TwoFramesPerSecondInPairsWithTimestamps) {
  // 121 frames at 24 fps: indices 0, 12, ..., 120 (11 frames), padded to 12 → 6 blocks.
  const text::VideoSampling s = must(text::sample_video_frames(121, 24.0, text::kVideoSampleFps, 2));
  ASSERT_EQ(s.blocks.size(), 6u);
  EXPECT_EQ(s.blocks[0], (std::vector<int64_t>{0, 12}));
  EXPECT_EQ(s.blocks[4], (std::vector<int64_t>{96, 108}));
  EXPECT_EQ(s.blocks[5], (std::vector<int64_t>{120, 120}));
  EXPECT_EQ(s.block_seconds, (std::vector<double>{0.25, 1.25, 2.25, 3.25, 4.25, 5.0}));
  EXPECT_EQ(text::seconds_label(s.block_seconds[0]), "<0.2 seconds>");  // ties to even, as Python
  EXPECT_EQ(text::seconds_label(0.75), "<0.8 seconds>");
  EXPECT_EQ(text::seconds_label(5.0), "<5.0 seconds>");
  // 13 frames: indices 0, 12 → one block.
  EXPECT_EQ(must(text::sample_video_frames(13, 24.0, 2.0, 2)).blocks.size(), 1u);
}

TEST(VideoSampling, FractionalStridesRoundHalfToEvenAndDeduplicate) {
  // stride 2.5: cursors 0, 2.5, 5, 7.5, 10 round to 0, 2, 5, 8, 10.
  const text::VideoSampling s = must(text::sample_video_frames(11, 5.0, 2.0, 1));
  ASSERT_EQ(s.blocks.size(), 5u);
  EXPECT_EQ(s.blocks[1], (std::vector<int64_t>{2}));
  EXPECT_EQ(s.blocks[3], (std::vector<int64_t>{8}));
  // stride 0.4: cursors round to 0 0 1 1 2 ... deduplicated.
  const text::VideoSampling dense = must(text::sample_video_frames(3, 1.0, 2.5, 1));
  EXPECT_EQ(dense.blocks, (std::vector<std::vector<int64_t>>{{0}, {1}, {2}}));
}

TEST(VideoSampling, TooShortAVideoNamesTheMinimum) {
  const auto r = text::sample_video_frames(12, 24.0, 2.0, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at least 13 frames at 24 fps (0.54 seconds), got 12"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(text::sample_video_frames(10, 0.0, 2.0, 2).ok());
}

std::vector<int64_t> i64s(const Tensor& t) {
  const int64_t* p = t.data_as<const int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

TEST(ReferenceVideo, TheClockIsThePipelines) {
  const SafetensorsFile file = must(SafetensorsFile::open(test::golden_path("reference_video.safetensors")));
  int cases = 0;
  for (; file.has("clock." + std::to_string(cases) + ".case"); ++cases) {
    const std::string k = "clock." + std::to_string(cases);
    const double* c = must(file.get(k + ".case")).data_as<const double>();
    const auto sources = must(h3::reference_frame_sources(static_cast<int64_t>(c[1]), c[0], static_cast<int64_t>(c[2])));
    EXPECT_EQ(sources, i64s(must(file.get(k + ".sources")))) << k << " at " << c[0] << " fps";
  }
  EXPECT_EQ(cases, 10);
}

TEST(VideoSampling, TheFramesAndLabelsAreThePipelines) {
  const SafetensorsFile file = must(SafetensorsFile::open(test::golden_path("reference_video.safetensors")));
  std::vector<text::VideoSampling> sampled;
  for (int k = 0; file.has("sampling." + std::to_string(k) + ".frames"); ++k) {
    const std::string name = "sampling." + std::to_string(k);
    const int64_t frames = must(file.get(name + ".frames")).data_as<const int64_t>()[0];
    text::VideoSampling s = must(text::sample_video_frames(frames, 24.0, text::kVideoSampleFps, 2));
    std::vector<int64_t> flat;
    for (const auto& block : s.blocks) flat.insert(flat.end(), block.begin(), block.end());
    EXPECT_EQ(flat, i64s(must(file.get(name + ".blocks")))) << name;
    const Tensor seconds = must(file.get(name + ".seconds"));
    const double* want = seconds.data_as<const double>();
    EXPECT_EQ(s.block_seconds, std::vector<double>(want, want + seconds.numel())) << name;
    sampled.push_back(std::move(s));
  }
  ASSERT_EQ(sampled.size(), 8u);
  // The presentation's timestamp labels, in order: video 1 is sampling case 0, video 2 case 1.
  const auto segments = nlohmann::json::parse(file.metadata().at("presentation"));
  std::vector<std::string> labels;
  for (const auto& s : segments) {
    const std::string text = s.get<std::string>();
    if (text.find(" seconds>") != std::string::npos) labels.push_back(text);
  }
  std::vector<std::string> ours;
  for (int v = 0; v < 2; ++v) {
    for (double t : sampled[static_cast<size_t>(v)].block_seconds) ours.push_back(text::seconds_label(t));
  }
  EXPECT_EQ(ours, labels);
  const auto short_video = text::sample_video_frames(12, 24.0, 2.0, 2);
  ASSERT_FALSE(short_video.ok());
  // The pipeline's sentence, from its "at least" on (ours is a clause of a longer error line).
  const std::string theirs = file.metadata().at("too_short");
  const std::string tail = theirs.substr(theirs.find("at least"));
  EXPECT_NE(short_video.status().message().find(tail.substr(0, tail.size() - 1)), std::string::npos)
      << short_video.status().message() << " vs " << theirs;
}

// The frames a video reference's VAE encode takes (snapped down to 17n + 5, all below 22) and the
// latent frames the release's VAE gives for them (one clip of 5 per 17 frames, padded, 3 dropped).
TEST(ReferenceVideo, EncodedFramesAndTheirLatentFrames) {
  for (auto [frames, encoded, latents] : {std::tuple{1, 1, 1}, std::tuple{2, 2, 2}, std::tuple{16, 16, 2},
                                          std::tuple{21, 21, 7}, std::tuple{22, 22, 7}, std::tuple{38, 22, 7},
                                          std::tuple{39, 39, 12}, std::tuple{124, 124, 37}, std::tuple{140, 124, 37}}) {
    EXPECT_EQ(h3::reference_video_encoded_frames(frames), encoded) << frames;
    EXPECT_EQ(h3::reference_video_latent_frames(encoded), latents) << encoded;
  }
}

}  // namespace
}  // namespace vortex
