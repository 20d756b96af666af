// The summary of a kernel timeline (cuda/kernel_timeline.h) that `vortex bench attention` puts in
// its manifests as derived.timeline under VORTEX_ATTENTION_TIMELINE=1.
#pragma once

#include <nlohmann/json.hpp>

#include "cuda/kernel_timeline.h"

namespace vortex::bench {

// Per consumer warpgroup (4 warps each), the median over its warps and key tiles 1 .. T−2 (the last
// tile takes the masked softmax) of the cycles from each mark to the next (the last to the next
// tile's first), then of the whole round (first mark to first mark): an array of {from_to,
// cycles}. Also the unit, the CTA, the tile count and the event names. With fewer than 4 tiles
// there is no interval to take, and only those fields are written.
nlohmann::json timeline_json(const cuda::KernelTimeline& t);

}  // namespace vortex::bench
