#version 450
// Phase 1 of the grouped expert FFN for one slot: for each of its rows r and
// each d_ff column j, h[r][j] = silu(gate_j . x_r) * (up_j . x_r).
// Invocation (j, t) computes column j of rows 4t..4t+3 (those that exist);
// the whole graph is one command buffer of these and ffn_down.comp.

layout(local_size_x_id = 1) in;

layout(std430, set = 0, binding = 1) readonly buffer In { float x[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Hid { float h[]; };

layout(push_constant) uniform Slot {
    uint gate;      // byte offset of the slot's gate matrix in w
    uint up;        // byte offset of its up matrix
    uint row_bytes; // bytes of one weight row
    uint n;         // d_ff: output columns
    uint k;         // d_model: elements per weight row
    uint x0;        // float offset of the slot's first input row
    uint h0;        // float offset of its first hidden row
    uint rows;      // capacity
} pc;

uvec4 act; // the first element of each of the four activation rows
#define ACT4(i) vec4(x[act.x + (i)], x[act.y + (i)], x[act.z + (i)], x[act.w + (i)])
#include "weights.glsl"

void main() {
    const uint j = gl_GlobalInvocationID.x, r0 = 4u * gl_GlobalInvocationID.y;
    if (j >= pc.n || r0 >= pc.rows) return;
    // rows past the slot's last repeat it; their sums are not stored
    const uvec4 r = min(uvec4(r0, r0 + 1u, r0 + 2u, r0 + 3u), uvec4(pc.rows - 1u));
    act = pc.x0 + r * pc.k;
    const vec4 g = dot_row4(pc.gate + j * pc.row_bytes, pc.k);
    const vec4 u = dot_row4(pc.up + j * pc.row_bytes, pc.k);
    const vec4 y = g / (1.0 + exp(-g)) * u;
    for (uint i = 0; i < 4u && r0 + i < pc.rows; i++)
        h[pc.h0 + (r0 + i) * pc.n + j] = y[i];
}
