// The bench's GPU monitor (bench/cuda_gpu_monitor.h) reads plausible SM clocks and board power
// from NVML on a machine with a driver, and the driver's reasons for a clock below its maximum.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "bench/cuda_gpu_monitor.h"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

TEST(GpuMonitor, SamplesClockAndPowerWhileRunning) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto monitor = bench::GpuMonitor::start(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const nlohmann::json r = monitor->stop();
  ASSERT_FALSE(r.contains("unavailable")) << r.dump();
  EXPECT_GE(r["samples"].get<int>(), 5) << r.dump();
  const double mean_mhz = r["sm_clock_mhz"]["mean"].get<double>();
  EXPECT_GT(mean_mhz, 100.0) << r.dump();
  EXPECT_LT(mean_mhz, 4000.0) << r.dump();
  EXPECT_GT(r["power_w"]["mean"].get<double>(), 1.0) << r.dump();
  EXPECT_TRUE(r["power_reading"].is_string()) << r.dump();
  // The H200's driver names its clock event reasons; each is a fraction of the samples.
  ASSERT_TRUE(r["clock_event_reasons"].is_object()) << r.dump();
  for (const auto& [reason, fraction] : r["clock_event_reasons"].items()) {
    EXPECT_GT(fraction.get<double>(), 0.0) << reason;
    EXPECT_LE(fraction.get<double>(), 1.0) << reason;
  }
  EXPECT_EQ(monitor->stop(), r) << "a second stop reports the same readings";
}

}  // namespace
}  // namespace vortex
