/* AVX2 kernels: the matmul of avx512.c on 8-lane vectors (tiles of up to 2
 * activation rows x 4 weight rows for one or two rows, 6 x 2 for more; 16
 * registers), weights widened to float in registers; quantised weights
 * (MXFP4 here; avx2-int8.c takes Q8_0, Q4_0 and the K-quants) are widened
 * with the scalar nm_dequantize_row. Compiled with -mavx2 -mfma -mf16c; only called
 * when CPUID reports them. Attention is the blocked kernel
 * of attention.c, shared with the AVX-512 variants. */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <immintrin.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum { RT_MAX = 6, CT_MAX = 4, L2_ROW_BLOCK_BYTES = 512 * 1024 };
/* matmul_spans: spans of KSPAN elements (a multiple of 8), blocks of at most
 * NB_MAX columns and L2_COL_BLOCK_BYTES of weights. */
enum { KSPAN = 512, NB_MAX = 64, L2_COL_BLOCK_BYTES = 256 * 1024 };
/* Quantised rows are widened QCHUNK elements at a time (whole blocks of
 * every quantised type), or whole into a panel of a tile's 2 or 4 weight
 * rows when it holds PANEL_ELEMS floats at most. */
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

/* One step of tile(): elements [kk, kk + n_left) of every row and column
 * (xk: the activations of element kk of the first row). */
ALWAYS_INLINE void tile_step(uint32_t type, int rt, int ct, const float *xk, int64_t ldx,
                             const uint8_t *w, size_t row_bytes, int64_t kk, int n_left,
                             __m256 acc[RT_MAX][CT_MAX]) {
    __m256 wv[CT_MAX];
#pragma GCC unroll 4
    for (int c = 0; c < ct; c++)
        wv[c] = load_w8(type, w + (size_t)c * row_bytes, kk, n_left);
#pragma GCC unroll 6
    for (int r = 0; r < rt; r++) {
        __m256 xv = load_x8(xk + r * ldx, n_left);
        /* in a register: gcc would otherwise fold the load into each of the
         * ct FMAs, ct loads of it (the loop is then load-bound) */
        __asm__("" : "+x"(xv));
#pragma GCC unroll 4
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
}

/* y[r][c] = x[r] . w[c]: one 8-lane FMA accumulator per output, the same
 * operations for every tile shape. Per step of 8 elements the ct weight
 * vectors are widened once, then each activation row is loaded once into a
 * register for its ct FMAs (6 x 2: 12 accumulators, 2 weights, 1 row).
 * This call takes elements [k0, k1) (k0 % 8 == 0; x: the activations of
 * element k0 of the first row): the accumulators start
 * at zero where k0 == 0 and from save otherwise, and go to y as sums where
 * k1 == k and back to save otherwise (save: [RT_MAX][CT_MAX]), so a tile
 * taken in spans gives the bits of one taken whole. */
ALWAYS_INLINE void tile(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                        const uint8_t *w, size_t row_bytes, int64_t k0, int64_t k1, int64_t k,
                        __m256 *save, float *y, int64_t ldy) {
    __m256 acc[RT_MAX][CT_MAX];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = k0 == 0 ? _mm256_setzero_ps() : save[r * CT_MAX + c];
    /* Decoding 16-bit rows shorter than a page, the next tile's ct rows
     * are fetched meanwhile, a line per step (ct * 16 bytes): streams of a
     * few dozen lines each left the hardware prefetchers untrained (BF16
     * 1 x 2048 x 768 over 128 experts: 0.66-0.71 the time with it, Zen 3;
     * rows of 4 KiB and F32 rows measured level or slower, so not there).
     * An integer: past the last tile it lies beyond the weights, which a
     * hint may name but a pointer may not. */
    const uintptr_t next = rt <= 2 && ct == CT_MAX && row_bytes < 4096 &&
                                   (type == NM_DTYPE_BF16 || type == NM_DTYPE_F16)
                               ? (uintptr_t)w + ct * row_bytes
                               : 0;
    int64_t kk = k0;
    for (; kk + 8 <= k1; kk += 8) {
        if (next) _mm_prefetch((const char *)(next + (uintptr_t)kk * 2 * CT_MAX), _MM_HINT_T0);
        tile_step(type, rt, ct, x + (kk - k0), ldx, w, row_bytes, kk, 8, acc);
    }
    if (kk < k1)
        tile_step(type, rt, ct, x + (kk - k0), ldx, w, row_bytes, kk, (int)(k1 - kk), acc);
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++) {
            if (k1 == k)
                y[r * ldy + c] = hsum8(acc[r][c]);
            else
                save[r * CT_MAX + c] = acc[r][c];
        }
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
        for (int64_t kk = 0; kk < nk; kk += 8)
            tile_step(NM_DTYPE_F32, rt, ct, x + k0 + kk, ldx, (const uint8_t *)wb[0], sizeof wb[0],
                      kk, 8, acc);
    }
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            y[r * ldy + c] = hsum8(acc[r][c]);
}

