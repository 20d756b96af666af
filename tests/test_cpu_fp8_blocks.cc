// The block-scaled fp8 linear's CPU reference (cpu/fp8_blocks.h):
// - quantize_blocks_fp8 applies cpu/fp8_scale.h's rule to each block: every scale and code equals
//   the rule applied to that block's elements alone (128-row tiles with a short last tile, and
//   1-row weight blocks), stored where the layout says (the kTiles padding 0); a non-finite block
//   poisons itself and nothing else;
// - on 128-column rows with 1-row blocks (one block per row) it is quantize_rows_fp8, bit for bit;
// - linear_fp8_blocks against a double product of the dequantized operands: an F32 y within
//   2^-21 of it (the exact block sums, one fp32 rounding of the total, the bias add);
// - refused shapes and dtypes name the field;
// - the recipe's error on an attention-output-like activation (heads of equal and of different
//   magnitudes): no worse than the per-token recipe's (cpu/fp8.h) on the same product.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cpu/fp8.h"
#include "cpu/fp8_blocks.h"
#include "cpu/fp8_scale.h"
#include "must.h"

namespace vortex {
namespace {

using test::must;

// N(0, 1) values scaled per column block: block b of a row is multiplied by 2^(b % 7 − 3), so
// blocks of different magnitudes sit side by side as heads do in an attention output.
Tensor headed_tensor(int64_t rows, int64_t cols, DType dtype, uint64_t seed, bool spread) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor f = Tensor::empty({rows, cols}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = spread ? std::ldexp(1.0f, static_cast<int>((c / 128) % 7) - 3) : 1.0f;
      f.data_as<float>()[r * cols + c] = normal(rng) * scale;
    }
  }
  return dtype == DType::kF32 ? f : must(f.to(dtype));
}

float value_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kBF16 ? bf16_bits_to_f32(t.data_as<uint16_t>()[i]) : t.data_as<float>()[i];
}

// Every scale and code of `q` against the rule applied to each block alone.
void expect_blockwise_rule(const Tensor& x, cpu::Fp8BlockLayout layout, const cpu::Fp8Blocks& q,
                           const std::string& what) {
  const int64_t n = x.size(0), c = x.size(1), col_blocks = c / 128;
  const cpu::Fp8BlockScales at = cpu::fp8_block_scales(layout, n, c);
  const int64_t block_rows = at.block_rows;
  ASSERT_EQ(q.scales.shape(), at.shape) << what;
  std::vector<bool> written(static_cast<size_t>(at.shape.numel()), false);
  int64_t bad_scales = 0, bad_codes = 0;
  for (int64_t rb = 0; rb * block_rows < n; ++rb) {
    for (int64_t b = 0; b < col_blocks; ++b) {
      uint32_t amax = 0;
      for (int64_t r = rb * block_rows; r < std::min(n, (rb + 1) * block_rows); ++r) {
        for (int64_t k = b * 128; k < (b + 1) * 128; ++k) amax = fp8_max_bits(amax, fp8_abs_bits(value_at(x, r * c + k)));
      }
      const Fp8RowScale s = fp8_row_scale(amax);
      const int64_t at_index = rb * at.row_block_stride + b * at.col_block_stride;
      written[static_cast<size_t>(at_index)] = true;
      const float got = q.scales.data_as<float>()[at_index];
      bad_scales += !(f32_bits(got) == f32_bits(s.scale) || (std::isnan(got) && std::isnan(s.scale)));
      for (int64_t r = rb * block_rows; r < std::min(n, (rb + 1) * block_rows); ++r) {
        for (int64_t k = b * 128; k < (b + 1) * 128; ++k) {
          bad_codes += q.codes.data_as<uint8_t>()[r * c + k] != fp8_quantize(value_at(x, r * c + k), s);
        }
      }
    }
  }
  int64_t bad_padding = 0;
  for (int64_t i = 0; i < at.shape.numel(); ++i) bad_padding += !written[i] && q.scales.data_as<float>()[i] != 0.0f;
  EXPECT_EQ(bad_scales, 0) << what;
  EXPECT_EQ(bad_codes, 0) << what;
  EXPECT_EQ(bad_padding, 0) << what << ": padding not 0";
}

TEST(CpuFp8Blocks, EachBlockFollowsTheRowRuleOverItsOwnElements) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    // 300 rows: two full 128-row tiles and a short one of 44. 3 column blocks: kTiles pads them to 4.
    const Tensor x = headed_tensor(300, 384, dtype, 11, true);
    const cpu::Fp8Blocks tiles = must(cpu::quantize_blocks_fp8(x.view(), cpu::Fp8BlockLayout::kTiles));
    EXPECT_EQ(tiles.scales.shape(), Shape({3, 4}));
    expect_blockwise_rule(x, cpu::Fp8BlockLayout::kTiles, tiles, std::string("128-row tiles, ") + dtype_name(dtype));
    const cpu::Fp8Blocks rows = must(cpu::quantize_blocks_fp8(x.view(), cpu::Fp8BlockLayout::kRows));
    EXPECT_EQ(rows.scales.shape(), Shape({3, 300}));
    expect_blockwise_rule(x, cpu::Fp8BlockLayout::kRows, rows, std::string("1-row blocks, ") + dtype_name(dtype));
  }
}

