#version 450
// One row per invocation: v = src (+ add + bias), written to xout when
// asked (the residual after attention), then dst = norm(v) * nw + nb by
// RMSNorm or LayerNorm (biased variance), sums in FP32.

layout(local_size_x = 64) in;

#include "dense.glsl"

layout(push_constant) uniform P {
    uint src;  // act offset of row 0's input
    uint add;  // act offset of row 0's addend, or NONE
    uint bias; // weights index of a vector added with it, or NONE
    uint xout; // act offset for src + add + bias, or NONE
    uint dst;  // act offset of row 0's output
    uint nw;   // weights index of the norm's weights
    uint nb;   // weights index of the norm's bias, or NONE
    uint n;    // elements per row
    uint rows;
    uint layer; // 1: LayerNorm, 0: RMSNorm
    float eps;
} pc;

float value(uint r, uint i) {
    float v = a[pc.src + r * pc.n + i];
    if (pc.add != NONE) v += a[pc.add + r * pc.n + i] + (pc.bias != NONE ? wf(pc.bias + i) : 0.0);
    return v;
}

void main() {
    const uint r = gl_GlobalInvocationID.x;
    if (r >= pc.rows) return;
    if (pc.xout != NONE)
        for (uint i = 0; i < pc.n; i++)
            a[pc.xout + r * pc.n + i] = value(r, i);
    const uint s = pc.xout != NONE ? pc.xout : pc.src;
    float mean = 0.0;
    if (pc.layer != 0u) {
        float sum = 0.0;
        for (uint i = 0; i < pc.n; i++)
            sum += (pc.xout != NONE ? a[s + r * pc.n + i] : value(r, i));
        mean = sum / float(pc.n);
    }
    float sum2 = 0.0;
    for (uint i = 0; i < pc.n; i++) {
        const float v = (pc.xout != NONE ? a[s + r * pc.n + i] : value(r, i)) - mean;
        sum2 += v * v;
    }
    const float scale = 1.0 / sqrt(sum2 / float(pc.n) + pc.eps);
    for (uint i = 0; i < pc.n; i++) {
        const float v = (pc.xout != NONE ? a[s + r * pc.n + i] : value(r, i)) - mean;
        a[pc.dst + r * pc.n + i] =
            v * scale * wf(pc.nw + i) + (pc.nb != NONE ? wf(pc.nb + i) : 0.0);
    }
}
