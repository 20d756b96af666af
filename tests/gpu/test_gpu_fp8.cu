// The fp8 recipe on the GPU (cuda/fp8_quantize.h, cuda/gemm_fp8.h) against the CPU reference
// (cpu/fp8.h) and against the bf16 CUDA path it replaces, on fresh random inputs (fixed seeds):
// rows 1, 7, 129, 1000; channels 24, 48, 77 (no 16-byte vectors), 5376 (the hidden size) and
// 17000 (too wide for the register cache); column slices of wider buffers at 16-byte-aligned
// and odd offsets; codes written into wider buffers of sentinel bytes, which must survive.
//
// Bounds:
// - quantize_rows_fp8 and quantize_weight_fp8 against the CPU: bitwise, codes and scales (the same
//   fp32 operations by the shared rule in cpu/fp8_scale.h; the amax is exact).
// - The fused producers against the bf16 CUDA path followed by quantize_rows_fp8: bitwise, both
//   against rms_norm_fused (what the model runs) and against the separate launches (residual,
//   rms_norm, adaln_modulate), for every form of the block norms; x after the residual too.
//   Against the CPU's fused reference they differ only where the GPU's rms_norm or expf differs
//   from the CPU's in the last bits. Those inputs flip a bf16 rounding of h (<= 1e-4 of the
//   elements for rms_norm, <= 1e-3 for silu, per test_gpu_elementwise.cu), so at most 2e-3 of the
//   codes (+1) may differ, and every scale must lie within 2^-6 relative (a few bf16 ulps of a
//   row's amax, which moves when its element is one of the flipped roundings).
// - fp8 GEMM against cpu::linear_fp8, row by row: rel-L2 of every row <= 2e-3 (F32 y) or 1e-2
//   (BF16 y). The CPU sums exactly; Hopper's fp8 MMA adds with about 14 mantissa bits between
//   cuBLASLt's promotions to fp32 (DeepSeek-V3 report, section 3.3.2), which the H200 run showed
//   as ~4e-3 of a row's RMS in the worst fp32 element (see expect_gemm_close). A wrong scale
//   vector, layout or bias is off by O(1).
#include <gtest/gtest-spi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu/elementwise.h"
#include "cpu/fp8.h"
#include "cpu/norm.h"
#include "cuda/elementwise.h"
#include "cuda/fp8_quantize.h"
#include "cuda/gemm_fp8.h"
#include "gpu/gemm_attention_test_util.h"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

using test::columns;
using test::must;
using test::random_tensor;
using test::set_value;

constexpr unsigned char kSentinel = 0xA5;
constexpr int64_t kRows[] = {1, 7, 129, 1000};
constexpr int64_t kChannels[] = {24, 48, 77, 5376, 17000};
constexpr int64_t kPad = 16;

std::string describe(const char* op, DType dtype, int64_t rows, int64_t channels, int64_t col) {
  return std::string(op) + " " + dtype_name(dtype) + " [" + std::to_string(rows) + ", " + std::to_string(channels) +
         "] at column " + std::to_string(col);
}

// Codes [n, c] as columns [col, col + c) of a sentinel-filled [n, c + kPad] device buffer, and scales [n].
struct DeviceRows {
  Tensor codes_full, scales;
  TensorView codes;
  int64_t col, c;
};

// Compares a quantizer's output with the expected rows: every code and scale bit, and the sentinel
// bytes around the codes view.
void expect_rows_equal(const Tensor& codes_full, const Tensor& scales, const cpu::Fp8Rows& want, int64_t col,
                       const std::string& what) {
  const int64_t n = want.codes.size(0), c = want.codes.size(1), width = codes_full.size(1);
  int64_t wrong = 0, clobbered = 0;
  std::string first;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t k = 0; k < width; ++k) {
      const uint8_t got = codes_full.data_as<uint8_t>()[r * width + k];
      if (k < col || k >= col + c) {
        clobbered += got != kSentinel;
        continue;
      }
      const uint8_t expected = want.codes.data_as<uint8_t>()[r * c + k - col];
      if (got != expected && wrong++ == 0) {
        first = "row " + std::to_string(r) + " col " + std::to_string(k - col) + ": code " + std::to_string(got) +
                ", want " + std::to_string(expected);
      }
    }
  }
  int64_t wrong_scales = 0;
  for (int64_t r = 0; r < n; ++r) {
    wrong_scales += f32_bits(scales.data_as<float>()[r]) != f32_bits(want.scales.data_as<float>()[r]);
  }
  EXPECT_EQ(wrong, 0) << what << ": first at " << first;
  EXPECT_EQ(wrong_scales, 0) << what << ": scales differ";
  EXPECT_EQ(clobbered, 0) << what << ": bytes written outside the codes view";
}

