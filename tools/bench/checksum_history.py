#!/usr/bin/env python3
"""The outputs' checksums across the committed manifests that record them (h3-denoise*: the
denoise latents; vae-decode-*: the frames and the waveform): the cross-build half of the exactness
gate (a change that claims the same bits must leave them where they were).

    python3 tools/bench/checksum_history.py                    # every committed run, oldest first
    python3 tools/bench/checksum_history.py --against DIR      # DIR's new manifests with checksums
                                                               # against the latest committed run of each
    python3 tools/bench/checksum_history.py --results PATH ...  # another results tree (tests)

Runs are compared per GPU model (the manifest's environment.gpu): cuBLASLt may choose other
algorithms on another model, so an H100's bits are only held to an H100's. The history marks each
run whose checksums differ from the previous run of the same workload on the same model (an
intended change of the program, or a break). With --against, the exit status is 1 when any of DIR's
workloads has checksums other than its latest committed run's on that model, and each such
workload is named.
"""

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def checksums(path):
    """(GPU model, ((output name, sha256), ...) sorted by name) of a manifest, or None without
    checksums (or when the file is not a manifest)."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    run = manifest.get("run") if isinstance(manifest, dict) else None
    c = ((run or {}).get("derived") or {}).get("checksums")
    if not isinstance(c, dict) or not c:
        return None
    gpu = (manifest.get("environment") or {}).get("gpu", "")
    return gpu, tuple(sorted((name, entry["sha256"]) for name, entry in c.items()))


def label(workload, gpu):
    return f"{workload} on {gpu}" if gpu else workload


def describe(sums):
    return "  ".join(f"{name} {sha[:16]}" for name, sha in sums)


def history(results):
    """{(workload, GPU model): [(run folder name, checksums)]}, oldest first by the manifests'
    run.observed_at (the folders are named date-commit, and commits do not sort by time)."""
    runs = {}
    for path in results.glob("*/*/*.json"):
        found = checksums(path)
        if found is not None:
            gpu, sums = found
            observed = json.loads(path.read_text())["run"].get("observed_at", "")
            runs.setdefault((path.stem, gpu), []).append((observed, path.parent.name, sums))
    return {key: [(folder, sums) for _, folder, sums in sorted(entries)] for key, entries in runs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=ROOT / "bench" / "results")
    parser.add_argument("--against", type=pathlib.Path)
    args = parser.parse_args()
    runs = history(args.results)
    if not runs:
        sys.exit(f"{args.results}: no manifest with checksums")
    if args.against is None:
        for (workload, gpu), entries in sorted(runs.items()):
            print(label(workload, gpu))
            previous = None
            for folder, sums in entries:
                mark = "" if previous in (None, sums) else "  <- changed"
                print(f"  {folder:24s} {describe(sums)}{mark}")
                previous = sums
        return
    new = {p.stem: checksums(p) for p in sorted(args.against.glob("*.json"))}
    new = {w: found for w, found in new.items() if found is not None}
    if not new:
        sys.exit(f"{args.against}: no manifest with checksums")
    differ = []
    for workload, (gpu, sums) in sorted(new.items()):
        if (workload, gpu) not in runs:
            print(f"{label(workload, gpu)}: no committed run to compare with")
            continue
        folder, committed = runs[(workload, gpu)][-1]
        same = sums == committed
        print(f"{label(workload, gpu)}: {'the same bits as' if same else 'DIFFERENT from'} {folder}")
        if not same:
            differ.append(workload)
    if differ:
        sys.exit("checksums differ: " + ", ".join(differ))


if __name__ == "__main__":
    main()
