// Clock marks of one CTA of a key-sweep attention kernel: where a key tile's SM cycles go between
// the points the kernel marks (diagnostics for the bench and the notes). The kernels' timeline
// instances (attention_wgmma_timeline, attention_int8fp8_timeline) compute the same output as the
// shipped instances and also record clock64() at each of their events of every key tile t >= 1,
// from lane 0 of each consumer warp of one CTA. Tile 0 (the sweep's start) is not marked. They also
// mark four points of every CTA of the grid (CtaMark), so that the time outside the key sweep and
// between the CTAs an SM runs one after another can be seen.
// Plain C++: the bench's summary of a timeline (bench/timeline_json.h) builds and is tested without
// CUDA; recording one is kernel_timeline_record.h.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vortex::cuda {

// The points of a CTA's life the timeline instances mark: its start (kernel entry), its first key
// tile done (the Q load and tile 0's unoverlapped softmax behind it), its last product landed
// (the sweep done; by both consumers, the later counts), and its end (after the epilogue's stores).
enum class CtaMark : int { kStart, kFirstTile, kSweepDone, kEnd, kCount };
constexpr int kCtaMarks = static_cast<int>(CtaMark::kCount);
// Device layout of one CTA's record (after the tile marks, cta_records_offset): the SM id, then per
// mark %globaltimer (ns, one clock for the whole GPU) and clock64() (cycles of that SM).
constexpr int kCtaTraceWords = 1 + 2 * kCtaMarks;

struct CtaSpan {
  int sm = 0;
  long long ns[kCtaMarks] = {};
  long long cycles[kCtaMarks] = {};
};

struct KernelTimeline {
  std::vector<std::string> events;  // what each mark follows, in program order within a tile
  int warps = 0, tiles = 0;         // consumer warps (4 per consumer warpgroup), key tiles
  std::vector<long long> cycles;    // [warp][tile][event]; zero where nothing was recorded
  std::vector<CtaSpan> ctas;        // every CTA of the grid, blockIdx.x fastest
  int cluster_ctas = 1;             // CTAs sharing each K / V load in the recorded launch

  long long at(int warp, int tile, int event) const {
    return cycles[(static_cast<size_t>(warp) * tiles + tile) * events.size() + static_cast<size_t>(event)];
  }
};

// The CTA records follow the tile marks in the same buffer: they start at this slot.
#ifdef __CUDACC__
__host__ __device__
#endif
inline long long cta_records_offset(int warps, int tiles, int events) {
  return static_cast<long long>(warps) * tiles * events;
}

// The slot of (consumer warp, tile, event) in a [warps][tiles][events] marks buffer (device side).
#ifdef __CUDACC__
__host__ __device__
#endif
inline long long timeline_slot(int consumer_warp, int tiles, int tile, int events, int event) {
  return (static_cast<long long>(consumer_warp) * tiles + tile) * events + event;
}

}  // namespace vortex::cuda
