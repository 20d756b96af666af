// How rms_norm lays a row out over threads, which fixes its summation order. Every kernel that
// reproduces an rms_norm bit for bit (norm.cu's rms_norm / rms_norm_fused / qk_norm_rope, and
// fp8_quantize.cu's fused producers) takes its layout from here, so the orders cannot drift.
//
//   group  rows of up to 32 · kNormGroupMaxVecs vectors: the smallest power-of-two number of lanes
//          (<= 32) that covers the row, kNormThreads / lanes rows per block, each lane summing its
//          vectors in order before a shuffle tree over the lanes.
//   block  wider rows, one block per row: as few vectors per thread as 256 threads allow (672
//          vectors -> 224 x 3), or kNormBlockMaxThreads threads when that is more than the
//          register cache holds; warp partials added in warp order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/row_io.cuh"

namespace vortex::cuda {

constexpr int kNormThreads = 256;        // block size of the group layout: 8 warps, 256 / lanes rows
constexpr int kNormGroupMaxVecs = 4;     // vectors per lane the group layout caches (32 fp32 registers)
constexpr int kNormBlockMaxThreads = 512;
constexpr int64_t kNormMaxGrid = 1 << 20;  // grid-stride loops cover the rest

// Register cache of the block layout: 24 fp32 values per thread in 16-byte vectors, 8 scalars
// (a 32-scalar cache spills: each scalar carries its own 64-bit index and bound check). Three
// vectors is what a 5376-wide row needs at 224 threads, and it fits norm.cu's 64-register cap;
// four spill there.
constexpr int norm_block_cache_vecs(int v) { return v == 1 ? 8 : 24 / v; }

struct NormRowLayout {
  bool group;      // the group layout (else one block per row)
  int lanes;       // threads per row: the group's lanes, or the block's threads
  unsigned block;  // threads per block
  unsigned grid;
  bool cached;     // block layout: the row fits the register cache (the group layout always does)
};

// The layout of `rows` rows of `vecs` vectors of width `v` elements.
inline NormRowLayout norm_row_layout(int64_t rows, int64_t vecs, int v) {
  NormRowLayout l{};
  if (vecs <= 32 * kNormGroupMaxVecs) {
    int lanes = 1;
    while (lanes < 32 && lanes < vecs) lanes *= 2;
    l.group = true;
    l.lanes = lanes;
    l.block = kNormThreads;
    l.grid = static_cast<unsigned>(std::min(detail::ceil_div(rows, kNormThreads / lanes), kNormMaxGrid));
    l.cached = true;
    return l;
  }
  const int64_t cache = norm_block_cache_vecs(v);
  int64_t per_thread = detail::ceil_div(vecs, 256);
  int64_t threads = detail::ceil_div(detail::ceil_div(vecs, per_thread), 32) * 32;
  if (per_thread > cache) {
    threads = kNormBlockMaxThreads;
    per_thread = detail::ceil_div(vecs, threads);
  }
  l.group = false;
  l.lanes = static_cast<int>(threads);
  l.block = static_cast<unsigned>(threads);
  l.grid = static_cast<unsigned>(std::min(rows, kNormMaxGrid));
  l.cached = per_thread <= cache;
  return l;
}

}  // namespace vortex::cuda
