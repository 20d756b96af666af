#include "cuda/runtime.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/byte_pieces.h"
#include "core/parallel.h"

namespace vortex::cuda {

Status cuda_status(cudaError_t error, const char* expr, const char* file, int line) {
  return device_error(std::string(cudaGetErrorName(error)) + " (" + cudaGetErrorString(error) + ") from " + expr +
                      " at " + file + ":" + std::to_string(line));
}

Result<DeviceArena> DeviceArena::create(size_t bytes) {
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, bytes);
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not blamed for it
    return out_of_memory("device arena of " + std::to_string(bytes) + " bytes does not fit on the device");
  }
  if (error != cudaSuccess) return cuda_status(error, "cudaMalloc (device arena)", __FILE__, __LINE__);
  return adopt(p, bytes, [](void* q) { cudaFree(q); });
}

DeviceArena DeviceArena::adopt(void* p, size_t bytes, const std::function<void(void*)>& release) {
  DeviceArena arena;
  arena.storage_ = std::make_shared<Storage>();
  arena.storage_->data = p;
  arena.storage_->bytes = bytes;
  arena.storage_->device = Device::kCuda;
  arena.storage_->keeper = std::shared_ptr<void>(p, release);
  return arena;
}

Result<DeviceArena> DeviceArena::create_on_stream(size_t bytes, cudaStream_t stream) {
  return create_on_stream(bytes, stream, stream);
}

Result<DeviceArena> DeviceArena::create_on_stream(size_t bytes, cudaStream_t stream, cudaStream_t last_use) {
  int device = 0, pools = 0;
  VORTEX_CUDA_CHECK(cudaGetDevice(&device));
  VORTEX_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
  if (!pools) return create(bytes);
  void* p = nullptr;
  const cudaError_t error = cudaMallocAsync(&p, bytes, stream);
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return out_of_memory("stream-ordered device scratch of " + std::to_string(bytes) + " bytes does not fit on the device");
  }
  if (error != cudaSuccess) return cuda_status(error, "cudaMallocAsync (device arena)", __FILE__, __LINE__);
  return adopt(p, bytes, [last_use](void* q) { cudaFreeAsync(q, last_use); });
}

Result<DeviceArena> DeviceArena::within(const Tensor& buffer) {
  if (buffer.device() != Device::kCuda || !buffer.is_contiguous() ||
      reinterpret_cast<uintptr_t>(buffer.data()) % kAlignment != 0) {
    return invalid_argument("DeviceArena::within needs a contiguous, " + std::to_string(kAlignment) +
                            "-byte aligned device tensor, got " + buffer.describe());
  }
  DeviceArena arena;
  arena.storage_ = std::make_shared<Storage>();
  arena.storage_->data = buffer.data();
  arena.storage_->bytes = buffer.nbytes();
  arena.storage_->device = Device::kCuda;
  arena.storage_->keeper = buffer.storage()->keeper;
  return arena;
}

Result<Tensor> DeviceArena::alloc(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  const size_t start = (used_ + kAlignment - 1) / kAlignment * kAlignment;
  if (!storage_ || start + bytes > storage_->bytes) {
    return out_of_memory("device arena exhausted: " + std::to_string(bytes) + " bytes for " + shape.to_string() +
                         " with " + std::to_string(capacity() - std::min(capacity(), start)) + " left of " +
                         std::to_string(capacity()));
  }
  used_ = start + bytes;
  peak_ = std::max(peak_, used_);
  const size_t esize = dtype_size(dtype);
  // Storage offsets count elements; every allocation start is a multiple of 256 bytes, so of esize.
  return Tensor::from_storage(storage_, shape, dtype, static_cast<int64_t>(start / esize));
}

Status copy_to_device(const Tensor& host, const Tensor& dst, cudaStream_t stream) {
  if (host.device() != Device::kCpu || dst.device() != Device::kCuda) {
    return invalid_argument("copy_to_device: needs a host source and a device destination");
  }
  if (host.shape() != dst.shape() || host.dtype() != dst.dtype() || !dst.is_contiguous()) {
    return invalid_argument("copy_to_device: " + host.describe() + " into " + dst.describe());
  }
  const Tensor src = host.contiguous();
  VORTEX_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyHostToDevice, stream));
  // The source may be a temporary: wait before it goes away.
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream));
  return ok_status();
}

