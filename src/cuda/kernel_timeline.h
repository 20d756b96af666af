// Clock marks of one CTA of a key-sweep attention kernel: where a key tile's SM cycles go between
// the points the kernel marks (diagnostics for the bench and the notes). The kernels' timeline
// instances (attention_wgmma_timeline, attention_int8fp8_timeline) compute the same output as the
// shipped instances and also record clock64() at each of their events of every key tile t >= 1,
// from lane 0 of each consumer warp of one CTA. Tile 0 (the sweep's start) is not marked.
// Plain C++: the bench's summary of a timeline (bench/timeline_json.h) builds and is tested without
// CUDA; recording one is kernel_timeline_record.h.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vortex::cuda {

struct KernelTimeline {
  std::vector<std::string> events;  // what each mark follows, in program order within a tile
  int warps = 0, tiles = 0;         // consumer warps (4 per consumer warpgroup), key tiles
  std::vector<long long> cycles;    // [warp][tile][event]; zero where nothing was recorded

  long long at(int warp, int tile, int event) const {
    return cycles[(static_cast<size_t>(warp) * tiles + tile) * events.size() + static_cast<size_t>(event)];
  }
};

// The slot of (consumer warp, tile, event) in a [warps][tiles][events] marks buffer (device side).
#ifdef __CUDACC__
__host__ __device__
#endif
inline long long timeline_slot(int consumer_warp, int tiles, int tile, int events, int event) {
  return (static_cast<long long>(consumer_warp) * tiles + tile) * events + event;
}

}  // namespace vortex::cuda
