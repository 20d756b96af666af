// generate --reference as a user runs it (ref2va with image, video and audio references), on the small preset
// with a synthetic Qwen3-VL (text encoder and vision tower) and the small synthetic video VAE. The
// CLI's latents are the bits of the library path taken by hand (each image onto its reference size,
// the presentation through the text encoder, the VAE posterior under seed 42, generate_ref2va);
// refusals are one line and write nothing. `vortex serve` takes the same references as numbered
// multipart parts and writes the same bits.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/h3/generate.h"
#include "models/h3/keyframes.h"
#include "models/h3/reference_video.h"
#include "models/h3/step_model.h"
#include "models/h3/synthetic.h"
#include "models/h3/transformer.h"
#include "models/h3/weights.h"
#include "media/wav.h"
#include "models/vae/audio_vae_encoder.h"
#include "models/vae/video_vae_encoder.h"
#include "must.h"
#include "text/synthetic_qwen3.h"
#include "text/text_conditioner.h"
#if defined(VORTEX_HAVE_MEDIA)
#include "media/png.h"
#include "media/mp4.h"
#include "media/video_reader.h"
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
constexpr int64_t kShortEdge = 64;
constexpr char kPrompt[] = "The subject of picture 1 walks through the scene of picture 2.";

Tensor pattern(int64_t height, int64_t width, int salt) {
  Tensor rgb = Tensor::empty({height, width, 3}, DType::kU8);
  for (int64_t i = 0; i < rgb.numel(); ++i) rgb.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 31 + salt) % 253);
  return rgb;
}

// The request() model's ref2va on the library path (the small preset's synthetic bf16 weights, 64 x 64,
// 22 frames, 3 steps, seed 5), and the CLI's latents at `out` checked to be its bits.
h3::GenerateResult expect_the_library_wrote(const std::string& out, const Tensor& states,
                                            const std::vector<int32_t>& tags, const std::vector<h3::Reference>& refs) {
  const h3::H3Config config = must(h3::config_preset("small"));
  auto transformer = must(h3::H3Transformer::create(must(
      h3::assemble_weights(must(h3::synthetic_weights(config, DType::kBF16, 0)), config, DType::kBF16))));
  h3::CpuStepModel steps(*transformer);
  h3::GenerateOptions options;
  options.video = {64, 64, 22};
  options.steps = 3;
  options.seed = 5;
  h3::GenerateResult want = must(h3::generate_ref2va(steps, states, tags, refs, options));
  auto file = must(SafetensorsFile::open(out + ".safetensors"));
  for (const auto& [name, tensor] : {std::pair{"video_latents", &want.video_latents},
                                     std::pair{"audio_latents", &want.audio_latents}}) {
    const Tensor got = must(file.get(name));
    EXPECT_EQ(got.shape(), tensor->shape()) << name;
    if (got.shape() == tensor->shape()) {
      EXPECT_EQ(std::memcmp(got.data(), tensor->data(), got.nbytes()), 0) << name << " differs from the library's";
    }
  }
  return want;
}

class CliRef2va : public ::testing::Test {
 protected:
  void SetUp() override {
    text::SyntheticQwen3Shape shape;
    shape.hidden = 40;  // the small preset's text_dim
    shape.vocab = kQwenVocab;
    shape.vision_depth = 2;
    must(text::write_synthetic_qwen3(encoder_dir(), shape));
    must(media::write_png(subject(), pattern(70, 50, 0)));  // resized to 96 x 64 (height x width)
    must(media::write_png(scene(), pattern(64, 64, 9)));    // already at its reference size
  }
  std::string encoder_dir() const { return (tmp_.path() / "qwen3_vl").string(); }
  std::string subject() const { return tmp_.file("subject.png"); }
  std::string scene() const { return tmp_.file("scene.png"); }
  std::string request(const std::string& out) const {
    return "generate --synthetic small --height 64 --width 64 --frames 22 --steps 3 --seed 5 --text-encoder " +
           q(encoder_dir()) + " --tokenizer " + q(test::golden_path("qwen_tokenizer_trimmed.json")) +
           " --text-encoder-layer 2 --prompt " + q(kPrompt) + " --synthetic-video-vae small --reference-short-edge " +
           std::to_string(kShortEdge) + " --out " + q(out);
  }
  // A voice at a CD's 44.1 kHz, longer than the 22 frames' 0.917 s: cut there, then resampled
  // onto the small audio VAE's 32 kHz.
  std::string voice() const {
    const int64_t samples = 50000;
    Tensor wave = Tensor::empty({1, samples}, DType::kF32);
    for (int64_t i = 0; i < samples; ++i) wave.data_as<float>()[i] = 0.4f * std::sin(0.01f * static_cast<float>(i));
    const std::string path = tmp_.file("voice.wav");
    must(media::write_wav(path, wave, 44100));
    return path;
  }
  std::string references(const std::vector<std::string>& paths) const {
    std::string flags;
    for (const std::string& p : paths) flags += " --reference " + q(p);
    return flags;
  }
  TempDir tmp_;
};

