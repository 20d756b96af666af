#!/usr/bin/env python3
"""Prints where a key tile's cycles go in the attention kernels, from the `derived.timeline` that
`VORTEX_ATTENTION_TIMELINE=1 vortex bench attention` writes into its manifests
(src/cuda/kernel_timeline.h).

    python3 tools/bench/timeline_summary.py DIR_OR_MANIFEST...

For every manifest with a timeline: per consumer warpgroup, the median cycles from each mark of the
kernel's key-tile loop to the next, with the share of the round, then the round itself. Both
consumers side by side show whether they alternate (one's softmax under the other's products) or
wait on each other.
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
            cells += f"{cycles:>10d}{share:>8s}"
        lines.append(f"  {entry['from_to'][:70]:70s}{cells}")
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
    if not found:
        sys.exit("no manifest with a derived.timeline (run vortex bench attention with VORTEX_ATTENTION_TIMELINE=1)")


if __name__ == "__main__":
    main()
