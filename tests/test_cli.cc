// The vortex binary, run as a user runs it: exit codes, one-line errors that name the problem, and
// inspect / convert on real and synthetic checkpoints.
#include <gtest/gtest.h>
#include <sys/wait.h>

#if defined(VORTEX_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/h3/config.h"
#include "models/h3/device_memory_plan.h"
#include "models/h3/weights.h"
#include "cli_test_util.h"
#include "must.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;
using test::golden_path;
using test::must;
using test_util::CliRun;
using test_util::expect_one_line_error;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

// A one-file checkpoint made from a golden's tensors, edited, with the golden's metadata (and so
// its config) unless `keep_metadata` is false.
void write_edited_golden(const std::string& path, const std::string& golden,
                         const std::function<void(h3::NamedTensors&)>& edit, bool keep_metadata = true) {
  auto checkpoint = ShardedCheckpoint::open(golden_path(golden));
  ASSERT_TRUE(checkpoint.ok());
  auto tensors = h3::read_all(*checkpoint);
  ASSERT_TRUE(tensors.ok());
  edit(*tensors);
  const std::map<std::string, std::string> none;
  ASSERT_TRUE(write_safetensors(path, *tensors, keep_metadata ? checkpoint->metadata() : none).ok());
}

TEST(Cli, MissingFile) {
  TempDir tmp;
  expect_one_line_error(run_cli("inspect " + q(tmp.file("nope.safetensors"))), "nope.safetensors: no such file");
}

TEST(Cli, TruncatedFile) {
  TempDir tmp;
  const std::string bytes = test_util::read_bytes(golden_path("h3_tiny/diffusers.safetensors"));
  test_util::write_bytes(tmp.file("cut.safetensors"), bytes.substr(0, bytes.size() / 2));
  expect_one_line_error(run_cli("inspect " + q(tmp.file("cut.safetensors"))), "cut.safetensors");
}

TEST(Cli, HeaderLengthPastTheEndOfTheFile) {
  TempDir tmp;
  std::string bytes = test_util::safetensors_image("{}", 0);
  bytes[0] = static_cast<char>(0x00);
  bytes[1] = static_cast<char>(0x10);  // claims a 4096-byte header in a 10-byte file
  test_util::write_bytes(tmp.file("short.safetensors"), bytes);
  expect_one_line_error(run_cli("inspect " + q(tmp.file("short.safetensors"))), "header length 4096");
}

TEST(Cli, TensorOfTheWrongShapeForTheConfig) {
  TempDir tmp;
  fs::copy_file(golden_path("h3_tiny/diffusers.safetensors"), tmp.file("diffusers.safetensors"));
  nlohmann::json config = nlohmann::json::parse(test_util::read_bytes(golden_path("h3_tiny/config.json")));
  config["hidden_size"] = 32;
  test_util::write_bytes(tmp.file("config.json"), config.dump(2));
  const CliRun run = run_cli("inspect " + q(tmp.path().string()));
  expect_one_line_error(run, "'proj_in.weight': shape [24, 16] but the config expects [32, 16]");
  EXPECT_NE(run.err.find("config from config.json"), std::string::npos) << run.err;
}

TEST(Cli, MissingTensor) {
  TempDir tmp;
  write_edited_golden(tmp.file("ckpt.safetensors"), "h3_tiny/diffusers.safetensors", [](h3::NamedTensors& t) {
    std::erase_if(t, [](const auto& e) { return e.first == "transformer_blocks.1.norm2.weight"; });
  });
  expect_one_line_error(run_cli("inspect " + q(tmp.file("ckpt.safetensors"))),
                        "missing tensor 'transformer_blocks.1.norm2.weight'");
}

