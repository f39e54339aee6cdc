/* Float rows to ggml's quantised block layouts (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)
 * by ggml's reference algorithms, so the bytes are those llama-quantize writes
 * without an importance matrix and llama.cpp reads them back to the same
 * values. Not here: dequantisation (dequant.c) and which tensor gets which
 * type (quant/). */
#include "tensor.h"

#include "base/base.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Byte compatibility needs ggml's operation order with every product rounded
 * on its own: no fused multiply-add. GCC does not contract in ISO C mode (the
 * build's -std=c11) and does not know this pragma; clang does. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum {
    SUPER = NM_QK_K, /* elements of a K-quant super-block   */
    SUB_K = 32,      /* elements per scale in Q4_K and Q5_K */
    SUB_Q6 = 16,     /* elements per scale in Q6_K          */
};

/* ggml treats a group whose largest magnitude is below this as all zero. */
#define ZERO_GROUP 1e-15f
#define HALF_MAX 65504.0f

/* Round half to even, as ggml's nearest_int does by adding 1.5 * 2^23 (exact
 * for |v| <= 2^22, the only range ggml calls it with). Out-of-range values
 * and NaN only occur for blocks whose scale is zero or rejected; they are
 * clamped here so the conversion is defined. */
static int round_even(float v) {
    if (!(v == v)) return 0;
    if (v > 4194303.f) return 4194303;
    if (v < -4194303.f) return -4194303;
    return (int)rintf(v);
}

static int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void put_half(uint8_t *dst, float v) {
    uint16_t h = nm_f32_to_f16(v);
    memcpy(dst, &h, 2);
}

static float get_half(const uint8_t *src) {
    uint16_t h;
    memcpy(&h, src, 2);
    return nm_f16_to_f32(h);
}

/* ---- Q8_0: x = d * q, q in [-127, 127] -------------------------------------- */

static void q8_0_block(const float *x, uint8_t *blk) {
    float amax = 0.0f;
    for (int i = 0; i < NM_Q8_0_BLOCK; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    /* the rounding uses the exact scale; the file holds it in half precision */
    const float d = amax / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(blk, d);
    int8_t *q = (int8_t *)(blk + 2);
    for (int i = 0; i < NM_Q8_0_BLOCK; i++) {
        float v = roundf(x[i] * inv);
        /* only a scale below 2^-128 (1/d infinite) can leave [-127, 127] */
        q[i] = (int8_t)(v != v ? 0.0f : fminf(127.0f, fmaxf(-127.0f, v)));
    }
}

/* ---- Q4_0: x = d * (q - 8), q in [0, 15] ------------------------------------ */

static void q4_0_block(const float *x, uint8_t *blk) {
    /* d is the signed value of largest magnitude over -8, so that value is
     * exactly level 0 and the other sign reaches at most level 15 (+7 d) */
    float amax = 0.0f, peak = 0.0f;
    for (int i = 0; i < NM_Q4_0_BLOCK; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            peak = x[i];
        }
    }
    const float d = peak / -8.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(blk, d);
    for (int i = 0; i < NM_Q4_0_BLOCK / 2; i++) {
        /* + 8.5 then truncation: round half up to a level, 16 clipped to 15 */
        float lo = x[i] * inv + 8.5f, hi = x[i + NM_Q4_0_BLOCK / 2] * inv + 8.5f;
        lo = lo >= 0.0f ? fminf(lo, 15.0f) : 0.0f;
        hi = hi >= 0.0f ? fminf(hi, 15.0f) : 0.0f;
        blk[2 + i] = (uint8_t)((int)lo | ((int)hi << 4));
    }
}

/* ---- K-quant helpers -------------------------------------------------------- */

/* Fits x[i] ~ scale * L[i] - min_out over levels L in [0, n_max] by weighted
 * least squares (ggml's make_qkx2_quants): start from the full range, then
 * try n_step + 1 stretched level spacings and keep the one of least weighted
 * squared error. Returns the scale; *min_out >= 0 is the offset to subtract. */
static float fit_scale_min(const float *x, const float *w, int n, int n_max, float r_min,
                           float r_delta, int n_step, uint8_t *L, float *min_out) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0; /* the offset only ever moves values up */
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *min_out = -lo;
        return 0.0f;
    }
    float inv = n_max / (hi - lo);
    float scale = 1 / inv;
    float best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clamp_int(round_even(inv * (x[i] - lo)), 0, n_max);
        float diff = scale * L[i] + lo - x[i];
        best += w[i] * (diff * diff);
    }
    uint8_t trial[SUB_K];
    for (int step = 0; step <= n_step; step++) {
        inv = (r_min + r_delta * step + n_max) / (hi - lo);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_int(round_even(inv * (x[i] - lo)), 0, n_max);
            trial[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float det = sum_w * sum_l2 - sum_l * sum_l;
        if (!(det > 0)) continue;
        float s = (sum_w * sum_xl - sum_x * sum_l) / det;
        float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (m > 0) { /* a positive offset is not representable: refit through 0 */
            m = 0;
            s = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = s * trial[i] + m - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best) {
            memcpy(L, trial, (size_t)n);
            best = err;
            scale = s;
            lo = m;
        }
    }
    *min_out = -lo;
    return scale;
}