TEST(CpuFp8Blocks, OneBlockPerRowIsTheRowQuantizer) {
  const Tensor x = headed_tensor(37, 128, DType::kBF16, 12, false);
  const cpu::Fp8Blocks blocks = must(cpu::quantize_blocks_fp8(x.view(), cpu::Fp8BlockLayout::kRows));
  const cpu::Fp8Rows rows = must(cpu::quantize_rows_fp8(x.view()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(blocks.codes.data_as<uint8_t>()[i], rows.codes.data_as<uint8_t>()[i]) << "element " << i;
  }
  for (int64_t r = 0; r < 37; ++r) {
    EXPECT_EQ(f32_bits(blocks.scales.data_as<float>()[r]), f32_bits(rows.scales.data_as<float>()[r])) << "row " << r;
  }
}

TEST(CpuFp8Blocks, ANonFiniteBlockPoisonsOnlyItself) {
  Tensor x = headed_tensor(130, 256, DType::kF32, 13, true);
  const cpu::Fp8Blocks clean = must(cpu::quantize_blocks_fp8(x.view(), cpu::Fp8BlockLayout::kTiles));
  x.data_as<float>()[129 * 256 + 200] = std::numeric_limits<float>::quiet_NaN();  // tile (1, 1)
  const cpu::Fp8Blocks dirty = must(cpu::quantize_blocks_fp8(x.view(), cpu::Fp8BlockLayout::kTiles));
  for (int64_t r = 0; r < 130; ++r) {
    for (int64_t k = 0; k < 256; ++k) {
      const uint8_t got = dirty.codes.data_as<uint8_t>()[r * 256 + k];
      if (r >= 128 && k >= 128) {
        ASSERT_EQ(got, kE4m3NanCode) << r << ", " << k;
      } else {
        ASSERT_EQ(got, clean.codes.data_as<uint8_t>()[r * 256 + k]) << r << ", " << k;
      }
    }
  }
  // Scales [2 tiles, 2 column blocks padded to 4]: tile (1, 1) is element 5.
  EXPECT_TRUE(std::isnan(dirty.scales.data_as<float>()[5]));
  for (int i : {0, 1, 4}) EXPECT_EQ(dirty.scales.data_as<float>()[i], clean.scales.data_as<float>()[i]) << i;
}

// y with an F32 output against Σ_k deq(qa)·deq(qw) + bias in double.
TEST(CpuFp8Blocks, LinearMatchesTheDequantizedProduct) {
  const int64_t m = 200, k = 384, n = 48;
  const Tensor x = headed_tensor(m, k, DType::kBF16, 21, true);
  Tensor w = headed_tensor(n, k, DType::kF32, 22, true);
  for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] *= 0.05f;
  Tensor bias = Tensor::empty({n}, DType::kF32);
  for (int64_t j = 0; j < n; ++j) bias.data_as<float>()[j] = 0.1f * static_cast<float>(j % 7) - 0.3f;
  const TensorView bias_v = bias.view();
  const cpu::Fp8Blocks qa = must(cpu::quantize_blocks_fp8(x.view(), cpu::Fp8BlockLayout::kTiles));
  const cpu::Fp8Blocks qw = must(cpu::quantize_blocks_fp8(w.view(), cpu::Fp8BlockLayout::kRows));
  Tensor y = Tensor::empty({m, n}, DType::kF32);
  must(cpu::linear_fp8_blocks(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), &bias_v, y.view()));
  int64_t bad = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const double a = static_cast<double>(e4m3_bits_to_f32(qa.codes.data_as<uint8_t>()[r * k + i])) *
                         qa.scales.data_as<float>()[(r / 128) * 4 + i / 128];
        const double b = static_cast<double>(e4m3_bits_to_f32(qw.codes.data_as<uint8_t>()[j * k + i])) *
                         qw.scales.data_as<float>()[(i / 128) * n + j];
        ref += a * b;
        magnitude += std::fabs(a * b);
      }
      const double bj = bias.data_as<float>()[j];
      const double got = y.data_as<float>()[r * n + j];
      bad += std::fabs(got - (ref + bj)) > std::ldexp(1.0, -21) * (magnitude + std::fabs(bj)) + 1e-30;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(CpuFp8Blocks, RefusesShapesAndDtypesNamingTheField) {
  const auto expect_invalid = [](const Status& s, const std::string& field) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.to_string();
  };
  const Tensor x = headed_tensor(4, 200, DType::kF32, 31, false);
  expect_invalid(cpu::quantize_blocks_fp8(x.view(), cpu::Fp8BlockLayout::kTiles).status(), "multiple of 128");
  const Tensor ok = headed_tensor(4, 128, DType::kF32, 32, false);
  Tensor codes = Tensor::empty({4, 128}, DType::kF8E4M3), wrong_scales = Tensor::empty({4, 1}, DType::kF32);
  expect_invalid(cpu::quantize_blocks_fp8(ok.view(), cpu::Fp8BlockLayout::kTiles, codes.view(), wrong_scales.view()),
                 "scales");
  expect_invalid(cpu::quantize_blocks_fp8(ok.view(), cpu::Fp8BlockLayout::kRows, codes.view(), wrong_scales.view()),
                 "scales");  // kRows: [1 column block, 4 rows]
  const cpu::Fp8Blocks qa = must(cpu::quantize_blocks_fp8(ok.view(), cpu::Fp8BlockLayout::kTiles));
  const cpu::Fp8Blocks qw = must(cpu::quantize_blocks_fp8(ok.view(), cpu::Fp8BlockLayout::kRows));
  Tensor y = Tensor::empty({4, 4}, DType::kF32);
  expect_invalid(cpu::linear_fp8_blocks(qa.codes.view(), wrong_scales.view(), qw.codes.view(), qw.scales.view(),
                                        nullptr, y.view()),
                 "activation scales");
  expect_invalid(cpu::linear_fp8_blocks(qa.codes.view(), qa.scales.view(), qw.codes.view(), wrong_scales.view(),
                                        nullptr, y.view()),
                 "weight scales");
  Tensor y_bad = Tensor::empty({4, 5}, DType::kF32);
  expect_invalid(cpu::linear_fp8_blocks(qa.codes.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), nullptr,
                                        y_bad.view()),
                 "output");
  expect_invalid(cpu::linear_fp8_blocks(ok.view(), qa.scales.view(), qw.codes.view(), qw.scales.view(), nullptr,
                                        y.view()),
                 "activation codes");
}

