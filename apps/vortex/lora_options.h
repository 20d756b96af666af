// --lora PATH[:STRENGTH] (generate, serve, convert): the adapters a command merges into the
// transformer's weights, read once, with the summary its output records.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/h3/config.h"
#include "models/h3/lora.h"
#include "vortex/status.h"

namespace vortex::cli {

extern const char* const kLoraHelp;

struct LoraSpec {
  std::string path;
  double strength = 1.0;
};

// "PATH" or "PATH:STRENGTH" (the whole text when it names a file).
LoraSpec parse_lora_spec(const std::string& text);

// The adapters (h3::LoraStack: merged in this order) and what the output records of them.
struct LoraOptions : h3::LoraStack {
  nlohmann::json summary = nlohmann::json::array();  // per adapter: path, sha256, strength, format, ...

  // The weights the adapters change ("<linear>.weight").
  std::set<std::string> targets() const;
  // Appends `more`'s adapters after these (merged after them).
  void append(LoraOptions&& more);
};

// Reads each adapter against `config`; the reference's warnings go to stderr. Errors are prefixed
// `context`.
Result<LoraOptions> read_lora_options(const std::vector<LoraSpec>& specs, const h3::H3Config& config,
                                      const std::string& context);
// The same for --lora's "PATH[:STRENGTH]" texts (errors prefixed "--lora").
Result<LoraOptions> read_lora_options(const std::vector<std::string>& specs, const h3::H3Config& config);

}  // namespace vortex::cli
