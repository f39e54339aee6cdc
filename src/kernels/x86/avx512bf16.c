/* AVX512-BF16 matmul for BF16 and Q8_0 weights (Q8_0 values d * q are
 * rounded to bfloat16 too, another 2^-9 each): activations are rounded to bfloat16
 * (round to nearest even) in registers and multiplied with vdpbf16ps, which
 * does 32 products per instruction where an FP32 FMA does 16; measured on
 * this machine at about twice the FP32 FMA rate (bench/kernels.c). It costs
 * accuracy: each activation carries a relative error up to 2^-9, so a dot
 * product errs by up to about 2^-8 * sum|x w| (llama.cpp makes the same
 * choice on such CPUs for BF16; for Q8_0 it quantises activations to int8
 * instead). Opt-in (NPUMOE_KERNELS=avx512bf16): the automatic
 * choice keeps FP32 activations. Other weight types go to the AVX-512
 * variant. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
 * -mavx512bf16 -mfma -mf16c; only called when CPUID reports them. */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"
#include "sums16.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <immintrin.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum { RT_MAX = 4, CT_MAX = 4, L2_ROW_BLOCK_BYTES = 512 * 1024, XB_ELEMS = 64 * 1024 };

/* 32 activations from element kk as bfloat16 pairs; lanes past n are 0. */
ALWAYS_INLINE __m512bh load_x32(const float *x, int64_t n_left) {
    if (n_left >= 32) return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
    const __mmask16 lo = (__mmask16)(n_left >= 16 ? 0xffff : (1u << n_left) - 1);
    const __mmask16 hi = (__mmask16)(n_left > 16 ? (1u << (n_left - 16)) - 1 : 0);
    return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16), _mm512_maskz_loadu_ps(lo, x));
}

/* 32 weights of a row from element kk (kk % 32 == 0) as bfloat16. BF16:
 * as stored, zero past the row's end. Q8_0: one whole block, d * q computed
 * in float (exact) and rounded to bfloat16 (relative error up to 2^-9). */
ALWAYS_INLINE __m512bh load_w32(uint32_t type, const uint8_t *row, int64_t kk, int64_t n_left) {
    if (type == NM_DTYPE_Q8_0) {
        const uint8_t *blk = row + (size_t)(kk / NM_Q8_0_BLOCK) * NM_Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, blk, 2);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
        const __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + 2));
        const __m128i q1 = _mm_loadu_si128((const __m128i *)(blk + 18));
        return _mm512_cvtne2ps_pbh(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1))),
                                   _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0))));
    }
    const uint16_t *w = (const uint16_t *)row + kk;
    if (n_left >= 32) return (__m512bh)_mm512_loadu_si512(w);
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1ull << n_left) - 1), w);
}

/* y[r][c] = x[r] . w[c]: one accumulator per output, pairs of products
 * added by vdpbf16ps in k order, reduced in nm_sum16's order: the same
 * operations for every tile shape. */
ALWAYS_INLINE void tile(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                        const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    __m512 acc[RT_MAX][CT_MAX];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk += 32) {
        const int64_t n_left = k - kk;
        __m512bh xv[RT_MAX];
        for (int r = 0; r < rt; r++)
            xv[r] = load_x32(x + r * ldx + kk, n_left);
        for (int c = 0; c < ct; c++) {
            const __m512bh wv = load_w32(type, w + (size_t)c * row_bytes, kk, n_left);
            for (int r = 0; r < rt; r++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv[r], wv);
        }
    }
    nm_store_sums4x4(rt, ct, &acc[0][0], CT_MAX, y, ldy);
}

/* The same as tile() with the activations already rounded to bfloat16 in
 * xb (row stride ldb, zero-padded to a multiple of 32): the same values and
 * the same operations, without converting them again for every column. */
