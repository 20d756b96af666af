#!/usr/bin/env python3
"""The instruction sequence of a compiled kernel, read here without cuobjdump (this machine has none).

The cubins a CUDA build embeds in its executables and objects are plain ELF: each kernel's code is a
`.text.<mangled name>` section of 16-byte instructions. Their mnemonics come from a table learned
from a `cuobjdump -sass` listing made on the GPU machine (`scripts/gpu-check --sass REGEX` writes
one): an instruction is named after the learned instruction with the same low 12 bits (the opcode
field) that shares the most bits of its two 64-bit words, which separates e.g. WARPGROUP.ARRIVE from
WARPGROUP.DEPBAR and MUFU.EX2 from MUFU.RCP. The names are a guess where the table has no sample of
that form; the listing stays the reference. Operands are not decoded: this shows where ptxas put the waits, the products and
the exp2s, which is what scheduling questions need (session 14: ptxas had hoisted exact attention's
wait for P·V above the softmax; bench/notes/attention.md).

  sass_outline.py --learn LISTING [--table FILE]   add a listing's instructions to the table
  sass_outline.py BINARY REGEX [--from N --to M] [--one-per-line] [--table FILE]
      the kernels whose section name matches REGEX, as runs ("123:MUFU.EX2x4" = 4 in a row from
      instruction 123); instructions the table does not know print as ?<opcode bits>.
"""

import argparse
import json
import pathlib
import re
import struct
import sys

DEFAULT_TABLE = pathlib.Path(__file__).with_name("sm90a_opcodes.json")
LISTING_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;\s*/\* 0x([0-9a-f]{16}) \*/")
SECOND_WORD = re.compile(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$")
SAMPLES_PER_MNEMONIC = 8


def mnemonic(text):
    words = text.split()
    return words[1] if words[0].startswith("@") else words[0]


def learn(listing, table):
    """Each instruction of the listing: its mnemonic and both 64-bit words (the second, on the next
    line, holds most modifiers: MUFU.EX2 and MUFU.RCP differ only there)."""
    added, pending = 0, None
    for line in open(listing, encoding="utf-8", errors="replace"):
        m = LISTING_LINE.search(line)
        if m:
            pending = (mnemonic(m.group(1)), int(m.group(2), 16))
            continue
        second = SECOND_WORD.match(line)
        if second and pending:
            op, word = pending
            pending = None
            sample = [word, int(second.group(1), 16)]
            samples = table.setdefault(str(word & 0xFFF), {}).setdefault(op, [])
            if sample not in samples and len(samples) < SAMPLES_PER_MNEMONIC:
                samples.append(sample)
                added += 1
    return added


def name(words, table):
    candidates = table.get(str(words[0] & 0xFFF))
    if not candidates:
        return "?%03x" % (words[0] & 0xFFF)

    def distance(sample):
        return bin(words[0] ^ sample[0]).count("1") + bin(words[1] ^ sample[1]).count("1")

    # The learned mnemonic with the sample nearest to this instruction, bit for bit.
    return min(candidates.items(), key=lambda kv: min(distance(s) for s in kv[1]))[0]


def kernels(data, pattern):
    """(section name, code bytes) of every .text section matching pattern in every ELF64 image in data."""
    start = 0
    while True:
        at = data.find(b"\x7fELF\x02\x01\x01", start)
        if at < 0:
            return
        start = at + 1
        try:
            shoff, = struct.unpack_from("<Q", data, at + 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, at + 0x3A)
            if shentsize != 64 or not 0 < shnum < 65536 or shstrndx >= shnum:
                continue
            sections = [struct.unpack_from("<IIQQQQ", data, at + shoff + 64 * i) for i in range(shnum)]
            strings = at + sections[shstrndx][4]
            for name_offset, _, _, _, offset, size in sections:
                section = data[strings + name_offset:data.index(b"\0", strings + name_offset)].decode("latin-1")
                if section.startswith(".text.") and re.search(pattern, section):
                    yield section, data[at + offset:at + offset + size]
        except (struct.error, ValueError):
            continue  # bytes that only looked like an ELF header


def outline(code, table, first, last, one_per_line):
    names = [name(struct.unpack_from("<QQ", code, 16 * i), table) for i in range(len(code) // 16)]
    last = len(names) if last is None else min(last, len(names))
    if one_per_line:
        return "\n".join(f"{i} {names[i]}" for i in range(first, last))
    runs, i = [], first
    while i < last:
        j = i
        while j + 1 < last and names[j + 1] == names[i]:
            j += 1
        runs.append(f"{i}:{names[i]}" + (f"x{j - i + 1}" if j > i else ""))
        i = j + 1
    return " ".join(runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary", nargs="?", help="an executable, object or cubin of a CUDA build")
    parser.add_argument("regex", nargs="?", help="matched against the kernels' .text section names")
    parser.add_argument("--learn", metavar="LISTING", help="a cuobjdump -sass listing to add to the table")
    parser.add_argument("--table", default=str(DEFAULT_TABLE))
    parser.add_argument("--from", dest="first", type=int, default=0)
    parser.add_argument("--to", dest="last", type=int)
    parser.add_argument("--one-per-line", action="store_true")
    args = parser.parse_args()
    table_path = pathlib.Path(args.table)
    table = json.loads(table_path.read_text()) if table_path.exists() else {}
    if args.learn:
        added = learn(args.learn, table)
        # One opcode per line: readable diffs when a listing adds forms.
        rows = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True, separators=(',', ':'))}"
                for k, v in sorted(table.items(), key=lambda kv: int(kv[0]))]
        table_path.write_text("{\n" + ",\n".join(rows) + "\n}\n")
        print(f"{added} instruction words added; {sum(len(v) for v in table.values())} mnemonics known")
        return 0
    if not args.binary or not args.regex:
        parser.error("give a binary and a kernel regex, or --learn LISTING")
    found = 0
    for section, code in kernels(pathlib.Path(args.binary).read_bytes(), args.regex):
        found += 1
        print(f"# {section}: {len(code) // 16} instructions")
        print(outline(code, table, args.first, args.last, args.one_per_line))
    if not found:
        print(f"sass_outline: no kernel section matching {args.regex!r} in {args.binary}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
