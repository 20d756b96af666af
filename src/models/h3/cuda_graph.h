// A CUDA graph of one piece of stream work, captured once and replayed: the 50-block stack of a
// forward is ~1,000 kernel and cuBLASLt launches whose host cost a replay replaces with one
// launch. The capture records the work's kernels and their arguments (device pointers included),
// so a graph is valid only while the work it stands for would launch exactly the same things:
// the owner keys it (shape, timesteps, attention plan) and captures again when the key changes.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>

#include "vortex/status.h"

namespace vortex::h3 {

class CapturedGraph {
 public:
  CapturedGraph() = default;
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  bool matches(const std::string& key) const { return exec_ != nullptr && key == key_; }

  // Runs `record` with `stream` pointed at a private capturing stream (restored afterwards, also
  // on failure), and keeps the instantiated graph under `key`. Nothing executes during the capture.
  Status capture(const std::string& key, cudaStream_t& stream, const std::function<Status()>& record);

  // Replays the graph on `stream`, ordered after the work already queued there.
  Status launch(cudaStream_t stream) const;

 private:
  void reset();

  std::string key_;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace vortex::h3
