#!/usr/bin/env python3
"""Regenerates the README's performance table from the committed run manifests.

    python3 tools/bench/readme_table.py            # rewrite README.md between the table markers
    python3 tools/bench/readme_table.py --check    # exit 1 if README.md is stale

Reads every bench/results/<gpu>/<run>/*.json manifest, verifies each section digest (a manifest
edited by hand no longer verifies and is refused), and keeps the newest run per workload.
"""

import argparse
import hashlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"


class Literal(str):
    """A number exactly as the manifest spells it (nlohmann's shortest-digits printer and Python's
    repr disagree on the last digit of some doubles, so numbers are never re-printed)."""


def canonical(value):
    # nlohmann::json's dump(): sorted keys, no whitespace, non-ASCII kept as UTF-8.
    if isinstance(value, Literal):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{canonical(k)}:{canonical(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def load(path):
    """(manifest with numbers as plain floats, the same with numbers as Literals)."""
    text = path.read_text()
    return json.loads(text), json.loads(text, parse_float=Literal, parse_int=Literal)


def verified(literal_manifest):
    digests = literal_manifest.get("digests", {})
    return digests and all(
        hashlib.sha256(canonical(literal_manifest[k]).encode()).hexdigest() == v for k, v in digests.items())


def rows():
    newest = {}
    for path in sorted((ROOT / "bench" / "results").glob("*/*/*.json")):
        manifest, literal = load(path)
        if manifest.get("schema") != "vortex.bench.v1":
            continue  # e.g. a `vortex generate` summary kept beside the manifests
        if not verified(literal):
            sys.exit(f"{path}: section digests do not verify")
        run = manifest["run"]
        key = (path.parts[-3], run["workload"])
        if key not in newest or run["observed_at"] > newest[key][0]["run"]["observed_at"]:
            newest[key] = (manifest, path)
    out = []
    for (gpu, workload), (m, path) in sorted(newest.items()):
        run, env = m["run"], m["environment"]
        peers = ", ".join(
            f"{p['name']} {p['median_ms']:.1f} ms ({p['ratio_peer_over_vortex']:.2f}×)"
            for p in m.get("peers", []) if "median_ms" in p)
        tflops = run.get("derived", {}).get("tflops")
        clock = (run.get("gpu_during_samples", {}).get("sm_clock_mhz") or {}).get("mean")
        out.append(f"| {workload} | {gpu} | {run['median']:.2f} | "
                   f"{tflops:.0f} | " if tflops else f"| {workload} | {gpu} | {run['median']:.2f} | – | ")
        out[-1] += f"{clock:.0f} | " if clock else "– | "
        out[-1] += (f"{peers or '–'} | {'pass' if m['correctness']['passed'] else 'FAIL'} "
                    f"(rel-L2 {m['correctness']['rel_l2']:.1e}) | {run['observed_at'][:10]}, "
                    f"{env.get('git_commit', '?')} | `{path.relative_to(ROOT)}` |")
    return out


def table():
    header = ["| workload | GPU | median ms | TFLOP/s | SM MHz (driver-reported mean over the samples) | "
              "peers in the same run (peer ms, ratio peer/vortex) | correctness | date, commit | manifest |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    return "\n".join(header + rows())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    updated = readme[:start] + "\n" + table() + "\n" + readme[end:]
    if args.check:
        sys.exit(0 if updated == readme else 1)
    (ROOT / "README.md").write_text(updated)


if __name__ == "__main__":
    main()
