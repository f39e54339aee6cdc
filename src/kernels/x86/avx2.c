/* AVX2 kernels: the matmul of avx512.c on 8-lane vectors (up to 2
 * activation rows x 4 weight rows per tile, 16 registers), weights widened to
 * float in registers; quantised weights (Q4_0, K-quants) are widened with the
 * scalar nm_dequantize_row. Compiled with -mavx2 -mfma -mf16c; only called
 * when CPUID reports them. Attention is the blocked kernel
 * of attention.c, shared with the AVX-512 variants. */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <immintrin.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum { RT_MAX = 2, CT_MAX = 4, L2_ROW_BLOCK_BYTES = 512 * 1024 };
/* Quantised rows are widened QCHUNK elements at a time (whole blocks of
 * every quantised type), or whole into a panel of CT_MAX rows when it holds
 * PANEL_ELEMS floats at most. */
enum { QCHUNK = NM_QUANT_CHUNK, PANEL_ELEMS = 16 * 1024 };

/* 8 weights of one row from element kk (kk % 8 == 0); n_left < 8 reads only
 * that many and zero-fills (never for Q8_0, whose rows are whole blocks). */
ALWAYS_INLINE __m256 load_w8(uint32_t type, const uint8_t *row, int64_t kk, int n_left) {
    switch (type) {
    case NM_DTYPE_F32: {
        if (n_left >= 8) return _mm256_loadu_ps((const float *)row + kk);
        float buf[8] = {0};
        memcpy(buf, (const float *)row + kk, (size_t)n_left * sizeof(float));
        return _mm256_loadu_ps(buf);
    }
    case NM_DTYPE_F16:
    case NM_DTYPE_BF16: {
        __m128i h;
        if (n_left >= 8) {
            h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + kk));
        } else {
            uint16_t buf[8] = {0};
            memcpy(buf, (const uint16_t *)row + kk, (size_t)n_left * 2);
            h = _mm_loadu_si128((const __m128i *)buf);
        }
        if (type == NM_DTYPE_F16) return _mm256_cvtph_ps(h);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    default: { /* Q8_0 */
        const uint8_t *blk = row + (size_t)(kk / NM_Q8_0_BLOCK) * NM_Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, blk, 2);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
        const __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 2 + kk % NM_Q8_0_BLOCK));
        return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
    }
}

ALWAYS_INLINE __m256 load_x8(const float *x, int n_left) {
    if (n_left >= 8) return _mm256_loadu_ps(x);
    float buf[8] = {0};
    memcpy(buf, x, (size_t)n_left * sizeof(float));
    return _mm256_loadu_ps(buf);
}

/* A fixed reduction order: high half onto low, then pairs, then the last two. */
ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[r][c] = x[r] . w[c]: one 8-lane FMA accumulator per output, the same
 * operations for every tile shape. */
ALWAYS_INLINE void tile(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                        const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    __m256 acc[RT_MAX][CT_MAX];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k; kk += 8) {
        const int n_left = k - kk < 8 ? (int)(k - kk) : 8;
        __m256 xv[RT_MAX];
        for (int r = 0; r < rt; r++)
            xv[r] = load_x8(x + r * ldx + kk, n_left);
        for (int c = 0; c < ct; c++) {
            const __m256 wv = load_w8(type, w + (size_t)c * row_bytes, kk, n_left);
            for (int r = 0; r < rt; r++)
                acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            y[r * ldy + c] = hsum8(acc[r][c]);
}

/* tile() for quantised weights: each QCHUNK of the ct rows is dequantised
 * into wb, then multiplied as tile() multiplies F32 rows (k is a multiple
 * of 32 here, so there is no tail), so the bits equal the panel path's. */
ALWAYS_INLINE void qtile(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                         const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    __m256 acc[RT_MAX][CT_MAX];
    float wb[CT_MAX][QCHUNK]; /* [ct][QCHUNK] */
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm256_setzero_ps();
    const size_t cb = nm_quant_chunk_bytes(type);
    for (int64_t k0 = 0; k0 < k; k0 += QCHUNK) {
        const int64_t nk = k - k0 < QCHUNK ? k - k0 : QCHUNK;
        for (int c = 0; c < ct; c++)
            nm_dequantize_row((nm_dtype)type,
                              w + (size_t)c * row_bytes + (size_t)(k0 / QCHUNK) * cb, wb[c], nk);
        for (int64_t kk = 0; kk < nk; kk += 8) {
            __m256 xv[RT_MAX];
            for (int r = 0; r < rt; r++)
                xv[r] = _mm256_loadu_ps(x + r * ldx + k0 + kk);
            for (int c = 0; c < ct; c++) {
                const __m256 wv = _mm256_loadu_ps(wb[c] + kk);
                for (int r = 0; r < rt; r++)
                    acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            y[r * ldy + c] = hsum8(acc[r][c]);
}

ALWAYS_INLINE void tile_any(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                            const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    if (nm_kernels_is_block_quant(type))
        qtile(type, rt, ct, x, ldx, w, row_bytes, k, y, ldy);
    else
        tile(type, rt, ct, x, ldx, w, row_bytes, k, y, ldy);
}

ALWAYS_INLINE void tile_rows(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                             const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    if (ct == CT_MAX) {
        if (rt == 2)
            tile_any(type, 2, CT_MAX, x, ldx, w, row_bytes, k, y, ldy);
        else
            tile_any(type, 1, CT_MAX, x, ldx, w, row_bytes, k, y, ldy);
        return;
    }
    for (int c = 0; c < ct; c++) {
        if (rt == 2)
            tile_any(type, 2, 1, x, ldx, w + (size_t)c * row_bytes, row_bytes, k, y + c, ldy);
        else
            tile_any(type, 1, 1, x, ldx, w + (size_t)c * row_bytes, row_bytes, k, y + c, ldy);
    }
}

ALWAYS_INLINE void matmul_type(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                               int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    int64_t rb = L2_ROW_BLOCK_BYTES / (k * (int64_t)sizeof(float)) / RT_MAX * RT_MAX;
    if (rb < RT_MAX) rb = RT_MAX;
    const uint8_t *base = w->data;
    /* Quantised weights with more than one row tile: a panel of CT_MAX rows
     * is dequantised once (at most 64 KiB on the stack) and read as F32 by
     * every row tile. */
    if (nm_kernels_is_block_quant(type) && m > RT_MAX && k * CT_MAX <= PANEL_ELEMS) {
        float panel[PANEL_ELEMS]; /* [CT_MAX][k] weight rows as float */
        for (int64_t i0 = 0; i0 < m; i0 += rb) {
            const int64_t i1 = i0 + rb < m ? i0 + rb : m;
            for (int64_t j = j0; j < j1; j += CT_MAX) {
                const int ct = (int)(j1 - j < CT_MAX ? j1 - j : CT_MAX);
                for (int c = 0; c < ct; c++)
                    nm_dequantize_row((nm_dtype)type, base + (size_t)(j + c) * w->row_bytes,
                                      panel + c * k, k);
                for (int64_t i = i0; i < i1; i += RT_MAX) {
                    const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
                    tile_rows(NM_DTYPE_F32, rt, ct, x + i * ldx, ldx, (const uint8_t *)panel,
                              (size_t)k * sizeof(float), k, y + i * ldy + j, ldy);
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

void nm_matmul_avx2_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                            int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
#define MATMUL(T) matmul_type(T, w, x, ldx, m, y, ldy, j0, j1)
    NM_KERNELS_FOR_EACH_TYPE(w, MATMUL);
#undef MATMUL
}
#else
typedef int nm_avx2_unused; /* an empty translation unit is not ISO C */
#endif
