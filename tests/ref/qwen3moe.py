"""Float64 numpy reference forward pass of the qwen3moe architecture.

What it is for: the independent implementation that the C engine's tests
compare against.  It is written from the model's definition (Hugging Face
Qwen3-MoE, as llama.cpp runs it) and shares no code with the engine; it reads
GGUF through tests/ref/gguf.py.  It has a KV cache so that "prefill, then one
token at a time" can be checked against one long prefill.
What it is not: fast, or meant for real-size models (every weight is widened to
float64 in memory); it has no tokenizer, no sampling beyond greedy argmax, and
no quantised weights.

Command line (same output format as `npumoe logits`):
  /usr/bin/python3 tests/ref/qwen3moe.py MODEL.gguf --tokens "1 2 3" -o out.f32 [--all]
writes float32 little-endian logits, [n_tokens][n_vocab] with --all, else the
last row [n_vocab].  --greedy N also prints N greedy token ids.
"""

import argparse
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402  (exits with a clear message when numpy is missing)

np = gguf.np

ARCH = "qwen3moe"


def rms_norm(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rope_neox(x, pos, theta):
    """NeoX RoPE: rotates the pair (x[i], x[i + hd/2]) by pos * theta^(-2i/hd).

    x: [T][n_heads][hd], pos: [T] absolute positions.
    """
    hd = x.shape[-1]
    half = hd // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / hd)  # [half]
    ang = pos.astype(np.float64)[:, None] * inv_freq[None, :]            # [T][half]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


class KVCache:
    """Keys (after q/k-norm and RoPE) and values of all positions seen so far."""

    def __init__(self, n_layer):
        self.k = [None] * n_layer  # each [n_past][n_head_kv][head_dim]
        self.v = [None] * n_layer  # each [n_past][n_head_kv][head_dim]
        self.n_past = 0

    def append(self, il, k, v):
        """Adds this batch's k, v to layer il; returns all keys and values."""
        if self.k[il] is None:
            self.k[il], self.v[il] = k, v
        else:
            self.k[il] = np.concatenate([self.k[il], k], axis=0)
            self.v[il] = np.concatenate([self.v[il], v], axis=0)
        return self.k[il], self.v[il]


class ForwardResult:
    """Outputs of one forward call over a batch of T tokens.

    logits:     [T][n_vocab] float64
    experts:    [T][n_layer][n_used] int, per layer in descending router probability
    router_gap: [T][n_layer] p(k-th chosen) - p(best unchosen) on the router
                softmax; small values mark positions where noise may flip routing.
    """

    def __init__(self, logits, experts, router_gap):
        self.logits = logits
        self.experts = experts
        self.router_gap = router_gap


class Qwen3MoE:
    """Weights and hyperparameters of a qwen3moe GGUF, widened to float64."""

    def __init__(self, path):
        g = gguf.GGUFFile(path)
        self.path = path
        arch = g.get("general.architecture")
        if arch != ARCH:
            raise gguf.GGUFError("%s: architecture is %r; this reference runs only %r"
                                 % (path, arch, ARCH))

        def hp(key, default=None):
            v = g.get(ARCH + "." + key, default)
            if v is None:
                raise gguf.GGUFError("%s: missing metadata key %s.%s" % (path, ARCH, key))
            return v

        self.n_layer = int(hp("block_count"))
        self.d_model = int(hp("embedding_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        # head_dim is its own key: n_head * head_dim may differ from d_model.
        self.head_dim = int(hp("attention.key_length", self.d_model // self.n_head))
        self.n_expert = int(hp("expert_count"))
        self.n_used = int(hp("expert_used_count"))
        self.eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.rope_theta = float(hp("rope.freq_base", 10000.0))
        if self.n_head % self.n_head_kv != 0:
            raise gguf.GGUFError("%s: head_count %d not a multiple of head_count_kv %d"
                                 % (path, self.n_head, self.n_head_kv))
        if not 0 < self.n_used <= self.n_expert:
            raise gguf.GGUFError("%s: expert_used_count %d out of range 1..%d"
                                 % (path, self.n_used, self.n_expert))

        def w(name):
            return g.tensor(name, dtype=np.float64)

        self.tok_embd = w("token_embd.weight")             # [n_vocab][d]
        self.n_vocab = self.tok_embd.shape[0]
        self.tied_output = "output.weight" not in g.tensors
        self.output = self.tok_embd if self.tied_output else w("output.weight")  # [n_vocab][d]
        self.output_norm = w("output_norm.weight")         # [d]
        self.weight_types = sorted({t.type_name for t in g.tensors.values()})

        self.layers = []
        for il in range(self.n_layer):
            p = "blk.%d." % il
            self.layers.append({
                "attn_norm": w(p + "attn_norm.weight"),      # [d]
                "wq": w(p + "attn_q.weight"),                # [n_head*hd][d]
                "wk": w(p + "attn_k.weight"),                # [n_head_kv*hd][d]
                "wv": w(p + "attn_v.weight"),                # [n_head_kv*hd][d]
                "wo": w(p + "attn_output.weight"),           # [d][n_head*hd]
                "q_norm": w(p + "attn_q_norm.weight"),       # [hd]
                "k_norm": w(p + "attn_k_norm.weight"),       # [hd]
                "ffn_norm": w(p + "ffn_norm.weight"),        # [d]
                "router": w(p + "ffn_gate_inp.weight"),      # [n_expert][d]
                "gate": w(p + "ffn_gate_exps.weight"),       # [n_expert][d_ff][d]
                "up": w(p + "ffn_up_exps.weight"),           # [n_expert][d_ff][d]
                "down": w(p + "ffn_down_exps.weight"),       # [n_expert][d][d_ff]
            })
        self.eos_ids = {int(g.get(k)) for k in ("tokenizer.ggml.eos_token_id",
                                                "tokenizer.ggml.eot_token_id")
                        if g.get(k) is not None}

    def new_cache(self):
        return KVCache(self.n_layer)

    def _attention(self, L, h, pos, cache, il):
        """Grouped-query causal self-attention of the batch; h: [T][d]."""
        T = h.shape[0]
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        q = (h @ L["wq"].T).reshape(T, nh, hd)
        k = (h @ L["wk"].T).reshape(T, nkv, hd)
        v = (h @ L["wv"].T).reshape(T, nkv, hd)
        q = rope_neox(rms_norm(q, L["q_norm"], self.eps), pos, self.rope_theta)
        k = rope_neox(rms_norm(k, L["k_norm"], self.eps), pos, self.rope_theta)
        K, V = cache.append(il, k, v)                       # [S][nkv][hd], S = n_past + T

        # Query head j reads kv head j // group, so group the q heads by kv head.
        group = nh // nkv
        qg = q.reshape(T, nkv, group, hd)
        scores = np.einsum("tkgd,skd->kgts", qg, K) / np.sqrt(hd)  # [nkv][group][T][S]
        S = K.shape[0]
        causal = np.arange(S)[None, :] > pos[:, None]              # [T][S]
        scores = np.where(causal, -np.inf, scores)
        out = np.einsum("kgts,skd->tkgd", softmax(scores, axis=-1), V)
        return out.reshape(T, nh * hd) @ L["wo"].T

    def _moe(self, L, h):
        """Routed SwiGLU experts; returns (out [T][d], experts [T][k], gap [T])."""
        T = h.shape[0]
        probs = softmax(h @ L["router"].T, axis=-1)                # [T][n_expert]
        # Stable sort: among equal probabilities the lower expert id wins.
        order = np.argsort(-probs, axis=-1, kind="stable")
        top = order[:, :self.n_used]                               # [T][k]
        w_top = np.take_along_axis(probs, top, axis=-1)
        w_top = w_top / np.sum(w_top, axis=-1, keepdims=True)      # renormalise to 1
        if self.n_used < self.n_expert:
            p_sorted = np.take_along_axis(probs, order, axis=-1)
            gap = p_sorted[:, self.n_used - 1] - p_sorted[:, self.n_used]
        else:
            gap = np.full(T, np.inf)

        out = np.zeros_like(h)
        for e in range(self.n_expert):
            rows, slot = np.nonzero(top == e)
            if rows.size == 0:
                continue
            x = h[rows]                                            # [n_rows][d]
            y = (silu(x @ L["gate"][e].T) * (x @ L["up"][e].T)) @ L["down"][e].T
            np.add.at(out, rows, y * w_top[rows, slot][:, None])
        return out, top, gap

    def forward(self, tokens, cache=None):
        """Runs tokens at positions cache.n_past.. and appends them to the cache.

        With cache=None a fresh cache is used (a one-shot prefill).
        Returns a ForwardResult for the new tokens.
        """
        if cache is None:
            cache = self.new_cache()
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        T = tokens.size
        if T == 0:
            return ForwardResult(np.zeros((0, self.n_vocab)),
                                 np.zeros((0, self.n_layer, self.n_used), dtype=np.int64),
                                 np.zeros((0, self.n_layer)))
        bad = tokens[(tokens < 0) | (tokens >= self.n_vocab)]
        if bad.size:
            raise ValueError("token id %d out of range 0..%d" % (bad[0], self.n_vocab - 1))

        pos = cache.n_past + np.arange(T)
        x = self.tok_embd[tokens].copy()                           # [T][d]
        experts = np.zeros((T, self.n_layer, self.n_used), dtype=np.int64)
        gaps = np.zeros((T, self.n_layer))
        for il, L in enumerate(self.layers):
            x = x + self._attention(L, rms_norm(x, L["attn_norm"], self.eps), pos, cache, il)
            moe_out, experts[:, il], gaps[:, il] = self._moe(L, rms_norm(x, L["ffn_norm"], self.eps))
            x = x + moe_out
        cache.n_past += T
        logits = rms_norm(x, self.output_norm, self.eps) @ self.output.T
        return ForwardResult(logits, experts, gaps)


def logits_all(model, tokens):
    """Logits [n][n_vocab] and experts [n][n_layer][k] of a one-shot prefill."""
    r = model.forward(tokens)
    return r.logits, r.experts


def greedy(model, tokens, n_new):
    """Greedy continuation: prefill, then decode one token at a time.

    Ties go to the lowest id (np.argmax).  Returns (ids [n_new], margins
    [n_new]) where margin is top-1 minus top-2 logit behind each choice.
    """
    cache = model.new_cache()
    last = model.forward(tokens, cache).logits[-1]
    ids, margins = [], []
    for i in range(n_new):
        tok = int(np.argmax(last))
        top2 = np.partition(last, -2)[-2:]
        ids.append(tok)
        margins.append(float(top2[1] - top2[0]))
        if i + 1 < n_new:
            last = model.forward([tok], cache).logits[-1]
    return ids, margins


def parse_tokens(text):
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise SystemExit("error: --tokens must be space-separated integers, got %r" % text)
    if not ids:
        raise SystemExit("error: --tokens is empty")
    return ids


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="qwen3moe GGUF file (F32/F16/BF16 weights)")
    ap.add_argument("--tokens", required=True, help='token ids, e.g. "1 2 3"')
    ap.add_argument("-o", "--output", help="write float32 LE logits here")
    ap.add_argument("--all", action="store_true", help="all positions, not just the last")
    ap.add_argument("--greedy", type=int, default=0, metavar="N",
                    help="also print N greedy token ids")
    args = ap.parse_args(argv)
    ids = parse_tokens(args.tokens)
    try:
        model = Qwen3MoE(args.model)
        logits = model.forward(ids).logits
    except (gguf.GGUFError, ValueError, OSError) as e:
        sys.exit("error: %s" % e)
    if args.output:
        rows = logits if args.all else logits[-1:]
        rows.astype("<f4").tofile(args.output)
    if args.greedy > 0:
        print(" ".join(str(t) for t in greedy(model, ids, args.greedy)[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