TEST_F(CliRef2va, TheCliRunsTheLibrarysRef2va) {
  const std::string out = tmp_.file("g");
  const auto run = run_cli(request(out) + references({subject(), scene()}));
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("encoding reference image 1 (" + subject() + ", 64x96) through the video VAE"),
            std::string::npos)
      << run.err;

  // The library, step by step.
  std::vector<Tensor> pixels;
  for (const std::string& path : {subject(), scene()}) {
    pixels.push_back(must(h3::fit_reference_image(must(media::read_png_rgb8(path)), kShortEdge)));
  }
  ASSERT_EQ(pixels[0].shape(), Shape({96, 64, 3}));
  auto conditioner =
      must(text::TextConditioner::load({encoder_dir(), test::golden_path("qwen_tokenizer_trimmed.json"), 2}));
  const text::Presentation presentation = must(conditioner->keyframe_presentation(kPrompt, {{96, 64}, {64, 64}}));
  const Tensor states = must(conditioner->encode_presentation(presentation, pixels));
  std::vector<int32_t> tags;
  for (const bool vision : presentation.vision) tags.push_back(vision ? h3::kVideoTag : h3::kTextTag);
  const vae::VideoVaeConfig vae_config = must(vae::video_vae_config_preset("small"));
  const vae::VideoVaeEncoder encoder =
      must(vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(vae_config, 0), vae_config));
  std::vector<h3::Reference> refs;
  for (const Tensor& p : pixels) {
    const Tensor moments = must(vae::encode_video_moments(encoder, must(vae::keyframe_pixels(p))));
    const Tensor eps = h3::seeded_normal({vae_config.latent_channels, moments.size(1), moments.size(2), moments.size(3)},
                                         42, h3::kKeyframePosteriorStream);
    refs.push_back({h3::ReferenceKind::kImage, must(vae::sample_video_condition(vae_config, moments, eps)), Tensor()});
  }
  const h3::GenerateResult want = expect_the_library_wrote(out, states, tags, refs);
  const auto summary = nlohmann::json::parse(test_util::read_bytes(out + ".json"));
  EXPECT_EQ(summary["request"]["task"], "ref2va");
  ASSERT_EQ(summary["request"]["references"].size(), 2u);
  EXPECT_EQ(summary["request"]["references"][0]["height"], 96);
  EXPECT_EQ(summary["request"]["references"][0]["width"], 64);
  EXPECT_EQ(summary["rows"]["references"], want.layout.num_condition);
  EXPECT_EQ(want.layout.num_condition, 3 * 2 + 2 * 2);  // 6 x 4 and 4 x 4 latents in 2 x 2 patches

  // The order is part of the request.
  const std::string swapped = tmp_.file("swapped");
  const auto again = run_cli(request(swapped) + references({scene(), subject()}));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(test_util::read_bytes(out + ".safetensors"), test_util::read_bytes(swapped + ".safetensors"));
}

