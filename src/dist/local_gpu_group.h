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
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <memory>
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

class LocalGpuGroup {
 public:
  // One rank per entry of `devices` (CUDA ordinals, distinct, each present). A single device is a
  // valid group of one (no NCCL communicator is made): the sequence-parallel code then runs the
  // single-GPU program through the same calls.
  static Result<std::unique_ptr<LocalGpuGroup>> create(const std::vector<int>& devices);
  ~LocalGpuGroup();
  LocalGpuGroup(const LocalGpuGroup&) = delete;
  LocalGpuGroup& operator=(const LocalGpuGroup&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_.at(rank); }
  // nullptr for a group of one.
  ncclComm_t comm(int rank) const { return comms_.empty() ? nullptr : comms_.at(rank); }

  // Runs fn(rank) for every rank at once, each on its own thread with its device current. Returns
  // the first failing rank's status (its rank and device named); then every communicator has been
  // aborted and later calls are refused.
  Status run_ranks(const std::function<Status(int rank)>& fn);

 private:
  LocalGpuGroup() = default;
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  bool broken_ = false;
};

// "0,1,3" → {0, 1, 3}; "all" → every device of this machine. Errors name the bad entry.
Result<std::vector<int>> parse_device_list(const std::string& text);

}  // namespace vortex::dist