TEST(Cli, UnexpectedExtraTensor) {
  TempDir tmp;
  write_edited_golden(tmp.file("ckpt.safetensors"), "h3_small/original.safetensors", [](h3::NamedTensors& t) {
    t.emplace_back("blocks.3.norm1.weight", Tensor::zeros({48}, DType::kF32));  // the config has 3 blocks
  });
  const CliRun run = run_cli("inspect " + q(tmp.file("ckpt.safetensors")) + " --json");
  expect_one_line_error(run, "unexpected tensor 'transformer_blocks.3.norm1.weight'");
  EXPECT_NE(run.err.find("original layout"), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
}

TEST(Cli, DevicesAreForTheGpu) {
  TempDir tmp;
  expect_one_line_error(run_cli("generate --synthetic test --devices 0,1 --out " + q(tmp.file("x"))),
                        "--devices is for --device cuda");
  EXPECT_FALSE(fs::exists(tmp.file("x.safetensors")));
}

TEST(Cli, Fp8RecipeNeedsTheGpu) {
  TempDir tmp;
  expect_one_line_error(run_cli("generate --synthetic test --recipe fp8 --out " + q(tmp.file("x"))),
                        "--recipe fp8 runs on --device cuda only");
  EXPECT_FALSE(fs::exists(tmp.file("x.safetensors")));
}

TEST(Cli, Tf32VaeEncodeNeedsTheGpu) {
  TempDir tmp;
  expect_one_line_error(run_cli("generate --synthetic test --vae-encode-precision tf32 --out " + q(tmp.file("x"))),
                        "--vae-encode-precision tf32 runs on --device cuda only");
  expect_one_line_error(run_cli("serve --synthetic test --vae-encode-precision tf32 --results " + q(tmp.file("r"))),
                        "--vae-encode-precision tf32 runs on --device cuda only");
  EXPECT_FALSE(fs::exists(tmp.file("x.safetensors")));
}

TEST(Cli, ConvertRefusesANonEmptyFolder) {
  TempDir tmp;
  const std::string out = tmp.file("out");
  fs::create_directory(out);
  test_util::write_bytes(out + "/keep.txt", "x");
  const CliRun run = run_cli("convert --synthetic --preset test --out " + q(out));
  expect_one_line_error(run, "not empty; pass --force");
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);
}

TEST(Cli, ConvertRejectsMixedModes) {
  TempDir tmp;
  expect_one_line_error(run_cli("convert --in " + q(golden_path("h3_tiny/original.safetensors")) +
                                " --synthetic --preset test --out " + q(tmp.file("o"))),
                        "exactly one of --in PATH and --synthetic");
  expect_one_line_error(run_cli("convert --in " + q(golden_path("h3_tiny/original.safetensors")) + " --out " +
                                q(tmp.file("o"))),
                        "--in needs --to");
  EXPECT_FALSE(fs::exists(tmp.file("o")));
}

nlohmann::json inspect_json(const std::string& path) {
  const CliRun run = run_cli("inspect --json " + q(path));
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_TRUE(run.err.empty()) << run.err;
  return nlohmann::json::parse(run.out, nullptr, /*allow_exceptions=*/false);
}

TEST(Cli, InspectsBothGoldenLayouts) {
  for (const std::string golden : {"h3_tiny", "h3_small"}) {
    const int64_t parameters = h3::config_from_file(golden_path(golden + "/config.json"))->parameter_count();
    for (const std::string layout : {"diffusers", "original"}) {
      const nlohmann::json j = inspect_json(golden_path(golden + "/" + layout + ".safetensors"));
      ASSERT_TRUE(j.is_object()) << golden << " " << layout;
      EXPECT_EQ(j["layout"], layout);
      EXPECT_EQ(j["parameters"].get<int64_t>(), parameters) << golden << " " << layout;
      EXPECT_EQ(j["config_source"], "config.json");
      EXPECT_EQ(j["shards"], 1);
      EXPECT_EQ(j["schema"], "ok");
      EXPECT_EQ(j["dtypes"].size(), 1u);
    }
  }
  const CliRun text = run_cli("inspect " + q(golden_path("h3_tiny/original.safetensors")));
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("layout      original\n"), std::string::npos) << text.out;
}

