#include "bench/cuda_gpu_monitor.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace vortex::bench {

namespace {

// The few NVML entry points used, by their C ABI (nvml.h is not part of the CUDA toolkit here):
// every call returns 0 on success; clocks are in MHz, power in milliwatts.
using NvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlHandleByPciBusId = int (*)(const char*, NvmlDevice*);
using NvmlClockInfo = int (*)(NvmlDevice, int, unsigned int*);
using NvmlPowerUsage = int (*)(NvmlDevice, unsigned int*);
constexpr int kNvmlClockSm = 1;  // nvmlClockType_t NVML_CLOCK_SM
constexpr auto kInterval = std::chrono::milliseconds(20);

struct Stats {
  double sum = 0, min = 0, max = 0;
  int n = 0;
  void add(double v) {
    min = n == 0 ? v : std::min(min, v);
    max = n == 0 ? v : std::max(max, v);
    sum += v;
    ++n;
  }
  nlohmann::json to_json() const {
    if (n == 0) return nullptr;
    return {{"mean", sum / n}, {"min", min}, {"max", max}};
  }
};

}  // namespace

struct GpuMonitor::State {
  std::string unavailable;  // why there are no readings, when there are none
  void* library = nullptr;
  NvmlShutdown shutdown = nullptr;
  NvmlClockInfo clock_info = nullptr;
  NvmlPowerUsage power_usage = nullptr;
  NvmlDevice device = nullptr;
  std::atomic<bool> running{false};
  std::thread thread;
  Stats clock, power;  // written by the sampling thread only, read after it joined

  void sample_until_stopped() {
    while (running.load()) {
      unsigned int mhz = 0, milliwatts = 0;
      if (clock_info(device, kNvmlClockSm, &mhz) == 0) clock.add(mhz);
      if (power_usage(device, &milliwatts) == 0) power.add(milliwatts / 1000.0);
      std::this_thread::sleep_for(kInterval);
    }
  }
};

GpuMonitor::GpuMonitor(std::unique_ptr<State> state) : state_(std::move(state)) {}

std::unique_ptr<GpuMonitor> GpuMonitor::start(int device) {
  auto s = std::make_unique<State>();
  s->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (s->library == nullptr) {
    s->unavailable = "libnvidia-ml.so.1 could not be loaded";
    return std::unique_ptr<GpuMonitor>(new GpuMonitor(std::move(s)));
  }
  const auto init = reinterpret_cast<NvmlInit>(dlsym(s->library, "nvmlInit_v2"));
  const auto by_bus = reinterpret_cast<NvmlHandleByPciBusId>(dlsym(s->library, "nvmlDeviceGetHandleByPciBusId_v2"));
  s->shutdown = reinterpret_cast<NvmlShutdown>(dlsym(s->library, "nvmlShutdown"));
  s->clock_info = reinterpret_cast<NvmlClockInfo>(dlsym(s->library, "nvmlDeviceGetClockInfo"));
  s->power_usage = reinterpret_cast<NvmlPowerUsage>(dlsym(s->library, "nvmlDeviceGetPowerUsage"));
  char bus_id[32] = {};
  if (!init || !by_bus || !s->shutdown || !s->clock_info || !s->power_usage) {
    s->unavailable = "libnvidia-ml.so.1 lacks an entry point";
  } else if (init() != 0) {
    s->unavailable = "nvmlInit failed";
    s->shutdown = nullptr;
  } else if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess ||
             by_bus(bus_id, &s->device) != 0) {
    s->unavailable = "no NVML handle for CUDA device " + std::to_string(device);
  } else {
    s->running = true;
    State* raw = s.get();
    s->thread = std::thread([raw] { raw->sample_until_stopped(); });
  }
  return std::unique_ptr<GpuMonitor>(new GpuMonitor(std::move(s)));
}

nlohmann::json GpuMonitor::stop() {
  State& s = *state_;
  if (s.running.exchange(false)) s.thread.join();
  if (!s.unavailable.empty()) return {{"unavailable", s.unavailable}};
  return {{"sm_clock_mhz", s.clock.to_json()}, {"power_w", s.power.to_json()}, {"samples", s.clock.n},
          {"interval_ms", kInterval.count()}};
}

GpuMonitor::~GpuMonitor() {
  stop();
  if (state_->shutdown) state_->shutdown();
  if (state_->library) dlclose(state_->library);
}

}  // namespace vortex::bench
