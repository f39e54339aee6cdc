"""Float64 numpy reference forward pass of the phimoe architecture.

What it is for: the independent implementation the C engine's phimoe is
checked against, in both of its semantics:
  * as trained (default), written from Hugging Face transformers'
    modeling_phimoe.py: LayerNorm with bias (input_layernorm,
    post_attention_layernorm, the final norm), q/k/v/o biases, LongRoPE
    (inv_freq divided by short_factor up to original_max_position_embeddings,
    cos/sin times the attention factor -- the GGUF's rope.scaling.attn_factor,
    as HF's short_mscale is not in the file -- rotate_half pairing), "sparsemixer"
    routing at inference (router_jitter_noise 0.01: each of the two experts is
    the best remaining logit, weighted by its softmax probability among the
    remaining experts within a relative gap of 2 * 0.01), experts
    w2(silu(w1 x) * w3 x), lm_head with bias;
  * llama.cpp's graph (--compat llama.cpp): RMSNorm plus bias, softmax over
    all experts, top-2, renormalised; and, as ggml does, the input of the F16
    output matmul rounded to F16. This one is checked against llama.cpp's
    goldens (--check-goldens), which shows the shared parts are right.
It shares no code with the engine; it reads GGUF through tests/ref/gguf.py.
What it is not: fast, or for real-size models; no KV cache (whole prompts).

Command lines:
  phimoe.py MODEL.gguf --tokens "1 2 3" -o out.f32 [--compat llama.cpp]
      writes float32 logits [n_tokens][n_vocab];
  phimoe.py --vectors DIR --check-goldens
      the llama.cpp semantics against DIR/tiny-phimoe's goldens;
  phimoe.py --vectors DIR --engine PATH/TO/npumoe
      goldens, then `npumoe logits --all` in both semantics against this
      reference, and the distance (KL, top-1) between the two semantics.
Exit status 0 when every check passes.
"""

import argparse
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402

np = gguf.np

