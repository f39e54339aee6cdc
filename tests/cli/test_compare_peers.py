#!/usr/bin/env python3
"""bench/compare_peers.py against closed forms: two fake llama-bench
binaries of known speeds, whose medians and per-round ratios are known
exactly; the rotation of the engines' order from round to round (read from
the log the fakes keep); npumoe itself as an engine, its kernel variant
passed through NPUMOE_KERNELS; and clear errors for a bad engine, a missing
model, an engine that fails, output that is not JSON and JSON without
the speed.

Usage: test_compare_peers.py NPUMOE --model GGUF (models/npumoe-tiny-moe.gguf)
"""
import argparse
import os
import subprocess
import sys
import tempfile

import test_cli  # its check() counts passes and failures
from test_cli import check

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                      "compare_peers.py")

# A fake llama-bench: its speeds written into it (lists, the i-th call of
# this fake answering the i-th entries, the last one repeated), each call
# appended to LOG; the JSON fields llama-bench writes for the two tests.
FAKE = """#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
p, n = int(a[a.index("-p") + 1]), int(a[a.index("-n") + 1])
try:
    with open(%(log)r) as f:
        calls = sum(1 for l in f if l.split()[0] == %(name)r)
except FileNotFoundError:
    calls = 0
with open(%(log)r, "a") as f:
    f.write(%(name)r + " " + a[a.index("-m") + 1] + "\\n")
if %(mode)r == "fail":
    sys.stderr.write("fake: out of memory\\n")
    sys.exit(3)
if %(mode)r == "garbage":
    print("not json")
    sys.exit(0)
if %(mode)r == "fields":
    print(json.dumps([{"n_prompt": p, "n_gen": 0}]))
    sys.exit(0)
out = []
if p > 0:
    out.append({"n_prompt": p, "n_gen": 0, "avg_ts": %(pp)r[min(calls, len(%(pp)r) - 1)]})
if n > 0:
    out.append({"n_prompt": 0, "n_gen": n, "avg_ts": %(tg)r[min(calls, len(%(tg)r) - 1)]})
print(json.dumps(out))
"""


def fake(tmp, name, pp, tg, log, mode="ok"):
    """pp, tg: a speed, or a list of them (one per call)."""
    pp, tg = (v if isinstance(v, list) else [v] for v in (pp, tg))
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(FAKE % {"log": log, "name": name, "mode": mode, "pp": pp, "tg": tg})
    os.chmod(path, 0o755)
    return path


def compare(args):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True,
                          timeout=600)


def table_rows(out):
    return [[c.strip() for c in l.strip().strip("|").split("|")] for l in out.splitlines()
            if l.startswith("| ") and not l.startswith("| model")]


def test_closed_form(tmp, model):
    log = os.path.join(tmp, "calls.log")
    a = fake(tmp, "peer_a", 100.0, 10.0, log)
    # b's calls: two files a round, so rounds of 250, 300, 1000 (prefill)
    b = fake(tmp, "peer_b", [250.0, 250.0, 300.0, 300.0, 1000.0], 30.0, log)
    r = compare(["-r", "3", "-p", "64", "-n", "4", "-e", "a=llama-bench:" + a, "-e",
                 "b=llama-bench:" + b, model, model])
    check(r.returncode == 0, "two fake peers: exit 0", r.stderr[-400:])
    rows = table_rows(r.stdout)
    want = [["pp64", "100.0", "300.0", "3.00 (2.50-10.00)"],
            ["tg4", "10.0", "30.0", "3.00 (3.00-3.00)"]]
    check(len(rows) == 4 and all(row[1:] == want[i % 2] for i, row in enumerate(rows)),
          "medians over rounds, and the median (range) of the per-round ratios", r.stdout)
    check("| model | test | a | b | b / a |" in r.stdout, "the header names the engines", r.stdout)
    with open(log) as f:
        calls = [l.split()[0] for l in f]
    # 3 rounds x 2 files x 2 engines, the order rotated each round
    check(calls == ["peer_a", "peer_b"] * 2 + ["peer_b", "peer_a"] * 2 + ["peer_a", "peer_b"] * 2,
          "the engines' order rotates from round to round", str(calls))
    # --ref b: the ratio inverted
    r = compare(["-r", "1", "-p", "8", "-n", "0", "--ref", "b", "-e", "a=llama-bench:" + a,
                 "-e", "b=llama-bench:" + b, model])
    rows = table_rows(r.stdout)  # b's later calls: 1000
    check(r.returncode == 0 and len(rows) == 1 and rows[0][1:] == ["pp8", "100.0", "1000.0",
                                                                   "0.10 (0.10-0.10)"],
          "--ref b, prefill only: a / b = 0.10, no generation row", r.stdout + r.stderr[-300:])
    # one engine: its medians, no ratio columns
    r = compare(["-r", "1", "-p", "8", "-n", "0", "-e", "a=llama-bench:" + a, model])
    check(r.returncode == 0 and "| model | test | a |\n|---|---|---:|\n" in r.stdout
          and table_rows(r.stdout) == [[os.path.basename(model), "pp8", "100.0"]],
          "one engine: a table of its medians alone", r.stdout + r.stderr[-300:])


