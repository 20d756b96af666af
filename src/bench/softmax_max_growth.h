// How often an online softmax's running max grows from one key tile to the next, on given q and k:
// the count a speculative-max attention kernel depends on (bench/notes/attention.md, "A shape for
// the speculative max"). Such a kernel computes a tile's exponentials against the running max
// before the tile's own max is known, and a warp redoes its tile when the max of any of its 16
// query rows grew. `bench h3-block` states the rate on a real block's q and k beside the rate on
// N(0, 1) ones and the i.i.d. expectation.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::bench {

constexpr int64_t kMaxGrowthWarpRows = 16;  // query rows of a consumer warp in the Hopper kernels

struct MaxGrowth {
  int64_t warps = 0;                    // sampled warps (kMaxGrowthWarpRows consecutive rows each)
  int64_t tiles = 0;                    // key tiles per row
  double row_tile_fraction = 0;         // (row, tile >= 1) pairs whose running max grew
  double warp_tile_fraction = 0;        // (warp, tile >= 1) pairs with a grown row: the redo rate
  double iid_row_tile_fraction = 0;     // the same for i.i.d. scores: mean over tiles t >= 1 of 1 / (t + 1)
  double iid_warp_tile_fraction = 0;    // ... of 1 − (1 − 1 / (t + 1))^16
};

// q [Nq, H, D], k [Nk, H, D]: host F32 or BF16 views with unit stride on D. Per head,
// `warps_per_head` groups of 16 consecutive query rows, spread evenly over the queries (starts
// aligned to 16), against every key in tiles of `tile_keys` (the last may be short). A row's
// scores are fp32 dot products: the int8fp8 kernel's quantized scores differ from them by about 1%,
// and its smoothing of K by the mean shifts all of a row's scores by one constant, which moves no
// max. Growth is strict (an equal tile max leaves alpha = 1). invalid_argument names the operand.
Result<MaxGrowth> softmax_max_growth(const TensorView& q, const TensorView& k, int64_t warps_per_head,
                                    int64_t tile_keys = 128);

nlohmann::json max_growth_json(const MaxGrowth& g);

}  // namespace vortex::bench
