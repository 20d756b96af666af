#include <gtest/gtest.h>

#include "bench/manifest.h"

namespace vortex::bench {
namespace {

TEST(BenchManifest, SectionsCarryDigestsThatDetectEdits) {
  Manifest m;
  m.workload = "unit";
  m.samples.ms = {3.0, 1.0, 2.0, 10.0};
  m.correctness = {"self", 0.0, 0.0, 1e-6, 1e-2, true};
  m.workload_section = {{"name", "unit"}, {"n", 7}};
  m.protocol = {{"warmup", 3}, {"repetitions", 4}};
  m.environment = {{"gpu", "none"}};
  m.implementation = {{"variant", "v0"}};
  nlohmann::json j = m.to_json();
  EXPECT_DOUBLE_EQ(j["run"]["median"].get<double>(), 2.5);
  EXPECT_EQ(j["run"]["primary"], "median");
  EXPECT_TRUE(verify_manifest(j));
  j["run"]["median"] = 1.0;
  EXPECT_FALSE(verify_manifest(j));
  nlohmann::json k = m.to_json();
  k["environment"]["gpu"] = "other";
  EXPECT_FALSE(verify_manifest(k));
}

TEST(BenchManifest, GpuConditionsAreRecordedWhenSampledAndCoveredByTheDigest) {
  Manifest m;
  m.workload = "unit";
  m.samples.ms = {1.0, 2.0};
  EXPECT_FALSE(m.to_json()["run"].contains("gpu_during_samples"));  // not sampled: no key
  m.samples.gpu = {{"sm_clock_mhz", {{"mean", 1612.5}, {"min", 1455}, {"max", 1980}}}, {"samples", 40}};
  nlohmann::json j = m.to_json();
  EXPECT_DOUBLE_EQ(j["run"]["gpu_during_samples"]["sm_clock_mhz"]["mean"].get<double>(), 1612.5);
  EXPECT_TRUE(verify_manifest(j));
  j["run"]["gpu_during_samples"]["sm_clock_mhz"]["mean"] = 1980;
  EXPECT_FALSE(verify_manifest(j));
}

}  // namespace
}  // namespace vortex::bench
