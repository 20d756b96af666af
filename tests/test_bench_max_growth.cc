// bench::softmax_max_growth (src/bench/softmax_max_growth.h): on i.i.d. scores (N(0, 1) q and k)
// the measured growth and redo rates sit at the i.i.d. expectation; scores rising with the key
// index grow on every tile, falling ones on none; bad operands are refused naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "bench/softmax_max_growth.h"
#include "must.h"

namespace vortex {
namespace {

using test::must;

Tensor normal_tensor(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(rng);
  return t;
}

TEST(BenchMaxGrowth, IidScoresGrowAtTheIidRate) {
  // 4 heads × 8 warps × 63 tiles after the first: ~2,000 warp-tiles, a binomial spread of ~1%.
  const Tensor q = normal_tensor({512, 4, 32}, 1), k = normal_tensor({8192, 4, 32}, 2);
  const bench::MaxGrowth g = must(bench::softmax_max_growth(q.view(), k.view(), 8));
  EXPECT_EQ(g.warps, 32);
  EXPECT_EQ(g.tiles, 64);
  // Σ_{t=2..64} 1/t / 63 and Σ 1 − (1 − 1/t)^16 / 63.
  EXPECT_NEAR(g.iid_row_tile_fraction, 0.0594, 5e-4);
  EXPECT_NEAR(g.iid_warp_tile_fraction, 0.474, 5e-3);
  std::printf("i.i.d. N(0, 1): row growth %.4f (expected %.4f), warp redo %.4f (expected %.4f)\n", g.row_tile_fraction,
              g.iid_row_tile_fraction, g.warp_tile_fraction, g.iid_warp_tile_fraction);
  EXPECT_NEAR(g.row_tile_fraction, g.iid_row_tile_fraction, 0.01);
  EXPECT_NEAR(g.warp_tile_fraction, g.iid_warp_tile_fraction, 0.04);
}

TEST(BenchMaxGrowth, MonotoneScoresGrowOnEveryTileOrNone) {
  // D = 1, q = 1: a row's score is k_j. Rising keys raise every tile's max; falling ones none.
  Tensor q = Tensor::empty({16, 1, 1}, DType::kF32), rising = Tensor::empty({1000, 1, 1}, DType::kF32);
  Tensor falling = Tensor::empty({1000, 1, 1}, DType::kF32);
  for (int64_t i = 0; i < 16; ++i) q.data_as<float>()[i] = 1.0f;
  for (int64_t j = 0; j < 1000; ++j) {
    rising.data_as<float>()[j] = static_cast<float>(j);
    falling.data_as<float>()[j] = -static_cast<float>(j);
  }
  const bench::MaxGrowth up = must(bench::softmax_max_growth(q.view(), rising.view(), 1));
  EXPECT_EQ(up.tiles, 8);  // 1,000 keys in tiles of 128, the last short
  EXPECT_EQ(up.row_tile_fraction, 1.0);
  EXPECT_EQ(up.warp_tile_fraction, 1.0);
  const bench::MaxGrowth down = must(bench::softmax_max_growth(q.view(), falling.view(), 1));
  EXPECT_EQ(down.row_tile_fraction, 0.0);
  EXPECT_EQ(down.warp_tile_fraction, 0.0);
}

TEST(BenchMaxGrowth, RefusesBadOperandsNamingThem) {
  const Tensor q = normal_tensor({32, 2, 8}, 3), k = normal_tensor({64, 3, 8}, 4);
  const Status s = bench::softmax_max_growth(q.view(), k.view(), 1).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(" k:"), std::string::npos) << s.to_string();
  const Tensor few = normal_tensor({8, 2, 8}, 5), k2 = normal_tensor({64, 2, 8}, 6);
  EXPECT_EQ(bench::softmax_max_growth(few.view(), k2.view(), 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vortex
