#include "bench/cuda_gpu_monitor.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iterator>
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
using NvmlClockEventReasons = int (*)(NvmlDevice, unsigned long long*);
constexpr int kNvmlClockSm = 1;  // nvmlClockType_t NVML_CLOCK_SM

// nvmlFieldValue_t, for the one field read: the board's instantaneous power. nvmlDeviceGetPowerUsage
// averages over about a second on Hopper, longer than one attention repetition, so its readings
// lag the work; the instantaneous field follows it. Older drivers lack it: the average is kept.
struct NvmlFieldValue {
  unsigned int field_id;
  unsigned int scope_id;
  long long timestamp;
  long long latency_us;
  int value_type;
  int nvml_return;
  union {
    double d;
    unsigned int ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
    int si;
  } value;
};
using NvmlFieldValues = int (*)(NvmlDevice, int, NvmlFieldValue*);
constexpr unsigned int kNvmlFieldPowerInstant = 186;  // NVML_FI_DEV_POWER_INSTANT, milliwatts
constexpr int kNvmlValueUnsignedInt = 1;

// Why the clock is below its maximum (nvmlClocksEventReasons bits), by the names the manifest uses.
struct ClockEventReason {
  unsigned long long bit;
  const char* name;
};
constexpr ClockEventReason kClockEventReasons[] = {
    {0x1, "gpu_idle"},          {0x2, "applications_clocks_setting"}, {0x4, "sw_power_cap"},
    {0x8, "hw_slowdown"},       {0x10, "sync_boost"},                 {0x20, "sw_thermal_slowdown"},
    {0x40, "hw_thermal_slowdown"}, {0x80, "hw_power_brake_slowdown"}, {0x100, "display_clock_setting"},
};
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
  NvmlFieldValues field_values = nullptr;             // optional
  NvmlClockEventReasons clock_event_reasons = nullptr;  // optional
  NvmlDevice device = nullptr;
  std::atomic<bool> running{false};
  std::thread thread;
  // Written by the sampling thread only, read after it joined.
  Stats clock, power;
  bool power_instant = false;  // whether every power reading was the instantaneous field
  int reason_samples = 0;
  int reason_counts[std::size(kClockEventReasons)] = {};

  void sample_power() {
    if (field_values != nullptr) {
      NvmlFieldValue field{};
      field.field_id = kNvmlFieldPowerInstant;
      if (field_values(device, 1, &field) == 0 && field.nvml_return == 0 && field.value_type == kNvmlValueUnsignedInt) {
        power.add(field.value.ui / 1000.0);
        power_instant = true;
        return;
      }
      field_values = nullptr;  // not offered by this driver: the averaged reading from now on, for every sample
      power = Stats{};
    }
    unsigned int milliwatts = 0;
    if (power_usage(device, &milliwatts) == 0) power.add(milliwatts / 1000.0);
    power_instant = false;
  }

  void sample_until_stopped() {
    while (running.load()) {
      unsigned int mhz = 0;
      if (clock_info(device, kNvmlClockSm, &mhz) == 0) clock.add(mhz);
      sample_power();
      unsigned long long reasons = 0;
      if (clock_event_reasons != nullptr && clock_event_reasons(device, &reasons) == 0) {
        ++reason_samples;
        for (size_t i = 0; i < std::size(kClockEventReasons); ++i) {
          if (reasons & kClockEventReasons[i].bit) ++reason_counts[i];
        }
      }
      std::this_thread::sleep_for(kInterval);
    }
  }

  // {reason: fraction of the samples it was active in}, the reasons seen at least once.
  nlohmann::json clock_event_fractions() const {
    if (reason_samples == 0) return nullptr;
    nlohmann::json fractions = nlohmann::json::object();
    for (size_t i = 0; i < std::size(kClockEventReasons); ++i) {
      if (reason_counts[i] > 0) fractions[kClockEventReasons[i].name] = double(reason_counts[i]) / reason_samples;
    }
    return fractions;
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
  s->field_values = reinterpret_cast<NvmlFieldValues>(dlsym(s->library, "nvmlDeviceGetFieldValues"));
  // The current name first; drivers before 535 only have the older one, with the same bits.
  s->clock_event_reasons =
      reinterpret_cast<NvmlClockEventReasons>(dlsym(s->library, "nvmlDeviceGetCurrentClocksEventReasons"));
  if (s->clock_event_reasons == nullptr) {
    s->clock_event_reasons =
        reinterpret_cast<NvmlClockEventReasons>(dlsym(s->library, "nvmlDeviceGetCurrentClocksThrottleReasons"));
  }
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
  return {{"sm_clock_mhz", s.clock.to_json()},
          {"sm_clock_source", "NVML's current SM clock: the driver's setting, which the SMs run below under "
                              "the power cap (bench/notes/attention.md, session 13)"},
          {"power_w", s.power.to_json()},
          {"power_reading", s.power_instant ? "instantaneous" : "NVML's running average (about 1 s)"},
          {"clock_event_reasons", s.clock_event_fractions()},
          {"samples", s.clock.n},
          {"interval_ms", kInterval.count()}};
}

GpuMonitor::~GpuMonitor() {
  stop();
  if (state_->shutdown) state_->shutdown();
  if (state_->library) dlclose(state_->library);
}

}  // namespace vortex::bench
