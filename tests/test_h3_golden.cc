// Parity of the H3 CPU program with the diffusers reference (tests/golden, made by
// tools/golden/make_h3_golden.py): every intermediate the reference recorded, in forward order,
// for both configs, both checkpoint layouts, fp32 and bf16.
#include <gtest/gtest.h>

#include <map>

#include "h3_golden_util.h"
#include "models/h3/weights.h"

namespace vortex {
namespace {

using test::golden_path;

struct ParityCase {
  std::string config;  // folder under tests/golden
  std::string layout;  // "diffusers" or "original"
  DType dtype;
};

std::string case_name(const testing::TestParamInfo<ParityCase>& info) {
  return info.param.config + "_" + info.param.layout + "_" + (info.param.dtype == DType::kF32 ? "fp32" : "bf16");
}

class H3Parity : public testing::TestWithParam<ParityCase> {};

// rel-L2 bounds: fp32 is the bound (measured < 1e-6). bf16: the reference's own CPU bf16
// run is the target; only accumulation order differs, which flips single bf16 roundings. Measured
// worst case 3.9e-3 (tiny config, audio head; the refiner output is bit-exact there); for scale,
// the reference's bf16 run is up to 1.2e-2 away from its fp32 run.
constexpr double kFp32Bound = 1e-4;
constexpr double kBf16Bound = 1e-2;

TEST_P(H3Parity, EveryIntermediateMatchesTheReference) {
  const ParityCase& pc = GetParam();
  auto model = h3::load_model(golden_path(pc.config + "/" + pc.layout + ".safetensors"), pc.dtype);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto io = SafetensorsFile::open(golden_path(pc.config + (pc.dtype == DType::kF32 ? "/io_fp32" : "/io_bf16") +
                                              ".safetensors"));
  ASSERT_TRUE(io.ok()) << io.status().to_string();
  auto golden = test::read_golden_case(*io);
  ASSERT_TRUE(golden.ok()) << golden.status().to_string();
  auto transformer = h3::H3Transformer::create(std::move(model->weights));
  ASSERT_TRUE(transformer.ok()) << transformer.status().to_string();

  std::vector<std::pair<std::string, Tensor>> seen;
  h3::ForwardObserver observer = [&](const std::string& name, const Tensor& t) { seen.emplace_back(name, t.clone()); };
  auto request = (*transformer)->prepare(golden->layout, golden->text_states, &observer);
  ASSERT_TRUE(request.ok()) << request.status().to_string();
  auto out = (*transformer)->forward(*request, golden->step, &observer);
  ASSERT_TRUE(out.ok()) << out.status().to_string();

  const double bound = pc.dtype == DType::kF32 ? kFp32Bound : kBf16Bound;
  int compared = 0;
  // Forward order, so the first failure printed is the first diverging tensor.
  for (const auto& [name, value] : seen) {
    if (!io->has("out." + name)) continue;
    auto ref = io->get("out." + name);
    ASSERT_TRUE(ref.ok());
    ASSERT_EQ(value.shape(), ref->shape()) << name;
    const double err = test::rel_l2(value, *ref);
    ++compared;
    ASSERT_LE(err, bound) << "first diverging tensor: " << name << " (rel-L2 " << err << ")";
    RecordProperty(name, std::to_string(err));
  }
  EXPECT_GE(compared, 8);
}

INSTANTIATE_TEST_SUITE_P(Goldens, H3Parity,
                         testing::Values(ParityCase{"h3_tiny", "diffusers", DType::kF32},
                                         ParityCase{"h3_tiny", "original", DType::kF32},
                                         ParityCase{"h3_small", "diffusers", DType::kF32},
                                         ParityCase{"h3_small", "original", DType::kF32},
                                         ParityCase{"h3_tiny", "diffusers", DType::kBF16},
                                         ParityCase{"h3_small", "diffusers", DType::kBF16},
                                         ParityCase{"h3_small", "original", DType::kBF16}),
                         case_name);

TEST(H3Layout, SmallT2vaLayoutEqualsTheReferencePipeline) {
  auto io = SafetensorsFile::open(golden_path("h3_small/io_fp32.safetensors"));
  ASSERT_TRUE(io.ok());
  auto golden = test::read_golden_case(*io);
  ASSERT_TRUE(golden.ok());
  auto config = h3::config_preset("small");
  ASSERT_TRUE(config.ok());
  auto geometry = h3::resolve_geometry({128, 192, 22}, *config);
  ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
  auto layout = h3::build_t2va_layout(12, *geometry, *config);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->positions, golden->layout.positions);  // bit-exact float64
  EXPECT_EQ(layout->tags, golden->layout.tags);
  EXPECT_EQ(layout->text_indices, golden->layout.text_indices);
  EXPECT_EQ(layout->audio_indices, golden->layout.audio_indices);
  EXPECT_EQ(layout->video_indices, golden->layout.video_indices);
}

TEST(H3Layout, CanonicalLayoutEqualsTheReferencePipeline) {
  auto file = SafetensorsFile::open(golden_path("layout_canonical.safetensors"));
  ASSERT_TRUE(file.ok());
  auto config = h3::config_preset("h3");
  ASSERT_TRUE(config.ok());
  auto geometry = h3::resolve_geometry({768, 1344, 124}, *config);
  ASSERT_TRUE(geometry.ok());
  EXPECT_EQ(geometry->latent_frames, 37);
  EXPECT_EQ(geometry->audio_latents, 207);
  auto layout = h3::build_t2va_layout(100, *geometry, *config);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->num_rows, 37810);
  auto positions = file->get("position_ids");
  ASSERT_TRUE(positions.ok());
  ASSERT_EQ(positions->numel(), layout->num_rows * 3);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < positions->numel(); ++i) mismatches += element_as_double(*positions, i) != layout->positions[i];
  EXPECT_EQ(mismatches, 0);
  auto tags = file->get("token_tags");
  ASSERT_TRUE(tags.ok());
  auto ref_tags = test::to_i64_vector(*tags);
  ASSERT_EQ(ref_tags.size(), layout->tags.size());
  for (size_t i = 0; i < ref_tags.size(); ++i) ASSERT_EQ(ref_tags[i], layout->tags[i]) << "row " << i;
  // The reference's video rows are the rows it tags video, in order.
  std::vector<int64_t> ref_video;
  for (size_t i = 0; i < ref_tags.size(); ++i) {
    if (ref_tags[i] == h3::kVideoTag) ref_video.push_back(static_cast<int64_t>(i));
  }
  EXPECT_EQ(ref_video, layout->video_indices);
}

TEST(H3Layout, BadGeometryIsAnErrorNamingTheField) {
  auto config = h3::config_preset("h3");
  ASSERT_TRUE(config.ok());
  auto frames = h3::resolve_geometry({768, 1344, 120}, *config);
  ASSERT_FALSE(frames.ok());
  EXPECT_NE(frames.status().message().find("frames 120"), std::string::npos) << frames.status().message();
  EXPECT_NE(frames.status().message().find("124"), std::string::npos);
  auto width = h3::resolve_geometry({768, 1340, 124}, *config);
  ASSERT_FALSE(width.ok());
  EXPECT_NE(width.status().message().find("width"), std::string::npos);
}

}  // namespace
}  // namespace vortex
