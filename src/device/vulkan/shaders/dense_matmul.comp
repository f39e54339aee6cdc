#version 450
// y[r][j] = W_j . x_r for the rows of a chunk, x and y in the activation
// buffer, W in the weights buffer in its own format (weights.glsl).
// Invocation (j, t) computes column j of rows 4t..4t+3 (those that exist).

layout(local_size_x_id = 1) in;

layout(std430, set = 0, binding = 1) buffer Act { float a[]; };

layout(push_constant) uniform P {
    uint w0;        // byte offset of the matrix in w
    uint row_bytes; // bytes of one weight row
    uint n;         // output columns
    uint k;         // elements per weight row and per input row
    uint x0;        // act offset of the first input row
    uint y0;        // act offset of the first output row ([rows][n])
    uint rows;
} pc;

uvec4 act; // the first element of each of the four input rows
#define ACT4(i) vec4(a[act.x + (i)], a[act.y + (i)], a[act.z + (i)], a[act.w + (i)])
#include "weights.glsl"

void main() {
    const uint j = gl_GlobalInvocationID.x, r0 = 4u * gl_GlobalInvocationID.y;
    if (j >= pc.n || r0 >= pc.rows) return;
    const uvec4 r = min(uvec4(r0, r0 + 1u, r0 + 2u, r0 + 3u), uvec4(pc.rows - 1u));
    act = pc.x0 + r * pc.k;
    const vec4 y = dot_row4(pc.w0 + j * pc.row_bytes, pc.k);
    for (uint i = 0; i < 4u && r0 + i < pc.rows; i++)
        a[pc.y0 + (r0 + i) * pc.n + j] = y[i];
}
