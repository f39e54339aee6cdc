/* AVX-512 kernels: a register-tiled matmul (up to 4 activation rows x 4
 * weight rows per tile, the weight panel reused across a block of rows that
 * stays in L2) with weights widened to float in registers, quantised ones
 * (Q4_0, K-quants) dequantised with SIMD a block at a time (attention:
 * x86/attention.c). Compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512dq -mfma -mf16c; only called when CPUID reports them. */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* RT_MAX x CT_MAX accumulators + RT_MAX activation vectors + 1 weight vector
 * fit the 32 registers. Measured on this machine (bench/kernels.c, BF16
 * 64 x 768 x 2048): 4 x 4 ran at ~100 GFLOP/s, 8 x 2 at ~17 (gcc 12 did not
 * keep its 16 accumulators in registers). */
enum { RT_MAX = 4, CT_MAX = 4, L2_ROW_BLOCK_BYTES = 512 * 1024, PANEL_ELEMS = 16 * 1024 };
/* A single activation row (decode): F32, F16, BF16 and Q8_0 weight rows are
 * read one after another, a single linear stream through the matrix that the
 * hardware prefetcher follows, while the out-of-order core overlaps the
 * accumulator chains of consecutive rows. Measured on this machine (128
 * distinct 2048 x 768 BF16 matrices, one core): 24 GB/s, against 9-12 GB/s
 * for GEMV_CT interleaved rows, whose 1.5 KiB streams are too short for the
 * prefetcher; Q8_0 9.3 against 5.6. The block-quantised types, whose
 * dequantisation dominates, keep GEMV_CT rows in flight (2-3x faster than
 * one row for them). */
enum { GEMV_CT = 8 };

/* 16 weights of one row from element kk (kk % 16 == 0) as floats; lanes at
 * or past the row's end are 0 (mask). Q8_0 rows are whole blocks, so their
 * mask is always full. */
ALWAYS_INLINE __m512 load_w16(uint32_t type, const uint8_t *row, int64_t kk, __mmask16 mask,
                              int full) {
    switch (type) {
    case NM_DTYPE_F32:
        return full ? _mm512_loadu_ps((const float *)row + kk)
                    : _mm512_maskz_loadu_ps(mask, (const float *)row + kk);
    case NM_DTYPE_F16: {
        __m256i h = full ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + kk))
                         : _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + kk);
        return _mm512_cvtph_ps(h);
    }
    case NM_DTYPE_BF16: {
        __m256i b = full ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + kk))
                         : _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + kk);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    default: { /* Q8_0 */
        const uint8_t *blk = row + (size_t)(kk / NM_Q8_0_BLOCK) * NM_Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, blk, 2);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + kk % NM_Q8_0_BLOCK));
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
    }
}

/* acc[r][c] += x[r][kk] * w[c][kk] for kk in [k0, k1), a multiple of 16
 * apart, one 16-lane FMA per 16 elements in k order. */
