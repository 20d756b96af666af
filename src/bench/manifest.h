// Run manifests (DESIGN section 4): one JSON record per benchmark run, modelled on public
// kernel-index run records. Sections: run, correctness, workload, protocol, environment,
// implementation, plus peers measured in the same process. Each section's SHA-256 is taken over
// its canonical JSON (keys sorted, no whitespace: nlohmann's dump()) and stored under "digests",
// so a manifest edited by hand no longer verifies.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vortex/status.h"

namespace vortex::bench {

struct Samples {
  std::vector<double> ms;  // one entry per timed repetition
  // The SM clock and board power while they were timed (bench/cuda_gpu_monitor.h); null when not
  // sampled.
  nlohmann::json gpu;
  double mean() const;
  double median() const;
  double min() const;
  double max() const;
};

struct Correctness {
  std::string comparator;  // what the output was compared with
  double max_abs = 0, max_rel = 0, rel_l2 = 0;
  double bound = 0;        // rel-L2 bound the check uses
  bool passed = false;
  nlohmann::json to_json() const;
};

struct Manifest {
  std::string workload;
  Samples samples;
  nlohmann::json derived = nlohmann::json::object();  // e.g. TFLOP/s from the median
  Correctness correctness;
  nlohmann::json workload_section = nlohmann::json::object();
  nlohmann::json protocol = nlohmann::json::object();
  nlohmann::json environment = nlohmann::json::object();
  nlohmann::json implementation = nlohmann::json::object();
  nlohmann::json peers = nlohmann::json::array();  // {name, median_ms, ratio_peer_over_vortex, ...}

  nlohmann::json to_json() const;  // with "digests"
};

// SHA-256 of the canonical dump of a JSON value.
std::string json_digest(const nlohmann::json& value);
// Recomputes the digests of a manifest and compares them with the stored ones.
bool verify_manifest(const nlohmann::json& manifest);
// "2026-11-29T21:03:00Z"
std::string utc_timestamp();

}  // namespace vortex::bench
