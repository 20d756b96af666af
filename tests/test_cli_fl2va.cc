// generate --first-frame / --last-frame as a user runs it (fl2va), on the small preset with a
// synthetic Qwen3-VL (text encoder and vision tower) and the small synthetic video VAE, whose 16x
// spatial ratio is the transformer's. The CLI's latents are the bits of the library path taken by
// hand (keyframes onto the canvas, the presentation through the text encoder, the VAE posterior
// under seed 42, generate_fl2va); refusals are one line and write nothing. `vortex serve` takes the
// same keyframes as multipart PNG parts and writes the same bits.
#include <gtest/gtest.h>

#include <algorithm>
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
#if defined(VORTEX_HAVE_SERVICE)
#include "serve_process.h"
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

#if defined(VORTEX_HAVE_SERVICE)
// The served first_frame / last_frame parts: the job's latents are the bits generate writes for the
// same keyframes, and its record names the canvas and the saved PNGs (what a restarted server
// reads). A bad keyframe request is a 400 naming the part or field and leaves no file behind.
TEST_F(CliFl2va, ServedKeyframesAreTheBitsGenerateWrites) {
  using test_util::json_of;
  const std::string tokenizer = test::golden_path("qwen_tokenizer_trimmed.json");
  const std::vector<std::string> encoder = {"--text-encoder", encoder_dir(), "--tokenizer", tokenizer,
                                            "--text-encoder-layer", "2"};
  std::vector<std::string> flags = encoder;
  flags.insert(flags.end(), {"--synthetic-video-vae", "small"});
  test_util::ServeProcess server(flags, "small");
  httplib::Client c = server.client();
  EXPECT_EQ(json_of(c.Get("/healthz")).value("keyframes", false), true);
  const auto submit = [](httplib::Client& to, const nlohmann::json& body, const std::string& first_png,
                          const std::string& last_png) {
    httplib::MultipartFormDataItems parts = {{"request", body.dump(), "", "application/json"}};
    if (!first_png.empty()) parts.push_back({"first_frame", first_png, "first.png", "image/png"});
    if (!last_png.empty()) parts.push_back({"last_frame", last_png, "last.png", "image/png"});
    return to.Post("/v1/jobs", parts);
  };
  const nlohmann::json body = {{"prompt", kPrompt}, {"height", 64}, {"width", 64},
                               {"frames", 22},      {"steps", 3},   {"seed", 5}};
  const httplib::Result submitted = submit(c, body, test_util::read_bytes(first()), test_util::read_bytes(last()));
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  const nlohmann::json done = test_util::wait_for_state(c, json_of(submitted).at("id"), "succeeded");
  const std::string out = tmp_.file("g");
  const auto generated = run_cli(request(out) + " --first-frame " + q(first()) + " --last-frame " + q(last()));
  ASSERT_EQ(generated.code, 0) << generated.err;
  const auto want = nlohmann::json::parse(test_util::read_bytes(out + ".json"));
  EXPECT_EQ(done["result"]["checksums"], want["checksums"]) << server.log();
  EXPECT_EQ(done["result"]["request"]["task"], "fl2va");
  const nlohmann::json& recorded = done.at("request");
  EXPECT_EQ(recorded.value("height", 0), 64);
  EXPECT_EQ(test_util::read_bytes(recorded.value("first_frame", "")), test_util::read_bytes(first()));
  EXPECT_EQ(test_util::read_bytes(recorded.value("last_frame", "")), test_util::read_bytes(last()));

  std::vector<fs::path> kept;
  for (const auto& entry : fs::directory_iterator(server.results())) kept.push_back(entry.path());
  const auto expect_refused = [&](const httplib::Result& r, const std::string& needle) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(json_of(r).value("error", "").find(needle), std::string::npos) << r->body;
  };
  const std::string png = test_util::read_bytes(first());
  expect_refused(submit(c, {{"text_tokens", 4}, {"height", 64}, {"width", 64}, {"frames", 22}}, png, ""), "prompt");
  expect_refused(submit(c, {{"prompt", kPrompt}, {"height", 64}}, png, ""), "give both");
  expect_refused(submit(c, {{"prompt", kPrompt}, {"first_frame", "first.png"}}, "", ""), "multipart part 'first_frame'");
  expect_refused(submit(c, {{"prompt", kPrompt}, {"height", 64}, {"width", 64}, {"frames", 22}}, "", "not an image"),
                 "PNG signature");
  std::vector<fs::path> after;
  for (const auto& entry : fs::directory_iterator(server.results())) after.push_back(entry.path());
  std::sort(kept.begin(), kept.end());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, kept) << "a refused request's uploads are removed";
  EXPECT_EQ(server.stop(), 0) << server.log();

  // A server with a text encoder but no video VAE refuses keyframes by name; a video VAE that could
  // only encode keyframes, without a text encoder to show them to, is refused at start.
  test_util::ServeProcess prompts_only(encoder, "small");
  httplib::Client p = prompts_only.client();
  expect_refused(submit(p, body, png, ""), "encodes no keyframes");
  EXPECT_EQ(prompts_only.stop(), 0) << prompts_only.log();
  expect_one_line_error(
      run_cli("serve --synthetic small --results " + q(tmp_.file("r")) + " --synthetic-video-vae small"),
      "give --text-encoder too");
}
#endif  // VORTEX_HAVE_SERVICE

#else
TEST(CliFl2va, NeedsThePngReader) { GTEST_SKIP() << "no PNG reader in this build"; }
#endif

}  // namespace
}  // namespace vortex