ALWAYS_INLINE void fma_span(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                            const uint8_t *w, size_t row_bytes, int64_t k0, int64_t k1,
                            __m512 acc[RT_MAX][GEMV_CT]) {
    for (int64_t kk = k0; kk < k1; kk += 16) {
        __m512 xv[RT_MAX];
        for (int r = 0; r < rt; r++)
            xv[r] = _mm512_loadu_ps(x + r * ldx + kk);
        for (int c = 0; c < ct; c++) {
            const __m512 wv = load_w16(type, w + (size_t)c * row_bytes, kk, 0xffff, 1);
            for (int r = 0; r < rt; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
}

/* y[r][c] = x[r] . w[c] for r < rt, c < ct. Each output is one 16-lane
 * accumulator (lane l sums k = l mod 16 with FMA, the tail masked) reduced
 * by _mm512_reduce_add_ps: the same operations for every tile shape. */
ALWAYS_INLINE void tile(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                        const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    __m512 acc[RT_MAX][GEMV_CT];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm512_setzero_ps();
    const int64_t kk = k / 16 * 16;
    fma_span(type, rt, ct, x, ldx, w, row_bytes, 0, kk, acc);
    if (kk < k) {
        const __mmask16 mask = (__mmask16)((1u << (k - kk)) - 1);
        __m512 xv[RT_MAX];
        for (int r = 0; r < rt; r++)
            xv[r] = _mm512_maskz_loadu_ps(mask, x + r * ldx + kk);
        for (int c = 0; c < ct; c++) {
            const __m512 wv = load_w16(type, w + (size_t)c * row_bytes, kk, mask, 0);
            for (int r = 0; r < rt; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
}

/* ---- quantised weights (Q4_0, Q4_K, Q5_K, Q6_K) ----
 * A weight row is dequantised QCHUNK elements at a time (one K-quant
 * super-block, eight Q4_0 blocks) into an L1 buffer, with the values of
 * nm_dequantize_row bit for bit: every float is rounded as ggml's to_float
 * rounds it. The 4- and 5-bit types look their values up in a table of the
 * 16 or 32 values a sub-block can take, built with the same float
 * operations (vpermps reads only an index's low 4 or 5 bits). */
enum { QCHUNK = NM_QUANT_CHUNK };

ALWAYS_INLINE float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

ALWAYS_INLINE __m512i bytes16(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

ALWAYS_INLINE __m512 iota16(int from) {
    return _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_ps((float)from));
}

/* 32 values: (q - 8) * d */
ALWAYS_INLINE void dequant_q4_0(const uint8_t *blk, float *dst) {
    const __m512 table = _mm512_mul_ps(iota16(-8), _mm512_set1_ps(half_at(blk)));
    const __m512i q = bytes16(blk + 2);
    _mm512_storeu_ps(dst, _mm512_permutexvar_ps(q, table));
    _mm512_storeu_ps(dst + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table));
}

/* The eight sub-block scales d * sc and mins dmin * mn of a Q4_K/Q5_K
 * block. The 6-bit fields of the 12 packed bytes (nm_k4_scale_min) are
 * unpacked four at a time in 32-bit words: bytes 0-3 hold sc 0-3 and the
 * top bits of sc 4-7, bytes 4-7 mn 0-3 and the top bits of mn 4-7, bytes
 * 8-11 the low nibbles of sc 4-7 (low) and mn 4-7 (high). */
ALWAYS_INLINE void k4_scales(const uint8_t *blk, float *ds, float *ms) {
    uint32_t a[3];
    memcpy(a, blk + 4, sizeof a);
    const uint32_t low6 = 0x3f3f3f3fu, nib = 0x0f0f0f0fu, top2 = 0x30303030u;
    const uint64_t sc = (uint64_t)(a[0] & low6) | (uint64_t)((a[2] & nib) | ((a[0] >> 2) & top2))
                                                      << 32;
    const uint64_t mn =
        (uint64_t)(a[1] & low6) | (uint64_t)(((a[2] >> 4) & nib) | ((a[1] >> 2) & top2)) << 32;
    const __m256 d = _mm256_set1_ps(half_at(blk)), dmin = _mm256_set1_ps(half_at(blk + 2));
    const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    _mm256_storeu_ps(ds, _mm256_mul_ps(d, scf));
    _mm256_storeu_ps(ms, _mm256_mul_ps(dmin, mnf));
}

/* 256 values: (d * sc) * q - dmin * mn, q a nibble of qs */
ALWAYS_INLINE void dequant_q4_k(const uint8_t *blk, float *dst) {
    float ds[8], ms[8];
    k4_scales(blk, ds, ms);
    const uint8_t *qs = blk + 4 + NM_K_SCALES_BYTES;
    const __m512 iota = iota16(0);
    for (int p = 0; p < 4; p++) {
        const __m512 lo = _mm512_sub_ps(_mm512_mul_ps(iota, _mm512_set1_ps(ds[2 * p])),
                                        _mm512_set1_ps(ms[2 * p]));
        const __m512 hi = _mm512_sub_ps(_mm512_mul_ps(iota, _mm512_set1_ps(ds[2 * p + 1])),
                                        _mm512_set1_ps(ms[2 * p + 1]));
        const __m512i q0 = bytes16(qs + 32 * p), q1 = bytes16(qs + 32 * p + 16);
        float *o = dst + 64 * p;
        _mm512_storeu_ps(o, _mm512_permutexvar_ps(q0, lo));
        _mm512_storeu_ps(o + 16, _mm512_permutexvar_ps(q1, lo));
        _mm512_storeu_ps(o + 32, _mm512_permutexvar_ps(_mm512_srli_epi32(q0, 4), hi));
        _mm512_storeu_ps(o + 48, _mm512_permutexvar_ps(_mm512_srli_epi32(q1, 4), hi));
    }
}

/* 256 values: (d * sc) * (q + 16 h) - dmin * mn, h bit s of qh[l]: the
 * index into the sub-block's 32 values takes its low 4 bits from the nibble
 * and bit 4 from qh shifted into place (vpermt2ps reads bits 0-4 only). */
ALWAYS_INLINE void dequant_q5_k(const uint8_t *blk, float *dst) {
    float ds[8], ms[8];
    k4_scales(blk, ds, ms);
    const uint8_t *qh = blk + 4 + NM_K_SCALES_BYTES, *qs = qh + NM_QK_K / 8;
    const __m512i h[2] = {bytes16(qh), bytes16(qh + 16)};
    const __m512i low4 = _mm512_set1_epi32(15);
    const __m512 iota_lo = iota16(0), iota_hi = iota16(16);
    for (int s = 0; s < 8; s++) {
        const __m512 dsv = _mm512_set1_ps(ds[s]), msv = _mm512_set1_ps(ms[s]);
        const __m512 t_lo = _mm512_sub_ps(_mm512_mul_ps(iota_lo, dsv), msv);
        const __m512 t_hi = _mm512_sub_ps(_mm512_mul_ps(iota_hi, dsv), msv);
        /* bit s of qh to bit 4 */
        const __m512i up = _mm512_set1_epi32(s < 4 ? 4 - s : 0),
                      down = _mm512_set1_epi32(s > 4 ? s - 4 : 0);
        const __m128i shift = _mm_cvtsi32_si128(4 * (s & 1));
        for (int v = 0; v < 2; v++) {
            const __m512i nib = _mm512_srl_epi32(bytes16(qs + 32 * (s / 2) + 16 * v), shift);
            const __m512i hb = _mm512_srlv_epi32(_mm512_sllv_epi32(h[v], up), down);
            /* (nib & low4) | (hb & ~low4) */
            const __m512i q = _mm512_ternarylogic_epi32(nib, hb, low4, 0xe4);
            _mm512_storeu_ps(dst + 32 * s + 16 * v, _mm512_permutex2var_ps(t_lo, q, t_hi));
        }
    }
}

/* 256 values: (d * sc) * (q - 32), q six bits from ql and qh. Per half of
 * 128 values the codes are built as bytes, 64 at a time: the low nibbles
 * of ql[0..63] are values 0..63 of the half in order and its high nibbles
 * values 64..127; bit pairs 0, 1, 2, 3 of qh[l] go above values l, 32 + l,
 * 64 + l, 96 + l, moved to bits 4-5 by 16-bit shifts (the bits a shift
 * carries in from the neighbouring byte are masked off). */
ALWAYS_INLINE void dequant_q6_k(const uint8_t *blk, float *dst) {
    const __m512 d = _mm512_set1_ps(half_at(blk + 208));
    float ds[16];
    _mm512_storeu_ps(ds, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                              _mm_loadu_si128((const __m128i *)(blk + 192))))));
    const __m512i nib = _mm512_set1_epi8(0x0f), top2 = _mm512_set1_epi8(0x30),
                  bias = _mm512_set1_epi8(32);
    /* left shifts by 4 then 2 for values 0..63; right by 0 then 2 for 64..127 */
    const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    int8_t q[128] __attribute__((aligned(64))); /* [128] codes minus 32 of one half */
    for (int half = 0; half < 2; half++) {
        const __m512i ql = _mm512_loadu_si512(blk + 64 * half);
        const __m512i qh =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * half)));
        const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, nib),
                                            _mm512_and_si512(_mm512_sllv_epi16(qh, up), top2));
        const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nib),
                                            _mm512_and_si512(_mm512_srlv_epi16(qh, down), top2));
        _mm512_store_si512(q, _mm512_sub_epi8(q01, bias));
        _mm512_store_si512(q + 64, _mm512_sub_epi8(q23, bias));
        for (int v = 0; v < 8; v++) {
            const __m512 qf = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(q + 16 * v))));
            _mm512_storeu_ps(dst + 128 * half + 16 * v,
                             _mm512_mul_ps(_mm512_set1_ps(ds[8 * half + v]), qf));
        }
    }
}

