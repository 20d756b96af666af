// How sequence parallelism splits the packed sequence's rows (dist/ulysses.h): contiguous ranges
// in rank order covering every row once, longer ranges first; starting at multiples of kRowGranule
// (the fp8 recipe's attention-output tiles) when every rank gets a granule, else single rows.
#include <gtest/gtest.h>

#include "dist/ulysses.h"

namespace vortex {
namespace {

TEST(DistRows, ContiguousRangesInRankOrder) {
  for (const int ranks : {1, 2, 3, 7, 8}) {
    for (const int64_t rows : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{128}, int64_t{129}, int64_t{254},
                               int64_t{1082}, int64_t{37810}}) {
      const std::vector<dist::RowRange> split = dist::partition_rows(rows, ranks);
      const int64_t g = rows >= dist::kRowGranule * ranks ? dist::kRowGranule : 1;
      ASSERT_EQ(split.size(), static_cast<size_t>(ranks));
      const int64_t blocks = (rows + g - 1) / g;
      int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(split[r].begin, next) << rows << " rows, rank " << r;
        EXPECT_EQ(split[r].begin % g, 0) << rows << " rows, rank " << r;
        const int64_t granules = (split[r].size() + g - 1) / g;
        EXPECT_GE(granules, blocks / ranks) << rows << " rows, rank " << r;
        EXPECT_LE(granules, blocks / ranks + 1) << rows << " rows, rank " << r;
        if (r > 0) EXPECT_LE(split[r].size(), split[r - 1].size());
        if (rows >= ranks) EXPECT_GE(split[r].size(), 1);
        next = split[r].end;
      }
      EXPECT_EQ(next, rows);
    }
  }
  // The canonical 37,810 rows (296 granules) on two GPUs: 148 granules each.
  EXPECT_EQ(dist::partition_rows(37810, 2)[1].begin, 148 * dist::kRowGranule);
}

// What a rank's block buffers are sized for: no rank of any request up to max_rows rows takes more.
TEST(DistRows, NoRequestGivesARankMoreThanMaxRowsPerRank) {
  for (const int ranks : {1, 2, 3, 4, 8}) {
    for (const int64_t max_rows : {int64_t{1}, int64_t{7}, int64_t{254}, int64_t{511}, int64_t{512}, int64_t{513},
                                   int64_t{1082}, int64_t{5000}}) {
      const int64_t most = dist::max_rows_per_rank(max_rows, ranks);
      EXPECT_LE(most, max_rows);
      for (int64_t rows = 1; rows <= max_rows; ++rows) {
        for (const dist::RowRange& r : dist::partition_rows(rows, ranks)) {
          ASSERT_LE(r.size(), most) << rows << " of up to " << max_rows << " rows on " << ranks << " ranks";
        }
      }
    }
  }
  EXPECT_EQ(dist::max_rows_per_rank(37810, 2), 148 * dist::kRowGranule);
  EXPECT_EQ(dist::max_rows_per_rank(37810, 4), 74 * dist::kRowGranule);
  EXPECT_EQ(dist::max_rows_per_rank(37810, 1), 37810);
}

}  // namespace
}  // namespace vortex
