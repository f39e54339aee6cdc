"""A Qwen3-MoE transformer in PyTorch with exactly the semantics of npumoe's
qwen3moe forward pass (and llama.cpp's), so that a trained model exported to
GGUF gives the same logits in the engine. Training-oriented: the experts run
as a loop over experts on gathered rows; this is not a fast inference path.

Weight shapes follow Hugging Face's Qwen3MoE (torch row-major); the GGUF
tensor of each has ggml ne = the reversed torch shape (export.py).
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass
class Config:
    n_vocab: int = 4096
    n_ctx: int = 256
    d_model: int = 256
    n_layer: int = 6
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 32
    n_expert_used: int = 4
    d_ff: int = 128  # expert hidden width
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6

    def to_dict(self):
        return asdict(self)


def rms_norm(x, weight, eps):
    # The engine keeps the mean of squares in double; float32 here differs
    # by rounding only.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(n_pos, head_dim, theta):
    """cos, sin of shape [n_pos][head_dim/2] for NeoX RoPE: dimension i is
    rotated with i + head_dim/2 at angle pos * theta^(-2i/head_dim)."""
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / head_dim)
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x: [B][T][H][D]; cos, sin: [T][D/2]. Rotates halves (NeoX)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        d, q, kv, E, ff = c.d_model, c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_expert, c.d_ff
        P = torch.nn.Parameter
        self.attn_norm = P(torch.ones(d))           # [d]
        self.wq = P(torch.empty(q, d))              # [n_head*head_dim][d]
        self.wk = P(torch.empty(kv, d))             # [n_head_kv*head_dim][d]
        self.wv = P(torch.empty(kv, d))             # [n_head_kv*head_dim][d]
        self.wo = P(torch.empty(d, q))              # [d][n_head*head_dim]
        self.q_norm = P(torch.ones(c.head_dim))     # [head_dim]
        self.k_norm = P(torch.ones(c.head_dim))     # [head_dim]
        self.ffn_norm = P(torch.ones(d))            # [d]
        self.router = P(torch.empty(E, d))          # [n_expert][d]
        self.gate = P(torch.empty(E, ff, d))        # [n_expert][d_ff][d]
        self.up = P(torch.empty(E, ff, d))          # [n_expert][d_ff][d]
        self.down = P(torch.empty(E, d, ff))        # [n_expert][d][d_ff]


class Model(torch.nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.tok_embd = torch.nn.Parameter(torch.empty(c.n_vocab, c.d_model))  # [n_vocab][d]
        self.layers = torch.nn.ModuleList([Layer(c) for _ in range(c.n_layer)])
        self.output_norm = torch.nn.Parameter(torch.ones(c.d_model))          # [d]
        self.output = torch.nn.Parameter(torch.empty(c.n_vocab, c.d_model))   # [n_vocab][d]
        cos, sin = rope_tables(c.n_ctx, c.head_dim, c.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, generator):
        """GPT-2 style: N(0, 0.02), residual outputs scaled by 1/sqrt(2 L)."""
        c = self.c
        std, out_std = 0.02, 0.02 / math.sqrt(2 * c.n_layer)

        def normal_(t, s):
            with torch.no_grad():
                t.copy_(torch.randn(t.shape, generator=generator) * s)

        normal_(self.tok_embd, std)
        normal_(self.output, std)
        for l in self.layers:
            for t in (l.wq, l.wk, l.wv, l.router, l.gate, l.up):
                normal_(t, std)
            normal_(l.wo, out_std)
            normal_(l.down, out_std)

    # ---- blocks --------------------------------------------------------------

    def attention(self, l, x, pos0=0):
        c = self.c
        B, T, _ = x.shape
        h = rms_norm(x, l.attn_norm, c.rms_eps)
        q = (h @ l.wq.t()).view(B, T, c.n_head, c.head_dim)
        k = (h @ l.wk.t()).view(B, T, c.n_head_kv, c.head_dim)
        v = (h @ l.wv.t()).view(B, T, c.n_head_kv, c.head_dim)
        q = rms_norm(q, l.q_norm, c.rms_eps)
        k = rms_norm(k, l.k_norm, c.rms_eps)
        cos, sin = self.rope_cos[pos0:pos0 + T], self.rope_sin[pos0:pos0 + T]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # GQA as ggml broadcasts it: query head h reads key/value head h // r.
        r = c.n_head // c.n_head_kv
        k = k.repeat_interleave(r, dim=2)
        v = v.repeat_interleave(r, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B][H][T][D]
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, c.n_head * c.head_dim)
        return x + o @ l.wo.t()

    def moe(self, l, x):
        """Returns (x + moe(x), stats) with stats = (counts [E], mean prob [E])."""
        c = self.c
        B, T, d = x.shape
        h = rms_norm(x, l.ffn_norm, c.rms_eps).reshape(B * T, d)
        probs = (h @ l.router.t()).softmax(-1)                        # [N][E]
        w, idx = probs.topk(c.n_expert_used, dim=-1)                  # [N][k]
        w = w / w.sum(-1, keepdim=True)
        flat = idx.reshape(-1)                                        # [N*k]
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=c.n_expert)           # [E]
        token = order // c.n_expert_used                              # token of each sorted slot
        weight = w.reshape(-1)[order]                                 # [N*k]
        # One gather, split into per-expert segments, and unbound weights:
        # their backward passes are one scatter, one cat and one stack,
        # where indexing per expert would build a zero tensor of the full
        # input for every expert.
        rows = h.index_select(0, token).split(counts.tolist())
        gate, up, down = l.gate.unbind(0), l.up.unbind(0), l.down.unbind(0)
        ys = []
        for e, r in enumerate(rows):
            if r.shape[0] == 0:
                ys.append(r)
                continue
            ys.append((F.silu(r @ gate[e].t()) * (r @ up[e].t())) @ down[e].t())
        y = torch.cat(ys) * weight[:, None]                           # [N*k][d]
        out = torch.zeros_like(h).index_add(0, token, y)
        return x + out.view(B, T, d), (counts, probs.mean(0))

    def forward(self, ids):
        """ids: [B][T] -> logits [B][T][n_vocab], list of per-layer routing stats."""
        x = self.tok_embd[ids]
        stats = []
        for l in self.layers:
            x = self.attention(l, x)
            x, s = self.moe(l, x)
            stats.append(s)
        x = rms_norm(x, self.output_norm, self.c.rms_eps)
        return x @ self.output.t(), stats


def load_balance_loss(stats, c: Config):
    """Switch Transformer / Mixtral auxiliary loss, averaged over layers:
    E * sum_e f_e P_e, f_e = share of top-k assignments to expert e, P_e =
    mean router probability of e. 1.0 at perfectly uniform routing."""
    total = 0.0
    for counts, mean_prob in stats:
        f = counts.float() / counts.sum()
        total = total + c.n_expert * (f * mean_prob).sum()
    return total / len(stats)


def param_count(c: Config):
    d, q, kv = c.d_model, c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    per_layer = 2 * d + 2 * c.head_dim + d * q + 2 * d * kv + q * d + c.n_expert * d \
        + 3 * c.n_expert * c.d_ff * d
    active = 2 * d + 2 * c.head_dim + d * q + 2 * d * kv + q * d + c.n_expert * d \
        + 3 * c.n_expert_used * c.d_ff * d
    total = 2 * c.n_vocab * d + d + c.n_layer * per_layer
    return total, 2 * c.n_vocab * d + d + c.n_layer * active
