// The fl2va (keyframe) packed layout and its row-timestep plans against the reference pipeline's own
// (tests/golden/layout_fl2va.safetensors, tools/golden/make_h3_fl2va_layout_golden.py).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/h3/layout.h"

namespace vortex {
namespace {

struct Case {
  int text, vision_begin, vision_end;
  h3::LatentGeometry geometry;
  std::vector<h3::KeyframeAnchor> anchors;
};

// The golden script's CASES.
const std::map<std::string, Case>& cases() {
  using A = h3::KeyframeAnchor;
  static const std::map<std::string, Case> c = {
      {"first", {12, 3, 9, {7, 6, 8, 12}, {A::kFirst}}},
      {"last", {12, 3, 9, {7, 6, 8, 12}, {A::kLast}}},
      {"first_last", {100, 0, 0, {37, 8, 12, 207}, {A::kFirst, A::kLast}}},
  };
  return c;
}
const std::vector<std::array<float, 2>> kPlans = {{0.25f, 0.5f}, {0.9995f, 0.75f}, {0.5f, 0.5f}};

TEST(H3KeyframeLayout, EqualsTheReferencePipelineBitForBit) {
  auto file = SafetensorsFile::open(test::golden_path("layout_fl2va.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto config = h3::config_preset("h3");
  ASSERT_TRUE(config.ok());
  for (const auto& [name, c] : cases()) {
    std::vector<int32_t> tags(static_cast<size_t>(c.text), h3::kTextTag);
    for (int i = c.vision_begin; i < c.vision_end; ++i) tags[i] = h3::kVideoTag;
    auto layout = h3::build_keyframe_layout(tags, c.geometry, *config, c.anchors);
    ASSERT_TRUE(layout.ok()) << name << ": " << layout.status().to_string();
    test::expect_layout_is_golden(*file, name, *layout, kPlans);
  }
}

TEST(H3KeyframeLayout, NoAnchorsIsTheT2vaLayout) {
  auto config = h3::config_preset("h3");
  ASSERT_TRUE(config.ok());
  const h3::LatentGeometry g{12, 8, 10, 20};
  auto t2va = h3::build_t2va_layout(7, g, *config);
  auto keyframes = h3::build_keyframe_layout(std::vector<int32_t>(7, h3::kTextTag), g, *config, {});
  ASSERT_TRUE(t2va.ok() && keyframes.ok());
  EXPECT_EQ(t2va->positions, keyframes->positions);
  EXPECT_EQ(t2va->tags, keyframes->tags);
  EXPECT_EQ(t2va->video_indices, keyframes->video_indices);
  EXPECT_EQ(keyframes->num_condition, 0);
  auto bad = h3::build_keyframe_layout({1, 2}, g, *config, {h3::KeyframeAnchor::kFirst});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("text row 1"), std::string::npos);
}

TEST(H3KeyframeLayout, PairwiseSumFollowsNumpysBlocks) {
  // Below 8 values a plain loop; the block-of-eight tree differs from the loop in the last bit here.
  std::vector<double> v(37);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 5.0 / 3.0 * (i % 5 == 0 ? 1 : 4);
  double sequential = 0.0;
  for (double x : v) sequential += x;
  const double pairwise = h3::numpy_pairwise_sum(v.data(), 37);
  EXPECT_NEAR(pairwise, sequential, 1e-12);
  EXPECT_EQ(h3::numpy_pairwise_sum(v.data(), 3), (v[0] + v[1]) + v[2]);
  // Past 128 values the halves are summed separately; the result stays the sum.
  std::vector<double> long_run(300, 0.1);
  EXPECT_NEAR(h3::numpy_pairwise_sum(long_run.data(), 300), 30.0, 1e-12);
}

}  // namespace
}  // namespace vortex
