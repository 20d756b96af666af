#include "dist/local_gpu_group.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <thread>

#include "cuda/runtime.h"

namespace vortex::dist {

Status nccl_status(ncclResult_t result, const char* expr, const char* file, int line) {
  return device_error(std::string("NCCL ") + ncclGetErrorString(result) + " from " + expr + " at " + file + ":" +
                      std::to_string(line) + (result == ncclSystemError || result == ncclInternalError
                                                  ? std::string(" (") + ncclGetLastError(nullptr) + ")"
                                                  : std::string()));
}

Result<std::unique_ptr<LocalGpuGroup>> LocalGpuGroup::create(const std::vector<int>& devices) {
  if (devices.empty()) return invalid_argument("GPU group: no devices given");
  int count = 0;
  VORTEX_CUDA_CHECK(cudaGetDeviceCount(&count));
  std::set<int> seen;
  for (const int d : devices) {
    if (d < 0 || d >= count) {
      return invalid_argument("GPU group: device " + std::to_string(d) + " does not exist (this machine has " +
                              std::to_string(count) + ")");
    }
    if (!seen.insert(d).second) return invalid_argument("GPU group: device " + std::to_string(d) + " named twice");
  }
  std::unique_ptr<LocalGpuGroup> group(new LocalGpuGroup());
  group->devices_ = devices;
  if (devices.size() > 1) {
    group->comms_.resize(devices.size());
    VORTEX_NCCL_CHECK(ncclCommInitAll(group->comms_.data(), static_cast<int>(devices.size()), devices.data()));
  }
  return group;
}

LocalGpuGroup::~LocalGpuGroup() {
  for (ncclComm_t comm : comms_) {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
}

Status LocalGpuGroup::run_ranks(const std::function<Status(int rank)>& fn) {
  if (broken_) return device_error("GPU group: a rank failed earlier and the communicators were aborted");
  std::vector<Status> results(devices_.size());
  std::mutex failure_mutex;
  int origin = -1;  // the rank that failed first: the others' errors may be the aborted collectives it caused
  const auto run = [&](int rank) {
    Status status = [&]() -> Status {
      VORTEX_CUDA_CHECK(cudaSetDevice(devices_[rank]));
      return fn(rank);
    }();
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (origin < 0) {
        origin = rank;
        // The other ranks may be waiting for this one inside a collective: abort every
        // communicator so that their calls return instead of hanging.
        for (ncclComm_t& comm : comms_) {
          ncclCommAbort(comm);
          comm = nullptr;
        }
        broken_ = !comms_.empty();
      }
    }
    results[rank] = std::move(status);
  };
  if (devices_.size() == 1) {
    run(0);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(devices_.size());
    for (int rank = 0; rank < size(); ++rank) threads.emplace_back(run, rank);
    for (std::thread& t : threads) t.join();
  }
  if (origin < 0) return ok_status();
  return results[origin].with_context("rank " + std::to_string(origin) + " (device " + std::to_string(devices_[origin]) +
                                      ")");
}

Result<std::vector<int>> parse_device_list(const std::string& text) {
  if (text == "all") {
    int count = 0;
    VORTEX_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<int> all(count);
    for (int i = 0; i < count; ++i) all[i] = i;
    return all;
  }
  std::vector<int> devices;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const bool digits = !item.empty() && item.size() <= 4 &&
                        std::all_of(item.begin(), item.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits) {
      return invalid_argument("device list \"" + text + "\": entry " + std::to_string(devices.size() + 1) + " (\"" +
                              item + "\") is not a device number (give e.g. 0,1 or all)");
    }
    devices.push_back(std::stoi(item));
    start = comma + 1;
  }
  return devices;
}

}  // namespace vortex::dist