def test_npumoe(tmp, npumoe, model):
    log = os.path.join(tmp, "calls2.log")
    a = fake(tmp, "peer_c", 100.0, 10.0, log)
    r = compare(["-r", "2", "-p", "16", "-n", "2", "-t", "1", "-e", "peer=llama-bench:" + a,
                 "-e", "nm=npumoe:%s:ref" % npumoe, model])
    rows = table_rows(r.stdout)
    ok = r.returncode == 0 and len(rows) == 2
    if ok:
        for row, base in zip(rows, (100.0, 10.0)):
            nm = float(row[3])
            ratio = float(row[4].split()[0])
            ok = ok and nm > 0 and abs(ratio - nm / base) <= 0.01 * ratio + 0.005
    check(ok, "npumoe as an engine: its t/s read from its JSON, the ratio against the peer",
          r.stdout + r.stderr[-400:])
    # the variant really reaches npumoe: one it does not know makes it fail
    r = compare(["-r", "1", "-p", "8", "-n", "0", "-e", "nm=npumoe:%s:nosuch" % npumoe, model])
    check(r.returncode == 1 and "NPUMOE_KERNELS" in r.stderr and "nm on" in r.stderr,
          "a kernel variant npumoe refuses: exit 1 naming the engine and npumoe's reason",
          r.stderr[-400:])


def test_errors(tmp, model):
    log = os.path.join(tmp, "calls3.log")
    good = fake(tmp, "peer_d", 100.0, 10.0, log)
    cases = [
        (["-e", "x=foo:" + good, model], 2, "want NAME=llama-bench:PATH"),
        (["-e", "x=llama-bench:" + os.path.join(tmp, "none"), model], 2, "not an executable"),
        (["-e", "x=llama-bench:" + good, os.path.join(tmp, "none.gguf")], 2, "no such file"),
        (["-e", "x=llama-bench:" + good, "-e", "x=llama-bench:" + good, model], 2,
         "names must differ"),
        (["-e", "x=llama-bench:" + good, "--ref", "y", model], 2, "is not an engine"),
        (["-p", "0", "-n", "0", "-e", "x=llama-bench:" + good, model], 2, "-p or -n"),
        (["-e", "x=llama-bench:" + fake(tmp, "peer_f", 1, 1, log, "fail"), model], 1,
         "exited with 3: fake: out of memory"),
        (["-e", "x=llama-bench:" + fake(tmp, "peer_g", 1, 1, log, "garbage"), model], 1,
         "not JSON"),
        (["-e", "x=llama-bench:" + fake(tmp, "peer_h", 1, 1, log, "fields"), model], 1,
         "unexpected JSON (KeyError"),
    ]
    for args, code, needle in cases:
        r = compare(["-r", "1", "-p", "8", "-n", "2"] + args)
        check(r.returncode == code and needle in r.stderr and "Traceback" not in r.stderr,
              f"{needle}: exit {code} with a message", f"exit {r.returncode}: {r.stderr[-300:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("npumoe")
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        test_closed_form(tmp, a.model)
        test_npumoe(tmp, a.npumoe, a.model)
        test_errors(tmp, a.model)
    print(f"test_compare_peers: {test_cli.passed} passed, {test_cli.failed} failed")
    return 1 if test_cli.failed else 0


if __name__ == "__main__":
    sys.exit(main())
