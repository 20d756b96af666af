#!/usr/bin/env python3
"""Summarises `scripts/gpu-check --ab-cycles`: the shipped kernels' cycles under Nsight Compute at a
locked clock, side A against side B.

    python3 tools/bench/ncu_cycles_summary.py OUT/cycles

OUT/cycles holds one `ncu --csv` report per run, named <side>-<pair>.csv (a-1.csv, b-1.csv, a-2.csv,
...). Per kernel (name and grid) and metric: the median over every profiled launch of each side, and
B over A. Where B launches a kernel on another grid than A (a change of the CTA's size), the
kernel's grids that only one side has are paired in the order each side first launched them.
Cycles at a locked clock do not move with the power cap, so a change of 0.5% reads clearly in one
call; the timeline instance cannot stand in for this where a change moves work next to its marks
(bench/notes/attention.md, session 13).
"""

import collections
import csv
import pathlib
import statistics
import sys


def rows(path):
    """The metric rows of one ncu CSV report (ncu prints ==PROF== lines before the header)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith('"')]
    return csv.DictReader(lines)


def pair_grids(grids_a, grids_b):
    """(grid A, grid B) pairs of one kernel: the grids both sides launched, then the rest in order."""
    common = [g for g in grids_a if g in grids_b]
    only_a = [g for g in grids_a if g not in grids_b]
    only_b = [g for g in grids_b if g not in grids_a]
    pairs = [(g, g) for g in common] + list(zip(only_a, only_b))
    pairs += [(g, None) for g in only_a[len(only_b):]] + [(None, g) for g in only_b[len(only_a):]]
    return pairs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = pathlib.Path(sys.argv[1])
    reports = sorted(root.glob("[ab]-*.csv"))
    if not reports:
        sys.exit(f"{root}: no a-N.csv / b-N.csv reports")
    # values[side][(kernel, grid)][metric]: every launch's value; grids[side][kernel]: first-launch order.
    values = {"a": collections.defaultdict(lambda: collections.defaultdict(list)),
              "b": collections.defaultdict(lambda: collections.defaultdict(list))}
    grids = {"a": collections.defaultdict(list), "b": collections.defaultdict(list)}
    for report in reports:
        side = report.name.split("-")[0]
        for row in rows(report):
            kernel, grid = row["Kernel Name"].split("(")[0].strip(), row["Grid Size"]
            if grid not in grids[side][kernel]:
                grids[side][kernel].append(grid)
            values[side][(kernel, grid)][row["Metric Name"]].append(float(row["Metric Value"].replace(",", "")))
    if not values["a"] and not values["b"]:
        sys.exit(f"{root}: the reports hold no metric rows (did the kernel-name regex match?)")
    for kernel in sorted(set(grids["a"]) | set(grids["b"])):
        for grid_a, grid_b in pair_grids(grids["a"][kernel], grids["b"][kernel]):
            grid = grid_a if grid_a == grid_b else f"{grid_a or '-'} (A) / {grid_b or '-'} (B)"
            print(f"{kernel} grid {grid}")
            print(f"  {'metric':28s} {'A median':>16s} {'B median':>16s} {'B / A':>8s}  launches A, B")
            a_metrics = values["a"].get((kernel, grid_a), {})
            b_metrics = values["b"].get((kernel, grid_b), {})
            for metric in sorted(set(a_metrics) | set(b_metrics)):
                a, b = a_metrics.get(metric, []), b_metrics.get(metric, [])
                if not a or not b:
                    print(f"  {metric:28s} missing on side {'A' if not a else 'B'}")
                    continue
                ma, mb = statistics.median(a), statistics.median(b)
                print(f"  {metric:28s} {ma:16.1f} {mb:16.1f} {mb / ma:8.4f}  {len(a)}, {len(b)}")


if __name__ == "__main__":
    main()
