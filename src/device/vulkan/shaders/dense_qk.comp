#version 450
// One row per invocation: the projections' biases, the q/k norms (per head
// or whole), RoPE at the row's position (NeoX or llama pairing, frequency
// factors, attention factor, as ggml's rope_ext), then the row's K and V
// into the layer's cache at that position.

layout(local_size_x = 64) in;

#include "dense.glsl"

layout(push_constant) uniform P {
    uint q0, k0, v0;    // act offsets of row 0's q, new k, new v
    uint bq, bk, bv;    // weights indices of the biases, or NONE
    uint qn, kn;        // weights indices of the q/k norms, or NONE
    uint n_head, n_head_kv, head_dim, n_rot;
    uint mode;          // bit 0: NeoX pairing; bits 1-2: q/k norm 0 none, 1 head, 2 whole;
                        // bit 3: K/V rounded to IEEE half (an F16 cache)
    float freq_base, attn_factor;
    uint factors;       // weights index of the frequency divisors, or NONE
    float eps;
    uint pos_at;        // act index of the launch's first position (as uint bits)
    uint rows;
    uint n_pos;         // positions of the cache: V starts at n_pos * kv_dim
} pc;

void rms(uint at, uint n, uint wn) {
    float sum = 0.0;
    for (uint i = 0; i < n; i++)
        sum += a[at + i] * a[at + i];
    const float scale = 1.0 / sqrt(sum / float(n) + pc.eps);
    for (uint i = 0; i < n; i++)
        a[at + i] = a[at + i] * scale * wf(wn + i);
}

void rope(uint at, uint n_head, uint pos) {
    const uint half_rot = pc.n_rot / 2u;
    const float theta_scale = pow(pc.freq_base, -2.0 / float(pc.n_rot));
    float theta = float(pos);
    for (uint i = 0; i < half_rot; i++) {
        const float t = pc.factors != NONE ? theta / wf(pc.factors + i) : theta;
        const float c = cos(t) * pc.attn_factor, s = sin(t) * pc.attn_factor;
        const uint ia = (pc.mode & 1u) != 0u ? i : 2u * i;
        const uint ib = (pc.mode & 1u) != 0u ? i + half_rot : 2u * i + 1u;
        for (uint h = 0; h < n_head; h++) {
            const uint v = at + h * pc.head_dim;
            const float x0 = a[v + ia], x1 = a[v + ib];
            a[v + ia] = x0 * c - x1 * s;
            a[v + ib] = x0 * s + x1 * c;
        }
        theta *= theta_scale;
    }
}

// The half of magnitude bits m with sign bits s (bit 15), as a float.
float half_at(uint m, uint s) { return unpackHalf2x16(m | s).x; }

// x rounded to the nearest IEEE half, ties to even, as the host rounds its
// F16 cache (nm_f32_to_f16): packHalf2x16's rounding is the
// implementation's, so its answer and its two neighbours are weighed.
float round_half(float x) {
    const uint h = packHalf2x16(vec2(x, 0.0)) & 0xffffu;
    const uint s = h & 0x8000u, m = h & 0x7fffu;
    if (m >= 0x7c00u) return unpackHalf2x16(h).x; // infinity, NaN
    uint best = m;
    float bd = abs(x - half_at(m, s));
    for (int j = 0; j < 2; j++) {
        const uint c = j == 0 ? m - 1u : m + 1u;
        if ((j == 0 && m == 0u) || (j == 1 && c >= 0x7c00u)) continue;
        const float dc = abs(x - half_at(c, s));
        if (dc < bd || (dc == bd && (c & 1u) == 0u)) {
            best = c;
            bd = dc;
        }
    }
    return half_at(best, s);
}

void main() {
    const uint t = gl_GlobalInvocationID.x;
    if (t >= pc.rows) return;
    const uint pos = floatBitsToUint(a[pc.pos_at]) + t;
    const uint hd = pc.head_dim, qd = pc.n_head * hd, kvd = pc.n_head_kv * hd;
    const uint q = pc.q0 + t * qd, k = pc.k0 + t * kvd, v = pc.v0 + t * kvd;
    for (uint i = 0; i < qd; i++)
        if (pc.bq != NONE) a[q + i] += wf(pc.bq + i);
    for (uint i = 0; i < kvd; i++) {
        if (pc.bk != NONE) a[k + i] += wf(pc.bk + i);
        if (pc.bv != NONE) a[v + i] += wf(pc.bv + i);
    }
    const uint qk = (pc.mode >> 1) & 3u;
    if (qk == 1u) {
        for (uint h = 0; h < pc.n_head; h++)
            rms(q + h * hd, hd, pc.qn);
        for (uint h = 0; h < pc.n_head_kv; h++)
            rms(k + h * hd, hd, pc.kn);
    } else if (qk == 2u) {
        rms(q, qd, pc.qn);
        rms(k, kvd, pc.kn);
    }
    rope(q, pc.n_head, pos);
    rope(k, pc.n_head_kv, pos);
    const bool f16 = (pc.mode & 8u) != 0u;
    for (uint i = 0; i < kvd; i++) {
        kv[pos * kvd + i] = f16 ? round_half(a[k + i]) : a[k + i];
        kv[(pc.n_pos + pos) * kvd + i] = f16 ? round_half(a[v + i]) : a[v + i];
    }
}
