#!/usr/bin/env python3
"""Summarises an A/B run of `scripts/gpu-check --ab`: per measured item, each run's median and SM
clock for side A and side B, in the order they ran, and B's mean median over A's.

    python3 tools/bench/ab_summary.py OUT/ab

OUT/ab holds one folder per run, named <side>-<pair> (a-1, b-1, a-2, ...), each with the manifests
`vortex bench --json-dir` wrote. Runs alternate between the sides, so a drift of the card (clock,
temperature) shows up in both columns instead of in the ratio. Where the manifests record the
output's checksums (run.derived.checksums), the line ends with whether every run of both sides
produced the same bits ("bits A = B") or not ("bits DIFFER"), the bitwise gate of a change that
claims to keep them.
"""

import collections
import json
import pathlib
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = pathlib.Path(sys.argv[1])
    runs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: (int(p.name.split("-")[1]), p.name))
    if not runs:
        sys.exit(f"{root}: no run folders")
    table = collections.defaultdict(lambda: {"a": [], "b": []})
    bits = collections.defaultdict(set)  # item -> the distinct checksum sets its runs recorded
    for run in runs:
        side = run.name.split("-")[0]
        for manifest in sorted(run.glob("*.json")):
            r = json.loads(manifest.read_text())["run"]
            clock = (r.get("gpu_during_samples") or {}).get("sm_clock_mhz") or {}
            table[manifest.stem][side].append((r["median"], clock.get("mean")))
            sums = (r.get("derived") or {}).get("checksums")
            if sums:
                bits[manifest.stem].add(json.dumps({k: v["sha256"] for k, v in sums.items()}, sort_keys=True))
    for item, sides in table.items():
        cells = []
        for side in ("a", "b"):
            cells.append(" ".join(f"{m:.3f}" + (f"@{c:.0f}" if c else "") for m, c in sides[side]))
        a = [m for m, _ in sides["a"]]
        b = [m for m, _ in sides["b"]]
        ratio = (sum(b) / len(b)) / (sum(a) / len(a)) if a and b else float("nan")
        gate = "" if not bits[item] else "  bits A = B" if len(bits[item]) == 1 else "  bits DIFFER"
        print(f"{item:32s} A {cells[0]:30s} B {cells[1]:30s} B/A {ratio:.4f}{gate}")


if __name__ == "__main__":
    main()
