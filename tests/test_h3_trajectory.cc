// The t2va, fl2va and ref2va loops against the reference's 4-point trajectories (tests/golden/h3_small/
// trajectory*.safetensors), and the reproducibility contract of a seeded generation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

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
  auto result = h3::denoise(*model, golden->layout, *text, video->clone(), audio->clone(), options);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->forwards, options.steps - 1);
  const double video_err = test::rel_l2(result->video_rows, *traj->get("out.video_latents"));
  const double audio_err = test::rel_l2(result->audio_rows, *traj->get("out.audio_latents"));
  EXPECT_LE(video_err, 1e-5);
  EXPECT_LE(audio_err, 1e-5);
}

// fl2va: two keyframes (first, last) noised once to t = 0.999, their rows in every forward and never
// stepped; picture tokens in the text tagged video (tools/golden/make_h3_fl2va_trajectory_golden.py).
TEST(H3Trajectory, FourPointKeyframeDenoiseMatchesTheReference) {
  auto model = small_model(DType::kF32);
  auto traj = SafetensorsFile::open(test::golden_path("h3_small/trajectory_fl2va.safetensors"));
  ASSERT_TRUE(traj.ok()) << traj.status().to_string();
  const auto get = [&](const std::string& name) {
    auto t = traj->get(name);
    EXPECT_TRUE(t.ok()) << name;
    return t.ok() ? t->contiguous() : Tensor();
  };
  std::vector<int32_t> tags;
  for (int64_t v : test::to_i64_vector(get("in.text_tags"))) tags.push_back(static_cast<int32_t>(v));
  auto geometry = h3::resolve_geometry({128, 192, 22}, model->config());
  ASSERT_TRUE(geometry.ok());
  const std::vector<h3::KeyframeAnchor> anchors = {h3::KeyframeAnchor::kFirst, h3::KeyframeAnchor::kLast};
  auto layout = h3::build_keyframe_layout(tags, *geometry, model->config(), anchors);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  std::vector<Tensor> keyframes, noise;
  for (int k = 0; k < 2; ++k) {
    keyframes.push_back(get("in.keyframe." + std::to_string(k)));
    noise.push_back(get("in.keyframe_noise." + std::to_string(k)));
  }
  auto condition = h3::condition_rows(keyframes, noise, model->config());
  ASSERT_TRUE(condition.ok()) << condition.status().to_string();
  EXPECT_EQ(test::rel_l2(*condition, get("out.condition_rows")), 0.0);  // the same fp32 ops, elementwise
  const Tensor generated = get("in.video_noise");
  Tensor video = Tensor::empty({layout->num_video, generated.size(1)}, DType::kF32);
  std::memcpy(video.data(), condition->data(), condition->nbytes());
  std::memcpy(static_cast<char*>(video.data()) + condition->nbytes(), generated.data(), generated.nbytes());
  h3::GenerateOptions options;
  options.steps = std::stoi(traj->metadata().at("steps"));
  auto result = h3::denoise(*model, *layout, get("in.encoder_hidden_states"), video, get("in.audio_noise").clone(),
                            options);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  const Tensor ref_video = get("out.video_latents");
  const double video_err = test::rel_l2(result->video_rows, ref_video);
  const double audio_err = test::rel_l2(result->audio_rows, get("out.audio_latents"));
  EXPECT_LE(video_err, 1e-5);
  EXPECT_LE(audio_err, 1e-5);
  std::printf("fl2va 3-evaluation trajectory vs the reference: video rel-L2 %.3e, audio %.3e\n", video_err,
              audio_err);
  // The keyframe rows come out as they went in.
  auto kept = result->video_rows.slice(0, 0, layout->num_condition);
  EXPECT_EQ(test::rel_l2(kept->contiguous(), *condition), 0.0);
}

