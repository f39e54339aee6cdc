"""Compares the C engine's `npumoe` command with the Python reference.

What it is for: the end-to-end CTest of the engine.  For each model and a few
token-id prompts it runs
    NPUMOE logits -m MODEL --tokens "IDS" --all -o FILE   (float32 LE [n][n_vocab])
    NPUMOE run -m MODEL --tokens "IDS" -n 16 --temp 0 --json   ("generated_ids")
and checks the logits at every position and the greedy ids against
tests/ref/qwen3moe.py (float64, independent of the engine).
What it is not: a check of the reference itself (check_goldens.py does that
against llama.cpp), nor a test of quantised models (the reference reads only
F32, F16 and BF16 weights).

Usage: /usr/bin/python3 tests/ref/compare_engine.py PATH/TO/npumoe
           [--vectors SHARED/vectors] [--model OTHER.gguf ...]
Prints one line per check, ends with "N passed, M failed"; exits 1 on failure.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402  (exits with a clear message when numpy is missing)
import qwen3moe  # noqa: E402

np = gguf.np

# F32 weights: the engine and the float64 reference differ only by float32
# rounding; the README measures ~3e-7 rel for llama.cpp against float64.
REL_TOL_F32 = 1e-5
# F16/BF16 weights: the reference widens the stored weights exactly, and the
# engine today keeps F32 activations, so the same 1e-5 holds (measured: 6e-7).
# An engine that rounds activations to F16 before the matmul (llama.cpp does,
# ~5e-4 rel on the all-F16 tiny-mixtral) or to BF16 (~1.5e-3 rel measured, and
# expert flips within tens of tokens) needs a statistical check instead; raise
# this only together with such a kernel choice, documented in docs/.
REL_TOL_HALF = 1e-5
# A greedy step whose top-1/top-2 reference margin is below this may go either
# way in a correct engine; it is scaled up for half-precision models (below).
NEAR_TIE = 1e-3
N_GREEDY = 16
HALF_TYPES = {"F16", "BF16"}


class Report:
    def __init__(self):
        self.n_pass = 0
        self.n_fail = 0

    def check(self, ok, name, detail):
        print("%s %-36s %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)
        if ok:
            self.n_pass += 1
        else:
            self.n_fail += 1


class EngineError(Exception):
    """The npumoe command could not be run or broke its output contract."""


def show_argv(argv):
    """The command line for messages, with long token lists shortened."""
    out = []
    for a in argv:
        ids = a.split()
        out.append('"%s ... (%d ids)"' % (" ".join(ids[:4]), len(ids))
                   if len(ids) > 8 else (a if len(ids) == 1 else '"%s"' % a))
    return " ".join(out)


def run_engine(argv, timeout):
    """Runs the engine; returns stdout, or raises EngineError with its stderr."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EngineError("timed out after %d s: %s" % (timeout, show_argv(argv)))
    except OSError as e:
        raise EngineError("cannot run %s: %s" % (argv[0], e))
    if p.returncode != 0:
        tail = p.stderr.decode("utf-8", "replace").strip()[-800:]
        raise EngineError("exit status %d from: %s\n    stderr: %s"
                          % (p.returncode, show_argv(argv), tail or "(empty)"))
    return p.stdout.decode("utf-8", "replace")


def engine_logits(binary, model_path, ids, all_rows, out_path, n_vocab, timeout):
    argv = [binary, "logits", "-m", model_path, "--tokens", " ".join(map(str, ids))]
    if all_rows:
        argv.append("--all")
    argv += ["-o", out_path]
    if os.path.exists(out_path):
        os.remove(out_path)  # never read a stale file from an earlier prompt
    run_engine(argv, timeout)
    if not os.path.isfile(out_path):
        raise EngineError("no output file %s from: %s" % (out_path, show_argv(argv)))
    n_rows = len(ids) if all_rows else 1
    got = np.fromfile(out_path, dtype="<f4")
    if got.size != n_rows * n_vocab:
        raise EngineError("%s holds %d floats, expected %d x %d"
                          % (out_path, got.size, n_rows, n_vocab))
    return got.reshape(n_rows, n_vocab).astype(np.float64)