// An image and a soundtrack: the soundtrack's rows are the audio VAE encoder's (cut at the
// generated duration, resampled onto the VAE's rate), labelled "<Audio 1>: " in the presentation,
// clean and never stepped.
TEST_F(CliRef2va, ASoundtrackReferenceIsTheLibrarysEncode) {
  const vae::AudioVaeConfig audio_config = must(vae::audio_vae_config_preset("small"));
  const std::string voice = this->voice();
  const std::string out = tmp_.file("g");
  const auto run = run_cli(request(out) + " --synthetic-audio-vae small" + references({scene(), voice}));
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("encoding the soundtrack of reference 2 (" + voice), std::string::npos) << run.err;

  const Tensor pixels = must(h3::fit_reference_image(must(media::read_png_rgb8(scene())), kShortEdge));
  auto conditioner =
      must(text::TextConditioner::load({encoder_dir(), test::golden_path("qwen_tokenizer_trimmed.json"), 2}));
  const text::Presentation presentation = must(conditioner->reference_presentation(
      kPrompt, {text::PresentedReference::picture(pixels.size(0), pixels.size(1)), text::PresentedReference::audio()}));
  const Tensor states = must(conditioner->encode_presentation(presentation, {pixels}));
  std::vector<int32_t> tags;
  for (const bool vision : presentation.vision) tags.push_back(vision ? h3::kVideoTag : h3::kTextTag);
  const vae::VideoVaeConfig vae_config = must(vae::video_vae_config_preset("small"));
  const vae::VideoVaeEncoder encoder =
      must(vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(vae_config, 0), vae_config));
  const Tensor moments = must(vae::encode_video_moments(encoder, must(vae::keyframe_pixels(pixels))));
  const Tensor eps = h3::seeded_normal({vae_config.latent_channels, moments.size(1), moments.size(2), moments.size(3)},
                                       42, h3::kKeyframePosteriorStream);
  const vae::AudioVaeEncoder audio = must(
      vae::assemble_audio_vae_encoder(vae::synthetic_audio_vae_tensors(audio_config, 0), audio_config));
  const media::Waveform read = must(media::read_wav(voice));
  const Tensor rows = must(vae::encode_reference_soundtrack(audio, read.samples, read.sample_rate, 22.0 / 24.0));
  const std::vector<h3::Reference> refs = {
      {h3::ReferenceKind::kImage, must(vae::sample_video_condition(vae_config, moments, eps)), Tensor()},
      {h3::ReferenceKind::kAudio, Tensor(), rows}};
  const h3::GenerateResult want = expect_the_library_wrote(out, states, tags, refs);
  const auto summary = nlohmann::json::parse(test_util::read_bytes(out + ".json"));
  EXPECT_EQ(summary["request"]["references"][1]["audio"], voice);
  EXPECT_EQ(summary["request"]["references"][1]["sample_rate"], 44100);
  EXPECT_EQ(summary["request"]["references"][1]["latents"], rows.size(0) / 2);
  EXPECT_EQ(want.layout.num_condition_audio, rows.size(0));

  // Refusals, one line each.
  expect_one_line_error(run_cli(request(out) + references({scene(), voice})), "encoded by the audio VAE");
  expect_one_line_error(run_cli(request(out) + " --synthetic-audio-vae small" + references({voice})),
                        "an audio reference needs an image or video reference beside it");
  test_util::write_bytes(tmp_.file("photo.jpg"), "jpeg");
  expect_one_line_error(run_cli(request(out) + references({tmp_.file("photo.jpg")})),
                        "a reference is a .png image, a .wav soundtrack or a video (.mp4");
}

TEST_F(CliRef2va, BadInputIsOneLineAndWritesNothing) {
  const std::string out = tmp_.file("g");
  const std::string base = request(out);
  const std::string one = references({subject()});
  expect_one_line_error(run_cli(base + references({tmp_.file("none.png")})), "none.png");
  must(media::write_png(tmp_.file("strip.png"), pattern(10, 64, 3)));
  expect_one_line_error(run_cli(base + references({scene(), tmp_.file("strip.png")})), "outside the model's 1:4 to 4:1");
  expect_one_line_error(run_cli(base + references(std::vector<std::string>(10, scene()))),
                        "10 image references; at most 9");
  expect_one_line_error(run_cli(base + one + " --first-frame " + q(scene())), "different tasks");
  const std::string without_vae = base.substr(0, base.find(" --synthetic-video-vae"));
  expect_one_line_error(run_cli(without_vae + " --out " + q(out) + one), "--synthetic-video-vae");
  std::string no_prompt = base;
  no_prompt.replace(no_prompt.find(" --prompt "), std::string(" --prompt ").size() + q(kPrompt).size(), "");
  expect_one_line_error(run_cli(no_prompt + one), "--prompt");
  std::string tiny = base;
  tiny.replace(tiny.find("--reference-short-edge 64"), 25, "--reference-short-edge 16");
  expect_one_line_error(run_cli(tiny + one), "reference short edge 16 is below 32");
  std::string odd = base;
  odd.replace(odd.find("--width 64"), 10, "--width 80");
  expect_one_line_error(run_cli(odd + one), "width 80 must be a positive multiple of 32");
  EXPECT_FALSE(fs::exists(out + ".safetensors"));
  EXPECT_FALSE(fs::exists(out + ".json"));
}