/* One MXFP4 block: the nibbles index a table of the 16 values as floats
 * (vpermps), times the block's power of two: d * (float)v, as the scalar
 * code rounds it (exactly: a small integer times a power of two). */
ALWAYS_INLINE void dequant_mxfp4(const uint8_t *blk, float *dst) {
    const __m512 values =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)nm_mxfp4_values)));
    const __m512 d = _mm512_set1_ps(nm_e8m0_half_to_f32(blk[0]));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 1)));
    const __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(0x0f)), hi = _mm512_srli_epi32(q, 4);
    _mm512_storeu_ps(dst, _mm512_mul_ps(d, _mm512_permutexvar_ps(lo, values)));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, _mm512_permutexvar_ps(hi, values)));
}

/* n (<= QCHUNK, whole blocks) values of a quantised row from src. */
ALWAYS_INLINE void dequant_chunk(uint32_t type, const uint8_t *src, float *dst, int64_t n) {
    switch (type) {
    case NM_DTYPE_MXFP4:
        for (int64_t b = 0; b < n / NM_MXFP4_BLOCK; b++)
            dequant_mxfp4(src + b * NM_MXFP4_BYTES, dst + b * NM_MXFP4_BLOCK);
        return;
    case NM_DTYPE_Q4_0:
        for (int64_t b = 0; b < n / NM_Q4_0_BLOCK; b++)
            dequant_q4_0(src + b * NM_Q4_0_BYTES, dst + b * NM_Q4_0_BLOCK);
        return;
    case NM_DTYPE_Q4_K:
        dequant_q4_k(src, dst);
        return;
    case NM_DTYPE_Q5_K:
        dequant_q5_k(src, dst);
        return;
    default: /* Q6_K */
        dequant_q6_k(src, dst);
        return;
    }
}