namespace {

// Copies the bytes of `pieces` into dst (contiguous, as many bytes) through the staging halves.
Status stage_to_device(const BytePieces& pieces, const Tensor& dst, cudaStream_t stream) {
  constexpr size_t kHalf = 32u << 20;
  constexpr int64_t kStagingGrain = 1 << 20;  // below a MB a thread's start costs more than its copy
  // The two halves fill one after the other, each copy packed where the last one ended (a small
  // copy, such as a weight's scales between two weights, takes only its bytes): the host fills one
  // half while the other's transfers run. Starting every copy on a fresh half instead left the
  // transfers idle behind each small copy while the host filled the next half (a quantized
  // weight's scales cost a chunk's memcpy each: session 57, bench/notes/dequantize_weights.md).
  struct Staging {
    std::mutex busy;
    void* pinned = nullptr;
    size_t half = 0;  // the half being filled
    size_t used = 0;  // its bytes handed to transfers since it was entered
    // The transfers out of each half, one event each (on their own streams), waited for before the
    // half is filled again; spent events are kept for reuse. Events of the device the area serves.
    std::vector<cudaEvent_t> pending[2];
    std::vector<cudaEvent_t> spare;
  };
  // One staging area per device, made on first use and kept: weight loading and the video VAE
  // encoder's pixel upload call it, and the ranks of a sequence-parallel group load theirs at once,
  // each on its own thread and device.
  static std::mutex registry_mutex;
  static std::map<int, std::unique_ptr<Staging>> registry;
  int device_id = 0;
  VORTEX_CUDA_CHECK(cudaGetDevice(&device_id));
  Staging* area = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    std::unique_ptr<Staging>& slot = registry[device_id];
    if (!slot) slot = std::make_unique<Staging>();
    area = slot.get();
  }
  std::lock_guard<std::mutex> busy(area->busy);
  Staging& staging = *area;
  if (!staging.pinned) VORTEX_CUDA_CHECK(cudaMallocHost(&staging.pinned, 2 * kHalf));
  char* out = static_cast<char*>(dst.data());
  const size_t total = pieces.size();
  for (size_t offset = 0; offset < total;) {
    if (staging.used == kHalf) {  // full: on to the other half, once its transfers are done
      staging.half ^= 1;
      staging.used = 0;
      for (cudaEvent_t e : staging.pending[staging.half]) {
        VORTEX_CUDA_CHECK(cudaEventSynchronize(e));
        staging.spare.push_back(e);
      }
      staging.pending[staging.half].clear();
    }
    const size_t bytes = std::min(kHalf - staging.used, total - offset);
    char* buffer = static_cast<char*>(staging.pinned) + staging.half * kHalf + staging.used;
    // One thread's memcpy into pinned memory ran ~5 GB/s on the GPU machine's host (the video VAE
    // encoder's 210 MB of clip pixels: 52 ms), below the transfer it feeds: the cores share it.
    parallel_for(
        0, static_cast<int64_t>(bytes),
        [&](int64_t begin, int64_t end) {
          pieces.read(offset + static_cast<size_t>(begin), offset + static_cast<size_t>(end), buffer + begin);
        },
        kStagingGrain);
    VORTEX_CUDA_CHECK(cudaMemcpyAsync(out + offset, buffer, bytes, cudaMemcpyHostToDevice, stream));
    cudaEvent_t done = nullptr;
    if (staging.spare.empty()) {
      VORTEX_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    } else {
      done = staging.spare.back();
      staging.spare.pop_back();
    }
    staging.pending[staging.half].push_back(done);
    VORTEX_CUDA_CHECK(cudaEventRecord(done, stream));
    staging.used += bytes;
    offset += bytes;
  }
  // No wait for the transfers: the host bytes are all in pinned memory by now, so the source (maybe
  // a temporary) may go, and the caller's later work on `stream` sees dst. A wait here held the
  // video VAE encoder's host at every keyframe tile until the GPU had run the tile before, and
  // the GPU idle while the host then staged and launched the next one.
  return ok_status();
}

}  // namespace

Status copy_to_device_staged(const Tensor& host, const Tensor& dst, cudaStream_t stream) {
  if (host.device() != Device::kCpu || dst.device() != Device::kCuda || host.shape() != dst.shape() ||
      host.dtype() != dst.dtype() || !dst.is_contiguous()) {
    return invalid_argument("copy_to_device_staged: " + host.describe() + " into " + dst.describe());
  }
  const Tensor src = host.contiguous();
  BytePieces pieces;
  pieces.add(src.data(), src.nbytes());
  return stage_to_device(pieces, dst, stream);
}

