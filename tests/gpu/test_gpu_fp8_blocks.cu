// cuda::quantize_blocks_fp8 against cpu::quantize_blocks_fp8, bit for bit (codes and scales):
// the kTiles layout (a short last tile, one row, 300 and 4,097 rows; column blocks padded to 4 and
// the padding written 0) and the kRows layout (the weight form),
// F32 and BF16, a 16-byte-aligned strided view (vector loads, word stores) and a column offset of 3
// (scalar loads, byte stores), a block holding a NaN and one holding huge values; bytes outside
// the codes view stay untouched; refused arguments name the field. Then Fp8GemmRunner's
// block-scaled linear against cpu::linear_fp8_blocks, which holds only if the scale layouts are
// the ones cuBLASLt reads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "cpu/fp8_blocks.h"
#include "cuda/fp8_blocks.h"
#include "cuda/gemm_fp8.h"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

using test::columns;
using test::must;
using test::random_tensor;
using test::set_value;

constexpr uint8_t kSentinel = 0xA5;
constexpr int64_t kPad = 16;  // input columns past the view

class GpuFp8Blocks : public test::GpuTest {};

struct BlockCase {
  int64_t rows, cols;
  cpu::Fp8BlockLayout layout;
  int64_t col;
  DType dtype;
};

constexpr cpu::Fp8BlockLayout kTiles = cpu::Fp8BlockLayout::kTiles, kRows = cpu::Fp8BlockLayout::kRows;
constexpr BlockCase kCases[] = {
    {300, 256, kTiles, 0, DType::kBF16}, {1, 128, kTiles, 0, DType::kF32},   {4097, 384, kTiles, 8, DType::kBF16},
    {129, 128, kTiles, 3, DType::kBF16}, {37, 256, kRows, 0, DType::kBF16},  {20, 128, kRows, 3, DType::kF32},
    {130, 512, kTiles, 0, DType::kF32},  {70, 384, kRows, 0, DType::kBF16}};

TEST_F(GpuFp8Blocks, QuantizerMatchesTheCpuBitForBit) {
  uint64_t seed = 7100;
  for (const BlockCase& c : kCases) {
    ArenaScope scope(arena_);
    const std::string what = "rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + 
                             (c.layout == kTiles ? " tiles" : " rows") + " col " + std::to_string(c.col) + " " + dtype_name(c.dtype);
    Tensor x = random_tensor({c.rows, c.col + c.cols + kPad}, c.dtype, ++seed, 2.0f);
    if (c.rows >= 3) {
      set_value(x, 1, c.col + 5, NAN);                 // poisons block (0, 0)
      for (int64_t k = 0; k < 128; ++k) set_value(x, c.rows - 1, c.col + c.cols - 128 + k, 3e38f * (k % 2 ? 1 : -1));
    }
    const TensorView host_view = columns(x, c.col, c.cols);
    const cpu::Fp8Blocks want = must(cpu::quantize_blocks_fp8(host_view, c.layout));

    const Tensor xd = to_device(x);
    // Code columns past the view, which must stay kSentinel: 16 keeps the rows 8-byte aligned (word
    // stores), 13 does not (byte stores).
    const int64_t code_pad = c.col == 3 ? 13 : 16;
    const Tensor codes_full = must(arena_.alloc({c.rows, c.cols + code_pad}, DType::kF8E4M3));
    ASSERT_EQ(cudaMemsetAsync(codes_full.data(), kSentinel, codes_full.nbytes(), stream_), cudaSuccess);
    // Scales start as NaN, so that the layout's padding must be written (0, as the CPU writes it).
    const Tensor scales = must(arena_.alloc(want.scales.shape(), DType::kF32));
    ASSERT_EQ(cudaMemsetAsync(scales.data(), 0xff, scales.nbytes(), stream_), cudaSuccess);
    VORTEX_EXPECT_OK(cuda::quantize_blocks_fp8(columns(xd, c.col, c.cols), c.layout,
                                               columns(codes_full, 0, c.cols), scales.view(), stream_));
    const Tensor got_codes = to_host(codes_full), got_scales = to_host(scales);
    int64_t bad_codes = 0, clobbered = 0, bad_scales = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t k = 0; k < c.cols + code_pad; ++k) {
        const uint8_t got = got_codes.data_as<uint8_t>()[r * (c.cols + code_pad) + k];
        if (k < c.cols) {
          bad_codes += got != want.codes.data_as<uint8_t>()[r * c.cols + k];
        } else {
          clobbered += got != kSentinel;
        }
      }
    }
    for (int64_t i = 0; i < want.scales.numel(); ++i) {
      const float g = got_scales.data_as<float>()[i], w = want.scales.data_as<float>()[i];
      bad_scales += !(f32_bits(g) == f32_bits(w) || (std::isnan(g) && std::isnan(w)));
    }
    EXPECT_EQ(bad_codes, 0) << what;
    EXPECT_EQ(bad_scales, 0) << what;
    EXPECT_EQ(clobbered, 0) << what << ": bytes written outside the codes view";
  }
}

