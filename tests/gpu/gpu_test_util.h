// Shared helpers of the GPU tests (tests/gpu): skipping cleanly without a device, a fixture that
// owns a device arena and a stream, random host tensors with fixed seeds, host/device copies,
// strided views, and the comparison every GPU-vs-CPU test states its bound in: per-element ulp
// distance in the output dtype, max-abs, max-rel and rel-L2.
//
// Helpers that can fail throw std::runtime_error with the Status message: gtest reports an
// exception escaping a test body as a failure with that message, which keeps the tests free of
// error plumbing. (Library code never throws; tests may.)
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "cuda/runtime.h"
#include "must.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::test {

// ---- device presence -----------------------------------------------------------------------------

inline bool cuda_device_present() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) cudaGetLastError();  // no driver / no device: clear, report absent
  return error == cudaSuccess && count > 0;
}

#define VORTEX_REQUIRE_GPU()                                                                   \
  do {                                                                                         \
    if (!::vortex::test::cuda_device_present()) GTEST_SKIP() << "no CUDA device on this host"; \
  } while (0)

// ---- failure as exceptions: must() (must.h) -----------------------------------------------------

#define VORTEX_EXPECT_OK(expr)                                   \
  do {                                                           \
    const ::vortex::Status vortex_test_status_ = (expr);         \
    EXPECT_TRUE(vortex_test_status_.ok()) << vortex_test_status_.to_string(); \
  } while (0)

// ---- random host data (fixed seeds) --------------------------------------------------------------

// Normal(mean, stddev) values drawn in fp32 and rounded once into `dtype`: the counter-based
// normals of core/rng.h (key `seed`, stream 0), filled on every core. The suite draws ~10^9 of
// them; std::normal_distribution on one core spent ~40 s of each run on it.
inline Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  Tensor f = Tensor::empty(shape, DType::kF32);
  float* p = f.data_as<float>();
  constexpr int64_t kGrain = int64_t{1} << 16;
  parallel_for(0, f.numel(), [&](int64_t begin, int64_t end) {
    fill_normal(p + begin, end - begin, seed, /*stream=*/0, begin);
    for (int64_t i = begin; i < end; ++i) p[i] = mean + stddev * p[i];
  }, kGrain);
  return dtype == DType::kF32 ? f : must(f.to(dtype));
}

// Uniform(lo, hi) fp32 values (angles, tables that must stay in a range).
inline Tensor uniform_tensor(const Shape& shape, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(lo, hi);
  Tensor f = Tensor::empty(shape, DType::kF32);
  float* p = f.data_as<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = uniform(rng);
  return f;
}

// n indices uniform in [0, limit) (repetition allowed).
template <class T>
std::vector<T> random_indices(int64_t n, int64_t limit, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, limit - 1);
  std::vector<T> out(static_cast<size_t>(n));
  for (auto& v : out) v = static_cast<T>(pick(rng));
  return out;
}

// n distinct indices in [0, limit), in random order (n <= limit).
inline std::vector<int64_t> random_distinct_indices(int64_t n, int64_t limit, uint64_t seed) {
  std::vector<int64_t> all(static_cast<size_t>(limit));
  for (int64_t i = 0; i < limit; ++i) all[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(n));
  return all;
}

// Element (r, k) of a contiguous rank-2 host tensor (F32 or BF16, rounded once) set to v: the
// special values (zero, NaN, infinity, huge) a quantizer test plants in its rows or blocks.
inline void set_value(Tensor& t, int64_t r, int64_t k, float v) {
  const int64_t i = r * t.size(1) + k;
  if (t.dtype() == DType::kBF16) {
    t.data_as<uint16_t>()[i] = f32_to_bf16_bits(v);
  } else {
    t.data_as<float>()[i] = v;
  }
}

// ---- views (host or device tensors alike: pointer arithmetic only) -------------------------------

// Columns [col, col + width) of a rank-2 tensor: a [N, width] view with the parent's row stride.
inline TensorView columns(const Tensor& t, int64_t col, int64_t width) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + col * static_cast<int64_t>(dtype_size(t.dtype()));
  v.shape = Shape({t.size(0), width});
  return v;
}

// Columns [col, col + heads·dim) of a rank-2 tensor viewed as [N, heads, dim] (q or k inside a
// fused [N, 3·H·D] QKV buffer).
inline TensorView head_view(const Tensor& t, int64_t col, int64_t heads, int64_t dim) {
  TensorView v = columns(t, col, heads * dim);
  v.shape = Shape({t.size(0), heads, dim});
  v.strides = Shape({t.strides()[0], dim, 1});
  return v;
}

// ---- comparison ----------------------------------------------------------------------------------

// Monotonic integer image of a float's bits, so that the difference of two images counts the
// representable values between them (ulps in that format). Both zeros map to 0.
inline int64_t ordered_bits_f32(float f) {
  const uint32_t u = f32_bits(f);
  const int64_t mag = u & 0x7FFFFFFFu;
  return (u >> 31) ? -mag : mag;
}
inline int64_t ordered_bits_bf16(uint16_t b) {
  const int64_t mag = b & 0x7FFFu;
  return (b >> 15) ? -mag : mag;
}

