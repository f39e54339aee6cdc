// What the shaders of the dense-part graph (graph kind 2) share: the
// graph's three buffers. w: the layer's weights and vectors (F32 vectors
// read by float index); a: every activation of the chunk, host visible,
// and the launch's first position; kv: the layer's K ([n_pos][kv_dim]),
// then V, in device memory. NONE marks an absent vector.

layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, set = 0, binding = 1) buffer Act { float a[]; };
layout(std430, set = 0, binding = 2) buffer KV { float kv[]; };

const uint NONE = 0xffffffffu;

float wf(uint i) { return uintBitsToFloat(w[i]); }