TEST_F(GpuFp8Blocks, RefusesArgumentsNamingTheField) {
  const auto expect_invalid = [](const Status& s, const std::string& field) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.to_string();
  };
  const Tensor x = to_device(random_tensor({4, 256}, DType::kBF16, 1));
  const Tensor codes = must(arena_.alloc({4, 256}, DType::kF8E4M3));
  const Tensor scales = must(arena_.alloc({1, 4}, DType::kF32));  // kTiles: 2 column blocks padded to 4
  const Tensor wrong_scales = must(arena_.alloc({1, 2}, DType::kF32));
  expect_invalid(cuda::quantize_blocks_fp8(x.view(), kTiles, codes.view(), wrong_scales.view(), stream_), "scales");
  expect_invalid(cuda::quantize_blocks_fp8(x.view(), kRows, codes.view(), scales.view(), stream_), "scales");
  expect_invalid(cuda::quantize_blocks_fp8(columns(x, 0, 200), kTiles, columns(codes, 0, 200), scales.view(), stream_),
                 "multiple of 128");
  const Tensor host = random_tensor({4, 256}, DType::kBF16, 2);
  expect_invalid(cuda::quantize_blocks_fp8(host.view(), kTiles, codes.view(), scales.view(), stream_), "host tensor");
  VORTEX_EXPECT_OK(cuda::quantize_blocks_fp8(x.view(), kTiles, codes.view(), scales.view(), stream_));
}

// Fp8GemmRunner::linear_blocks against cpu::linear_fp8_blocks on block-quantized operands whose
// blocks differ in magnitude by up to 2^3 (a misread scale layout shows as errors of that order):
// every row within the per-token fp8 GEMM's bounds (expect_fp8_gemm_rows_close). 300 tokens (a
// short last tile), K 384, N 256, with and without a bias.
TEST_F(GpuFp8Blocks, BlockScaledLinearMatchesTheCpu) {
  const int64_t m = 300, k = 384, n = 256;
  Tensor x = random_tensor({m, k}, DType::kF32, 7301, 1.0f), w = random_tensor({n, k}, DType::kF32, 7302, 0.05f);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) x.data_as<float>()[r * k + c] *= std::ldexp(1.0f, static_cast<int>((r / 128 + c / 128) % 4) - 2);
  }
  const cpu::Fp8Blocks qa = must(cpu::quantize_blocks_fp8(x.view(), kTiles));
  const cpu::Fp8Blocks qw = must(cpu::quantize_blocks_fp8(w.view(), kRows));
  const Tensor bias = random_tensor({n}, DType::kBF16, 7303, 0.5f);
  const Tensor qa_d = to_device(qa.codes), sa_d = to_device(qa.scales), qw_d = to_device(qw.codes),
               sw_d = to_device(qw.scales), bias_d = to_device(bias);
  auto runner = must(cuda::Fp8GemmRunner::create(arena_));
  for (const DType out : {DType::kF32, DType::kBF16}) {
    for (const bool with_bias : {false, true}) {
      ArenaScope scope(arena_);
      const std::string what = std::string(dtype_name(out)) + (with_bias ? " with bias" : "");
      const TensorView bias_host = bias.view(), bias_dev = bias_d.view();
      Tensor want = Tensor::empty({m, n}, out);
      must(cpu::linear_fp8_blocks(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(),
                                  with_bias ? &bias_host : nullptr, want.view()));
      const Tensor y = must(arena_.alloc({m, n}, out));
      VORTEX_EXPECT_OK(runner->linear_blocks(qa_d.view(), sa_d.view(), qw_d.view(), sw_d.view(),
                                             with_bias ? &bias_dev : nullptr, y.view(), stream_));
      test::expect_fp8_gemm_rows_close(to_host(y), want, what);
    }
  }
  Tensor y = must(arena_.alloc({m, n}, DType::kF32));
  EXPECT_EQ(runner->linear_blocks(qa_d.view(), sw_d.view(), qw_d.view(), sw_d.view(), nullptr, y.view(), stream_).code(),
            StatusCode::kInvalidArgument)
      << "weight scales passed as activation scales";
}

}  // namespace
}  // namespace vortex