// Element `i` (row-major logical index) of a host view of rank <= 8, as fp32.
inline float view_element(const TensorView& v, int64_t i) {
  int64_t off = 0, rem = i;
  for (int d = v.rank() - 1; d >= 0; --d) {
    off += (rem % v.shape[d]) * v.strides[d];
    rem /= v.shape[d];
  }
  if (v.dtype == DType::kBF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(v.data)[off]);
  return static_cast<const float*>(v.data)[off];
}

// The largest |element| of a host view (attention outputs are bounded by a multiple of max |v|).
inline double max_abs_of(const TensorView& t) {
  double m = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(view_element(t, i))));
  return m;
}

struct Comparison {
  int64_t count = 0;
  int64_t differing = 0;      // elements whose values differ (NaN == NaN and -0 == +0 count as equal)
  int64_t within_1ulp = 0;    // of those, exactly 1 ulp apart in the compared dtype
  int64_t beyond_1ulp = 0;    // more than 1 ulp apart, or finite vs non-finite
  int64_t max_ulp = 0;        // largest finite ulp distance
  int64_t nonfinite = 0;      // NaN or infinity on one side only, or infinities of opposite sign
  double max_abs = 0.0;
  double max_rel = 0.0;       // |got - want| / |want| over elements with |want| > rel_floor
  double rel_l2 = 0.0;        // ||got - want|| / ||want||
  int64_t worst = -1;         // logical index of the largest ulp distance
  float worst_got = 0.0f, worst_want = 0.0f;

  std::string summary() const {
    std::ostringstream s;
    s << count << " elements: " << differing << " differ (" << within_1ulp << " by 1 ulp, " << beyond_1ulp
      << " by more, " << nonfinite << " non-finite), max " << max_ulp << " ulp, max-abs " << max_abs << ", max-rel " << max_rel << ", rel-L2 "
      << rel_l2;
    if (worst >= 0) s << "; worst at " << worst << ": got " << worst_got << ", want " << worst_want;
    return s.str();
  }
};

// Compares two host views of the same shape and dtype (F32 or BF16), element by element.
// Elements with |want| <= rel_floor are left out of max_rel (they still count in ulps and max-abs).
inline Comparison compare(const TensorView& got, const TensorView& want, double rel_floor = 1e-30) {
  if (got.shape != want.shape || got.dtype != want.dtype) {
    throw std::runtime_error("compare: got " + got.shape.to_string() + " " + dtype_name(got.dtype) + " vs want " +
                             want.shape.to_string() + " " + dtype_name(want.dtype));
  }
  if (got.device != Device::kCpu || want.device != Device::kCpu) {
    throw std::runtime_error("compare: download device tensors first");
  }
  const bool bf16 = got.dtype == DType::kBF16;
  Comparison c;
  c.count = got.numel();
  double num = 0.0, den = 0.0;
  int64_t worst_ulps = 0;
  for (int64_t i = 0; i < c.count; ++i) {
    const float g = view_element(got, i), w = view_element(want, i);
    const bool g_nan = std::isnan(g), w_nan = std::isnan(w);
    if (g_nan && w_nan) continue;
    if (g_nan || w_nan || std::isinf(g) || std::isinf(w)) {
      if (g == w) continue;  // equal infinities
      ++c.differing;
      ++c.beyond_1ulp;
      ++c.nonfinite;
      if (c.worst < 0) {
        c.worst = i;
        c.worst_got = g;
        c.worst_want = w;
      }
      continue;  // kept out of max-abs, max-rel and rel-L2
    }
    const int64_t ulps =
        bf16 ? std::llabs(ordered_bits_bf16(f32_to_bf16_bits(g)) - ordered_bits_bf16(f32_to_bf16_bits(w)))
             : std::llabs(ordered_bits_f32(g) - ordered_bits_f32(w));
    if (ulps == 0) {
      den += static_cast<double>(w) * w;
      continue;
    }
    ++c.differing;
    if (ulps == 1) ++c.within_1ulp;
    else ++c.beyond_1ulp;
    c.max_ulp = std::max(c.max_ulp, ulps);
    if (ulps > worst_ulps && c.nonfinite == 0) {
      worst_ulps = ulps;
      c.worst = i;
      c.worst_got = g;
      c.worst_want = w;
    }
    const double diff = std::fabs(static_cast<double>(g) - w);
    c.max_abs = std::max(c.max_abs, diff);
    if (std::fabs(w) > rel_floor) c.max_rel = std::max(c.max_rel, diff / std::fabs(w));
    num += diff * diff;
    den += static_cast<double>(w) * w;
  }
  c.rel_l2 = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  return c;
}

inline Comparison compare(const Tensor& got, const Tensor& want, double rel_floor = 1e-30) {
  return compare(got.view(), want.view(), rel_floor);
}

// ---- bounds (each reports through EXPECT_*, so a test can state several) ---------------------------