ROUTER_JITTER = 0.01  # Phi-3.5-MoE / Phi-tiny-MoE config.json router_jitter_noise


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def layer_norm(x, w, b, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rms_norm_bias(x, w, b, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w + b


def silu(x):
    return x / (1.0 + np.exp(-x))


def sparsemixer(logits, jitter):
    """HF sparsemixer with training off, for one token: ([ids], [weights])."""
    ids, weights = [], []
    scores = logits.copy()
    masked_scores = logits.copy()
    for _ in range(2):
        thr = np.max(masked_scores)
        best = int(np.argmax(masked_scores))
        factor = np.maximum(np.abs(scores), thr)
        mask = ((thr - scores) / factor) > 2 * jitter
        gates = np.where(mask, -np.inf, masked_scores)
        p = softmax(gates)
        ids.append(best)
        weights.append(p[best])
        masked_scores = masked_scores.copy()
        masked_scores[best] = -np.inf
    return ids, weights


def softmax_top2_renorm(logits):
    p = softmax(logits)
    order = sorted(range(len(p)), key=lambda e: (-p[e], e))[:2]
    w = p[order]
    return order, list(w / w.sum())


class Model:
    def __init__(self, path):
        g = gguf.GGUFFile(path)
        self.g = g
        key = lambda k, d=None: g.get("phimoe." + k, d)  # noqa: E731
        self.n_layer = int(key("block_count"))
        self.d = int(key("embedding_length"))
        self.n_head = int(key("attention.head_count"))
        self.n_kv = int(key("attention.head_count_kv"))
        self.hd = self.d // self.n_head
        self.n_rot = int(key("rope.dimension_count", self.hd))
        self.eps = float(key("attention.layer_norm_rms_epsilon"))
        self.theta = float(key("rope.freq_base", 10000.0))
        self.attn_factor = float(key("rope.scaling.attn_factor", 1.0))
        self.n_ctx_orig = int(key("rope.scaling.original_context_length",
                                  key("context_length")))
        self.k = int(key("expert_used_count"))
        w = lambda name: g.tensor(name, dtype=np.float64)  # noqa: E731
        self.w = w
        self.embd = w("token_embd.weight")
        self.out = w("output.weight")
        self.out_b = w("output.bias")
        self.out_f16 = g.tensors["output.weight"].type_id == gguf.GGML_F16
        self.factors_short = w("rope_factors_short.weight")
        self.factors_long = w("rope_factors_long.weight")

    def rope(self, x, pos, n_ctx):
        """x: [T][heads][hd]; NEOX pairing, LongRoPE factors, attention factor."""
        half = self.n_rot // 2
        factors = self.factors_short if n_ctx <= self.n_ctx_orig else self.factors_long
        inv_freq = 1.0 / (factors * self.theta ** (np.arange(half) * 2.0 / self.n_rot))
        ang = pos[:, None].astype(np.float64) * inv_freq[None, :]
        cos = (np.cos(ang) * self.attn_factor)[:, None, :]
        sin = (np.sin(ang) * self.attn_factor)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:self.n_rot]
        rot = np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
        return np.concatenate([rot, x[..., self.n_rot:]], axis=-1)

    def forward(self, ids, compat=False, n_ctx=512):
        """All logits [T][n_vocab] and the experts chosen [layer][T][2]."""
        norm = rms_norm_bias if compat else layer_norm
        T = len(ids)
        x = self.embd[np.asarray(ids)]
        pos = np.arange(T)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        group = self.n_head // self.n_kv
        experts = []
        for il in range(self.n_layer):
            p = "blk.%d." % il
            w = lambda s: self.w(p + s)  # noqa: E731
            h = norm(x, w("attn_norm.weight"), w("attn_norm.bias"), self.eps)
            q = (h @ w("attn_q.weight").T + w("attn_q.bias")).reshape(T, self.n_head, self.hd)
            k = (h @ w("attn_k.weight").T + w("attn_k.bias")).reshape(T, self.n_kv, self.hd)
            v = (h @ w("attn_v.weight").T + w("attn_v.bias")).reshape(T, self.n_kv, self.hd)
            q, k = self.rope(q, pos, n_ctx), self.rope(k, pos, n_ctx)
            att = np.empty((T, self.n_head, self.hd))
            for hh in range(self.n_head):
                s = q[:, hh, :] @ k[:, hh // group, :].T / np.sqrt(self.hd) + mask
                att[:, hh, :] = softmax(s) @ v[:, hh // group, :]
            x = x + att.reshape(T, -1) @ w("attn_output.weight").T + w("attn_output.bias")
            h = norm(x, w("ffn_norm.weight"), w("ffn_norm.bias"), self.eps)
            router = h @ w("ffn_gate_inp.weight").T
            gate, up, down = (w("ffn_gate_exps.weight"), w("ffn_up_exps.weight"),
                              w("ffn_down_exps.weight"))
            moe = np.zeros_like(x)
            chosen = []
            for t in range(T):
                e_ids, e_w = (softmax_top2_renorm(router[t]) if compat
                              else sparsemixer(router[t], ROUTER_JITTER))
                chosen.append(e_ids)
                for e, wt in zip(e_ids, e_w):
                    moe[t] += wt * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
            experts.append(chosen)
            x = x + moe
        h = norm(x, self.w("output_norm.weight"), self.w("output_norm.bias"), self.eps)
        if compat and self.out_f16:
            h = h.astype(np.float32).astype(np.float16).astype(np.float64)
        return h @ self.out.T + self.out_b, experts


def read_lines(path):
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


def rel_err(a, b):
    """max over rows of max|a - b| / max|b|."""
    return float(np.max(np.max(np.abs(a - b), axis=-1) / np.max(np.abs(b), axis=-1)))


def kl_top1(p_logits, q_logits):
    """Mean KL(p || q) over rows and the share of rows with the same argmax."""
    lp = p_logits - np.max(p_logits, axis=-1, keepdims=True)
    lp = lp - np.log(np.sum(np.exp(lp), axis=-1, keepdims=True))
    lq = q_logits - np.max(q_logits, axis=-1, keepdims=True)
    lq = lq - np.log(np.sum(np.exp(lq), axis=-1, keepdims=True))
    kl = np.sum(np.exp(lp) * (lp - lq), axis=-1)
    top1 = np.mean(np.argmax(p_logits, axis=-1) == np.argmax(q_logits, axis=-1))
    return float(np.mean(kl)), float(np.max(kl)), float(top1)


N_PROMPTS = 4  # prompts 0..3 (1, 7, 32, 100 tokens): enough, and fast


def check_goldens(model, vdir):
    ok = True
    prompts = read_lines(os.path.join(vdir, "prompts.txt"))
    positions = read_lines(os.path.join(vdir, "positions.txt"))
    for i in range(N_PROMPTS):
        ids = [int(t) for t in prompts[i]]
        got, experts = model.forward(ids, compat=True)
        pos = [int(t) for t in positions[i]]
        gold = np.fromfile(os.path.join(vdir, "logits_%d.f32" % i), dtype="<f4")
        gold = gold.reshape(len(pos), -1).astype(np.float64)
        e = rel_err(got[pos], gold)
        want = read_lines(os.path.join(vdir, "experts_%d.txt" % i))
        gaps = read_lines(os.path.join(vdir, "router_gap_%d.txt" % i))
        diff = 0
        for t in range(len(ids)):
            for il in range(model.n_layer):
                if float(gaps[t][il]) < 1e-4:
                    continue
                w = set(int(v) for v in want[t][il * 2:il * 2 + 2])
                diff += w != set(experts[il][t])
        good = e < 1e-5 and diff == 0
        ok &= good
        print("%s reference (llama.cpp semantics) vs golden, prompt %d (%d tokens): "
              "max rel %.3g, expert sets differing %d" % ("ok  " if good else "FAIL", i,
                                                         len(ids), e, diff))
    return ok


def engine_logits(binary, model_path, ids, compat, n_vocab):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        argv = [binary, "logits", "-m", model_path, "--tokens", " ".join(map(str, ids)),
                "--all", "-o", out, "-t", "2"]
        if compat:
            argv += ["--compat", "llama.cpp"]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        if p.returncode != 0:
            raise RuntimeError("%s failed: %s" % (" ".join(argv), p.stderr.decode()))
        return np.fromfile(out, dtype="<f4").reshape(len(ids), n_vocab).astype(np.float64)


def check_engine(model, vdir, binary):
    ok = True
    model_path = os.path.join(vdir, "model.gguf")
    prompts = read_lines(os.path.join(vdir, "prompts.txt"))
    all_ref = {False: [], True: []}
    for i in range(N_PROMPTS):
        ids = [int(t) for t in prompts[i]]
        for compat in (False, True):
            ref, _ = model.forward(ids, compat=compat)
            got = engine_logits(binary, model_path, ids, compat, ref.shape[-1])
            rows = list(range(len(ids)))
            if compat:
                # positions where llama.cpp's router gap is below 1e-4: a
                # float32 engine and a float64 reference may pick different
                # experts there, legitimately
                gaps = read_lines(os.path.join(vdir, "router_gap_%d.txt" % i))
                rows = [t for t in rows if min(float(v) for v in gaps[t]) >= 1e-4]
            e = rel_err(got[rows], ref[rows])
            # F32 engine vs float64 reference: float rounding only, 1e-5. In
            # llama.cpp semantics the output matmul's input is rounded to
            # F16, which is discontinuous: a float32-vs-float64 difference
            # can flip one element's rounding by an F16 ulp (4.9e-4 of it),
            # about 1e-4 of the logits; hence 5e-4 there.
            good = e < (5e-4 if compat else 1e-5)
            ok &= good
            all_ref[compat].append(ref)
            print("%s engine vs reference (%s), prompt %d (%d tokens, %d compared): max rel %.3g"
                  % ("ok  " if good else "FAIL", "llama.cpp" if compat else "as trained", i,
                     len(ids), len(rows), e))
    trained = np.concatenate(all_ref[False])
    llama = np.concatenate(all_ref[True])
    kl_mean, kl_max, top1 = kl_top1(trained, llama)
    print("as trained vs llama.cpp semantics (reference, prompts 0..%d, %d positions): "
          "KL mean %.4g max %.4g nats, top-1 agreement %.1f%%"
          % (N_PROMPTS - 1, trained.shape[0], kl_mean, kl_max, 100 * top1))
    ok &= kl_mean > 0  # the semantics do differ
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", help="GGUF model (phimoe)")
    ap.add_argument("--tokens", help="token ids, space separated")
    ap.add_argument("-o", "--output", help="float32 logits output")
    ap.add_argument("--compat", choices=["none", "llama.cpp"], default="none")
    ap.add_argument("--vectors", help="the vectors folder (shared/vectors)")
    ap.add_argument("--check-goldens", action="store_true")
    ap.add_argument("--engine", help="npumoe binary to compare")
    args = ap.parse_args()
    if args.vectors:
        vdir = os.path.join(args.vectors, "tiny-phimoe")
        model = Model(os.path.join(vdir, "model.gguf"))
        ok = check_goldens(model, vdir)
        if args.engine:
            ok &= check_engine(model, vdir, os.path.abspath(args.engine))
        print("phimoe reference: %s" % ("all checks passed" if ok else "FAILED"))
        return 0 if ok else 1
    if not (args.model and args.tokens and args.output):
        ap.error("give MODEL --tokens IDS -o FILE, or --vectors DIR")
    model = Model(args.model)
    logits, _ = model.forward([int(t) for t in args.tokens.split()],
                              compat=args.compat == "llama.cpp")
    logits.astype("<f4").tofile(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
