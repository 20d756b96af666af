#include "bench/manifest.h"

#include <algorithm>
#include <ctime>
#include <numeric>

#include "core/sha256.h"

namespace vortex::bench {

double Samples::mean() const {
  return ms.empty() ? 0.0 : std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
}

double Samples::median() const {
  if (ms.empty()) return 0.0;
  std::vector<double> s = ms;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

double Samples::min() const { return ms.empty() ? 0.0 : *std::min_element(ms.begin(), ms.end()); }
double Samples::max() const { return ms.empty() ? 0.0 : *std::max_element(ms.begin(), ms.end()); }

nlohmann::json Correctness::to_json() const {
  return {{"comparator", comparator}, {"max_abs", max_abs}, {"max_rel", max_rel},
          {"rel_l2", rel_l2},         {"bound_rel_l2", bound}, {"passed", passed}};
}

std::string json_digest(const nlohmann::json& value) {
  const std::string canonical = value.dump();
  return sha256_hex(canonical.data(), canonical.size());
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

nlohmann::json Manifest::to_json() const {
  nlohmann::json run = {
      {"status", correctness.passed ? "ok" : "incorrect"},
      {"workload", workload},
      {"unit", "ms"},
      {"primary", "median"},
      {"median", samples.median()},
      {"mean", samples.mean()},
      {"min", samples.min()},
      {"max", samples.max()},
      {"samples", samples.ms},
      {"derived", derived},
      {"observed_at", utc_timestamp()},
  };
  if (!samples.gpu.is_null()) run["gpu_during_samples"] = samples.gpu;
  nlohmann::json m = {
      {"schema", "vortex.bench.v1"},
      {"run", run},
      {"correctness", correctness.to_json()},
      {"workload", workload_section},
      {"protocol", protocol},
      {"environment", environment},
      {"implementation", implementation},
      {"peers", peers},
  };
  nlohmann::json digests;
  for (const char* section : {"run", "correctness", "workload", "protocol", "environment", "implementation", "peers"}) {
    digests[section] = json_digest(m[section]);
  }
  m["digests"] = digests;
  return m;
}

bool verify_manifest(const nlohmann::json& manifest) {
  if (!manifest.contains("digests")) return false;
  for (const auto& [section, digest] : manifest["digests"].items()) {
    if (!manifest.contains(section) || json_digest(manifest[section]) != digest.get<std::string>()) return false;
  }
  return true;
}

}  // namespace vortex::bench