// The device memory generate --device cuda would take for the canonical request, from the same
// plan the CUDA model sizes its arenas with; fp8 is marked unavailable where its widths do not fit.
TEST(Cli, InspectStatesTheCudaMemoryOfTheCanonicalRequest) {
  const h3::H3Config c = *h3::config_from_file(golden_path("h3_small/config.json"));
  const nlohmann::json j = inspect_json(golden_path("h3_small/diffusers.safetensors"));
  ASSERT_TRUE(j.is_object());
  const nlohmann::json& m = j["cuda_memory"];
  EXPECT_EQ(m["request"]["rows"].get<int64_t>(), 37810);
  EXPECT_EQ(m["bf16"]["weights_bytes"].get<uint64_t>(), h3::device_weight_bytes(c, h3::LinearRecipe::kBf16, false));
  EXPECT_EQ(m["bf16"]["activations_bytes"].get<uint64_t>(),
            h3::plan_activations(c, 37810, h3::LinearRecipe::kBf16, false, true).total);
  // This config's inner dim is 3 x 24 = 72, not a multiple of 16.
  EXPECT_NE(m["fp8"]["unavailable"].get<std::string>().find("inner dim"), std::string::npos) << m.dump();
  const CliRun text = run_cli("inspect " + q(golden_path("h3_small/diffusers.safetensors")));
  EXPECT_NE(text.out.find("cuda memory 768x1344, 124 frames, 100 text tokens (37,810 rows"), std::string::npos)
      << text.out;
}

// Without config.json or metadata the config comes from the shapes, and rope_freq_dim (3 here,
// not the 4 its head size would suggest) from rope.inv_freq.
// A Qwen3-VL text encoder folder (what --text-encoder takes) is described as one: its widths, the
// layers H3 would read, their bytes, the tokenizer; a folder missing a layer's tensor is one line.
TEST(Cli, InspectsATextEncoderFolder) {
  const nlohmann::json j = inspect_json(golden_path("qwen3_text_small"));
  EXPECT_EQ(j["config"]["hidden_size"], 128);
  EXPECT_EQ(j["config"]["num_key_value_heads"], 2);
  EXPECT_EQ(j["layers_read"], 6);  // fewer than H3's 50: all of them
  EXPECT_NE(j["reads"].get<std::string>().find("--text-encoder-layer 6"), std::string::npos) << j["reads"];
  const SafetensorsFile model = must(SafetensorsFile::open(golden_path("qwen3_text_small/model.safetensors")));
  uint64_t layer_bytes = 0;
  for (const std::string& name : model.names()) {
    if (name.find(".layers.") != std::string::npos) layer_bytes += must(model.info(name)).nbytes();
  }
  EXPECT_EQ(j["layers_bytes"].get<uint64_t>(), layer_bytes);
  EXPECT_GE(j["cuda_weights_bytes"].get<uint64_t>(), layer_bytes);  // bf16 already; only the alignment adds
  EXPECT_TRUE(j["tokenizer"].is_null());

  TempDir tmp;
  std::vector<std::pair<std::string, Tensor>> kept;
  for (const std::string& name : model.names()) {
    if (name != "model.language_model.layers.3.self_attn.k_norm.weight") kept.emplace_back(name, must(model.get(name)));
  }
  must(write_safetensors(tmp.file("model.safetensors"), kept));
  fs::copy_file(golden_path("qwen3_text_small/config.json"), tmp.file("config.json"));
  expect_one_line_error(run_cli("inspect " + q(tmp.path().string())), "layers.3.self_attn.k_norm.weight");
}

TEST(Cli, InspectInfersTheConfigFromShapes) {
  TempDir tmp;
  write_edited_golden(tmp.file("bare.safetensors"), "h3_small/original.safetensors", [](h3::NamedTensors&) {}, false);
  const nlohmann::json j = inspect_json(tmp.file("bare.safetensors"));
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["config_source"], "inferred from tensor shapes");
  EXPECT_EQ(*h3::config_from_json(j["config"]), *h3::config_from_file(golden_path("h3_small/config.json")));
}

