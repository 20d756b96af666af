// Device arena and host <-> device copies.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

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

// Copies of every size, packed one after another into the staging halves (a copy that ends mid-half
// leaves the rest to the next), from two streams by turns: each lands whole, none overwritten by
// the next copy's staging before its own transfer ran.
TEST(GpuRuntime, StagedCopiesOfMixedSizesFromTwoStreamsLandWhole) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  // Bytes: a half and a bit, tiny ones between, one ending exactly where a half does, several halves.
  const std::vector<int64_t> sizes = {(33ll << 20) + 5, 3, 1024, (31ll << 20) - 1032, 17ll << 20, 1,
                                      (64ll << 20) + 5, 7, 96 << 10};
  int64_t all = 0;
  for (int64_t n : sizes) all += n + 256;
  auto arena = cuda::DeviceArena::create(static_cast<size_t>(all));
  ASSERT_TRUE(arena.ok());
  std::vector<Tensor> hosts, devs;
  std::mt19937 rng(23);
  for (size_t k = 0; k < sizes.size(); ++k) {
    Tensor h = Tensor::empty({sizes[k]}, DType::kU8);
    for (int64_t i = 0; i < sizes[k]; ++i) static_cast<uint8_t*>(h.data())[i] = static_cast<uint8_t>(rng());
    hosts.push_back(h);
    auto d = arena->alloc({sizes[k]}, DType::kU8);
    ASSERT_TRUE(d.ok());
    devs.push_back(*d);
    ASSERT_TRUE(cuda::copy_to_device_staged(hosts[k], devs[k], streams[k % 2]).ok()) << "copy " << k;
  }
  for (cudaStream_t s : streams) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto back = cuda::download(devs[k], nullptr);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(std::memcmp(back->data(), hosts[k].data(), hosts[k].nbytes()), 0) << "copy " << k;
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

// Rows taken in runs (a fused layer's parts): out of order, empty runs, runs across the staging
// halves' ends, odd row sizes; what lands is the host's gather of the same rows. Bad runs refused.
TEST(GpuRuntime, StagedRowCopiesLandTheRowsInTheirRunsOrder) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 301, cols = 51 * 1024 + 3;  // a row of ~100 KB bf16: runs cross the halves' ends
  Tensor host = Tensor::empty({rows, cols}, DType::kBF16);
  std::mt19937 rng(41);
  for (int64_t i = 0; i < host.numel(); ++i) host.data_as<uint16_t>()[i] = static_cast<uint16_t>(rng());
  const std::vector<std::pair<int64_t, int64_t>> runs = {{150, 151}, {0, 0}, {3, 1}, {0, 150}, {300, 1}, {7, 293}};
  int64_t taken = 0;
  for (const auto& run : runs) taken += run.second;
  Tensor want = Tensor::empty({taken, cols}, DType::kBF16);
  int64_t at = 0;
  for (const auto& [first, count] : runs) {
    std::memcpy(want.data_as<uint16_t>() + at * cols, host.data_as<uint16_t>() + first * cols,
                static_cast<size_t>(count * cols) * 2);
    at += count;
  }
  auto arena = cuda::DeviceArena::create(static_cast<size_t>(want.nbytes()) + 4096);
  ASSERT_TRUE(arena.ok());
  auto dst = arena->alloc({taken, cols}, DType::kBF16);
  ASSERT_TRUE(dst.ok());
  // Twice: from wherever the halves stood after earlier tests, then after a small copy.
  for (int pass = 0; pass < 2; ++pass) {
    ASSERT_EQ(cudaMemset(dst->data(), 0, dst->nbytes()), cudaSuccess);
    ASSERT_TRUE(cuda::copy_rows_to_device_staged(host, runs, *dst, nullptr).ok());
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    auto back = cuda::download(*dst, nullptr);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(std::memcmp(back->data(), want.data(), want.nbytes()), 0) << "pass " << pass;
    auto tiny = arena->alloc({3}, DType::kU8);
    ASSERT_TRUE(tiny.ok());
    ASSERT_TRUE(cuda::copy_to_device_staged(Tensor::zeros({3}, DType::kU8), *tiny, nullptr).ok());
  }
  const auto refused = [&](const std::vector<std::pair<int64_t, int64_t>>& bad) {
    const Status s = cuda::copy_rows_to_device_staged(host, bad, *dst, nullptr);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("copy_rows_to_device_staged: rows of bf16[301, 52227]"), std::string::npos)
        << s.message();
  };
  refused({{0, 301}, {300, taken - 300}});       // past the last row
  refused({{-1, 1}, {0, taken - 1}});            // before the first
  refused({{0, 301}});                           // fewer rows than dst has
}

// The staged copy is stream-ordered: it returns once the host bytes are in pinned memory, without
// waiting for earlier work on the stream, and never reads the source afterwards.
TEST(GpuRuntime, StagedCopyIsStreamOrderedAndDoneWithTheSourceOnReturn) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  // Two copies back to back (one per staging half), of 3 MB and 5 MB + 3 floats.
  const std::vector<int64_t> sizes = {3 << 18, (5 << 18) + 3};
  auto arena = cuda::DeviceArena::create(64 << 20);
  ASSERT_TRUE(arena.ok());
  std::vector<Tensor> hosts, wants, devs;
  std::mt19937 rng(11);
  for (int64_t n : sizes) {
    Tensor h = Tensor::empty({n}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) h.data_as<float>()[i] = static_cast<float>(rng());
    wants.push_back(h.clone());
    hosts.push_back(h);
    auto d = arena->alloc({n}, DType::kF32);
    ASSERT_TRUE(d.ok());
    devs.push_back(*d);
  }
  // The staging area exists before the timed part (its first use allocates pinned memory).
  ASSERT_TRUE(cuda::copy_to_device_staged(hosts[0], devs[0], stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // The stream is held for 400 ms by a host function; the copies must not wait for it.
  ASSERT_EQ(cudaLaunchHostFunc(
                stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(400)); }, nullptr),
            cudaSuccess);
  const auto start = std::chrono::steady_clock::now();
  for (size_t k = 0; k < sizes.size(); ++k) ASSERT_TRUE(cuda::copy_to_device_staged(hosts[k], devs[k], stream).ok());
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(waited_ms, 200.0) << "the staged copies waited for the stream";
  // The sources are scribbled over before the transfers can have run: the device must hold the
  // bytes they had at the call.
  for (Tensor& h : hosts) std::memset(h.data(), 0xff, h.nbytes());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto back = cuda::download(devs[k], stream);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(std::memcmp(back->data(), wants[k].data(), wants[k].nbytes()), 0) << "copy " << k;
  }
  cudaStreamDestroy(stream);
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
