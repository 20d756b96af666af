// CUDA runtime plumbing: error checks that become Status (with file:line), the device arena that
// holds every activation of a model, and host <-> device copies of Tensors.
//
// Device tensors are ordinary Tensors whose Storage has device = kCuda. Host-side Tensor methods
// that touch elements (contiguous(), to(), clone()) must not be called on them; the functions in
// src/cuda are the only code that reads or writes device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

Status cuda_status(cudaError_t error, const char* expr, const char* file, int line);

}  // namespace vortex::cuda

// Returns a device_error Status naming the failed call and its file:line.
#define VORTEX_CUDA_CHECK(expr)                                                               \
  do {                                                                                        \
    cudaError_t vortex_cuda_error_ = (expr);                                                  \
    if (vortex_cuda_error_ != cudaSuccess)                                                    \
      return ::vortex::cuda::cuda_status(vortex_cuda_error_, #expr, __FILE__, __LINE__);      \
  } while (0)

// After a kernel launch: surfaces launch-configuration errors as Status.
#define VORTEX_CUDA_CHECK_LAUNCH() VORTEX_CUDA_CHECK(cudaGetLastError())

namespace vortex::cuda {

// One device allocation carved up by a bump pointer. Every tensor of a model and its activations
// comes from an arena sized up front, so the step loop never calls cudaMalloc. `mark()` and
// `release_to()` scope per-step scratch; `peak()` is the high-water mark reported by the bench.
class DeviceArena {
 public:
  static constexpr size_t kAlignment = 256;  // cuBLASLt and TMA want >= 16; 256 keeps rows coalesced

  // The bytes alloc() takes for a tensor of this shape and dtype (rounded up to kAlignment): what
  // an arena is sized from.
  static size_t bytes_for(const Shape& shape, DType dtype) {
    return (static_cast<size_t>(shape.numel()) * dtype_size(dtype) + kAlignment - 1) / kAlignment * kAlignment;
  }

  static Result<DeviceArena> create(size_t bytes);
  // Scratch in `stream`'s order: allocated from the device's memory pool and freed into it (once
  // the arena and every tensor of it are gone) after the work queued on `stream` by then, so
  // neither step waits for the device the way cudaMalloc / cudaFree do. Use it on `stream` only.
  // Where the device has no memory pools it is create().
  static Result<DeviceArena> create_on_stream(size_t bytes, cudaStream_t stream);
  // The same, freed after the work queued on `last_use` instead: scratch written on `stream` and
  // read on `last_use`, which waits for `stream` first.
  static Result<DeviceArena> create_on_stream(size_t bytes, cudaStream_t stream, cudaStream_t last_use);
  // An arena over the bytes of an existing contiguous device tensor (it keeps that memory alive):
  // scratch that shares memory with a buffer whose lifetime does not overlap its own.
  static Result<DeviceArena> within(const Tensor& buffer);
  DeviceArena() = default;

  Result<Tensor> alloc(const Shape& shape, DType dtype);
  size_t mark() const { return used_; }
  void release_to(size_t mark) { used_ = mark; }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t capacity() const { return storage_ ? storage_->bytes : 0; }

 private:
  // An arena over a fresh allocation that `release` frees.
  static DeviceArena adopt(void* p, size_t bytes, const std::function<void(void*)>& release);

  std::shared_ptr<Storage> storage_;
  size_t used_ = 0;
  size_t peak_ = 0;
};

// Copies a host tensor (any strides; made contiguous first) into `dst` (contiguous, same shape and
// dtype, on the device).
Status copy_to_device(const Tensor& host, const Tensor& dst, cudaStream_t stream);
// The same through pinned staging buffers (two 32 MB halves filled in turn, each copy packed after
// the last, the transfers out of one overlapping the memcpy into the other): how checkpoint weights
// go mmap -> pinned -> device at full PCIe speed, their small scales and factors included.
// Ordered on `stream` like cudaMemcpyAsync: it returns once `host` has been read (into the pinned
// halves), without waiting for the transfers or for earlier work on `stream`; later work on
// `stream` sees dst, other streams and the host need the caller's synchronisation.
Status copy_to_device_staged(const Tensor& host, const Tensor& dst, cudaStream_t stream);
// The same for rows of a contiguous host tensor taken in runs (first row, count), one after
// another into dst: a weight made of another's rows (the original layout's fused layers' parts)
// goes from the mapping into the staging halves with no gathered copy between.
Status copy_rows_to_device_staged(const Tensor& host, const std::vector<std::pair<int64_t, int64_t>>& runs,
                                  const Tensor& dst, cudaStream_t stream);
// Allocates in the arena and copies (copy_to_device).
Result<Tensor> upload(const Tensor& host, DeviceArena& arena, cudaStream_t stream);
// Allocates in the arena and copies through the staging buffers (copy_to_device_staged: no wait).
Result<Tensor> upload_staged(const Tensor& host, DeviceArena& arena, cudaStream_t stream);
// A new contiguous host tensor holding a contiguous device tensor's bytes (synchronises `stream`).
Result<Tensor> download(const Tensor& device, cudaStream_t stream);

// "name BF16[N, H, D] strides [..] on cuda": how the ops' argument errors name a view.
std::string describe_view(const char* name, const TensorView& t);

// Name, SM count, clocks, memory and driver/runtime versions, for manifests and logs.
struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int major = 0, minor = 0;
  size_t total_memory = 0;
  int driver_version = 0, runtime_version = 0;
  int clock_khz = 0, memory_clock_khz = 0;
};
Result<DeviceInfo> device_info(int device = 0);

// Whether this build can run on device 0: the kernels are compiled for sm_90a only (wgmma, TMA,
// setmaxnreg), which runs on compute capability 9.0 and nothing else. A one-line status
// naming `flag`, the device and what it lacks (unimplemented: the request is valid, this machine
// cannot serve it), instead of a failed launch deep inside a step.
Status require_hopper_device(const std::string& flag);

// What ptxas gave a kernel (registers per thread, spills as local memory) and the shared memory it
// launches with, for manifests: the resources decide occupancy and explain a kernel's speed.
struct KernelResources {
  int registers = 0;
  size_t static_shared_bytes = 0, dynamic_shared_bytes = 0, local_bytes = 0;
  int max_threads = 0;
};
Result<KernelResources> kernel_resources(const void* kernel, size_t dynamic_shared_bytes);

}  // namespace vortex::cuda
