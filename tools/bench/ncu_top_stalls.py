#!/usr/bin/env python3
"""Prints where a kernel's warps wait, from Nsight Compute's source page exported as CSV.

    ncu -i report.ncu-rep --page source --csv --print-source sass > source.csv
    python3 tools/bench/ncu_top_stalls.py source.csv [--top 40]

The source page has one row per SASS instruction with its warp-stall sample counts. This prints the
instructions holding the most samples, each with its share of all samples, and the share of
samples by instruction kind (opcode before the first '.', after any predicate), so a kernel's waits
can be read as "62% on the wgmma wait, 20% on MUFU.EX2" rather than guessed from section totals.
Where the page has the per-reason columns (stall_wait, stall_dispatch, ...; `--set full`), each
kind also gets its leading reasons: "MUFU ... wait 66%" says the exp2s wait on the instruction that
feeds them, "dispatch" or "math" would say the pipe. Column names differ between Nsight Compute
versions: the sample column is found by its name, and the header is printed when it is not.
"""

import argparse
import collections
import csv
import sys


def find_column(header, *needles):
    for name in header:
        if all(n.lower() in name.lower() for n in needles):
            return name
    return None


def number(text):
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def instruction_kind(text):
    """The opcode before its first '.', past a predicate: "@!P0 BRA 0x10" is a BRA."""
    words = [w for w in text.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=40, help="instructions to list (default 40)")
    args = parser.parse_args()

    with open(args.csv, newline="") as f:
        # ncu prints progress lines before the table when run without --quiet: start at the header.
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if "Source" in line and "," in line), None)
    if start is None:
        sys.exit(f"{args.csv}: no source table (no header line naming 'Source')")
    rows = list(csv.DictReader(lines[start:]))
    header = list(rows[0].keys()) if rows else []
    samples = find_column(header, "Warp Stall Sampling", "All")
    source = find_column(header, "Source")
    address = find_column(header, "Address")
    if samples is None or source is None:
        sys.exit(f"{args.csv}: no warp-stall sample column; columns are: {header}")

    total = sum(number(r[samples]) for r in rows)
    if total == 0:
        sys.exit(f"{args.csv}: no stall samples recorded (profile with --set full or the SourceCounters section)")
    # All samples per reason; the "(Not Issued)" columns are their subsets.
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    by_kind, instructions = collections.Counter(), collections.Counter()
    reasons_by_kind = collections.defaultdict(collections.Counter)
    for r in rows:
        kind = instruction_kind(r[source])
        by_kind[kind] += number(r[samples])
        instructions[kind] += 1
        for name in reasons:
            reasons_by_kind[kind][name[len("stall_"):]] += number(r[name])

    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    print("by instruction kind:")
    for kind, count in by_kind.most_common(15):
        line = f"  {100 * count / total:5.1f}%  {kind:<12} {instructions[kind]:4d} instructions"
        kind_total = sum(reasons_by_kind[kind].values())
        if kind_total > 0:
            leading = reasons_by_kind[kind].most_common(3)
            line += "; " + ", ".join(f"{name} {100 * n / kind_total:.0f}%" for name, n in leading if n > 0)
        print(line)
    print(f"top {args.top} instructions:")
    for r in sorted(rows, key=lambda r: -number(r[samples]))[: args.top]:
        where = r.get(address, "") if address else ""
        print(f"  {100 * number(r[samples]) / total:5.1f}%  {where:>8}  {r[source].strip()}")


if __name__ == "__main__":
    main()
