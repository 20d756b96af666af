// GGUF checkpoints through the CLI (models/h3/model_source.h), as ComfyUI-GGUF writes a diffusion
// model: the original layout's names under `model.diffusion_model.`, no config (inferred from the
// shapes), linears in a block type (Q8_0 here; every type's values are checked against ggml itself
// in test_gguf.cc), the rest F32 / F16 / BF16. inspect describes it, generate from it gives the bits
// of generate from the same weights dequantized by this test into a safetensors file, and convert
// writes a safetensors checkpoint that gives them too.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "gguf_test_util.h"

namespace vortex {
namespace {

using test_util::CliRun;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

TEST(CliGguf, GenerateAndConvertRunTheDequantizedWeights) {
  TempDir tmp;
  // The small preset with widths of whole Q8_0 blocks (32), so that every block linear is quantized.
  h3::H3Config config = *h3::config_preset("small");
  config.hidden_size = 64;
  config.num_attention_heads = 2;
  config.attention_head_dim = 32;
  config.text_dim = 32;
  ASSERT_TRUE(config.validate().ok());
  std::filesystem::create_directories(tmp.file("gguf"));
  auto written = test_util::write_gguf_checkpoints(config, 12, tmp.file("source"), tmp.file("gguf/h3-small-Q8_0.gguf"),
                                                   tmp.file("gguf/reference.safetensors"));
  ASSERT_TRUE(written.ok()) << written.status().message();
  const int quantized = written->quantized;
  ASSERT_GE(quantized, 4 * config.num_layers);
  std::vector<test_util::GgufTensor> gguf = written->tensors;

  const CliRun inspect = run_cli("inspect " + q(tmp.file("gguf/h3-small-Q8_0.gguf")));
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("layout      original"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("config      from inferred from tensor shapes: " + config.to_json_string()),
            std::string::npos)
      << inspect.out;
  EXPECT_NE(inspect.out.find("gguf        " + std::to_string(quantized) + " tensors in ggml block types, "
                             "architecture 'h3'"),
            std::string::npos)
      << inspect.out;
  EXPECT_NE(inspect.out.find("  Q8_0      " + std::to_string(quantized) + " tensors"), std::string::npos) << inspect.out;

  const CliRun convert = run_cli("convert --in " + q(tmp.file("gguf/h3-small-Q8_0.gguf")) + " --to diffusers --out " +
                                 q(tmp.file("converted")));
  ASSERT_EQ(convert.code, 0) << convert.err;
  const std::string request = " --height 128 --width 192 --frames 22 --steps 2 --text-tokens 4 --seed 5 --out ";
  std::map<std::string, std::string> latents;
  for (const std::string model : {"gguf/h3-small-Q8_0.gguf", "gguf/reference.safetensors", "converted"}) {
    const CliRun run = run_cli("generate --model " + q(tmp.file(model)) + request + q(tmp.file("g")));
    ASSERT_EQ(run.code, 0) << model << ": " << run.err;
    latents[model] = test_util::latent_checksum_lines(run);
  }
  EXPECT_EQ(latents["gguf/h3-small-Q8_0.gguf"], latents["gguf/reference.safetensors"]);
  EXPECT_EQ(latents["converted"], latents["gguf/reference.safetensors"]);

  // A type this reader does not dequantize: one line naming the tensor and the type.
  gguf[0].type = 16;  // IQ2_XXS
  test_util::write_gguf(tmp.file("gguf/iq.gguf"), {}, gguf);
  test_util::expect_one_line_error(run_cli("inspect " + q(tmp.file("gguf/iq.gguf"))),
                                   "tensor '" + gguf[0].name + "' is stored IQ2_XXS, which is not read here");
}

}  // namespace
}  // namespace vortex