// The bound against the CPU's fused reference (see the header).
void expect_rows_close(const Tensor& codes_full, const Tensor& scales, const cpu::Fp8Rows& want, int64_t col,
                       const std::string& what) {
  const int64_t n = want.codes.size(0), c = want.codes.size(1), width = codes_full.size(1);
  int64_t differing = 0, far_scales = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t k = 0; k < c; ++k) {
      differing += codes_full.data_as<uint8_t>()[r * width + col + k] != want.codes.data_as<uint8_t>()[r * c + k];
    }
    const float got = scales.data_as<float>()[r], expected = want.scales.data_as<float>()[r];
    far_scales += !(std::fabs(got - expected) <= std::ldexp(std::fabs(expected), -6));
  }
  EXPECT_LE(static_cast<double>(differing), 1.0 + 2e-3 * static_cast<double>(n * c)) << what << ": codes vs CPU";
  EXPECT_EQ(far_scales, 0) << what << ": scales vs CPU";
}

class GpuFp8 : public test::GpuTest {
 protected:
  DeviceRows device_rows(int64_t n, int64_t c, int64_t col) {
    DeviceRows d;
    d.codes_full = must(arena_.alloc({n, c + kPad}, DType::kF8E4M3));
    EXPECT_EQ(cudaMemsetAsync(d.codes_full.data(), kSentinel, d.codes_full.nbytes(), stream_), cudaSuccess);
    d.scales = must(arena_.alloc({n}, DType::kF32));
    d.codes = columns(d.codes_full, col, c);
    d.col = col;
    d.c = c;
    return d;
  }
  void expect_equal(const DeviceRows& d, const cpu::Fp8Rows& want, const std::string& what) {
    expect_rows_equal(to_host(d.codes_full), to_host(d.scales), want, d.col, what);
  }
  void expect_close(const DeviceRows& d, const cpu::Fp8Rows& want, const std::string& what) {
    expect_rows_close(to_host(d.codes_full), to_host(d.scales), want, d.col, what);
  }
  // The unfused output as rows: codes and scales downloaded into a cpu::Fp8Rows.
  cpu::Fp8Rows host_rows(const DeviceRows& d) {
    const Tensor full = to_host(d.codes_full);
    return {must(full.slice(1, d.col, d.col + d.c)).contiguous(), to_host(d.scales)};
  }
};

// ---- the checker itself ----------------------------------------------------------------------------

TEST(GpuFp8Checker, FlagsAFlippedCodeAScaleBitAndAClobberedByte) {
  const Tensor x = random_tensor({5, 24}, DType::kBF16, 1);
  const cpu::Fp8Rows want = must(cpu::quantize_rows_fp8(x.view()));
  Tensor full = Tensor::empty({5, 24 + kPad}, DType::kF8E4M3);
  std::memset(full.data(), kSentinel, full.nbytes());
  for (int64_t r = 0; r < 5; ++r) {
    std::memcpy(full.data_as<uint8_t>() + r * (24 + kPad) + 3, want.codes.data_as<uint8_t>() + r * 24, 24);
  }
  Tensor scales = want.scales.clone();
  expect_rows_equal(full, scales, want, 3, "clean");
  full.data_as<uint8_t>()[2 * (24 + kPad) + 10] ^= 1;
  EXPECT_NONFATAL_FAILURE(expect_rows_equal(full, scales, want, 3, "flipped code"), "flipped code");
  full.data_as<uint8_t>()[2 * (24 + kPad) + 10] ^= 1;
  scales.data_as<float>()[4] = std::nextafter(scales.data_as<float>()[4], 1.0f);
  EXPECT_NONFATAL_FAILURE(expect_rows_equal(full, scales, want, 3, "scale ulp"), "scale ulp");
  scales.data_as<float>()[4] = want.scales.data_as<float>()[4];
  full.data_as<uint8_t>()[0] = 0;
  EXPECT_NONFATAL_FAILURE(expect_rows_equal(full, scales, want, 3, "clobbered"), "clobbered");
}

// ---- quantize_rows_fp8 / quantize_weight_fp8 ---------------------------------------------------------

TEST_F(GpuFp8, QuantizeRowsMatchesCpuBitwise) {
  uint64_t seed = 1000;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t c : kChannels) {
      for (int64_t n : kRows) {
        for (int64_t col : {int64_t{8}, int64_t{3}}) {
          ArenaScope scope(arena_);
          const std::string what = describe("quantize_rows_fp8", dtype, n, c, col);
          Tensor x = random_tensor({n, c + kPad}, dtype, ++seed, 3.0f);
          // Rows the rule treats specially: zero, NaN, infinity, huge (saturating neighbours), tiny.
          if (n >= 7) {
            for (int64_t k = 0; k < c + kPad; ++k) set_value(x, 0, k, 0.0f);
            set_value(x, 1, col + c / 2, NAN);
            set_value(x, 2, col, -INFINITY);
            for (int64_t k = 0; k < c + kPad; ++k) set_value(x, 3, k, 3e38f * (k % 2 ? 1.0f : -0.999f));
            for (int64_t k = 0; k < c + kPad; ++k) set_value(x, 4, k, std::ldexp(static_cast<float>(k % 5), -132));
          }
          const Tensor xd = to_device(x);
          const DeviceRows d = device_rows(n, c, col);
          VORTEX_EXPECT_OK(cuda::quantize_rows_fp8(columns(xd, col, c), d.codes, d.scales.view(), stream_));
          expect_equal(d, must(cpu::quantize_rows_fp8(columns(x, col, c))), what);
        }
      }
    }
  }
}

