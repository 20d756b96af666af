// What the GPU ran at while a measurement was timed: the SM clock and the board power, sampled
// every 20 ms through NVML on a background thread, with the reasons the driver gives for a
// clock below its maximum. Under sustained load the H200 holds its 700 W
// cap by lowering the SM clock to 1.45-1.75 GHz (bench/notes/attention.md), so a median means
// little without the clock it was taken at; manifests carry this next to the samples. The clock
// NVML reports is the one the driver set: under the cap the SMs run slower than it (exact attention
// at ~1.5 GHz while NVML says ~1.7; the attention timeline's clock_mhz measures the SMs' own).
//
// NVML is the driver's library (libnvidia-ml.so.1), loaded with dlopen when a monitor starts:
// machines without a driver build and run everything else, and the monitor then reports that it
// had no readings.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

namespace vortex::bench {

class GpuMonitor {
 public:
  // Starts sampling CUDA device `device`; never fails (a monitor without NVML records nothing).
  static std::unique_ptr<GpuMonitor> start(int device);
  ~GpuMonitor();
  // Stops sampling: {"sm_clock_mhz": {mean, min, max}, "sm_clock_source", "power_w": {mean, min, max}, "power_reading":
  // instantaneous or averaged, "clock_event_reasons": {reason: fraction of samples} (why the clock
  // was below its maximum, e.g. "sw_power_cap"), "samples": n, "interval_ms": 20}, or
  // {"unavailable": why}.
  nlohmann::json stop();

 private:
  struct State;
  explicit GpuMonitor(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace vortex::bench
