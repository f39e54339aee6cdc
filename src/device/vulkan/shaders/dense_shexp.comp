#version 450
// The shared expert's elementwise steps, one element per invocation
// (dense.c: its matmuls are dense_matmul.comp's). mode 0, SwiGLU into the
// gate's place: a[x0 + i] = silu(a[x0 + i]) * a[y0 + i]; mode 1, the output
// scaled by the sigmoid of its row's gate logit: a[x0 + i] *=
// sigmoid(a[y0 + i / k]); for i < n, sums in FP32.

layout(local_size_x = 64) in;

#include "dense.glsl"

layout(push_constant) uniform P {
    uint x0;   // act offset of the values changed in place
    uint y0;   // act offset of the up values (mode 0) or the logits (mode 1)
    uint n;    // elements
    uint k;    // mode 1: elements per row
    uint mode; // 0 SwiGLU, 1 sigmoid gate
} pc;

void main() {
    // a grid-stride loop: n may exceed what one dispatch's groups cover
    const uint stride = gl_NumWorkGroups.x * 64u;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        const float x = a[pc.x0 + i];
        if (pc.mode == 0u)
            a[pc.x0 + i] = x / (1.0 + exp(-x)) * a[pc.y0 + i];
        else
            a[pc.x0 + i] = x * (1.0 / (1.0 + exp(-a[pc.y0 + i / pc.k])));
    }
}