TEST_F(GpuFp8, WeightQuantizationFromHostAndDeviceMatchesCpu) {
  uint64_t seed = 2000;
  struct Shape2 {
    int64_t o, i;
  };
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (Shape2 s : {Shape2{16, 16}, Shape2{96, 80}, Shape2{48, 5376}, Shape2{5376, 7168}}) {
      ArenaScope scope(arena_);
      const std::string what = describe("quantize_weight_fp8", dtype, s.o, s.i, 0);
      const Tensor w = random_tensor({s.o, s.i}, dtype, ++seed, 1.0f / std::sqrt(static_cast<float>(s.i)));
      const cpu::Fp8Rows want = must(cpu::quantize_weight_fp8(w.view()));
      const size_t before = arena_.mark();
      const cuda::Fp8Weight from_host = must(cuda::quantize_weight_fp8(w, arena_, stream_));
      // The staging scratch is gone: only the codes, the scales and their alignment padding remain.
      EXPECT_LE(arena_.mark() - before, static_cast<size_t>(s.o * s.i + 4 * s.o) + 2 * cuda::DeviceArena::kAlignment)
          << what;
      expect_rows_equal(to_host(from_host.codes), to_host(from_host.scales), want, 0, what + " from host");
      const cuda::Fp8Weight from_device = must(cuda::quantize_weight_fp8(to_device(w), arena_, stream_));
      expect_rows_equal(to_host(from_device.codes), to_host(from_device.scales), want, 0, what + " from device");
    }
  }
}

// ---- fused producers -------------------------------------------------------------------------------

// The forms of the block norms (refiner norm1 / norm2, transformer norm1 / norm2), each with the
// weight forms rms_norm takes.
enum class Form { kPlain, kResidual, kModulate, kGatedModulate };
enum class NormWeight { kBf16, kNone, kF32Strided };
struct NormVariant {
  Form form;
  NormWeight weight;
  DType table;
};
constexpr NormVariant kNormVariants[] = {{Form::kPlain, NormWeight::kBf16, DType::kBF16},
                                         {Form::kPlain, NormWeight::kNone, DType::kBF16},
                                         {Form::kResidual, NormWeight::kBf16, DType::kBF16},
                                         {Form::kModulate, NormWeight::kBf16, DType::kBF16},
                                         {Form::kModulate, NormWeight::kF32Strided, DType::kF32},
                                         {Form::kGatedModulate, NormWeight::kBf16, DType::kBF16}};

std::string describe(const NormVariant& v) {
  const char* forms[] = {"plain", "residual", "modulate", "gated residual + modulate"};
  const char* weights[] = {"bf16 weight", "no weight", "strided f32 weight"};
  return std::string(forms[static_cast<int>(v.form)]) + ", " + weights[static_cast<int>(v.weight)] + ", table " +
         dtype_name(v.table);
}

