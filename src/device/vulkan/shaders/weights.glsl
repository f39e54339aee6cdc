// Reading one row of a weight matrix in its own format (ggml's block
// layouts, see src/tensor/tensor.h) and taking its dot product with a row of
// activations, accumulated in FP32. Included by the FFN shaders; the weight
// type is the specialization constant TYPE (an nm_dtype value).

layout(constant_id = 0) const uint TYPE = 0;
layout(constant_id = 1) const uint WG = 64;

const uint T_F32 = 0;
const uint T_F16 = 1;
const uint T_Q8_0 = 8;
const uint T_Q4_K = 12;
const uint T_BF16 = 30;
const uint T_MXFP4 = 39;

// MXFP4's E2M1 values, doubled (nm_mxfp4_values)
const float MXFP4_VALUES[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                         0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);

layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };

uint byte_at(uint b) { return (w[b >> 2] >> ((b & 3u) * 8u)) & 0xffu; }
// b even: a 16-bit value never straddles two words
uint half_at(uint b) { return (w[b >> 2] >> ((b & 2u) * 8u)) & 0xffffu; }
float f16_at(uint b) { return unpackHalf2x16(half_at(b)).x; }
// 2^(e - 128), MXFP4's halved E8M0 scale, as nm_e8m0_half_to_f32 (a device
// that flushes denormals reads e < 2 as 0: scales below 2^-126 never occur
// in trained weights)
float e8m0_half(uint e) {
    return uintBitsToFloat(e >= 2u ? (e - 1u) << 23 : e == 1u ? 0x00400000u : 0x00200000u);
}

// For each of four activation rows, sum_i W[row][i] * act[i] for i < k;
// `base` is the weight row's first byte. ACT4(i), defined by the includer,
// gives element i of the four activation rows: each weight is decoded once
// for the four.
vec4 dot_row4(uint base, uint k) {
    vec4 sum = vec4(0.0);
    if (TYPE == T_F32) {
        const uint w0 = base >> 2;
        for (uint i = 0; i < k; i++)
            sum += uintBitsToFloat(w[w0 + i]) * ACT4(i);
    } else if (TYPE == T_F16) {
        for (uint i = 0; i < k; i++)
            sum += f16_at(base + 2u * i) * ACT4(i);
    } else if (TYPE == T_BF16) {
        for (uint i = 0; i < k; i++)
            sum += uintBitsToFloat(half_at(base + 2u * i) << 16) * ACT4(i);
    } else if (TYPE == T_Q8_0) {
        // blocks of 32: f16 d, 32 int8 codes (34 bytes, so 2-byte aligned)
        for (uint b = 0; b < k / 32u; b++) {
            const uint at = base + 34u * b;
            const float d = f16_at(at);
            vec4 s = vec4(0.0);
            for (uint l = 0; l < 32u; l++) {
                const int q = bitfieldExtract(int(byte_at(at + 2u + l)), 0, 8);
                s += float(q) * ACT4(32u * b + l);
            }
            sum += d * s;
        }
    } else if (TYPE == T_MXFP4) {
        // blocks of 32: an E8M0 scale byte, 16 bytes of two E2M1 nibbles
        // (element l low, l + 16 high; 17 bytes, so any alignment)
        for (uint b = 0; b < k / 32u; b++) {
            const uint at = base + 17u * b;
            vec4 s = vec4(0.0);
            for (uint l = 0; l < 16u; l++) {
                const uint q = byte_at(at + 1u + l);
                s += MXFP4_VALUES[q & 15u] * ACT4(32u * b + l);
                s += MXFP4_VALUES[q >> 4u] * ACT4(32u * b + 16u + l);
            }
            sum += e8m0_half(byte_at(at)) * s;
        }
    } else if (TYPE == T_Q4_K) {
        // super-blocks of 256: f16 d, f16 dmin, 12 packed scale bytes,
        // 128 code bytes (144 bytes, word aligned)
        for (uint b = 0; b < k / 256u; b++) {
            const uint w0 = (base >> 2) + 36u * b;
            const vec2 dm = unpackHalf2x16(w[w0]);
            const uint sc0 = w[w0 + 1u], sc1 = w[w0 + 2u], sc2 = w[w0 + 3u];
            for (uint p = 0; p < 4u; p++) {
                // scales and mins of sub-blocks 2p and 2p + 1 (nm_k4_scale_min)
                float scale[2], mn[2];
                for (uint h = 0; h < 2u; h++) {
                    const uint j = 2u * p + h;
                    uint sc, m;
                    if (j < 4u) {
                        sc = (sc0 >> (8u * j)) & 63u;
                        m = (sc1 >> (8u * j)) & 63u;
                    } else {
                        const uint lo = (sc2 >> (8u * (j - 4u))) & 0xffu;
                        sc = (lo & 15u) | (((sc0 >> (8u * (j - 4u))) >> 6u & 3u) << 4u);
                        m = (lo >> 4u) | (((sc1 >> (8u * (j - 4u))) >> 6u & 3u) << 4u);
                    }
                    scale[h] = dm.x * float(sc);
                    mn[h] = dm.y * float(m);
                }
                const uint e0 = 256u * b + 64u * p;
                vec4 s_lo = vec4(0.0), s_hi = vec4(0.0), a_lo = vec4(0.0), a_hi = vec4(0.0);
                for (uint l4 = 0; l4 < 8u; l4++) {
                    const uint q4 = w[w0 + 4u + 8u * p + l4];
                    for (uint c = 0; c < 4u; c++) {
                        const uint q = (q4 >> (8u * c)) & 0xffu;
                        const uint l = 4u * l4 + c;
                        const vec4 x_lo = ACT4(e0 + l), x_hi = ACT4(e0 + 32u + l);
                        s_lo += float(q & 15u) * x_lo;
                        s_hi += float(q >> 4u) * x_hi;
                        a_lo += x_lo;
                        a_hi += x_hi;
                    }
                }
                sum += scale[0] * s_lo - mn[0] * a_lo + scale[1] * s_hi - mn[1] * a_hi;
            }
        }
    }
    return sum;
}
