#include "models/vae/config_fields.h"

#include <optional>

#include <nlohmann/json.hpp>

#include "core/json_int.h"

namespace vortex::vae {

namespace {

// The value at `key`, or null when the key is absent or null (the caller keeps its default).
const nlohmann::json* find_field(const nlohmann::json& json, const char* key) {
  auto it = json.find(key);
  return it == json.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

std::string ConfigFields::error(const char* field, const std::string& what) const {
  return std::string(component_) + " config field '" + prefix_ + field + "' " + what;
}

Status ConfigFields::only_known(const nlohmann::json& json, std::initializer_list<std::string_view> known) const {
  for (const auto& [key, value] : json.items()) {
    if (key.starts_with('_')) continue;
    bool found = false;
    for (std::string_view k : known) found = found || k == key;
    if (!found) {
      return invalid_argument(error(key.c_str(), "is not one this reader knows; refusing it rather than decoding "
                                                 "without the setting it asks for"));
    }
  }
  return ok_status();
}

Status ConfigFields::require(const nlohmann::json& json, const char* key) const {
  if (find_field(json, key) == nullptr) return invalid_argument(error(key, "is missing"));
  return ok_status();
}

Status ConfigFields::expect_value(const nlohmann::json& json, const char* key, const nlohmann::json& accepted,
                                  const char* why) const {
  const nlohmann::json* v = find_field(json, key);
  if (v == nullptr || *v == accepted) return ok_status();
  return invalid_argument(error(key, "is " + v->dump() + "; only " + accepted.dump() + " maps onto this decoder (" +
                                         why + ")"));
}

Status ConfigFields::read_int(const nlohmann::json& json, const char* key, int& out) const {
  const nlohmann::json* v = find_field(json, key);
  if (!v) return ok_status();
  const std::optional<int> x = json_int(*v);
  if (!x) return invalid_argument(error(key, "must be an integer (32-bit)"));
  out = *x;
  return ok_status();
}

Status ConfigFields::read_float(const nlohmann::json& json, const char* key, float& out) const {
  const nlohmann::json* v = find_field(json, key);
  if (!v) return ok_status();
  if (!v->is_number()) return invalid_argument(error(key, "must be a number"));
  out = static_cast<float>(v->get<double>());
  return ok_status();
}

Status ConfigFields::read_string(const nlohmann::json& json, const char* key, std::string& out) const {
  const nlohmann::json* v = find_field(json, key);
  if (!v) return ok_status();
  if (!v->is_string()) return invalid_argument(error(key, "must be a string"));
  out = v->get<std::string>();
  return ok_status();
}

Status ConfigFields::read_int_list(const nlohmann::json& json, const char* key, std::vector<int>& out) const {
  const nlohmann::json* v = find_field(json, key);
  if (!v) return ok_status();
  if (!v->is_array()) return invalid_argument(error(key, "must be a list of integers"));
  std::vector<int> values;
  for (const auto& x : *v) {
    const std::optional<int> value = json_int(x);
    if (!value) return invalid_argument(error(key, "must be a list of integers (32-bit)"));
    values.push_back(*value);
  }
  out = std::move(values);
  return ok_status();
}

Status ConfigFields::read_int_table(const nlohmann::json& json, const char* key,
                                    std::vector<std::vector<int>>& out) const {
  const nlohmann::json* v = find_field(json, key);
  if (!v) return ok_status();
  if (!v->is_array()) return invalid_argument(error(key, "must be a list of integer lists"));
  std::vector<std::vector<int>> rows;
  for (const auto& row : *v) {
    if (!row.is_array()) return invalid_argument(error(key, "must be a list of integer lists"));
    std::vector<int> values;
    for (const auto& x : row) {
      const std::optional<int> value = json_int(x);
      if (!value) return invalid_argument(error(key, "must be a list of integer lists (32-bit)"));
      values.push_back(*value);
    }
    rows.push_back(std::move(values));
  }
  out = std::move(rows);
  return ok_status();
}

Status ConfigFields::read_float_list(const nlohmann::json& json, const char* key, std::vector<float>& out,
                                     const char* missing_reason) const {
  const nlohmann::json* v = find_field(json, key);
  if (!v) return missing_reason ? invalid_argument(error(key, std::string("is ") + missing_reason)) : ok_status();
  if (!v->is_array()) return invalid_argument(error(key, "must be a list of numbers"));
  std::vector<float> values;
  for (const auto& x : *v) {
    if (!x.is_number()) return invalid_argument(error(key, "must be a list of numbers"));
    values.push_back(static_cast<float>(x.get<double>()));
  }
  out = std::move(values);
  return ok_status();
}

}  // namespace vortex::vae