TEST(H3Trajectory, SeededKeyframeGenerationIsReproducibleAndChecked) {
  auto model = small_model(DType::kBF16);
  const Tensor text = h3::seeded_normal({12, model->config().text_dim}, 5, h3::kSyntheticTextStream);
  std::vector<int32_t> tags(12, h3::kTextTag);
  for (int i = 2; i < 6; ++i) tags[i] = h3::kVideoTag;
  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 3;
  options.seed = 11;
  const std::vector<h3::Keyframe> keyframes = {
      {h3::seeded_normal({24, 1, 8, 12}, 3, 9), h3::KeyframeAnchor::kLast}};
  h3::CpuStepModel cpu(*model);
  auto a = h3::generate_fl2va(cpu, text, tags, keyframes, options);
  auto b = h3::generate_fl2va(cpu, text, tags, keyframes, options);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string();
  EXPECT_EQ(a->layout.num_condition, 24);
  EXPECT_EQ(a->video_latents.shape(), Shape({24, 7, 8, 12}));  // the generated frames only
  EXPECT_EQ(h3::latent_checksum(a->video_latents).sha256, h3::latent_checksum(b->video_latents).sha256);
  auto t2va = h3::generate_t2va(cpu, text, options);
  ASSERT_TRUE(t2va.ok());
  EXPECT_NE(h3::latent_checksum(a->video_latents).sha256, h3::latent_checksum(t2va->video_latents).sha256);

  const std::vector<h3::Keyframe> wrong_size = {{h3::seeded_normal({24, 1, 8, 10}, 3, 9), h3::KeyframeAnchor::kFirst}};
  auto size = h3::generate_fl2va(cpu, text, tags, wrong_size, options);
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.status().message().find("keyframe 1"), std::string::npos) << size.status().message();
  auto none = h3::generate_fl2va(cpu, text, tags, {}, options);
  EXPECT_FALSE(none.ok());
  auto short_tags = h3::generate_fl2va(cpu, text, std::vector<int32_t>(5, h3::kTextTag), keyframes, options);
  ASSERT_FALSE(short_tags.ok());
  EXPECT_NE(short_tags.status().message().find("text tags"), std::string::npos);
  Tensor nan = keyframes[0].latents.clone();
  nan.data_as<float>()[17] = std::nanf("");
  auto bad = h3::generate_fl2va(cpu, text, tags, {{nan, h3::KeyframeAnchor::kLast}}, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("element 17"), std::string::npos) << bad.status().message();
}

// ref2va: two images, an audio reference and a video with a soundtrack, in that packed order; the
// video latents noised once to t = 0.999, the soundtracks clean at t = 1, none of them stepped
// (tools/golden/make_h3_ref2va_trajectory_golden.py).
TEST(H3Trajectory, FourPointReferenceDenoiseMatchesTheReference) {
  auto model = small_model(DType::kF32);
  auto traj = SafetensorsFile::open(test::golden_path("h3_small/trajectory_ref2va.safetensors"));
  ASSERT_TRUE(traj.ok()) << traj.status().to_string();
  const auto get = [&](const std::string& name) {
    auto t = traj->get(name);
    EXPECT_TRUE(t.ok()) << name;
    return t.ok() ? t->contiguous() : Tensor();
  };
  std::vector<int32_t> tags;
  for (int64_t v : test::to_i64_vector(get("in.text_tags"))) tags.push_back(static_cast<int32_t>(v));
  auto geometry = h3::resolve_geometry({128, 192, 22}, model->config());
  ASSERT_TRUE(geometry.ok());
  using K = h3::ReferenceKind;
  const std::vector<h3::ReferenceBlock> blocks = {
      {K::kImage, 1, 4, 10, 0}, {K::kAudio, 0, 0, 0, 9}, {K::kVideo, 2, 6, 4, 5}, {K::kImage, 1, 6, 6, 0}};
  auto layout = h3::build_ref2va_layout(tags, blocks, *geometry, model->config());
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  std::vector<Tensor> latents, noise;
  for (int k = 0; k < 3; ++k) {
    latents.push_back(get("in.reference." + std::to_string(k)));
    noise.push_back(get("in.reference_noise." + std::to_string(k)));
  }
  auto condition = h3::condition_rows(latents, noise, model->config());
  ASSERT_TRUE(condition.ok()) << condition.status().to_string();
  EXPECT_EQ(test::rel_l2(*condition, get("out.condition_rows")), 0.0);
  const auto stack = [](const std::vector<Tensor>& blocks) {
    int64_t rows = 0;
    for (const Tensor& b : blocks) rows += b.size(0);
    Tensor out = Tensor::empty({rows, blocks[0].size(1)}, DType::kF32);
    char* dst = static_cast<char*>(out.data());
    for (const Tensor& b : blocks) {
      std::memcpy(dst, b.data(), b.nbytes());
      dst += b.nbytes();
    }
    return out;
  };
  const Tensor soundtracks = stack({get("in.reference_audio.0"), get("in.reference_audio.1")});
  ASSERT_EQ(soundtracks.size(0), layout->num_condition_audio);
  ASSERT_EQ(condition->size(0), layout->num_condition);
  h3::GenerateOptions options;
  options.steps = std::stoi(traj->metadata().at("steps"));
  auto result = h3::denoise(*model, *layout, get("in.encoder_hidden_states"),
                            stack({*condition, get("in.video_noise")}), stack({soundtracks, get("in.audio_noise")}),
                            options);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  const double video_err = test::rel_l2(result->video_rows, get("out.video_latents"));
  const double audio_err = test::rel_l2(result->audio_rows, get("out.audio_latents"));
  EXPECT_LE(video_err, 1e-5);
  EXPECT_LE(audio_err, 1e-5);
  std::printf("ref2va 3-evaluation trajectory vs the reference: video rel-L2 %.3e, audio %.3e\n", video_err,
              audio_err);
  // The reference rows come out as they went in.
  auto kept_video = result->video_rows.slice(0, 0, layout->num_condition);
  auto kept_audio = result->audio_rows.slice(0, 0, layout->num_condition_audio);
  EXPECT_EQ(test::rel_l2(kept_video->contiguous(), *condition), 0.0);
  EXPECT_EQ(test::rel_l2(kept_audio->contiguous(), soundtracks), 0.0);
}

