/* Scalar row dequantisation of every type npumoe computes with: the
 * reference the SIMD kernels must equal bit for bit. Each value is rounded
 * as ggml's to_float rounds it (the scale products first, then times q),
 * so the tests can compare with llama.cpp's dequantised rows exactly. */
#include "tensor.h"

#include "base/base.h"

#include <string.h>

static float load_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return nm_f16_to_f32(h);
}

static void q8_0_block(const uint8_t *blk, float *dst) {
    const float d = load_f16(blk);
    const int8_t *q = (const int8_t *)(blk + 2);
    for (int i = 0; i < NM_Q8_0_BLOCK; i++)
        dst[i] = d * (float)q[i];
}

static void q4_0_block(const uint8_t *blk, float *dst) {
    const float d = load_f16(blk);
    const uint8_t *qs = blk + 2;
    for (int i = 0; i < NM_Q4_0_BLOCK / 2; i++)
        dst[i] = (float)((qs[i] & 0x0f) - 8) * d;
    for (int i = 0; i < NM_Q4_0_BLOCK / 2; i++)
        dst[i + NM_Q4_0_BLOCK / 2] = (float)((qs[i] >> 4) - 8) * d;
}

const int8_t nm_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void mxfp4_block(const uint8_t *blk, float *dst) {
    const float d = nm_e8m0_half_to_f32(blk[0]);
    const uint8_t *qs = blk + 1;
    for (int i = 0; i < NM_MXFP4_BLOCK / 2; i++) {
        dst[i] = d * (float)nm_mxfp4_values[qs[i] & 0x0f];
        dst[i + NM_MXFP4_BLOCK / 2] = d * (float)nm_mxfp4_values[qs[i] >> 4];
    }
}

/* Q4_K and Q5_K share everything but the fifth bit; qh is NULL for Q4_K. */
static void q45_k_block(const uint8_t *blk, const uint8_t *qh, const uint8_t *qs, float *dst) {
    const float d = load_f16(blk), dmin = load_f16(blk + 2);
    const uint8_t *scales = blk + 4;
    for (int s = 0; s < 8; s++) {
        uint8_t sc, mn;
        nm_k4_scale_min(s, scales, &sc, &mn);
        const float ds = d * (float)sc, ms = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        const int shift = 4 * (s & 1);
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0x0f;
            if (qh && (qh[l] >> s) & 1) v += 16;
            dst[32 * s + l] = ds * (float)v - ms;
        }
    }
}

static void q6_k_block(const uint8_t *blk, float *dst) {
    const float d = load_f16(blk + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(blk + 192) + 8 * h;
        for (int g = 0; g < 4; g++) {
            /* 16 values share a scale */
            for (int l0 = 0; l0 < 32; l0 += 16) {
                const float ds = d * (float)sc[2 * g + l0 / 16];
                float *out = dst + 128 * h + 32 * g + l0;
                for (int l = l0; l < l0 + 16; l++) {
                    const int lo = (ql[l + 32 * (g & 1)] >> (4 * (g >> 1))) & 0x0f;
                    const int hi = (qh[l] >> (2 * g)) & 3;
                    out[l - l0] = ds * (float)((lo | hi << 4) - 32);
                }
            }
        }
    }
}

void nm_dequantize_row(nm_dtype type, const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    switch (type) {
    case NM_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case NM_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = load_f16(p + 2 * i);
        return;
    case NM_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t b;
            memcpy(&b, p + 2 * i, 2);
            dst[i] = nm_bf16_to_f32(b);
        }
        return;
    case NM_DTYPE_Q8_0:
        NM_ASSERT(n % NM_Q8_0_BLOCK == 0);
        for (int64_t b = 0; b < n / NM_Q8_0_BLOCK; b++)
            q8_0_block(p + b * NM_Q8_0_BYTES, dst + b * NM_Q8_0_BLOCK);
        return;
    case NM_DTYPE_Q4_0:
        NM_ASSERT(n % NM_Q4_0_BLOCK == 0);
        for (int64_t b = 0; b < n / NM_Q4_0_BLOCK; b++)
            q4_0_block(p + b * NM_Q4_0_BYTES, dst + b * NM_Q4_0_BLOCK);
        return;
    case NM_DTYPE_MXFP4:
        NM_ASSERT(n % NM_MXFP4_BLOCK == 0);
        for (int64_t b = 0; b < n / NM_MXFP4_BLOCK; b++)
            mxfp4_block(p + b * NM_MXFP4_BYTES, dst + b * NM_MXFP4_BLOCK);
        return;
    case NM_DTYPE_Q4_K:
        NM_ASSERT(n % NM_QK_K == 0);
        for (int64_t b = 0; b < n / NM_QK_K; b++) {
            const uint8_t *blk = p + b * NM_Q4_K_BYTES;
            q45_k_block(blk, NULL, blk + 4 + NM_K_SCALES_BYTES, dst + b * NM_QK_K);
        }
        return;
    case NM_DTYPE_Q5_K:
        NM_ASSERT(n % NM_QK_K == 0);
        for (int64_t b = 0; b < n / NM_QK_K; b++) {
            const uint8_t *blk = p + b * NM_Q5_K_BYTES;
            const uint8_t *qh = blk + 4 + NM_K_SCALES_BYTES;
            q45_k_block(blk, qh, qh + NM_QK_K / 8, dst + b * NM_QK_K);
        }
        return;
    case NM_DTYPE_Q6_K:
        NM_ASSERT(n % NM_QK_K == 0);
        for (int64_t b = 0; b < n / NM_QK_K; b++)
            q6_k_block(p + b * NM_Q6_K_BYTES, dst + b * NM_QK_K);
        return;
    default:
        NM_ASSERT(!"nm_dequantize_row: unsupported type");
    }
}