TEST_F(GpuFp8, FusedNormEqualsUnfusedPathBitwise) {
  uint64_t seed = 3000;
  constexpr int64_t kTableRows = 6;
  constexpr float kEps = 1e-5f;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int64_t c : kChannels) {
      for (int64_t n : kRows) {
        for (int64_t col : {int64_t{8}, int64_t{3}}) {
          for (const NormVariant& v : kNormVariants) {
            ArenaScope scope(arena_);
            const std::string what = describe("rms_norm_fused_quantize_fp8", dtype, n, c, col) + ", " + describe(v);
            const bool residual = v.form == Form::kResidual || v.form == Form::kGatedModulate;
            const bool gated = v.form == Form::kGatedModulate;
            const bool modulate = v.form == Form::kModulate || v.form == Form::kGatedModulate;
            Tensor x = random_tensor({n, c + kPad}, dtype, ++seed, 2.0f);
            const Tensor branch = random_tensor({n, c}, dtype, ++seed);
            // A strided weight is every other element of a [2C] vector: rms_norm's scalar path.
            const DType w_dtype = v.weight == NormWeight::kF32Strided ? DType::kF32 : DType::kBF16;
            const Tensor w_store = random_tensor({2 * c}, w_dtype, ++seed, 0.2f);
            const Tensor table = random_tensor({kTableRows, 6 * c}, v.table, ++seed, 0.5f);
            const std::vector<int32_t> row = test::random_indices<int32_t>(n, kTableRows, ++seed);
            // Three device copies of x: the residual forms update x in place.
            const Tensor x_fused = to_device(x), x_path = to_device(x), x_steps = to_device(x);
            const Tensor bd = to_device(branch), wd = to_device(w_store), td = to_device(table);
            const auto weight_view = [&](const Tensor& t) {
              TensorView wv = t.view();
              wv.shape = Shape({c});
              if (v.weight == NormWeight::kF32Strided) wv.strides = Shape({2});
              return wv;
            };
            const TensorView wdv = weight_view(wd), whv = weight_view(w_store);
            const TensorView* wdp = v.weight == NormWeight::kNone ? nullptr : &wdv;
            const TensorView* whp = v.weight == NormWeight::kNone ? nullptr : &whv;
            const int32_t* rowd = device_vector(row);
            const TensorView bdv = bd.view(), gate = columns(td, 2 * c, c), shift = columns(td, 0, c),
                             scale = columns(td, c, c);
            cuda::NormFusion fusion;
            if (residual) fusion.branch = &bdv;
            if (gated) {
              fusion.gate = &gate;
              fusion.gate_row = rowd;
            }
            if (modulate) {
              fusion.shift = &shift;
              fusion.scale = &scale;
              fusion.mod_row = rowd;
            }

            const DeviceRows fused = device_rows(n, c, col);
            VORTEX_EXPECT_OK(cuda::rms_norm_fused_quantize_fp8(columns(x_fused, col, c), wdp, kEps, fusion, fused.codes,
                                                               fused.scales.view(), stream_));

            // The bf16 path the model runs: rms_norm_fused into an arena bf16 buffer, then the quantizer.
            const Tensor h = must(arena_.alloc({n, c}, DType::kBF16));
            VORTEX_EXPECT_OK(cuda::rms_norm_fused(columns(x_path, col, c), wdp, kEps, fusion, h.view(), stream_));
            const DeviceRows path = device_rows(n, c, 0);
            VORTEX_EXPECT_OK(cuda::quantize_rows_fp8(h.view(), path.codes, path.scales.view(), stream_));
            expect_equal(fused, host_rows(path), what + " vs rms_norm_fused");
            EXPECT_EQ(std::memcmp(to_host(x_fused).data(), to_host(x_path).data(), x.nbytes()), 0)
                << what << ": x after the residual";

            // The same path as separate launches.
            const TensorView xs = columns(x_steps, col, c);
            if (gated) {
              VORTEX_EXPECT_OK(cuda::gated_residual(xs, gate, rowd, bdv, stream_));
            } else if (residual) {
              VORTEX_EXPECT_OK(cuda::residual_add(xs, bdv, stream_));
            }
            const Tensor h2 = must(arena_.alloc({n, c}, DType::kBF16));
            VORTEX_EXPECT_OK(cuda::rms_norm(xs, wdp, kEps, h2.view(), stream_));
            if (modulate) VORTEX_EXPECT_OK(cuda::adaln_modulate(h2.view(), shift, scale, rowd, h2.view(), stream_));
            const DeviceRows steps = device_rows(n, c, 0);
            VORTEX_EXPECT_OK(cuda::quantize_rows_fp8(h2.view(), steps.codes, steps.scales.view(), stream_));
            expect_equal(fused, host_rows(steps), what + " vs separate launches");

            // The CPU reference, on the host copy.
            const TensorView hb = branch.view(), hgate = columns(table, 2 * c, c), hshift = columns(table, 0, c),
                             hscale = columns(table, c, c);
            cpu::Fp8NormFusion host_fusion;
            if (residual) host_fusion.branch = &hb;
            if (gated) {
              host_fusion.gate = &hgate;
              host_fusion.gate_row = &row;
            }
            if (modulate) {
              host_fusion.shift = &hshift;
              host_fusion.scale = &hscale;
              host_fusion.mod_row = &row;
            }
            Tensor codes = Tensor::empty({n, c}, DType::kF8E4M3), scales = Tensor::empty({n}, DType::kF32);
            must(cpu::rms_norm_fused_quantize_fp8(columns(x, col, c), whp, kEps, host_fusion, codes.view(),
                                                  scales.view()));
            expect_close(fused, {codes, scales}, what + " vs CPU");
          }
        }
      }
    }
  }
}

