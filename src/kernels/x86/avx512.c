/* AVX-512 kernels: a register-tiled matmul (up to 4 activation rows x 4
 * weight rows per tile, the weight panel reused across a block of rows that
 * stays in L2) with weights widened to float in registers, quantised ones
 * (Q4_0, K-quants) dequantised with SIMD a block at a time (attention:
 * x86/attention.c). Compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512dq -mfma -mf16c; only called when CPUID reports them. */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"
#include "sums16.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* RT_MAX x CT_MAX accumulators + RT_MAX activation vectors + 1 weight vector
 * fit the 32 registers. Measured (bench/kernels.c) when this was written,
 * BF16 64 x 768 x 2048: 4 x 4 ran at ~100 GFLOP/s, 8 x 2 at ~17 (gcc 12 did
 * not keep its 16 accumulators in registers); later, on a Xeon (Emerald
 * Rapids, docs/PERFORMANCE.md), 4 x 6 took 0.81-0.83 the time of 4 x 4 on
 * BF16 512 x 2048 x 768 and 0.89-0.91 on 32-row expert shapes: an
 * activation vector, read from L2 as the row tiles pass over a panel, feeds
 * six FMAs instead of four. */
enum { RT_MAX = 4, CT_MAX = 6, L2_ROW_BLOCK_BYTES = 512 * 1024 };
/* A single activation row (decode): F32, F16, BF16 and Q8_0 weight rows are
 * read GEMV_ROWS at a time, one accumulator chain each, and the next
 * GEMV_ROWS rows (contiguous) are prefetched into L2 meanwhile: a single
 * ascending stream through the matrix. One row at a time (what this did
 * before) was bound by its single chain: on a Xeon (Emerald Rapids, one
 * core; 5 alternated runs, median ratio and ratio of the fastest) four
 * rows with the prefetch took 0.51 / 0.60 the time on a BF16 output head
 * (151936 x 2048), 0.47-0.67 / 0.60-0.64 on 128 distinct BF16 expert
 * matrices (768 x 2048, 2048 x 768), 0.54-0.60 on Q8_0 and F16 ones; of
 * which the prefetch 0.55-0.88 of four rows without it (the least on the
 * short rows of 1.5 KiB, which the hardware prefetcher follows late). The
 * block-quantised types, whose dequantisation dominates, keep GEMV_CT rows
 * in flight (2-3x faster than one row for them). */
enum { GEMV_CT = 8, GEMV_ROWS = 4 };

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
 * apart, one 16-lane FMA per 16 elements in k order; pf (or NULL): pf_step
 * bytes from pf prefetched into L2 per 16 elements. */
