#version 450
// Causal grouped-query attention: invocation (t, h) is query head h of row
// t over the cache's positions 0 .. pos + t; query head h reads kv head
// h / (n_head / n_head_kv). One pass with a running maximum (online
// softmax), so no scores are stored; head_dim <= MAX_HEAD_DIM. Rows are the
// workgroup's lanes (a CPU driver runs them as SIMD lanes).

layout(local_size_x = 64) in;

#include "dense.glsl"

const uint MAX_HEAD_DIM = 256;

layout(push_constant) uniform P {
    uint q0;   // act offset of row 0's q ([rows][n_head][head_dim])
    uint att0; // act offset of row 0's output, same shape
    uint n_pos, n_head, n_head_kv, head_dim;
    float scale;
    uint pos_at; // act index of the launch's first position (as uint bits)
    uint rows;
} pc;

void main() {
    const uint t = gl_GlobalInvocationID.x, h = gl_GlobalInvocationID.y;
    if (t >= pc.rows || h >= pc.n_head) return;
    const uint n_kv = floatBitsToUint(a[pc.pos_at]) + t + 1u;
    const uint hd = pc.head_dim, kvd = pc.n_head_kv * hd;
    const uint kvh = h / (pc.n_head / pc.n_head_kv);
    const uint q = pc.q0 + (t * pc.n_head + h) * hd;
    float acc[MAX_HEAD_DIM];
    for (uint d = 0; d < hd; d++)
        acc[d] = 0.0;
    float mx = -1.0 / 0.0, sum = 0.0;
    for (uint j = 0; j < n_kv; j++) {
        const uint kj = j * kvd + kvh * hd, vj = (pc.n_pos + j) * kvd + kvh * hd;
        float s = 0.0;
        for (uint d = 0; d < hd; d++)
            s += a[q + d] * kv[kj + d];
        s *= pc.scale;
        // rescale what came before when the maximum grows
        const float m = max(mx, s), r = exp(mx - m), e = exp(s - m);
        sum = sum * r + e;
        for (uint d = 0; d < hd; d++)
            acc[d] = acc[d] * r + e * kv[vj + d];
        mx = m;
    }
    const uint o = pc.att0 + (t * pc.n_head + h) * hd;
    for (uint d = 0; d < hd; d++)
        a[o + d] = acc[d] / sum;
}
