// Integers read from JSON (configs, served requests) into int: nlohmann's get<int>() converts an
// out-of-range value silently (4294967346 becomes 50), so every such read goes through json_int.
#pragma once

#include <climits>
#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace vortex {

// The value as an int, or nullopt when it is not an integer or lies outside int's range.
inline std::optional<int> json_int(const nlohmann::json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT_MAX)) return std::nullopt;
    return static_cast<int>(u);
  }
  const int64_t s = value.get<int64_t>();
  if (s < INT_MIN || s > INT_MAX) return std::nullopt;
  return static_cast<int>(s);
}

}  // namespace vortex