TEST_F(GpuFp8, FusedNormBadTableIndexGivesNanRows) {
  const int64_t n = 129, c = 5376;
  const Tensor x = random_tensor({n, c}, DType::kBF16, 3901);
  const Tensor branch = random_tensor({n, c}, DType::kBF16, 3902);
  const Tensor table = random_tensor({6, 6 * c}, DType::kBF16, 3903, 0.5f);
  std::vector<int32_t> gate_row = test::random_indices<int32_t>(n, 6, 3904), mod_row = gate_row;
  gate_row[5] = 6;
  mod_row[77] = -1;
  const Tensor x_fused = to_device(x), x_path = to_device(x), bd = to_device(branch), td = to_device(table);
  const TensorView bdv = bd.view(), gate = columns(td, 2 * c, c), shift = columns(td, 0, c), scale = columns(td, c, c);
  const cuda::NormFusion fusion{&bdv, &gate, device_vector(gate_row), &shift, &scale, device_vector(mod_row)};
  const DeviceRows fused = device_rows(n, c, 0);
  VORTEX_EXPECT_OK(cuda::rms_norm_fused_quantize_fp8(x_fused.view(), nullptr, 1e-5f, fusion, fused.codes,
                                                     fused.scales.view(), stream_));
  const Tensor h = must(arena_.alloc({n, c}, DType::kBF16));
  VORTEX_EXPECT_OK(cuda::rms_norm_fused(x_path.view(), nullptr, 1e-5f, fusion, h.view(), stream_));
  const DeviceRows path = device_rows(n, c, 0);
  VORTEX_EXPECT_OK(cuda::quantize_rows_fp8(h.view(), path.codes, path.scales.view(), stream_));
  expect_equal(fused, host_rows(path), "bad table index");
  const cpu::Fp8Rows got = host_rows(fused);
  for (int64_t r : {int64_t{5}, int64_t{77}}) {
    EXPECT_TRUE(std::isnan(got.scales.data_as<float>()[r])) << r;
    for (int64_t k = 0; k < c; ++k) ASSERT_EQ(got.codes.data_as<uint8_t>()[r * c + k], 0x7F) << r << "," << k;
  }
  EXPECT_FALSE(std::isnan(got.scales.data_as<float>()[6]));
}

TEST_F(GpuFp8, FusedSwigluEqualsUnfusedPathBitwise) {
  uint64_t seed = 4000;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int64_t f : {int64_t{24}, int64_t{48}, int64_t{77}, int64_t{5376}, int64_t{14336}}) {
      for (int64_t n : kRows) {
        for (int64_t col : {int64_t{0}, int64_t{1}}) {
          ArenaScope scope(arena_);
          const std::string what = describe("swiglu_quantize_fp8", dtype, n, f, col);
          const Tensor u = random_tensor({n, 2 * f + kPad}, dtype, ++seed, 3.0f);
          const Tensor ud = to_device(u);
          const Tensor p = must(arena_.alloc({n, f}, DType::kBF16));
          VORTEX_EXPECT_OK(cuda::swiglu(columns(ud, col, 2 * f), p.view(), stream_));
          const DeviceRows unfused = device_rows(n, f, 0);
          VORTEX_EXPECT_OK(cuda::quantize_rows_fp8(p.view(), unfused.codes, unfused.scales.view(), stream_));
          const DeviceRows fused = device_rows(n, f, col);
          VORTEX_EXPECT_OK(
              cuda::swiglu_quantize_fp8(columns(ud, col, 2 * f), fused.codes, fused.scales.view(), stream_));
          expect_equal(fused, host_rows(unfused), what + " vs unfused");

          Tensor codes = Tensor::empty({n, f}, DType::kF8E4M3), scales = Tensor::empty({n}, DType::kF32);
          must(cpu::swiglu_quantize_fp8(columns(u, col, 2 * f), codes.view(), scales.view()));
          expect_close(fused, {codes, scales}, what + " vs CPU");
        }
      }
    }
  }
}

// ---- fp8 GEMM ----------------------------------------------------------------------------------------

class GpuFp8Gemm : public GpuFp8 {
 protected:
  void SetUp() override {
    GpuFp8::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    runner_ = must(cuda::Fp8GemmRunner::create(arena_));
  }
  std::unique_ptr<cuda::Fp8GemmRunner> runner_;
};

// Rows of N(0, stddev) values scaled by 2^e, e uniform in [-6, 6] per row: a scale applied to
// the wrong row or column is off by up to 2^12.
Tensor spread_tensor(const Shape& shape, uint64_t seed, float stddev) {
  Tensor t = random_tensor(shape, DType::kF32, seed, stddev);
  const std::vector<int32_t> e = test::random_indices<int32_t>(shape[0], 13, seed + 1);
  for (int64_t r = 0; r < shape[0]; ++r) {
    for (int64_t k = 0; k < shape[1]; ++k) t.data_as<float>()[r * shape[1] + k] *= std::ldexp(1.0f, e[r] - 6);
  }
  return t;
}

