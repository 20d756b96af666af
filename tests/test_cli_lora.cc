// generate --lora: the latents are those of a checkpoint with the adapters merged by the library,
// on any thread count; the run's JSON names each adapter; convert --lora bakes the same weights; bad
// adapters are one line, nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/sha256.h"
#include "h3_golden_util.h"
#include "models/h3/lora.h"
#include "models/h3/model_source.h"
#include "models/h3/weights.h"
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

const std::string kRequest = "generate --height 64 --width 64 --frames 22 --steps 2 --text-tokens 4 --seed 5 ";

std::string lora(const std::string& name) { return golden_path("h3_lora/" + name + ".safetensors"); }

TEST(CliLora, LatentsAreTheLibraryMergedCheckpointsOnAnyThreadCount) {
  TempDir tmp;
  // The library's merge, written as a checkpoint (bf16, as generate's CPU default keeps it).
  const h3::ModelSource base = must(h3::ModelSource::open(golden_path("h3_lora/base.safetensors")));
  const h3::H3Config config = must(h3::resolve_config(base));
  h3::NamedTensors tensors = must(base.tensors());
  const h3::LoraAdapter kohya = must(h3::read_lora(lora("kohya_original"), config));
  const h3::LoraAdapter diffsynth = must(h3::read_lora(lora("diffsynth"), config));
  must(h3::merge_loras(tensors, {{&kohya, 0.5}, {&diffsynth, 1.0}}, DType::kBF16));
  must(write_safetensors(tmp.file("merged.safetensors"), tensors, base.metadata()));
  const CliRun merged =
      run_cli(kRequest + "--model " + q(tmp.file("merged.safetensors")) + " --out " + q(tmp.file("m")));
  ASSERT_EQ(merged.code, 0) << merged.err;

  const std::string loras = " --lora " + q(lora("kohya_original") + ":0.5") + " --lora " + q(lora("diffsynth"));
  for (const std::string threads : {"1", "3"}) {
    const std::string prefix = tmp.file("l" + threads);
    const CliRun run =
        run_cli(kRequest + "--model " + q(golden_path("h3_lora/base.safetensors")) + loras + " --out " + q(prefix),
                "VORTEX_NUM_THREADS=" + threads);
    ASSERT_EQ(run.code, 0) << run.err;
    EXPECT_EQ(test_util::latent_checksum_lines(run), test_util::latent_checksum_lines(merged)) << threads << " threads";
    const nlohmann::json summary = nlohmann::json::parse(test_util::read_bytes(prefix + ".json"));
    ASSERT_EQ(summary["loras"].size(), 2u) << summary.dump();
    const nlohmann::json& first = summary["loras"][0];
    EXPECT_EQ(first["path"], lora("kohya_original"));
    EXPECT_EQ(first["strength"], 0.5);
    EXPECT_EQ(first["modules"], kohya.modules.size());
    EXPECT_EQ(first["alpha"], ".alpha tensors");
    const std::string bytes = test_util::read_bytes(lora("kohya_original"));
    EXPECT_EQ(first["sha256"], sha256_hex(bytes.data(), bytes.size()));
    EXPECT_EQ(summary["loras"][1]["strength"], 1.0);
    EXPECT_NE(summary["model"].get<std::string>().find("2 LoRA adapters merged"), std::string::npos)
        << summary["model"];
  }
  // Without the adapters the latents differ.
  const CliRun plain =
      run_cli(kRequest + "--model " + q(golden_path("h3_lora/base.safetensors")) + " --out " + q(tmp.file("p")));
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(test_util::latent_checksum_lines(plain), test_util::latent_checksum_lines(merged));
}

