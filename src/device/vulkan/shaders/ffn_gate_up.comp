#version 450
// Phase 1 of the grouped expert FFN for one slot: for each of its rows r and
// each d_ff column j, h[r][j] = act(gate_j . x_r + gb_j, up_j . x_r + ub_j),
// act SwiGLU, silu(g) * u, or gpt-oss's clamped SwiGLU (nm_swiglu_oai_forward),
// the biases absent unless the weights have them.
// Invocation (j, t) computes column j of rows 4t..4t+3 (those that exist);
// the whole graph is one command buffer of these and ffn_down.comp.

layout(local_size_x_id = 1) in;

layout(std430, set = 0, binding = 1) readonly buffer In { float x[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Hid { float h[]; };

const uint NONE = 0xffffffffu;
const uint GLU_SWIGLU = 0;
const uint GLU_SWIGLU_OAI = 1;

layout(push_constant) uniform Slot {
    uint gate;      // byte offset of the slot's gate matrix in w
    uint up;        // byte offset of its up matrix
    uint row_bytes; // bytes of one weight row
    uint n;         // d_ff: output columns
    uint k;         // d_model: elements per weight row
    uint x0;        // float offset of the slot's first input row
    uint h0;        // float offset of its first hidden row
    uint rows;      // capacity
    uint gate_b;    // byte offset in w of the gate bias (F32 [d_ff]), or NONE
    uint up_b;      // byte offset in w of the up bias (F32 [d_ff]), or NONE
    uint glu;       // GLU_SWIGLU or GLU_SWIGLU_OAI (an nm_glu)
    float alpha;    // GLU_SWIGLU_OAI's alpha and limit
    float limit;
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
    vec4 g = dot_row4(pc.gate + j * pc.row_bytes, pc.k);
    vec4 u = dot_row4(pc.up + j * pc.row_bytes, pc.k);
    // the biases first, as the host (nm_expert_glu_forward) adds them
    if (pc.gate_b != NONE) g += uintBitsToFloat(w[(pc.gate_b >> 2) + j]);
    if (pc.up_b != NONE) u += uintBitsToFloat(w[(pc.up_b >> 2) + j]);
    vec4 y;
    if (pc.glu == GLU_SWIGLU_OAI) {
        const vec4 gc = min(g, vec4(pc.limit));
        const vec4 uc = clamp(u, vec4(-pc.limit), vec4(pc.limit));
        y = gc / (1.0 + exp(pc.alpha * -gc)) * (uc + 1.0);
    } else {
        y = g / (1.0 + exp(-g)) * u;
    }
    for (uint i = 0; i < 4u && r0 + i < pc.rows; i++)
        h[pc.h0 + (r0 + i) * pc.n + j] = y[i];
}