/* Q4_K and Q5_K share everything but the level count and how levels are
 * packed: eight sub-blocks of 32, each with a 6-bit scale and a 6-bit min
 * relative to the super-block's half-precision d and dmin. Levels go to L. */
static void k_scales_mins(const float *x, int n_max, float r_min, int n_step, uint8_t *blk,
                          uint8_t *L) {
    float scales[SUPER / SUB_K], mins[SUPER / SUB_K], w[SUB_K];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < SUPER / SUB_K; j++) {
        const float *xs = x + SUB_K * j;
        float sum_x2 = 0;
        for (int i = 0; i < SUB_K; i++)
            sum_x2 += xs[i] * xs[i];
        const float rms = sqrtf(sum_x2 / SUB_K);
        for (int i = 0; i < SUB_K; i++)
            w[i] = rms + fabsf(xs[i]);
        scales[j] =
            fit_scale_min(xs, w, SUB_K, n_max, r_min, 0.1f, n_step, L + SUB_K * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[SUPER / SUB_K], lm[SUPER / SUB_K];
    uint8_t *packed = blk + 4; /* [12] */
    for (int j = 0; j < SUPER / SUB_K; j++) {
        /* the int to uint8_t conversion wraps as ggml's does (a negative
         * scale ends up at 63) */
        ls[j] = (uint8_t)round_even(inv_scale * scales[j]);
        lm[j] = (uint8_t)round_even(inv_min * mins[j]);
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    /* sub-blocks 0-3: 6 bits in bytes 0-3 (scale) and 4-7 (min); 4-7: the low
     * 4 bits in bytes 8-11, the top 2 bits in the spare bits of bytes 0-7 */
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        packed[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        packed[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    put_half(blk, max_scale / 63.f);
    put_half(blk + 2, max_min / 63.f);

    /* requantise each value against the scales as stored */
    const float d = get_half(blk), dmin = get_half(blk + 2);
    for (int j = 0; j < SUPER / SUB_K; j++) {
        const float dj = d * ls[j];
        if (!dj) continue; /* keep the fit's levels: they decode to -dm anyway */
        const float dm = dmin * lm[j];
        for (int i = 0; i < SUB_K; i++)
            L[SUB_K * j + i] =
                (uint8_t)clamp_int(round_even((x[SUB_K * j + i] + dm) / dj), 0, n_max);
    }
}

static void q4_k_block(const float *x, uint8_t *blk) {
    uint8_t L[SUPER];
    k_scales_mins(x, 15, -1.0f, 20, blk, L);
    /* each 32 bytes hold two sub-blocks: low nibbles the first, high the next */
    uint8_t *qs = blk + 16;
    for (int c = 0; c < SUPER; c += 64, qs += 32)
        for (int i = 0; i < 32; i++)
            qs[i] = (uint8_t)(L[c + i] | (L[c + 32 + i] << 4));
}

static void q5_k_block(const float *x, uint8_t *blk) {
    uint8_t L[SUPER];
    k_scales_mins(x, 31, -0.5f, 15, blk, L);
    /* low nibbles as in Q4_K; bit 4 of element c+i goes to qh[i], bit
     * (c / 32) for the first sub-block of the pair and the next one up */
    uint8_t *qh = blk + 16, *qs = blk + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < SUPER; c += 64, qs += 32) {
        const int bit = c / 32;
        for (int i = 0; i < 32; i++) {
            const int a = L[c + i], b = L[c + 32 + i];
            qh[i] |= (uint8_t)(((a >> 4) << bit) | ((b >> 4) << (bit + 1)));
            qs[i] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
        }
    }
}

/* Symmetric fit of x[i] ~ scale * (L[i] - n_max), levels L in [0, 2 n_max)
 * (ggml's make_qx_quants with x^2 weights): the scale that puts the largest
 * magnitude at -n_max, then 18 nearby spacings, keeping the best weighted
 * least-squares one. Returns the scale (0 for an all-zero group). */
static float fit_symmetric(const float *x, int n, int n_max, int8_t *L) {
    float amax = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            peak = x[i];
        }
    }
    if (amax < ZERO_GROUP) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float inv = -n_max / peak;
    float sum_lx = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_int(round_even(inv * x[i]), -n_max, n_max - 1);
        L[i] = (int8_t)(l + n_max);
        float w = x[i] * x[i];
        sum_lx += w * x[i] * l;
        sum_l2 += w * l * l;
    }
    float scale = sum_l2 ? sum_lx / sum_l2 : 0.0f;
    float best = scale * sum_lx;
    for (int step = -9; step <= 9; step++) {
        if (step == 0) continue;
        inv = -(n_max + 0.1f * step) / peak;
        sum_lx = sum_l2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_int(round_even(inv * x[i]), -n_max, n_max - 1);
            float w = x[i] * x[i];
            sum_lx += w * x[i] * l;
            sum_l2 += w * l * l;
        }
        /* compares sum_lx^2 / sum_l2 (the explained energy) without dividing */
        if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(n_max + clamp_int(round_even(inv * x[i]), -n_max, n_max - 1));
            scale = sum_lx / sum_l2;
            best = scale * sum_lx;
        }
    }
    return scale;
}