#if defined(VORTEX_HAVE_SERVICE)
// A submission with its reference parts: (part name, file bytes), a reference_audio_<k> sent as a
// WAV, a reference_video_<k> as an MP4.
httplib::Result submit_references(httplib::Client& to, const nlohmann::json& body,
                                  const std::vector<std::pair<std::string, std::string>>& files) {
  httplib::MultipartFormDataItems parts = {{"request", body.dump(), "", "application/json"}};
  for (const auto& [part, bytes] : files) {
    const bool audio = part.starts_with("reference_audio"), video = part.starts_with("reference_video");
    parts.push_back({part, bytes, part + (audio ? ".wav" : video ? ".mp4" : ".png"),
                     audio ? "audio/wav" : video ? "video/mp4" : "image/png"});
  }
  return to.Post("/v1/jobs", parts);
}

void expect_refused(const httplib::Result& r, const std::string& needle) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(test_util::json_of(r).value("error", "").find(needle), std::string::npos) << r->body;
}

// The served reference_image_<k> parts: the job's latents are the bits generate writes for the
// same references, and its record keeps their order and short edge (what a restarted server
// reads). A gap in the numbering or a reference on a server that encodes none is a 400.
TEST_F(CliRef2va, ServedReferencesAreTheBitsGenerateWrites) {
  using test_util::json_of;
  const std::string tokenizer = test::golden_path("qwen_tokenizer_trimmed.json");
  const std::vector<std::string> encoder = {"--text-encoder", encoder_dir(), "--tokenizer", tokenizer,
                                            "--text-encoder-layer", "2"};
  std::vector<std::string> flags = encoder;
  flags.insert(flags.end(), {"--synthetic-video-vae", "small"});
  test_util::ServeProcess server(flags, "small");
  httplib::Client c = server.client();
  EXPECT_EQ(json_of(c.Get("/healthz")).value("references", false), true);
  const auto submit = submit_references;
  const nlohmann::json body = {{"prompt", kPrompt}, {"height", 64}, {"width", 64},       {"frames", 22},
                               {"steps", 3},        {"seed", 5},    {"reference_short_edge", kShortEdge}};
  const std::string subject_png = test_util::read_bytes(subject()), scene_png = test_util::read_bytes(scene());
  const httplib::Result submitted =
      submit(c, body, {{"reference_image_1", subject_png}, {"reference_image_2", scene_png}});
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  const nlohmann::json done = test_util::wait_for_state(c, json_of(submitted).at("id"), "succeeded");
  const std::string out = tmp_.file("g");
  const auto generated = run_cli(request(out) + references({subject(), scene()}));
  ASSERT_EQ(generated.code, 0) << generated.err;
  const auto want = nlohmann::json::parse(test_util::read_bytes(out + ".json"));
  EXPECT_EQ(done["result"]["checksums"], want["checksums"]) << server.log();
  EXPECT_EQ(done["result"]["request"]["task"], "ref2va");
  const nlohmann::json& recorded = done.at("request");
  ASSERT_EQ(recorded.at("references").size(), 2u);
  EXPECT_EQ(test_util::read_bytes(recorded["references"][0]), subject_png);
  EXPECT_EQ(test_util::read_bytes(recorded["references"][1]), scene_png);
  EXPECT_EQ(recorded.value("reference_short_edge", 0), kShortEdge);

  expect_refused(submit(c, body, {{"reference_image_2", scene_png}}), "reference_image_2: came without a reference 1");
  expect_refused(submit(c, {{"prompt", kPrompt}, {"reference_short_edge", 64}}, {}),
                 "no 'reference_image_<k>' part came");
  expect_refused(submit(c, {{"prompt", kPrompt}, {"reference_image_1", "a.png"}}, {}), "multipart part 'reference_image_1'");
  expect_refused(submit(c, body, {{"reference_image_1", "not an image"}}), "PNG signature");
  expect_refused(submit(c, body, {{"reference_image_1", scene_png}, {"first_frame", scene_png}}), "different tasks");
  EXPECT_EQ(server.stop(), 0) << server.log();

  test_util::ServeProcess prompts_only(encoder, "small");
  httplib::Client p = prompts_only.client();
  expect_refused(submit(p, body, {{"reference_image_1", scene_png}}), "encodes no references");
  EXPECT_EQ(prompts_only.stop(), 0) << prompts_only.log();
}

