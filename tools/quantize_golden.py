#!/usr/bin/env python3
"""Makes tests/quantize_golden.txt: what llama.cpp's llama-quantize writes for
the shipped model, so tests/test_quantize.c can check npumoe's quantisers
byte for byte (as CRC-32s) and its q4_k_m / q5_k_m / q4_k_s / q5_k_s type
choices.

What it is for: regenerating the golden after the shipped model changes, on a
machine with a llama.cpp build. What it is not: run by the tests (they only
read the text file).

Usage: tools/quantize_golden.py --llama-quantize PATH/llama-quantize
           [--model models/npumoe-tiny-moe.gguf] [-o tests/quantize_golden.txt]

Single types are made with --pure (every quantisable tensor in that type, as
npumoe's single types do). The model's ffn_down_exps rows have 48 elements,
which no block type divides: llama-quantize refuses q8_0/q4_0 for them, so
those two runs keep them f16 with --tensor-type ffn_down_exps=f16, which is
npumoe's fallback. Only stdlib Python.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile
import zlib

TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 8: "q8_0", 12: "q4_K", 13: "q5_K", 14: "q6_K", 30: "bf16"}
BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 8: (32, 34), 12: (256, 144), 13: (256, 176),
         14: (256, 210)}
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

# (npumoe kind, llama-quantize arguments)
RUNS = [
    ("q8_0", ["--pure", "--tensor-type", "ffn_down_exps=f16"], "Q8_0"),
    ("q4_0", ["--pure", "--tensor-type", "ffn_down_exps=f16"], "Q4_0"),
    ("q4_k", ["--pure"], "Q4_K_S"),
    ("q5_k", ["--pure"], "Q5_K_S"),
    ("q6_k", ["--pure"], "Q6_K"),
    ("q4_k_m", [], "Q4_K_M"),
    ("q5_k_m", [], "Q5_K_M"),
    ("q4_k_s", [], "Q4_K_S"),
    ("q5_k_s", [], "Q5_K_S"),
    ("f32", ["--pure"], "F32"),
    ("f16", ["--pure"], "F16"),
    ("bf16", ["--pure"], "BF16"),
]


def read_tensors(path):
    """[(name, type, bytes)] in file order."""
    b = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize("<" + fmt)
        return v

    def string():
        nonlocal pos
        (n,) = take("Q")
        s = b[pos:pos + n]
        pos += n
        return s.decode("utf-8")

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("IQ")
            return [value(et) for _ in range(n)]
        return take(SCALAR[t])[0]

    assert b[:4] == b"GGUF", path
    pos = 4
    _, n_tensors, n_kv = take("IQQ")
    kv = {}
    for _ in range(n_kv):
        k = string()
        (t,) = take("I")
        kv[k] = value(t)
    infos = []
    for _ in range(n_tensors):
        name = string()
        (nd,) = take("I")
        ne = take("Q" * nd)
        t, off = take("IQ")
        infos.append((name, t, ne, off))
    align = kv.get("general.alignment", 32)
    start = (pos + align - 1) // align * align
    out = []
    for name, t, ne, off in infos:
        count = 1
        for x in ne:
            count *= x
        bs, bb = BLOCK[t]
        out.append((name, t, b[start + off:start + off + count // bs * bb]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-quantize", required=True)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--model", default=os.path.join(here, "..", "models", "npumoe-tiny-moe.gguf"))
    ap.add_argument("-o", "--output", default=os.path.join(here, "..", "tests", "quantize_golden.txt"))
    a = ap.parse_args()
    lines = [
        "# llama-quantize's output for models/npumoe-tiny-moe.gguf, made by tools/quantize_golden.py",
        "# with llama.cpp d32676d77426540327835040d5d3279728f0b4c8 (the golden vectors' commit):",
    ]
    for kind, args, ftype in RUNS:
        lines.append(f"#   {kind}: llama-quantize {' '.join(args)} MODEL OUT {ftype} 2".replace("  ", " "))
    lines += [
        "# 'bytes KIND TENSOR TYPE CRC32 N_BYTES': the tensor's data in a single-type file (CRC-32",
        "# of zlib/IEEE); 'type KIND TENSOR TYPE': the type a mix gave the tensor.",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for kind, args, ftype in RUNS:
            out = os.path.join(tmp, kind + ".gguf")
            r = subprocess.run([a.llama_quantize] + args + [a.model, out, ftype, "2"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"llama-quantize {kind} failed:\n{r.stderr[-2000:]}")
            for name, t, data in read_tensors(out):
                if kind.endswith(("_m", "_s")):  # the mixes
                    lines.append(f"type {kind} {name} {TYPE_NAMES[t]}")
                elif t not in (0, 1, 30) or TYPE_NAMES[t] == kind:  # made by this run
                    lines.append(f"bytes {kind} {name} {TYPE_NAMES[t]} {zlib.crc32(data):08x} {len(data)}")
    with open(a.output, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.output}: {len(lines)} lines")


if __name__ == "__main__":
    main()
