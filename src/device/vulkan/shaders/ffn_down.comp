#version 450
// Phase 2 of the grouped expert FFN for one slot: y[r][j] = down_j . h_r.

layout(local_size_x_id = 1) in;

layout(std430, set = 0, binding = 1) readonly buffer Hid { float h[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float y[]; };

layout(push_constant) uniform Slot {
    uint down;      // byte offset of the slot's down matrix in w
    uint unused;
    uint row_bytes; // bytes of one weight row
    uint n;         // d_model: output columns
    uint k;         // d_ff: elements per weight row
    uint h0;        // float offset of the slot's first hidden row
    uint y0;        // float offset of its first output row
    uint rows;      // capacity
} pc;

uint act_base;
#define ACT(i) h[act_base + (i)]
#include "weights.glsl"

void main() {
    const uint j = gl_GlobalInvocationID.x, r = gl_GlobalInvocationID.y;
    if (j >= pc.n || r >= pc.rows) return;
    act_base = pc.h0 + r * pc.k;
    y[pc.y0 + r * pc.n + j] = dot_row(pc.down + j * pc.row_bytes, pc.k);
}
