// Device arena and host <-> device copies.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <random>

#include "cuda/runtime.h"

namespace vortex {
namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(GpuRuntime, StagedCopySpansSeveralStagingHalves) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  // 100 MB + an odd tail: four 32 MB halves, the last one partial.
  const int64_t n = (100ll << 20) / 2 + 7;
  Tensor host = Tensor::empty({n}, DType::kBF16);
  std::mt19937 rng(5);
  for (int64_t i = 0; i < n; ++i) host.data_as<uint16_t>()[i] = static_cast<uint16_t>(rng());
  auto arena = cuda::DeviceArena::create(host.nbytes() + 1024);
  ASSERT_TRUE(arena.ok());
  auto dev = arena->alloc(host.shape(), host.dtype());
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(cuda::copy_to_device_staged(host, *dev, nullptr).ok());
  auto back = cuda::download(*dev, nullptr);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::memcmp(back->data(), host.data(), host.nbytes()), 0);
}

TEST(GpuRuntime, ArenaReportsExhaustionAsAnError) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  auto arena = cuda::DeviceArena::create(4096);
  ASSERT_TRUE(arena.ok());
  EXPECT_TRUE(arena->alloc({1000}, DType::kF32).ok());
  auto too_big = arena->alloc({1000}, DType::kF32);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(too_big.status().message().find("exhausted"), std::string::npos);
}

}  // namespace
}  // namespace vortex
