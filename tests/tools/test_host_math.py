#!/usr/bin/env python3
"""Keeps the C library's transcendentals out of the host program.

Their last bits differ between C libraries (and, in glibc, between the variants picked by CPU), so
every exp, log, sin, cos, pow ... that shapes an output goes through core/portable_math.h instead
(README, "CPU"). This test fails on a call to one of libm's in the host sources, naming the file and
line. Device code (.cu, .cuh) uses CUDA's own math and is not scanned; src/bench/ computes
statistics about runs, not outputs, and is exempt.
"""

import pathlib
import re
import sys
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCANNED = ["src", "apps"]
EXEMPT = {"src/core/portable_math.cc", "src/core/portable_math.h"}
EXEMPT_DIRS = ["src/bench/"]

FUNCTIONS = ("exp|exp2|expm1|log|log2|log10|log1p|sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|tanh|"
             "asinh|acosh|atanh|erf|erfc|pow|cbrt|tgamma|lgamma|hypot")
# std::exp(...), ::sinf(...), expf(...), but not portable_expf(...) or a member such as x.exp(...).
LIBM_CALL = re.compile(r"(?<![\w.>])(?:std::|::)?(?:(?:" + FUNCTIONS + r")f?)\s*\(")


def strip_comments_and_strings(line):
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    return line.split("//", 1)[0]


def offending_lines():
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".cc", ".h", ".cpp", ".hpp"):
                continue
            rel = path.relative_to(ROOT).as_posix()
            if rel in EXEMPT or any(rel.startswith(d) for d in EXEMPT_DIRS):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if LIBM_CALL.search(strip_comments_and_strings(line)):
                    found.append(f"{rel}:{number}: {line.strip()}")
    return found


class HostMath(unittest.TestCase):
    def test_no_libm_transcendentals_in_the_host_program(self):
        found = offending_lines()
        self.assertEqual(found, [], "libm transcendentals (use core/portable_math.h):\n" + "\n".join(found))

    def test_the_pattern_catches_what_it_should(self):
        for call in ["std::exp(x)", "expf(-g)", "std::pow(a, b)", "::sinf(t)", "y = tanh (z)", "std::sin(pi * x)"]:
            self.assertTrue(LIBM_CALL.search(call), call)
        for fine in ["portable_expf(x)", "portable_sin(x)", "v.exp(1)", "p->log(2)", "exponent(3)", "std::sqrt(x)",
                     "cosine(a)", "logits(b)"]:
            self.assertFalse(LIBM_CALL.search(fine), fine)
        self.assertEqual(strip_comments_and_strings('f(); // std::exp(x)'), "f(); ")
        self.assertEqual(strip_comments_and_strings('err("std::log(x) failed")'), 'err("")')


if __name__ == "__main__":
    sys.exit(unittest.main())
