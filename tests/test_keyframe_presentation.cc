// The fl2va presentation through TextConditioner: a synthetic Qwen3-VL checkpoint with a vision
// tower (text/synthetic_qwen3.h) and the committed trimmed tokenizer. The token list is the
// reference pipeline's (MiniMaxH3TextEncoderStep for keyframes: per keyframe the label
// "<Picture i>: " tokenized without special tokens, <|vision_start|>, one <|image_pad|> per merged
// patch, <|vision_end|>; then the prompt), the vision rows are flagged, the states are the text
// encoder's on the vision tower's features, and wrong sizes or a missing tower are named.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "cli_test_util.h"
#include "h3_golden_util.h"
#include "must.h"
#include "text/synthetic_qwen3.h"
#include "text/text_conditioner.h"

namespace vortex::text {
namespace {

namespace fs = std::filesystem;
using test::must;

constexpr int64_t kQwenVocab = 151936;

Tensor test_image(int64_t h, int64_t w) {
  Tensor t = Tensor::empty({h, w, 3}, DType::kU8);
  uint8_t* p = t.data_as<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint8_t>((i * 37 + i / 7) % 251);
  return t;
}

class KeyframePresentation : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticQwen3Shape shape;
    shape.vocab = kQwenVocab;
    shape.vision_depth = 2;
    must(write_synthetic_qwen3(dir().string(), shape));
  }
  fs::path dir() const { return tmp_.path() / "qwen3_vl"; }
  std::unique_ptr<TextConditioner> load() const {
    return must(TextConditioner::load({dir().string(), test::golden_path("qwen_tokenizer_trimmed.json"), 2}));
  }
  test_util::TempDir tmp_;
};

TEST_F(KeyframePresentation, MissingEncoderFolderIsNamed) {
  const std::string missing = (tmp_.path() / "absent").string();
  const auto t = TextConditioner::load({missing, "", 2});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(missing + " does not exist"), std::string::npos) << t.status().message();
}

TEST_F(KeyframePresentation, TokensFlagsAndStates) {
  auto conditioner = load();
  const Presentation p = must(conditioner->keyframe_presentation("A cat.", {{64, 96}, {64, 96}}));
  const std::vector<int32_t> prompt = must(conditioner->tokenize("A cat."));
  const std::vector<int32_t> label1 = must(conditioner->tokenize("<Picture 1>: "));
  const std::vector<int32_t> label2 = must(conditioner->tokenize("<Picture 2>: "));
  std::vector<int32_t> want;
  std::vector<bool> vision;
  for (const auto* label : {&label1, &label2}) {
    want.insert(want.end(), label->begin(), label->end());
    vision.insert(vision.end(), label->size(), false);
    want.push_back(151652);
    want.insert(want.end(), 6, 151655);  // 4 x 6 patches of 16, merged 2 x 2
    want.push_back(151653);
    vision.insert(vision.end(), 8, true);
  }
  want.insert(want.end(), prompt.begin(), prompt.end());
  vision.insert(vision.end(), prompt.size(), false);
  EXPECT_EQ(p.ids, want);
  EXPECT_EQ(p.vision, vision);
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_EQ(p.blocks[0].grid.tokens(), 6);
  EXPECT_EQ(p.blocks[1].visual, 1u);

  const Tensor states = must(conditioner->encode_presentation(p, {test_image(64, 96), test_image(64, 96)}));
  EXPECT_EQ(states.shape(), Shape({static_cast<int64_t>(want.size()), 8}));
  // The label rows before the first vision block see no image: the text-only encode's bits there.
  const Tensor plain = must(conditioner->encode(p.ids));
  const size_t label_bytes = label1.size() * 8 * sizeof(uint16_t);
  EXPECT_EQ(std::memcmp(states.data(), plain.data(), label_bytes), 0);
  EXPECT_GT(test::rel_l2(states, plain), 1e-2);  // the image rows and everything after them differ
  // Deterministic.
  const Tensor again = must(conditioner->encode_presentation(p, {test_image(64, 96), test_image(64, 96)}));
  EXPECT_EQ(std::memcmp(states.data(), again.data(), states.nbytes()), 0);
}

// The ids and vision flags a presentation should hold, built up in reading order: text runs
// tokenized by the conditioner, vision blocks of six pads (a 64 x 96 picture's, merged).
struct ExpectedPresentation {
  const TextConditioner& conditioner;
  std::vector<int32_t> ids;
  std::vector<bool> vision;
  void text(const std::string& s) {
    const std::vector<int32_t> run = must(conditioner.tokenize(s));
    ids.insert(ids.end(), run.begin(), run.end());
    vision.insert(vision.end(), run.size(), false);
  }
  void block(int32_t pad) {
    ids.push_back(151652);
    ids.insert(ids.end(), 6, pad);
    ids.push_back(151653);
    vision.insert(vision.end(), 8, true);
  }
};

// ref2va: labels numbered per modality in reading order; an audio reference is its label alone.
TEST_F(KeyframePresentation, ReferencesAreLabelledPerModality) {
  auto conditioner = load();
  const Presentation p =
      must(conditioner->reference_presentation("A cat.", {PresentedReference::audio(), PresentedReference::picture(64, 96),
                                                          PresentedReference::audio()}));
  ExpectedPresentation want{*conditioner};
  want.text("<Audio 1>: ");
  want.text("<Picture 1>: ");
  want.block(151655);
  want.text("<Audio 2>: ");
  want.text("A cat.");
  EXPECT_EQ(p.ids, want.ids);
  EXPECT_EQ(p.vision, want.vision);
  EXPECT_EQ(p.blocks.size(), 1u);
  // All pictures: the keyframes' presentation.
  const Presentation pictures = must(conditioner->reference_presentation(
      "A cat.", {PresentedReference::picture(64, 96), PresentedReference::picture(64, 96)}));
  EXPECT_EQ(pictures.ids, must(conditioner->keyframe_presentation("A cat.", {{64, 96}, {64, 96}})).ids);
}

