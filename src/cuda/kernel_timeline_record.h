// Records a kernel timeline (cuda/kernel_timeline.h): the host side the timeline instances share.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernel_timeline.h"
#include "vortex/status.h"

namespace vortex::cuda {

// Host side: allocates the marks buffer for `warps` × `tiles` × events.size(), runs `launch` with
// it, and downloads the marks (synchronizes `stream`).
template <typename Launch>
Result<KernelTimeline> record_timeline(std::vector<std::string> events, int warps, int tiles, cudaStream_t stream,
                                       Launch&& launch) {
  KernelTimeline timeline;
  timeline.events = std::move(events);
  timeline.warps = warps;
  timeline.tiles = tiles;
  const size_t count = static_cast<size_t>(warps) * tiles * timeline.events.size();
  long long* marks = nullptr;
  // A diagnostic outside any step loop: its own small allocation.
  if (cudaMalloc(&marks, count * sizeof(long long)) != cudaSuccess) {
    cudaGetLastError();
    return out_of_memory("kernel timeline: cannot allocate " + std::to_string(count * 8) + " bytes of marks");
  }
  timeline.cycles.resize(count);
  const Status status = [&]() -> Status {
    if (cudaMemsetAsync(marks, 0, count * sizeof(long long), stream) != cudaSuccess) {
      return device_error("kernel timeline: cudaMemsetAsync failed");
    }
    VORTEX_RETURN_IF_ERROR(launch(marks));
    if (cudaMemcpyAsync(timeline.cycles.data(), marks, count * sizeof(long long), cudaMemcpyDeviceToHost, stream) !=
            cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      return device_error("kernel timeline: downloading the marks failed");
    }
    return ok_status();
  }();
  cudaFree(marks);
  VORTEX_RETURN_IF_ERROR(status);
  return timeline;
}

}  // namespace vortex::cuda
