#include "vortex/tensor.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/dtype.h"
#include "core/parallel.h"

namespace vortex {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kF8E5M2: return 1;
    case DType::kE2M1x2: return 1;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kBool: return 1;
    case DType::kF64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kE2M1x2: return "F4_E2M1X2";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kBool: return "BOOL";
    case DType::kF64: return "F64";
  }
  return "?";
}

Result<DType> dtype_from_name(const std::string& name) {
  static const DType kAll[] = {DType::kF32,  DType::kBF16, DType::kF16, DType::kF8E4M3,
                               DType::kF8E5M2, DType::kE2M1x2, DType::kI8, DType::kU8,
                               DType::kI32, DType::kI64, DType::kBool, DType::kF64};
  for (DType d : kAll) {
    if (name == dtype_name(d)) return d;
  }
  return invalid_argument("unknown dtype '" + name + "'");
}

bool dtype_is_float(DType dtype) {
  switch (dtype) {
    case DType::kF32: case DType::kBF16: case DType::kF16: case DType::kF8E4M3:
    case DType::kF8E5M2: case DType::kE2M1x2: case DType::kF64:
      return true;
    default:
      return false;
  }
}

const char* device_name(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

// ---- Shape ---------------------------------------------------------------------------------------

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

Shape::Shape(const std::vector<int64_t>& dims) {
  for (int64_t d : dims) push_back(d);
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  return rank_ == other.rank_ && std::equal(begin(), end(), other.begin());
}

std::string Shape::to_string() const {
  std::ostringstream out;
  out << '[';
  for (int i = 0; i < rank_; ++i) out << (i ? ", " : "") << dims_[i];
  out << ']';
  return out.str();
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides = shape;
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

static bool strides_are_contiguous(const Shape& shape, const Shape& strides) {
  int64_t expected = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

bool TensorView::is_contiguous() const { return strides_are_contiguous(shape, strides); }

// ---- Tensor --------------------------------------------------------------------------------------

static std::shared_ptr<Storage> allocate_host(size_t bytes) {
  auto storage = std::make_shared<Storage>();
  size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  storage->data = p;
  storage->bytes = bytes;
  storage->device = Device::kCpu;
  storage->keeper = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return storage;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  Tensor t;
  t.storage_ = allocate_host(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                            int64_t offset) {
  Tensor t;
  t.storage_ = std::move(storage);
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.offset_ = offset;
  return t;
}

Tensor Tensor::from_f32(const std::vector<float>& values, const Shape& shape) {
  Tensor t = empty(shape, DType::kF32);
  std::memcpy(t.data(), values.data(), std::min(values.size() * 4, t.nbytes()));
  return t;
}

Tensor Tensor::from_i64(const std::vector<int64_t>& values, const Shape& shape) {
  Tensor t = empty(shape, DType::kI64);
  std::memcpy(t.data(), values.data(), std::min(values.size() * 8, t.nbytes()));
  return t;
}

bool Tensor::is_contiguous() const { return strides_are_contiguous(shape_, strides_); }

void* Tensor::data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

TensorView Tensor::view() const {
  TensorView v;
  v.data = data();
  v.dtype = dtype_;
  v.device = device();
  v.shape = shape_;
  v.strides = strides_;
  return v;
}

static Status check_dim(const Tensor& t, int& dim, const char* op) {
  if (dim < 0) dim += t.rank();
  if (dim < 0 || dim >= t.rank()) {
    return invalid_argument(std::string(op) + ": dim out of range for " + t.describe());
  }
  return ok_status();
}

Result<Tensor> Tensor::slice(int dim, int64_t start, int64_t end) const {
  VORTEX_RETURN_IF_ERROR(check_dim(*this, dim, "slice"));
  if (start < 0 || end < start || end > shape_[dim]) {
    return invalid_argument("slice [" + std::to_string(start) + ", " + std::to_string(end) +
                            ") out of range for dim " + std::to_string(dim) + " of " + describe());
  }
  Tensor t = *this;
  t.offset_ += start * strides_[dim];
  t.shape_[dim] = end - start;
  return t;
}

Result<Tensor> Tensor::select(int dim, int64_t index) const {
  VORTEX_RETURN_IF_ERROR(check_dim(*this, dim, "select"));
  if (index < 0 || index >= shape_[dim]) {
    return invalid_argument("select index " + std::to_string(index) + " out of range for " + describe());
  }
  Tensor t = *this;
  t.offset_ += index * strides_[dim];
  Shape shape, strides;
  for (int i = 0; i < rank(); ++i) {
    if (i == dim) continue;
    shape.push_back(shape_[i]);
    strides.push_back(strides_[i]);
  }
  t.shape_ = shape;
  t.strides_ = strides;
  return t;
}

Result<Tensor> Tensor::reshape(const Shape& shape) const {
  if (shape.numel() != numel()) {
    return invalid_argument("reshape " + describe() + " to " + shape.to_string() + ": element count differs");
  }
  if (!is_contiguous()) return invalid_argument("reshape of non-contiguous " + describe());
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Result<Tensor> Tensor::permute(const std::vector<int>& order) const {
  if (static_cast<int>(order.size()) != rank()) {
    return invalid_argument("permute: order has " + std::to_string(order.size()) + " entries for " + describe());
  }
  std::vector<bool> seen(rank(), false);
  Tensor t = *this;
  Shape shape, strides;
  for (int d : order) {
    if (d < 0 || d >= rank() || seen[d]) return invalid_argument("permute: bad order for " + describe());
    seen[d] = true;
    shape.push_back(shape_[d]);
    strides.push_back(strides_[d]);
  }
  t.shape_ = shape;
  t.strides_ = strides;
  return t;
}

Result<Tensor> Tensor::transpose(int dim0, int dim1) const {
  VORTEX_RETURN_IF_ERROR(check_dim(*this, dim0, "transpose"));
  VORTEX_RETURN_IF_ERROR(check_dim(*this, dim1, "transpose"));
  std::vector<int> order(rank());
  for (int i = 0; i < rank(); ++i) order[i] = i;
  std::swap(order[dim0], order[dim1]);
  return permute(order);
}

// Row-major walk over the first `dims` dimensions of a strided shape: the element offset of the
// current index, stepped one position at a time (an odometer: no division per step).
class StridedWalk {
 public:
  // Starts at row-major position `start` of those dimensions.
  StridedWalk(const Shape& shape, const Shape& strides, int dims, int64_t start)
      : shape_(shape), strides_(strides), dims_(dims) {
    for (int d = dims - 1; d >= 0; --d) {
      index_[d] = start % shape[d];
      start /= shape[d];
      offset_ += index_[d] * strides[d];
    }
  }
  int64_t offset() const { return offset_; }
  void next() {
    for (int d = dims_ - 1; d >= 0; --d) {
      if (++index_[d] < shape_[d]) {
        offset_ += strides_[d];
        return;
      }
      offset_ -= (shape_[d] - 1) * strides_[d];
      index_[d] = 0;
    }
  }

 private:
  const Shape& shape_;
  const Shape& strides_;
  int dims_;
  std::array<int64_t, kMaxDims> index_{};
  int64_t offset_ = 0;
};

// Calls fn(logical_index, element_offset) for every element in row-major logical order.
template <class Fn>
static void for_each_offset(const Shape& shape, const Shape& strides, Fn fn) {
  const int64_t n = shape.numel();
  if (n == 0) return;
  StridedWalk walk(shape, strides, shape.rank(), 0);
  for (int64_t i = 0; i < n; ++i, walk.next()) fn(i, walk.offset());
}

// A strided view's elements in row-major order into dst, a row of the innermost dimension at a
// time (element by element through a generic copy this cost ~4 ns an element: 12 ms for one
// 3 x 17 x 256 x 256 tile's channels-last permute in the video VAE encoder), the rows spread over
// the cores. T is a type of the element's size: only bits move.
template <class T>
static void copy_rows(const T* src, T* dst, const Shape& shape, const Shape& strides) {
  const int rank = shape.rank();
  const int64_t inner = shape[rank - 1], step = strides[rank - 1], rows = shape.numel() / inner;
  const auto copy = [&](int64_t r0, int64_t r1) {
    StridedWalk walk(shape, strides, rank - 1, r0);  // over the rows
    for (int64_t row = r0; row < r1; ++row, walk.next()) {
      const T* s = src + walk.offset();
      T* o = dst + row * inner;
      for (int64_t j = 0; j < inner; ++j) o[j] = s[j * step];
    }
  };
  parallel_for(0, rows, copy, std::max<int64_t>(1, (int64_t{1} << 16) / inner));
}

Tensor Tensor::contiguous_copy() const {
  Tensor out = empty(shape_, dtype_);
  if (is_contiguous()) {
    std::memcpy(out.data(), data(), nbytes());
    return out;
  }
  if (numel() == 0) return out;
  const void* src = data();
  void* dst = out.data();
  switch (dtype_size(dtype_)) {
    case 1: copy_rows(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), shape_, strides_); break;
    case 2: copy_rows(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), shape_, strides_); break;
    case 4: copy_rows(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), shape_, strides_); break;
    default: copy_rows(static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), shape_, strides_); break;
  }
  return out;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : contiguous_copy(); }

static double load_as_double(const void* p, DType dtype) {
  switch (dtype) {
    case DType::kF32: return *static_cast<const float*>(p);
    case DType::kBF16: return bf16_bits_to_f32(*static_cast<const uint16_t*>(p));
    case DType::kF16: return f16_bits_to_f32(*static_cast<const uint16_t*>(p));
    case DType::kF8E4M3: return e4m3_bits_to_f32(*static_cast<const uint8_t*>(p));
    case DType::kF8E5M2: return e5m2_bits_to_f32(*static_cast<const uint8_t*>(p));
    case DType::kE2M1x2: return e2m1_code_to_f32(*static_cast<const uint8_t*>(p) & 0xF);
    case DType::kI8: return *static_cast<const int8_t*>(p);
    case DType::kU8: return *static_cast<const uint8_t*>(p);
    case DType::kI32: return *static_cast<const int32_t*>(p);
    case DType::kI64: return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::kBool: return *static_cast<const uint8_t*>(p) ? 1.0 : 0.0;
    case DType::kF64: return *static_cast<const double*>(p);
  }
  return 0.0;
}

// Stores v with the rounding rules of DESIGN section 3. Floats narrower than f32 round from the
// f32 value (the only path the runtime uses); f64 -> f32 rounds once, as the C++ cast does.
static void store_from_double(void* p, DType dtype, double v) {
  const float f = static_cast<float>(v);
  switch (dtype) {
    case DType::kF32: *static_cast<float*>(p) = f; break;
    case DType::kBF16: *static_cast<uint16_t*>(p) = f32_to_bf16_bits(f); break;
    case DType::kF16: *static_cast<uint16_t*>(p) = f32_to_f16_bits(f); break;
    case DType::kF8E4M3: *static_cast<uint8_t*>(p) = f32_to_e4m3_bits(f); break;
    case DType::kF8E5M2: *static_cast<uint8_t*>(p) = f32_to_e5m2_bits(f); break;
    case DType::kE2M1x2: *static_cast<uint8_t*>(p) = f32_to_e2m1_code(f); break;
    case DType::kI8: *static_cast<int8_t*>(p) = static_cast<int8_t>(v); break;
    case DType::kU8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v); break;
    case DType::kI32: *static_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case DType::kI64: *static_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case DType::kBool: *static_cast<uint8_t*>(p) = v != 0.0; break;
    case DType::kF64: *static_cast<double*>(p) = v; break;
  }
}

