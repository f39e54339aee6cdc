"""Block-by-block scoring for bench/budget_sweep.sh (docs/NPUMOE.md,
"Budgeted tiers"). A text's tokens are cut into blocks of whole windows;
each block is scored by `npumoe compare` (the dense reference and the
plan's candidate see the same tokens), and means over the text come with
the standard error of paired differences (batch means over the blocks).

  budget_blocks.py windows IDS CTX BW
  budget_blocks.py score NAME PLAN IDS NPUMOE MODEL CTX BW BLOCKS_OUT
  budget_blocks.py diff NAME BLOCKS_A BLOCKS_B          (A less B)
"""
import json
import math
import subprocess
import sys


def paired(d, n):
    """Token-weighted mean of the blocks' differences d (blocks of n tokens)
    and its standard error."""
    big_n, k = sum(n), len(d)
    mean = sum(t * x for t, x in zip(n, d)) / big_n
    if k < 2:
        return mean, float("nan")
    return mean, math.sqrt(k / (k - 1) * sum((t * (x - mean)) ** 2 for t, x in zip(n, d))) / big_n


def block_starts(n_win, bw):
    """First window of each block; compare scores at least two windows, so
    a last block of one joins the one before."""
    starts = list(range(0, n_win, bw))
    if len(starts) > 1 and n_win - starts[-1] < 2:
        starts.pop()
    return starts


def windows(ids_path, ctx, bw):
    ids = open(ids_path).read().split()
    w = len(ids) // ctx
    print(f"eval: {len(ids)} tokens, {w} windows of {ctx}, {len(block_starts(w, bw))} blocks "
          f"of {bw} windows (a last one of a single window joins the one before)")


def score(name, plan_path, ids_path, np, model, ctx, bw, blocks_path):
    p = json.load(open(plan_path))
    ids = open(ids_path).read().split()
    n_win = len(ids) // ctx
    starts = block_starts(n_win, bw)
    d, n, kls, asg, drop, dw = [], [], [], 0, 0, 0.0
    for i, w0 in enumerate(starts):
        w1 = starts[i + 1] if i + 1 < len(starts) else n_win
        run = subprocess.run([np, "compare", "-m", model, "--tokens", " ".join(ids[w0 * ctx:w1 * ctx]),
                              "--ctx", str(ctx), "--plan", plan_path, "--mode", "grouped", "--json"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"npumoe compare failed on windows {w0}..{w1 - 1}: {run.stderr.strip()[-500:]}")
        c = json.loads(run.stdout)
        # the block's mean NLL difference, candidate less reference
        d.append(math.log(c["candidate_perplexity"] / c["perplexity"]))
        n.append(c["tokens_scored"])
        kls.append(c["kl_mean"])
        r = c["moe"]["total"]
        asg += r["assignments"]
        drop += r["dropped"]
        dw += r["dropped_weight"] * r["assignments"]  # top-k weights sum alike per token
    json.dump({"d": d, "n": n, "kl": kls}, open(blocks_path, "w"))
    mean, se = paired(d, n)
    kl = sum(t * x for t, x in zip(n, kls)) / sum(n)
    rows = [sum(g["tier"] * len(g["experts"]) for g in l["groups"]) for l in p["layers"]]
    print(f"| {name} | {sum(rows) / len(rows):.0f} | {100 * math.expm1(mean):+.3f}% | "
          f"{100 * se:.3f}% | {kl:.5f} | "
          f"{100 * p['predicted_drop_rate']:.3f}% | {100 * drop / asg:.3f}% | "
          f"{100 * p['predicted_drop_weight']:.3f}% | {100 * dw / asg:.3f}% |", flush=True)


def diff(name, a_path, b_path):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    m, se = paired([x - y for x, y in zip(a["d"], b["d"])], a["n"])
    mk, sek = paired([x - y for x, y in zip(a["kl"], b["kl"])], a["n"])
    print(f"| {name} | | {100 * math.expm1(m):+.3f}% | {100 * se:.3f}% | "
          f"{mk:+.5f} +/- {sek:.5f} | | | | |", flush=True)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "windows":
        windows(args[0], int(args[1]), int(args[2]))
    elif cmd == "score":
        score(*args[:5], int(args[5]), int(args[6]), args[7])
    elif cmd == "diff":
        diff(*args)
    else:
        sys.exit(__doc__)
