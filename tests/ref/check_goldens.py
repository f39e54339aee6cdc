"""Validates the Python reference (tests/ref/qwen3moe.py) against llama.cpp.

What it is for: proving that the reference the C engine is compared with is
itself right, using the goldens llama.cpp produced for tiny-qwen3moe
(shared/vectors/README.md): logits of the one-shot prefill, expert choices,
greedy continuations; plus the reference's own KV-cache path (prefill of the
first floor(n/2) tokens, then one token at a time) against its one-shot prefill.
What it is not: a test of the C engine (that is compare_engine.py).

Usage: /usr/bin/python3 tests/ref/check_goldens.py --vectors SHARED/vectors
Prints one line per check and ends with "N passed, M failed"; exits 1 on failure.
"""

import argparse
import os
import sys
import time

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3moe  # noqa: E402  (exits with a clear message when numpy is missing)

np = qwen3moe.np

# The README measured a float64 numpy forward at <= 2.7e-6 abs against these
# F32 goldens, and llama.cpp's own variants stay near 3e-7 rel; 1e-5 rel leaves
# room for that float32 noise but not for a wrong formula.
GOLDEN_REL_TOL = 1e-5
# Split vs one-shot are both float64 runs of the same code; only summation
# order and batch shapes differ, so anything above float64 noise is a bug.
SPLIT_REL_TOL = 1e-10


def read_int_lines(path):
    with open(path) as f:
        return [[int(t) for t in line.split()] for line in f.read().splitlines()]


def row_errors(a, b):
    """(max abs error, max over rows of max|a-b| / max|b|) for [n][n_vocab] arrays."""
    d = np.abs(a - b)
    rel = d.max(axis=1) / np.abs(b).max(axis=1)
    return float(d.max()), float(rel.max())


class Report:
    def __init__(self):
        self.n_pass = 0
        self.n_fail = 0

    def check(self, ok, name, detail):
        print("%s %-28s %s" % ("PASS" if ok else "FAIL", name, detail))
        if ok:
            self.n_pass += 1
        else:
            self.n_fail += 1


def split_forward(model, tokens):
    """Prefill of the first floor(n/2) tokens, then one token per call."""
    cache = model.new_cache()
    n0 = len(tokens) // 2
    parts = [model.forward(tokens[:n0], cache)]
    parts += [model.forward(tokens[i:i + 1], cache) for i in range(n0, len(tokens))]
    logits = np.concatenate([p.logits for p in parts], axis=0)
    experts = np.concatenate([p.experts for p in parts], axis=0)
    return logits, experts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vectors", required=True, help="shared/vectors folder")
    ap.add_argument("--model", default="tiny-qwen3moe", help="model folder under --vectors")
    args = ap.parse_args()

    vdir = os.path.join(args.vectors, args.model)
    if not os.path.isfile(os.path.join(vdir, "model.gguf")):
        sys.exit("error: no golden model at %s/model.gguf (is --vectors right?)" % vdir)

    t0 = time.time()
    model = qwen3moe.Qwen3MoE(os.path.join(vdir, "model.gguf"))
    prompts = read_int_lines(os.path.join(vdir, "prompts.txt"))
    positions = read_int_lines(os.path.join(vdir, "positions.txt"))
    greedy_ref = read_int_lines(os.path.join(vdir, "greedy.txt"))
    rep = Report()
    print("reference: %s, %d layers, d=%d, %d experts top-%d, vocab %d"
          % (vdir, model.n_layer, model.d_model, model.n_expert, model.n_used, model.n_vocab))

    for i, tokens in enumerate(prompts):
        tag = "prompt %d (n=%d)" % (i, len(tokens))
        gold = np.fromfile(os.path.join(vdir, "logits_%d.f32" % i), dtype="<f4")
        pos = positions[i]
        if gold.size != len(pos) * model.n_vocab:
            rep.check(False, tag + " golden", "logits_%d.f32 has %d floats, expected %d x %d"
                      % (i, gold.size, len(pos), model.n_vocab))
            continue
        gold = gold.reshape(len(pos), model.n_vocab).astype(np.float64)

        one = model.forward(tokens)
        ab, rel = row_errors(one.logits[pos], gold)
        rep.check(rel < GOLDEN_REL_TOL, tag + " logits",
                  "max abs %.3g, max rel %.3g (tol rel %g, %d rows)"
                  % (ab, rel, GOLDEN_REL_TOL, len(pos)))

        # Expert sets: llama.cpp lists each layer's experts by descending
        # probability; compare as sets so the order convention cannot matter.
        gold_ex = np.array(read_int_lines(os.path.join(vdir, "experts_%d.txt" % i)))
        gold_ex = gold_ex.reshape(len(tokens), model.n_layer, model.n_used)
        same = np.all(np.sort(gold_ex, -1) == np.sort(one.experts, -1), axis=-1)  # [n][n_layer]
        bad = np.argwhere(~same)
        detail = "all %d positions x %d layers equal; min router gap %.2g" % (
            len(tokens), model.n_layer, one.router_gap.min())
        if bad.size:
            p, il = bad[0]
            detail = "%d differ; first at position %d layer %d: ref %s, llama.cpp %s (gap %.2g)" % (
                len(bad), p, il, one.experts[p, il].tolist(), gold_ex[p, il].tolist(),
                one.router_gap[p, il])
        rep.check(not bad.size, tag + " experts", detail)

        ids, margins = qwen3moe.greedy(model, tokens, len(greedy_ref[i]))
        diff = [k for k in range(len(ids)) if ids[k] != greedy_ref[i][k]]
        detail = "%d tokens equal, min margin %.3g" % (len(ids), min(margins))
        if diff:
            k = diff[0]
            detail = "first difference at step %d: ref %d, llama.cpp %d (ref margin %.3g)" % (
                k, ids[k], greedy_ref[i][k], margins[k])
        rep.check(not diff, tag + " greedy", detail)

        split_logits, split_ex = split_forward(model, tokens)
        ab_s, rel_s = row_errors(split_logits, one.logits)
        ex_same = bool(np.all(np.sort(split_ex, -1) == np.sort(one.experts, -1)))
        rep.check(rel_s < SPLIT_REL_TOL and ex_same, tag + " split vs one-shot",
                  "prefill %d + %d single: max abs %.3g, max rel %.3g (tol %g), experts %s"
                  % (len(tokens) // 2, len(tokens) - len(tokens) // 2, ab_s, rel_s,
                     SPLIT_REL_TOL, "equal" if ex_same else "DIFFER"))
        ab_g, rel_g = row_errors(split_logits[pos], gold)
        rep.check(rel_g < GOLDEN_REL_TOL, tag + " split vs golden",
                  "max abs %.3g, max rel %.3g (tol rel %g)" % (ab_g, rel_g, GOLDEN_REL_TOL))

    print("time %.1f s" % (time.time() - t0))
    print("%d passed, %d failed" % (rep.n_pass, rep.n_fail))
    return 1 if rep.n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
