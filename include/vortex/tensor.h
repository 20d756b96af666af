// Tensor and TensorView: typed, strided views over host or device memory.
//
// A Tensor shares ownership of its storage (a heap block, a device block, an mmap'd file);
// slicing, permuting and reshaping return new Tensors over the same storage without copying.
// A TensorView is the non-owning form handed to ops and kernels: pointer, dtype, shape, strides.
// Strides and offsets count elements, not bytes. For e2m1x2 one element is one byte (two values).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "vortex/status.h"

namespace vortex {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kF8E4M3,
  kF8E5M2,
  kE2M1x2,  // two e2m1 values per byte, first in the low nibble
  kI8,
  kU8,
  kI32,
  kI64,
  kBool,
  kF64,
};

size_t dtype_size(DType dtype);
// The safetensors spelling: "F32", "BF16", "F8_E4M3", ...
const char* dtype_name(DType dtype);
Result<DType> dtype_from_name(const std::string& name);
bool dtype_is_float(DType dtype);

enum class Device : uint8_t { kCpu, kCuda };
const char* device_name(Device device);

constexpr int kMaxDims = 8;

// A small fixed-capacity list of dimension sizes (or strides).
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }
  void push_back(int64_t d) { dims_[rank_++] = d; }
  bool operator==(const Shape& other) const;
  bool operator!=(const Shape& other) const { return !(*this == other); }
  // "[2, 3, 4]"
  std::string to_string() const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

Shape contiguous_strides(const Shape& shape);

// Memory that a Tensor views: owned, borrowed from an mmap'd file, or on a device.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::kCpu;
  std::shared_ptr<void> keeper;  // releases the memory when the last Tensor lets go
};

struct TensorView {
  void* data = nullptr;  // points at element [0, 0, ...], offset already applied
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  Shape shape;
  Shape strides;

  int rank() const { return shape.rank(); }
  int64_t numel() const { return shape.numel(); }
  bool is_contiguous() const;
  template <class T>
  T* as() const { return static_cast<T*>(data); }
};

class Tensor {
 public:
  Tensor() = default;

  // Fresh host memory, 64-byte aligned; contents uninitialised / zeroed.
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  // Views memory that someone else owns; `keeper` keeps it alive (may be null for static data).
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                             int64_t offset = 0);
  // Copies a host vector into a new f32 / i64 tensor (tests and small tables).
  static Tensor from_f32(const std::vector<float>& values, const Shape& shape);
  static Tensor from_i64(const std::vector<int64_t>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::kCpu; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int rank() const { return shape_.rank(); }
  int64_t size(int dim) const { return shape_[dim < 0 ? dim + rank() : dim]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* data() const;
  template <class T>
  T* data_as() const { return static_cast<T*>(data()); }
  TensorView view() const;

  // Views (no copy). Errors are programming errors at these call sites, reported as Status.
  Result<Tensor> slice(int dim, int64_t start, int64_t end) const;
  Result<Tensor> select(int dim, int64_t index) const;  // drops `dim`
  Result<Tensor> reshape(const Shape& shape) const;     // contiguous tensors only
  Result<Tensor> permute(const std::vector<int>& order) const;
  Result<Tensor> transpose(int dim0, int dim1) const;

  // Copies (host only).
  Tensor contiguous() const;
  Result<Tensor> to(DType dtype) const;  // exact rounding rules of DESIGN section 3
  Tensor clone() const { return contiguous_copy(); }

  // "bf16[37810, 5376]"
  std::string describe() const;

 private:
  Tensor contiguous_copy() const;

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
};

// Copies `src` into `dst` element by element with dtype conversion (host tensors, same shape).
Status copy_into(const Tensor& src, const Tensor& dst);

// Reads element `i` (row-major logical index) of any float or integer tensor as double.
double element_as_double(const Tensor& t, int64_t logical_index);

}  // namespace vortex
