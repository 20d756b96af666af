// Per-section GPU time of one run, for the bench's per-kernel breakdown: sections are bracketed
// by CUDA events on the stream (no synchronisation inside), and summed by name after the run.
// With no profiler attached, a SectionScope costs one branch.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace vortex::cuda {

class SectionProfiler {
 public:
  ~SectionProfiler() {
    for (auto& r : records_) {
      cudaEventDestroy(r.start);
      cudaEventDestroy(r.stop);
    }
  }
  void begin(const char* name, cudaStream_t stream) {
    Record r{name, nullptr, nullptr};
    cudaEventCreate(&r.start);
    cudaEventCreate(&r.stop);
    cudaEventRecord(r.start, stream);
    records_.push_back(r);
  }
  void end(cudaStream_t stream) { cudaEventRecord(records_.back().stop, stream); }
  // Milliseconds per section name, summed over occurrences (synchronises on the last event).
  std::map<std::string, double> totals() const {
    std::map<std::string, double> out;
    if (!records_.empty()) cudaEventSynchronize(records_.back().stop);
    for (const auto& r : records_) {
      float ms = 0;
      cudaEventElapsedTime(&ms, r.start, r.stop);
      out[r.name] += ms;
    }
    return out;
  }

 private:
  struct Record {
    std::string name;
    cudaEvent_t start, stop;
  };
  std::vector<Record> records_;
};

class SectionScope {
 public:
  SectionScope(SectionProfiler* profiler, const char* name, cudaStream_t stream) : profiler_(profiler), stream_(stream) {
    if (profiler_) profiler_->begin(name, stream_);
  }
  ~SectionScope() {
    if (profiler_) profiler_->end(stream_);
  }
  SectionScope(const SectionScope&) = delete;
  SectionScope& operator=(const SectionScope&) = delete;

 private:
  SectionProfiler* profiler_;
  cudaStream_t stream_;
};

}  // namespace vortex::cuda
