// Fuzzing a file reader with damaged copies of a good file (the safetensors and media readers'
// tests): whatever the reader accepts is checked, whatever it refuses must be a one-line Status.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>

#include "safetensors_test_util.h"

namespace vortex::test_util {

// `good` with 1-4 bytes flipped (three times in four within its first `header_bytes`) and, one
// time in four, cut at a random length.
inline std::string damage(const std::string& good, size_t header_bytes, std::mt19937& rng) {
  std::string image = good;
  const int flips = 1 + static_cast<int>(rng() % 4);
  for (int f = 0; f < flips; ++f) {
    const size_t limit = rng() % 4 != 0 ? std::min(header_bytes, image.size()) : image.size();
    image[rng() % limit] ^= static_cast<char>(1 + rng() % 255);
  }
  if (rng() % 4 == 0) image.resize(rng() % image.size());
  return image;
}

// `iterations` damaged copies of `good` (damage() drawing on `rng`; `mend` may touch each up
// after) written to `path` and handed to `read` (path → Result): a refusal must be a one-line
// Status, an accepted file is handed to `check`. Both outcomes must occur.
template <typename Read, typename Check>
void fuzz_reader(const std::string& good, size_t header_bytes, int iterations, std::mt19937& rng,
                 const std::string& path, Read read, Check check,
                 const std::function<void(std::string&, int)>& mend = {}) {
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < iterations; ++iter) {
    std::string image = damage(good, header_bytes, rng);
    if (mend) mend(image, iter);
    write_bytes(path, image);
    auto result = read(path);
    if (!result.ok()) {
      ++refused;
      EXPECT_FALSE(result.status().message().empty());
      EXPECT_EQ(result.status().message().find('\n'), std::string::npos) << result.status().message();
      continue;
    }
    ++accepted;
    check(*result);
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);
}

}  // namespace vortex::test_util