/* Q6_K: x = d * scale[j] * (q - 32), sixteen groups of 16 with int8 scales,
 * q in [0, 63] split into 4 low bits (ql) and 2 high bits (qh). */
static void q6_k_block(const float *x, uint8_t *blk) {
    int8_t L[SUPER];
    float scales[SUPER / SUB_Q6];
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < SUPER / SUB_Q6; j++) {
        scales[j] = fit_symmetric(x + SUB_Q6 * j, SUB_Q6, 32, L + SUB_Q6 * j);
        if (fabsf(scales[j]) > max_abs) {
            max_abs = fabsf(scales[j]);
            max_scale = scales[j];
        }
    }
    memset(blk, 0, NM_Q6_K_BYTES);
    if (max_abs < ZERO_GROUP) return; /* all zero: d = 0 */
    uint8_t *ql = blk, *qh = blk + 128;
    int8_t *sc = (int8_t *)(blk + 192);
    const float inv = -128.f / max_scale;
    put_half(blk + 208, 1 / inv);
    for (int j = 0; j < SUPER / SUB_Q6; j++) {
        int s = round_even(inv * scales[j]);
        sc[j] = (int8_t)(s < 127 ? s : 127);
    }
    const float d = get_half(blk + 208);
    for (int j = 0; j < SUPER / SUB_Q6; j++) {
        const float dj = d * sc[j];
        if (!dj) continue;
        for (int i = 0; i < SUB_Q6; i++)
            L[SUB_Q6 * j + i] =
                (int8_t)(clamp_int(round_even(x[SUB_Q6 * j + i] / dj), -32, 31) + 32);
    }
    /* per 128 elements: ql[0..63] low nibbles of elements 0-63 (high nibble:
     * elements 64-127), qh[0..31] the top 2 bits of elements i, i+32, i+64,
     * i+96 at bits 0, 2, 4, 6 */
    for (int c = 0; c < SUPER; c += 128, ql += 64, qh += 32) {
        for (int i = 0; i < 32; i++) {
            const int a = L[c + i], b = L[c + i + 32], e = L[c + i + 64], f = L[c + i + 96];
            ql[i] = (uint8_t)((a & 0xF) | ((e & 0xF) << 4));
            ql[i + 32] = (uint8_t)((b & 0xF) | ((f & 0xF) << 4));
            qh[i] = (uint8_t)((a >> 4) | ((b >> 4) << 2) | ((e >> 4) << 4) | ((f >> 4) << 6));
        }
    }
}

/* ---- float types: one element per block ------------------------------------ */

static void f32_block(const float *x, uint8_t *blk) { memcpy(blk, x, sizeof(float)); }

static void f16_block(const float *x, uint8_t *blk) {
    const uint16_t h = nm_f32_to_f16(*x);
    memcpy(blk, &h, 2);
}

static void bf16_block(const float *x, uint8_t *blk) {
    const uint16_t b = nm_f32_to_bf16(*x);
    memcpy(blk, &b, 2);
}

/* MXFP4 as ggml's reference rounds it: e = floor(log2 max|x|) - 2 + 127
 * (from frexp, exact everywhere), so the largest value lands in the top
 * binade of the doubled E2M1 values (8 or 12 times 2^(e - 128)); each value
 * the nearest of the 16, the first on ties; an all-zero block stays zero. */
