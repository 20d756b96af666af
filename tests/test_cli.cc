// The vortex binary, run as a user runs it: exit codes, one-line errors that name the problem, and
// inspect / convert on real and synthetic checkpoints.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/h3/config.h"
#include "models/h3/weights.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;
using test::golden_path;
using test_util::TempDir;

struct CliRun {
  int code = -1;
  std::string out, err;
};

// Runs `vortex <args>` (args already shell-quoted) with stdout and stderr captured in files.
CliRun run_cli(const std::string& args) {
  static TempDir capture;
  const std::string out = capture.file("stdout"), err = capture.file("stderr");
  const std::string command = std::string(VORTEX_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(command.c_str());
  CliRun run;
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = test_util::read_bytes(out);
  run.err = test_util::read_bytes(err);
  return run;
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// Exit code 2 and exactly one stderr line that contains `needle`.
void expect_one_line_error(const CliRun& run, const std::string& needle) {
  EXPECT_EQ(run.code, 2) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_TRUE(run.err.starts_with("vortex: ")) << run.err;
  EXPECT_NE(run.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << run.err;
}

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

// Without config.json or metadata the config comes from the shapes, and rope_freq_dim (3 here,
// not the 4 its head size would suggest) from rope.inv_freq.
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
  // clip, which the MP4 writer refuses; the released shape (synthetic weights) fits.
  expect_one_line_error(run_cli("decode --latents " + q(latents + ".safetensors") +
                                " --synthetic-audio-vae small --synthetic-video-vae test --out " +
                                q(tmp.file("short.mp4"))),
                        "do not match the video's 22 frames");
  const CliRun mp4 = run_cli("decode --latents " + q(latents + ".safetensors") +
                             " --synthetic-audio-vae h3 --synthetic-video-vae test --out " + q(tmp.file("clip.mp4")));
  EXPECT_EQ(mp4.code, 0) << mp4.err;
  EXPECT_TRUE(fs::exists(tmp.file("clip.mp4")));
  EXPECT_NE(mp4.out.find("22 frames"), std::string::npos) << mp4.out;
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
