// serve --lora-dir: LoRA adapters named per request and merged into the loaded model's weights
// between jobs, without loading the model again.
//
// A request names adapters in the server's LoRA folder: "loras": [{"name": "style.safetensors",
// "strength": 0.8}, ...]. Before its job runs, the model's weights become the checkpoint's with the
// server's own --lora adapters merged first and the request's after them, in order: the bits
// `generate --lora SERVER... --lora REQUEST...` computes. Only the weights an adapter of the old or
// the new set touches are merged and written again (on the GPU written in place, under either
// recipe, through h3::lora_merging_filler); a job whose adapters are the ones in place (the same
// files, unchanged, at the same strengths) costs nothing.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate_common.h"
#include "lora_options.h"
#include "models/h3/config.h"
#include "vortex/status.h"

namespace vortex::cli {

struct RequestLora {
  std::string name;  // a file in the server's LoRA folder, relative to it
  double strength = 1.0;
};

// At most this many adapters a request (each merge pass reads every one of them).
constexpr size_t kMaxRequestLoras = 16;

// The request's "loras" field, type-checked; errors name loras[i] and the field.
Result<std::vector<RequestLora>> parse_request_loras(const nlohmann::json& value);
nlohmann::json request_loras_json(const std::vector<RequestLora>& loras);

class LoraSwitcher {
 public:
  // `folder`: where requests' adapters are; `server_loras`: serve's --lora texts, merged into
  // every job before the request's. `model` was loaded with ModelOptions::keep_base_weights and
  // holds the server's adapters.
  static Result<LoraSwitcher> create(const std::string& folder, const std::vector<std::string>& server_loras,
                                     const LoadedStepModel& model);

  // At submit: each name is a file in the folder that reads as an adapter fitting `config`.
  Status check(const std::vector<RequestLora>& loras, const h3::H3Config& config) const;
  // Before a job: gives `model` the server's adapters and then these (model.loras lists them all).
  // `log` prefixes the lines on stderr that say what was merged and how long it took. Returns the
  // seconds the switch took: 0 when these adapters were already in place.
  Result<double> use(const std::vector<RequestLora>& loras, LoadedStepModel& model, const std::string& log);
  // The adapters in the folder (GET /v1/loras): name and bytes, sorted by name.
  nlohmann::json list() const;

 private:
  // One adapter as merged: which file, its size and time of change (a file rewritten in place is
  // read again), and the strength.
  struct Applied {
    std::string path;
    uintmax_t bytes = 0;
    int64_t modified_ns = 0;
    double strength = 1.0;
    bool operator==(const Applied&) const = default;
  };
  // Where a request's name leads, or an error naming loras[index].name.
  Result<std::string> resolve(const RequestLora& lora, size_t index) const;
  Result<std::vector<Applied>> identify(const std::vector<LoraSpec>& specs) const;

  std::string folder_;
  std::vector<LoraSpec> server_;
  // What the model's weights hold: these adapters (when known), and which weights may differ from
  // the base weights (the adapters' targets; after a failed switch, every weight either set touched).
  std::vector<Applied> applied_;
  bool applied_known_ = false;
  nlohmann::json applied_summary_ = nlohmann::json::array();
  std::set<std::string> changed_;
};

}  // namespace vortex::cli