// A soundtrack as the part reference_audio_<k>, numbered with the images in reading order: the
// job's latents are the bits generate writes for the same references (the audio encoder loaded
// once, beside the video VAE and without --media). A soundtrack on a server without an audio VAE,
// two parts at one position or a gap is a 400.
TEST_F(CliRef2va, ServedSoundtracksAreTheBitsGenerateWrites) {
  using test_util::json_of;
  const std::vector<std::string> encoder = {"--text-encoder",     encoder_dir(),
                                            "--tokenizer",        test::golden_path("qwen_tokenizer_trimmed.json"),
                                            "--text-encoder-layer", "2",
                                            "--synthetic-video-vae", "small"};
  std::vector<std::string> flags = encoder;
  flags.insert(flags.end(), {"--synthetic-audio-vae", "small"});
  test_util::ServeProcess server(flags, "small");
  httplib::Client c = server.client();
  EXPECT_EQ(json_of(c.Get("/healthz")).value("soundtrack_references", false), true);
  const nlohmann::json body = {{"prompt", kPrompt}, {"height", 64}, {"width", 64},       {"frames", 22},
                               {"steps", 3},        {"seed", 5},    {"reference_short_edge", kShortEdge}};
  const std::string voice = this->voice();
  const std::string scene_png = test_util::read_bytes(scene()), voice_wav = test_util::read_bytes(voice);
  const httplib::Result submitted =
      submit_references(c, body, {{"reference_image_1", scene_png}, {"reference_audio_2", voice_wav}});
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  const nlohmann::json done = test_util::wait_for_state(c, json_of(submitted).at("id"), "succeeded");
  const std::string out = tmp_.file("g");
  const auto generated = run_cli(request(out) + " --synthetic-audio-vae small" + references({scene(), voice}));
  ASSERT_EQ(generated.code, 0) << generated.err;
  const auto want = nlohmann::json::parse(test_util::read_bytes(out + ".json"));
  EXPECT_EQ(done["result"]["checksums"], want["checksums"]) << server.log();
  const nlohmann::json& recorded = done.at("request");
  ASSERT_EQ(recorded.at("references").size(), 2u);
  EXPECT_EQ(test_util::read_bytes(recorded["references"][1]), voice_wav);
  EXPECT_EQ(done["result"]["request"]["references"][1]["sample_rate"], 44100);

  expect_refused(submit_references(c, body, {{"reference_image_1", scene_png}, {"reference_audio_1", voice_wav}}),
                 "reference_audio_1: came beside reference_image_1");
  expect_refused(submit_references(c, body, {{"reference_image_1", scene_png}, {"reference_audio_3", voice_wav}}),
                 "reference_audio_3: came without a reference 2");
  expect_refused(submit_references(c, body, {{"reference_audio_1", voice_wav}}),
                 "an audio reference needs an image or video reference beside it");
  expect_refused(submit_references(c, body, {{"reference_image_1", scene_png}, {"reference_audio_2", "RIFF"}}),
                 "reference_audio_2");
  EXPECT_EQ(server.stop(), 0) << server.log();

  test_util::ServeProcess images_only(encoder, "small");
  httplib::Client p = images_only.client();
  EXPECT_EQ(json_of(p.Get("/healthz")).value("soundtrack_references", true), false);
  expect_refused(submit_references(p, body, {{"reference_image_1", scene_png}, {"reference_audio_2", voice_wav}}),
                 "reference_audio_2: this server encodes no soundtracks");
  EXPECT_EQ(images_only.stop(), 0) << images_only.log();
}
#endif  // VORTEX_HAVE_SERVICE

