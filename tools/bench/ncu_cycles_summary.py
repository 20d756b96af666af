#!/usr/bin/env python3
"""Summarises `scripts/gpu-check --ab-cycles`: the shipped kernels' cycles under Nsight Compute at a
locked clock, side A against side B.

    python3 tools/bench/ncu_cycles_summary.py OUT/cycles

OUT/cycles holds one `ncu --csv` report per run, named <side>-<pair>.csv (a-1.csv, b-1.csv, a-2.csv,
...). Per kernel (name and grid) and metric: the median over every profiled launch of each side, and
B over A.
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


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = pathlib.Path(sys.argv[1])
    reports = sorted(root.glob("[ab]-*.csv"))
    if not reports:
        sys.exit(f"{root}: no a-N.csv / b-N.csv reports")
    values = collections.defaultdict(lambda: {"a": [], "b": []})
    for report in reports:
        side = report.name.split("-")[0]
        for row in rows(report):
            value = float(row["Metric Value"].replace(",", ""))
            kernel = row["Kernel Name"].split("(")[0] + " grid " + row["Grid Size"]
            values[(kernel, row["Metric Name"])][side].append(value)
    if not values:
        sys.exit(f"{root}: the reports hold no metric rows (did the kernel-name regex match?)")
    shown = None
    for (kernel, metric), sides in sorted(values.items()):
        if kernel != shown:
            print(kernel)
            print(f"  {'metric':28s} {'A median':>16s} {'B median':>16s} {'B / A':>8s}  launches A, B")
            shown = kernel
        a, b = sides["a"], sides["b"]
        if not a or not b:
            print(f"  {metric:28s} missing on side {'A' if not a else 'B'}")
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"  {metric:28s} {ma:16.1f} {mb:16.1f} {mb / ma:8.4f}  {len(a)}, {len(b)}")


if __name__ == "__main__":
    main()
