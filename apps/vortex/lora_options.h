// --lora PATH[:STRENGTH] (generate, serve, convert): the adapters a command merges into the
// transformer's weights, read once, with the summary its output records.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/h3/config.h"
#include "models/h3/lora.h"
#include "vortex/status.h"

namespace vortex::cli {

extern const char* const kLoraHelp;

struct LoraOptions {
  std::vector<h3::LoraAdapter> adapters;
  std::vector<double> strengths;
  nlohmann::json summary = nlohmann::json::array();  // per adapter: path, sha256, strength, format, ...

  std::vector<h3::LoraApplication> applications() const;
};

// Reads each "PATH" or "PATH:STRENGTH" (the whole text when it names a file) against `config`;
// the reference's warnings go to stderr. Errors are prefixed "--lora".
Result<LoraOptions> read_lora_options(const std::vector<std::string>& specs, const h3::H3Config& config);

}  // namespace vortex::cli