// A clip of `frames` frames at 12 fps, 64 x 64, with a stereo soundtrack at 48 kHz (as long as the
// frames: 2/3 s for 8) or silent.
std::string write_clip(const std::string& path, bool with_sound = true, int64_t frames = 8) {
  const int64_t F = frames, S = frames * 4000;
  Tensor video = Tensor::empty({3, F, 64, 64}, DType::kF32);
  for (int64_t i = 0; i < video.numel(); ++i) video.data_as<float>()[i] = static_cast<float>((i * 7) % 64) / 63.0f;
  Tensor audio = Tensor::empty({2, S}, DType::kF32);
  for (int64_t i = 0; i < audio.numel(); ++i) audio.data_as<float>()[i] = 0.3f * std::sin(0.02f * static_cast<float>(i));
  must(media::write_mp4(path, video, 12, with_sound ? &audio : nullptr, with_sound ? 48000 : 0));
  return path;
}

// A video reference with its soundtrack: its frames onto the 24 fps clock (8 at 12 fps → 16) and the
// canvas of its aspect ratio (768 x 768), shown to the text encoder as "<Audio 1>: <Video 1>: " and
// a 2 fps block, encoded by the video VAE (16 frames → 2 latent frames, the seed-42 posterior draw)
// and its soundtrack by the audio VAE: the CLI's latents are the library's bits, and a server's for
// the part reference_video_1. Without an audio VAE the video's soundtrack is refused by name. (The
// small video VAE takes about a minute per encode of the 768 x 768 canvas on two cores, so the
// served case shares this test.)
TEST_F(CliRef2va, AVideoReferenceIsTheLibrarysEncode) {
  const std::string clip = write_clip(tmp_.file("clip.mp4"));
  const std::string out = tmp_.file("g");
  const auto run = run_cli(request(out) + " --synthetic-audio-vae small" + references({clip}));
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("encoding reference video 1 (" + clip + ", 16 frames of 768x768)"), std::string::npos)
      << run.err;

  const double seconds = 22.0 / 24.0;
  const media::DecodedVideo decoded = must(media::read_video(clip, seconds));
  ASSERT_EQ(decoded.frames.size(0), 8);
  ASSERT_TRUE(decoded.audio.defined());
  const Tensor frames = must(h3::normalize_reference_video(decoded.frames, decoded.fps, 22));
  ASSERT_EQ(frames.shape(), Shape({16, 768, 768, 3}));
  auto conditioner =
      must(text::TextConditioner::load({encoder_dir(), test::golden_path("qwen_tokenizer_trimmed.json"), 2}));
  const text::Presentation presentation = must(
      conditioner->reference_presentation(kPrompt, {text::PresentedReference::video(16, 24.0, 768, 768, true)}));
  const Tensor states = must(conditioner->encode_presentation(presentation, {frames}));
  std::vector<int32_t> tags;
  for (const bool vision : presentation.vision) tags.push_back(vision ? h3::kVideoTag : h3::kTextTag);
  const vae::VideoVaeConfig vae_config = must(vae::video_vae_config_preset("small"));
  const vae::VideoVaeEncoder encoder =
      must(vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(vae_config, 0), vae_config));
  const Tensor moments = must(vae::encode_video_moments(encoder, must(vae::keyframe_pixels(frames))));
  ASSERT_EQ(moments.size(1), 2);
  const Tensor eps = h3::seeded_normal({vae_config.latent_channels, moments.size(1), moments.size(2), moments.size(3)},
                                       42, h3::kKeyframePosteriorStream);
  const vae::AudioVaeConfig audio_config = must(vae::audio_vae_config_preset("small"));
  const vae::AudioVaeEncoder audio =
      must(vae::assemble_audio_vae_encoder(vae::synthetic_audio_vae_tensors(audio_config, 0), audio_config));
  const Tensor rows = must(vae::encode_reference_soundtrack(audio, decoded.audio, decoded.sample_rate, seconds));
  const std::vector<h3::Reference> refs = {
      {h3::ReferenceKind::kVideo, must(vae::sample_video_condition(vae_config, moments, eps)), rows}};
  const h3::GenerateResult want = expect_the_library_wrote(out, states, tags, refs);
  EXPECT_EQ(want.layout.num_condition_audio, rows.size(0));
  const auto summary = nlohmann::json::parse(test_util::read_bytes(out + ".json"));
  const nlohmann::json& entry = summary["request"]["references"][0];
  EXPECT_EQ(entry["video"], clip);
  EXPECT_EQ(entry["fps"], 12.0);
  EXPECT_EQ(entry["source_frames"], 8);
  EXPECT_EQ(entry["frames"], 16);
  EXPECT_EQ(entry["encoded_frames"], 16);
  EXPECT_EQ(entry["latent_frames"], 2);
  EXPECT_EQ(entry["height"], 768);
  EXPECT_EQ(entry["width"], 768);
  EXPECT_EQ(entry["sample_rate"], 48000);
  EXPECT_EQ(entry["latents"], rows.size(0) / 2);

  // Refusals, one line each, before any encode. A silent video needs no audio VAE: four of them
  // get as far as the count.
  expect_one_line_error(run_cli(request(out) + references({clip})), "clip.mp4: its soundtrack is encoded by the audio VAE");
  const std::string silent = write_clip(tmp_.file("silent.mp4"), false);
  expect_one_line_error(run_cli(request(out) + references(std::vector<std::string>(4, silent))),
                        "4 video references; at most 3");
  // 4 frames at 12 fps are 8 on the clock: too few for two frames sampled at 2 fps.
  const std::string short_clip = write_clip(tmp_.file("short.mp4"), false, 4);
  expect_one_line_error(run_cli(request(out) + references({scene(), short_clip})),
                        "short.mp4: video 1: a reference video is read at 2 fps");
  test_util::write_bytes(tmp_.file("broken.mp4"), "not a video");
  expect_one_line_error(run_cli(request(out) + references({tmp_.file("broken.mp4")})),
                        "broken.mp4: avformat_open_input failed");

