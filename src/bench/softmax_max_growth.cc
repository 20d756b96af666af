#include "bench/softmax_max_growth.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "cpu/rows.h"

namespace vortex::bench {

namespace {

Status check_operand(const TensorView& t, const char* what) {
  if (t.device != Device::kCpu) return invalid_argument(std::string("softmax_max_growth ") + what + ": must be on the host");
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
    return invalid_argument(std::string("softmax_max_growth ") + what + ": dtype " + dtype_name(t.dtype) +
                            " (expected F32 or BF16)");
  }
  if (t.rank() != 3 || t.strides[2] != 1) {
    return invalid_argument(std::string("softmax_max_growth ") + what + ": must be [N, H, D] with unit stride on D, got " +
                            t.shape.to_string());
  }
  return ok_status();
}

// One head's rows [n, D] as contiguous floats.
std::vector<float> head_rows(const TensorView& t, int64_t head) {
  const int64_t n = t.shape[0], d = t.shape[2];
  std::vector<float> out(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i) cpu::load_row(cpu::row_ptr(t, i, head), t.dtype, d, out.data() + i * d);
  return out;
}

}  // namespace

Result<MaxGrowth> softmax_max_growth(const TensorView& q, const TensorView& k, int64_t warps_per_head,
                                    int64_t tile_keys) {
  VORTEX_RETURN_IF_ERROR(check_operand(q, "q"));
  VORTEX_RETURN_IF_ERROR(check_operand(k, "k"));
  const int64_t nq = q.shape[0], nk = k.shape[0], heads = q.shape[1], d = q.shape[2];
  if (k.shape[1] != heads || k.shape[2] != d) {
    return invalid_argument("softmax_max_growth k: " + k.shape.to_string() + " does not match q " + q.shape.to_string());
  }
  if (nq < kMaxGrowthWarpRows || nk < 1) {
    return invalid_argument("softmax_max_growth q: needs at least 16 rows and k at least one, got " +
                            q.shape.to_string() + " and " + k.shape.to_string());
  }
  if (warps_per_head < 1 || tile_keys < 1) {
    return invalid_argument("softmax_max_growth: warps_per_head and tile_keys must be >= 1");
  }
  const int64_t tiles = (nk + tile_keys - 1) / tile_keys;
  const int64_t groups = nq / kMaxGrowthWarpRows;
  const int64_t warps = std::min(warps_per_head, groups);
  // Per head: grown (row, tile) pairs and redone (warp, tile) pairs, tiles >= 1.
  std::vector<int64_t> grown(static_cast<size_t>(heads), 0), redone(static_cast<size_t>(heads), 0);
  parallel_for(0, heads, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const std::vector<float> qh = head_rows(q, h), kh = head_rows(k, h);
      for (int64_t w = 0; w < warps; ++w) {
        const int64_t row0 = (w * groups / warps) * kMaxGrowthWarpRows;
        // The warp's rows transposed, [D][16]: each key's 16 dot products then run across the rows
        // (vectorisable without reordering any one row's sum).
        std::vector<float> qt(static_cast<size_t>(d * kMaxGrowthWarpRows));
        for (int64_t r = 0; r < kMaxGrowthWarpRows; ++r) {
          for (int64_t c = 0; c < d; ++c) qt[c * kMaxGrowthWarpRows + r] = qh[(row0 + r) * d + c];
        }
        float running[kMaxGrowthWarpRows], tile_max[kMaxGrowthWarpRows];
        std::fill(std::begin(running), std::end(running), -std::numeric_limits<float>::infinity());
        for (int64_t t = 0; t < tiles; ++t) {
          std::fill(std::begin(tile_max), std::end(tile_max), -std::numeric_limits<float>::infinity());
          for (int64_t j = t * tile_keys; j < std::min(nk, (t + 1) * tile_keys); ++j) {
            const float* kj = kh.data() + j * d;
            float s[kMaxGrowthWarpRows] = {};
            for (int64_t c = 0; c < d; ++c) {
              for (int64_t r = 0; r < kMaxGrowthWarpRows; ++r) s[r] += qt[c * kMaxGrowthWarpRows + r] * kj[c];
            }
            for (int64_t r = 0; r < kMaxGrowthWarpRows; ++r) tile_max[r] = std::max(tile_max[r], s[r]);
          }
          bool any = false;
          for (int64_t r = 0; r < kMaxGrowthWarpRows; ++r) {
            const bool grew = tile_max[r] > running[r];
            if (t > 0) {
              grown[h] += grew;
              any = any || grew;
            }
            running[r] = std::max(running[r], tile_max[r]);
          }
          if (t > 0) redone[h] += any;
        }
      }
    }
  });
  MaxGrowth g;
  g.warps = warps * heads;
  g.tiles = tiles;
  int64_t grown_total = 0, redone_total = 0;
  for (int64_t h = 0; h < heads; ++h) grown_total += grown[h], redone_total += redone[h];
  if (tiles > 1) {
    g.row_tile_fraction =
        static_cast<double>(grown_total) / static_cast<double>(g.warps * kMaxGrowthWarpRows * (tiles - 1));
    g.warp_tile_fraction = static_cast<double>(redone_total) / static_cast<double>(g.warps * (tiles - 1));
    for (int64_t t = 1; t < tiles; ++t) {
      const double p = 1.0 / static_cast<double>(t + 1);
      g.iid_row_tile_fraction += p;
      g.iid_warp_tile_fraction += 1.0 - std::pow(1.0 - p, static_cast<double>(kMaxGrowthWarpRows));
    }
    g.iid_row_tile_fraction /= static_cast<double>(tiles - 1);
    g.iid_warp_tile_fraction /= static_cast<double>(tiles - 1);
  }
  return g;
}

nlohmann::json max_growth_json(const MaxGrowth& g) {
  return {{"sampled_warps", g.warps},
          {"key_tiles", g.tiles},
          {"rows_per_warp", kMaxGrowthWarpRows},
          {"row_tile_growth_fraction", g.row_tile_fraction},
          {"warp_tile_redo_fraction", g.warp_tile_fraction},
          {"iid_row_tile_growth_fraction", g.iid_row_tile_fraction},
          {"iid_warp_tile_redo_fraction", g.iid_warp_tile_fraction}};
}

}  // namespace vortex::bench