def parse_json_output(text):
    """The JSON object of `run --json`: the whole stdout or its last {...} line."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            return json.loads(text[start:end + 1])
        except ValueError:
            pass
    raise EngineError("no JSON object in `run --json` output: %r" % text[-300:])


def reference_greedy(model, ids, n_new):
    """Greedy ids and the reference logits row behind each choice."""
    cache = model.new_cache()
    row = model.forward(ids, cache).logits[-1]
    toks, rows = [], []
    for i in range(n_new):
        tok = int(np.argmax(row))
        toks.append(tok)
        rows.append(row)
        if i + 1 < n_new:
            row = model.forward([tok], cache).logits[-1]
    return toks, rows


def compare_greedy(ref_ids, ref_rows, got_ids, rel_tol, eos_ids):
    """(ok, detail).  Exact until the first near-tie; there any near-tied token
    is accepted and later steps are not compared, since a legitimate different
    choice changes everything after it."""
    if not isinstance(got_ids, list) or not all(isinstance(t, int) for t in got_ids):
        return False, "generated_ids is not a list of integers: %r" % (got_ids,)
    if len(got_ids) > len(ref_ids):
        return False, "engine generated %d ids, asked for %d" % (len(got_ids), len(ref_ids))
    for k, ref_tok in enumerate(ref_ids):
        row = ref_rows[k]
        top2 = np.partition(row, -2)[-2:]
        margin = top2[1] - top2[0]
        tie = max(NEAR_TIE, 2.0 * rel_tol * np.abs(row).max())
        if k >= len(got_ids):
            # Shorter output is fine only if the engine stopped at end-of-sequence.
            if got_ids and got_ids[-1] in eos_ids:
                return True, "equal for %d ids, engine stopped at EOS %d" % (k, got_ids[-1])
            return False, "engine generated only %d of %d ids: %s" % (
                len(got_ids), len(ref_ids), got_ids)
        tok = got_ids[k]
        if margin < tie:
            if not 0 <= tok < row.size:
                return False, "step %d: engine id %d out of range" % (k, tok)
            if row[tok] < top2[1] - tie:
                return False, ("step %d is a near-tie (margin %.3g) but engine chose %d, "
                               "%.3g below the top" % (k, margin, tok, top2[1] - row[tok]))
            return True, "equal for %d ids; near-tie at step %d (margin %.3g), rest skipped" % (
                k, k, margin)
        if tok != ref_tok:
            return False, "step %d: engine %d, reference %d (margin %.3g)\n    engine %s\n    ref    %s" % (
                k, tok, ref_tok, margin, got_ids, ref_ids)
    return True, "all %d ids equal" % len(ref_ids)


def make_prompts(n_vocab, seed=20240611):
    """Token-id lists: one token, short, ~100 tokens, random over the whole vocab
    (including both ends), and one longer than typical prefill chunks."""
    rng = np.random.default_rng(seed)
    v = n_vocab
    return [
        ("1 token", [9707 % v]),
        ("short", [t % v for t in (785, 3974, 13876, 38835, 34208, 916, 279, 15678)]),
        ("100 tokens", [int(t) for t in rng.integers(0, min(v, 4096), 100)]),
        ("random ids", [0, v - 1] + [int(t) for t in rng.integers(0, v, 35)]),
        ("200 tokens", [int(t) for t in rng.integers(0, v, 200)]),
    ]


def model_tag(path):
    """Short name: the folder for .../NAME/model.gguf, else the file's stem."""
    base = os.path.basename(path)
    if base == "model.gguf":
        return os.path.basename(os.path.dirname(os.path.abspath(path)))
    return os.path.splitext(base)[0]