ALWAYS_INLINE void fma_span(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                            const uint8_t *w, size_t row_bytes, int64_t k0, int64_t k1,
                            __m512 acc[RT_MAX][GEMV_CT], const uint8_t *pf, int64_t pf_step) {
    for (int64_t kk = k0; kk < k1; kk += 16) {
        if (pf)
            for (int64_t b = 0; b < pf_step; b += 64)
                _mm_prefetch((const char *)pf + (kk - k0) / 16 * pf_step + b, _MM_HINT_T1);
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

/* y[r * ldy + c] = the sum of acc[r][c]'s lanes (nm_sum16's order) for an
 * rt x ct tile, four columns at a time. */
ALWAYS_INLINE void store_sums(int rt, int ct, __m512 acc[RT_MAX][GEMV_CT], float *y, int64_t ldy) {
    for (int c = 0; c < ct; c += 4)
        nm_store_sums4x4(rt, ct - c < 4 ? ct - c : 4, &acc[0][c], GEMV_CT, y + c, ldy);
}

/* y[r][c] = x[r] . w[c] for r < rt, c < ct. Each output is one 16-lane
 * accumulator (lane l sums k = l mod 16 with FMA, the tail masked) reduced
 * in nm_sum16's order: the same operations for every tile shape. */
ALWAYS_INLINE void tile(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                        const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy,
                        const uint8_t *pf, int64_t pf_step) {
    __m512 acc[RT_MAX][GEMV_CT];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm512_setzero_ps();
    const int64_t kk = k / 16 * 16;
    fma_span(type, rt, ct, x, ldx, w, row_bytes, 0, kk, acc, pf, pf_step);
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
    store_sums(rt, ct, acc, y, ldy);
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
        fma_span(NM_DTYPE_F32, rt, ct, x + k0, ldx, (const uint8_t *)wb, sizeof wb[0], 0, nk, acc,
                 NULL, 0);
    }
    store_sums(rt, ct, acc, y, ldy);
}

/* One row tile over one slab [0, nk) of a panel of widened or dequantised
 * rows (row stride ldp, zeros from nk to the next multiple of 16): the
 * accumulators start at zero (first) or from save, and end reduced into y
 * (last) or back in save ([RT_MAX][CT_MAX] of them, column c at
 * save[r * CT_MAX + c]). A tail of fewer than 16 elements takes the masked
 * FMA of tile(). */
ALWAYS_INLINE void slab_tile(int rt, int ct, const float *x, int64_t ldx, const float *panel,
                             int64_t ldp, int64_t nk, __m512 *save, int first, int last, float *y,
                             int64_t ldy) {
    __m512 acc[RT_MAX][GEMV_CT];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = first ? _mm512_setzero_ps() : save[r * CT_MAX + c];
    const int64_t nk16 = nk / 16 * 16;
    fma_span(NM_DTYPE_F32, rt, ct, x, ldx, (const uint8_t *)panel, (size_t)ldp * sizeof(float), 0,
             nk16, acc, NULL, 0);
    if (nk16 < nk) {
        const __mmask16 mask = (__mmask16)((1u << (nk - nk16)) - 1);
        __m512 xv[RT_MAX];
        for (int r = 0; r < rt; r++)
            xv[r] = _mm512_maskz_loadu_ps(mask, x + r * ldx + nk16);
        for (int c = 0; c < ct; c++) {
            const __m512 wv = _mm512_loadu_ps(panel + c * ldp + nk16);
            for (int r = 0; r < rt; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    if (last) {
        store_sums(rt, ct, acc, y, ldy);
        return;
    }
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            save[r * CT_MAX + c] = acc[r][c];
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

/* One weight row of k elements widened to float (k rounded up to 16 with
 * zeros). */
ALWAYS_INLINE void widen_row(uint32_t type, const uint8_t *row, int64_t k, float *dst) {
    int64_t kk = 0;
    for (; kk + 16 <= k; kk += 16)
        _mm512_storeu_ps(dst + kk, load_w16(type, row, kk, 0xffff, 1));
    if (kk < k)
        _mm512_storeu_ps(dst + kk, load_w16(type, row, kk, (__mmask16)((1u << (k - kk)) - 1), 0));
}

/* Share t of n (t < n) of the cache lines of n_rows rows of `bytes` bytes
 * each from p (stride row_bytes), prefetched into L2. */
ALWAYS_INLINE void prefetch_share(const uint8_t *p, size_t row_bytes, int n_rows, int64_t bytes,
                                  int64_t t, int64_t n) {
    for (int r = 0; r < n_rows; r++) {
        const uintptr_t at = (uintptr_t)(p + (size_t)r * row_bytes);
        const int64_t lines = ((int64_t)(at & 63) + bytes + 63) / 64;
        for (int64_t l = t * lines / n; l < (t + 1) * lines / n; l++)
            _mm_prefetch((const char *)(at & ~(uintptr_t)63) + 64 * l, _MM_HINT_T1);
    }
}

/* Widened (F16, BF16, Q8_0) and block-quantised weights with more than one
 * row tile: CT_MAX rows are widened or dequantised into a panel of SLAB
 * elements each (on the stack) that every row tile of an L2 block of
 * activation rows reads as F32; longer rows go in slabs, the accumulators
 * of the block's row tiles kept between slabs, so the FMA sequence of an
 * output is the one qtile() and tile() make. A panel of 1024 (24 KiB) and a
 * row tile's activations over it (16 KiB) stay in L1 together; BF16 panels
 * of whole rows of 2048, as before, took 1.06 / 1.20 the time (512 x 2048 x
 * 768 / 32-row experts, Emerald Rapids, 4 x 4 tiles). The next slab's
 * weights are prefetched while the row tiles run. */
enum { SLAB = 1024, SAVE_TILES = 16 };
ALWAYS_INLINE void matmul_panel(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                                int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1,
                                int64_t rb) {
    const int64_t k = w->k, ldp = k < SLAB ? (k + 15) / 16 * 16 : SLAB;
    /* a block has at most SAVE_TILES row tiles when k > SLAB */
    if (k > SLAB && rb > SAVE_TILES * RT_MAX) rb = SAVE_TILES * RT_MAX;
    float panel[CT_MAX * SLAB] __attribute__((aligned(64))); /* [CT_MAX][ldp] */
    __m512 save[SAVE_TILES][RT_MAX * CT_MAX];                /* accumulators between slabs */
    const uint8_t *base = w->data;
    const bool quant = nm_kernels_is_block_quant(type);
    const nm_dtype_traits *tr = nm_dtype_traits_of(type);
    for (int64_t i0 = 0; i0 < m; i0 += rb) {
        const int64_t i1 = i0 + rb < m ? i0 + rb : m;
        for (int64_t j = j0; j < j1; j += CT_MAX) {
            const int ct = (int)(j1 - j < CT_MAX ? j1 - j : CT_MAX);
            for (int64_t ks = 0; ks < k; ks += SLAB) {
                const int64_t nk = k - ks < SLAB ? k - ks : SLAB;
                const int first = ks == 0, last = ks + nk == k;
                for (int c = 0; c < ct; c++) {
                    const uint8_t *row = base + (size_t)(j + c) * w->row_bytes +
                                         (size_t)(ks / tr->block_size) * tr->block_bytes;
                    if (quant)
                        dequant_row(type, row, panel + c * ldp, nk);
                    else
                        widen_row(type, row, nk, panel + c * ldp);
                }
                /* the next slab's weights (this panel's next, or the next
                 * panel's first) into L2 while the row tiles run: the
                 * hardware prefetchers follow CT_MAX short streams late */
                const int64_t nks = last ? 0 : ks + SLAB, nj = last ? j + CT_MAX : j;
                const int nct = nj < j1 ? (int)(j1 - nj < CT_MAX ? j1 - nj : CT_MAX) : 0;
                const int64_t nnk = k - nks < SLAB ? k - nks : SLAB;
                const uint8_t *nrow = nct ? base + (size_t)nj * w->row_bytes +
                                                (size_t)(nks / tr->block_size) * tr->block_bytes
                                          : base;
                const int64_t n_tiles = (i1 - i0 + RT_MAX - 1) / RT_MAX;
                for (int64_t i = i0; i < i1; i += RT_MAX) {
                    const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
                    __m512 *sv = save[k <= SLAB ? 0 : (i - i0) / RT_MAX];
                    prefetch_share(nrow, w->row_bytes, nct,
                                   nnk / (int64_t)tr->block_size * (int64_t)tr->block_bytes,
                                   (i - i0) / RT_MAX, n_tiles);
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
        tile(type, rt, ct, x, ldx, w, row_bytes, k, y, ldy, NULL, 0);
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

ALWAYS_INLINE void matmul_type(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                               int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    /* activation rows that stay in L2 while the weight panels pass over them */
    int64_t rb = L2_ROW_BLOCK_BYTES / (k * (int64_t)sizeof(float)) / RT_MAX * RT_MAX;
    if (rb < RT_MAX) rb = RT_MAX;
    const uint8_t *base = w->data;
    if (m == 1) {
        int64_t j = j0;
        if (!nm_kernels_is_block_quant(type)) {
            /* GEMV_ROWS rows at a time (contiguous: one stream), each its
             * own accumulator chain, the next GEMV_ROWS rows prefetched
             * into L2 meanwhile */
            const size_t rb_bytes = w->row_bytes;
            const int64_t pf_step = GEMV_ROWS * (int64_t)rb_bytes / ((k + 15) / 16);
            for (; j + GEMV_ROWS <= j1; j += GEMV_ROWS) {
                const uint8_t *wj = base + (size_t)j * rb_bytes;
                tile(type, 1, GEMV_ROWS, x, ldx, wj, rb_bytes, k, y + j, ldy,
                     j + 2 * GEMV_ROWS <= j1 ? wj + GEMV_ROWS * rb_bytes : NULL, pf_step);
            }
            for (; j < j1; j++)
                tile(type, 1, 1, x, ldx, base + (size_t)j * rb_bytes, rb_bytes, k, y + j, ldy, NULL,
                     0);
        }
        for (; j + GEMV_CT <= j1; j += GEMV_CT)
            tile_any(type, 1, GEMV_CT, x, ldx, base + (size_t)j * w->row_bytes, w->row_bytes, k,
                     y + j, ldy);
        for (; j < j1; j++)
            tile_any(type, 1, 1, x, ldx, base + (size_t)j * w->row_bytes, w->row_bytes, k, y + j,
                     ldy);
        return;
    }
    /* With more than one row tile, panels of CT_MAX weight rows are widened
     * or dequantised to float once and read by every row tile. */
    if (type != NM_DTYPE_F32 && m > RT_MAX) {
        matmul_panel(type, w, x, ldx, m, y, ldy, j0, j1, rb);
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
