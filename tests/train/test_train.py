#!/usr/bin/python3
"""The training tool (tools/train/) against the engine: a tiny model is
trained for a few steps on a slice of the data and exported, and the engine
must load it, tokenize held-out text to the Python tokenizer's ids, and give
the PyTorch model's logits (rel 1e-4) for the F32 and F16 exports, for the
trained weights and for large random ones that make every part of the forward
pass (RoPE, q/k norms, GQA, routing) matter. Two runs with one seed must give
identical weights, and a run stopped and resumed the weights of one that was
not. When the shipped model (models/npumoe-tiny-moe.gguf) is there, its
tokenizer and logits are checked the same way, from the file alone.

Usage: test_train.py NPUMOE [--model GGUF --heldout TXT] [--keep]
Needs Debian's python3-torch, python3-regex, python3-numpy, bible-kjv.
"""
import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_DIR = os.path.join(ROOT, "tools", "train")
TRAIN = os.path.join(TRAIN_DIR, "train.py")
REL_TOL = 1e-4

try:
    import numpy as np
    import torch
except ImportError as e:
    print("test_train: %s: PyTorch and numpy are required (Debian: apt-get install python3-torch "
          "python3-numpy; run with /usr/bin/python3)" % e)
    print("test_train: 0 passed, 1 failed")
    sys.exit(1)

sys.path.insert(0, TRAIN_DIR)
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import bpe  # noqa: E402
import export  # noqa: E402
import train  # noqa: E402
from model import Config, Model  # noqa: E402

passed = 0
failed = 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("ok:   %s" % what)
    else:
        failed += 1
        print("FAIL: %s" % what + ("\n      %s" % detail if detail else ""))


def run(args, timeout=300):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def train_run(workdir, seed, extra=()):
    r = run([sys.executable, TRAIN, "train", "--preset", "tiny", "--workdir", workdir,
             "--seed", str(seed), "--ckpt-every", "2"] + list(extra))
    if r.returncode != 0:
        print(r.stdout[-2000:] + r.stderr[-2000:])
    return r.returncode == 0


def state(workdir):
    return torch.load(os.path.join(workdir, "ckpt.pt"))["model"]


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def engine_ids(npumoe, gguf, text=None, path=None):
    args = [npumoe, "tokenize", "-m", gguf] + (["-f", path] if path else ["-p", text])
    r = run(args)
    if r.returncode != 0:
        return "exit %d: %s" % (r.returncode, r.stderr.strip())
    return [int(t) for t in r.stdout.split()]


def engine_logits(npumoe, gguf, ids, tmp):
    out = os.path.join(tmp, "logits.bin")
    r = run([npumoe, "logits", "-m", gguf, "--tokens", " ".join(map(str, ids)), "--all",
             "-o", out, "-t", "2"])
    if r.returncode != 0:
        return None, "exit %d: %s" % (r.returncode, r.stderr.strip())
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1), ""


@torch.no_grad()
def compare_logits(npumoe, gguf, model, prompts_ids, tmp, what):
    model.eval()
    for ids in prompts_ids:
        got, err = engine_logits(npumoe, gguf, ids, tmp)
        if got is None:
            check(False, what, err)
            return
        want = model(torch.tensor([ids]))[0][0].double().numpy()
        rel = float(np.abs(got - want).max() / np.abs(want).max())
        check(rel <= REL_TOL, "%s: %d tokens, max |diff| / max |logit| = %.2e (limit %.0e)"
              % (what, len(ids), rel, REL_TOL))