def check_model(binary, model_path, rep, timeout, workdir):
    name = model_tag(model_path)
    try:
        model = qwen3moe.Qwen3MoE(model_path)
    except (gguf.GGUFError, OSError) as e:
        rep.check(False, name + " load", "reference cannot run this model: %s" % e)
        return
    weight_types = {t.type_name for t in gguf.GGUFFile(model_path).tensors.values()
                    if len(t.ne) >= 2}
    half = bool(weight_types & HALF_TYPES)
    rel_tol = REL_TOL_HALF if half else REL_TOL_F32
    print("model %s: weights %s, %s output, vocab %d; logits tol rel %g"
          % (model_path, "/".join(sorted(weight_types)),
             "tied" if model.tied_output else "untied", model.n_vocab, rel_tol))
    out_path = os.path.join(workdir, "logits.f32")

    for label, ids in make_prompts(model.n_vocab):
        tag = "%s %s (n=%d)" % (name, label, len(ids))
        ref = model.forward(ids).logits
        try:
            got = engine_logits(binary, model_path, ids, True, out_path, model.n_vocab, timeout)
        except EngineError as e:
            rep.check(False, tag + " logits", str(e))
        else:
            finite = bool(np.all(np.isfinite(got)))
            d = np.abs(got - ref)
            rel = d.max(axis=1) / np.abs(ref).max(axis=1)      # per position
            worst = int(np.argmax(rel))
            rep.check(finite and rel.max() < rel_tol, tag + " logits",
                      "max abs %.3g, max rel %.3g at position %d (tol %g)%s"
                      % (d.max(), rel.max(), worst, rel_tol,
                         "" if finite else ", NON-FINITE values"))

        ref_ids, ref_rows = reference_greedy(model, ids, N_GREEDY)
        argv = [binary, "run", "-m", model_path, "--tokens", " ".join(map(str, ids)),
                "-n", str(N_GREEDY), "--temp", "0", "--json"]
        try:
            out = parse_json_output(run_engine(argv, timeout))
            if not isinstance(out, dict) or "generated_ids" not in out:
                raise EngineError("`run --json` output has no \"generated_ids\": %r"
                                  % (out,))
        except EngineError as e:
            rep.check(False, tag + " greedy", str(e))
        else:
            ok, detail = compare_greedy(ref_ids, ref_rows, out["generated_ids"],
                                        rel_tol, model.eos_ids)
            rep.check(ok, tag + " greedy", detail)

    # Without --all the contract is the last row only.
    ids = make_prompts(model.n_vocab)[1][1]
    tag = "%s short, last row only" % name
    try:
        got = engine_logits(binary, model_path, ids, False, out_path, model.n_vocab, timeout)
    except EngineError as e:
        rep.check(False, tag, str(e))
    else:
        ref = model.forward(ids).logits[-1:]
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        rep.check(bool(np.all(np.isfinite(got))) and rel < rel_tol, tag,
                  "max rel %.3g (tol %g)" % (rel, rel_tol))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_vectors = os.path.normpath(os.path.join(here, "..", "..", "..", "shared", "vectors"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("npumoe", help="path of the npumoe binary")
    ap.add_argument("--vectors", default=default_vectors,
                    help="shared/vectors folder (its tiny-qwen3moe/model.gguf is always checked)")
    ap.add_argument("--model", action="append", default=[],
                    help="another qwen3moe GGUF to check (repeatable)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per engine call")
    args = ap.parse_args()

    binary = os.path.abspath(args.npumoe)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        print("error: npumoe binary not found or not executable: %s "
              "(build the `npumoe` target first)" % binary)
        print("0 passed, 1 failed")
        return 1
    models = [os.path.join(args.vectors, "tiny-qwen3moe", "model.gguf")] + args.model
    missing = [m for m in models if not os.path.isfile(m)]
    if missing:
        print("error: model file(s) not found: %s" % ", ".join(missing))
        print("0 passed, 1 failed")
        return 1

    rep = Report()
    with tempfile.TemporaryDirectory(prefix="nm_compare_") as workdir:
        for m in models:
            check_model(binary, m, rep, args.timeout, workdir)
    print("%d passed, %d failed" % (rep.n_pass, rep.n_fail))
    return 1 if rep.n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
