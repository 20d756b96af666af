// generate --first-frame / --last-frame as a user runs it (fl2va), on the small preset with a
// synthetic Qwen3-VL (text encoder and vision tower) and the small synthetic video VAE, whose 16x
// spatial ratio is the transformer's. The CLI's latents are the bits of the library path taken by
// hand (keyframes onto the canvas, the presentation through the text encoder, the VAE posterior
// under seed 42, generate_fl2va); refusals are one line and write nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/h3/generate.h"
#include "models/h3/keyframes.h"
#include "models/h3/step_model.h"
#include "models/h3/synthetic.h"
#include "models/h3/transformer.h"
#include "models/h3/weights.h"
#include "models/vae/video_vae_encoder.h"
#include "must.h"
#include "text/synthetic_qwen3.h"
#include "text/text_conditioner.h"
#if defined(VORTEX_HAVE_MEDIA)
#include "media/png.h"
#endif

namespace vortex {
namespace {

#if defined(VORTEX_HAVE_MEDIA)

namespace fs = std::filesystem;
using test::must;
using test_util::expect_one_line_error;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

constexpr int64_t kQwenVocab = 151936;
constexpr char kPrompt[] = "A cat walks across the frame.";

Tensor pattern(int64_t height, int64_t width, int salt) {
  Tensor rgb = Tensor::empty({height, width, 3}, DType::kU8);
  for (int64_t i = 0; i < rgb.numel(); ++i) rgb.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 29 + salt) % 251);
  return rgb;
}

class CliFl2va : public ::testing::Test {
 protected:
  void SetUp() override {
    text::SyntheticQwen3Shape shape;
    shape.hidden = 40;  // the small preset's text_dim
    shape.vocab = kQwenVocab;
    shape.vision_depth = 2;
    must(text::write_synthetic_qwen3(encoder_dir(), shape));
    must(media::write_png(first(), pattern(64, 64, 0)));
    must(media::write_png(last(), pattern(50, 70, 7)));  // cover-cropped onto the canvas
  }
  std::string encoder_dir() const { return (tmp_.path() / "qwen3_vl").string(); }
  std::string first() const { return tmp_.file("first.png"); }
  std::string last() const { return tmp_.file("last.png"); }
  std::string request(const std::string& out) const {
    return "generate --synthetic small --height 64 --width 64 --frames 22 --steps 3 --seed 5 --text-encoder " +
           q(encoder_dir()) + " --tokenizer " + q(test::golden_path("qwen_tokenizer_trimmed.json")) +
           " --text-encoder-layer 2 --prompt " + q(kPrompt) + " --synthetic-video-vae small --out " + q(out);
  }
  TempDir tmp_;
};

TEST_F(CliFl2va, TheCliRunsTheLibrarysFl2va) {
  const std::string out = tmp_.file("g");
  const auto run = run_cli(request(out) + " --first-frame " + q(first()) + " --last-frame " + q(last()));
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("encoding keyframe 2 (" + last() + ") through the video VAE"), std::string::npos) << run.err;

  // The library, step by step.
  const h3::Canvas canvas{64, 64};
  const std::vector<Tensor> pixels = {must(h3::fit_keyframe(must(media::read_png_rgb8(first())), canvas, 0)),
                                      must(h3::fit_keyframe(must(media::read_png_rgb8(last())), canvas, 1))};
  auto conditioner =
      must(text::TextConditioner::load({encoder_dir(), test::golden_path("qwen_tokenizer_trimmed.json"), 2}));
  const text::Presentation presentation = must(conditioner->keyframe_presentation(kPrompt, {{64, 64}, {64, 64}}));
  const Tensor states = must(conditioner->encode_presentation(presentation, pixels));
  std::vector<int32_t> tags;
  for (const bool vision : presentation.vision) tags.push_back(vision ? h3::kVideoTag : h3::kTextTag);
  const vae::VideoVaeConfig vae_config = must(vae::video_vae_config_preset("small"));
  const vae::VideoVaeEncoder encoder =
      must(vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(vae_config, 0), vae_config));
  std::vector<h3::Keyframe> keyframes;
  for (size_t k = 0; k < pixels.size(); ++k) {
    const Tensor moments = must(vae::encode_video_moments(encoder, must(vae::keyframe_pixels(pixels[k]))));
    const Tensor eps = h3::seeded_normal({vae_config.latent_channels, moments.size(1), moments.size(2), moments.size(3)},
                                         42, h3::kKeyframePosteriorStream);
    keyframes.push_back({must(vae::sample_video_condition(vae_config, moments, eps)),
                         k == 0 ? h3::KeyframeAnchor::kFirst : h3::KeyframeAnchor::kLast});
  }
  const h3::H3Config config = must(h3::config_preset("small"));
  auto transformer = must(h3::H3Transformer::create(must(
      h3::assemble_weights(must(h3::synthetic_weights(config, DType::kBF16, 0)), config, DType::kBF16))));
  h3::CpuStepModel steps(*transformer);
  h3::GenerateOptions options;
  options.video = {64, 64, 22};
  options.steps = 3;
  options.seed = 5;
  const h3::GenerateResult want = must(h3::generate_fl2va(steps, states, tags, keyframes, options));

  auto file = must(SafetensorsFile::open(out + ".safetensors"));
  for (const auto& [name, tensor] : {std::pair{"video_latents", &want.video_latents},
                                     std::pair{"audio_latents", &want.audio_latents}}) {
    const Tensor got = must(file.get(name));
    ASSERT_EQ(got.shape(), tensor->shape()) << name;
    EXPECT_EQ(std::memcmp(got.data(), tensor->data(), got.nbytes()), 0) << name << " differs from the library's";
  }
  const auto summary = nlohmann::json::parse(test_util::read_bytes(out + ".json"));
  EXPECT_EQ(summary["request"]["task"], "fl2va");
  EXPECT_EQ(summary["request"]["keyframes"].size(), 2u);
  EXPECT_EQ(summary["request"]["keyframes"][1]["anchor"], "last");
  EXPECT_EQ(summary["rows"]["keyframes"], want.layout.num_condition);
  EXPECT_GT(want.layout.num_condition, 0);

  // Another last frame, other latents.
  const std::string other = tmp_.file("other");
  const auto again = run_cli(request(other) + " --first-frame " + q(first()) + " --last-frame " + q(first()));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(test_util::read_bytes(out + ".safetensors"), test_util::read_bytes(other + ".safetensors"));
}

