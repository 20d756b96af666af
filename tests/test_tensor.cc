#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "must.h"
#include "vortex/tensor.h"

namespace vortex {
namespace {

using test::must;

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

// contiguous() of permuted and sliced views, for every element size, large enough that the rows
// are spread over the cores: every element where the view's logical order puts it.
TEST(Tensor, ContiguousCopiesStridedViewsInLogicalOrder) {
  for (const DType dtype : {DType::kU8, DType::kBF16, DType::kF32, DType::kI64}) {
    Tensor t = Tensor::zeros({3, 9, 40, 70}, dtype);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
      const int64_t value = (i * 7919) % 251;  // exact in every one of these types
      switch (dtype) {
        case DType::kU8: t.data_as<uint8_t>()[i] = static_cast<uint8_t>(value); break;
        case DType::kBF16: t.data_as<uint16_t>()[i] = static_cast<uint16_t>(0x4000 + value); break;
        case DType::kF32: t.data_as<float>()[i] = static_cast<float>(value); break;
        default: t.data_as<int64_t>()[i] = value * bytes; break;
      }
    }
    const Tensor channels_last = must(t.permute({1, 2, 3, 0}));
    const Tensor window = must(must(channels_last.slice(1, 3, 37)).slice(2, 1, 69));
    const Tensor reversed_inner = must(t.permute({3, 2, 1, 0}));
    for (const Tensor& view : {channels_last, window, reversed_inner, must(t.select(0, 1))}) {
      if (view.is_contiguous()) continue;
      const Tensor c = view.contiguous();
      ASSERT_TRUE(c.is_contiguous());
      ASSERT_EQ(c.shape(), view.shape());
      for (int64_t i = 0; i < view.numel(); ++i) {
        ASSERT_EQ(element_as_double(c, i), element_as_double(view, i)) << dtype_name(dtype) << " element " << i;
      }
    }
  }
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

// The dense conversion loops (contiguous tensors, spread over the cores) give the bits of the
// element-by-element path that strided tensors take.
TEST(Tensor, DenseConversionsAreTheBitsOfTheStridedPath) {
  constexpr int64_t kRows = 301, kCols = 1031;  // past the conversion's grain, odd sizes
  Tensor t = Tensor::empty({kRows, kCols}, DType::kF32);
  float* p = t.data_as<float>();
  uint32_t state = 12345;
  for (int64_t i = 0; i < t.numel(); ++i) {
    state = state * 1664525u + 1013904223u;
    p[i] = static_cast<float>(static_cast<int32_t>(state)) * 1e-7f;
  }
  p[0] = 1.0f + 1.0f / 256.0f;  // a tie
  p[1] = std::numeric_limits<float>::quiet_NaN();
  p[2] = std::numeric_limits<float>::infinity();
  for (DType to : {DType::kBF16, DType::kF16, DType::kF8E4M3}) {
    const Tensor dense = must(t.to(to));
    const Tensor transposed = must(must(t.transpose(0, 1)).to(to));  // the element-by-element path
    const Tensor back = must(transposed.transpose(0, 1)).contiguous();
    ASSERT_EQ(std::memcmp(dense.data(), back.data(), dense.nbytes()), 0) << dtype_name(to);
    const Tensor widened = must(dense.to(DType::kF32));
    const Tensor widened_walked = must(must(back.transpose(0, 1)).to(DType::kF32));
    const Tensor widened_back = must(widened_walked.transpose(0, 1)).contiguous();
    ASSERT_EQ(std::memcmp(widened.data(), widened_back.data(), widened.nbytes()), 0) << dtype_name(to);
  }
}

}  // namespace
}  // namespace vortex