ALWAYS_INLINE void dequant_row(uint32_t type, const uint8_t *row, float *dst, int64_t k) {
    for (int64_t k0 = 0; k0 < k; k0 += QCHUNK)
        dequant_chunk(type, row + (size_t)(k0 / QCHUNK) * nm_quant_chunk_bytes(type), dst + k0,
                      k - k0 < QCHUNK ? k - k0 : QCHUNK);
}

void nm_dequantize_avx512_row(uint32_t type, const void *src, float *dst, int64_t n) {
    switch (type) {
    case NM_DTYPE_Q4_0:
        NM_ASSERT(n % NM_Q4_0_BLOCK == 0);
        dequant_row(NM_DTYPE_Q4_0, src, dst, n);
        return;
    case NM_DTYPE_MXFP4:
        NM_ASSERT(n % NM_MXFP4_BLOCK == 0);
        dequant_row(NM_DTYPE_MXFP4, src, dst, n);
        return;
    case NM_DTYPE_Q4_K:
        NM_ASSERT(n % NM_QK_K == 0);
        dequant_row(NM_DTYPE_Q4_K, src, dst, n);
        return;
    case NM_DTYPE_Q5_K:
        NM_ASSERT(n % NM_QK_K == 0);
        dequant_row(NM_DTYPE_Q5_K, src, dst, n);
        return;
    case NM_DTYPE_Q6_K:
        NM_ASSERT(n % NM_QK_K == 0);
        dequant_row(NM_DTYPE_Q6_K, src, dst, n);
        return;
    default:
        nm_dequantize_row((nm_dtype)type, src, dst, n);
    }
}