static void mxfp4_block(const float *x, uint8_t *blk) {
    memset(blk, 0, NM_MXFP4_BYTES);
    float amax = 0.0f;
    for (int i = 0; i < NM_MXFP4_BLOCK; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    if (amax == 0.0f) return;
    int exp2;
    frexpf(amax, &exp2); /* amax in [2^(exp2 - 1), 2^exp2) */
    const int e = exp2 - 1 - 2 + 127;
    blk[0] = (uint8_t)(e < 0 ? 0 : e);
    const float d = nm_e8m0_half_to_f32(blk[0]);
    for (int i = 0; i < NM_MXFP4_BLOCK; i++) {
        int best = 0;
        for (int v = 1; v < 16; v++)
            if (fabsf(x[i] - d * nm_mxfp4_values[v]) < fabsf(x[i] - d * nm_mxfp4_values[best]))
                best = v;
        blk[1 + i % 16] |= (uint8_t)(i < 16 ? best : best << 4);
    }
}

/* ---- entry points ----------------------------------------------------------- */

typedef struct quant_kind {
    uint32_t block, bytes;
    /* Inputs past this magnitude cannot be held (the half-precision scale
     * would overflow) and would overflow float sums inside the fits. */
    float max_abs;
    void (*block_fn)(const float *x, uint8_t *blk);
    int n_halves; /* half-precision scales to check, at half_at[] */
    int half_at[2];
} quant_kind;

static const quant_kind kinds[NM_DTYPE_COUNT] = {
    [NM_DTYPE_Q8_0] = {NM_Q8_0_BLOCK, NM_Q8_0_BYTES, 127 * HALF_MAX, q8_0_block, 1, {0}},
    [NM_DTYPE_Q4_0] = {NM_Q4_0_BLOCK, NM_Q4_0_BYTES, 8 * HALF_MAX, q4_0_block, 1, {0}},
    [NM_DTYPE_Q4_K] = {SUPER, NM_Q4_K_BYTES, 15 * 63 * HALF_MAX, q4_k_block, 2, {0, 2}},
    [NM_DTYPE_Q5_K] = {SUPER, NM_Q5_K_BYTES, 31 * 63 * HALF_MAX, q5_k_block, 2, {0, 2}},
    [NM_DTYPE_Q6_K] = {SUPER, NM_Q6_K_BYTES, 32 * 128 * HALF_MAX, q6_k_block, 1, {208}},
    [NM_DTYPE_MXFP4] = {NM_MXFP4_BLOCK, NM_MXFP4_BYTES, FLT_MAX, mxfp4_block, 0, {0}},
    /* rounded to nearest even; F16 refuses what would round to infinity */
    [NM_DTYPE_F32] = {1, 4, FLT_MAX, f32_block, 0, {0}},
    [NM_DTYPE_F16] = {1, 2, HALF_MAX, f16_block, 0, {0}},
    [NM_DTYPE_BF16] = {1, 2, FLT_MAX, bf16_block, 0, {0}},
};

static const quant_kind *kind_of(uint32_t type) {
    return type < NM_DTYPE_COUNT && kinds[type].block_fn ? &kinds[type] : NULL;
}

bool nm_quantize_is_supported(uint32_t type_id) { return kind_of(type_id) != NULL; }

nm_status nm_quantize_row(nm_dtype type, const float *src, void *dst, int64_t n, nm_error *err) {
    const quant_kind *k = kind_of(type);
    NM_ASSERT(k != NULL && n >= 0 && n % k->block == 0);
    const nm_dtype_traits *t = nm_dtype_traits_of(type);
    NM_ASSERT(t && t->block_size == k->block && t->block_bytes == k->bytes);
    for (int64_t i = 0; i < n; i++) {
        const float v = src[i];
        if (isnan(v))
            return nm_errorf(err, NM_ERR_INVALID_ARG, "element %lld is NaN", (long long)i);
        if (isinf(v)) {
            return nm_errorf(err, NM_ERR_INVALID_ARG, "element %lld is %sinfinity", (long long)i,
                             v < 0 ? "-" : "+");
        }
        if (fabsf(v) > k->max_abs) {
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "element %lld (%g) is beyond the largest magnitude %s holds (%g)",
                             (long long)i, (double)v, t->name, (double)k->max_abs);
        }
    }
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / k->block; b++) {
        uint8_t *blk = out + (size_t)b * k->bytes;
        k->block_fn(src + b * k->block, blk);
        for (int h = 0; h < k->n_halves; h++) {
            if (!isfinite(get_half(blk + k->half_at[h]))) {
                return nm_errorf(err, NM_ERR_INVALID_ARG,
                                 "the values of elements %lld..%lld need a %s scale beyond "
                                 "half precision's %g",
                                 (long long)(b * k->block), (long long)((b + 1) * k->block - 1),
                                 t->name, (double)HALF_MAX);
            }
        }
    }
    return NM_OK;
}
