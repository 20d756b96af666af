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

Result<std::unique_ptr<LocalGpuGroup>> LocalGpuGroup::create_on_one_device(int device, int ranks) {
  if (ranks < 1) return invalid_argument("GPU group: " + std::to_string(ranks) + " ranks");
  VORTEX_ASSIGN_OR_RETURN(auto group, create({device}));
  group->devices_.assign(static_cast<size_t>(ranks), device);
  group->one_device_ = true;
  group->posted_.resize(static_cast<size_t>(ranks));
  group->ready_.assign(static_cast<size_t>(ranks), nullptr);
  group->copied_.assign(static_cast<size_t>(ranks), nullptr);
  VORTEX_CUDA_CHECK(cudaSetDevice(device));
  for (int r = 0; r < ranks; ++r) {
    VORTEX_CUDA_CHECK(cudaEventCreateWithFlags(&group->ready_[r], cudaEventDisableTiming));
    VORTEX_CUDA_CHECK(cudaEventCreateWithFlags(&group->copied_[r], cudaEventDisableTiming));
  }
  return group;
}

LocalGpuGroup::~LocalGpuGroup() {
  for (ncclComm_t comm : comms_) {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
  for (cudaEvent_t e : ready_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : copied_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

Status LocalGpuGroup::exchange(int rank, const std::vector<Transfer>& transfers, cudaStream_t stream) {
  if (one_device_) return exchange_on_one_device(rank, transfers, stream);
  if (size() == 1) return ok_status();
  ncclComm_t comm = comms_.at(rank);
  if (comm == nullptr) return device_error("GPU group: the communicators were aborted");
  VORTEX_NCCL_CHECK(ncclGroupStart());
  for (const Transfer& t : transfers) {
    if (t.send_bytes > 0) VORTEX_NCCL_CHECK(ncclSend(t.send, t.send_bytes, ncclUint8, t.peer, comm, stream));
    if (t.recv_bytes > 0) VORTEX_NCCL_CHECK(ncclRecv(t.recv, t.recv_bytes, ncclUint8, t.peer, comm, stream));
  }
  VORTEX_NCCL_CHECK(ncclGroupEnd());
  return ok_status();
}

Status LocalGpuGroup::barrier() {
  std::unique_lock<std::mutex> lock(barrier_mutex_);
  if (failed_) return cancelled("GPU group: another rank failed");
  const uint64_t generation = generation_;
  if (++arrived_ == size()) {
    arrived_ = 0;
    ++generation_;
    barrier_cv_.notify_all();
    return ok_status();
  }
  barrier_cv_.wait(lock, [&] { return generation_ != generation || failed_; });
  if (generation_ == generation) return cancelled("GPU group: another rank failed");
  return ok_status();
}

Status LocalGpuGroup::exchange_on_one_device(int rank, const std::vector<Transfer>& transfers, cudaStream_t stream) {
  // 1. This rank's sends are ready once its stream reaches here; post them.
  VORTEX_CUDA_CHECK(cudaEventRecord(ready_[rank], stream));
  posted_[rank] = transfers;
  VORTEX_RETURN_IF_ERROR(barrier());
  // 2. Receive: copy from each peer's posted send buffer once the peer's stream got there.
  for (const Transfer& t : transfers) {
    if (t.recv_bytes == 0) continue;
    const Transfer* match = nullptr;
    for (const Transfer& p : posted_.at(t.peer)) {
      if (p.peer == rank) match = &p;
    }
    if (match == nullptr || match->send_bytes != t.recv_bytes) {
      return internal_error("GPU group exchange: rank " + std::to_string(rank) + " expects " +
                            std::to_string(t.recv_bytes) + " bytes from rank " + std::to_string(t.peer) +
                            ", which sends " + std::to_string(match ? match->send_bytes : 0));
    }
    VORTEX_CUDA_CHECK(cudaStreamWaitEvent(stream, ready_[t.peer], 0));
    VORTEX_CUDA_CHECK(cudaMemcpyAsync(t.recv, match->send, t.recv_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  VORTEX_CUDA_CHECK(cudaEventRecord(copied_[rank], stream));
  VORTEX_RETURN_IF_ERROR(barrier());
  // 3. This rank's send buffers are free again once every peer copied from them.
  for (const Transfer& t : transfers) {
    if (t.send_bytes > 0) VORTEX_CUDA_CHECK(cudaStreamWaitEvent(stream, copied_[t.peer], 0));
  }
  return ok_status();
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
        {
          // A group on one device: release the ranks waiting at its barrier.
          std::lock_guard<std::mutex> barrier_lock(barrier_mutex_);
          failed_ = one_device_;
        }
        barrier_cv_.notify_all();
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
  if (one_device_) {
    std::lock_guard<std::mutex> barrier_lock(barrier_mutex_);
    failed_ = false;  // every thread has left; the next run starts from an empty barrier
    arrived_ = 0;
  }
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