Status copy_rows_to_device_staged(const Tensor& host, const std::vector<std::pair<int64_t, int64_t>>& runs,
                                  const Tensor& dst, cudaStream_t stream) {
  int64_t rows = 0;
  bool in_range = host.rank() >= 1;
  for (const auto& [first, count] : runs) {
    rows += count;
    in_range = in_range && first >= 0 && count >= 0 && first + count <= host.size(0);
  }
  Shape rows_shape = host.shape();
  if (host.rank() >= 1) rows_shape[0] = rows;
  if (host.device() != Device::kCpu || !host.is_contiguous() || dst.device() != Device::kCuda || !in_range ||
      rows_shape != dst.shape() || host.dtype() != dst.dtype() || !dst.is_contiguous()) {
    return invalid_argument("copy_rows_to_device_staged: rows of " + host.describe() + " into " + dst.describe());
  }
  const size_t row_bytes = host.size(0) == 0 ? 0 : host.nbytes() / static_cast<size_t>(host.size(0));
  return stage_to_device(BytePieces::rows(host.data(), row_bytes, runs), dst, stream);
}

Result<Tensor> upload(const Tensor& host, DeviceArena& arena, cudaStream_t stream) {
  VORTEX_ASSIGN_OR_RETURN(Tensor dst, arena.alloc(host.shape(), host.dtype()));
  VORTEX_RETURN_IF_ERROR(copy_to_device(host, dst, stream));
  return dst;
}

Result<Tensor> upload_staged(const Tensor& host, DeviceArena& arena, cudaStream_t stream) {
  VORTEX_ASSIGN_OR_RETURN(Tensor dst, arena.alloc(host.shape(), host.dtype()));
  VORTEX_RETURN_IF_ERROR(copy_to_device_staged(host, dst, stream));
  return dst;
}

Result<Tensor> download(const Tensor& device, cudaStream_t stream) {
  if (device.device() != Device::kCuda || !device.is_contiguous()) {
    return invalid_argument("download: needs a contiguous device tensor, got " + device.describe());
  }
  Tensor host = Tensor::empty(device.shape(), device.dtype());
  VORTEX_CUDA_CHECK(cudaMemcpyAsync(host.data(), device.data(), host.nbytes(), cudaMemcpyDeviceToHost, stream));
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

std::string describe_view(const char* name, const TensorView& t) {
  return std::string(name) + " " + dtype_name(t.dtype) + t.shape.to_string() + " strides " + t.strides.to_string() +
         " on " + device_name(t.device);
}

Result<DeviceInfo> device_info(int device) {
  cudaDeviceProp prop{};
  VORTEX_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.major = prop.major;
  info.minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  VORTEX_CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  VORTEX_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  VORTEX_CUDA_CHECK(cudaDeviceGetAttribute(&info.clock_khz, cudaDevAttrClockRate, device));
  VORTEX_CUDA_CHECK(cudaDeviceGetAttribute(&info.memory_clock_khz, cudaDevAttrMemoryClockRate, device));
  return info;
}

Status require_hopper_device(const std::string& flag) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clear the sticky error for whoever asks next
    return unimplemented(flag + ": no usable CUDA device (" +
                         (error != cudaSuccess ? std::string(cudaGetErrorString(error)) : "none found") + ")");
  }
  cudaDeviceProp prop{};
  VORTEX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0) {
    return unimplemented(flag + ": device 0 is " + prop.name + " (compute capability " + std::to_string(prop.major) +
                         "." + std::to_string(prop.minor) + "); this build's kernels run on 9.0 (Hopper, sm_90a) only");
  }
  return ok_status();
}

Result<KernelResources> kernel_resources(const void* kernel, size_t dynamic_shared_bytes) {
  cudaFuncAttributes attributes{};
  VORTEX_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  KernelResources r;
  r.registers = attributes.numRegs;
  r.static_shared_bytes = attributes.sharedSizeBytes;
  r.dynamic_shared_bytes = dynamic_shared_bytes;
  r.local_bytes = attributes.localSizeBytes;
  r.max_threads = attributes.maxThreadsPerBlock;
  return r;
}

}  // namespace vortex::cuda
