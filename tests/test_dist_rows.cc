// How sequence parallelism splits the packed sequence's rows (dist/ulysses.h): contiguous ranges
// in rank order covering every row once, sizes differing by at most one, longer ranges first.
#include <gtest/gtest.h>

#include "dist/ulysses.h"

namespace vortex {
namespace {

TEST(DistRows, ContiguousRangesInRankOrder) {
  for (const int ranks : {1, 2, 3, 7, 8}) {
    for (const int64_t rows : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{37810}, int64_t{37811}}) {
      const std::vector<dist::RowRange> split = dist::partition_rows(rows, ranks);
      ASSERT_EQ(split.size(), static_cast<size_t>(ranks));
      int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(split[r].begin, next) << rows << " rows, rank " << r;
        EXPECT_GE(split[r].size(), rows / ranks);
        EXPECT_LE(split[r].size(), rows / ranks + 1);
        if (r > 0) EXPECT_LE(split[r].size(), split[r - 1].size());
        next = split[r].end;
      }
      EXPECT_EQ(next, rows);
    }
  }
  EXPECT_EQ(dist::partition_rows(37810, 2)[1].begin, 18905);
}

}  // namespace
}  // namespace vortex
