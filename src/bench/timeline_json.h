// The summary of a kernel timeline (cuda/kernel_timeline.h) that `vortex bench attention` puts in
// its manifests as derived.timeline under VORTEX_ATTENTION_TIMELINE=1.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "cuda/kernel_timeline.h"

namespace vortex::bench {

// Per consumer warpgroup (4 warps each), the median over its warps and key tiles 1 .. T−2 (the last
// tile takes the masked softmax) of the cycles from each mark to the next (the last to the next
// tile's first), then of the whole round (first mark to first mark): an array of {from_to,
// cycles}. Also the unit, the CTA, the tile count and the event names. With fewer than 4 tiles
// there is no interval to take, and only those fields are written.
// With CTA records (KernelTimeline::ctas), also "ctas": where the CTAs' time goes outside the key
// sweep and between the CTAs an SM runs one after another (cta_summary_json).
nlohmann::json timeline_json(const cuda::KernelTimeline& t);

// The CTA records' summary: how many CTAs and SMs (and CTAs per SM, fewest and most); the median
// over CTAs of the cycles from start to the first tile done (prologue), to the sweep's end, to the
// CTA's end (epilogue) and in all; the gaps between consecutive CTAs on one SM (cycles: median,
// most); the kernel's span (ns, first start to last end); and the SM whose last CTA ended last:
// its CTAs, the ns they ran and its span. CTAs with a mark missing are only counted (unrecorded).
nlohmann::json cta_summary_json(const std::vector<cuda::CtaSpan>& ctas);

}  // namespace vortex::bench
