#!/usr/bin/env python3
"""The bench tools under tools/bench, run by ctest (CPU only):

- readme_table.py --check: the README's performance table is the one the committed manifests make
  (and every manifest's digests verify);
- ncu_top_stalls.py on a small source-page CSV: shares and order;
- ab_summary.py on two pairs of synthetic runs: per-item medians in run order and the B/A ratio, and
  whether the two sides' recorded checksums agree;
- timeline_summary.py on a synthetic derived.timeline: per-consumer phases and shares of the round,
  the warps' spread at each mark, and the CTA records' summary;
- ncu_cycles_summary.py on synthetic ncu CSV reports: per kernel and grid, the medians and B/A, also
  where B launches a kernel on other grids;
- checksum_history.py on a synthetic results tree: runs in time order, changes marked, --against, a
  workload whose manifests name other outputs (a decode's frames), and runs held to the same GPU model's.
- tools/kernels/sass_outline.py: a table learned from a synthetic listing names the instructions of a
  kernel section in a synthetic ELF (found inside surrounding bytes, as in an executable).
"""

import json
import pathlib
import re
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "bench"


def run(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


class ReadmeTable(unittest.TestCase):
    def test_readme_table_matches_the_manifests(self):
        r = run(TOOLS / "readme_table.py", "--check")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


class ChecksumHistory(unittest.TestCase):
    @staticmethod
    def manifest(folder, workload, observed, video, audio):
        folder.mkdir(parents=True, exist_ok=True)
        sums = {"video": {"sha256": video, "sum": 1.0}, "audio": {"sha256": audio, "sum": 2.0}}
        run = {"observed_at": observed, "derived": {"checksums": sums}}
        (folder / f"{workload}.json").write_text(json.dumps({"run": run}))

    def test_history_in_time_order_and_the_check_against_a_new_run(self):
        with tempfile.TemporaryDirectory() as d:
            results = pathlib.Path(d) / "results"
            # Folder names do not sort by time: "aaa" ran last.
            for folder, hour, video in (("fff", 1, "v1"), ("bbb", 2, "v2"), ("aaa", 3, "v2")):
                self.manifest(results / "h200" / f"2026-11-30-{folder}", "h3-denoise", f"2026-11-30T0{hour}:00:00Z",
                              video * 32, "a1" * 32)
            r = run(TOOLS / "checksum_history.py", "--results", results)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            self.assertEqual([line.split()[0] for line in lines[1:]],
                             ["2026-11-30-fff", "2026-11-30-bbb", "2026-11-30-aaa"])
            self.assertTrue(lines[2].endswith("<- changed"))
            self.assertFalse(lines[3].endswith("<- changed"))

            same, other = pathlib.Path(d) / "same", pathlib.Path(d) / "other"
            self.manifest(same, "h3-denoise", "x", "v2" * 32, "a1" * 32)
            self.manifest(other, "h3-denoise", "x", "v3" * 32, "a1" * 32)
            r = run(TOOLS / "checksum_history.py", "--results", results, "--against", same)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("h3-denoise: the same bits as 2026-11-30-aaa", r.stdout)
            r = run(TOOLS / "checksum_history.py", "--results", results, "--against", other)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("DIFFERENT from 2026-11-30-aaa", r.stdout)
            self.assertIn("checksums differ: h3-denoise", r.stderr)

    def test_a_decode_checksum_beside_the_denoise(self):
        with tempfile.TemporaryDirectory() as d:
            results = pathlib.Path(d) / "results"
            self.manifest(results / "h100" / "2026-12-06-aaa", "h3-denoise", "2026-12-06T01:00:00Z", "v1" * 32,
                          "a1" * 32)
            decode = results / "h100" / "2026-12-06-bbb"
            decode.mkdir(parents=True)
            frames = {"frames": {"sha256": "f1" * 32, "sum": 3.0}}
            run_section = {"observed_at": "2026-12-06T02:00:00Z", "derived": {"checksums": frames}}
            (decode / "vae-decode-video.json").write_text(json.dumps({"run": run_section}))
            (decode / "notes.json").write_text("[1, 2]")  # not a manifest: skipped
            r = run(TOOLS / "checksum_history.py", "--results", results)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("vae-decode-video", r.stdout)
            self.assertIn("frames f1f1f1f1f1f1f1f1", r.stdout)
            new = pathlib.Path(d) / "new"
            new.mkdir()
            run_section["derived"]["checksums"]["frames"]["sha256"] = "f2" * 32
            (new / "vae-decode-video.json").write_text(json.dumps({"run": run_section}))
            r = run(TOOLS / "checksum_history.py", "--results", results, "--against", new)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("checksums differ: vae-decode-video", r.stderr)

    def test_runs_are_held_to_the_same_gpu_model(self):
        with tempfile.TemporaryDirectory() as d:
            results = pathlib.Path(d) / "results"

            def write(folder, gpu, sha, observed):
                folder.mkdir(parents=True, exist_ok=True)
                run_section = {"observed_at": observed,
                               "derived": {"checksums": {"frames": {"sha256": sha * 32, "sum": 1.0}}}}
                manifest = {"run": run_section, "environment": {"gpu": gpu}}
                (folder / "vae-decode-video.json").write_text(json.dumps(manifest))

            # The H200's run is the newest, with other bits than the H100's (another cuBLASLt choice).
            write(results / "h100" / "2026-12-06-aaa", "NVIDIA H100 80GB HBM3", "a1", "2026-12-06T01:00:00Z")
            write(results / "h200" / "2026-12-06-bbb", "NVIDIA H200", "b2", "2026-12-06T02:00:00Z")
            r = run(TOOLS / "checksum_history.py", "--results", results)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("<- changed", r.stdout)
            self.assertIn("vae-decode-video on NVIDIA H200", r.stdout)
            new = pathlib.Path(d) / "new"
            write(new, "NVIDIA H100 80GB HBM3", "a1", "x")
            r = run(TOOLS / "checksum_history.py", "--results", results, "--against", new)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("on NVIDIA H100 80GB HBM3: the same bits as 2026-12-06-aaa", r.stdout)
            other = pathlib.Path(d) / "other"
            write(other, "NVIDIA H100 PCIe", "c3", "x")
            r = run(TOOLS / "checksum_history.py", "--results", results, "--against", other)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("no committed run to compare with", r.stdout)


class NcuCyclesSummary(unittest.TestCase):
    HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
              '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')

    def report(self, cycles_by_grid):
        lines = ["==PROF== Connected to process 1 (vortex)\n", self.HEADER]
        for i, (grid, cycles) in enumerate(cycles_by_grid):
            lines.append(f'"{i}","1","vortex","h","void k<0, 0, 2>(CUtensorMap_st, P)","1","7","(384, 1, 1)",'
                         f'"{grid}","0","9.0","Command line profiler metrics","sm__cycles_active.avg","cycle",'
                         f'"{cycles:,.2f}"\n')
        return "".join(lines)

    def test_medians_per_kernel_and_grid_and_the_ratio(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            long, short = "(296, 56, 1)", "(36, 24, 1)"
            (root / "a-1.csv").write_text(self.report([(long, 1000000), (long, 1000002), (short, 5000)]))
            (root / "a-2.csv").write_text(self.report([(long, 999998)]))
            (root / "b-1.csv").write_text(self.report([(long, 990000), (short, 5100)]))
            (root / "b-2.csv").write_text(self.report([(long, 990000)]))
            r = run(TOOLS / "ncu_cycles_summary.py", d)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            at = lines.index("void k<0, 0, 2> grid (296, 56, 1)")
            self.assertIn("1000000.0", lines[at + 2])
            self.assertIn("990000.0", lines[at + 2])
            self.assertIn("0.9900  3, 2", lines[at + 2])
            short_at = lines.index("void k<0, 0, 2> grid (36, 24, 1)")
            self.assertIn("1.0200  1, 1", lines[short_at + 2])

    def test_a_kernel_whose_grid_changed_is_still_compared(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            (root / "a-1.csv").write_text(self.report([("(296, 56, 1)", 1000000), ("(36, 24, 1)", 5000)]))
            (root / "b-1.csv").write_text(self.report([("(198, 56, 1)", 920000), ("(24, 24, 1)", 4900)]))
            r = run(TOOLS / "ncu_cycles_summary.py", d)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            at = lines.index("void k<0, 0, 2> grid (296, 56, 1) (A) / (198, 56, 1) (B)")
            self.assertIn("0.9200  1, 1", lines[at + 2])
            short_at = lines.index("void k<0, 0, 2> grid (36, 24, 1) (A) / (24, 24, 1) (B)")
            self.assertIn("0.9800  1, 1", lines[short_at + 2])
            self.assertNotIn("missing", r.stdout)

    def test_no_reports_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            r = run(TOOLS / "ncu_cycles_summary.py", d)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no a-N.csv", r.stderr)


class NcuTopStalls(unittest.TestCase):
    @staticmethod
    def stalls(page, *args):
        """ncu_top_stalls.py on a source page with this text."""
        with tempfile.TemporaryDirectory() as d:
            csv = pathlib.Path(d) / "source.csv"
            csv.write_text(page)
            return run(TOOLS / "ncu_top_stalls.py", csv, *args)

    def test_shares_by_instruction_and_kind(self):
        r = self.stalls(
            "==PROF== Disconnected\n"
            '"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"\n'
            '"0010","HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ","10","9"\n'
            '"0020","MUFU.EX2 R3, R4","30","20"\n'
            '"0030","WARPGROUP.DEPBAR.LE gsb0, 0x0","1,060","60"\n', "--top", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("3 instructions, 1100 stall samples", lines[0])
        top = lines[lines.index("top 2 instructions:") + 1:]
        self.assertEqual(len(top), 2)
        self.assertIn("96.4%", top[0])
        self.assertIn("WARPGROUP.DEPBAR", top[0])
        self.assertIn("MUFU.EX2", top[1])

    def test_leading_reasons_per_kind_and_predicated_kinds(self):
        r = self.stalls(
            '"Address","Source","Warp Stall Sampling (All Samples)","stall_wait","stall_dispatch",'
            '"stall_wait (Not Issued)"\n'
            '"0010","MUFU.EX2 R3, R4","30","20","10","20"\n'
            '"0020","MUFU.EX2 R5, R6","10","10","0","10"\n'
            '"0030","@!P0 BRA 0x10","60","0","60","0"\n')
        self.assertEqual(r.returncode, 0, r.stderr)
        kinds = r.stdout.splitlines()[2:4]
        self.assertIn("60.0%  BRA", kinds[0])
        self.assertIn("1 instructions; dispatch 100%", kinds[0])
        self.assertIn("40.0%  MUFU", kinds[1])
        self.assertIn("2 instructions; wait 75%, dispatch 25%", kinds[1])

    def test_a_table_without_samples_is_an_error(self):
        r = self.stalls('"# Address","Source"\n"0010","NOP"\n')
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no warp-stall sample column", r.stderr)


class AbSummary(unittest.TestCase):
    def test_medians_in_run_order_and_ratio(self):
        medians = {"a-1": 60.0, "b-1": 63.0, "a-2": 62.0, "b-2": 65.0}
        with tempfile.TemporaryDirectory() as d:
            for run_name, median in medians.items():
                folder = pathlib.Path(d) / run_name
                folder.mkdir()
                run_section = {"median": median, "gpu_during_samples": {"sm_clock_mhz": {"mean": 1650.0}}}
                (folder / "attention.json").write_text(json.dumps({"run": run_section}))
            r = run(TOOLS / "ab_summary.py", d)
            self.assertEqual(r.returncode, 0, r.stderr)
            line = r.stdout.strip()
            self.assertIn("A 60.000@1650 62.000@1650", line)
            self.assertIn("B 63.000@1650 65.000@1650", line)
            self.assertIn("B/A 1.0492", line)
            self.assertNotIn("bits", line)  # no checksums recorded

    def test_checksums_of_the_two_sides(self):
        for b_sha, verdict in (("aa", "bits A = B"), ("bb", "bits DIFFER")):
            with tempfile.TemporaryDirectory() as d:
                for run_name in ("a-1", "b-1", "a-2", "b-2"):
                    folder = pathlib.Path(d) / run_name
                    folder.mkdir()
                    sha = b_sha if run_name.startswith("b") else "aa"
                    run_section = {"median": 4.0, "derived": {"checksums": {"frames": {"sha256": sha, "sum": 1.0}}}}
                    (folder / "vae-decode-video.json").write_text(json.dumps({"run": run_section}))
                r = run(TOOLS / "ab_summary.py", d)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertTrue(r.stdout.strip().endswith(verdict), r.stdout)


class TimelineSummary(unittest.TestCase):
    def test_phases_and_shares_per_consumer(self):
        def phases(softmax):
            return [{"from_to": "scores landed -> softmax done", "cycles": softmax,
                     "other_consumer_in_this_phase": 0.9, "warp_spread_at_start": 40,
                     "last_warp_share_at_start": [0.7, 0.1, 0.1, 0.1]},
                    {"from_to": "softmax done -> scores landed (next tile)", "cycles": 2000 - softmax,
                     "other_consumer_in_this_phase": 0.25},
                    {"from_to": "round", "cycles": 2000}]
        timeline = {"unit": "SM cycles", "cta": "the middle CTA", "tiles": 296,
                    "consumer0": phases(500), "consumer1": phases(800)}
        with tempfile.TemporaryDirectory() as d:
            (pathlib.Path(d) / "attention-int8fp8.json").write_text(
                json.dumps({"run": {"derived": {"timeline": timeline}}}))
            (pathlib.Path(d) / "attention.json").write_text(json.dumps({"run": {"derived": {}}}))
            r = run(TOOLS / "timeline_summary.py", d)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            self.assertIn("attention-int8fp8", lines[0])
            softmax = next(line for line in lines if "softmax done" in line and "->" in line.split("softmax done")[0])
            self.assertIn("500 (25.0%)", softmax)
            self.assertIn("800 (40.0%) [ 90%]", softmax)
            self.assertIn("[ 25%]", next(line for line in lines if line.strip().startswith("softmax done ->")))
            round_at = next(i for i, line in enumerate(lines) if line.strip().startswith("round"))
            # The spread at the one mark that has it, for both consumers; none for the others.
            self.assertIn("last warp's share", lines[round_at + 1])
            self.assertEqual(len(lines), round_at + 3)
            self.assertTrue(lines[-1].strip().startswith("scores landed"))
            self.assertEqual(re.findall(r"\d+ +70/10/10/10%", lines[-1]), ["40     70/10/10/10%"] * 2)

    def test_cta_records(self):
        ctas = {"count": 864, "unrecorded": 0, "sms": 132, "ctas_per_sm": {"fewest": 6, "most": 7},
                "median_cycles": {"prologue (start -> first tile done)": 3000,
                                  "sweep (first tile done -> last product landed)": 92000,
                                  "epilogue (-> end)": 5000, "total": 100000},
                "same_sm_gap_cycles": {"median": 900, "most": 4000},
                "kernel_ns": 404000, "clock_mhz": 1724.6,
                "last_sm": {"ctas": 7, "busy_ns": 353000, "busy_cycles": 690000, "span_ns": 402000}}
        launches = [{"kernel_ns": 404000, "clock_mhz": 1724.6, "last_sm_busy_cycles": 690000},
                    {"kernel_ns": 431000, "clock_mhz": 1601.2, "last_sm_busy_cycles": 690500}]
        timeline = {"unit": "SM cycles", "cta": "the middle CTA", "tiles": 3, "ctas": ctas, "launches": launches}
        with tempfile.TemporaryDirectory() as d:
            (pathlib.Path(d) / "attention-4608x24.json").write_text(
                json.dumps({"run": {"derived": {"timeline": timeline}}}))
            r = run(TOOLS / "timeline_summary.py", d)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = r.stdout
            self.assertIn("CTAs: 864 on 132 SMs (0 unrecorded)", out)
            self.assertIn("per SM: 6 to 7 CTAs", out)
            prologue = next(line for line in out.splitlines() if "prologue" in line)
            self.assertIn("3000 cycles ( 3.0%)", prologue)
            self.assertIn("median 900, most 4000 cycles", out)
            self.assertIn("kernel span 404.0 us; the last SM ran 7 CTAs for 353.0 us of its 402.0 us", out)
            self.assertIn("the CTAs ran at 1725 MHz", out)
            self.assertIn("2: span      431.0 us at   1601 MHz, the last SM busy       690500 cycles", out)

    def test_no_timeline_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            (pathlib.Path(d) / "attention.json").write_text(json.dumps({"run": {"derived": {}}}))
            r = run(TOOLS / "timeline_summary.py", d)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("VORTEX_ATTENTION_TIMELINE=1", r.stderr)


class SassOutline(unittest.TestCase):
    # Two forms that share the opcode bits and differ in the second word, and a third opcode.
    EX2, RCP, FADD = (0x0000000B000B7308, 0x000FE20000000800), (0x0000000B000B7308, 0x000FE20000001000), \
        (0x0000000B0A0B7221, 0x000FC80000000000)

    @staticmethod
    def listing(rows):
        lines = []
        for address, (text, (first, second)) in enumerate(rows):
            lines.append(f"        /*{16 * address:04x}*/                   {text} ;   /* 0x{first:016x} */")
            lines.append(f"                                                  /* 0x{second:016x} */")
        return "\n".join(lines) + "\n"

    @staticmethod
    def elf(section, code):
        names = b"\0.shstrtab\0" + section.encode() + b"\0"
        header_size, names_at = 64, 64
        code_at = names_at + len(names)
        table_at = code_at + len(code)
        header = bytearray(header_size)
        header[0:7] = b"\x7fELF\x02\x01\x01"
        struct.pack_into("<Q", header, 0x28, table_at)
        struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)
        sections = bytes(64)  # the null section
        sections += struct.pack("<IIQQQQ", 1, 3, 0, 0, names_at, len(names)).ljust(64, b"\0")
        sections += struct.pack("<IIQQQQ", 11, 1, 6, 0, code_at, len(code)).ljust(64, b"\0")
        return bytes(header) + names + code + sections

    def test_names_the_instructions_of_a_matching_kernel(self):
        tool = ROOT / "tools" / "kernels" / "sass_outline.py"
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            (tmp / "sass.txt").write_text(self.listing([("MUFU.EX2 R11, R11", self.EX2), ("MUFU.RCP R1, R2", self.RCP),
                                                        ("@P0 FADD R1, R2, R3", self.FADD)]))
            table = tmp / "table.json"
            r = run(tool, "--learn", tmp / "sass.txt", "--table", table)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("3 instruction words added", r.stdout)
            code = b"".join(struct.pack("<QQ", *w) for w in (self.EX2, self.EX2, self.RCP, self.FADD,
                                                              (0x0000000000000FFF, 0)))
            (tmp / "binary").write_bytes(b"host bytes" + self.elf(".text._Z6kernelv", code) + b"tail")
            r = run(tool, tmp / "binary", "kernel", "--table", table)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.splitlines()[1], "0:MUFU.EX2x2 2:MUFU.RCP 3:FADD 4:?fff")
            r = run(tool, tmp / "binary", "other_kernel", "--table", table)
            self.assertEqual(r.returncode, 1)
            self.assertIn("no kernel section matching", r.stderr)


if __name__ == "__main__":
    unittest.main()
