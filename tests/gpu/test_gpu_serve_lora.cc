// serve --lora-dir on the GPU, as a user runs it: each job's adapters are written into the loaded
// model in place, and its latents are the bits `generate --device cuda --lora ...` computes with a
// model loaded with them, under both recipes, while the jobs switch between sets and back to none.
#if defined(VORTEX_HAVE_SERVICE)
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "gpu_test_util.h"
#include "models/h3/config.h"
#include "models/h3/weights.h"
#include "serve_process.h"

namespace vortex {
namespace {

using test::must;
using test_util::json_of;
using test_util::post_json;
using test_util::q;
using test_util::run_cli;
using test_util::ServeProcess;
using test_util::TempDir;
using test_util::wait_for_state;
using test_util::write_lora;

constexpr const char* kGeometry = R"("height": 64, "width": 64, "frames": 22, "steps": 3, "seed": 5, "text_tokens": 4)";

TEST(GpuServeLora, RequestAdaptersAreTheBitsGenerateComputes) {
  VORTEX_REQUIRE_GPU();
  TempDir tmp;
  const std::string folder = tmp.file("loras");
  std::filesystem::create_directories(folder);
  std::map<std::string, std::pair<int64_t, int64_t>> shape;  // the mid preset's linears: [out, in]
  for (const h3::TensorSpec& spec : h3::diffusers_schema(must(h3::config_preset("mid")))) {
    if (spec.shape.rank() == 2) shape[spec.name] = {spec.shape[0], spec.shape[1]};
  }
  const auto linears = [&](const std::vector<std::string>& targets) {
    std::vector<std::tuple<std::string, int64_t, int64_t>> out;
    for (const std::string& t : targets) out.emplace_back(t, shape.at(t + ".weight").first, shape.at(t + ".weight").second);
    return out;
  };
  // a: a block's fused QKV part and FC2; b: an AdaLN projection (off the device with tables per
  // request), a refiner block, the time MLP (run on the host) and an output head.
  write_lora(folder + "/a.safetensors", linears({"transformer_blocks.0.attn.to_q", "transformer_blocks.2.ff.net.2"}), 0.2f);
  write_lora(folder + "/b.safetensors",
             linears({"transformer_blocks.1.adaln_proj.linear", "token_refiner.refiner_blocks.0.attn.to_k",
                      "time_embedder.linear_2", "proj_out"}),
             -0.15f);
  const std::string a = folder + "/a.safetensors", b = folder + "/b.safetensors";
  const std::vector<std::pair<std::string, std::string>> jobs = {
      {R"([{"name": "a.safetensors", "strength": 0.05}])", "--lora " + q(a + ":0.05")},
      {"[]", ""},
      {R"([{"name": "b.safetensors", "strength": 0.04}, {"name": "a.safetensors", "strength": -0.03}])",
       "--lora " + q(b + ":0.04") + " --lora " + q(a + ":-0.03")},
      {R"([{"name": "a.safetensors", "strength": 0.05}])", "--lora " + q(a + ":0.05")}};

  for (const std::string recipe : {"bf16", "fp8"}) {
    SCOPED_TRACE(recipe);
    ServeProcess server({"--device", "cuda", "--recipe", recipe, "--lora-dir", folder}, "mid");
    httplib::Client c = server.client();
    std::vector<nlohmann::json> checksums;
    for (const auto& [loras, flags] : jobs) {
      SCOPED_TRACE(loras);
      const httplib::Result submitted = post_json(c, std::string("{") + kGeometry + ", \"loras\": " + loras + "}");
      ASSERT_TRUE(submitted);
      ASSERT_EQ(submitted->status, 202) << submitted->body;
      const nlohmann::json done = wait_for_state(c, json_of(submitted).at("id"), "succeeded", 300);
      const test_util::CliRun generated =
          run_cli("generate --synthetic mid --device cuda --recipe " + recipe +
                  " --height 64 --width 64 --frames 22 --steps 3 --seed 5 --text-tokens 4 " + flags + " --out " +
                  q(tmp.file("generated")));
      ASSERT_EQ(generated.code, 0) << generated.err;
      const nlohmann::json want = nlohmann::json::parse(test_util::read_bytes(tmp.file("generated.json")));
      EXPECT_EQ(done["result"]["checksums"], want["checksums"]);
      checksums.push_back(done["result"]["checksums"]);
    }
    EXPECT_EQ(checksums[3], checksums[0]);
    EXPECT_NE(checksums[0], checksums[1]);
    EXPECT_NE(checksums[2], checksums[1]);
    EXPECT_EQ(server.stop(), 0) << server.log();
  }
}

}  // namespace
}  // namespace vortex
#endif  // VORTEX_HAVE_SERVICE