TEST(H3Trajectory, SeededReferenceGenerationIsReproducibleAndChecked) {
  auto model = small_model(DType::kBF16);
  const h3::H3Config& config = model->config();
  const Tensor text = h3::seeded_normal({12, config.text_dim}, 5, h3::kSyntheticTextStream);
  std::vector<int32_t> tags(12, h3::kTextTag);
  for (int i = 2; i < 6; ++i) tags[i] = h3::kVideoTag;
  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 3;
  options.seed = 11;
  using K = h3::ReferenceKind;
  const h3::Reference image{K::kImage, h3::seeded_normal({24, 1, 6, 4}, 3, 9), Tensor()};
  const h3::Reference voice{K::kAudio, Tensor(), h3::seeded_normal({14, 32}, 3, 10)};
  const std::vector<h3::Reference> references = {image, voice};
  h3::CpuStepModel cpu(*model);
  auto a = h3::generate_ref2va(cpu, text, tags, references, options);
  auto b = h3::generate_ref2va(cpu, text, tags, references, options);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string();
  EXPECT_EQ(a->layout.num_condition, 6);
  EXPECT_EQ(a->layout.num_condition_audio, 14);
  EXPECT_EQ(a->video_latents.shape(), Shape({24, 7, 8, 12}));  // the generated rows only
  EXPECT_EQ(a->audio_latents.shape(), Shape({2, 37, 32}));
  EXPECT_EQ(h3::latent_checksum(a->video_latents).sha256, h3::latent_checksum(b->video_latents).sha256);
  EXPECT_EQ(h3::latent_checksum(a->audio_latents).sha256, h3::latent_checksum(b->audio_latents).sha256);
  // The reference order is part of the request.
  auto swapped = h3::generate_ref2va(cpu, text, tags, {voice, image}, options);
  ASSERT_TRUE(swapped.ok()) << swapped.status().to_string();
  EXPECT_NE(h3::latent_checksum(a->video_latents).sha256, h3::latent_checksum(swapped->video_latents).sha256);

  const auto refused = [&](const std::vector<h3::Reference>& refs, const std::string& needle) {
    auto r = h3::generate_ref2va(cpu, text, tags, refs, options);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  refused({}, "at least one reference");
  refused({voice}, "an audio reference needs an image or video reference beside it");
  refused(std::vector<h3::Reference>(10, image), "10 image references; at most 9");
  refused({image, image, image, image, image, voice, voice, voice, voice}, "4 audio references; at most 3");
  refused({image, {K::kImage, h3::seeded_normal({24, 2, 6, 4}, 3, 9), Tensor()}}, "reference 2 (image): latents");
  refused({image, {K::kImage, image.latents, voice.audio_rows}}, "reference 2 (image): an image reference has no");
  refused({image, {K::kAudio, Tensor(), h3::seeded_normal({14, 31}, 3, 10)}}, "reference 2 (audio): soundtrack rows");
  refused({image, {K::kAudio, Tensor(), h3::seeded_normal({13, 32}, 3, 10)}}, "reference 2 (audio): soundtrack rows");
  refused({{K::kVideo, Tensor(), Tensor()}}, "reference 1 (video): needs video latents");
  Tensor nan = voice.audio_rows.clone();
  nan.data_as<float>()[33] = std::nanf("");
  refused({image, {K::kAudio, Tensor(), nan}}, "soundtrack element 33 is not finite");
  Tensor nan_latents = image.latents.clone();
  nan_latents.data_as<float>()[5] = std::nanf("");
  refused({{K::kImage, nan_latents, Tensor()}}, "condition 1: latent element 5 is not finite");
  auto short_tags = h3::generate_ref2va(cpu, text, std::vector<int32_t>(5, h3::kTextTag), references, options);
  ASSERT_FALSE(short_tags.ok());
  EXPECT_NE(short_tags.status().message().find("text tags"), std::string::npos);
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