ALWAYS_INLINE void tile_pre(int rt, int ct, const uint16_t *xb, int64_t ldb, const uint8_t *w,
                            size_t row_bytes, int64_t k, float *y, int64_t ldy, const uint8_t *pf,
                            size_t pf_step) {
    __m512 acc[RT_MAX][CT_MAX];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk += 32) {
        const int64_t n_left = k - kk;
        __m512bh xv[RT_MAX];
        for (int r = 0; r < rt; r++)
            xv[r] = (__m512bh)_mm512_loadu_si512(xb + r * ldb + kk);
        if (pf) /* pf_step bytes from pf per step of 32 */
            for (size_t at = (size_t)(kk / 32) * pf_step / 64 * 64;
                 at < (size_t)(kk / 32 + 1) * pf_step; at += 64)
                _mm_prefetch((const char *)pf + at, _MM_HINT_T1);
        for (int c = 0; c < ct; c++) {
            const __m512bh wv = load_w32(NM_DTYPE_BF16, w + (size_t)c * row_bytes, kk, n_left);
            for (int r = 0; r < rt; r++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv[r], wv);
        }
    }
    nm_store_sums4x4(rt, ct, &acc[0][0], CT_MAX, y, ldy);
}

ALWAYS_INLINE void tile_pre_rt(int rt, int ct, const uint16_t *xb, int64_t ldb, const uint8_t *w,
                               size_t row_bytes, int64_t k, float *y, int64_t ldy,
                               const uint8_t *pf, size_t pf_step) {
    switch (rt) {
    case 4:
        tile_pre(4, ct, xb, ldb, w, row_bytes, k, y, ldy, pf, pf_step);
        return;
    case 3:
        tile_pre(3, ct, xb, ldb, w, row_bytes, k, y, ldy, pf, pf_step);
        return;
    case 2:
        tile_pre(2, ct, xb, ldb, w, row_bytes, k, y, ldy, pf, pf_step);
        return;
    default:
        tile_pre(1, ct, xb, ldb, w, row_bytes, k, y, ldy, pf, pf_step);
        return;
    }
}

ALWAYS_INLINE void tile_rt(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                           const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    switch (rt) {
    case 4:
        tile(type, 4, ct, x, ldx, w, row_bytes, k, y, ldy);
        return;
    case 3:
        tile(type, 3, ct, x, ldx, w, row_bytes, k, y, ldy);
        return;
    case 2:
        tile(type, 2, ct, x, ldx, w, row_bytes, k, y, ldy);
        return;
    default:
        tile(type, 1, ct, x, ldx, w, row_bytes, k, y, ldy);
        return;
    }
}

