#version 450
// Phase 1 of the grouped expert FFN for one slot: for each of its rows r and
// each d_ff column j, h[r][j] = silu(gate_j . x_r) * (up_j . x_r).
// Invocation (j, r); the whole graph is one command buffer of these and
// ffn_down.comp.

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

uint act_base;
#define ACT(i) x[act_base + (i)]
#include "weights.glsl"

void main() {
    const uint j = gl_GlobalInvocationID.x, r = gl_GlobalInvocationID.y;
    if (j >= pc.n || r >= pc.rows) return;
    act_base = pc.x0 + r * pc.k;
    const float g = dot_row(pc.gate + j * pc.row_bytes, pc.k);
    const float u = dot_row(pc.up + j * pc.row_bytes, pc.k);
    h[pc.h0 + r * pc.n + j] = g / (1.0 + exp(-g)) * u;
}
