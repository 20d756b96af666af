// Clock marks of one CTA of a key-sweep attention kernel (diagnostics for the bench and notes):
// where a key tile's SM cycles go between the points a kernel marks. The kernels' timeline
// instances (attention_wgmma_timeline, attention_int8fp8_timeline) compute the same output as the
// shipped instances and also record clock64() at each of their events of every key tile t >= 1,
// from lane 0 of each consumer warp of one CTA. Tile 0 (the sweep's start) is not marked.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "vortex/status.h"

namespace vortex::cuda {

struct KernelTimeline {
  std::vector<std::string> events;  // what each mark follows, in program order within a tile
  int warps = 0, tiles = 0;         // consumer warps (4 per consumer warpgroup), key tiles
  std::vector<long long> cycles;    // [warp][tile][event]; zero where nothing was recorded

  long long at(int warp, int tile, int event) const {
    return cycles[(static_cast<size_t>(warp) * tiles + tile) * events.size() + static_cast<size_t>(event)];
  }
};

// Device side: the slot of (consumer warp, tile, event) in a [warps][tiles][events] marks buffer.
__host__ __device__ inline long long timeline_slot(int consumer_warp, int tiles, int tile, int events, int event) {
  return (static_cast<long long>(consumer_warp) * tiles + tile) * events + event;
}

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
