#!/usr/bin/python3
"""Trains npumoe's default model: a small Qwen3-MoE on the King James Bible,
with its own byte-level BPE tokenizer, on the CPU, deterministically from a
seed; exports it as a qwen3moe GGUF and measures it.

    train.py train  --workdir DIR [--preset small|tiny] [--seed N] [--steps N] [--layers N]
                    [--aux-coef X]
    train.py export --workdir DIR -o FILE.gguf [--type f16|bf16|f32]
    train.py eval   --workdir DIR [--type f16|bf16|f32]

`train` prepares the data and tokenizer once (DIR/tokenizer.txt, DIR/data.pt,
DIR/heldout.txt), then trains, writing DIR/ckpt.pt every --ckpt-every steps;
run the same command again to resume from it. The same seed gives the same
weights, bit for bit, on the same machine and libraries. Not here: anything
that needs a GPU or data from the network.
"""

import os
import sys

# Debian's python3-torch calls the system BLAS, which is the slow reference
# BLAS unless OpenBLAS is the chosen alternative. Rather than switch the
# alternative for the whole machine, run this process with OpenBLAS
# (libopenblas0-openmp) first on the library path, when it is installed.
_THREADS = 2
for _d in ("/usr/lib/x86_64-linux-gnu/openblas-openmp", "/usr/lib/aarch64-linux-gnu/openblas-openmp"):
    if os.path.isdir(_d) and _d not in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        _env = dict(os.environ)
        _env["LD_LIBRARY_PATH"] = ":".join(p for p in (_d, _env.get("LD_LIBRARY_PATH")) if p)
        _env.setdefault("OMP_NUM_THREADS", str(_THREADS))
        _env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning threads starve on a shared machine
        os.execve(sys.executable, [sys.executable] + sys.argv, _env)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

