// fp8 checkpoints on the GPU, as a user runs them: `generate --device cuda` from a checkpoint that
// `convert --quantize fp8` wrote runs the fp8 recipe on the weights it runs from the bf16 source
// (the dequantized weights quantize back to the same codes and scales), and the bf16 recipe on the
// weights of the same checkpoint converted back to bf16; the same from the original layout written fp8.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "cli_test_util.h"
#include "gpu_test_util.h"

namespace vortex {
namespace {

using test_util::CliRun;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

TEST(GpuFp8Checkpoint, EachRecipeRunsTheWeightsItRunsFromTheSource) {
  VORTEX_REQUIRE_GPU();
  TempDir tmp;
  const auto convert = [&](const std::string& args) {
    const CliRun run = run_cli("convert " + args);
    EXPECT_EQ(run.code, 0) << args << ": " << run.err;
  };
  convert("--synthetic --preset mid --seed 6 --out " + q(tmp.file("source")));
  convert("--in " + q(tmp.file("source")) + " --to diffusers --quantize fp8 --out " + q(tmp.file("fp8")));
  convert("--in " + q(tmp.file("fp8")) + " --to original --out " + q(tmp.file("dequantized")));
  // The original layout fp8: its fused QKV and FC1 split still fp8 and dequantize on the device.
  convert("--in " + q(tmp.file("source")) + " --to original --quantize fp8 --out " + q(tmp.file("fp8-original")));
  std::map<std::string, std::string> latents;
  for (const std::string recipe : {"bf16", "fp8"}) {
    for (const std::string model : {"source", "fp8", "fp8-original", "dequantized"}) {
      const CliRun run = run_cli("generate --device cuda --recipe " + recipe + " --model " + q(tmp.file(model)) +
                                 " --height 64 --width 64 --frames 22 --steps 3 --seed 5 --text-tokens 4 --out " +
                                 q(tmp.file("g")));
      ASSERT_EQ(run.code, 0) << recipe << " " << model << ": " << run.err;
      latents[recipe + " " + model] = test_util::latent_checksum_lines(run);
    }
  }
  EXPECT_EQ(latents["fp8 fp8"], latents["fp8 source"]) << "the fp8 recipe's own weights, back from the checkpoint";
  EXPECT_EQ(latents["fp8 dequantized"], latents["fp8 source"]);
  EXPECT_EQ(latents["fp8 fp8-original"], latents["fp8 source"]);
  EXPECT_EQ(latents["bf16 fp8-original"], latents["bf16 fp8"]);
  EXPECT_EQ(latents["bf16 fp8"], latents["bf16 dequantized"]);
  // The bf16 recipe on the dequantized weights is not the source's: the checkpoint is approximate.
  EXPECT_NE(latents["bf16 fp8"], latents["bf16 source"]);
}

}  // namespace
}  // namespace vortex
