// ref2va's video references through the Qwen3-VL vision tower and text encoder against
// transformers (tests/golden/qwen3_vl_small/video.safetensors, made by
// tools/golden/make_qwen3_vl_video_golden.py): the video processor's pixels bit for bit, the tower
// on each video (its vision blocks encoded one by one here, batched there: the reference's
// per-block attention spans make them the same program), and a presentation of a picture and two
// videos (positions exactly, hidden states as the keyframe presentation's bound); the video
// processor's size rule and the refusals.
//
// Measured against the reference's CPU bf16 run: merged 7.1e-3 / 6.5e-3, DeepStack 3.1e-3 to
// 6.9e-3, hidden states 7.2e-3 to 1.12e-2 at layers 1-4 (the reference's own CUDA run: merged
// 9.1e-3 / 8.3e-3, hidden states 8.3e-3 to 1.21e-2, the golden's `stats`).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "h3_golden_util.h"
#include "must.h"
#include "text/qwen3_text_encoder.h"
#include "text/qwen3_vision_encoder.h"

namespace vortex::text {
namespace {

using test::golden_path;
using test::must;
using test::rel_l2;

std::string golden_dir() { return golden_path("qwen3_vl_small"); }

// The golden's sampled frames of video v in blocks of two, the last repeated to fill a pair.
std::vector<std::vector<Tensor>> video_blocks(const SafetensorsFile& io, int v) {
  const Tensor frames = must(io.get("video." + std::to_string(v)));
  std::vector<std::vector<Tensor>> blocks;
  for (int64_t f = 0; f < frames.size(0); f += 2) {
    blocks.push_back({must(frames.select(0, f)), must(frames.select(0, std::min(f + 1, frames.size(0) - 1)))});
  }
  return blocks;
}

TEST(Qwen3VlVideo, PixelsAreTheVideoProcessorsBitForBit) {
  const SafetensorsFile io = must(SafetensorsFile::open(golden_dir() + "/video.safetensors"));
  const Qwen3VisionEncoder encoder = must(Qwen3VisionEncoder::load(golden_dir(), golden_dir()));
  const Tensor reference = must(io.get("pixel_values_videos"));
  int64_t row = 0;
  for (int v = 0; v < 2; ++v) {
    const int64_t sampled = must(io.get("video." + std::to_string(v))).size(0);
    const VisionGrid grid = must(encoder.video_grid_for(sampled, 64, 96));
    for (const auto& block : video_blocks(io, v)) {
      const Tensor patches = must(encoder.video_block_patches(block, grid));
      const Tensor expected = must(reference.slice(0, row, row + grid.patches())).contiguous();
      ASSERT_EQ(patches.shape(), expected.shape());
      EXPECT_EQ(std::memcmp(patches.data(), expected.data(), expected.nbytes()), 0) << "video " << v << " row " << row;
      row += grid.patches();
    }
  }
  EXPECT_EQ(row, reference.size(0));
}

std::vector<VisionFeatures> encode_video(const Qwen3VisionEncoder& encoder, const SafetensorsFile& io, int v) {
  const int64_t sampled = must(io.get("video." + std::to_string(v))).size(0);
  const VisionGrid grid = must(encoder.video_grid_for(sampled, 64, 96));
  std::vector<VisionFeatures> out;
  for (const auto& block : video_blocks(io, v)) {
    out.push_back(must(encoder.encode(must(encoder.video_block_patches(block, grid)), grid)));
  }
  return out;
}

Tensor rows_of(const std::vector<VisionFeatures>& blocks, int deepstack) {
  const int64_t rows = blocks[0].merged.size(0), C = blocks[0].merged.size(1);
  Tensor out = Tensor::empty({rows * static_cast<int64_t>(blocks.size()), C}, DType::kBF16);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Tensor& t = deepstack < 0 ? blocks[b].merged : blocks[b].deepstack[static_cast<size_t>(deepstack)];
    std::memcpy(static_cast<char*>(out.data()) + b * t.nbytes(), t.contiguous().data(), t.nbytes());
  }
  return out;
}

TEST(Qwen3VlVideo, TheTowerOnEachVideoMatchesTransformers) {
  const SafetensorsFile io = must(SafetensorsFile::open(golden_dir() + "/video.safetensors"));
  const Qwen3VisionEncoder encoder = must(Qwen3VisionEncoder::load(golden_dir(), golden_dir()));
  for (int v = 0; v < 2; ++v) {
    const std::vector<VisionFeatures> blocks = encode_video(encoder, io, v);
    ASSERT_EQ(blocks.size(), 2u);
    for (int d = -1; d < 2; ++d) {
      const std::string name = "video." + std::to_string(v) + (d < 0 ? ".merged" : ".deepstack." + std::to_string(d));
      const Tensor ours = rows_of(blocks, d), ref = must(io.get(name));
      ASSERT_EQ(ours.shape(), ref.shape()) << name;
      const double err = rel_l2(ours, ref);
      EXPECT_LE(err, 1e-2) << name;
      std::printf("%s: rel-L2 %.3e against transformers (CPU, bf16)\n", name.c_str(), err);
    }
  }
}

TEST(Qwen3VlVideo, APresentationWithVideosMatchesTransformers) {
  const SafetensorsFile io = must(SafetensorsFile::open(golden_dir() + "/video.safetensors"));
  const Qwen3VisionEncoder vision = must(Qwen3VisionEncoder::load(golden_dir(), golden_dir()));
  const std::vector<int32_t> ids = test::golden_token_ids(io);
  // In reading order: the picture, then each video's blocks.
  std::vector<VisionFeatures> features{must(vision.encode_image(must(io.get("image.0"))))};
  for (int v = 0; v < 2; ++v) {
    for (VisionFeatures& f : encode_video(vision, io, v)) features.push_back(std::move(f));
  }
  const Qwen3TextEncoder first = must(Qwen3TextEncoder::load(golden_dir(), 1));
  const auto rows = must(first.vision_rows(ids, features));
  ASSERT_EQ(rows.runs.size(), 5u);
  const std::vector<int64_t> expected = test::to_i64_vector(must(io.get("position_ids")));
  const int64_t N = static_cast<int64_t>(ids.size());
  for (int axis = 0; axis < 3; ++axis) {
    for (int64_t n = 0; n < N; ++n) {
      ASSERT_EQ(rows.positions[axis][n], expected[axis * N + n]) << "axis " << axis << " token " << n;
    }
  }
  for (int layer = 1; layer <= 4; ++layer) {
    const Qwen3TextEncoder encoder = must(Qwen3TextEncoder::load(golden_dir(), layer));
    const Tensor out = must(encoder.encode(ids, features));
    const Tensor ref = must(io.get("hidden_states." + std::to_string(layer)));
    ASSERT_EQ(out.shape(), ref.shape());
    const double err = rel_l2(out, ref);
    EXPECT_LE(err, 0.015) << "layer " << layer;
    std::printf("layer %d: rel-L2 %.3e against transformers (CPU, bf16)\n", layer, err);
  }
}

TEST(Qwen3VlVideo, SmartResizeCountsEveryFrame) {
  Qwen3VideoProcessorConfig p;  // Qwen3VLVideoProcessor's class defaults
  p.patch = 16;
  p.merge = 2;
  p.temporal_patch = 2;
  p.min_pixels = 128 * 32 * 32;
  p.max_pixels = 768 * 32 * 32;
  EXPECT_EQ(must(p.target_size(11, 768, 1344)), (std::array<int64_t, 2>{192, 352}));
  EXPECT_EQ(must(p.target_size(2, 64, 96)), (std::array<int64_t, 2>{224, 320}));   // up to min_pixels
  EXPECT_EQ(must(p.target_size(5, 16, 40)), (std::array<int64_t, 2>{128, 256}));   // below a factor first
  p.max_pixels = 32 * 32 * 32 * 768;  // a budget H3's canvas fits for up to 21 sampled frames
  EXPECT_EQ(must(p.target_size(21, 768, 1344)), (std::array<int64_t, 2>{768, 1344}));
  p.min_pixels = 1024;
  p.max_pixels = int64_t{1} << 40;
  EXPECT_EQ(must(p.target_size(3, 720, 1280)), (std::array<int64_t, 2>{704, 1280}));
  EXPECT_FALSE(p.target_size(1, 768, 768).ok());  // fewer frames than the temporal patch
}

TEST(Qwen3VlVideo, RefusalsAreNamed) {
  const Qwen3VisionEncoder encoder = must(Qwen3VisionEncoder::load(golden_dir(), golden_dir()));
  // Frames the processor resizes (test_qwen3_vl_resize.cc) get the grid of its size.
  const VisionGrid odd = must(encoder.video_grid_for(4, 64, 100));
  EXPECT_EQ(odd.height, 4);
  EXPECT_EQ(odd.width, 6);
  const auto flat = encoder.video_grid_for(4, 10, 2500);
  ASSERT_FALSE(flat.ok());
  EXPECT_NE(flat.status().message().find("aspect ratios below 200"), std::string::npos) << flat.status().message();
  const VisionGrid grid = must(encoder.video_grid_for(4, 64, 96));
  const Tensor frame = Tensor::zeros({64, 96, 3}, DType::kU8);
  EXPECT_FALSE(encoder.video_block_patches({frame}, grid).ok());
  const auto wrong = encoder.video_block_patches({frame, Tensor::zeros({64, 64, 3}, DType::kU8)}, grid);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("frame 1"), std::string::npos) << wrong.status().message();

  // Without video processor settings pictures still work and videos are refused by name.
  namespace fs = std::filesystem;
  const fs::path tmp = fs::path(::testing::TempDir()) / "qwen3_vl_no_video";
  fs::create_directories(tmp);
  fs::copy_file(fs::path(golden_dir()) / "preprocessor_config.json", tmp / "preprocessor_config.json",
                fs::copy_options::overwrite_existing);
  const Qwen3VisionEncoder images_only = must(Qwen3VisionEncoder::load(golden_dir(), tmp.string()));
  EXPECT_TRUE(images_only.grid_for(64, 96).ok());
  const auto refused = images_only.video_grid_for(4, 64, 96);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("video_preprocessor_config.json does not exist"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace vortex::text
