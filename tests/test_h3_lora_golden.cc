// LoRA adapters against diffusers (tests/golden/h3_lora, tools/golden/make_h3_lora_golden.py):
// every layout its loader reads, placed and scaled as it places and scales them, merged, and the
// forward of the merged model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "h3_golden_util.h"
#include "models/h3/lora.h"
#include "models/h3/weights.h"

namespace vortex {
namespace {

using test::golden_path;
using test::must;

const char* const kLoraFiles[] = {"kohya_original",  "diffusers_metadata_alpha", "diffsynth", "musubi", "peft_dump",
                                  "adapter_metadata", "rslora_metadata",          "dora",      "lora_bias"};

std::string lora_path(const std::string& name) { return golden_path("h3_lora/" + name + ".safetensors"); }

h3::NamedTensors base_tensors() {
  return must(h3::read_all(must(ShardedCheckpoint::open(golden_path("h3_lora/base.safetensors")))));
}

h3::H3Config lora_config() { return must(h3::config_from_file(golden_path("h3_lora/config.json"))); }

// Each file changes exactly the weights (and, with lora_B biases, the biases) diffusers' conversion
// says it does, to the golden's float64 fold rounded to fp32 (ours: fp32 chains, so a few ulps
// apart); for DoRA and biases the golden script checked that fold against peft's unfused forward.
TEST(H3Lora, EveryLayoutMergesToTheReferencesWeights) {
  const auto expected = must(SafetensorsFile::open(golden_path("h3_lora/expected.safetensors")));
  const h3::H3Config config = lora_config();
  for (const char* name : kLoraFiles) {
    SCOPED_TRACE(name);
    const h3::LoraAdapter adapter = must(h3::read_lora(lora_path(name), config));
    h3::NamedTensors tensors = base_tensors();
    const h3::NamedTensors base = tensors;
    must(h3::merge_loras(tensors, {{&adapter, 1.0}}, DType::kF32));
    double worst = 0;
    std::set<std::string> want;
    for (const std::string& key : expected.names()) {
      if (key.starts_with(std::string(name) + "/")) want.insert(key.substr(std::string(name).size() + 1));
    }
    ASSERT_FALSE(want.empty());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& [tensor_name, merged] = tensors[i];
      if (!want.count(tensor_name)) {
        EXPECT_EQ(merged.data(), base[i].second.data()) << tensor_name << " changed but the reference leaves it";
        continue;
      }
      const Tensor ref = must(expected.get(std::string(name) + "/" + tensor_name));
      ASSERT_EQ(merged.shape(), ref.shape()) << tensor_name;
      EXPECT_EQ(merged.dtype(), DType::kF32);
      const double error = test::rel_l2(merged, ref);
      worst = std::max(worst, error);
      EXPECT_LE(error, 1e-6) << tensor_name;
      EXPECT_GT(test::rel_l2(base[i].second, ref), 1e-3) << tensor_name << ": the LoRA should move it";
    }
    size_t merged_tensors = 0;
    for (const h3::LoraModule& m : adapter.modules) merged_tensors += m.merged_tensors().size();
    EXPECT_EQ(merged_tensors, want.size());
    std::printf("%s (%s): %zu tensors, worst rel-L2 %.2e\n", name, adapter.format.c_str(), want.size(), worst);
  }
}

TEST(H3Lora, ScalesFollowWhatEachFileRecords) {
  const h3::H3Config config = lora_config();
  auto scales = [&](const std::string& name) {
    std::map<std::string, double> out;
    for (const auto& m : must(h3::read_lora(lora_path(name), config)).modules) out[m.target] = m.scale;
    return out;
  };
  // kohya: alpha 1 or 3 over rank 4.
  const auto kohya = scales("kohya_original");
  EXPECT_DOUBLE_EQ(kohya.at("transformer_blocks.0.attn.to_q"), 0.25);
  EXPECT_DOUBLE_EQ(kohya.at("transformer_blocks.0.attn.to_out.0"), 0.75);
  // __metadata__ alpha 4 over ranks 8 and 2.
  const auto network = scales("diffusers_metadata_alpha");
  EXPECT_DOUBLE_EQ(network.at("transformer_blocks.1.attn.to_q"), 0.5);
  EXPECT_DOUBLE_EQ(network.at("transformer_blocks.1.adaln_proj.linear"), 2.0);
  // lora_adapter_metadata: r 4, alpha 8; alpha_pattern gives to_q 2, rank_pattern ff.net.2 rank 2.
  const auto peft = scales("adapter_metadata");
  EXPECT_DOUBLE_EQ(peft.at("transformer_blocks.0.attn.to_q"), 0.5);
  EXPECT_DOUBLE_EQ(peft.at("transformer_blocks.1.ff.net.2"), 4.0);
  EXPECT_DOUBLE_EQ(peft.at("transformer_blocks.0.adaln_proj.linear"), 2.0);
  // rsLoRA: 6 / sqrt(4).
  EXPECT_DOUBLE_EQ(scales("rslora_metadata").at("audio_proj_out"), 3.0);
  // Nothing recorded: alpha == rank.
  EXPECT_DOUBLE_EQ(scales("peft_dump").at("context_embedder"), 1.0);
}

// The merged model's forward against the reference's forward on the weights it merged (fp32): one
// adapter, three stacked at strengths 0.5, 1 and -0.75, and a lora_B-bias file, a plain one and a
// DoRA one stacked (the DoRA module scaling what the two before it added).
TEST(H3Lora, TheMergedModelsForwardMatchesTheReference) {
  const auto expected = must(SafetensorsFile::open(golden_path("h3_lora/expected.safetensors")));
  const test::GoldenCase golden = must(test::read_golden_case(expected));
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, double>>>> cases = {
      {"kohya_original", {{"kohya_original", 1.0}}},
      {"stacked", {{"kohya_original", 0.5}, {"diffusers_metadata_alpha", 1.0}, {"diffsynth", -0.75}}},
      {"dora_stacked", {{"lora_bias", 0.7}, {"rslora_metadata", 1.0}, {"dora", -0.5}}}};
  for (const auto& [case_name, files] : cases) {
    SCOPED_TRACE(case_name);
    std::vector<h3::LoraAdapter> adapters;
    for (const auto& file : files) adapters.push_back(must(h3::read_lora(lora_path(file.first), lora_config())));
    const auto merge = [&](h3::NamedTensors& tensors, const h3::H3Config&) {
      std::vector<h3::LoraApplication> applications;
      for (size_t i = 0; i < files.size(); ++i) applications.push_back({&adapters[i], files[i].second});
      return h3::merge_loras(tensors, applications, DType::kF32);
    };
    h3::LoadedModel model = must(h3::load_model(golden_path("h3_lora/base.safetensors"), DType::kF32, merge));
    auto transformer = must(h3::H3Transformer::create(std::move(model.weights)));
    auto request = must(transformer->prepare(golden.layout, golden.text_states));
    const h3::StepOutputs out = must(transformer->forward(request, golden.step));
    const double video = test::rel_l2(out.video_velocity, must(expected.get(case_name + ".video_out")));
    const double audio = test::rel_l2(out.audio_velocity, must(expected.get(case_name + ".audio_out")));
    EXPECT_LE(video, 1e-5);
    EXPECT_LE(audio, 1e-5);
    std::printf("%s: video rel-L2 %.2e, audio %.2e\n", case_name.c_str(), video, audio);
  }
}

// A bf16 model rounds each merged weight once: the fp32 merge, then RNE.
TEST(H3Lora, ABf16ModelRoundsTheMergedWeightOnce) {
  const h3::LoraAdapter adapter = must(h3::read_lora(lora_path("musubi"), lora_config()));
  const h3::NamedTensors base = base_tensors();
  h3::NamedTensors f32 = base, bf16 = base;
  must(h3::merge_loras(f32, {{&adapter, 0.8}}, DType::kF32));
  must(h3::merge_loras(bf16, {{&adapter, 0.8}}, DType::kBF16));
  int merged = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    const std::string& name = f32[i].first;
    if (f32[i].second.data() == base[i].second.data()) continue;
    ++merged;
    const Tensor want = h3::is_fp32_island(name) ? f32[i].second : must(f32[i].second.to(DType::kBF16));
    ASSERT_EQ(bf16[i].second.dtype(), want.dtype()) << name;
    EXPECT_EQ(0, std::memcmp(bf16[i].second.data(), want.data(), want.nbytes())) << name;
  }
  EXPECT_EQ(merged, static_cast<int>(adapter.modules.size()));
}

}  // namespace
}  // namespace vortex