/* tile() over [k0, k1); quantised weights only whole (k0 == 0, k1 == k). */
ALWAYS_INLINE void tile_any(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                            const uint8_t *w, size_t row_bytes, int64_t k0, int64_t k1, int64_t k,
                            __m256 *save, float *y, int64_t ldy) {
    if (nm_kernels_is_block_quant(type))
        qtile(type, rt, ct, x, ldx, w, row_bytes, k, y, ldy);
    else
        tile(type, rt, ct, x, ldx, w, row_bytes, k0, k1, k, save, y, ldy);
}

/* A tile of rt rows (1 to 6) by ct columns over [k0, k1): the two shapes
 * the matmul uses (2 x 4 for one or two rows, 6 x 2 for more), a narrower
 * tile one column at a time (column c keeps its accumulators in column c of
 * save). Each shape is compiled for constant sizes. */
ALWAYS_INLINE void tile_rows(uint32_t type, int rt, int ct, int ct_max, const float *x,
                             int64_t ldx, const uint8_t *w, size_t row_bytes, int64_t k0,
                             int64_t k1, int64_t k, __m256 *save, float *y, int64_t ldy) {
#define TILE(R, C, WO, YO)                                                                        \
    tile_any(type, R, C, x, ldx, w + (WO), row_bytes, k0, k1, k, save ? save + (YO) : NULL,        \
             y + (YO), ldy)
    if (ct == ct_max && ct_max == 4) {
        if (rt == 2)
            TILE(2, 4, 0, 0);
        else
            TILE(1, 4, 0, 0);
        return;
    }
    if (ct == ct_max && ct_max == 2) {
        switch (rt) {
        case 1: TILE(1, 2, 0, 0); return;
        case 2: TILE(2, 2, 0, 0); return;
        case 3: TILE(3, 2, 0, 0); return;
        case 4: TILE(4, 2, 0, 0); return;
        case 5: TILE(5, 2, 0, 0); return;
        default: TILE(6, 2, 0, 0); return;
        }
    }
    for (int c = 0; c < ct; c++) {
        switch (rt) {
        case 1: TILE(1, 1, (size_t)c * row_bytes, c); break;
        case 2: TILE(2, 1, (size_t)c * row_bytes, c); break;
        case 3: TILE(3, 1, (size_t)c * row_bytes, c); break;
        case 4: TILE(4, 1, (size_t)c * row_bytes, c); break;
        case 5: TILE(5, 1, (size_t)c * row_bytes, c); break;
        default: TILE(6, 1, (size_t)c * row_bytes, c); break;
        }
    }
#undef TILE
}

/* Rows [i0, i1) in tiles of at most rt_max rows whose heights differ by at
 * most one (a short tile costs nearly what a full one does): the first row
 * of tile t, and its height in *rt. */
static inline int64_t row_tile(int64_t i0, int64_t i1, int rt_max, int64_t t, int *rt) {
    const int64_t n_tiles = (i1 - i0 + rt_max - 1) / rt_max;
    const int64_t i = i0 + t * (i1 - i0) / n_tiles;
    *rt = (int)(i0 + (t + 1) * (i1 - i0) / n_tiles - i);
    return i;
}

/* Rows [i0, i1) of y against weight rows [j, j + ct), whole. */
ALWAYS_INLINE void row_tiles(uint32_t type, int rt_max, int ct, int ct_max, const float *x,
                             int64_t ldx, int64_t i0, int64_t i1, const uint8_t *w,
                             size_t row_bytes, int64_t k, float *y, int64_t ldy, int64_t j) {
    const int64_t n_tiles = (i1 - i0 + rt_max - 1) / rt_max;
    for (int64_t t = 0; t < n_tiles; t++) {
        int rt;
        const int64_t i = row_tile(i0, i1, rt_max, t, &rt);
        tile_rows(type, rt, ct, ct_max, x + i * ldx, ldx, w, row_bytes, 0, k, k, NULL,
                  y + i * ldy + j, ldy);
    }
}

/* Float weights under 6 x 2 tiles: for a block of columns whose weights stay
 * in L2, each row tile in turn against every column of the block, KSPAN
 * elements at a time, so that the tile's activations stay in L1 while the
 * block's weights stream past (six whole rows of 2048 floats would not fit:
 * read again from L2 for each pair of columns, they held the tiles to two
 * thirds of the FMA peak). Each pair of columns keeps its accumulators in
 * save between spans: the bits of whole tiles. */