// convert --lora bakes the adapters into a checkpoint (here in the original layout, one group of
// tensors at a time): generating from it gives generate --lora's bits, lora_B biases and a DoRA
// module scaling them included.
TEST(CliLora, ConvertBakesTheAdaptersGenerateMerges) {
  TempDir tmp;
  const std::string base = golden_path("h3_lora/base.safetensors");
  const std::string loras = " --lora " + q(lora("kohya_original") + ":0.5") + " --lora " + q(lora("musubi")) +
                            " --lora " + q(lora("lora_bias") + ":0.7") + " --lora " + q(lora("dora") + ":-0.5");
  const CliRun convert =
      run_cli("convert --in " + q(base) + " --to original" + loras + " --out " + q(tmp.file("baked")));
  ASSERT_EQ(convert.code, 0) << convert.err;
  EXPECT_NE(convert.out.find("merged " + lora("kohya_original") + " at strength 0.5"), std::string::npos)
      << convert.out;
  const CliRun baked = run_cli(kRequest + "--model " + q(tmp.file("baked")) + " --out " + q(tmp.file("b")));
  ASSERT_EQ(baked.code, 0) << baked.err;
  const CliRun merged = run_cli(kRequest + "--model " + q(base) + loras + " --out " + q(tmp.file("m")));
  ASSERT_EQ(merged.code, 0) << merged.err;
  EXPECT_EQ(test_util::latent_checksum_lines(baked), test_util::latent_checksum_lines(merged));
  expect_one_line_error(
      run_cli("convert --synthetic --preset test --lora " + q(lora("musubi")) + " --out " + q(tmp.file("s"))),
      "--lora goes with --in");
}

// inspect reads an adapter as generate --lora does, against --model's config or the released one.
TEST(CliLora, InspectDescribesAnAdapter) {
  const std::string model = " --model " + q(golden_path("h3_lora/base.safetensors"));
  const CliRun text = run_cli("inspect " + q(lora("kohya_original")) + model);
  ASSERT_EQ(text.code, 0) << text.err;
  for (const char* line : {"layout      original names under diffusion_model., kohya", "alpha       .alpha tensors",
                           "modules     21", "transformer_blocks.N.ff.net.0.proj           2", "ranks       4 (21)",
                           "scales      0.25 (10) 0.75 (11)"}) {
    EXPECT_NE(text.out.find(line), std::string::npos) << line << " in:\n" << text.out;
  }
  const CliRun json = run_cli("inspect --json " + q(lora("adapter_metadata")) + model);
  ASSERT_EQ(json.code, 0) << json.err;
  const nlohmann::json out = nlohmann::json::parse(json.out);
  EXPECT_EQ(out["alpha"], "lora_adapter_metadata");
  EXPECT_EQ(out["ranks"], nlohmann::json({{"2", 1}, {"4", 3}}));
  EXPECT_EQ(out["scales"], nlohmann::json({{"0.5", 1}, {"2", 2}, {"4", 1}}));
  EXPECT_EQ(out["dora_modules"], 0);
  // peft's DoRA and lora_B biases are counted.
  const CliRun dora = run_cli("inspect " + q(lora("dora")) + model);
  ASSERT_EQ(dora.code, 0) << dora.err;
  EXPECT_NE(dora.out.find("DoRA        4 of 4 modules"), std::string::npos) << dora.out;
  const CliRun bias = run_cli("inspect --json " + q(lora("lora_bias")) + model);
  ASSERT_EQ(bias.code, 0) << bias.err;
  EXPECT_EQ(nlohmann::json::parse(bias.out)["bias_modules"], 3);
  // The golden adapters are for a small model, not the released one.
  expect_one_line_error(run_cli("inspect " + q(lora("kohya_original"))), "checked against the released H3 config");
  expect_one_line_error(run_cli("inspect " + q(golden_path("h3_lora/base.safetensors")) + model),
                        "--model goes with a LoRA adapter's file");
}

TEST(CliLora, BadAdaptersAreOneLineAndWriteNothing) {
  TempDir tmp;
  const std::string model = "--model " + q(golden_path("h3_lora/base.safetensors"));
  const auto refused = [&](const std::string& lora_arg, const std::string& needle) {
    SCOPED_TRACE(lora_arg);
    expect_one_line_error(run_cli(kRequest + model + " --lora " + q(lora_arg) + " --out " + q(tmp.file("x"))), needle);
    EXPECT_FALSE(fs::exists(tmp.file("x.safetensors")) || fs::exists(tmp.file("x.json")));
  };
  refused(tmp.file("missing.safetensors"), "missing.safetensors");
  refused(tmp.file("missing.safetensors") + ":0.5", "missing.safetensors");
  // A LoRA trained for another checkpoint's shapes.
  must(write_safetensors(
      tmp.file("other.safetensors"),
      {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", Tensor::zeros({2, 48}, DType::kF32)},
       {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", Tensor::zeros({72, 2}, DType::kF32)}}));
  refused(tmp.file("other.safetensors"), "do not fit 'transformer_blocks.0.attn.to_q' [256, 32]");
}

}  // namespace
}  // namespace vortex
