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

// Host side: allocates the marks buffer for `warps` × `tiles` × events.size() tile marks followed
// by `ctas` CTA records (kCtaTraceWords each), runs `launch(marks)`, and downloads both
// (synchronizes `stream`).
template <typename Launch>
Result<KernelTimeline> record_timeline(std::vector<std::string> events, int warps, int tiles, int ctas,
                                       cudaStream_t stream, Launch&& launch) {
  KernelTimeline timeline;
  timeline.events = std::move(events);
  timeline.warps = warps;
  timeline.tiles = tiles;
  const size_t count =
      static_cast<size_t>(cta_records_offset(warps, tiles, static_cast<int>(timeline.events.size())));
  const size_t cta_words = static_cast<size_t>(ctas) * kCtaTraceWords;
  const size_t bytes = (count + cta_words) * sizeof(long long);
  long long* marks = nullptr;
  // A diagnostic outside any step loop: its own small allocation.
  if (cudaMalloc(&marks, bytes) != cudaSuccess) {
    cudaGetLastError();
    return out_of_memory("kernel timeline: cannot allocate " + std::to_string(bytes) + " bytes of marks");
  }
  std::vector<long long> host(count + cta_words);
  const Status status = [&]() -> Status {
    if (cudaMemsetAsync(marks, 0, bytes, stream) != cudaSuccess) {
      return device_error("kernel timeline: cudaMemsetAsync failed");
    }
    VORTEX_RETURN_IF_ERROR(launch(marks));
    if (cudaMemcpyAsync(host.data(), marks, bytes, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      return device_error("kernel timeline: downloading the marks failed");
    }
    return ok_status();
  }();
  cudaFree(marks);
  VORTEX_RETURN_IF_ERROR(status);
  timeline.cycles.assign(host.begin(), host.begin() + static_cast<std::ptrdiff_t>(count));
  timeline.ctas.resize(static_cast<size_t>(ctas));
  for (size_t c = 0; c < timeline.ctas.size(); ++c) {
    const long long* record = host.data() + count + c * kCtaTraceWords;
    CtaSpan& span = timeline.ctas[c];
    span.sm = static_cast<int>(record[0]);
    for (int m = 0; m < kCtaMarks; ++m) {
      span.ns[m] = record[1 + 2 * m];
      span.cycles[m] = record[2 + 2 * m];
    }
  }
  return timeline;
}

}  // namespace vortex::cuda