ALWAYS_INLINE void matmul_spans(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                                int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    int64_t nb = L2_COL_BLOCK_BYTES / (int64_t)w->row_bytes / 2 * 2;
    nb = nb < 2 ? 2 : nb > NB_MAX ? NB_MAX : nb;
    __m256 save[NB_MAX / 2][RT_MAX * CT_MAX];
    /* the tile's span of activations, one row after another: rows of the
     * caller's x lie 8 KiB apart at K = 2048, all in the same L1 sets */
    _Alignas(32) float xs[RT_MAX][KSPAN];
    const int64_t n_tiles = (m + RT_MAX - 1) / RT_MAX;
    for (int64_t jb = j0; jb < j1; jb += nb) {
        const int64_t jb1 = jb + nb < j1 ? jb + nb : j1;
        for (int64_t t = 0; t < n_tiles; t++) {
            int rt;
            const int64_t i = row_tile(0, m, RT_MAX, t, &rt);
            for (int64_t k0 = 0; k0 < k; k0 += KSPAN) {
                const int64_t k1 = k0 + KSPAN < k ? k0 + KSPAN : k;
                for (int r = 0; r < rt; r++)
                    memcpy(xs[r], x + (i + r) * ldx + k0, (size_t)(k1 - k0) * sizeof(float));
                for (int64_t j = jb; j < jb1; j += 2) {
                    const int ct = jb1 - j < 2 ? 1 : 2;
                    tile_rows(type, rt, ct, 2, xs[0], KSPAN, w->data + (size_t)j * w->row_bytes,
                              w->row_bytes, k0, k1, k, save[(j - jb) / 2], y + i * ldy + j, ldy);
                }
            }
        }
    }
}

/* The matmul in tiles of at most rt_max x ct_max. */
ALWAYS_INLINE void matmul_shape(uint32_t type, int rt_max, int ct_max, const nm_mat *w,
                                const float *x, int64_t ldx, int64_t m, float *y, int64_t ldy,
                                int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    int64_t rb = L2_ROW_BLOCK_BYTES / (k * (int64_t)sizeof(float)) / rt_max * rt_max;
    if (rb < rt_max) rb = rt_max;
    const uint8_t *base = w->data;
    if (!nm_kernels_is_block_quant(type) && rt_max == RT_MAX) {
        matmul_spans(type, w, x, ldx, m, y, ldy, j0, j1);
        return;
    }
    /* Quantised weights with more than one row tile: a panel of ct_max rows
     * is dequantised once (at most 64 KiB on the stack) and read as F32 by
     * every row tile. */
    if (nm_kernels_is_block_quant(type) && m > rt_max && k * ct_max <= PANEL_ELEMS) {
        float panel[PANEL_ELEMS]; /* [ct_max][k] weight rows as float */
        for (int64_t i0 = 0; i0 < m; i0 += rb) {
            const int64_t i1 = i0 + rb < m ? i0 + rb : m;
            for (int64_t j = j0; j < j1; j += ct_max) {
                const int ct = (int)(j1 - j < ct_max ? j1 - j : ct_max);
                for (int c = 0; c < ct; c++)
                    nm_dequantize_row((nm_dtype)type, base + (size_t)(j + c) * w->row_bytes,
                                      panel + c * k, k);
                row_tiles(NM_DTYPE_F32, rt_max, ct, ct_max, x, ldx, i0, i1,
                          (const uint8_t *)panel, (size_t)k * sizeof(float), k, y, ldy, j);
            }
        }
        return;
    }
    for (int64_t i0 = 0; i0 < m; i0 += rb) {
        const int64_t i1 = i0 + rb < m ? i0 + rb : m;
        for (int64_t j = j0; j < j1; j += ct_max) {
            const int ct = (int)(j1 - j < ct_max ? j1 - j : ct_max);
            row_tiles(type, rt_max, ct, ct_max, x, ldx, i0, i1,
                      base + (size_t)j * w->row_bytes, w->row_bytes, k, y, ldy, j);
        }
    }
}

ALWAYS_INLINE void matmul_type(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                               int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    if (m <= 2)
        matmul_shape(type, 2, 4, w, x, ldx, m, y, ldy, j0, j1);
    else
        matmul_shape(type, RT_MAX, 2, w, x, ldx, m, y, ldy, j0, j1);
}

/* One function per weight type rather than all in one: the tiles of every
 * type together made a function of over 7000 memory accesses, past which
 * gcc's ASan checks each through a call that scans the shadow instead of
 * inline (ASan tests 10 times slower). */
#define MATMUL_FN(T)                                                                               \
    static __attribute__((noinline)) void matmul_##T(const nm_mat *w, const float *x, int64_t ldx, \
                                                     int64_t m, float *y, int64_t ldy, int64_t j0, \
                                                     int64_t j1) {                                 \
        matmul_type(T, w, x, ldx, m, y, ldy, j0, j1);                                              \
    }
MATMUL_FN(NM_DTYPE_F32)
MATMUL_FN(NM_DTYPE_F16)
MATMUL_FN(NM_DTYPE_BF16)
MATMUL_FN(NM_DTYPE_Q8_0)
MATMUL_FN(NM_DTYPE_Q4_0)
MATMUL_FN(NM_DTYPE_MXFP4)
MATMUL_FN(NM_DTYPE_Q4_K)
MATMUL_FN(NM_DTYPE_Q5_K)
MATMUL_FN(NM_DTYPE_Q6_K)
#undef MATMUL_FN

void nm_matmul_avx2_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                            int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
#define MATMUL(T) matmul_##T(w, x, ldx, m, y, ldy, j0, j1)
    NM_KERNELS_FOR_EACH_TYPE(w, MATMUL);
#undef MATMUL
}
#else
typedef int nm_avx2_unused; /* an empty translation unit is not ISO C */
#endif
