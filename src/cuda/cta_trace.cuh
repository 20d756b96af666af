// Device side of the CTA records of the timeline instances (cuda/kernel_timeline.h: CtaMark and
// kCtaTraceWords): each CTA's SM and, per mark, %globaltimer and clock64().
#pragma once

#include "cuda/kernel_timeline.h"

namespace vortex::cuda {

// Records `mark` for this CTA in the timeline buffer `marks` (zeroed): [warps][tiles][events] tile
// marks, then [CTAs][kCtaTraceWords], blockIdx.x fastest. Several threads may record the same mark
// (each consumer its sweep's end): the latest counts.
__device__ __forceinline__ void cta_mark(long long* marks, int warps, int tiles, int events, CtaMark mark) {
  long long* cta_marks = marks + cta_records_offset(warps, tiles, events);
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns));
  const unsigned long long cycles = static_cast<unsigned long long>(clock64());
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
  const long long cta = static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x;
  auto* record = reinterpret_cast<unsigned long long*>(cta_marks + cta * kCtaTraceWords);
  record[0] = sm;
  const int m = static_cast<int>(mark);
  atomicMax(record + 1 + 2 * m, ns);
  atomicMax(record + 2 + 2 * m, cycles);
}

}  // namespace vortex::cuda
