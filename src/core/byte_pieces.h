// BytePieces: bytes that lie in pieces of memory, read as one run of bytes (rows of a tensor taken
// in runs; a whole buffer is one piece). Any range of them can be copied out on its own, so a copy
// can be split over threads wherever the pieces begin and end.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace vortex {

class BytePieces {
 public:
  // The rows of a contiguous buffer of `row_bytes` rows taken in runs (first row, count), in order.
  static BytePieces rows(const void* base, size_t row_bytes, const std::vector<std::pair<int64_t, int64_t>>& runs) {
    BytePieces pieces;
    for (const auto& [first, count] : runs) {
      pieces.add(static_cast<const char*>(base) + static_cast<size_t>(first) * row_bytes,
                 static_cast<size_t>(count) * row_bytes);
    }
    return pieces;
  }

  void add(const void* data, size_t bytes) {
    if (bytes == 0) return;
    begin_.push_back(static_cast<const char*>(data));
    end_.push_back(size() + bytes);
  }
  size_t size() const { return end_.empty() ? 0 : end_.back(); }

  // Copies bytes [from, to) of the run into `out`.
  void read(size_t from, size_t to, char* out) const {
    size_t piece = static_cast<size_t>(std::upper_bound(end_.begin(), end_.end(), from) - end_.begin());
    while (from < to) {
      const size_t start = piece == 0 ? 0 : end_[piece - 1];
      const size_t stop = std::min(to, end_[piece]);
      std::memcpy(out, begin_[piece] + (from - start), stop - from);
      out += stop - from;
      from = stop;
      ++piece;
    }
  }

 private:
  std::vector<const char*> begin_;
  std::vector<size_t> end_;  // where each piece ends in the run
};

}  // namespace vortex