/* tile() for quantised weights: each QCHUNK of the ct weight rows is
 * dequantised into wb, then multiplied as tile() multiplies F32 rows (k is
 * a multiple of 32: no tail), so an output has the same bits whether its
 * weights came through here or through a panel. */
ALWAYS_INLINE void qtile(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                         const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    __m512 acc[RT_MAX][GEMV_CT];
    float wb[GEMV_CT][QCHUNK] __attribute__((aligned(64))); /* [ct][QCHUNK] */
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm512_setzero_ps();
    const size_t cb = nm_quant_chunk_bytes(type);
    for (int64_t k0 = 0; k0 < k; k0 += QCHUNK) {
        const int64_t nk = k - k0 < QCHUNK ? k - k0 : QCHUNK;
        for (int c = 0; c < ct; c++)
            dequant_chunk(type, w + (size_t)c * row_bytes + (size_t)(k0 / QCHUNK) * cb, wb[c], nk);
        fma_span(NM_DTYPE_F32, rt, ct, x + k0, ldx, (const uint8_t *)wb, sizeof wb[0], 0, nk, acc);
    }
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
}

/* One row tile over one slab [0, nk) of a panel of dequantised rows (row
 * stride ldp): the accumulators start at zero (first) or from save, and
 * end reduced into y (last) or back in save ([RT_MAX][CT_MAX] of them,
 * column c at save[r * CT_MAX + c]). */
ALWAYS_INLINE void slab_tile(int rt, int ct, const float *x, int64_t ldx, const float *panel,
                             int64_t ldp, int64_t nk, __m512 *save, int first, int last, float *y,
                             int64_t ldy) {
    __m512 acc[RT_MAX][GEMV_CT];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = first ? _mm512_setzero_ps() : save[r * CT_MAX + c];
    fma_span(NM_DTYPE_F32, rt, ct, x, ldx, (const uint8_t *)panel, (size_t)ldp * sizeof(float), 0,
             nk, acc);
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++) {
            if (last)
                y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
            else
                save[r * CT_MAX + c] = acc[r][c];
        }
}

ALWAYS_INLINE void slab_tile_rt(int rt, int ct, const float *x, int64_t ldx, const float *panel,
                                int64_t ldp, int64_t nk, __m512 *save, int first, int last,
                                float *y, int64_t ldy) {
    switch (rt) {
    case 4:
        slab_tile(4, ct, x, ldx, panel, ldp, nk, save, first, last, y, ldy);
        return;
    case 3:
        slab_tile(3, ct, x, ldx, panel, ldp, nk, save, first, last, y, ldy);
        return;
    case 2:
        slab_tile(2, ct, x, ldx, panel, ldp, nk, save, first, last, y, ldy);
        return;
    default:
        slab_tile(1, ct, x, ldx, panel, ldp, nk, save, first, last, y, ldy);
        return;
    }
}

/* Quantised weights with more than one row tile: CT_MAX rows are
 * dequantised into a panel (64 KiB on the stack) that every row tile of an
 * L2 block of activation rows reads as F32. Rows longer than the panel
 * holds go in slabs of SLAB elements, the accumulators of the block's row
 * tiles kept between slabs, so the FMA sequence of an output is the one
 * qtile() and tile() make. */
