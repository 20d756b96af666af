#include "inspect_lora.h"

#include <cstdio>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "formats/safetensors.h"
#include "models/h3/lora.h"
#include "models/h3/model_source.h"
#include "models/h3/weights.h"

namespace vortex::cli {

namespace {

// 0.25 -> "0.25", 1/3 -> "0.333333": a scale as a reader writes it.
std::string shortest(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

}  // namespace

bool is_lora_file(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return false;
  for (const std::string& name : file->names()) {
    if (h3::is_lora_tensor_name(name)) return true;
  }
  return false;
}

int inspect_lora(const std::string& path, const std::string& model, bool json) {
  Result<h3::H3Config> config = h3::config_preset("h3");
  std::string checked_against = "the released H3 config (--model names another checkpoint)";
  if (!model.empty()) {
    auto checkpoint = h3::ModelSource::open(model);
    if (!checkpoint.ok()) return report_error(checkpoint.status().with_context("--model"));
    config = h3::resolve_config(*checkpoint);
    checked_against = "the config of " + model;
  }
  if (!config.ok()) return report_error(config.status());
  auto adapter = h3::read_lora(path, *config);
  if (!adapter.ok()) return report_error(adapter.status().with_context("checked against " + checked_against));

  // Modules by kind: the block index (and refiner block index) folded out of the name.
  const std::regex block(R"((transformer_blocks|refiner_blocks)\.\d+\.)");
  std::map<std::string, int> kinds;
  std::map<int64_t, int> ranks;
  std::map<double, int> scales;
  int dora = 0, biased = 0;
  for (const h3::LoraModule& m : adapter->modules) {
    ++kinds[std::regex_replace(m.target, block, "$1.N.")];
    ++ranks[m.down.size(0)];
    ++scales[m.scale];
    dora += m.magnitude.defined() ? 1 : 0;
    biased += m.bias.defined() ? 1 : 0;
  }
  if (json) {
    nlohmann::json rank_counts = nlohmann::json::object(), scale_counts = nlohmann::json::object();
    for (const auto& [rank, count] : ranks) rank_counts[std::to_string(rank)] = count;
    for (const auto& [scale, count] : scales) scale_counts[shortest(scale)] = count;
    const nlohmann::json out = {{"lora", path},
                                {"format", adapter->format},
                                {"partition", adapter->partition},
                                {"alpha", adapter->alpha_source},
                                {"modules", adapter->modules.size()},
                                {"by_kind", kinds},
                                {"ranks", rank_counts},
                                {"scales", scale_counts},
                                {"dora_modules", dora},
                                {"bias_modules", biased},
                                {"warnings", adapter->warnings},
                                {"checked_against", checked_against}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("lora        %s\n", path.c_str());
  std::printf("layout      %s\n", adapter->format.c_str());
  std::printf("partition   %s\n", adapter->partition.c_str());
  std::printf("alpha       %s\n", adapter->alpha_source.c_str());
  std::printf("modules     %zu\n", adapter->modules.size());
  for (const auto& [kind, count] : kinds) std::printf("  %-44s %d\n", kind.c_str(), count);
  std::printf("ranks      ");
  for (const auto& [rank, count] : ranks) std::printf(" %lld (%d)", static_cast<long long>(rank), count);
  std::printf("\nscales     ");
  for (const auto& [scale, count] : scales) std::printf(" %s (%d)", shortest(scale).c_str(), count);
  std::printf("\nDoRA        %d of %d modules\n", dora, static_cast<int>(adapter->modules.size()));
  std::printf("biases      %d of %d modules\n", biased, static_cast<int>(adapter->modules.size()));
  std::printf("fits        %s\n", checked_against.c_str());
  for (const std::string& w : adapter->warnings) std::printf("warning     %s\n", w.c_str());
  return 0;
}

}  // namespace vortex::cli