TEST(Cli, ConvertSyntheticInBothLayoutsThenInspect) {
  TempDir tmp;
  const int64_t parameters = h3::config_preset("test")->parameter_count();
  for (const std::string layout : {"diffusers", "original"}) {
    const std::string out = tmp.file(layout);
    const CliRun run = run_cli("convert --synthetic --preset test --layout " + layout + " --seed 11 --max-shard-mb 1 --out " +
                               q(out));
    ASSERT_EQ(run.code, 0) << run.err;
    EXPECT_NE(run.out.find(layout + " layout"), std::string::npos) << run.out;
    const nlohmann::json j = inspect_json(out);
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["layout"], layout);
    EXPECT_EQ(j["parameters"].get<int64_t>(), parameters);
    EXPECT_EQ(j["config_source"], "config.json");
    EXPECT_TRUE(j["dtypes"].contains("BF16") && j["dtypes"].contains("F32")) << j["dtypes"].dump();
  }
  // The golden goes through the CLI converter and comes back as its other golden.
  const CliRun run = run_cli("convert --in " + q(golden_path("h3_small/original.safetensors")) + " --to diffusers --out " +
                             q(tmp.file("converted")));
  ASSERT_EQ(run.code, 0) << run.err;
  const nlohmann::json j = inspect_json(tmp.file("converted"));
  EXPECT_EQ(j["layout"], "diffusers");
  EXPECT_EQ(j["parameters"].get<int64_t>(), h3::config_from_file(golden_path("h3_small/config.json"))->parameter_count());
}

}  // namespace
}  // namespace vortex

namespace vortex {
namespace {

TEST(CliDecode, SoundtrackToWavAndClearRefusals) {
  TempDir tmp;
  const std::string latents = tmp.file("clip");
  ASSERT_EQ(run_cli("generate --synthetic small --height 128 --width 192 --frames 22 --steps 2 --text-tokens 4 --out " +
                    q(latents))
                .code,
            0);
  const CliRun wav = run_cli("decode --latents " + q(latents + ".safetensors") +
                             " --synthetic-audio-vae small --out " + q(tmp.file("clip.wav")));
  EXPECT_EQ(wav.code, 0) << wav.err;
  EXPECT_TRUE(fs::exists(tmp.file("clip.wav")));
  EXPECT_NE(wav.out.find("32000 Hz"), std::string::npos) << wav.out;

  // An MP4 needs the picture too.
  expect_one_line_error(run_cli("decode --latents " + q(latents + ".safetensors") +
                                " --synthetic-audio-vae small --out " + q(tmp.file("clip.mp4"))),
                        "--video-vae");
  EXPECT_FALSE(fs::exists(tmp.file("clip.mp4")));
#if defined(VORTEX_HAVE_MEDIA)
  // The small audio VAE hops 20 samples per latent, not 800: its soundtrack is too short for the
  // clip, which is refused before either decoder runs.
  expect_one_line_error(run_cli("decode --latents " + q(latents + ".safetensors") +
                                " --synthetic-audio-vae small --synthetic-video-vae test --out " +
                                q(tmp.file("short.mp4"))),
                        "do not match the video's 22 frames");
  // A decode to MP4 that succeeds: CliGenerate.MediaIsTheDecodeOfTheWrittenLatents (the full-size
  // audio VAE is the slow part of this suite, so it runs there once).
#endif

  // The `test` transformer's audio latents have 6 channels; the `small` audio VAE reads 32.
  const std::string narrow = tmp.file("narrow");
  ASSERT_EQ(run_cli("generate --synthetic test --height 64 --width 64 --frames 22 --steps 2 --text-tokens 4 --out " +
                    q(narrow))
                .code,
            0);
  expect_one_line_error(run_cli("decode --latents " + q(narrow + ".safetensors") +
                                " --synthetic-audio-vae small --out " + q(tmp.file("narrow.wav"))),
                        "audio_latents");
  EXPECT_FALSE(fs::exists(tmp.file("narrow.wav")));
}

}  // namespace
}  // namespace vortex