// rel-L2 of an fp8 product against the exact product of the same operands.
double rel_l2(const Tensor& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = got.data_as<float>()[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// The out projection's shape in miniature: x [256 tokens, 8 heads × 128], w [64, 1024]. The block
// recipe must cost no accuracy against the per-token one (cpu/fp8.h) on the same product, with
// heads of equal magnitude and with heads 2^-3..2^3 apart. Measured: 0.0369 against 0.0372, and
// 0.0373 against 0.0373 (e4m3's relative step is the same at any scale, and at this spread the
// per-token scale still keeps the small heads out of e4m3's subnormals).
TEST(CpuFp8Blocks, BlockRecipeErrorAgainstThePerTokenRecipe) {
  const int64_t m = 256, k = 1024, n = 64;
  for (const bool spread : {false, true}) {
    const Tensor x = headed_tensor(m, k, DType::kBF16, spread ? 41 : 42, spread);
    Tensor w = headed_tensor(n, k, DType::kF32, 43, false);
    for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] *= 0.03f;
    std::vector<double> exact(static_cast<size_t>(m * n));
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(value_at(x, r * k + i)) * w.data_as<float>()[j * k + i];
        exact[r * n + j] = acc;
      }
    }
    const cpu::Fp8Blocks qa_tiles = must(cpu::quantize_blocks_fp8(x.view(), cpu::Fp8BlockLayout::kTiles));
    const cpu::Fp8Blocks qw_blocks = must(cpu::quantize_blocks_fp8(w.view(), cpu::Fp8BlockLayout::kRows));
    Tensor y_blocks = Tensor::empty({m, n}, DType::kF32);
    must(cpu::linear_fp8_blocks(qa_tiles.codes.view(), qa_tiles.scales.view(), qw_blocks.codes.view(),
                                qw_blocks.scales.view(), nullptr, y_blocks.view()));
    const cpu::Fp8Rows qa_rows = must(cpu::quantize_rows_fp8(x.view()));
    const cpu::Fp8Rows qw_rows = must(cpu::quantize_weight_fp8(w.view()));
    Tensor y_rows = Tensor::empty({m, n}, DType::kF32);
    must(cpu::linear_fp8(qa_rows.codes.view(), qa_rows.scales.view(), qw_rows.codes.view(), qw_rows.scales.view(),
                         nullptr, y_rows.view()));
    const double e_blocks = rel_l2(y_blocks, exact), e_rows = rel_l2(y_rows, exact);
    std::printf("heads %s: rel-L2 vs exact, block recipe %.5f, per-token recipe %.5f\n",
                spread ? "2^-3..2^3 apart" : "of equal magnitude", e_blocks, e_rows);
    EXPECT_LE(e_blocks, 0.045);
    EXPECT_GE(e_blocks, 0.01) << "a quantizer that quantizes nothing must fail";
    EXPECT_LE(e_blocks, 1.05 * e_rows) << "the block recipe must not lose accuracy against the per-token one";
  }
}

}  // namespace
}  // namespace vortex
