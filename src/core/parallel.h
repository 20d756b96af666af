// parallel_for: the one way CPU code spreads work over cores.
//
// A process-wide pool of num_threads() - 1 workers (plus the calling thread) is created on first
// use. Its size is std::thread::hardware_concurrency(), or VORTEX_NUM_THREADS when that is set
// to a positive integer. Every CPU op threads through here and nowhere else, so that a second
// thread pool (OpenBLAS's, say) never competes with this one for the same cores.
#pragma once

#include <cstdint>
#include <functional>

namespace vortex {

// The number of threads parallel_for may use, the caller included (>= 1).
int num_threads();

// Calls fn(chunk_begin, chunk_end) over disjoint contiguous chunks that together cover
// [begin, end) exactly once, and returns when all have finished. The range is cut into at most
// num_threads() chunks of nearly equal size, each at least `grain` long, so a caller that keeps
// per-chunk scratch (or per-chunk reuse, like a converted weight block) gets at most one chunk
// per thread. Runs fn(begin, end) inline when the range is no longer than `grain`, when there is
// one thread, or when called from inside another parallel_for (nesting never deadlocks).
// Calls from several outside threads at once are served one after another.
// fn must not throw: the library reports errors through Status, never exceptions.
void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& fn,
                  int64_t grain = 1);

}  // namespace vortex