namespace vortex {
namespace {

// The files of `dir`, sorted: what a refused command must leave as it was.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

Tensor normal(std::initializer_list<int64_t> dims, uint64_t seed) {
  const Shape shape(dims);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = static_cast<float>(static_cast<double>(x >> 40) / 8388608.0 - 1.0);
  }
  return Tensor::from_f32(v, shape);
}

// A latents file as `vortex generate` writes it; an undefined tensor is left out.
void write_latents(const std::string& path, const Tensor& video, const Tensor& audio) {
  h3::NamedTensors tensors;
  if (video.defined()) tensors.emplace_back("video_latents", video);
  if (audio.defined()) tensors.emplace_back("audio_latents", audio);
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
}

// Every refusal: exit 2, one stderr line naming the tensor / field / flag, and nothing written
// (neither the output nor a temp file) in the output folder.
TEST(CliDecode, BadLatentsAndRequestsLeaveNoFile) {
  TempDir tmp;
  const fs::path out_dir = tmp.path() / "out";
  fs::create_directory(out_dir);
  const std::string wav = q((out_dir / "clip.wav").string()), mp4 = q((out_dir / "clip.mp4").string());
  const std::string small_audio = " --synthetic-audio-vae small";
  const Tensor video = normal({24, 7, 2, 2}, 1), audio = normal({2, 37, 32}, 2);
  struct Case {
    Tensor video, audio;
    std::string flags, needle;
  };
  Tensor nan_video = video.clone();
  nan_video.data_as<float>()[((3 * 7 + 4) * 2 + 1) * 2 + 0] = std::nanf("");
  Tensor inf_audio = audio.clone();
  inf_audio.data_as<float>()[(37 + 5) * 32 + 3] = std::numeric_limits<float>::infinity();
  std::vector<Case> cases = {
      {video, normal({2, 37, 31}, 3), small_audio + " --out " + wav,
       "'audio_latents': shape [2, 37, 31]: channel dim (dim 2) must be latent_channels = 32"},
      {video, normal({37, 2, 32}, 3), small_audio + " --out " + wav, "frame-major"},
      {video, normal({74, 32}, 3), small_audio + " --out " + wav, "packed [2·A, 32] rows"},
      {video, inf_audio, small_audio + " --out " + wav,
       "'audio_latents': non-finite value inf at [1, 5, 3] (right channel, latent frame 5 of 37)"},
      {video, Tensor(), small_audio + " --out " + wav, "no tensor 'audio_latents'"},
      {video, audio, small_audio + " --synthetic-video-vae test --out " + wav, "a WAV holds no picture"},
      {video, audio, small_audio + " --out " + q((tmp.path() / "none" / "clip.wav").string()), "does not exist"},
      {video, audio, small_audio + " --out " + q((out_dir / "clip.ogg").string()), "must end in .wav or .mp4"},
      {video, audio, small_audio + " --audio-vae " + q(tmp.file("vae")) + " --out " + wav, "exclude each other"},
      {video, audio, " --audio-vae " + q(tmp.file("no_vae")) + " --out " + wav, "no_vae"},
      {video, audio, " --synthetic-audio-vae tiny --out " + wav, "unknown audio VAE preset 'tiny'"},
  };
#if defined(VORTEX_HAVE_MEDIA)
  const std::string both = small_audio + " --synthetic-video-vae test --out " + mp4;
  const std::vector<Case> picture = {
      {normal({24, 6, 2, 2}, 4), audio, both, "'video_latents': shape [24, 6, 2, 2] has frames 6 (dim 1), not 5n + 2"},
      {normal({23, 7, 2, 2}, 4), audio, both, "has 23 channels (dim 0) but the video VAE has 24"},
      {normal({24, 7, 2}, 4), audio, both, "must be [C, T, H, W]"},
      {Tensor::zeros({24, 7, 0, 2}, DType::kF32), audio, both, "empty height or width"},
      {nan_video, audio, both, "'video_latents': non-finite value nan at [3, 4, 1, 0] (latent frame 4 of 7)"},
      {Tensor(), audio, both, "no tensor 'video_latents'"},
      {video, audio, both, "do not match the video's 22 frames"},
      {video, audio, small_audio + " --out " + mp4, "--video-vae"},
  };
  cases.insert(cases.end(), picture.begin(), picture.end());
#endif
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string latents = tmp.file("latents" + std::to_string(i) + ".safetensors");
    write_latents(latents, c.video, c.audio);
    SCOPED_TRACE(c.needle);
    const CliRun run = run_cli("decode --latents " + q(latents) + c.flags);
    expect_one_line_error(run, c.needle);
    if (c.needle.find("latents'") != std::string::npos) EXPECT_NE(run.err.find(latents), std::string::npos) << run.err;
    EXPECT_TRUE(listing(out_dir).empty()) << listing(out_dir)[0];
  }
}

