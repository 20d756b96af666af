// The GPUs of this process as one NCCL group: a rank per device, a host thread per rank.
//
// One process drives every GPU (the weights are loaded once from the host, the request is parsed
// once). Each rank's work runs on its own host thread with its device current and calls its own
// communicator, so a rank's code reads like the single-GPU code with the collectives inside it;
// NCCL takes one thread per communicator without grouping calls across ranks.
//
// A failure on one rank while the others wait inside a collective would hang them: run_ranks
// aborts every communicator when a rank fails (the waiting collectives return an error), and the
// group refuses further work.
//
// A group can also put every rank on one GPU (create_on_one_device): the exchanges are then device
// copies between the ranks' buffers, ordered by events and a host barrier, instead of NCCL. That
// runs the multi-GPU program, its row and head bookkeeping included, on a machine with one GPU
// (the tests do); it is not faster than one rank, and CUDA graphs cannot hold its exchanges.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "vortex/status.h"

namespace vortex::dist {

Status nccl_status(ncclResult_t result, const char* expr, const char* file, int line);

}  // namespace vortex::dist

// Returns a device_error Status naming the failed NCCL call, its file:line and NCCL's reason.
#define VORTEX_NCCL_CHECK(expr)                                                           \
  do {                                                                                    \
    ncclResult_t vortex_nccl_result_ = (expr);                                            \
    if (vortex_nccl_result_ != ncclSuccess)                                               \
      return ::vortex::dist::nccl_status(vortex_nccl_result_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace vortex::dist {

// One rank's part of an exchange with one peer: bytes it sends and bytes it receives (either may be
// zero). The peer's matching Transfer names this rank, with the two sizes swapped.
struct Transfer {
  int peer = 0;
  const void* send = nullptr;
  size_t send_bytes = 0;
  void* recv = nullptr;
  size_t recv_bytes = 0;
};

class LocalGpuGroup {
 public:
  // One rank per entry of `devices` (CUDA ordinals, distinct, each present). A single device is a
  // valid group of one (no NCCL communicator is made): the sequence-parallel code then runs the
  // single-GPU program through the same calls.
  static Result<std::unique_ptr<LocalGpuGroup>> create(const std::vector<int>& devices);
  // `ranks` ranks all on `device`, exchanging by device copies (see above).
  static Result<std::unique_ptr<LocalGpuGroup>> create_on_one_device(int device, int ranks);
  ~LocalGpuGroup();
  LocalGpuGroup(const LocalGpuGroup&) = delete;
  LocalGpuGroup& operator=(const LocalGpuGroup&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_.at(rank); }
  bool on_one_device() const { return one_device_; }

  // This rank's sends and receives as one exchange queued on `stream`: NCCL's grouped
  // point-to-point calls, or for a group on one device, copies from the peers' send buffers after
  // their streams reach the exchange. Every rank named as a peer must make the matching call.
  Status exchange(int rank, const std::vector<Transfer>& transfers, cudaStream_t stream);

  // Runs fn(rank) for every rank at once, each on its own thread with its device current. Returns
  // the first failing rank's status (its rank and device named); an NCCL group has then aborted its
  // communicators and refuses later calls (a group on one device released its barrier and goes on).
  Status run_ranks(const std::function<Status(int rank)>& fn);

 private:
  LocalGpuGroup() = default;
  Status exchange_on_one_device(int rank, const std::vector<Transfer>& transfers, cudaStream_t stream);
  // Every rank of a one-device group waits here until all have arrived; refused once a rank failed.
  Status barrier();

  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  bool broken_ = false;
  // A group on one device: what each rank posted for the current exchange, and its events (sends
  // ready; its copies from the peers done).
  bool one_device_ = false;
  std::vector<std::vector<Transfer>> posted_;
  std::vector<cudaEvent_t> ready_, copied_;
  std::mutex barrier_mutex_;
  std::condition_variable barrier_cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool failed_ = false;
};

// "0,1,3" → {0, 1, 3}; "all" → every device of this machine. Errors name the bad entry.
Result<std::vector<int>> parse_device_list(const std::string& text);

}  // namespace vortex::dist