def randomize(model, seed):
    """Weights far from the near-identity of a fresh model: norms 1 +- 0.3,
    matrices N(0, 1/fan_in), embeddings N(0, 9/d)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                scale = 3.0 if name == "tok_embd" else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * scale / math.sqrt(p.shape[-1]))


def model_from_gguf(path):
    """A PyTorch Model holding the weights of a qwen3moe GGUF, read with the
    independent reader of tests/ref/gguf.py."""
    import gguf
    f = gguf.GGUFFile(path)
    a = "qwen3moe."
    c = Config(n_vocab=f.tensors["token_embd.weight"].ne[1], n_ctx=f.require(a + "context_length"),
               d_model=f.require(a + "embedding_length"), n_layer=f.require(a + "block_count"),
               n_head=f.require(a + "attention.head_count"),
               n_head_kv=f.require(a + "attention.head_count_kv"),
               head_dim=f.require(a + "attention.key_length"),
               n_expert=f.require(a + "expert_count"),
               n_expert_used=f.require(a + "expert_used_count"),
               d_ff=f.require(a + "expert_feed_forward_length"),
               rope_theta=f.require(a + "rope.freq_base"),
               rms_eps=f.require(a + "attention.layer_norm_rms_epsilon"))
    m = Model(c)
    with torch.no_grad():
        for name, t, _ in export.tensors(m):
            t.copy_(torch.from_numpy(np.array(f.tensor(name), dtype=np.float32)))
    inv = {ch: b for b, ch in bpe.BYTE_TO_CHAR.items()}
    merges = [tuple(bytes(inv[ch] for ch in side) for side in line.split(" "))
              for line in f.require("tokenizer.ggml.merges")]
    tok = bpe.Tokenizer(merges)
    same_vocab = tok.token_texts() == list(f.require("tokenizer.ggml.tokens"))
    return m, tok, same_vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("npumoe")
    ap.add_argument("--model", help="the shipped GGUF (checked when given and present)")
    ap.add_argument("--heldout", help="the shipped held-out text")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    npumoe = a.npumoe
    tmp = tempfile.mkdtemp(prefix="nm_train_")
    A, B, C = (os.path.join(tmp, n) for n in "ABC")

    # ---- determinism and resume ----
    ok = train_run(A, 7) and train_run(B, 7)
    check(ok, "two tiny training runs with seed 7 complete")
    if ok:
        check(same_weights(state(A), state(B)), "the same seed gives bit-identical weights")
    ok = train_run(C, 7, ["--stop-after", "3"]) and train_run(C, 7)
    check(ok, "a run stopped after step 3 resumes to the end")
    if ok:
        check(torch.load(os.path.join(C, "ckpt.pt"))["step"] == 6 and same_weights(state(A), state(C)),
              "stopped-and-resumed weights equal an uninterrupted run's")
    r = run([sys.executable, TRAIN, "train", "--preset", "tiny", "--workdir", A, "--seed", "8"])
    check(r.returncode != 0 and "another run" in r.stdout + r.stderr,
          "a checkpoint of another seed is refused, not resumed")
    if not os.path.exists(os.path.join(A, "ckpt.pt")):
        print("test_train: %d passed, %d failed" % (passed, failed + 1))
        return 1

    # ---- export and the engine ----
    model, _ = train.load_model(A)
    tok = train.load_tokenizer(os.path.join(A, "tokenizer.txt"))
    g32, g16 = os.path.join(tmp, "tiny-f32.gguf"), os.path.join(tmp, "tiny-f16.gguf")
    export.write_gguf(model, tok, g32, "f32", "test")
    export.write_gguf(model, tok, g16, "f16", "test")
    r = run([npumoe, "info", "-m", g32])
    c = model.c
    check(r.returncode == 0 and "qwen3moe" in r.stdout
          and "%d, %d active per token" % (c.n_expert, c.n_expert_used) in r.stdout,
          "npumoe info loads the F32 export", r.stdout + r.stderr)

    with open(os.path.join(A, "heldout.txt"), encoding="utf-8") as f:
        heldout = f.read()
    got = engine_ids(npumoe, g32, path=os.path.join(A, "heldout.txt"))
    want = tok.encode(heldout)
    check(got == want, "npumoe tokenize of the held-out text (%d bytes) = the Python tokenizer's "
          "%d ids" % (len(heldout.encode()), len(want)),
          got if isinstance(got, str) else "first difference at %d" % next(
              (i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want))))
    texts = ["In the beginning God created the heaven and the earth.",
             "And he said unto them, Go ye into all the world,\n\nand preach",
             heldout[:200]]
    # Beyond the training text's ASCII: contractions in any case, runs of
    # spaces and newlines, digits, multi-byte UTF-8 (byte tokens only).
    odd = ["I'm here, you'RE there; they'll've gone.", "  many   spaces\n\n\t tab\r\nend  ",
           "12345 3.14159 1,000", "na\u00efve caf\u00e9 \u6771\u4eac \u2014 \u201cq\u201d \U0001f600",
           "Hello\n\n\n   world   \n", "x" * 50]
    bad = [t for t in texts + odd if engine_ids(npumoe, g32, text=t) != tok.encode(t)]
    check(not bad, "npumoe tokenize -p = the Python tokenizer's ids on %d prompts"
          % len(texts + odd), "differ: %r" % bad)
    prompts = [tok.encode(t)[:c.n_ctx] for t in texts]
    compare_logits(npumoe, g32, model, prompts, tmp, "F32 export, trained weights")
    m16, _ = train.load_model(A)
    export.round_like_export(m16, "f16")
    compare_logits(npumoe, g16, m16, prompts[:1], tmp, "F16 export, trained weights rounded to F16")
    randomize(model, 11)
    export.write_gguf(model, tok, g32, "f32", "test")
    compare_logits(npumoe, g32, model, prompts, tmp, "F32 export, large random weights")

    # ---- the shipped model, from the file alone ----
    if a.model and os.path.exists(a.model):
        m, stok, same_vocab = model_from_gguf(a.model)
        check(same_vocab, "shipped model: the merges rebuild exactly its token list")
        if a.heldout and os.path.exists(a.heldout):
            with open(a.heldout, encoding="utf-8") as f:
                text = f.read()
            got, want = engine_ids(npumoe, a.model, path=a.heldout), stok.encode(text)
            check(got == want, "shipped model: npumoe tokenize of %s = the Python tokenizer's %d ids"
                  % (os.path.basename(a.heldout), len(want)))
            ids = want[:64]
        else:
            ids = stok.encode(texts[0])
        compare_logits(npumoe, a.model, m, [ids], tmp, "shipped model: engine logits = PyTorch's")
    elif a.model:
        print("note: %s is not there; the shipped-model checks were skipped" % a.model)

    if a.keep:
        print("kept %s" % tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_train: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
