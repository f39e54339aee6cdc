#!/usr/bin/python3
"""Writes src/tokenizer/unicode_tables.c: the code point classes the BPE
pre-tokenizers need, as one sorted table of ranges.

Run from the repository root (stdlib only; reads Debian's unicode-data files):

    /usr/bin/python3 tools/gen_unicode_tables.py \
        [--ucd /usr/share/unicode] [--out src/tokenizer/unicode_tables.c]

What the classes mean, and why they are built this way: llama.cpp's
pre-tokenizers test a code point's Unicode general category by major class
(\\p{L}, \\p{N}, \\p{Z}, \\p{M}, \\p{P}, \\p{S}, \\p{C}), with unassigned code
points (Cn) in a class of their own ("undefined"), and a separate whitespace
bit that is the Unicode White_Space property (PropList.txt), not category Z:
it includes the controls TAB..CR and U+0085 and excludes nothing of Zs. We
reproduce exactly those classes so that our splitter cuts where llama.cpp
cuts.

Unicode version: llama.cpp's tables are Unicode 15.1. When the local data is
15.0 (Debian bookworm's unicode-data), the 627 code points that 15.1 added
are applied here by hand (they are listed below, with their categories); the
script refuses data older than 15.0.

Case folding: the only case-insensitive match the pre-tokenizers make is the
contraction rule (?i:'s|'t|'re|'ve|'m|'ll|'d). The script checks that no code
point outside ASCII lowercases to one of those letters, so ASCII folding in C
is exact and no lowercase table is generated.
"""

import argparse
import os
import re
import sys

MAX_CODEPOINT = 0x110000

# Class bits, the same values the C side uses (see tokenizer-impl.h).
UNDEFINED = 0x0001
NUMBER = 0x0002
LETTER = 0x0004
SEPARATOR = 0x0008
ACCENT_MARK = 0x0010
PUNCTUATION = 0x0020
SYMBOL = 0x0040
CONTROL = 0x0080
WHITESPACE = 0x0100

MAJOR_CLASS = {
    "L": LETTER,
    "N": NUMBER,
    "Z": SEPARATOR,
    "M": ACCENT_MARK,
    "P": PUNCTUATION,
    "S": SYMBOL,
    "C": CONTROL,
}

# Unicode 15.1.0 additions (first, last, general category).
UNICODE_15_1_ADDITIONS = [
    (0x2FFC, 0x2FFF, "So"),  # ideographic description characters
    (0x31EF, 0x31EF, "So"),  # CJK stroke HXG
    (0x2EBF0, 0x2EE5D, "Lo"),  # CJK Unified Ideographs Extension I
]

CONTRACTION_LETTERS = set(ord(c) for c in "stmdrvel")


def read_version(ucd):
    with open(os.path.join(ucd, "DerivedAge.txt"), encoding="utf-8") as f:
        first = f.readline()
    m = re.search(r"DerivedAge-(\d+)\.(\d+)\.(\d+)\.txt", first)
    if not m:
        sys.exit("cannot read the Unicode version from DerivedAge.txt")
    return tuple(int(x) for x in m.groups())


