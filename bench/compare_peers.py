#!/usr/bin/env python3
"""npumoe against llama.cpp-family engines on the same GGUF files, as
docs/PERFORMANCE.md measures it: rounds in which every engine runs every
file once (prefill and generation in one run), the engines' order rotated
from round to round, so that a machine whose speed drifts favours no one;
then, per file and test, each engine's median over the rounds and the
median (range) of the per-round ratios against the reference engine.

  bench/compare_peers.py [-r ROUNDS] [-p N] [-n N] [-t THREADS] [--ref NAME]
                         -e NAME=llama-bench:PATH -e NAME=npumoe:PATH[:KERNELS]
                         ... MODEL...

An engine is a `llama-bench` binary (llama.cpp, ik_llama.cpp: run as
`PATH -m MODEL -p N -n N -r 1 -t THREADS -o json`) or an `npumoe` binary
(run as `PATH bench -m MODEL -p N -n N -r 1 -t THREADS --json`, with
NPUMOE_KERNELS=KERNELS when given). The peers are built by hand; this
program only runs what it is given. Every sample is printed as it comes
(one line per run, to stderr), then the Markdown table and the samples in
round order (stdout).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def parse_engine(spec):
    name, sep, rest = spec.partition("=")
    kind, sep2, path = rest.partition(":")
    if not sep or not sep2 or not name or kind not in ("llama-bench", "npumoe") or not path:
        raise argparse.ArgumentTypeError(
            "engine '%s': want NAME=llama-bench:PATH or NAME=npumoe:PATH[:KERNELS]" % spec)
    kernels = None
    if kind == "npumoe" and ":" in path:
        path, kernels = path.rsplit(":", 1)
    return {"name": name, "kind": kind, "path": path, "kernels": kernels}


def asked(args):
    """The tests asked for: 'pp' (prompt of -p tokens), 'tg' (-n generated)."""
    return [k for k, n in (("pp", args.p), ("tg", args.n)) if n > 0]


def run_once(engine, model, args):
    """{'pp': t/s, 'tg': t/s} of one run (a test asked for and missing: an error)."""
    env = dict(os.environ)
    if engine["kind"] == "llama-bench":
        cmd = [engine["path"], "-m", model, "-p", str(args.p), "-n", str(args.n), "-r", "1",
               "-t", str(args.t), "-o", "json"]
        field = "avg_ts"
    else:
        cmd = [engine["path"], "bench", "-m", model, "-p", str(args.p), "-n", str(args.n), "-r",
               "1", "-t", str(args.t), "--json"]
        field = "tokens_per_s"
        if engine["kernels"]:
            env["NPUMOE_KERNELS"] = engine["kernels"]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace")
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-3:]
        raise RuntimeError("%s on %s exited with %d: %s" %
                           (engine["name"], model, out.returncode, " | ".join(tail)))
    try:
        tests = json.loads(out.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError("%s on %s: output is not JSON (%s)" % (engine["name"], model, e))
    got = {}
    try:
        for t in tests:
            if t["n_prompt"] > 0 and t["n_gen"] == 0:
                got["pp"] = float(t[field])
            elif t["n_gen"] > 0 and t["n_prompt"] == 0:
                got["tg"] = float(t[field])
    except (KeyError, TypeError, ValueError) as e:
        raise RuntimeError("%s on %s: unexpected JSON (%s: %s)" %
                           (engine["name"], model, type(e).__name__, e))
    for k in asked(args):
        if k not in got:
            raise RuntimeError("%s on %s: no %s result in its output" % (engine["name"], model, k))
    return got


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), to go beside the numbers."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU model unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-r", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (default 512; 0: none)")
    ap.add_argument("-n", type=int, default=128, help="generated tokens (default 128; 0: none)")
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    ap.add_argument("-e", dest="engines", action="append", type=parse_engine, required=True,
                    metavar="NAME=KIND:PATH[:KERNELS]", help="an engine (repeat)")
    ap.add_argument("--ref", help="engine the ratios are taken against (default: the first)")
    ap.add_argument("models", nargs="+", metavar="MODEL")
    args = ap.parse_args()
    if args.r < 1 or args.p < 0 or args.n < 0 or args.p + args.n == 0 or args.t < 1:
        ap.error("need -r >= 1, -t >= 1, and -p or -n above 0")
    names = [e["name"] for e in args.engines]
    if len(set(names)) != len(names):
        ap.error("engine names must differ")
    ref = args.ref or names[0]
    if ref not in names:
        ap.error("--ref %s is not an engine" % ref)
    for e in args.engines:
        if not os.access(e["path"], os.X_OK):
            ap.error("engine %s: %s is not an executable file" % (e["name"], e["path"]))
    for m in args.models:
        if not os.path.isfile(m):
            ap.error("model %s: no such file" % m)

    tests = asked(args)
    label = {"pp": "pp%d" % args.p, "tg": "tg%d" % args.n}
    # samples[(model, test, engine)][round]
    samples = {}
    n_eng = len(args.engines)
    print("command: %s" % " ".join(sys.argv), file=sys.stderr)
    for r in range(args.r):
        for m in args.models:
            for i in range(n_eng):
                e = args.engines[(i + r) % n_eng]
                got = run_once(e, m, args)
                for k in tests:
                    samples.setdefault((m, k, e["name"]), {})[r] = got[k]
                print("round %d %s %s %s %s" % (r + 1, os.path.basename(m), e["name"],
                                                time.strftime("%H:%M:%S"),
                                                " ".join("%s %.2f" % (label[k], got[k])
                                                         for k in tests)),
                      file=sys.stderr, flush=True)

    others = [n for n in names if n != ref]
    print("%s; %d CPUs online; %d round(s), finished %s UTC" %
          (cpu_model(), os.cpu_count(), args.r, time.strftime("%Y-%m-%d %H:%M", time.gmtime())))
    print()

    def row(cells):
        print("| " + " | ".join(cells) + " |")

    row(["model", "test"] + names + ["%s / %s" % (n, ref) for n in others])
    print("|---|---|" + "---:|" * (len(names) + len(others)))
    for m in args.models:
        for k in tests:
            cells = [os.path.basename(m), label[k]]
            cells += ["%.1f" % statistics.median(samples[(m, k, n)].values()) for n in names]
            for n in others:
                ratios = [samples[(m, k, n)][r] / samples[(m, k, ref)][r] for r in range(args.r)]
                cells.append("%.2f (%.2f-%.2f)" % (statistics.median(ratios), min(ratios),
                                                   max(ratios)))
            row(cells)
    print()
    print("Samples, t/s, in round order:")
    print()
    for m in args.models:
        for k in tests:
            print("%s %s: %s" % (os.path.basename(m), label[k], " | ".join(
                "%s %s" % (n, " ".join("%.1f" % samples[(m, k, n)][r] for r in range(args.r)))
                for n in names)))


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as err:
        print("compare_peers: %s" % err, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
