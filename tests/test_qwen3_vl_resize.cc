// The Qwen3-VL processors' resize against transformers (tests/golden/qwen3_vl_small/resize.safetensors,
// made by tools/golden/make_qwen3_vl_resize_golden.py): pictures and videos whose smart_resize size
// differs from theirs — sides rounded to multiples of 32, over and under the pixel budgets — are
// resized as torchvision resizes uint8 tensors (bicubic, antialiased), bit for bit; the grids are
// the processors'; one picture's whole pixel_values are the processor's; a video's frames go
// through the same resize on the video path.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cpu/image_resize.h"
#include "h3_golden_util.h"
#include "must.h"
#include "text/qwen3_vision_encoder.h"

namespace vortex::text {
namespace {

namespace fs = std::filesystem;
using test::golden_path;
using test::differing_bytes;
using test::must;

std::string golden_dir() { return golden_path("qwen3_vl_small"); }
SafetensorsFile resize_golden() { return must(SafetensorsFile::open(golden_dir() + "/resize.safetensors")); }

constexpr int kPictures = 4, kVideos = 2;

// The golden's processor settings (its metadata's image_size / video_size) beside the tower's.
std::string processor_folder() {
  const fs::path dir = fs::path(::testing::TempDir()) / "qwen3_vl_resize_processor";
  fs::create_directories(dir);
  const nlohmann::json stats = nlohmann::json::parse(resize_golden().metadata().at("stats"));
  for (const auto& [file, size] : {std::pair{"preprocessor_config.json", "image_size"},
                                   std::pair{"video_preprocessor_config.json", "video_size"}}) {
    std::ifstream in(fs::path(golden_dir()) / file);
    nlohmann::json config = nlohmann::json::parse(in);
    config["size"] = stats.at(size);
    std::ofstream(dir / file) << config.dump(2);
  }
  return dir.string();
}

// The case's frames as [frames, H, W, 3] (a picture is one frame).
Tensor frames_of(const SafetensorsFile& file, const std::string& name) {
  Tensor t = must(file.get(name)).contiguous();
  return t.rank() == 3 ? must(t.reshape(Shape({1, t.size(0), t.size(1), 3}))) : t;
}

TEST(Qwen3VlResize, TheGoldenNamesTheUint8ResizeAsTheProcessors) {
  const nlohmann::json stats = nlohmann::json::parse(resize_golden().metadata().at("stats"));
  ASSERT_EQ(stats.at("cases").size(), static_cast<size_t>(kPictures + kVideos));
  for (const auto& [name, c] : stats.at("cases").items()) {
    EXPECT_EQ(c.at("max_abs_difference").at("uint8").get<double>(), 0.0) << name;
    // Pillow's bicubic, the other 8-bit candidate, is a level off somewhere in every case.
    EXPECT_GT(c.at("max_abs_difference").at("pil").get<double>(), 0.0) << name;
  }
}

TEST(Qwen3VlResize, BicubicIsTorchvisionsBitForBit) {
  const SafetensorsFile file = resize_golden();
  int compared = 0;
  for (const std::string kind : {"image", "video"}) {
    for (int i = 0; i < (kind == "image" ? kPictures : kVideos); ++i) {
      const std::string name = kind + "." + std::to_string(i);
      const Tensor source = frames_of(file, name), want = frames_of(file, name + ".resized.uint8");
      ASSERT_EQ(source.size(0), want.size(0)) << name;
      for (int64_t f = 0; f < source.size(0); ++f) {
        const Tensor got = must(cpu::resize_bicubic_rgb8(must(source.select(0, f)).contiguous(), want.size(1),
                                                         want.size(2)));
        EXPECT_EQ(differing_bytes(got, must(want.select(0, f)).contiguous()), 0) << name << " frame " << f;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, kPictures + 4 + 6);
}

TEST(Qwen3VlResize, GridsAndPixelsAreTheProcessors) {
  const SafetensorsFile file = resize_golden();
  const Qwen3VisionEncoder encoder = must(Qwen3VisionEncoder::load(golden_dir(), processor_folder()));
  for (int i = 0; i < kPictures; ++i) {
    const std::string name = "image." + std::to_string(i);
    const Tensor picture = must(file.get(name)).contiguous();
    const std::vector<int64_t> grid = test::to_i64_vector(must(file.get(name + ".grid")));
    const VisionGrid got = must(encoder.grid_for(picture.size(0), picture.size(1)));
    EXPECT_EQ(got.height, grid[1]) << name;
    EXPECT_EQ(got.width, grid[2]) << name;
  }
  // A picture under min_pixels, upscaled: every pixel value the processor's.
  VisionGrid grid;
  const Tensor patches = must(encoder.image_patches(must(file.get("image.2")).contiguous(), &grid));
  const Tensor want = must(file.get("image.2.pixel_values")).contiguous();
  ASSERT_EQ(patches.shape(), want.shape());
  EXPECT_EQ(std::memcmp(patches.data(), want.data(), static_cast<size_t>(want.nbytes())), 0);

  // Videos: the grid for their frame counts, and each block's patches from the frames as given are
  // those of the frames the processor's resize made.
  for (int v = 0; v < kVideos; ++v) {
    const std::string name = "video." + std::to_string(v);
    const Tensor frames = frames_of(file, name), resized = frames_of(file, name + ".resized.uint8");
    const std::vector<int64_t> want_grid = test::to_i64_vector(must(file.get(name + ".grid")));
    const VisionGrid got = must(encoder.video_grid_for(frames.size(0), frames.size(1), frames.size(2)));
    EXPECT_EQ(got.height, want_grid[1]) << name;
    EXPECT_EQ(got.width, want_grid[2]) << name;
    ASSERT_EQ(frames.size(0) % 2, 0) << name;
    for (int64_t f = 0; f < frames.size(0); f += 2) {
      const Tensor from_source =
          must(encoder.video_block_patches({must(frames.select(0, f)), must(frames.select(0, f + 1))}, got));
      const Tensor from_resized =
          must(encoder.video_block_patches({must(resized.select(0, f)), must(resized.select(0, f + 1))}, got));
      ASSERT_EQ(from_source.shape(), from_resized.shape());
      EXPECT_EQ(std::memcmp(from_source.data(), from_resized.data(), static_cast<size_t>(from_source.nbytes())), 0)
          << name << " block " << f / 2;
    }
  }
}

TEST(Qwen3VlResize, BadInputIsNamed) {
  EXPECT_FALSE(cpu::resize_bicubic_rgb8(Tensor::zeros({4, 4, 4}, DType::kU8), 2, 2).ok());
  EXPECT_FALSE(cpu::resize_bicubic_rgb8(Tensor::zeros({4, 4, 3}, DType::kU8), 2, 0).ok());
  EXPECT_FALSE(cpu::resize_bicubic_rgb8(Tensor::zeros({4, 4, 3}, DType::kF32), 2, 2).ok());
  // A block's frames of two sizes are refused by frame, not resized apart.
  const Qwen3VisionEncoder encoder = must(Qwen3VisionEncoder::load(golden_dir(), processor_folder()));
  const VisionGrid grid = must(encoder.video_grid_for(2, 130, 96));
  const auto mixed = encoder.video_block_patches(
      {Tensor::zeros({130, 96, 3}, DType::kU8), Tensor::zeros({128, 96, 3}, DType::kU8)}, grid);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("frame 1"), std::string::npos) << mixed.status().message();
}

}  // namespace
}  // namespace vortex::text