#if defined(VORTEX_HAVE_SERVICE)
  // Served as the part reference_video_1, the job's latents are generate's bits; on a server
  // without an audio VAE the clip's soundtrack is refused naming the part, not the server's file.
  using test_util::json_of;
  std::vector<std::string> flags = {"--text-encoder",       encoder_dir(),
                                    "--tokenizer",          test::golden_path("qwen_tokenizer_trimmed.json"),
                                    "--text-encoder-layer", "2",
                                    "--synthetic-video-vae", "small"};
  const nlohmann::json body = {{"prompt", kPrompt}, {"height", 64}, {"width", 64},       {"frames", 22},
                               {"steps", 3},        {"seed", 5},    {"reference_short_edge", kShortEdge}};
  const std::string clip_mp4 = test_util::read_bytes(clip);
  {
    test_util::ServeProcess images_only(flags, "small");
    httplib::Client c = images_only.client();
    EXPECT_EQ(json_of(c.Get("/healthz")).value("video_references", false), true);
    expect_refused(submit_references(c, body, {{"reference_video_1", clip_mp4}}),
                   "reference_video_1: its soundtrack is encoded by the audio VAE (this server encodes no soundtracks");
    expect_refused(submit_references(c, body, {{"reference_image_1", clip_mp4}, {"reference_video_1", clip_mp4}}),
                   "reference_video_1: came beside reference_image_1");
    expect_refused(submit_references(c, {{"prompt", kPrompt}, {"reference_video_1", "a.mp4"}}, {}),
                   "multipart part 'reference_video_1' (MP4");
    EXPECT_EQ(images_only.stop(), 0) << images_only.log();
  }
  flags.insert(flags.end(), {"--synthetic-audio-vae", "small"});
  test_util::ServeProcess server(flags, "small");
  httplib::Client c = server.client();
  const httplib::Result submitted = submit_references(c, body, {{"reference_video_1", clip_mp4}});
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  // The job's CPU encode of the canvas takes a minute alone, several beside other tests on two cores.
  const nlohmann::json done = test_util::wait_for_state(c, json_of(submitted).at("id"), "succeeded", 600);
  ASSERT_EQ(done.value("state", ""), "succeeded") << server.log();
  EXPECT_EQ(done["result"]["checksums"], summary["checksums"]) << server.log();
  EXPECT_EQ(done["result"]["request"]["references"][0].value("latent_frames", 0), 2);
  EXPECT_EQ(test_util::read_bytes(done["request"]["references"][0]), clip_mp4);
  EXPECT_EQ(server.stop(), 0) << server.log();
#endif
}

#else

TEST(CliRef2va, NeedsThePngReader) { GTEST_SKIP() << "this build has no PNG reader (libpng was not found)"; }

#endif

}  // namespace
}  // namespace vortex
