#include <gtest/gtest.h>

#include "vortex/tensor.h"

namespace vortex {
namespace {

TEST(Tensor, SliceSharesStorageWithoutCopy) {
  Tensor t = Tensor::from_f32({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  auto s = t.slice(1, 1, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->shape(), Shape({3, 2}));
  EXPECT_EQ(s->storage(), t.storage());
  EXPECT_FALSE(s->is_contiguous());
  EXPECT_EQ(element_as_double(*s, 0), 1.0);
  EXPECT_EQ(element_as_double(*s, 3), 6.0);
  Tensor c = s->contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.data_as<float>()[5], 10.0f);
}

TEST(Tensor, PermuteAndSelect) {
  Tensor t = Tensor::from_f32({0, 1, 2, 3, 4, 5}, {2, 3});
  auto p = t.transpose(0, 1);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->shape(), Shape({3, 2}));
  EXPECT_EQ(element_as_double(*p, 1), 3.0);
  auto row = p->select(0, 2);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->shape(), Shape({2}));
  EXPECT_EQ(element_as_double(*row, 1), 5.0);
}

TEST(Tensor, BadViewsReturnErrors) {
  Tensor t = Tensor::zeros({2, 3}, DType::kF32);
  EXPECT_FALSE(t.slice(1, 2, 4).ok());
  EXPECT_FALSE(t.select(2, 0).ok());
  EXPECT_FALSE(t.reshape({4, 2}).ok());
  EXPECT_FALSE(t.permute({0, 0}).ok());
  auto tr = t.transpose(0, 1);
  ASSERT_TRUE(tr.ok());
  EXPECT_FALSE(tr->reshape({6}).ok());
}

TEST(Tensor, ToBf16RoundsNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  Tensor t = Tensor::from_f32({1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f}, {2});
  auto b = t.to(DType::kBF16);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(element_as_double(*b, 0), 1.0);
  EXPECT_EQ(element_as_double(*b, 1), 1.0 + 4.0 / 256.0);
}

}  // namespace
}  // namespace vortex