// Uploads a host matrix into columns [col, col + width) of a device buffer [rows, width + pad].
Tensor upload_into_columns(const Tensor& host, cuda::DeviceArena& arena, cudaStream_t stream, int64_t col,
                           int64_t pad) {
  const int64_t rows = host.size(0), width = host.size(1);
  const size_t esize = dtype_size(host.dtype());
  const Tensor full = must(arena.alloc({rows, width + pad}, host.dtype()));
  EXPECT_EQ(cudaMemcpy2DAsync(static_cast<char*>(full.data()) + col * esize, (width + pad) * esize, host.data(),
                              width * esize, width * esize, rows, cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return must(full.slice(1, col, col + width));
}

TEST_F(GpuFp8Gemm, MatchesCpuReferenceOnOddAndStridedShapes) {
  uint64_t seed = 5000;
  struct Kn {
    int64_t k, n;
  };
  for (int64_t m : kRows) {
    for (Kn kn : {Kn{16, 16}, Kn{48, 32}, Kn{256, 96}, Kn{5376, 272}}) {
      for (DType out : {DType::kBF16, DType::kF32}) {
        for (bool bias : {false, true}) {
          for (bool strided : {false, true}) {
            ArenaScope scope(arena_);
            const std::string what = "M=" + std::to_string(m) + " K=" + std::to_string(kn.k) + " N=" +
                                     std::to_string(kn.n) + " " + dtype_name(out) + (bias ? " bias" : "") +
                                     (strided ? " strided" : "");
            const cpu::Fp8Rows qa = must(cpu::quantize_rows_fp8(spread_tensor({m, kn.k}, ++seed, 1.0f).view()));
            const cpu::Fp8Rows qw = must(cpu::quantize_weight_fp8(
                spread_tensor({kn.n, kn.k}, ++seed, 1.0f / std::sqrt(static_cast<float>(kn.k))).view()));
            const Tensor b = random_tensor({kn.n}, DType::kBF16, ++seed);
            // Strided: qa inside a [M, K + 32] buffer at column 16, y inside [M, N + 16] at column 8.
            const Tensor dqa = strided ? upload_into_columns(qa.codes, arena_, stream_, 16, 32) : to_device(qa.codes);
            const Tensor dsa = to_device(qa.scales), dqw = to_device(qw.codes), dsw = to_device(qw.scales);
            const Tensor db = to_device(b);
            const Tensor y_full = must(arena_.alloc({m, kn.n + (strided ? 16 : 0)}, out));
            EXPECT_EQ(cudaMemsetAsync(y_full.data(), kSentinel, y_full.nbytes(), stream_), cudaSuccess);
            const Tensor dy = must(y_full.slice(1, strided ? 8 : 0, (strided ? 8 : 0) + kn.n));
            const TensorView dbv = db.view();
            VORTEX_EXPECT_OK(runner_->linear(dqa.view(), dsa.view(), dqw.view(), dsw.view(), bias ? &dbv : nullptr,
                                             dy.view(), stream_));
            const Tensor got_full = to_host(y_full);
            const Tensor got = must(got_full.slice(1, strided ? 8 : 0, (strided ? 8 : 0) + kn.n)).contiguous();
            if (strided) {
              const size_t esize = dtype_size(out), row_bytes = (kn.n + 16) * esize;
              int64_t clobbered = 0;
              for (int64_t r = 0; r < m; ++r) {
                const auto* bytes = static_cast<const unsigned char*>(got_full.data()) + r * row_bytes;
                for (size_t i = 0; i < row_bytes; ++i) {
                  if (i >= 8 * esize && i < (8 + kn.n) * esize) continue;
                  clobbered += bytes[i] != kSentinel;
                }
              }
              EXPECT_EQ(clobbered, 0) << what << ": bytes written outside y";
            }
            Tensor want = Tensor::empty({m, kn.n}, out);
            const TensorView bv = b.view();
            must(cpu::linear_fp8(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(),
                                 bias ? &bv : nullptr, want.view()));
            test::expect_fp8_gemm_rows_close(got, want, what);
          }
        }
      }
    }
  }
}

TEST_F(GpuFp8Gemm, PlanCacheIsHitOnRepeats) {
  const cpu::Fp8Rows qa = must(cpu::quantize_rows_fp8(random_tensor({100, 64}, DType::kBF16, 6001).view()));
  const cpu::Fp8Rows qw = must(cpu::quantize_weight_fp8(random_tensor({32, 64}, DType::kBF16, 6002).view()));
  const Tensor dqa = to_device(qa.codes), dqa2 = to_device(qa.codes), dsa = to_device(qa.scales);
  const Tensor dqw = to_device(qw.codes), dsw = to_device(qw.scales);
  const Tensor b = to_device(random_tensor({32}, DType::kBF16, 6003));
  const Tensor y = must(arena_.alloc({100, 32}, DType::kBF16));
  const TensorView bias = b.view();
  must(runner_->linear(dqa.view(), dsa.view(), dqw.view(), dsw.view(), nullptr, y.view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 1u);
  must(runner_->linear(dqa2.view(), dsa.view(), dqw.view(), dsw.view(), nullptr, y.view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 1u);  // other buffers, same alignment
  must(runner_->linear(dqa.view(), dsa.view(), dqw.view(), dsw.view(), &bias, y.view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 2u);
  must(runner_->linear(must(dqa.slice(0, 0, 51)).view(), must(dsa.slice(0, 0, 51)).view(), dqw.view(), dsw.view(),
                       &bias, must(y.slice(0, 0, 51)).view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 3u);
  must(runner_->linear(dqa.view(), dsa.view(), dqw.view(), dsw.view(), &bias, y.view(), stream_));
  EXPECT_EQ(runner_->cached_plans(), 3u);
  sync();
}

class GpuFp8GemmBlock : public GpuFp8Gemm {
 protected:
  size_t arena_bytes() const override { return size_t{2} << 30; }  // FC1: x 0.1, w 0.45, y 0.24 GB
};

// The four GEMMs of an H3 block at 4099 rows: activations and weights made and quantized on the
// device, 16 sampled rows checked against the CPU reference.
TEST_F(GpuFp8GemmBlock, BlockShapesOnSampledRows) {
  constexpr int64_t kM = 4099, kSampled = 16;
  struct BlockGemm {
    const char* name;
    int64_t k, n;
  };
  const BlockGemm gemms[] = {
      {"qkv", 5376, 3 * 7168}, {"out", 7168, 5376}, {"fc1", 5376, 2 * 14336}, {"fc2", 14336, 5376}};
  std::vector<int64_t> rows = test::random_distinct_indices(kSampled - 2, kM - 2, 4099);
  for (int64_t& r : rows) r += 1;
  rows.push_back(0);
  rows.push_back(kM - 1);
  uint64_t seed = 7000;
  for (const BlockGemm& g : gemms) {
    ArenaScope scope(arena_);
    const Tensor x = must(arena_.alloc({kM, g.k}, DType::kBF16));
    const Tensor w = must(arena_.alloc({g.n, g.k}, DType::kBF16));
    must(test::fill_uniform(x, seed++, 1.0f, stream_));
    must(test::fill_uniform(w, seed++, std::sqrt(3.0f / static_cast<float>(g.k)), stream_));
    const Tensor qa = must(arena_.alloc({kM, g.k}, DType::kF8E4M3));
    const Tensor sa = must(arena_.alloc({kM}, DType::kF32));
    must(cuda::quantize_rows_fp8(x.view(), qa.view(), sa.view(), stream_));
    const cuda::Fp8Weight qw = must(cuda::quantize_weight_fp8(w, arena_, stream_));
    const Tensor y = must(arena_.alloc({kM, g.n}, DType::kBF16));
    must(runner_->linear(qa.view(), sa.view(), qw, nullptr, y.view(), stream_));
    sync();

    Tensor qa_rows = Tensor::empty({kSampled, g.k}, DType::kF8E4M3), sa_rows = Tensor::empty({kSampled}, DType::kF32);
    Tensor y_rows = Tensor::empty({kSampled, g.n}, DType::kBF16);
    const Tensor sa_host = to_host(sa);
    for (int64_t i = 0; i < kSampled; ++i) {
      const Tensor qr = test::download_2d(qa.data(), DType::kF8E4M3, g.k, rows[i], 1, 0, g.k);
      const Tensor yr = test::download_2d(y.data(), DType::kBF16, g.n, rows[i], 1, 0, g.n);
      std::memcpy(qa_rows.data_as<uint8_t>() + i * g.k, qr.data(), qr.nbytes());
      std::memcpy(y_rows.data_as<uint16_t>() + i * g.n, yr.data(), yr.nbytes());
      sa_rows.data_as<float>()[i] = sa_host.data_as<float>()[rows[i]];
    }
    Tensor want = Tensor::empty({kSampled, g.n}, DType::kBF16);
    must(cpu::linear_fp8(qa_rows.view(), sa_rows.view(), to_host(qw.codes).view(), to_host(qw.scales).view(), nullptr,
                         want.view()));
    test::expect_fp8_gemm_rows_close(y_rows, want, g.name);
  }
}

// ---- bad input -----------------------------------------------------------------------------------

void expect_invalid(const Status& s, const std::string& names) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find(names), std::string::npos) << "message should name \"" << names << "\": " << s.message();
}

TEST_F(GpuFp8Gemm, RejectsBadOperands) {
  const Tensor qa = must(arena_.alloc({10, 64}, DType::kF8E4M3)), sa = must(arena_.alloc({10}, DType::kF32));
  const Tensor qw = must(arena_.alloc({32, 64}, DType::kF8E4M3)), sw = must(arena_.alloc({32}, DType::kF32));
  const Tensor y = must(arena_.alloc({10, 32}, DType::kBF16));
  const Tensor qa24 = must(arena_.alloc({10, 24}, DType::kF8E4M3)), qw24 = must(arena_.alloc({32, 24}, DType::kF8E4M3));
  const Tensor qw24n = must(arena_.alloc({24, 64}, DType::kF8E4M3)), sw24 = must(arena_.alloc({24}, DType::kF32));
  const Tensor y24 = must(arena_.alloc({10, 24}, DType::kBF16)), bf = must(arena_.alloc({32}, DType::kF32));
  const Tensor wide = must(arena_.alloc({10, 80}, DType::kF8E4M3));
  const TensorView f32_bias = bf.view();
  const auto run = [&](const TensorView& a, const TensorView& as, const TensorView& w, const TensorView& ws,
                       const TensorView* b, const TensorView& out) {
    return runner_->linear(a, as, w, ws, b, out, stream_);
  };
  expect_invalid(run(qa24.view(), sa.view(), qw24.view(), sw.view(), nullptr, y.view()), "K must be");
  expect_invalid(run(qa.view(), sa.view(), qw24n.view(), sw24.view(), nullptr, y24.view()), "N (weight rows)");
  expect_invalid(run(must(wide.slice(1, 1, 65)).view(), sa.view(), qw.view(), sw.view(), nullptr, y.view()),
                 "activation codes qa");
  expect_invalid(run(qa.view(), sa.view(), y.view(), sw.view(), nullptr, y.view()), "weight codes qw");
  expect_invalid(run(qa.view(), sw.view(), qw.view(), sw.view(), nullptr, y.view()), "activation scales sa");
  expect_invalid(run(qa.view(), sa.view(), qw.view(), sa.view(), nullptr, y.view()), "weight scales sw");
  expect_invalid(run(qa.view(), sa.view(), qw.view(), sw.view(), &f32_bias, y.view()), "bias must be BF16");
  expect_invalid(run(qa.view(), sa.view(), qw.view(), sw.view(), nullptr, must(y.slice(0, 0, 5)).view()), "output y");
  TensorView host_y = y.view();
  host_y.device = Device::kCpu;
  expect_invalid(run(qa.view(), sa.view(), qw.view(), sw.view(), nullptr, host_y), "on the device");
  EXPECT_EQ(runner_->cached_plans(), 0u);
}

TensorView fake_device(const Shape& shape, DType dtype) {
  alignas(16) static char dummy[16];
  TensorView v;
  v.data = dummy;
  v.dtype = dtype;
  v.device = Device::kCuda;
  v.shape = shape;
  v.strides = contiguous_strides(shape);
  return v;
}

TEST(GpuFp8Args, QuantizerArgumentsNameTheOperand) {
  const DType bf = DType::kBF16, e4 = DType::kF8E4M3, f = DType::kF32;
  const TensorView x = fake_device({4, 8}, bf), codes = fake_device({4, 8}, e4), scales = fake_device({4}, f);
  const int32_t* row = reinterpret_cast<const int32_t*>(fake_device({1}, DType::kI32).data);
  TensorView host = x;
  host.device = Device::kCpu;
  expect_invalid(cuda::quantize_rows_fp8(host, codes, scales, nullptr), "quantize_rows_fp8 input");
  expect_invalid(cuda::quantize_rows_fp8(x, fake_device({4, 8}, DType::kU8), scales, nullptr),
                 "quantize_rows_fp8 codes");
  expect_invalid(cuda::quantize_rows_fp8(x, fake_device({4, 7}, e4), scales, nullptr), "quantize_rows_fp8 codes");
  expect_invalid(cuda::quantize_rows_fp8(x, codes, fake_device({5}, f), nullptr), "quantize_rows_fp8 scales");
  expect_invalid(cuda::quantize_rows_fp8(fake_device({4, 0}, bf), fake_device({4, 0}, e4), scales, nullptr),
                 "quantize_rows_fp8 input");
  const TensorView w7 = fake_device({7}, bf);
  const std::string norm = "rms_norm_fused_quantize_fp8";
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, &w7, 1e-5f, {}, codes, scales, nullptr), norm + " weight");
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, nullptr, 1e-5f, {}, codes, fake_device({4}, bf), nullptr),
                 norm + " scales");
  const TensorView t4 = fake_device({6, 4}, bf), t8 = fake_device({6, 8}, bf), t9 = fake_device({6, 9}, bf);
  const TensorView b5 = fake_device({5, 8}, bf);
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, nullptr, 1e-5f, {nullptr, nullptr, nullptr, &t4, &t4, row},
                                                   codes, scales, nullptr),
                 norm + " shift");
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, nullptr, 1e-5f, {nullptr, nullptr, nullptr, &t8, &t9, row},
                                                   codes, scales, nullptr),
                 norm + " scale");
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, nullptr, 1e-5f, {nullptr, nullptr, nullptr, &t8, &t8, nullptr},
                                                   codes, scales, nullptr),
                 norm + " shift");
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, nullptr, 1e-5f, {nullptr, nullptr, nullptr, &t8, nullptr, row},
                                                   codes, scales, nullptr),
                 norm + " shift");
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, nullptr, 1e-5f, {&b5}, codes, scales, nullptr), norm + " branch");
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, nullptr, 1e-5f, {nullptr, &t8, row}, codes, scales, nullptr),
                 norm + " gate");
  expect_invalid(cuda::rms_norm_fused_quantize_fp8(x, nullptr, 1e-5f, {&x, &t8, nullptr}, codes, scales, nullptr),
                 norm + " gate");
  expect_invalid(cuda::swiglu_quantize_fp8(fake_device({4, 17}, bf), codes, scales, nullptr),
                 "swiglu_quantize_fp8 input");
  expect_invalid(cuda::swiglu_quantize_fp8(fake_device({4, 18}, bf), codes, scales, nullptr),
                 "swiglu_quantize_fp8 codes");
  cuda::DeviceArena unused;
  expect_invalid(cuda::quantize_weight_fp8(Tensor::empty({8}, bf), unused, nullptr).status(),
                 "quantize_weight_fp8 weight");
}

}  // namespace
}  // namespace vortex
