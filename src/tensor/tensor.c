/* The ggml type table (block layouts from ggml's format; ids ggml removed are
 * left empty) and the scalar float conversions the kernels build on. Row
 * dequantisation is in dequant.c. */
#include "tensor.h"

#include "base/base.h"

#include <string.h>

static const nm_dtype_traits dtype_table[NM_DTYPE_COUNT] = {
    [NM_DTYPE_F32] = {"f32", 1, 4},
    [NM_DTYPE_F16] = {"f16", 1, 2},
    [NM_DTYPE_Q4_0] = {"q4_0", 32, 18},
    [NM_DTYPE_Q4_1] = {"q4_1", 32, 20},
    [NM_DTYPE_Q5_0] = {"q5_0", 32, 22},
    [NM_DTYPE_Q5_1] = {"q5_1", 32, 24},
    [NM_DTYPE_Q8_0] = {"q8_0", 32, 34},
    [NM_DTYPE_Q8_1] = {"q8_1", 32, 36},
    [NM_DTYPE_Q2_K] = {"q2_K", 256, 84},
    [NM_DTYPE_Q3_K] = {"q3_K", 256, 110},
    [NM_DTYPE_Q4_K] = {"q4_K", 256, 144},
    [NM_DTYPE_Q5_K] = {"q5_K", 256, 176},
    [NM_DTYPE_Q6_K] = {"q6_K", 256, 210},
    [NM_DTYPE_Q8_K] = {"q8_K", 256, 292},
    [NM_DTYPE_IQ2_XXS] = {"iq2_xxs", 256, 66},
    [NM_DTYPE_IQ2_XS] = {"iq2_xs", 256, 74},
    [NM_DTYPE_IQ3_XXS] = {"iq3_xxs", 256, 98},
    [NM_DTYPE_IQ1_S] = {"iq1_s", 256, 50},
    [NM_DTYPE_IQ4_NL] = {"iq4_nl", 32, 18},
    [NM_DTYPE_IQ3_S] = {"iq3_s", 256, 110},
    [NM_DTYPE_IQ2_S] = {"iq2_s", 256, 82},
    [NM_DTYPE_IQ4_XS] = {"iq4_xs", 256, 136},
    [NM_DTYPE_I8] = {"i8", 1, 1},
    [NM_DTYPE_I16] = {"i16", 1, 2},
    [NM_DTYPE_I32] = {"i32", 1, 4},
    [NM_DTYPE_I64] = {"i64", 1, 8},
    [NM_DTYPE_F64] = {"f64", 1, 8},
    [NM_DTYPE_IQ1_M] = {"iq1_m", 256, 56},
    [NM_DTYPE_BF16] = {"bf16", 1, 2},
    [NM_DTYPE_TQ1_0] = {"tq1_0", 256, 54},
    [NM_DTYPE_TQ2_0] = {"tq2_0", 256, 66},
    [NM_DTYPE_MXFP4] = {"mxfp4", 32, 17},
};

const nm_dtype_traits *nm_dtype_traits_of(uint32_t type_id) {
    if (type_id >= NM_DTYPE_COUNT || dtype_table[type_id].name == NULL) return NULL;
    return &dtype_table[type_id];
}

const char *nm_dtype_name(uint32_t type_id) {
    const nm_dtype_traits *t = nm_dtype_traits_of(type_id);
    return t ? t->name : "unknown";
}

bool nm_dtype_row_bytes(uint32_t type_id, int64_t n, size_t *out) {
    const nm_dtype_traits *t = nm_dtype_traits_of(type_id);
    if (!t || n < 0 || n % t->block_size != 0) return false;
    return nm_mul_size((size_t)(n / t->block_size), t->block_bytes, out);
}

bool nm_dtype_is_supported(uint32_t type_id) {
    switch (type_id) {
    case NM_DTYPE_F32:
    case NM_DTYPE_F16:
    case NM_DTYPE_BF16:
    case NM_DTYPE_Q8_0:
    case NM_DTYPE_Q4_0:
    case NM_DTYPE_Q4_K:
    case NM_DTYPE_Q5_K:
    case NM_DTYPE_Q6_K:
    case NM_DTYPE_MXFP4:
        return true;
    default:
        return false;
    }
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float nm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t nm_f32_to_f16(float f) {
    uint32_t x = float_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t exp = (x >> 23) & 0xff;
    uint32_t mant = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        /* subnormal half: shift the mantissa with its implicit bit */
        uint32_t m = mant | 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into exp: correct */
    return (uint16_t)(sign | half);
}

float nm_bf16_to_f32(uint16_t b) { return bits_float((uint32_t)b << 16); }

uint16_t nm_f32_to_bf16(float f) {
    uint32_t x = float_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