TEST_F(CliFl2va, BadInputIsOneLineAndWritesNothing) {
  const std::string out = tmp_.file("g");
  const std::string keyframe = " --first-frame " + q(first());
  const std::string base = request(out);
  const std::string without_vae = base.substr(0, base.find(" --synthetic-video-vae"));
  expect_one_line_error(run_cli(without_vae + " --out " + q(out) + keyframe), "--synthetic-video-vae");
  expect_one_line_error(run_cli(base + " --first-frame " + q(tmp_.file("none.png"))), "none.png");
  test_util::write_bytes(tmp_.file("text.png"), "not an image");
  expect_one_line_error(run_cli(base + " --first-frame " + q(tmp_.file("text.png"))), "PNG signature");
  // The canvas is the request's size, in multiples of 32, or the first keyframe's (whose aspect
  // ratio must lie in [1/4, 4]).
  const std::string sized = "--height 64 --width 64";
  std::string odd = base;
  odd.replace(odd.find(sized), sized.size(), "--height 64 --width 80");
  expect_one_line_error(run_cli(odd + keyframe), "width 80 must be a positive multiple of 32");
  std::string half = base;
  half.replace(half.find(sized), sized.size(), "--height 64");
  expect_one_line_error(run_cli(half + keyframe), "give both");
  must(media::write_png(tmp_.file("strip.png"), pattern(10, 64, 3)));
  std::string unsized = base;
  unsized.replace(unsized.find(sized), sized.size(), "");
  expect_one_line_error(run_cli(unsized + " --first-frame " + q(tmp_.file("strip.png"))), "aspect ratio");
  // Keyframes go with a prompt, through a text encoder that has a vision tower.
  std::string no_prompt = base;
  no_prompt.replace(no_prompt.find(" --prompt "), std::string(" --prompt ").size() + q(kPrompt).size(), "");
  expect_one_line_error(run_cli(no_prompt + keyframe), "--prompt");
  const auto synthetic_text = run_cli(no_prompt + keyframe + " --text-tokens 4");
  EXPECT_NE(synthetic_text.code, 0);
  EXPECT_NE(synthetic_text.err.find("--text-tokens excludes --first-frame"), std::string::npos) << synthetic_text.err;
  const std::string text_only = (tmp_.path() / "text_only").string();
  text::SyntheticQwen3Shape shape;
  shape.hidden = 40;
  shape.vocab = kQwenVocab;
  must(text::write_synthetic_qwen3(text_only, shape));
  std::string no_vision = base;
  no_vision.replace(no_vision.find(q(encoder_dir())), q(encoder_dir()).size(), q(text_only));
  expect_one_line_error(run_cli(no_vision + keyframe), "vision tower");
  expect_one_line_error(run_cli("generate --synthetic small --text-tokens 4 --image-processor " + q(encoder_dir()) +
                                " --out " + q(out)),
                        "--image-processor");
  EXPECT_FALSE(fs::exists(out + ".safetensors"));
  EXPECT_FALSE(fs::exists(out + ".json"));
}

#else
TEST(CliFl2va, NeedsThePngReader) { GTEST_SKIP() << "no PNG reader in this build"; }
#endif

}  // namespace
}  // namespace vortex