// The original checkpoint's video VAE config is read by the CLI too; what it cannot map is refused
// naming the file and the field, before any decoding.
TEST(CliDecode, OriginalVideoVaeConfigRefusalNamesTheFileAndField) {
#if defined(VORTEX_HAVE_MEDIA)
  TempDir tmp;
  const fs::path vae_dir = tmp.path() / "video_vae";
  fs::create_directories(vae_dir / "source");
  test_util::write_bytes((vae_dir / "config.json").string(),
                         R"({"source_path": "source", "source_safetensors_path": "model.safetensors",
                             "vae_chunking": 2})");
  test_util::write_bytes((vae_dir / "source" / "config.json").string(), "{}");
  write_latents(tmp.file("l.safetensors"), normal({24, 7, 2, 2}, 1), normal({2, 37, 32}, 2));
  const CliRun run = run_cli("decode --latents " + q(tmp.file("l.safetensors")) +
                             " --synthetic-audio-vae small --video-vae " + q(vae_dir.string()) + " --out " +
                             q(tmp.file("o.mp4")));
  expect_one_line_error(run, (vae_dir / "config.json").string() + ": video VAE config field 'vae_chunking'");
  EXPECT_FALSE(fs::exists(tmp.file("o.mp4")));
#else
  GTEST_SKIP() << "no MP4 writer in this build";
#endif
}

// generate --media: the latents files, then the very bytes `vortex decode` writes from them.
TEST(CliGenerate, MediaIsTheDecodeOfTheWrittenLatents) {
  TempDir tmp;
  const std::string request = "generate --synthetic small --height 128 --width 192 --frames 22 --steps 2 "
                              "--text-tokens 4 --weights-seed 3 --out " + q(tmp.file("g"));
  const CliRun wav = run_cli(request + " --media " + q(tmp.file("g.wav")) + " --synthetic-audio-vae small");
  ASSERT_EQ(wav.code, 0) << wav.err;
  EXPECT_TRUE(fs::exists(tmp.file("g.safetensors")) && fs::exists(tmp.file("g.json")));
  EXPECT_NE(wav.err.find("decode: sound: audio VAE on latents [2, 37, 32]"), std::string::npos) << wav.err;
  EXPECT_NE(wav.out.find("wrote " + tmp.file("g.wav")), std::string::npos) << wav.out;
  const CliRun decoded = run_cli("decode --latents " + q(tmp.file("g.safetensors")) +
                                 " --synthetic-audio-vae small --weights-seed 3 --out " + q(tmp.file("d.wav")));
  ASSERT_EQ(decoded.code, 0) << decoded.err;
  EXPECT_EQ(test_util::read_bytes(tmp.file("g.wav")), test_util::read_bytes(tmp.file("d.wav")));
#if defined(VORTEX_HAVE_MEDIA)
  const CliRun mp4 = run_cli(request + " --media " + q(tmp.file("g.mp4")) +
                             " --synthetic-audio-vae h3 --synthetic-video-vae test");
  ASSERT_EQ(mp4.code, 0) << mp4.err;
  for (const char* stage : {"decode: picture: video VAE on latents [24, 7, 8, 12] -> 22 frames of 48x32",
                            "decode: sound: ", "decode: writing "}) {
    EXPECT_NE(mp4.err.find(stage), std::string::npos) << stage << " in: " << mp4.err;
  }
  const CliRun d = run_cli("decode --latents " + q(tmp.file("g.safetensors")) +
                           " --synthetic-audio-vae h3 --synthetic-video-vae test --weights-seed 3 --out " +
                           q(tmp.file("d.mp4")));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.out.find("22 frames of 48x32 at 24 fps with a 32000 Hz stereo soundtrack"), std::string::npos) << d.out;
  EXPECT_EQ(test_util::read_bytes(tmp.file("g.mp4")), test_util::read_bytes(tmp.file("d.mp4")));
