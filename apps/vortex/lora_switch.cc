#include "lora_switch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/quote.h"
#include "models/h3/lora.h"

namespace vortex::cli {

namespace fs = std::filesystem;

namespace {

// At most this many files GET /v1/loras lists.
constexpr size_t kMaxListed = 1000;

std::string field(size_t index, const char* name) {
  return "loras[" + std::to_string(index) + "]." + name;
}

// An error about a file of the folder, with its server path replaced by the name the request gave.
Status named_as_requested(const Status& error, const std::string& path, const std::string& name) {
  std::string message = error.message();
  for (size_t at = message.find(path); at != std::string::npos; at = message.find(path, at + name.size())) {
    message.replace(at, path.size(), name);
  }
  return Status(error.code(), message);
}

}  // namespace

Result<std::vector<RequestLora>> parse_request_loras(const nlohmann::json& value) {
  if (!value.is_array()) {
    return invalid_argument("loras: an array of {\"name\": ..., \"strength\": ...} is expected, got " + shown_value(value));
  }
  if (value.size() > kMaxRequestLoras) {
    return invalid_argument("loras: " + std::to_string(value.size()) + " adapters; a request may name at most " +
                            std::to_string(kMaxRequestLoras));
  }
  std::vector<RequestLora> out;
  for (size_t i = 0; i < value.size(); ++i) {
    const nlohmann::json& entry = value[i];
    if (!entry.is_object()) {
      return invalid_argument("loras[" + std::to_string(i) + "]: an object {\"name\": ..., \"strength\": ...} is "
                              "expected, got " + shown_value(entry));
    }
    RequestLora lora;
    for (const auto& [key, v] : entry.items()) {
      if (key == "name") {
        if (!v.is_string() || v.get<std::string>().empty()) {
          return invalid_argument(field(i, "name") + ": a file name is expected, got " + shown_value(v));
        }
        lora.name = v.get<std::string>();
      } else if (key == "strength") {
        if (!v.is_number() || !std::isfinite(v.get<double>())) {
          return invalid_argument(field(i, "strength") + ": a finite number is expected, got " + shown_value(v));
        }
        lora.strength = v.get<double>();
      } else {
        return invalid_argument(field(i, key.c_str()) + ": unknown field (an adapter has \"name\" and \"strength\")");
      }
    }
    if (lora.name.empty()) return invalid_argument(field(i, "name") + ": missing");
    out.push_back(std::move(lora));
  }
  return out;
}

nlohmann::json request_loras_json(const std::vector<RequestLora>& loras) {
  nlohmann::json out = nlohmann::json::array();
  for (const RequestLora& l : loras) out.push_back({{"name", l.name}, {"strength", l.strength}});
  return out;
}

Result<LoraSwitcher> LoraSwitcher::create(const std::string& folder, const std::vector<std::string>& server_loras,
                                          const LoadedStepModel& model) {
  std::error_code error;
  if (!fs::is_directory(folder, error)) return invalid_argument("--lora-dir " + quote(folder) + ": not a folder");
  if (model.base_weights.empty()) return internal_error("--lora-dir: the model was loaded without its base weights");
  LoraSwitcher switcher;
  switcher.folder_ = folder;
  for (const std::string& text : server_loras) switcher.server_.push_back(parse_lora_spec(text));
  VORTEX_ASSIGN_OR_RETURN(switcher.applied_, switcher.identify(switcher.server_));
  switcher.applied_known_ = true;
  switcher.applied_summary_ = model.loras;
  switcher.changed_ = model.merged_weights;
  return switcher;
}

Result<std::string> LoraSwitcher::resolve(const RequestLora& lora, size_t index) const {
  const fs::path name(lora.name);
  const fs::path normal = name.lexically_normal();
  bool escapes = name.is_absolute() || normal.empty() || normal == ".";
  for (const fs::path& part : normal) escapes = escapes || part == "..";
  if (escapes) {
    return invalid_argument(field(index, "name") + ": " + quote(lora.name) +
                            " is not a file name inside the server's LoRA folder");
  }
  const fs::path path = fs::path(folder_) / normal;
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    return invalid_argument(field(index, "name") + ": no adapter " + quote(lora.name) +
                            " in the server's LoRA folder (GET /v1/loras lists them)");
  }
  return path.string();
}

