// The Qwen3-VL vision tower's CPU program against transformers (tests/golden/qwen3_vl_small, made
// by tools/golden/make_qwen3_vl_golden.py): the image processor's pixels bit for bit, then every
// stage of the tower on two images whose patch grids (4 × 6, 6 × 10) resample the learned 8 × 8
// position grid down and up; and the load / input errors.
//
// The patch and position embeddings are the reference's bit for bit. After them, rel-L2 against
// the reference's CPU bf16 run per stage: the programs round at the same points but sum in
// different orders (GEMM k order, LayerNorm statistics, attention), so bf16 roundings land an ulp
// apart now and then and the flips compound block by block. Measured: block 0 1.5e-3 / 2.0e-3,
// the last block 5.3e-3, merged 6.7e-3 / 6.4e-3, DeepStack 3.4e-3 to 7.0e-3 — closer than the
// reference's own CUDA run is to its CPU run (the golden's `stats`: 4.8e-3, 7.4e-3, 8.7e-3).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "h3_golden_util.h"
#include "must.h"
#include "text/qwen3_vision_encoder.h"

namespace vortex::text {
namespace {

using test::golden_path;
using test::must;
using test::rel_l2;

std::string golden_dir() { return golden_path("qwen3_vl_small"); }

TEST(Qwen3VisionEncoder, PixelsAreTheProcessorsBitForBit) {
  const SafetensorsFile io = must(SafetensorsFile::open(golden_dir() + "/io.safetensors"));
  const Qwen3VisionEncoder encoder = must(Qwen3VisionEncoder::load(golden_dir(), golden_dir()));
  const Tensor reference = must(io.get("pixel_values"));
  int64_t row = 0;
  for (int i = 0; i < 2; ++i) {
    VisionGrid grid;
    const Tensor patches = must(encoder.image_patches(must(io.get("image." + std::to_string(i))), &grid));
    const Tensor expected = must(reference.slice(0, row, row + grid.patches())).contiguous();
    ASSERT_EQ(patches.shape(), expected.shape()) << "image " << i;
    EXPECT_EQ(std::memcmp(patches.data(), expected.data(), expected.nbytes()), 0) << "image " << i;
    row += grid.patches();
  }
  EXPECT_EQ(row, reference.size(0));
}

TEST(Qwen3VisionEncoder, EveryStageMatchesTransformers) {
  const SafetensorsFile io = must(SafetensorsFile::open(golden_dir() + "/io.safetensors"));
  const Qwen3VisionEncoder encoder = must(Qwen3VisionEncoder::load(golden_dir(), golden_dir()));
  EXPECT_EQ(encoder.config().deepstack_layers, (std::vector<int64_t>{0, 2}));
  const std::vector<std::pair<std::string, double>> bounds = {
      {"embedded", 0.0}, {"block0", 4e-3}, {"last", 1e-2}, {"merged", 1e-2}, {"deepstack.0", 1e-2},
      {"deepstack.1", 1e-2}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "vision." + std::to_string(i) + ".";
    const Tensor image = must(io.get("image." + std::to_string(i)));
    VisionGrid grid;
    const Tensor patches = must(encoder.image_patches(image, &grid));
    Tensor x = must(encoder.embed(patches, grid));
    std::map<std::string, Tensor> ours;
    ours["embedded"] = x.clone();
    must(encoder.run_blocks(x, grid, 0, 1, nullptr));
    ours["block0"] = x.clone();
    must(encoder.run_blocks(x, grid, 1, encoder.config().depth, nullptr));
    ours["last"] = x;
    const VisionFeatures features = must(encoder.encode_image(image));
    ASSERT_EQ(features.deepstack.size(), 2u);
    EXPECT_EQ(features.grid.tokens(), features.merged.size(0));
    ours["merged"] = features.merged;
    ours["deepstack.0"] = features.deepstack[0];
    ours["deepstack.1"] = features.deepstack[1];
    for (const auto& [name, bound] : bounds) {
      const Tensor ref = must(io.get(p + name));
      ASSERT_EQ(ours[name].shape(), ref.shape()) << p << name;
      const double err = rel_l2(ours[name], ref);
      EXPECT_LE(err, bound) << p << name;
      std::printf("%s%s: rel-L2 %.3e against transformers (CPU, bf16)\n", p.c_str(), name.c_str(), err);
    }
  }
}

TEST(Qwen3VisionEncoder, BadImagesAreRefused) {
  const Qwen3VisionEncoder encoder = must(Qwen3VisionEncoder::load(golden_dir(), golden_dir()));
  VisionGrid grid;
  const auto gray = encoder.image_patches(Tensor::zeros({64, 64}, DType::kU8), &grid);
  ASSERT_FALSE(gray.ok());
  EXPECT_EQ(gray.status().code(), StatusCode::kInvalidArgument);
  const auto floats = encoder.image_patches(Tensor::zeros({64, 64, 3}, DType::kF32), &grid);
  EXPECT_FALSE(floats.ok());
  // Patches that do not fit the grid named with them.
  const auto bad = encoder.encode(Tensor::zeros({10, encoder.config().patch_values()}, DType::kF32),
                                  VisionGrid{4, 6, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("4 x 6 grid"), std::string::npos) << bad.status().message();
}

TEST(Qwen3VisionEncoder, SmartResizeFollowsTheProcessor) {
  Qwen3ImageProcessorConfig p;
  p.patch = 16;
  p.merge = 2;
  p.min_pixels = 65536;
  p.max_pixels = 16777216;
  // H3's canvases are multiples of 32 and stay as they are.
  for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{768, 1344}, {1344, 768}, {512, 2016}, {768, 768}}) {
    EXPECT_EQ(must(p.target_size(h, w)), (std::array<int64_t, 2>{h, w}));
  }
  EXPECT_EQ(must(p.target_size(720, 1280)), (std::array<int64_t, 2>{704, 1280}));  // 22.5 rounds to 22
  EXPECT_EQ(must(p.target_size(100, 100)), (std::array<int64_t, 2>{256, 256}));    // up to min_pixels
  p.max_pixels = 1024 * 1024;
  EXPECT_EQ(must(p.target_size(2000, 3000)), (std::array<int64_t, 2>{832, 1248}));  // down to max_pixels
  EXPECT_FALSE(p.target_size(10, 2500).ok());                                      // aspect 250
}

TEST(Qwen3VisionEncoder, BadCheckpointsAndConfigsAreNamed) {
  const std::string dir = golden_dir();
  const std::string tmp = ::testing::TempDir() + "/qwen3_vision_case";
  std::filesystem::create_directories(tmp);
  {
    const SafetensorsFile model = must(SafetensorsFile::open(dir + "/model.safetensors"));
    std::vector<std::pair<std::string, Tensor>> kept;
    for (const std::string& name : model.names()) {
      if (name != "model.visual.blocks.1.mlp.linear_fc2.bias") kept.emplace_back(name, must(model.get(name)));
    }
    must(write_safetensors(tmp + "/model.safetensors", kept));
  }
  std::filesystem::copy_file(dir + "/config.json", tmp + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const auto missing = Qwen3VisionEncoder::load(tmp, dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("blocks.1.mlp.linear_fc2.bias"), std::string::npos);

  std::ifstream in(dir + "/config.json");
  const nlohmann::json base = nlohmann::json::parse(in);
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j["vision_config"]["num_position_embeddings"] = 60; }, "not a square"},
      {[](nlohmann::json& j) { j["vision_config"]["deepstack_visual_indexes"] = {0, 3}; }, "deepstack_visual_indexes"},
      {[](nlohmann::json& j) { j["vision_config"]["hidden_act"] = "relu"; }, "hidden_act"},
      {[](nlohmann::json& j) { j["vision_config"]["num_heads"] = 5; }, "num_heads"},
      {[](nlohmann::json& j) { j["vision_config"]["patch_size"] = 14; }, "differ from"},
      {[](nlohmann::json& j) { j.erase("vision_config"); }, "vision_config"},
  };
  for (const auto& [edit, needle] : cases) {
    nlohmann::json j = base;
    edit(j);
    std::ofstream(tmp + "/config.json") << j.dump();
    const auto loaded = Qwen3VisionEncoder::load(tmp, dir);
    ASSERT_FALSE(loaded.ok()) << needle;
    EXPECT_NE(loaded.status().message().find(needle), std::string::npos) << loaded.status().message();
  }
  std::ofstream(tmp + "/config.json") << base.dump();
  std::ofstream(tmp + "/preprocessor_config.json") << R"({"patch_size": 16, "merge_size": 2, "do_normalize": false})";
  const auto no_normalise = Qwen3VisionEncoder::load(dir, tmp);
  ASSERT_FALSE(no_normalise.ok());
  EXPECT_NE(no_normalise.status().message().find("do_normalize"), std::string::npos);
  std::filesystem::remove(tmp + "/preprocessor_config.json");
  EXPECT_EQ(Qwen3VisionEncoder::load(dir, tmp).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace vortex::text