#endif
}

// What generate --media would refuse after denoising is refused before it: no latents are written.
TEST(CliGenerate, MediaRefusalsComeBeforeDenoising) {
  TempDir tmp;
  const std::string small = "generate --synthetic small --height 128 --width 192 --frames 22 --steps 2 "
                            "--text-tokens 4 --out " + q(tmp.file("r"));
  const std::string narrow = "generate --synthetic test --height 64 --width 64 --frames 22 --steps 2 "
                             "--text-tokens 4 --out " + q(tmp.file("r"));
  std::vector<std::pair<std::string, std::string>> cases = {
      {small + " --synthetic-audio-vae small", "--media PATH.wav|PATH.mp4, which is not given"},
      {small + " --media " + q(tmp.file("r.ogg")) + " --synthetic-audio-vae small", "must end in .wav or .mp4"},
      {small + " --media " + q(tmp.file("r.wav")), "--audio-vae"},
      {narrow + " --media " + q(tmp.file("r.wav")) + " --synthetic-audio-vae small",
       "--media " + tmp.file("r.wav") + ": audio latents: shape [2, 37, 6]: channel dim (dim 2)"},
  };
#if defined(VORTEX_HAVE_MEDIA)
  cases.push_back({small + " --media " + q(tmp.file("r.mp4")) + " --synthetic-audio-vae small --synthetic-video-vae test",
                   "do not match the video's 22 frames"});
  cases.push_back({small + " --media " + q(tmp.file("r.mp4")) + " --synthetic-audio-vae h3 --synthetic-video-vae nope",
                   "unknown video VAE preset 'nope'"});
#endif
  for (const auto& [command, needle] : cases) {
    SCOPED_TRACE(needle);
    expect_one_line_error(run_cli(command), needle);
    EXPECT_TRUE(listing(tmp.path()).empty()) << listing(tmp.path())[0];
  }
}

// --device cuda where no GPU this build runs on is usable (CI, the CPU machines): one line, exit 1
// (a valid request this machine cannot serve), nothing written.
TEST(CliGenerate, CudaWithoutAUsableDeviceIsOneLine) {
#if defined(VORTEX_HAVE_CUDA)
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) GTEST_SKIP() << "a CUDA device is present";
  const std::string needle = "--device cuda: no usable CUDA device";
#else
  const std::string needle = "--device cuda: this build has no CUDA backend";
#endif
  TempDir tmp;
  const CliRun run = run_cli("generate --synthetic test --device cuda --height 64 --width 64 --frames 22 --steps 2 "
                             "--text-tokens 4 --out " + q(tmp.file("r")));
  EXPECT_EQ(run.code, 1) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(needle), std::string::npos) << run.err;
  EXPECT_TRUE(listing(tmp.path()).empty()) << listing(tmp.path())[0];
}

