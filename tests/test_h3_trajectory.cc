// The t2va loop against the reference's 4-point trajectory (tests/golden/h3_small/trajectory),
// and the reproducibility contract of a seeded generation.
#include <gtest/gtest.h>

#include "h3_golden_util.h"
#include "models/h3/generate.h"

namespace vortex {
namespace {

std::unique_ptr<h3::H3Transformer> small_model(DType dtype) {
  auto model = h3::load_model(test::golden_path("h3_small/diffusers.safetensors"), dtype);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  auto transformer = h3::H3Transformer::create(std::move(model->weights));
  EXPECT_TRUE(transformer.ok());
  return std::move(*transformer);
}

TEST(H3Trajectory, FourPointDenoiseMatchesTheReference) {
  auto model = small_model(DType::kF32);
  auto io = SafetensorsFile::open(test::golden_path("h3_small/io_fp32.safetensors"));
  auto traj = SafetensorsFile::open(test::golden_path("h3_small/trajectory.safetensors"));
  ASSERT_TRUE(io.ok() && traj.ok());
  auto golden = test::read_golden_case(*io);
  ASSERT_TRUE(golden.ok());
  h3::GenerateOptions options;
  options.steps = std::stoi(traj->metadata().at("steps"));
  auto video = traj->get("in.video_noise");
  auto audio = traj->get("in.audio_noise");
  auto text = traj->get("in.encoder_hidden_states");
  ASSERT_TRUE(video.ok() && audio.ok() && text.ok());
  auto result = h3::denoise_t2va(*model, golden->layout, *text, video->clone(), audio->clone(), options);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->forwards, options.steps - 1);
  const double video_err = test::rel_l2(result->video_rows, *traj->get("out.video_latents"));
  const double audio_err = test::rel_l2(result->audio_rows, *traj->get("out.audio_latents"));
  EXPECT_LE(video_err, 1e-5);
  EXPECT_LE(audio_err, 1e-5);
}

TEST(H3Trajectory, SeededGenerationIsReproducible) {
  auto model = small_model(DType::kBF16);
  const Tensor text = h3::seeded_normal({12, model->config().text_dim}, 5, h3::kSyntheticTextStream);
  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 3;
  options.seed = 11;
  auto a = h3::generate_t2va(*model, text, options);
  auto b = h3::generate_t2va(*model, text, options);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string();
  EXPECT_EQ(a->video_latents.shape(), Shape({24, 7, 8, 12}));
  EXPECT_EQ(a->audio_latents.shape(), Shape({2, 37, 32}));
  EXPECT_EQ(h3::latent_checksum(a->video_latents).sha256, h3::latent_checksum(b->video_latents).sha256);
  EXPECT_EQ(h3::latent_checksum(a->audio_latents).sha256, h3::latent_checksum(b->audio_latents).sha256);
  options.seed = 12;
  auto c = h3::generate_t2va(*model, text, options);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(h3::latent_checksum(a->video_latents).sha256, h3::latent_checksum(c->video_latents).sha256);
}

TEST(H3Trajectory, BadRequestsAreErrorsNotCrashes) {
  auto model = small_model(DType::kF32);
  Tensor text = h3::seeded_normal({12, model->config().text_dim}, 5, h3::kSyntheticTextStream);
  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 1;
  auto steps = h3::generate_t2va(*model, text, options);
  ASSERT_FALSE(steps.ok());
  EXPECT_NE(steps.status().message().find("steps"), std::string::npos);
  options.steps = 3;
  text.data_as<float>()[7 * model->config().text_dim + 3] = std::nanf("");
  auto nan = h3::generate_t2va(*model, text, options);
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.status().message().find("row 7"), std::string::npos) << nan.status().message();
  auto wrong = h3::generate_t2va(*model, Tensor::zeros({12, 5}, DType::kF32), options);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("text states"), std::string::npos);
}

}  // namespace
}  // namespace vortex