enum { SLAB = PANEL_ELEMS / CT_MAX, SAVE_TILES = 8 };
ALWAYS_INLINE void matmul_quant_panel(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                                      int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1,
                                      int64_t rb) {
    const int64_t k = w->k, ldp = k < SLAB ? k : SLAB;
    /* a block of rb rows has at most SAVE_TILES row tiles when k > SLAB */
    NM_ASSERT(k <= SLAB || rb <= SAVE_TILES * RT_MAX);
    float panel[PANEL_ELEMS] __attribute__((aligned(64))); /* [CT_MAX][ldp] */
    __m512 save[SAVE_TILES][RT_MAX * CT_MAX];              /* accumulators between slabs */
    const uint8_t *base = w->data;
    const size_t cb = nm_quant_chunk_bytes(type);
    for (int64_t i0 = 0; i0 < m; i0 += rb) {
        const int64_t i1 = i0 + rb < m ? i0 + rb : m;
        for (int64_t j = j0; j < j1; j += CT_MAX) {
            const int ct = (int)(j1 - j < CT_MAX ? j1 - j : CT_MAX);
            for (int64_t ks = 0; ks < k; ks += SLAB) {
                const int64_t nk = k - ks < SLAB ? k - ks : SLAB;
                const int first = ks == 0, last = ks + nk == k;
                for (int c = 0; c < ct; c++)
                    dequant_row(type, base + (size_t)(j + c) * w->row_bytes + ks / QCHUNK * cb,
                                panel + c * ldp, nk);
                for (int64_t i = i0; i < i1; i += RT_MAX) {
                    const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
                    __m512 *sv = save[k <= SLAB ? 0 : (i - i0) / RT_MAX];
                    if (ct == CT_MAX) {
                        slab_tile_rt(rt, CT_MAX, x + i * ldx + ks, ldx, panel, ldp, nk, sv, first,
                                     last, y + i * ldy + j, ldy);
                    } else {
                        for (int c = 0; c < ct; c++)
                            slab_tile_rt(rt, 1, x + i * ldx + ks, ldx, panel + c * ldp, ldp, nk,
                                         sv + c, first, last, y + i * ldy + j + c, ldy);
                    }
                }
            }
        }
    }
}

/* Quantised types go through qtile(), the others through tile(). */
ALWAYS_INLINE void tile_any(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                            const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    if (nm_kernels_is_block_quant(type))
        qtile(type, rt, ct, x, ldx, w, row_bytes, k, y, ldy);
    else
        tile(type, rt, ct, x, ldx, w, row_bytes, k, y, ldy);
}

/* Tile shapes with constant bounds, so acc[][] lives in registers. */
ALWAYS_INLINE void tile_rt(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                           const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    switch (rt) {
    case 4:
        tile_any(type, 4, ct, x, ldx, w, row_bytes, k, y, ldy);
        return;
    case 3:
        tile_any(type, 3, ct, x, ldx, w, row_bytes, k, y, ldy);
        return;
    case 2:
        tile_any(type, 2, ct, x, ldx, w, row_bytes, k, y, ldy);
        return;
    default:
        tile_any(type, 1, ct, x, ldx, w, row_bytes, k, y, ldy);
        return;
    }
}

ALWAYS_INLINE void tile_rows(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                             const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    if (ct == CT_MAX) {
        tile_rt(type, rt, CT_MAX, x, ldx, w, row_bytes, k, y, ldy);
        return;
    }
    for (int c = 0; c < ct; c++)
        tile_rt(type, rt, 1, x, ldx, w + (size_t)c * row_bytes, row_bytes, k, y + c, ldy);
}

/* One weight row of k elements widened to float (k rounded up to 16 with
 * zeros). */
ALWAYS_INLINE void widen_row(uint32_t type, const uint8_t *row, int64_t k, float *dst) {
    int64_t kk = 0;
    for (; kk + 16 <= k; kk += 16)
        _mm512_storeu_ps(dst + kk, load_w16(type, row, kk, 0xffff, 1));
    if (kk < k)
        _mm512_storeu_ps(dst + kk, load_w16(type, row, kk, (__mmask16)((1u << (k - kk)) - 1), 0));
}

