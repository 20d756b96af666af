// A keyframe presentation through the Qwen3-VL text encoder against transformers
// (tests/golden/qwen3_vl_small): two images' vision features in place of their image-pad runs,
// the 3-D multimodal RoPE positions, DeepStack features added after decoder layers 0 and 1, and
// the hidden state after each layer; and the presentation errors.
//
// Bounds: the positions exactly; hidden states rel-L2 <= 0.015 against the reference's CPU bf16
// run. The vision features already differ by summation order (test_qwen3_vision_encoder.cc) and
// the language model adds its own. Measured: 6.7e-3, 8.4e-3, 9.8e-3, 1.11e-2 at layers 1-4,
// closer than the reference's CUDA run is to its CPU run (7.7e-3 to 1.17e-2, the golden's
// `stats`). hidden_states[1] and [2] are the layers' outputs before their DeepStack adds.
#include <gtest/gtest.h>

#include "h3_golden_util.h"
#include "must.h"
#include "text/qwen3_text_encoder.h"
#include "text/qwen3_vision_encoder.h"

namespace vortex::text {
namespace {

using test::golden_path;
using test::must;
using test::rel_l2;

struct Presentation {
  std::vector<int32_t> ids;
  std::vector<VisionFeatures> images;
};

Presentation golden_presentation(const SafetensorsFile& io) {
  const std::string dir = golden_path("qwen3_vl_small");
  const Qwen3VisionEncoder vision = must(Qwen3VisionEncoder::load(dir, dir));
  Presentation p{test::golden_token_ids(io), {}};
  for (int i = 0; i < 2; ++i) p.images.push_back(must(vision.encode_image(must(io.get("image." + std::to_string(i))))));
  return p;
}

TEST(Qwen3VlPresentation, PositionsAreTheReferencesMultimodalRope) {
  const std::string dir = golden_path("qwen3_vl_small");
  const SafetensorsFile io = must(SafetensorsFile::open(dir + "/io.safetensors"));
  const Presentation p = golden_presentation(io);
  const Qwen3TextEncoder encoder = must(Qwen3TextEncoder::load(dir, 4));
  const auto rows = must(encoder.vision_rows(p.ids, p.images));
  ASSERT_EQ(rows.runs.size(), 2u);
  EXPECT_EQ(rows.runs[0].count, 6);
  EXPECT_EQ(rows.runs[1].count, 15);
  EXPECT_EQ(rows.deepstack.size(), 2u);
  const std::vector<int64_t> expected = test::to_i64_vector(must(io.get("position_ids")));
  const int64_t N = static_cast<int64_t>(p.ids.size());
  for (int axis = 0; axis < 3; ++axis) {
    for (int64_t n = 0; n < N; ++n) {
      ASSERT_EQ(rows.positions[axis][n], expected[axis * N + n]) << "axis " << axis << " token " << n;
    }
  }
}

TEST(Qwen3VlPresentation, EveryLayerMatchesTransformers) {
  const std::string dir = golden_path("qwen3_vl_small");
  const SafetensorsFile io = must(SafetensorsFile::open(dir + "/io.safetensors"));
  const Presentation p = golden_presentation(io);
  for (int layer = 1; layer <= 4; ++layer) {
    const Qwen3TextEncoder encoder = must(Qwen3TextEncoder::load(dir, layer));
    const Tensor out = must(encoder.encode(p.ids, p.images));
    const Tensor ref = must(io.get("hidden_states." + std::to_string(layer)));
    ASSERT_EQ(out.shape(), ref.shape());
    const double err = rel_l2(out, ref);
    EXPECT_LE(err, 0.015) << "layer " << layer;
    std::printf("layer %d: rel-L2 %.3e against transformers (CPU, bf16)\n", layer, err);
  }
}

TEST(Qwen3VlPresentation, MismatchedImagesAreNamed) {
  const std::string dir = golden_path("qwen3_vl_small");
  const SafetensorsFile io = must(SafetensorsFile::open(dir + "/io.safetensors"));
  const Presentation p = golden_presentation(io);
  const Qwen3TextEncoder encoder = must(Qwen3TextEncoder::load(dir, 2));
  const auto one = encoder.encode(p.ids, {p.images[0]});
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("image-pad run 2"), std::string::npos) << one.status().message();
  const auto swapped = encoder.encode(p.ids, {p.images[1], p.images[0]});
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.status().message().find("has 6 tokens; image 1 gives 15"), std::string::npos)
      << swapped.status().message();
  const auto extra = encoder.encode(p.ids, {p.images[0], p.images[1], p.images[0]});
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("3 image(s) given for 2"), std::string::npos) << extra.status().message();
  // The text-only golden's image_token_id lies outside its small vocabulary: it takes no images.
  const std::string text_only = golden_path("qwen3_text_small");
  const Qwen3TextEncoder text = must(Qwen3TextEncoder::load(text_only, 2));
  const auto refused = text.encode({1, 2, 3}, {p.images[0]});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("takes no images"), std::string::npos);
  // Without images the pad ids are plain tokens: the text path, unchanged.
  EXPECT_TRUE(encoder.encode(p.ids).ok());
}

}  // namespace
}  // namespace vortex::text
