#include "lora_options.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/quote.h"
#include "core/sha256.h"

namespace vortex::cli {

const char* const kLoraHelp =
    "A LoRA adapter (.safetensors) merged into the transformer's weights at load, as PATH or PATH:STRENGTH "
    "(default 1); repeat it to stack adapters, merged in order. Reads diffusers, peft, original-name (ai-toolkit, "
    "ComfyUI, kohya), musubi-tuner and DiffSynth-Studio files, with the alpha they record";

namespace {

// The file's SHA-256, read in 4 MB pieces (an H3 LoRA is up to a few GB).
Result<std::string> file_sha256(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return io_error("cannot open " + quote(path));
  Sha256 hash;
  std::vector<char> buffer(4 << 20);
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f)) > 0) hash.update(buffer.data(), n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return io_error("cannot read " + quote(path));
  return hash.finish_hex();
}

}  // namespace

LoraSpec parse_lora_spec(const std::string& text) {
  std::error_code error;
  const size_t colon = text.rfind(':');
  if (std::filesystem::is_regular_file(text, error) || colon == std::string::npos) return {text, 1.0};
  const std::string strength = text.substr(colon + 1);
  char* end = nullptr;
  const double value = std::strtod(strength.c_str(), &end);
  if (strength.empty() || end != strength.c_str() + strength.size() || !std::isfinite(value)) return {text, 1.0};
  return {text.substr(0, colon), value};
}

std::set<std::string> LoraOptions::targets() const {
  std::set<std::string> out;
  for (const h3::LoraAdapter& adapter : adapters) {
    for (const h3::LoraModule& module : adapter.modules) {
      for (std::string& name : module.merged_tensors()) out.insert(std::move(name));
    }
  }
  return out;
}

void LoraOptions::append(LoraOptions&& more) {
  for (auto& adapter : more.adapters) adapters.push_back(std::move(adapter));
  strengths.insert(strengths.end(), more.strengths.begin(), more.strengths.end());
  for (auto& entry : more.summary) summary.push_back(std::move(entry));
}

Result<LoraOptions> read_lora_options(const std::vector<std::string>& specs, const h3::H3Config& config) {
  std::vector<LoraSpec> parsed;
  for (const std::string& text : specs) parsed.push_back(parse_lora_spec(text));
  return read_lora_options(parsed, config, "--lora");
}

Result<LoraOptions> read_lora_options(const std::vector<LoraSpec>& specs, const h3::H3Config& config,
                                      const std::string& context) {
  LoraOptions out;
  out.adapters.reserve(specs.size());
  for (const LoraSpec& spec : specs) {
    auto adapter = h3::read_lora(spec.path, config);
    if (!adapter.ok()) return adapter.status().with_context(context);
    for (const std::string& w : adapter->warnings) {
      std::fprintf(stderr, "vortex: %s %s: %s\n", context.c_str(), spec.path.c_str(), w.c_str());
    }
    auto sha256 = file_sha256(spec.path);
    if (!sha256.ok()) return sha256.status().with_context(context);
    out.summary.push_back({{"path", spec.path},
                           {"sha256", *sha256},
                           {"strength", spec.strength},
                           {"format", adapter->format},
                           {"partition", adapter->partition},
                           {"alpha", adapter->alpha_source},
                           {"modules", adapter->modules.size()}});
    out.adapters.push_back(std::move(*adapter));
    out.strengths.push_back(spec.strength);
  }
  return out;
}

}  // namespace vortex::cli