try:
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
except ImportError:
    sys.exit("error: PyTorch is required (Debian: apt-get install python3-torch; "
             "run with /usr/bin/python3)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402
import export  # noqa: E402
from model import Config, Model, load_balance_loss, param_count  # noqa: E402

# Presets. `small` is the shipped model; `tiny` is for tests (seconds).
PRESETS = {
    "small": dict(
        config=dict(n_vocab=4096, n_ctx=256, d_model=256, n_layer=6, n_head=4, n_head_kv=2,
                    head_dim=64, n_expert=32, n_expert_used=4, d_ff=48, rope_theta=10000.0),
        batch=16, steps=800, lr=2e-3, warmup=40, aux_coef=0.01, max_docs=0),
    "tiny": dict(
        config=dict(n_vocab=512, n_ctx=64, d_model=64, n_layer=2, n_head=4, n_head_kv=2,
                    head_dim=16, n_expert=8, n_expert_used=2, d_ff=32, rope_theta=10000.0),
        batch=4, steps=6, lr=3e-3, warmup=2, aux_coef=0.001, max_docs=40),
}

WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
LOG_EVERY = 10


def log(msg):
    print(msg, flush=True)


# ---- data ---------------------------------------------------------------------


def load_tokenizer(path):
    inv = {c: b for b, c in bpe.BYTE_TO_CHAR.items()}
    merges = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            a, b = line.rstrip("\n").split(" ")
            merges.append((bytes(inv[ch] for ch in a), bytes(inv[ch] for ch in b)))
    return bpe.Tokenizer(merges)


def prepare(workdir, cfg, max_docs):
    """Tokenizer and token ids, made once per workdir. Returns (tok, data)."""
    tok_path, data_path = os.path.join(workdir, "tokenizer.txt"), os.path.join(workdir, "data.pt")
    if os.path.exists(tok_path) and os.path.exists(data_path):
        return load_tokenizer(tok_path), torch.load(data_path)
    t0 = time.time()
    train_docs, heldout_docs = corpus.split(corpus.kjv_chapters())
    if max_docs:
        train_docs, heldout_docs = train_docs[:max_docs], heldout_docs[:max(1, max_docs // 10)]
    log("data: %d training chapters (%d bytes), %d held-out chapters (%d bytes)" % (
        len(train_docs), sum(len(d.encode()) for d in train_docs), len(heldout_docs),
        sum(len(d.encode()) for d in heldout_docs)))
    merges = bpe.train(train_docs, cfg.n_vocab - len(bpe.SPECIAL_TOKENS), log=log)
    tok = bpe.Tokenizer(merges)
    if tok.n_vocab != cfg.n_vocab:
        sys.exit("error: the training text yields only %d tokens, the model wants %d"
                 % (tok.n_vocab, cfg.n_vocab))
    stream = []
    for d in train_docs:
        stream.extend(tok.encode(d))
        stream.append(tok.eot)
    heldout_text = "\n".join(heldout_docs)
    data = {"train": torch.tensor(stream, dtype=torch.int32),
            "heldout": torch.tensor(tok.encode(heldout_text), dtype=torch.int32)}
    with open(os.path.join(workdir, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(heldout_text)
    with open(tok_path + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(m + "\n" for m in tok.merge_texts()))
    torch.save(data, data_path)
    os.replace(tok_path + ".tmp", tok_path)
    log("data: %d training tokens, %d held-out tokens, %.1f bytes/token, %.1fs" % (
        len(stream), len(data["heldout"]), sum(len(d.encode()) for d in train_docs) / len(stream),
        time.time() - t0))
    return tok, data


class Batches:
    """Windows of n_ctx+1 tokens from the training stream. Each epoch starts
    the window grid at a random offset and visits the windows in a random
    order, both drawn from a generator seeded by (seed, epoch): the batch of
    a step depends on nothing else, so a resumed run sees the same data."""

    def __init__(self, stream, n_ctx, batch, seed):
        self.stream, self.T, self.B, self.seed = stream.long(), n_ctx, batch, seed
        self.n_win = (len(stream) - 1) // n_ctx - 1
        if self.n_win < 1:
            sys.exit("error: %d training tokens do not fill two windows of %d"
                     % (len(stream), n_ctx))
        self._epoch, self._perm, self._offset = None, None, None

    def _for_epoch(self, e):
        if e != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1000003 + e)
            self._offset = int(torch.randint(0, self.T, (1,), generator=g))
            self._perm = torch.randperm(self.n_win, generator=g)
            self._epoch = e
        return self._offset, self._perm

    def get(self, step):
        rows = []
        for b in range(self.B):
            g = step * self.B + b
            offset, perm = self._for_epoch(g // self.n_win)
            start = offset + int(perm[g % self.n_win]) * self.T
            rows.append(self.stream[start:start + self.T + 1])
        x = torch.stack(rows)
        return x[:, :-1], x[:, 1:]

    def epochs(self, step):
        return step * self.B / self.n_win


# ---- training -----------------------------------------------------------------


def lr_at(step, steps, peak, warmup):
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * p)))


def make_optimizer(model, lr):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def save_checkpoint(path, state):
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_model(workdir):
    ck = torch.load(os.path.join(workdir, "ckpt.pt"))
    model = Model(Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    return model, ck


def cmd_train(a):
    preset = PRESETS[a.preset]
    cfg = Config(**dict(preset["config"], **({"n_layer": a.layers} if a.layers else {})))
    steps = a.steps or preset["steps"]
    if a.aux_coef is not None:
        preset = dict(preset, aux_coef=a.aux_coef)
    max_docs = preset["max_docs"] if a.max_docs is None else a.max_docs
    os.makedirs(a.workdir, exist_ok=True)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok, data = prepare(a.workdir, cfg, max_docs)
    batches = Batches(data["train"], cfg.n_ctx, preset["batch"], a.seed)

    ckpt_path = os.path.join(a.workdir, "ckpt.pt")
    model = Model(cfg)
    opt = make_optimizer(model, preset["lr"])
    start, elapsed = 0, 0.0
    run_args = dict(preset=a.preset, seed=a.seed, steps=steps, max_docs=max_docs,
                    batch=preset["batch"], lr=preset["lr"], warmup=preset["warmup"],
                    aux_coef=preset["aux_coef"])
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        if ck["config"] != cfg.to_dict() or ck["run"] != run_args:
            sys.exit("error: %s was made by another run (%s, %s); use another --workdir"
                     % (ckpt_path, ck["run"], ck["config"]))
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start, elapsed = ck["step"], ck["elapsed_s"]
        log("resuming at step %d of %d (%.0fs trained so far)" % (start, steps, elapsed))
    else:
        model.init_weights(torch.Generator().manual_seed(a.seed))
    total, active = param_count(cfg)
    log("model: %s" % json.dumps(cfg.to_dict()))
    log("run: %s" % json.dumps(run_args))
    log("model: %.2fM parameters, %.2fM active per token; batch %d x %d tokens, %d steps "
        "(%.2f epochs), seed %d, %d threads" % (
            total / 1e6, active / 1e6, preset["batch"], cfg.n_ctx, steps, batches.epochs(steps),
            a.seed, a.threads))

    tokens_per_step = preset["batch"] * cfg.n_ctx
    t_session, elapsed0 = time.time(), elapsed
    t_log, tok_since, ce_sum, aux_sum, n_sum = time.time(), 0, 0.0, 0.0, 0
    stop = min(steps, a.stop_after) if a.stop_after else steps
    for step in range(start, stop):
        model.train()
        lr = lr_at(step, steps, preset["lr"], preset["warmup"])
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batches.get(step)
        logits, stats = model(x)
        ce = F.cross_entropy(logits.reshape(-1, cfg.n_vocab), y.reshape(-1))
        aux = load_balance_loss(stats, cfg)
        loss = ce + preset["aux_coef"] * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        ce_sum, aux_sum, n_sum = ce_sum + ce.item(), aux_sum + aux.item(), n_sum + 1
        tok_since += tokens_per_step
        done = step + 1
        elapsed = elapsed0 + time.time() - t_session
        if done % LOG_EVERY == 0 or done == steps:
            tps = tok_since / max(time.time() - t_log, 1e-9)
            eta = (steps - done) * tokens_per_step / max(tps, 1e-9)
            top = max(float(s[0].max()) / float(s[0].sum()) for s in stats)
            log("step %5d/%d  loss %.4f  aux %.4f  lr %.2e  %.0f tok/s  epoch %.2f  "
                "max expert share %.3f  elapsed %s  ETA %s" % (
                    done, steps, ce_sum / n_sum, aux_sum / n_sum, lr, tps, batches.epochs(done),
                    top, hms(elapsed), hms(eta)))
            t_log, tok_since, ce_sum, aux_sum, n_sum = time.time(), 0, 0.0, 0.0, 0
        if done % a.ckpt_every == 0 or done == stop:
            save_checkpoint(ckpt_path, {"config": cfg.to_dict(), "run": run_args,
                                        "model": model.state_dict(), "opt": opt.state_dict(),
                                        "step": done, "elapsed_s": elapsed})
    if stop < steps:
        log("stopped after step %d of %d (--stop-after); run again to resume" % (stop, steps))
    else:
        log("training done: %d steps, %s" % (steps, hms(elapsed)))


def hms(s):
    s = int(s)
    return "%d:%02d:%02d" % (s // 3600, s // 60 % 60, s % 60)


# ---- export and evaluation ------------------------------------------------------


def cmd_export(a):
    model, ck = load_model(a.workdir)
    tok = load_tokenizer(os.path.join(a.workdir, "tokenizer.txt"))
    export.write_gguf(model, tok, a.output, a.type, a.name)
    log("wrote %s (%s, step %d, %d bytes)" % (a.output, a.type, ck["step"], os.path.getsize(a.output)))


@torch.no_grad()
def perplexity(model, ids, n_ctx, batch=8):
    """llama.cpp's method (llama-perplexity): non-overlapping windows of n_ctx
    tokens, each scored on its second half: the logits at position i predict
    token i+1 for i in [n_ctx/2, n_ctx-1). Returns (nll per scored token [n],
    target ids [n], per-layer expert assignment counts over all window
    positions [n_layer][n_expert])."""
    model.eval()
    c = model.c
    n_win = len(ids) // n_ctx
    if n_win < 1:
        raise ValueError("%d tokens are fewer than one window of %d" % (len(ids), n_ctx))
    first = n_ctx // 2
    nll, targets = [], []
    counts = torch.zeros(c.n_layer, c.n_expert, dtype=torch.long)
    wins = ids[:n_win * n_ctx].long().view(n_win, n_ctx)
    for i in range(0, n_win, batch):
        x = wins[i:i + batch]
        logits, stats = model(x)
        logp = logits[:, first:n_ctx - 1].double().log_softmax(-1)
        tgt = x[:, first + 1:]
        nll.append(-logp.gather(-1, tgt[..., None])[..., 0].reshape(-1))
        targets.append(tgt.reshape(-1))
        for l, (cnt, _) in enumerate(stats):
            counts[l] += cnt
    return torch.cat(nll), torch.cat(targets), counts


def cmd_eval(a):
    model, ck = load_model(a.workdir)
    torch.set_num_threads(a.threads)
    export.round_like_export(model, a.type)
    data = torch.load(os.path.join(a.workdir, "data.pt"))
    c = model.c
    n_ctx = a.ctx or c.n_ctx
    t0 = time.time()
    nll, targets, counts = perplexity(model, data["heldout"], n_ctx)
    ppl = math.exp(nll.mean().item())
    # Unigram model of the training tokens, add-one smoothed, on the same targets.
    freq = torch.bincount(data["train"].long(), minlength=c.n_vocab).double() + 1.0
    uni = -(freq / freq.sum()).log()[targets].mean().item()
    quarter = max(1, c.n_expert // 4)
    layers = []
    for l in range(c.n_layer):
        share = counts[l].double() / counts[l].sum()
        s, _ = share.sort(descending=True)
        layers.append({"top_quarter_share": round(s[:quarter].sum().item(), 4),
                       "max_share": round(s[0].item(), 4), "min_share": round(s[-1].item(), 4),
                       "experts_under_1pct": int((share < 0.01).sum()),
                       "counts": counts[l].tolist()})
    report = {"step": ck["step"], "weights": a.type, "n_ctx": n_ctx,
              "heldout_tokens": len(data["heldout"]), "scored_tokens": len(nll),
              "ppl": round(ppl, 4), "unigram_ppl": round(math.exp(uni), 4),
              "uniform_top_quarter_share": quarter / c.n_expert, "layers": layers,
              "eval_s": round(time.time() - t0, 1), "train_s": round(ck["elapsed_s"], 1)}
    path = os.path.join(a.workdir, "eval-%s.json" % a.type)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    log("held-out: %d tokens, %d scored, n_ctx %d, %s weights: ppl %.3f, unigram ppl %.3f" % (
        len(data["heldout"]), len(nll), n_ctx, a.type, ppl, math.exp(uni)))
    for l, r in enumerate(layers):
        log("layer %d: top quarter of experts take %.1f%% of assignments (uniform %.0f%%), "
            "max %.1f%%, min %.2f%%, %d experts under 1%%" % (
                l, 100 * r["top_quarter_share"], 100 * quarter / c.n_expert, 100 * r["max_share"],
                100 * r["min_share"], r["experts_under_1pct"]))
    log("wrote %s" % path)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="prepare data and tokenizer, train (resumes from DIR/ckpt.pt)")
    t.add_argument("--workdir", required=True)
    t.add_argument("--preset", choices=sorted(PRESETS), default="small")
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--steps", type=int, default=0, help="training steps (default: the preset's)")
    t.add_argument("--max-docs", type=int, default=None,
                   help="use only the first N training chapters (default: the preset's; 0 = all)")
    t.add_argument("--layers", type=int, default=0,
                   help="number of layers (default: the preset's)")
    t.add_argument("--aux-coef", type=float, default=None,
                   help="load-balancing loss coefficient (default: the preset's)")
    t.add_argument("--ckpt-every", type=int, default=50)
    t.add_argument("--stop-after", type=int, default=0,
                   help="stop (with a checkpoint) after this step of the schedule")
    t.add_argument("--threads", type=int, default=_THREADS)
    e = sub.add_parser("export", help="write DIR/ckpt.pt as a qwen3moe GGUF")
    e.add_argument("--workdir", required=True)
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--type", choices=sorted(export.FILE_TYPE), default="f16")
    e.add_argument("--name", default="npumoe-tiny-moe")
    v = sub.add_parser("eval", help="held-out perplexity, unigram perplexity, expert load skew")
    v.add_argument("--workdir", required=True)
    v.add_argument("--type", choices=sorted(export.FILE_TYPE), default="f16",
                   help="round the weights as this export type stores them")
    v.add_argument("--ctx", type=int, default=0, help="window length (default: trained context)")
    v.add_argument("--threads", type=int, default=_THREADS)
    a = p.parse_args(argv)
    if a.cmd in ("train", "eval") and a.threads < 1:
        p.error("--threads must be at least 1")
    {"train": cmd_train, "export": cmd_export, "eval": cmd_eval}[a.cmd](a)


if __name__ == "__main__":
    main(sys.argv[1:])