// The CPU program's results do not depend on the machine's core count, whichever CPU GEMM the
// build runs: the latents (their checksums) and a decoded WAV, on 1 and 3 threads. With OpenBLAS,
// tiles that followed the thread count once changed the few-row linears' and conv1d's bits.
TEST(CliReproducibility, TheThreadCountDoesNotChangeTheBits) {
  TempDir tmp;
  const std::string request = "generate --synthetic small --height 128 --width 192 --frames 22 --steps 3 "
                              "--text-tokens 8 --seed 3 --out ";
  std::string checksums[2];
  for (int i = 0; i < 2; ++i) {
    const std::string threads = i == 0 ? "1" : "3";
    const std::string prefix = tmp.file("r" + threads);
    const CliRun run = run_cli(request + q(prefix), "VORTEX_NUM_THREADS=" + threads);
    ASSERT_EQ(run.code, 0) << run.err;
    checksums[i] = test_util::latent_checksum_lines(run);
    const CliRun decode = run_cli("decode --latents " + q(prefix + ".safetensors") +
                                  " --synthetic-audio-vae small --out " + q(prefix + ".wav"),
                                  "VORTEX_NUM_THREADS=" + threads);
    ASSERT_EQ(decode.code, 0) << decode.err;
  }
  EXPECT_EQ(checksums[0], checksums[1]);
  EXPECT_TRUE(test_util::read_bytes(tmp.file("r1.wav")) == test_util::read_bytes(tmp.file("r3.wav")))
      << "the WAVs decoded on 1 and 3 threads differ";
#if defined(VORTEX_HAVE_MEDIA)
  // The picture too (the video VAE's CPU path and the encoder), with the real-size audio decoder.
  for (const std::string threads : {"1", "3"}) {
    const CliRun mp4 = run_cli("decode --latents " + q(tmp.file("r1.safetensors")) +
                                   " --synthetic-audio-vae h3 --synthetic-video-vae test --out " +
                                   q(tmp.file("m" + threads + ".mp4")),
                               "VORTEX_NUM_THREADS=" + threads);
    ASSERT_EQ(mp4.code, 0) << mp4.err;
  }
  EXPECT_TRUE(test_util::read_bytes(tmp.file("m1.mp4")) == test_util::read_bytes(tmp.file("m3.mp4")))
      << "the MP4s decoded on 1 and 3 threads differ";
#endif
}

// Where vortex bench would write its manifests is checked before any GPU work, so a typo cannot
// cost a whole run; the checks need no GPU.
TEST(CliBench, OutputRefusalsComeFirst) {
  TempDir tmp;
  test_util::write_bytes(tmp.file("file"), "x");
  expect_one_line_error(run_cli("bench attention --json " + q((tmp.path() / "none" / "m.json").string())),
                        "--json " + (tmp.path() / "none" / "m.json").string() + ": the folder " +
                            (tmp.path() / "none").string() + " does not exist");
  expect_one_line_error(run_cli("bench attention --json-dir " + q(tmp.file("file"))), "exists and is not a folder");
  EXPECT_EQ(listing(tmp.path()).size(), 1u);
}

// What would make the run fail only once the latents are written, or after the weights load, is
// refused first, in one line naming the flag.
TEST(CliGenerate, RequestRefusalsComeBeforeLoading) {
  TempDir tmp;
  const std::string request = "generate --synthetic test --height 64 --width 64 --frames 22 --text-tokens 4 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {request + "--steps 2 --out " + q((tmp.path() / "none" / "r").string()),
       "--out " + (tmp.path() / "none" / "r").string() + ": the folder " + (tmp.path() / "none").string() +
           " does not exist"},
      {request + "--steps 2 --out " + q(tmp.path().string() + "/"), "must name a file prefix"},
      {request + "--steps 1 --out " + q(tmp.file("r")), "steps must be >= 2"},
      {"generate --synthetic test --height 48 --width 64 --frames 22 --steps 2 --out " + q(tmp.file("r")),
       "height 48 must be a positive multiple of 32"},
      {request + "--steps 2 --attention int8fp8 --exact-blocks 7 --out " + q(tmp.file("r")), "--exact-blocks"},
  };
  for (const auto& [command, needle] : cases) {
    SCOPED_TRACE(needle);
    const CliRun run = run_cli(command);
    expect_one_line_error(run, needle);
    EXPECT_TRUE(listing(tmp.path()).empty()) << listing(tmp.path())[0];
  }
}

}  // namespace
}  // namespace vortex
