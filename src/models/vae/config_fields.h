// Reading VAE config.json fields: one-line errors naming the component and the field, and the
// same rules for both VAEs (an absent or null key keeps the default; JSON numbers become fp32 the
// way the reference's torch.tensor does, by rounding to nearest).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "vortex/status.h"

namespace vortex::vae {

class ConfigFields {
 public:
  explicit ConfigFields(const char* component) : component_(component) {}

  // "<component> config field '<field>' <what>"
  std::string error(const char* field, const std::string& what) const;

  Status read_int(const nlohmann::json& json, const char* key, int& out) const;
  Status read_float(const nlohmann::json& json, const char* key, float& out) const;
  Status read_string(const nlohmann::json& json, const char* key, std::string& out) const;
  Status read_int_list(const nlohmann::json& json, const char* key, std::vector<int>& out) const;
  Status read_int_table(const nlohmann::json& json, const char* key, std::vector<std::vector<int>>& out) const;
  // With `missing_reason`, an absent key is an error "is <missing_reason>"; without, the default stays.
  Status read_float_list(const nlohmann::json& json, const char* key, std::vector<float>& out,
                         const char* missing_reason = nullptr) const;

 private:
  const char* component_;
};

}  // namespace vortex::vae