Tensor test_video(int64_t frames, int64_t h, int64_t w) {
  Tensor t = Tensor::empty({frames, h, w, 3}, DType::kU8);
  uint8_t* p = t.data_as<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint8_t>((i * 29 + i / 5 + i / 18432) % 253);
  return t;
}

// ref2va with videos: a video's "<Video k>: " label (after "<Audio j>: " when it has sound), then
// per 2 fps block its timestamp label and a <|video_pad|> block; the blocks read the sampled frames.
TEST_F(KeyframePresentation, VideosAreLabelledAndTimestampedPerBlock) {
  auto conditioner = load();
  const Presentation p = must(conditioner->reference_presentation(
      "A cat.", {PresentedReference::video(37, 24.0, 64, 96, true), PresentedReference::picture(64, 96),
                 PresentedReference::video(25, 24.0, 64, 96, false)}));
  ExpectedPresentation want{*conditioner};
  want.text("<Audio 1>: ");
  want.text("<Video 1>: ");
  want.text("<0.2 seconds>");
  want.block(151656);
  want.text("<1.2 seconds>");
  want.block(151656);
  want.text("<Picture 1>: ");
  want.block(151655);
  want.text("<Video 2>: ");
  want.text("<0.2 seconds>");
  want.block(151656);
  want.text("<1.0 seconds>");
  want.block(151656);
  want.text("A cat.");
  EXPECT_EQ(p.ids, want.ids);
  EXPECT_EQ(p.vision, want.vision);
  ASSERT_EQ(p.blocks.size(), 5u);
  EXPECT_EQ(p.visuals, 3u);
  EXPECT_EQ(p.blocks[1].frames, (std::vector<int64_t>{24, 36}));
  EXPECT_EQ(p.blocks[2].visual, 1u);
  EXPECT_TRUE(p.blocks[2].frames.empty());
  EXPECT_EQ(p.blocks[4].frames, (std::vector<int64_t>{24, 24}));  // the last sampled frame repeated

  const Tensor v1 = test_video(37, 64, 96), v2 = test_video(25, 64, 96);
  const Tensor states = must(conditioner->encode_presentation(p, {v1, test_image(64, 96), v2}));
  EXPECT_EQ(states.shape(), Shape({static_cast<int64_t>(want.ids.size()), 8}));
  EXPECT_GT(test::rel_l2(states, must(conditioner->encode(p.ids))), 1e-2);
  // A block reads its own frames: another frame 36 changes the states from the second block on.
  Tensor changed = v1.clone();
  changed.data_as<uint8_t>()[36 * 64 * 96 * 3] ^= 0xff;
  const Tensor other = must(conditioner->encode_presentation(p, {changed, test_image(64, 96), v2}));
  EXPECT_NE(std::memcmp(states.data(), other.data(), states.nbytes()), 0);

  // Refusals name the video.
  const auto short_video = conditioner->reference_presentation("A cat.", {PresentedReference::video(12, 24.0, 64, 96, false)});
  ASSERT_FALSE(short_video.ok());
  EXPECT_NE(short_video.status().message().find("video 1: a reference video is read at 2 fps"), std::string::npos)
      << short_video.status().message();
  const auto truncated = conditioner->encode_presentation(p, {test_video(30, 64, 96), test_image(64, 96), v2});
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("video 1: 30 frames given; its presentation reads frame 36"),
            std::string::npos)
      << truncated.status().message();
  const auto wrong = conditioner->encode_presentation(p, {v1, test_image(64, 96), test_video(25, 96, 64)});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("video 2: "), std::string::npos) << wrong.status().message();
}

TEST_F(KeyframePresentation, WrongSizesAndMissingTowersAreNamed) {
  auto conditioner = load();
  const auto flat = conditioner->keyframe_presentation("A cat.", {{64, 96}, {10, 2500}});
  ASSERT_FALSE(flat.ok());
  EXPECT_NE(flat.status().message().find("picture 2"), std::string::npos) << flat.status().message();
  EXPECT_NE(flat.status().message().find("aspect ratios below 200"), std::string::npos) << flat.status().message();
  const Presentation p = must(conditioner->keyframe_presentation("A cat.", {{64, 96}}));
  const auto other = conditioner->encode_presentation(p, {test_image(96, 64)});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("not the size"), std::string::npos) << other.status().message();
  EXPECT_FALSE(conditioner->encode_presentation(p, {}).ok());

  // A text encoder without a vision tower serves prompts, and refuses keyframes by name.
  const fs::path text_only = tmp_.path() / "text_only";
  SyntheticQwen3Shape shape;
  shape.vocab = kQwenVocab;
  must(write_synthetic_qwen3(text_only.string(), shape));
  auto plain = must(TextConditioner::load({text_only.string(), test::golden_path("qwen_tokenizer_trimmed.json"), 2}));
  EXPECT_TRUE(plain->encode(must(plain->tokenize("A cat."))).ok());
  const auto refused = plain->keyframe_presentation("A cat.", {{64, 96}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("keyframes need the text encoder's vision tower"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace vortex::text
