// Reading VAE config.json fields: one-line errors naming the component and the field, and the
// same rules for both VAEs (an absent or null key keeps the default; JSON numbers become fp32 the
// way the reference's torch.tensor does, by rounding to nearest).
//
// The original checkpoint's configs are read strictly: every key must be one the reader knows
// (only_known), because a setting silently ignored is a decoder silently different from the
// checkpoint's. Nested objects are read with a field prefix ("vit_decoder_kwargs.") so that errors
// name the full path of the field.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "vortex/status.h"

namespace vortex::vae {

class ConfigFields {
 public:
  explicit ConfigFields(const char* component, const char* field_prefix = "")
      : component_(component), prefix_(field_prefix) {}

  // "<component> config field '<prefix><field>' <what>"
  std::string error(const char* field, const std::string& what) const;

  // An error for the first key of `json` that is not in `known` and does not start with '_' (the
  // bookkeeping keys of config writers: _class_name, _diffusers_version, ...).
  Status only_known(const nlohmann::json& json, std::initializer_list<std::string_view> known) const;
  // An error when `key` is absent or null.
  Status require(const nlohmann::json& json, const char* key) const;
  // An error when `key` is present, not null and not equal to `accepted` (numbers compare by
  // value): for settings the decoder implements one way only. `why` ends the message.
  Status expect_value(const nlohmann::json& json, const char* key, const nlohmann::json& accepted,
                      const char* why) const;

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
  const char* prefix_;
};

}  // namespace vortex::vae
