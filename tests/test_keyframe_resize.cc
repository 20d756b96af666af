// Keyframes onto the canvas: Pillow's LANCZOS resize bit for bit, the canvas rules, stretch and
// cover-crop (tests/golden/keyframe_resize.safetensors, tools/golden/make_keyframe_resize_golden.py);
// ref2va's image references onto their own size (tests/golden/reference_image.safetensors,
// tools/golden/make_reference_image_golden.py).
#include <gtest/gtest.h>

#include <cstring>

#include "cpu/image_resize.h"
#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/h3/keyframes.h"

namespace vortex {
namespace {

using test::differing_bytes;

TEST(KeyframeResize, LanczosIsPillowsBitForBit) {
  auto file = SafetensorsFile::open(test::golden_path("keyframe_resize.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  int compared = 0;
  for (int k = 0; k < 3; ++k) {
    auto image = file->get("in.image." + std::to_string(k));
    ASSERT_TRUE(image.ok());
    for (const auto& name : file->names()) {
      const std::string prefix = "resize." + std::to_string(k) + ".";
      if (name.rfind(prefix, 0) != 0) continue;
      auto ref = file->get(name);
      ASSERT_TRUE(ref.ok());
      auto got = cpu::resize_lanczos_rgb8(image->contiguous(), ref->size(0), ref->size(1));
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      ASSERT_EQ(got->shape(), ref->shape()) << name;
      EXPECT_EQ(differing_bytes(*got, ref->contiguous()), 0) << name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 15);
}

TEST(KeyframeResize, CanvasStretchAndCoverCropAreThePipelines) {
  auto file = SafetensorsFile::open(test::golden_path("keyframe_resize.safetensors"));
  ASSERT_TRUE(file.ok());
  const std::vector<int64_t> rows = test::to_i64_vector(*file->get("canvas"));
  for (size_t r = 0; r + 3 < rows.size(); r += 4) {
    auto canvas = h3::keyframe_canvas(rows[r], rows[r + 1]);
    ASSERT_TRUE(canvas.ok()) << canvas.status().to_string();
    EXPECT_EQ(canvas->height, rows[r + 2]) << rows[r] << "x" << rows[r + 1];
    EXPECT_EQ(canvas->width, rows[r + 3]) << rows[r] << "x" << rows[r + 1];
  }
  const std::vector<int64_t> fit = test::to_i64_vector(*file->get("fit_canvas"));
  const h3::Canvas canvas{fit[0], fit[1]};
  for (int k = 0; k < 3; ++k) {
    const Tensor image = file->get("in.image." + std::to_string(k))->contiguous();
    for (int index : {0, 1}) {
      auto got = h3::fit_keyframe(image, canvas, index);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      const Tensor ref = file->get("fit." + std::to_string(k) + (index == 0 ? ".first" : ".last"))->contiguous();
      ASSERT_EQ(got->shape(), ref.shape());
      EXPECT_EQ(differing_bytes(*got, ref), 0) << "image " << k << " keyframe " << index;
    }
  }
  auto tall = h3::keyframe_canvas(100, 500);
  ASSERT_FALSE(tall.ok());
  EXPECT_NE(tall.status().to_string().find("aspect ratio"), std::string::npos);
  EXPECT_FALSE(h3::keyframe_canvas(0, 10).ok());
  EXPECT_FALSE(cpu::resize_lanczos_rgb8(Tensor::zeros({4, 4, 4}, DType::kU8), 2, 2).ok());
  EXPECT_FALSE(cpu::resize_lanczos_rgb8(Tensor::zeros({4, 4, 3}, DType::kU8), 0, 2).ok());
}

// The pipeline's setup step normalised these images; its sizes at the release's 2048 short edge,
// its pixels at 96.
TEST(ReferenceImage, SizesAndPixelsAreThePipelines) {
  auto file = SafetensorsFile::open(test::golden_path("reference_image.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const std::vector<int64_t> source = test::to_i64_vector(file->get("sizes.source")->contiguous());
  const std::vector<int64_t> normalized = test::to_i64_vector(file->get("sizes.normalized")->contiguous());
  ASSERT_EQ(source.size(), normalized.size());
  ASSERT_GE(source.size(), 20u);
  for (size_t i = 0; i < source.size(); i += 2) {
    auto size = h3::reference_image_size(source[i], source[i + 1]);
    ASSERT_TRUE(size.ok()) << size.status().to_string();
    EXPECT_EQ(size->height, normalized[i]) << source[i] << "x" << source[i + 1];
    EXPECT_EQ(size->width, normalized[i + 1]) << source[i] << "x" << source[i + 1];
  }
  for (int k = 0; k < 3; ++k) {
    const std::string name = "image." + std::to_string(k);
    auto image = file->get(name + ".source");
    auto want = file->get(name + ".normalized");
    ASSERT_TRUE(image.ok() && want.ok()) << name;
    auto got = h3::fit_reference_image(image->contiguous(), 96);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->shape(), want->shape()) << name;
    EXPECT_EQ(differing_bytes(*got, want->contiguous()), 0) << name;
  }
}

TEST(ReferenceImage, RefusalsAreNamed) {
  const auto refused = [](int64_t w, int64_t h, int64_t edge, const std::string& needle) {
    auto size = h3::reference_image_size(w, h, edge);
    ASSERT_FALSE(size.ok()) << w << "x" << h;
    EXPECT_NE(size.status().message().find(needle), std::string::npos) << size.status().message();
  };
  refused(4001, 1000, 2048, "reference image size 4001x1000: its aspect ratio is outside the model's 1:4 to 4:1");
  refused(10, 41, 2048, "outside the model's 1:4 to 4:1");
  refused(0, 5, 2048, "must be positive");
  refused(64, 64, 31, "reference short edge 31 is below 32");
  auto wrong = h3::fit_reference_image(Tensor::zeros({8, 8, 4}, DType::kU8));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("must be U8 [H, W, 3]"), std::string::npos);
}

}  // namespace
}  // namespace vortex
