// NVFP4 and GGUF checkpoints on the GPU, as a user runs them: `generate --device cuda` from an NVFP4
// file (ComfyUI's and ModelOpt's forms; nvfp4_test_util.h), which dequantizes each weight as it
// uploads, or from a GGUF file (gguf_test_util.h: original layout, Q8_0 block linears held as
// their blocks, split still quantized, dequantized on the device as each uploads), gives under each
// recipe the latents it gives from the same weights dequantized by the test.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "cli_test_util.h"
#include "gguf_test_util.h"
#include "gpu_test_util.h"
#include "nvfp4_test_util.h"

namespace vortex {
namespace {

using test_util::CliRun;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

// "RECIPE quantized" and "RECIPE reference": the latents of a short cuda generate from each file
// under each recipe.
std::map<std::string, std::string> latents_by_recipe(const std::string& quantized, const std::string& reference,
                                                     const std::string& out) {
  std::map<std::string, std::string> latents;
  for (const std::string recipe : {"bf16", "fp8"}) {
    for (const auto& [which, path] : {std::pair{"quantized", quantized}, std::pair{"reference", reference}}) {
      const CliRun run = run_cli("generate --device cuda --recipe " + recipe + " --model " + q(path) +
                                 " --height 64 --width 64 --frames 22 --steps 3 --seed 5 --text-tokens 4 --out " + q(out));
      EXPECT_EQ(run.code, 0) << recipe << " " << path << ": " << run.err;
      latents[recipe + " " + which] = test_util::latent_checksum_lines(run);
    }
  }
  return latents;
}

TEST(GpuNvfp4Checkpoint, EachRecipeRunsTheDequantizedWeights) {
  VORTEX_REQUIRE_GPU();
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("mid");
  auto written = test_util::write_nvfp4_checkpoints(config, 6, tmp.file("nvfp4.safetensors"),
                                                    tmp.file("reference.safetensors"));
  ASSERT_TRUE(written.ok()) << written.status().message();
  ASSERT_GT(written->quantized, 0);
  auto latents = latents_by_recipe(tmp.file("nvfp4.safetensors"), tmp.file("reference.safetensors"), tmp.file("g"));
  EXPECT_EQ(latents["bf16 quantized"], latents["bf16 reference"]);
  EXPECT_EQ(latents["fp8 quantized"], latents["fp8 reference"]);
}

TEST(GpuGgufCheckpoint, EachRecipeRunsTheDequantizedWeights) {
  VORTEX_REQUIRE_GPU();
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("mid");
  std::filesystem::create_directories(tmp.file("gguf"));
  auto written = test_util::write_gguf_checkpoints(config, 7, tmp.file("source"), tmp.file("gguf/h3-mid.gguf"),
                                                   tmp.file("gguf/reference.safetensors"));
  ASSERT_TRUE(written.ok()) << written.status().message();
  ASSERT_GE(written->quantized, 4 * config.num_layers);
  auto latents = latents_by_recipe(tmp.file("gguf/h3-mid.gguf"), tmp.file("gguf/reference.safetensors"), tmp.file("g"));
  EXPECT_EQ(latents["bf16 quantized"], latents["bf16 reference"]);
  EXPECT_EQ(latents["fp8 quantized"], latents["fp8 reference"]);
}

}  // namespace
}  // namespace vortex