Result<std::vector<LoraSwitcher::Applied>> LoraSwitcher::identify(const std::vector<LoraSpec>& specs) const {
  std::vector<Applied> out;
  for (const LoraSpec& spec : specs) {
    std::error_code error;
    Applied a{spec.path, fs::file_size(spec.path, error), 0, spec.strength};
    const auto modified = fs::last_write_time(spec.path, error);
    if (error) return io_error("LoRA adapter " + quote(spec.path) + ": " + error.message());
    a.modified_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(modified.time_since_epoch()).count();
    out.push_back(std::move(a));
  }
  return out;
}

Status LoraSwitcher::check(const std::vector<RequestLora>& loras, const h3::H3Config& config) const {
  for (size_t i = 0; i < loras.size(); ++i) {
    VORTEX_ASSIGN_OR_RETURN(const std::string path, resolve(loras[i], i));
    const Result<h3::LoraAdapter> adapter = h3::read_lora(path, config);
    if (!adapter.ok()) return named_as_requested(adapter.status().with_context(field(i, "name")), path, loras[i].name);
  }
  return ok_status();
}

Result<double> LoraSwitcher::use(const std::vector<RequestLora>& loras, LoadedStepModel& model,
                                 const std::string& log) {
  std::vector<LoraSpec> requested;
  for (size_t i = 0; i < loras.size(); ++i) {
    VORTEX_ASSIGN_OR_RETURN(const std::string path, resolve(loras[i], i));
    requested.push_back({path, loras[i].strength});
  }
  std::vector<LoraSpec> all = server_;
  all.insert(all.end(), requested.begin(), requested.end());
  VORTEX_ASSIGN_OR_RETURN(const std::vector<Applied> wanted, identify(all));
  if (applied_known_ && wanted == applied_) {
    model.loras = applied_summary_;
    return 0.0;
  }

  const auto start = std::chrono::steady_clock::now();
  const h3::H3Config& config = model.steps().config();
  VORTEX_ASSIGN_OR_RETURN(LoraOptions adapters, read_lora_options(server_, config, "--lora"));
  auto from_request = read_lora_options(requested, config, "loras");
  if (!from_request.ok()) {
    Status error = from_request.status();
    for (size_t i = 0; i < loras.size(); ++i) error = named_as_requested(error, requested[i].path, loras[i].name);
    return error;
  }
  for (size_t i = 0; i < loras.size(); ++i) {  // the client knows its adapters by name
    nlohmann::json& entry = from_request->summary[i];
    entry.erase("path");
    entry["name"] = loras[i].name;
  }
  adapters.append(std::move(*from_request));
  const std::set<std::string> targets = adapters.targets();
  std::set<std::string> names = changed_;
  names.insert(targets.begin(), targets.end());
  std::fprintf(stderr, "%sLoRA adapters: %zu (%zu weights to write again) ...\n", log.c_str(),
               adapters.adapters.size(), names.size());

  nlohmann::json summary = std::move(adapters.summary);
  auto stack = std::make_shared<const h3::LoraStack>(std::move(static_cast<h3::LoraStack&>(adapters)));
  // From here on the model may hold either set's weights until the write succeeds.
  applied_known_ = false;
  changed_ = names;
  VORTEX_RETURN_IF_ERROR(model.merge_adapters(std::move(stack), names).with_context("loras"));
  changed_ = targets;
  applied_ = wanted;
  applied_known_ = true;
  applied_summary_ = summary;
  model.loras = std::move(summary);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "%sLoRA adapters merged and written in %.2f s\n", log.c_str(), seconds);
  return seconds;
}

nlohmann::json LoraSwitcher::list() const {
  nlohmann::json out = nlohmann::json::array();
  std::vector<std::pair<std::string, uintmax_t>> found;
  std::error_code error;
  for (fs::recursive_directory_iterator it(folder_, fs::directory_options::skip_permission_denied, error), end;
       !error && it != end && found.size() < kMaxListed; it.increment(error)) {
    std::error_code ignored;
    if (!it->is_regular_file(ignored) || it->path().extension() != ".safetensors") continue;
    found.emplace_back(fs::relative(it->path(), folder_, ignored).string(), it->file_size(ignored));
  }
  std::sort(found.begin(), found.end());
  for (const auto& [name, bytes] : found) out.push_back({{"name", name}, {"bytes", bytes}});
  return out;
}

}  // namespace vortex::cli
