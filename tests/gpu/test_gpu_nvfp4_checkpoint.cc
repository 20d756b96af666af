// NVFP4 checkpoints on the GPU, as a user runs them: `generate --device cuda` from an NVFP4 file
// (ComfyUI's and ModelOpt's forms; nvfp4_test_util.h) dequantizes each weight as it uploads, so each
// recipe gives the latents it gives from the same weights dequantized by the test into bf16.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "cli_test_util.h"
#include "gpu_test_util.h"
#include "nvfp4_test_util.h"

namespace vortex {
namespace {

using test_util::CliRun;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

TEST(GpuNvfp4Checkpoint, EachRecipeRunsTheDequantizedWeights) {
  VORTEX_REQUIRE_GPU();
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("mid");
  auto written = test_util::write_nvfp4_checkpoints(config, 6, tmp.file("nvfp4.safetensors"),
                                                    tmp.file("reference.safetensors"));
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  std::map<std::string, std::string> latents;
  for (const std::string recipe : {"bf16", "fp8"}) {
    for (const std::string model : {"nvfp4", "reference"}) {
      const CliRun run = run_cli("generate --device cuda --recipe " + recipe + " --model " +
                                 q(tmp.file(model + ".safetensors")) +
                                 " --height 64 --width 64 --frames 22 --steps 3 --seed 5 --text-tokens 4 --out " +
                                 q(tmp.file("g")));
      ASSERT_EQ(run.code, 0) << recipe << " " << model << ": " << run.err;
      latents[recipe + " " + model] = test_util::latent_checksum_lines(run);
    }
  }
  EXPECT_EQ(latents["bf16 nvfp4"], latents["bf16 reference"]);
  EXPECT_EQ(latents["fp8 nvfp4"], latents["fp8 reference"]);
}

}  // namespace
}  // namespace vortex