ALWAYS_INLINE void matmul_type(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                               int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    /* activation rows that stay in L2 while the weight panels pass over them */
    int64_t rb = L2_ROW_BLOCK_BYTES / (k * (int64_t)sizeof(float)) / RT_MAX * RT_MAX;
    if (rb < RT_MAX) rb = RT_MAX;
    const uint8_t *base = w->data;
    if (m == 1) {
        int64_t j = j0;
        if (!nm_kernels_is_block_quant(type))
            for (; j < j1; j++) /* one linear stream (see GEMV_CT) */
                tile(type, 1, 1, x, ldx, base + (size_t)j * w->row_bytes, w->row_bytes, k, y + j,
                     ldy);
        for (; j + GEMV_CT <= j1; j += GEMV_CT)
            tile_any(type, 1, GEMV_CT, x, ldx, base + (size_t)j * w->row_bytes, w->row_bytes, k,
                     y + j, ldy);
        for (; j < j1; j++)
            tile_any(type, 1, 1, x, ldx, base + (size_t)j * w->row_bytes, w->row_bytes, k, y + j,
                     ldy);
        return;
    }
    if (nm_kernels_is_block_quant(type) && m > RT_MAX) {
        matmul_quant_panel(type, w, x, ldx, m, y, ldy, j0, j1, rb);
        return;
    }
    /* With more than one row tile, a panel of CT_MAX weight rows is widened
     * to float once into a stack buffer (at most 64 KiB) and read as F32 by
     * every row tile: the same values, converted once instead of per tile. */
    const int64_t ldp = (k + 15) / 16 * 16;
    if (type != NM_DTYPE_F32 && m > RT_MAX && ldp * CT_MAX <= PANEL_ELEMS) {
        float panel[PANEL_ELEMS]; /* [CT_MAX][ldp] weight rows as float */
        for (int64_t i0 = 0; i0 < m; i0 += rb) {
            const int64_t i1 = i0 + rb < m ? i0 + rb : m;
            for (int64_t j = j0; j < j1; j += CT_MAX) {
                const int ct = (int)(j1 - j < CT_MAX ? j1 - j : CT_MAX);
                for (int c = 0; c < ct; c++)
                    widen_row(type, base + (size_t)(j + c) * w->row_bytes, k, panel + c * ldp);
                const uint8_t *pw = (const uint8_t *)panel;
                const size_t prb = (size_t)ldp * sizeof(float);
                for (int64_t i = i0; i < i1; i += RT_MAX) {
                    const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
                    tile_rows(NM_DTYPE_F32, rt, ct, x + i * ldx, ldx, pw, prb, k, y + i * ldy + j,
                              ldy);
                }
            }
        }
        return;
    }
    for (int64_t i0 = 0; i0 < m; i0 += rb) {
        const int64_t i1 = i0 + rb < m ? i0 + rb : m;
        for (int64_t j = j0; j < j1; j += CT_MAX) {
            const int ct = (int)(j1 - j < CT_MAX ? j1 - j : CT_MAX);
            const uint8_t *wj = base + (size_t)j * w->row_bytes;
            for (int64_t i = i0; i < i1; i += RT_MAX) {
                const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
                tile_rows(type, rt, ct, x + i * ldx, ldx, wj, w->row_bytes, k, y + i * ldy + j,
                          ldy);
            }
        }
    }
}

void nm_matmul_avx512_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                              int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
#define MATMUL(T) matmul_type(T, w, x, ldx, m, y, ldy, j0, j1)
    NM_KERNELS_FOR_EACH_TYPE(w, MATMUL);
#undef MATMUL
}
#else
typedef int nm_avx512_unused; /* an empty translation unit is not ISO C */
#endif