ALWAYS_INLINE void matmul_type(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                               int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    const uint8_t *base = w->data;
    const size_t rb_bytes = w->row_bytes;
    if (m == 1) {
        /* weight rows one after another: one linear stream (see avx512.c);
         * BF16 rows against the activations rounded once (not per row) */
        const int64_t ldb = (k + 31) / 32 * 32;
        if (type == NM_DTYPE_BF16 && ldb <= XB_ELEMS) {
            uint16_t xb[XB_ELEMS]; /* [ldb] the row in bfloat16 */
            for (int64_t kk = 0; kk < ldb; kk += 32)
                _mm512_storeu_si512(xb + kk, (__m512i)load_x32(x + kk, k - kk));
            for (int64_t j = j0; j < j1; j++)
                tile_pre(1, 1, xb, ldb, base + (size_t)j * rb_bytes, rb_bytes, k, y + j, ldy, NULL,
                         0);
            return;
        }
        for (int64_t j = j0; j < j1; j++)
            tile(type, 1, 1, x, ldx, base + (size_t)j * rb_bytes, rb_bytes, k, y + j, ldy);
        return;
    }
    /* Rows of up to XB_ELEMS / 4 elements: a block of rows is rounded to
     * bfloat16 once into a stack buffer (128 KiB), then every column tile
     * reads it. */
    const int64_t ldb = (k + 31) / 32 * 32;
    if (ldb * RT_MAX <= XB_ELEMS) {
        uint16_t xb[XB_ELEMS]; /* [rb][ldb] the block's activations in bfloat16 */
        uint16_t panel[XB_ELEMS / RT_MAX * CT_MAX]; /* [CT_MAX][ldb] Q8_0 weights in bfloat16 */
        const int64_t rbb = XB_ELEMS / ldb / RT_MAX * RT_MAX;
        for (int64_t i0 = 0; i0 < m; i0 += rbb) {
            const int64_t i1 = i0 + rbb < m ? i0 + rbb : m;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t kk = 0; kk < ldb; kk += 32)
                    _mm512_storeu_si512(xb + (i - i0) * ldb + kk,
                                        (__m512i)load_x32(x + i * ldx + kk, k - kk));
            for (int64_t j = j0; j < j1; j += CT_MAX) {
                const int ct = (int)(j1 - j < CT_MAX ? j1 - j : CT_MAX);
                const uint8_t *wj = base + (size_t)j * rb_bytes;
                size_t wrb = rb_bytes;
                if (type == NM_DTYPE_Q8_0) {
                    /* the panel's rows in bfloat16, converted once for all row tiles */
                    for (int c = 0; c < ct; c++)
                        for (int64_t kk = 0; kk < k; kk += 32)
                            _mm512_storeu_si512(
                                panel + c * ldb + kk,
                                (__m512i)load_w32(type, wj + (size_t)c * rb_bytes, kk, k - kk));
                    wj = (const uint8_t *)panel;
                    wrb = (size_t)ldb * 2;
                }
                /* BF16 weights come from memory once per row block: the
                 * row tiles fetch the next CT_MAX rows (contiguous) into
                 * L2 meanwhile, tile t the t-th n_tiles-th of them, which
                 * the hardware prefetchers, following CT_MAX short streams,
                 * do late (one thread, 128 distinct 32 x 768 x 2048
                 * matrices, least ms per matrix of 3 passes: 0.71-0.75
                 * without, 0.58-0.69 with; 0.45 when they are in cache) */
                const uint8_t *pf = type == NM_DTYPE_BF16 && j + 2 * CT_MAX <= j1
                                        ? base + (size_t)(j + CT_MAX) * rb_bytes
                                        : NULL;
                const int64_t n_tiles = (i1 - i0 + RT_MAX - 1) / RT_MAX, n_steps = ldb / 32;
                const size_t span = (CT_MAX * rb_bytes + (size_t)n_tiles - 1) / (size_t)n_tiles;
                const size_t pf_step = (span + (size_t)n_steps - 1) / (size_t)n_steps;
                for (int64_t i = i0; i < i1; i += RT_MAX) {
                    const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
                    const uint16_t *xi = xb + (i - i0) * ldb;
                    if (ct == CT_MAX) {
                        tile_pre_rt(rt, CT_MAX, xi, ldb, wj, wrb, k, y + i * ldy + j, ldy,
                                    pf ? pf +
                                             (size_t)((i - i0) / RT_MAX) * pf_step * (size_t)n_steps
                                       : NULL,
                                    pf_step);
                    } else {
                        for (int c = 0; c < ct; c++)
                            tile_pre_rt(rt, 1, xi, ldb, wj + (size_t)c * wrb, wrb, k,
                                        y + i * ldy + j + c, ldy, NULL, 0);
                    }
                }
            }
        }
        return;
    }
    int64_t rb = L2_ROW_BLOCK_BYTES / (k * (int64_t)sizeof(float)) / RT_MAX * RT_MAX;
    if (rb < RT_MAX) rb = RT_MAX;
    for (int64_t i0 = 0; i0 < m; i0 += rb) {
        const int64_t i1 = i0 + rb < m ? i0 + rb : m;
        for (int64_t j = j0; j < j1; j += CT_MAX) {
            const int ct = (int)(j1 - j < CT_MAX ? j1 - j : CT_MAX);
            const uint8_t *wj = base + (size_t)j * rb_bytes;
            for (int64_t i = i0; i < i1; i += RT_MAX) {
                const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
                if (ct == CT_MAX) {
                    tile_rt(type, rt, CT_MAX, x + i * ldx, ldx, wj, rb_bytes, k, y + i * ldy + j,
                            ldy);
                } else {
                    for (int c = 0; c < ct; c++)
                        tile_rt(type, rt, 1, x + i * ldx, ldx, wj + (size_t)c * rb_bytes, rb_bytes,
                                k, y + i * ldy + j + c, ldy);
                }
            }
        }
    }
}
void nm_matmul_avx512bf16_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                                  int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
    if (w->type == NM_DTYPE_BF16) {
        matmul_type(NM_DTYPE_BF16, w, x, ldx, m, y, ldy, j0, j1);
    } else if (w->type == NM_DTYPE_Q8_0) {
        NM_ASSERT(w->k % NM_Q8_0_BLOCK == 0);
        matmul_type(NM_DTYPE_Q8_0, w, x, ldx, m, y, ldy, j0, j1);
    } else {
        nm_matmul_avx512_forward(w, x, ldx, m, y, ldy, j0, j1);
    }
}
#else
typedef int nm_avx512bf16_unused; /* an empty translation unit is not ISO C */
#endif