// n contiguous elements converted with the rules of load_as_double / store_from_double. The two
// conversions every upload and download makes (f32 <-> bf16) get loops of their own: through the
// generic pair they cost 72 ms for one keyframe's 6.2 M patch values (bench/notes/vision_tower.md).
static void convert_dense(const char* s, DType from, char* d, DType to, int64_t n) {
  constexpr int64_t kGrain = 1 << 16;
  const int64_t ss = static_cast<int64_t>(dtype_size(from)), ds = static_cast<int64_t>(dtype_size(to));
  parallel_for(0, n, [&](int64_t begin, int64_t end) {
    if (from == DType::kF32 && to == DType::kBF16) {
      const float* x = reinterpret_cast<const float*>(s);
      uint16_t* y = reinterpret_cast<uint16_t*>(d);
      for (int64_t i = begin; i < end; ++i) y[i] = f32_to_bf16_bits(x[i]);
    } else if (from == DType::kBF16 && to == DType::kF32) {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(s);
      float* y = reinterpret_cast<float*>(d);
      for (int64_t i = begin; i < end; ++i) y[i] = bf16_bits_to_f32(x[i]);
    } else {
      for (int64_t i = begin; i < end; ++i) store_from_double(d + i * ds, to, load_as_double(s + i * ss, from));
    }
  }, kGrain);
}