// Bit-identical output: ops whose GPU code performs the CPU's fp32 operations in the CPU's order.
inline void expect_bitwise(const Comparison& c, const std::string& what = "") {
  EXPECT_EQ(c.differing, 0) << what << ": " << c.summary();
}

// No element more than 1 ulp of the output dtype away, and at most `fraction` of the elements
// (plus one) exactly 1 ulp away: ops whose fp32 value differs from the CPU's in its last bits
// (a different exp, a different summation order), which moves a rounding only near a tie.
inline void expect_within_1ulp(const Comparison& c, double fraction, const std::string& what = "") {
  EXPECT_EQ(c.beyond_1ulp, 0) << what << ": " << c.summary();
  EXPECT_LE(static_cast<double>(c.within_1ulp), 1.0 + fraction * static_cast<double>(c.count))
      << what << ": " << c.summary();
}

// Every element within `bound` relative error (and no NaN/infinity disagreement): fp32 outputs of
// ops without cancellation.
inline void expect_max_rel(const Comparison& c, double bound, const std::string& what = "") {
  EXPECT_EQ(c.nonfinite, 0) << what << ": " << c.summary();
  EXPECT_LE(c.max_rel, bound) << what << ": " << c.summary();
}

// The fp8 GEMM against the CPU's exact-sum reference, row by row (the test rows span many orders
// of magnitude, so a global or per-element measure would be decided by the largest or the
// near-zero outputs). Hopper's fp8 tensor cores add partial products with about 14 mantissa bits
// before cuBLASLt promotes them to fp32, so the sums are not fp32-exact: on the H200 the worst
// element of an fp32 output was ~4e-3 of its row's RMS and every fp32 row within 2e-3 rel-L2. A
// bf16 output adds its own rounding: a 16-wide row dominated by one element that rounds the other
// way is already 2^-8..2^-7 off, and the worst bf16 row measured 6.2e-3 (whole tensors <= 1.7e-3).
constexpr double kFp8GemmRowRelL2F32 = 2e-3, kFp8GemmRowRelL2Bf16 = 1e-2;

inline void expect_fp8_gemm_rows_close(const Tensor& got, const Tensor& want, const std::string& what) {
  const Comparison cmp = compare(got, want);
  EXPECT_EQ(cmp.nonfinite, 0) << what << ": " << cmp.summary();
  const int64_t rows = want.size(0), cols = want.size(1);
  double worst = 0.0;
  int64_t worst_row = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double diff2 = 0.0, ref2 = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = element_as_double(got, r * cols + c), w = element_as_double(want, r * cols + c);
      diff2 += (g - w) * (g - w);
      ref2 += w * w;
    }
    const double rel = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    if (rel > worst) {
      worst = rel;
      worst_row = r;
    }
  }
  const double bound = want.dtype() == DType::kF32 ? kFp8GemmRowRelL2F32 : kFp8GemmRowRelL2Bf16;
  EXPECT_LE(worst, bound) << what << ": worst row " << worst_row << " rel-L2 " << worst << "; " << cmp.summary();
}

// Sets environment variable `name` to `value` (unsets it for nullptr) for its lifetime and restores
// the caller's setting after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* saved = std::getenv(name);
    had_ = saved != nullptr;
    if (had_) saved_ = saved;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), saved_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  bool had_ = false;
  std::string saved_;
};

// ---- the fixture ---------------------------------------------------------------------------------

// Owns a device arena and a stream; skips the test when no device is present. Sub-cases scope
// their allocations with ArenaScope so a loop over shapes reuses the same memory (the stream orders
// the reuse: every op and copy runs on stream_).
class GpuTest : public ::testing::Test {
 protected:
  virtual size_t arena_bytes() const { return size_t{1} << 30; }

  void SetUp() override {
    VORTEX_REQUIRE_GPU();
    arena_ = must(cuda::DeviceArena::create(arena_bytes()));
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  Tensor to_device(const Tensor& host) { return must(cuda::upload(host, arena_, stream_)); }
  Tensor to_host(const Tensor& device) { return must(cuda::download(device, stream_)); }

  // A device copy of a host vector of int32 / int64 indices.
  template <class T>
  T* device_vector(const std::vector<T>& values) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8);
    const DType dtype = sizeof(T) == 4 ? DType::kI32 : DType::kI64;
    Tensor host = Tensor::empty({static_cast<int64_t>(values.size())}, dtype);
    if (!values.empty()) std::memcpy(host.data(), values.data(), values.size() * sizeof(T));
    return to_device(host).template data_as<T>();
  }

  void sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

  class ArenaScope {
   public:
    explicit ArenaScope(cuda::DeviceArena& arena) : arena_(arena), mark_(arena.mark()) {}
    ~ArenaScope() { arena_.release_to(mark_); }
    ArenaScope(const ArenaScope&) = delete;
    ArenaScope& operator=(const ArenaScope&) = delete;

   private:
    cuda::DeviceArena& arena_;
    size_t mark_;
  };

  cuda::DeviceArena arena_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace vortex::test
