// The ref2va (reference) packed layout and its row-timestep plans against the reference pipeline's
// own (tests/golden/layout_ref2va.safetensors, tools/golden/make_h3_ref2va_layout_golden.py), and
// the layout's refusals.
#include <gtest/gtest.h>

#include <map>

#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/h3/layout.h"

namespace vortex {
namespace {

using K = h3::ReferenceKind;

struct Case {
  int text, vision_begin, vision_end;
  h3::LatentGeometry geometry;
  std::vector<h3::ReferenceBlock> references;
};

// The golden script's CASES: (kind, latent frames, height, width, soundtrack latents).
const std::map<std::string, Case>& cases() {
  static const std::map<std::string, Case> c = {
      {"images", {10, 2, 6, {7, 6, 8, 12}, {{K::kImage, 1, 4, 10, 0}, {K::kImage, 1, 8, 6, 0}}}},
      {"mixed",
       {24, 3, 11, {12, 8, 12, 20},
        {{K::kImage, 1, 6, 4, 0},
         {K::kAudio, 0, 0, 0, 9},
         {K::kVideo, 2, 4, 6, 30},
         {K::kVideo, 22, 2, 4, 0},
         {K::kVideo, 7, 6, 6, 3},
         {K::kImage, 1, 10, 8, 0}}}},
  };
  return c;
}
const std::vector<std::array<float, 2>> kPlans = {{0.25f, 0.5f}, {0.9995f, 0.75f}, {0.5f, 0.5f}};

std::vector<int32_t> text_tags(const Case& c) {
  std::vector<int32_t> tags(static_cast<size_t>(c.text), h3::kTextTag);
  for (int i = c.vision_begin; i < c.vision_end; ++i) tags[i] = h3::kVideoTag;
  return tags;
}

TEST(H3ReferenceLayout, EqualsTheReferencePipelineBitForBit) {
  auto file = SafetensorsFile::open(test::golden_path("layout_ref2va.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto config = h3::config_preset("h3");
  ASSERT_TRUE(config.ok());
  for (const auto& [name, c] : cases()) {
    auto layout = h3::build_ref2va_layout(text_tags(c), c.references, c.geometry, *config);
    ASSERT_TRUE(layout.ok()) << name << ": " << layout.status().to_string();
    test::expect_layout_is_golden(*file, name, *layout, kPlans);
  }
}

TEST(H3ReferenceLayout, NoReferencesIsTheT2vaLayout) {
  auto config = h3::config_preset("h3");
  ASSERT_TRUE(config.ok());
  const h3::LatentGeometry g{12, 8, 10, 20};
  auto t2va = h3::build_t2va_layout(7, g, *config);
  auto ref2va = h3::build_ref2va_layout(std::vector<int32_t>(7, h3::kTextTag), {}, g, *config);
  ASSERT_TRUE(t2va.ok() && ref2va.ok());
  EXPECT_EQ(t2va->positions, ref2va->positions);
  EXPECT_EQ(t2va->tags, ref2va->tags);
  EXPECT_EQ(t2va->video_indices, ref2va->video_indices);
  EXPECT_EQ(t2va->audio_indices, ref2va->audio_indices);
  EXPECT_EQ(ref2va->num_condition + ref2va->num_condition_audio, 0);
}

TEST(H3ReferenceLayout, MalformedReferencesAreNamed) {
  auto config = h3::config_preset("h3");
  ASSERT_TRUE(config.ok());
  const h3::LatentGeometry g{7, 6, 8, 12};
  const std::vector<int32_t> tags(5, h3::kTextTag);
  const struct {
    h3::ReferenceBlock block;
    const char* needle;
  } bad[] = {
      {{K::kImage, 2, 4, 4, 0}, "reference 2: an image reference is one latent frame"},
      {{K::kImage, 1, 4, 4, 3}, "reference 2: an image reference is one latent frame without sound"},
      {{K::kVideo, 3, 5, 4, 0}, "reference 2: latent geometry 3x5x4"},
      {{K::kVideo, 0, 4, 4, 0}, "reference 2: latent geometry 0x4x4"},
      {{K::kAudio, 0, 0, 0, 0}, "reference 2: an audio reference needs at least one audio latent"},
      {{K::kAudio, 1, 2, 2, 4}, "reference 2: an audio reference has no video latents"},
      {{K::kVideo, 2, 4, 4, -1}, "reference 2: negative audio latents"},
  };
  for (const auto& b : bad) {
    auto layout = h3::build_ref2va_layout(tags, {{K::kImage, 1, 4, 4, 0}, b.block}, g, *config);
    ASSERT_FALSE(layout.ok()) << b.needle;
    EXPECT_NE(layout.status().message().find(b.needle), std::string::npos) << layout.status().message();
  }
  auto bad_tag = h3::build_ref2va_layout({1, 7}, {{K::kImage, 1, 4, 4, 0}}, g, *config);
  ASSERT_FALSE(bad_tag.ok());
  EXPECT_NE(bad_tag.status().message().find("text row 1"), std::string::npos);
}

}  // namespace
}  // namespace vortex