Status copy_into(const Tensor& src, const Tensor& dst) {
  if (src.shape() != dst.shape()) {
    return invalid_argument("copy " + src.describe() + " into " + dst.describe() + ": shapes differ");
  }
  if (src.device() != Device::kCpu || dst.device() != Device::kCpu) {
    return invalid_argument("copy_into works on host tensors only");
  }
  if (src.dtype() == DType::kE2M1x2 || dst.dtype() == DType::kE2M1x2) {
    if (src.dtype() != dst.dtype()) return unimplemented("e2m1x2 conversion needs the packing helpers");
  }
  const char* s = static_cast<const char*>(src.data());
  char* d = static_cast<char*>(dst.data());
  const int64_t ss = static_cast<int64_t>(dtype_size(src.dtype()));
  const int64_t ds = static_cast<int64_t>(dtype_size(dst.dtype()));
  const bool same = src.dtype() == dst.dtype();
  if (same && src.is_contiguous() && dst.is_contiguous()) {  // the common case: one move, not one per element
    std::memmove(d, s, src.nbytes());
    return ok_status();
  }
  if (src.is_contiguous() && dst.is_contiguous()) {  // a conversion: one dense pass over all cores
    convert_dense(s, src.dtype(), d, dst.dtype(), src.numel());
    return ok_status();
  }
  // Walk both tensors in logical order; the destination offsets come from a second walk.
  std::vector<int64_t> dst_offsets(static_cast<size_t>(dst.numel()));
  for_each_offset(dst.shape(), dst.strides(), [&](int64_t i, int64_t off) { dst_offsets[i] = off; });
  for_each_offset(src.shape(), src.strides(), [&](int64_t i, int64_t off) {
    if (same) {
      std::memcpy(d + dst_offsets[i] * ds, s + off * ss, ss);
    } else {
      store_from_double(d + dst_offsets[i] * ds, dst.dtype(), load_as_double(s + off * ss, src.dtype()));
    }
  });
  return ok_status();
}

Result<Tensor> Tensor::to(DType dtype) const {
  Tensor out = empty(shape_, dtype);
  VORTEX_RETURN_IF_ERROR(copy_into(*this, out));
  return out;
}

double element_as_double(const Tensor& t, int64_t logical_index) {
  int64_t off = 0, rem = logical_index;
  for (int d = t.rank() - 1; d >= 0; --d) {
    off += (rem % t.shape()[d]) * t.strides()[d];
    rem /= t.shape()[d];
  }
  const char* p = static_cast<const char*>(t.data()) + off * static_cast<int64_t>(dtype_size(t.dtype()));
  return load_as_double(p, t.dtype());
}

std::string Tensor::describe() const {
  std::string name = dtype_name(dtype_);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name + shape_.to_string();
}

}  // namespace vortex