def read_categories(ucd):
    """General category of every code point; None where unassigned."""
    cat = [None] * MAX_CODEPOINT
    first = None
    with open(os.path.join(ucd, "UnicodeData.txt"), encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(";")
            cp = int(fields[0], 16)
            name, gc = fields[1], fields[2]
            if name.endswith(", First>"):
                first = cp
                continue
            if name.endswith(", Last>"):
                for c in range(first, cp + 1):
                    cat[c] = gc
                first = None
                continue
            cat[cp] = gc
    return cat


def read_lowercase(ucd):
    """code point -> first code point of its lowercase (simple and special)."""
    lower = {}
    with open(os.path.join(ucd, "UnicodeData.txt"), encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(";")
            if fields[13]:
                lower[int(fields[0], 16)] = int(fields[13], 16)
    with open(os.path.join(ucd, "SpecialCasing.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = [x.strip() for x in line.split(";")]
            if len(fields) > 5 and fields[4]:
                continue  # conditional mappings (language, context)
            if fields[1]:
                lower[int(fields[0], 16)] = int(fields[1].split()[0], 16)
    return lower


def read_white_space(ucd):
    ws = []
    with open(os.path.join(ucd, "PropList.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            rng, prop = [x.strip() for x in line.split(";")]
            if prop != "White_Space":
                continue
            if ".." in rng:
                a, b = (int(x, 16) for x in rng.split(".."))
            else:
                a = b = int(rng, 16)
            ws.extend(range(a, b + 1))
    return ws


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ucd", default="/usr/share/unicode")
    ap.add_argument("--out", default="src/tokenizer/unicode_tables.c")
    args = ap.parse_args()

    version = read_version(args.ucd)
    if version < (15, 0, 0):
        sys.exit("Unicode %d.%d.%d is older than 15.0" % version)
    cat = read_categories(args.ucd)
    patched = ""
    if version < (15, 1, 0):
        for a, b, gc in UNICODE_15_1_ADDITIONS:
            for c in range(a, b + 1):
                if cat[c] is not None:
                    sys.exit("U+%04X is already assigned; the 15.1 patch does not apply" % c)
                cat[c] = gc
        patched = " plus the Unicode 15.1 additions"

    flags = [0] * MAX_CODEPOINT
    for c in range(MAX_CODEPOINT):
        flags[c] = UNDEFINED if cat[c] is None else MAJOR_CLASS[cat[c][0]]
    white_space = read_white_space(args.ucd)
    for c in white_space:
        flags[c] |= WHITESPACE

    lower = read_lowercase(args.ucd)
    for c, l in lower.items():
        if l in CONTRACTION_LETTERS and not (ord("A") <= c <= ord("Z")):
            sys.exit("U+%04X lowercases to '%s': ASCII case folding is not exact" % (c, chr(l)))

    starts, values = [], []
    for c in range(MAX_CODEPOINT):
        if not values or flags[c] != values[-1]:
            starts.append(c)
            values.append(flags[c])

    version_text = "%d.%d.%d" % version
    out = []
    out.append("/* Generated by tools/gen_unicode_tables.py from the Unicode Character")
    out.append(" * Database %s (Debian unicode-data: UnicodeData.txt, PropList.txt)" % version_text)
    out.append(" *%s." % (patched if patched else " as is"))
    out.append(" * Do not edit; rerun the script:")
    out.append(" *     /usr/bin/python3 tools/gen_unicode_tables.py")
    out.append(" * Code point classes for the pre-tokenizers: range i covers")
    out.append(" * [nm_unicode_range_start[i], nm_unicode_range_start[i + 1]) and has the")
    out.append(" * class bits nm_unicode_range_flags[i] (NM_UFLAG_* in tokenizer-impl.h). */")
    out.append('#include "tokenizer-impl.h"')
    out.append("")
    out.append("/* clang-format off */")
    out.append("const uint32_t nm_unicode_n_ranges = %d;" % len(starts))
    out.append("")
    out.append("const uint32_t nm_unicode_range_start[%d] = {" % len(starts))
    for i in range(0, len(starts), 8):
        out.append("    " + ", ".join("0x%06X" % s for s in starts[i:i + 8]) + ",")
    out.append("};")
    out.append("")
    out.append("const uint16_t nm_unicode_range_flags[%d] = {" % len(values))
    for i in range(0, len(values), 10):
        out.append("    " + ", ".join("0x%04X" % v for v in values[i:i + 10]) + ",")
    out.append("};")
    out.append("")
    out.append("/* The same classes for U+0000..U+007F, the common case, without a search. */")
    out.append("const uint16_t nm_unicode_ascii_flags[128] = {")
    for i in range(0, 128, 10):
        out.append("    " + ", ".join("0x%04X" % v for v in flags[i:min(i + 10, 128)]) + ",")
    out.append("};")
    out.append("/* clang-format on */")
    out.append("")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(out))
    print("wrote %s: %d ranges, %d whitespace code points, Unicode %s%s" % (
        args.out, len(starts), len(white_space), version_text, patched))


if __name__ == "__main__":
    main()
