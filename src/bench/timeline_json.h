// The summary of a kernel timeline (cuda/kernel_timeline.h) that `vortex bench attention` puts in
// its manifests as derived.timeline under VORTEX_ATTENTION_TIMELINE=1.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <vector>

#include "cuda/kernel_timeline.h"
#include "vortex/status.h"

namespace vortex::bench {

// Per consumer warpgroup (4 warps each), the median over its warps and key tiles 1 .. T−2 (the last
// tile takes the masked softmax) of the cycles from each mark to the next (the last to the next
// tile's first), then of the whole round (first mark to first mark): an array of {from_to,
// cycles}; with two consumers or more, each mark-to-mark entry also has
// other_consumer_in_this_phase: the median share of that interval during which the next consumer's
// warp on the same sub-partition was in the same interval of its own tiles (near 1: the two run that
// phase together and share its units; near 0: they alternate). Each mark-to-mark entry also has
// warp_spread_at_start, the median cycles between the consumer's earliest and latest warp at the
// interval's first mark, and last_warp_share_at_start, how often each of its warps 0..3 was the
// latest (a product is a warpgroup instruction: the earlier warps wait for the latest). Also the
// unit, the CTA, the tile count and the event names. With fewer than 4 tiles there is no interval
// to take, and only those fields are written.
// With CTA records (KernelTimeline::ctas), also "ctas": where the CTAs' time goes outside the key
// sweep and between the CTAs an SM runs one after another (cta_summary_json). "cluster_ctas": how
// many CTAs shared each K / V load in the recorded launch.
nlohmann::json timeline_json(const cuda::KernelTimeline& t);

// The CTA records' summary: how many CTAs and SMs (and CTAs per SM, fewest and most); the median
// over CTAs of the cycles from start to the first tile done (prologue), to the sweep's end, to the
// CTA's end (epilogue) and in all; the gaps between consecutive CTAs on one SM (cycles: median,
// most); the kernel's span (ns, first start to last end); the clock the CTAs ran at (their cycles
// over their ns, MHz); and the SM whose last CTA ended last: its CTAs, the ns and cycles they ran
// and its span. CTAs with a mark missing are only counted (unrecorded).
nlohmann::json cta_summary_json(const std::vector<cuda::CtaSpan>& ctas);

// VORTEX_ATTENTION_TIMELINE as a launch count: 0 when unset or empty, else 1 .. 1000; anything else is
// an error naming the variable.
Result<int> timeline_launches_from_env();

// VORTEX_ATTENTION_TIMELINE_CLUSTER: the cluster size the timeline instances run with (1 or 2 CTAs
// sharing each K / V load), or 0 (unset or empty) for the size-based choice the shipped launches
// make; anything else is an error naming the variable. With it, the multicast's cost in cycles and
// its gain in clock are measured apart at one shape.
Result<int> timeline_cluster_from_env();

// Runs a timeline instance `launches` times back to back and summarises the last launch
// (timeline_json); with more than one launch and CTA records, "launches" lists each launch's kernel
// ns, clock (MHz) and the last SM's busy cycles, so a sustained run's cycles and clock can be read
// apart as the power controller settles.
Result<nlohmann::json> repeated_timeline_json(int launches,
                                              const std::function<Result<cuda::KernelTimeline>()>& launch);

}  // namespace vortex::bench
