#!/usr/bin/env python3
"""Prints where a key tile's cycles go in the attention kernels, from the `derived.timeline` that
`VORTEX_ATTENTION_TIMELINE=1 vortex bench attention` writes into its manifests
(src/cuda/kernel_timeline.h).

    python3 tools/bench/timeline_summary.py DIR_OR_MANIFEST...

For every manifest with a timeline: per consumer warpgroup, the median cycles from each mark of the
kernel's key-tile loop to the next, with the share of the round, then the round itself. The
consumers side by side show whether they alternate (one's softmax under the other's products) or
wait on each other; the bracketed share is how much of the phase the next consumer's warp on the
same sub-partition spent in the same phase (near 100%: they run it together and share its units).
Below the table, how far apart each consumer's 4 warps (one per sub-partition) reach each mark: the
median spread in cycles, and how often each of warps 0..3 is the last (a product is a warpgroup
instruction, so at an issue the other warps wait for the last). Then, from every CTA's records,
the median CTA's prologue / sweep / epilogue, the gaps between the CTAs one SM runs, the kernel's
span against the last SM's busy time and the clock the CTAs ran at; with several launches
(VORTEX_ATTENTION_TIMELINE=N), each launch's span, clock and the last SM's busy cycles.
"""

import json
import pathlib
import sys


def manifests(paths):
    for path in map(pathlib.Path, paths):
        yield from sorted(path.glob("*.json")) if path.is_dir() else [path]


def summarize(name, timeline):
    consumers = sorted(k for k in timeline if k.startswith("consumer"))
    if not consumers:
        return [f"{name}: timeline of {timeline.get('tiles', '?')} tiles, too few to summarize"]
    lines = [f"{name}: {timeline.get('cta', 'one CTA')}, {timeline['tiles']} key tiles, {timeline['unit']}"]
    header = f"  {'from -> to':70s}" + "".join(f"{c:>18s}" for c in consumers)
    lines.append(header)
    phases = [timeline[c] for c in consumers]
    rounds = [next(p["cycles"] for p in ph if p["from_to"] == "round") for ph in phases]
    for i, entry in enumerate(phases[0]):
        cells = ""
        for ph, rnd in zip(phases, rounds):
            cycles = ph[i]["cycles"]
            share = "" if entry["from_to"] == "round" else f" ({100.0 * cycles / rnd:4.1f}%)"
            together = ph[i].get("other_consumer_in_this_phase")
            together = "" if together is None else f" [{100.0 * together:3.0f}%]"
            cells += f"{cycles:>10d}{share:>8s}{together:>7s}"
        lines.append(f"  {entry['from_to'][:70]:70s}{cells}")
    return lines + summarize_spread(phases)


def summarize_spread(phases):
    """The warps' spread at each mark (manifests from before it was recorded have none)."""
    marks = [i for i, entry in enumerate(phases[0]) if "warp_spread_at_start" in entry]
    if not marks:
        return []
    lines = ["  the consumer's 4 warps at each mark: spread in cycles, and the last warp's share (warps 0/1/2/3)"]
    for i in marks:
        cells = ""
        for ph in phases:
            last = "/".join(f"{100.0 * share:.0f}" for share in ph[i]["last_warp_share_at_start"])
            cells += f"{ph[i]['warp_spread_at_start']:>8d} {last:>15s}%"
        lines.append(f"    {ph[i]['from_to'].split(' -> ')[0][:68]:68s}{cells}")
    return lines


def summarize_ctas(ctas):
    lines = [f"  CTAs: {ctas['count']} on {ctas['sms']} SMs ({ctas.get('unrecorded', 0)} unrecorded)"]
    if "median_cycles" not in ctas:
        return lines
    per_sm = ctas["ctas_per_sm"]
    lines.append(f"    per SM: {per_sm['fewest']} to {per_sm['most']} CTAs")
    total = ctas["median_cycles"]["total"]
    for phase, cycles in ctas["median_cycles"].items():
        share = "" if phase == "total" else f" ({100.0 * cycles / total:4.1f}%)"
        lines.append(f"    median CTA, {phase:50s}{cycles:>10d} cycles{share}")
    if "same_sm_gap_cycles" in ctas:
        gap = ctas["same_sm_gap_cycles"]
        lines.append(f"    gap between consecutive CTAs on one SM: median {gap['median']}, most {gap['most']} cycles")
    last = ctas["last_sm"]
    lines.append(f"    kernel span {ctas['kernel_ns'] / 1000:.1f} us; the last SM ran {last['ctas']} CTAs for "
                 f"{last['busy_ns'] / 1000:.1f} us of its {last['span_ns'] / 1000:.1f} us")
    if "clock_mhz" in ctas:
        lines.append(f"    the CTAs ran at {ctas['clock_mhz']:.0f} MHz (their cycles over their ns)")
    return lines


def summarize_launches(launches):
    lines = ["  launches, back to back:"]
    for i, launch in enumerate(launches):
        lines.append(f"    {i + 1:3d}: span {launch['kernel_ns'] / 1000:10.1f} us at {launch['clock_mhz']:6.0f} MHz, "
                     f"the last SM busy {launch['last_sm_busy_cycles']:>12d} cycles")
    return lines


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    found = 0
    for path in manifests(sys.argv[1:]):
        timeline = json.loads(path.read_text()).get("run", {}).get("derived", {}).get("timeline")
        if timeline is None:
            continue
        found += 1
        print("\n".join(summarize(path.stem, timeline)))
        if "ctas" in timeline:
            print("\n".join(summarize_ctas(timeline["ctas"])))
        if "cluster_ctas" in timeline:
            print(f"  clusters of {timeline['cluster_ctas']} CTA(s) sharing each K / V load")
        if "launches" in timeline:
            print("\n".join(summarize_launches(timeline["launches"])))
    if not found:
        sys.exit("no manifest with a derived.timeline (run vortex bench attention with VORTEX_ATTENTION_TIMELINE=1)")


if __name__ == "__main__":
    main()
