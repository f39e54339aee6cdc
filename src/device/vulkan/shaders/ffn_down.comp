#version 450
// Phase 2 of the grouped expert FFN for one slot: y[r][j] = down_j . h_r
// (+ db_j when the weights have a down bias).
// Invocation (j, t) computes column j of rows 4t..4t+3 (those that exist).

layout(local_size_x_id = 1) in;

layout(std430, set = 0, binding = 1) readonly buffer Hid { float h[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float y[]; };

const uint NONE = 0xffffffffu;

layout(push_constant) uniform Slot {
    uint down;      // byte offset of the slot's down matrix in w
    uint bias;      // byte offset in w of its bias (F32 [d_model]), or NONE
    uint row_bytes; // bytes of one weight row
    uint n;         // d_model: output columns
    uint k;         // d_ff: elements per weight row
    uint h0;        // float offset of the slot's first hidden row
    uint y0;        // float offset of its first output row
    uint rows;      // capacity
} pc;

uvec4 act; // the first element of each of the four activation rows
#define ACT4(i) vec4(h[act.x + (i)], h[act.y + (i)], h[act.z + (i)], h[act.w + (i)])
#include "weights.glsl"

void main() {
    const uint j = gl_GlobalInvocationID.x, r0 = 4u * gl_GlobalInvocationID.y;
    if (j >= pc.n || r0 >= pc.rows) return;
    const uvec4 r = min(uvec4(r0, r0 + 1u, r0 + 2u, r0 + 3u), uvec4(pc.rows - 1u));
    act = pc.h0 + r * pc.k;
    vec4 v = dot_row4(pc.down + j * pc.row_bytes, pc.k);
    if (pc.bias != NONE) v += uintBitsToFloat(w[(pc.bias >> 2) + j]);
    for (uint i = 0; i < 4u && r0 + i < pc.rows; i++)
        y[pc.y0 + (r0 + i) * pc.n + j] = v[i];
}
