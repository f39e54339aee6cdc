/* The amx variant: matmuls of BF16 and quantised weights on AMX tiles.
 * Compiled twice: here with the AMX flags (the instructions, entry points
 * *_hw), and by amx-emu.c with NM_AMX_EMU defined (the tile operations in
 * plain C, amx-tile.h; entry points *_emu). The rest of the code is AVX-512
 * in both, so both need the CPU features of avx512vnni.
 *
 * BF16 weights: y = x . W^T with the weights as tile A, straight from the
 * file's rows (16 rows x 32 values per tile, row stride row_bytes), and the
 * activations rounded to bfloat16 as avx512bf16 rounds them (nearest even)
 * and laid out as tile B (row p: the pairs 2p, 2p + 1 of 16 activation
 * rows), so C[n][m] = y[m][n]. Every m takes this path, one row as well as
 * many (16 x 16 outputs per tile product, rows past m are zeros): an
 * output is then always the same sequence of tile products over its weight
 * row and activation row in blocks of 32, which the tile's FP32
 * accumulation order (not that of vdpbf16ps) makes it. So the bits do not
 * depend on m or [j0, j1), but they are not avx512bf16's.
 *
 * Q8_0, Q4_0, Q4_K, Q5_K, MXFP4 weights: the activations quantised to int8
 * blocks as avx512vnni does (vnni-blocks.h), as tile A (16 rows x one block
 * of 32 codes); the weights unpacked as avx512vnni unpacks them, NC = 16
 * rows per panel, which is tile B (8 rows x 16 outputs x 4 codes). One tile
 * product per unit of 32 weights gives the exact int32 sums that vpdpbusd
 * gives, and the scales are applied outside the tile with the FMAs of
 * avx512vnni in its order: the outputs are avx512vnni's, bit for bit. So
 * the products where the tiles do not pay go to avx512vnni itself: fewer
 * than AMX_MIN_ROWS rows (decode), and Q6_K weights, whose sub-blocks of 16
 * would take two tile products and two C tiles per unit (slower than
 * avx512vnni at every shape measured, docs/PERFORMANCE.md); a last tile of
 * fewer than 16 rows is filled with rows of zero codes. */
#if defined(__x86_64__)
#include "vnni-blocks.h"

#include "amx-tile.h"

#if defined(NM_AMX_EMU)
#define AMX_FN(name) name##_emu_forward
#else
#define AMX_FN(name) name##_hw_forward
#endif

/* Tiles. BF16: C 0-3 (16 x 16 FP32), A 4-5 (16 rows x 32 BF16), B 6-7
 * (16 pairs x 16 columns). Int8: C 0, 1, 6, 7 (16 x 16 int32: a batch of
 * four units' sums); A 2 and 4 (16 rows x 32 codes), B 3 and 5 (8 rows x
 * 16 x 4 codes), used by alternate units. */
enum { CFG_BF16 = 0, CFG_INT8 = 1 };
static const nm_amx_cfg configs[2] = {
    [CFG_BF16] = {.palette = 1,
                  .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                  .rows = {16, 16, 16, 16, 16, 16, 16, 16}},
    [CFG_INT8] = {.palette = 1,
                  .colsb = {64, 64, 32, 64, 32, 64, 64, 64},
                  .rows = {16, 16, 16, 8, 16, 8, 16, 16}},
};

/* The configuration this thread loaded last (-1: none yet): each thread
 * loads one before its first tile instruction. */
static _Thread_local int cfg_loaded = -1;

static void use_config(int id) {
    if (cfg_loaded == id) return;
    AMX_LOADCFG(&configs[id]);
    cfg_loaded = id;
}

/* ---- BF16 ---- */

/* BF_KC: K elements per slice (a multiple of 32); the slices' partial sums
 * go through y (a float stored and reloaded is the same float). BF_MB:
 * activation tiles (16 rows each) of a block of rows, which every 32 weight
 * rows then meet, two at a time (64 KiB of the stack for each).
 * For more rows than one block, groups of up to BF_GROUP row tiles (1 MiB
 * at BF_KC) rounded at once into the thread's kernel scratch, and
 * BF_COL_BYTES: the weights (of w and w2) of a block of columns that all
 * the group's blocks of rows meet before the next block of columns, so
 * that they come from L2, not memory, after the first (half of a 2 MiB
 * L2). */
enum { BF_KC = 2048, BF_MB = 4, BF_GROUP = 16, BF_COL_BYTES = 1 << 20 };

/* n_left (> 0) activations as bfloat16 pairs, 32 at a time, rounded as
 * avx512bf16's load_x32 rounds them; zero past n_left. */
static inline __m512i bf16_x32(const float *x, int64_t n_left) {
    if (n_left >= 32)
        return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
    const __mmask16 lo = (__mmask16)(n_left >= 16 ? 0xffff : (1u << n_left) - 1);
    const __mmask16 hi = (__mmask16)(n_left > 16 ? (1u << (n_left - 16)) - 1 : 0);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16),
                                        _mm512_maskz_loadu_ps(lo, x));
}

/* out[c] lane r = in[r] lane c (16 x 16 dwords): pairs of rows
 * interleaved by dwords, then quadwords, leave in u[4g + q] the column
 * 4L + q of rows 4g..4g+3 in each 128-bit lane L; 128-bit shuffles gather
 * the four lanes L of each column. */
static inline void transpose16(const __m512i *in, __m512i *out) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(in[i], in[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(in[i], in[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int q = 0; q < 4; q++) {
        const __m512i s0 = _mm512_shuffle_i32x4(u[q], u[4 + q], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i s1 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i s2 = _mm512_shuffle_i32x4(u[q], u[4 + q], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i s3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], _MM_SHUFFLE(3, 2, 3, 2));
        out[q] = _mm512_shuffle_i32x4(s0, s1, _MM_SHUFFLE(2, 0, 2, 0));
        out[4 + q] = _mm512_shuffle_i32x4(s0, s1, _MM_SHUFFLE(3, 1, 3, 1));
        out[8 + q] = _mm512_shuffle_i32x4(s2, s3, _MM_SHUFFLE(2, 0, 2, 0));
        out[12 + q] = _mm512_shuffle_i32x4(s2, s3, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* Tile B of activation rows [0, rows) (rows <= 16) over kn elements from
 * x: xt[kb][p][r] (dwords) = the bfloat16 pair 2p, 2p + 1 of block kb of
 * row r; rows past `rows` and elements past kn are 0. */
static void bf16_b_tiles(const float *x, int64_t ldx, int rows, int64_t kn, uint32_t *xt) {
    const int64_t nkb = (kn + 31) / 32;
    for (int64_t kb = 0; kb < nkb; kb++) {
        __m512i in[16], out[16];
        for (int r = 0; r < 16; r++)
            in[r] =
                r < rows ? bf16_x32(x + r * ldx + 32 * kb, kn - 32 * kb) : _mm512_setzero_si512();
        transpose16(in, out);
        for (int p = 0; p < 16; p++)
            _mm512_store_si512(xt + (kb * 16 + p) * 16, out[p]);
    }
}

/* The B tiles of rows [i0, i1) of x over the slice k0 + [0, kn), tile t
 * (rows i0 + 16 t on) at xt + t * step. */
static void bf16_row_tiles(const float *x, int64_t ldx, int64_t i0, int64_t i1, int64_t k0,
                           int64_t kn, uint32_t *xt, int64_t step) {
    for (int64_t i = i0; i < i1; i += 16)
        bf16_b_tiles(x + i * ldx + k0, ldx, (int)(i1 - i < 16 ? i1 - i : 16), kn,
                     xt + (i - i0) / 16 * step);
}

/* NG x MG tiles of C over nkb blocks: A (weights) from a[g] (row stride
 * lda), B from xt[h] (blocks of 16 x 16 dwords). first: C starts at 0,
 * else from cbuf. C tile (g, h) is stored to cbuf + (g * 2 + h) * 256. pf:
 * 32 rows (stride lda) whose lines kb to prefetch into L2 meanwhile, or NULL. */
static inline __attribute__((always_inline)) void
bf16_block(int ng, int mg, const uint8_t *const *a, int64_t lda, const uint32_t *const *xt,
           int64_t nkb, int first, float *cbuf, const uint8_t *pf) {
#define C_AT(g, h) (cbuf + ((g)*2 + (h)) * 256)
    if (first) {
        AMX_ZERO(0);
        if (mg > 1) AMX_ZERO(1);
        if (ng > 1) AMX_ZERO(2);
        if (ng > 1 && mg > 1) AMX_ZERO(3);
    } else {
        AMX_LOAD(0, C_AT(0, 0), 64);
        if (mg > 1) AMX_LOAD(1, C_AT(0, 1), 64);
        if (ng > 1) AMX_LOAD(2, C_AT(1, 0), 64);
        if (ng > 1 && mg > 1) AMX_LOAD(3, C_AT(1, 1), 64);
    }
    for (int64_t kb = 0; kb < nkb; kb++) {
        if (pf) /* the next 32 rows' line kb, into L2 */
            for (int r = 0; r < 32; r++)
                _mm_prefetch((const char *)pf + r * lda + 64 * kb, _MM_HINT_T1);
        AMX_LOAD(4, a[0] + 64 * kb, lda);
        AMX_LOAD(6, xt[0] + 256 * kb, 64);
        AMX_DPBF16(0, 4, 6);
        if (mg > 1) {
            AMX_LOAD(7, xt[1] + 256 * kb, 64);
            AMX_DPBF16(1, 4, 7);
        }
        if (ng > 1) {
            AMX_LOAD(5, a[1] + 64 * kb, lda);
            AMX_DPBF16(2, 5, 6);
            if (mg > 1) AMX_DPBF16(3, 5, 7);
        }
    }
    AMX_STORE(0, C_AT(0, 0), 64);
    if (mg > 1) AMX_STORE(1, C_AT(0, 1), 64);
    if (ng > 1) AMX_STORE(2, C_AT(1, 0), 64);
    if (ng > 1 && mg > 1) AMX_STORE(3, C_AT(1, 1), 64);
#undef C_AT
}

/* The C tiles (g, h) of output rows j + 16 g and activation rows i + 16 h,
 * in cbuf as [g][h][n][m], to y (only rows below m, outputs below j1); or,
 * load, from y into cbuf (0 elsewhere). */
static void bf16_c_io(int load, int ng, int mg, float *cbuf, float *y, int64_t ldy, int64_t i,
                      int64_t m, int64_t j, int64_t j1) {
    for (int g = 0; g < ng; g++)
        for (int h = 0; h < mg; h++) {
            float *cv = cbuf + (g * 2 + h) * 256;
            const int64_t jg = j + 16 * g, ih = i + 16 * h;
            const __mmask16 cols = (__mmask16)(j1 - jg >= 16 ? 0xffff : (1u << (j1 - jg)) - 1);
            __m512i in[16], out[16];
            if (!load) {
                for (int c = 0; c < 16; c++)
                    in[c] = _mm512_load_si512(cv + 16 * c);
                transpose16(in, out);
                for (int r = 0; r < 16 && ih + r < m; r++)
                    _mm512_mask_storeu_epi32(y + (ih + r) * ldy + jg, cols, out[r]);
                continue;
            }
            for (int r = 0; r < 16; r++)
                in[r] = ih + r < m ? _mm512_maskz_loadu_epi32(cols, y + (ih + r) * ldy + jg)
                                   : _mm512_setzero_si512();
            transpose16(in, out);
            for (int c = 0; c < 16; c++)
                _mm512_store_si512(cv + 16 * c, out[c]);
        }
}

/* Outputs [j, min(j + 32, j1)) of w for the activation tiles of rows
 * [i0, i0 + mi) over the slice k0 + [0, kn): tile h at xt + h * xt_step. */
static inline __attribute__((always_inline)) void
bf16_cols(const nm_mat *w, int64_t j, int64_t j1, int64_t k0, int64_t kn, int64_t i0, int64_t mi,
          const uint32_t *xt, int64_t xt_step, uint16_t (*apad)[16 * BF_KC], float *cbuf, float *y,
          int64_t ldy, int64_t m) {
    const int64_t k = w->k, nkb = (kn + 31) / 32;
    const uint8_t *base = w->data;
    const int first = k0 == 0;
    const int mg = (int)((mi + 15) / 16);
    const int ng = j1 - j > 16 ? 2 : 1;
    /* A in place: whole blocks of rows that exist */
    const int in_place = k % 32 == 0 && j + 16 * ng <= w->n;
    const uint8_t *as[2];
    const int64_t lda = in_place ? (int64_t)w->row_bytes : nkb * 64;
    for (int g = 0; g < ng; g++) {
        const int64_t jg = j + 16 * g;
        if (in_place) {
            as[g] = base + (size_t)jg * w->row_bytes + (size_t)k0 * 2;
            continue;
        }
        memset(apad[g], 0, sizeof apad[g]);
        for (int c = 0; c < 16 && jg + c < w->n; c++)
            memcpy(apad[g] + c * nkb * 32, base + (size_t)(jg + c) * w->row_bytes + (size_t)k0 * 2,
                   (size_t)kn * 2);
        as[g] = (const uint8_t *)apad[g];
    }
    for (int h = 0; h < mg; h += 2) {
        const int mp = mg - h > 1 ? 2 : 1;
        const uint32_t *xts[2] = {xt + h * xt_step, xt + (h + mp - 1) * xt_step};
        const int64_t i = i0 + 16 * h;
        if (!first) bf16_c_io(1, ng, mp, cbuf, y, ldy, i, m, j, j1);
        /* While the first activation tiles meet these rows, the
         * next 32 rows (read in place) are prefetched into L2: a
         * tile's 16 rows are 16 streams, which the hardware
         * prefetchers follow badly (as in avx512vnni.c). */
        const uint8_t *pf = h == 0 && in_place && j + 64 <= j1 ? as[0] + 32 * w->row_bytes : NULL;
        if (ng == 2 && mp == 2)
            bf16_block(2, 2, as, lda, xts, nkb, first, cbuf, pf);
        else if (ng == 2)
            bf16_block(2, 1, as, lda, xts, nkb, first, cbuf, pf);
        else if (mp == 2)
            bf16_block(1, 2, as, lda, xts, nkb, first, cbuf, pf);
        else
            bf16_block(1, 1, as, lda, xts, nkb, first, cbuf, pf);
        bf16_c_io(0, ng, mp, cbuf, y, ldy, i, m, j, j1);
    }
}

/* y = x w^T over [j0, j1); with w2 (BF16 of w's shape), also y2 = x w2^T
 * from the same activation tiles, then y = silu(y) * y2 (nm_swiglu_forward)
 * for each 32 columns once the last slice of K is summed. The order in
 * which blocks of rows and columns are taken does not change an output:
 * it is always the same tile products over its row and column. */
static void matmul_bf16(const nm_mat *w, const nm_mat *w2, const float *x, int64_t ldx, int64_t m,
                        float *y, int64_t ldy, float *y2, int64_t ldy2, int64_t j0, int64_t j1) {
    use_config(CFG_BF16);
    const int64_t k = w->k;
    NM_ASSERT(!w2 || (w2->type == w->type && w2->n == w->n && w2->k == k));
    enum { STACK_STEP = BF_KC / 2 * 16 };               /* dwords of a row tile's B tiles */
    _Alignas(64) uint32_t xt_stack[BF_MB * STACK_STEP]; /* tiles B of BF_MB row tiles */
    _Alignas(64) uint16_t apad[2][16 * BF_KC];          /* tiles A that cannot be read in place */
    _Alignas(64) float cbuf[2 * 2 * 256];               /* C tiles: [g][h][n][m] */
    for (int64_t k0 = 0; k0 < k; k0 += BF_KC) {
        const int64_t kn = k - k0 < BF_KC ? k - k0 : BF_KC;
        const int64_t all_step = (kn + 31) / 32 * 256; /* dwords of a row tile's B tiles */
        for (int64_t g0 = 0; g0 < m; g0 += 16 * BF_GROUP) {
            const int64_t g1 = m - g0 < 16 * BF_GROUP ? m : g0 + 16 * BF_GROUP;
            const int64_t n_tiles = (g1 - g0 + 15) / 16;
            /* more rows than a block: the group's row tiles at once, in the
             * kernel scratch (where it cannot be had, block by block on the
             * stack, as for fewer rows) */
            uint32_t *all =
                n_tiles > BF_MB ? nm_kernel_scratch((size_t)(BF_GROUP * all_step) * 4) : NULL;
            const int64_t xt_step = all ? all_step : STACK_STEP;
            int64_t cb = j1 - j0; /* columns per block */
            if (all) {
                bf16_row_tiles(x, ldx, g0, g1, k0, kn, all, all_step);
                cb = BF_COL_BYTES / (kn * 2 * (w2 ? 2 : 1)) / 32 * 32;
                if (cb < 32) cb = 32;
            }
            for (int64_t jb = j0; jb < j1; jb += cb) {
                const int64_t jbe = j1 - jb < cb ? j1 : jb + cb;
                for (int64_t i0 = g0; i0 < g1; i0 += 16 * BF_MB) {
                    const int64_t mi = g1 - i0 < 16 * BF_MB ? g1 - i0 : 16 * BF_MB;
                    const uint32_t *xt = all ? all + (i0 - g0) / 16 * all_step : xt_stack;
                    if (!all) bf16_row_tiles(x, ldx, i0, i0 + mi, k0, kn, xt_stack, STACK_STEP);
                    for (int64_t j = jb; j < jbe; j += 32) {
                        bf16_cols(w, j, jbe, k0, kn, i0, mi, xt, xt_step, apad, cbuf, y, ldy, m);
                        if (!w2) continue;
                        bf16_cols(w2, j, jbe, k0, kn, i0, mi, xt, xt_step, apad, cbuf, y2, ldy2, m);
                        if (k0 + kn < k) continue;
                        nm_swiglu_block(y, ldy, y2, ldy2, i0, i0 + mi, j,
                                        j + 32 < jbe ? j + 32 : jbe);
                    }
                }
            }
        }
    }
}

/* ---- quantised weights ---- */

/* KC: K elements per slice, as avx512vnni's panel path; the blocks of
 * quantised activation rows are xrows_buffer's (vnni-blocks.h). */
enum { KC = 4096, MT = 16, PK_Q8_0 = NC * NM_Q8_0_BYTES };
/* Products of fewer rows go to avx512vnni (measured crossover,
 * docs/PERFORMANCE.md); more fill the last tile with rows of zeros. */
enum { AMX_MIN_ROWS = 12 };

/* acc[r] += a unit's sums (cs: its C tile as int32 [r][lane]) scaled as
 * avx512vnni's unit_dot scales them, in its order; ws, aux: the unit's
 * weight scales (as wpanel_block's s, aux); xm: the 16 rows' activation
 * blocks. The K-quants' codes have no offset (their blocks' c is 0): their
 * sums are not added to. */
static inline __attribute__((always_inline)) void unit_scale(uint32_t type, const int32_t *cs,
                                                             __m512 ws, __m512i aux,
                                                             const nm_xblock *xm, __m512 *acc) {
    const bool k_quant = type == NM_DTYPE_Q4_K || type == NM_DTYPE_Q5_K;
#pragma GCC unroll 16
    for (int r = 0; r < MT; r++) {
        const nm_xblock *xb = &xm[r];
        const __m512i sums = _mm512_load_si512(cs + 16 * r);
        const __m512 dot =
            _mm512_cvtepi32_ps(k_quant ? sums : _mm512_add_epi32(sums, _mm512_set1_epi32(xb->c)));
        acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(ws, _mm512_set1_ps(xb->d)), acc[r]);
        if (k_quant)
            acc[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(aux), _mm512_set1_ps(xb->f), acc[r]);
    }
}

/* C tile c = A tile a (activation codes from x, QB bytes a row) . B tile
 * b (weight codes from q, 64 bytes a row). */
#define TILE_PRODUCT(c, a, b, x, q)                                                                \
    do {                                                                                           \
        AMX_ZERO(c);                                                                               \
        AMX_LOAD(a, x, QB);                                                                        \
        AMX_LOAD(b, q, 64);                                                                        \
        AMX_DPBSUD(c, a, b);                                                                       \
    } while (0)

/* The tile product of a unit (weight codes q, as wpanel_block's q[8]) into
 * the C tile of slot `slot` of a batch (tile numbers must be constants,
 * hence the switch). */
static inline __attribute__((always_inline)) void unit_product(int slot, const int8_t *x,
                                                               const uint8_t *q) {
    switch (slot) {
    case 0:
        TILE_PRODUCT(0, 2, 3, x, q);
        break;
    case 1:
        TILE_PRODUCT(1, 4, 5, x, q);
        break;
    case 2:
        TILE_PRODUCT(6, 2, 3, x, q);
        break;
    default:
        TILE_PRODUCT(7, 4, 5, x, q);
    }
}

/* The C tile of slot `slot` to cs[slot]. */
static inline __attribute__((always_inline)) void unit_store(int slot, int32_t (*cs)[MT * 16]) {
    switch (slot) {
    case 0:
        AMX_STORE(0, cs[0], 64);
        break;
    case 1:
        AMX_STORE(1, cs[1], 64);
        break;
    case 2:
        AMX_STORE(6, cs[2], 64);
        break;
    default:
        AMX_STORE(7, cs[3], 64);
    }
}

/* Weights to prefetch into L2 while a tile computes: n_rows rows from p,
 * stride bytes apart, `lines` cache lines of each; unit i of nb takes the
 * lines [i, i + 1) * lines / nb of every row. */
typedef struct prefetch_rows {
    const uint8_t *p;
    int64_t stride, lines;
    int n_rows;
} prefetch_rows;

/* MT activation rows (a tile of quantise_rows' tiled layout: codes xq,
 * blocks xm) x the NC rows of panel over nb units (or, pk set, of the Q8_0
 * group of the panel16 layout at pk, read in place: its codes are B tiles
 * as they lie); y as avx512vnni's tile leaves it, for its first `rows` rows
 * (the others are zeros in xq and xm); pf: the next panel's weights,
 * prefetched meanwhile (or NULL).
 *
 * The units go in ascending order, avx512vnni's for these types (it
 * reorders Q6_K's only), in batches of four, one per C tile: a
 * batch's products are issued and its C tiles stored, then the batch
 * before is scaled. The vector loads of a C tile's sums wait until its
 * store retires, which waits for every tile product before it in program
 * order; so they come after the next batch's products, and depend only on
 * stores behind which no product is pending. */
static inline __attribute__((always_inline)) void tile_q(uint32_t type, const wpanel_block *panel,
                                                         const uint8_t *pk, const int8_t *xq,
                                                         const nm_xblock *xm, int64_t nb, float *y,
                                                         int64_t ldy, __mmask16 cmask, int first,
                                                         int rows, const prefetch_rows *pf) {
    enum { PER = 4 }; /* units per batch */
    __m512 acc[MT];   /* the row loops are unrolled: gcc otherwise kept acc[] on the stack */
#pragma GCC unroll 16
    for (int r = 0; r < MT; r++)
        acc[r] =
            first || r >= rows ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(cmask, y + r * ldy);
    _Alignas(64) int32_t cs[2][PER][MT * 16]; /* two batches' C tiles */
    /* lines per unit in 16.16 fixed point, rounded up: the last unit
     * reaches the last line */
    const int64_t pf_step = pf ? ((pf->lines << 16) + nb - 1) / nb : 0;
    const int64_t n_batch = (nb + PER - 1) / PER;
    const __m512i no_aux = _mm512_setzero_si512();
    for (int64_t bt = 0; bt <= n_batch; bt++) {
        if (bt < n_batch) {
            const int64_t i0 = bt * PER;
            const int n = nb - i0 < PER ? (int)(nb - i0) : PER;
            for (int u = 0; u < n; u++) {
                const int64_t b = i0 + u;
                unit_product(u, xq + 16 * QB * b,
                             pk ? pk + b * PK_Q8_0 + 2 * NC : (const uint8_t *)panel[b].q);
            }
            for (int u = 0; u < n; u++)
                unit_store(u, cs[bt % 2]);
            if (pf) /* this batch's share of the next rows' lines (shifts, not
                       the divisions per line this loop had) */
                for (int r = 0; r < pf->n_rows; r++)
                    for (int64_t l = (i0 * pf_step) >> 16; l < ((i0 + n) * pf_step) >> 16; l++)
                        _mm_prefetch((const char *)pf->p + r * pf->stride + 64 * l, _MM_HINT_T1);
        }
        if (bt == 0) continue;
        const int64_t i0 = (bt - 1) * PER;
        const int n = nb - i0 < PER ? (int)(nb - i0) : PER;
        for (int u = 0; u < n; u++) {
            const int64_t b = i0 + u;
            const int32_t *c = cs[(bt - 1) % 2][u];
            const __m512 ws =
                pk ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pk + b * PK_Q8_0)))
                   : panel[b].s;
            unit_scale(type, c, ws, pk ? no_aux : panel[b].aux, xm + 16 * b, acc);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MT; r++)
        if (r < rows) _mm512_mask_storeu_ps(y + r * ldy, cmask, acc[r]);
}

/* Outputs [j, je) of w (one group of NC rows at most; returns je) for the
 * quantised activation rows [i0, i1) over the slice k0 + [0, kn). */
static inline __attribute__((always_inline)) int64_t
q_cols(uint32_t type, const nm_mat *w, int64_t n_grouped, int64_t j, int64_t j1, int64_t k0,
       int64_t kn, int64_t i0, int64_t i1, const int8_t *xq, const nm_xblock *xm,
       wpanel_block *panel, float *y, int64_t ldy) {
    const int64_t fetch_k = QB * units_per_fetch(type), nb = kn / QB;
    int32_t off[NC];
    const wrows rows = panel_rows(type, w, n_grouped, j, j1, k0, off);
    /* Q8_0's packed codes need no unpacking: no copy */
    const uint8_t *pk = type == NM_DTYPE_Q8_0 ? rows.src.pk : NULL;
    if (!pk) fill_panel(type, &rows.src, kn / fetch_k, panel);
    /* the next NC rows of the file (NC streams, which the
     * hardware prefetchers follow badly), or the next group of
     * the panel16 layout (one stream), during the first tile */
    const int64_t jn = rows.jl + NC;
    const size_t slice = (size_t)(kn / fetch_k) * fetch_bytes(type);
    const prefetch_rows next =
        jn < n_grouped ? (prefetch_rows){rows.wj + NC * w->row_bytes +
                                             NC * (size_t)(k0 / fetch_k) * fetch_bytes(type),
                                         0, (int64_t)(NC * slice + 63) / 64, 1}
                       : (prefetch_rows){rows.wj + NC * w->row_bytes +
                                             (size_t)(k0 / fetch_k) * fetch_bytes(type),
                                         (int64_t)w->row_bytes, (int64_t)(slice + 63) / 64, NC};
    const int pf_ok = jn < n_grouped || jn + NC <= j1;
    for (int64_t i = i0; i < i1; i += MT)
        tile_q(type, panel, pk, xq + (i - i0) * kn, xm + (i - i0) * nb, nb, y + i * ldy + rows.jl,
               ldy, rows.cmask, k0 == 0, (int)(i1 - i < MT ? i1 - i : MT),
               i == i0 && pf_ok ? &next : NULL);
    return rows.je;
}

/* y = x w^T over [j0, j1); with w2 (same type, shape and layout as w),
 * also y2 = x w2^T from the same quantised activations, then, group of
 * columns by group, y = silu(y) * y2 (nm_swiglu_forward) once the last
 * slice of K is summed. */
static inline __attribute__((always_inline)) void
matmul_q(uint32_t type, const nm_mat *w, const nm_mat *w2, const float *x, int64_t ldx, int64_t m,
         float *y, int64_t ldy, float *y2, int64_t ldy2, int64_t j0, int64_t j1) {
    NM_ASSERT(type != NM_DTYPE_Q6_K); /* avx512vnni's (matmul_any): no tile code for its halves */
    use_config(CFG_INT8);
    const int64_t k = w->k;
    const int64_t fetch_k = QB * units_per_fetch(type);
    NM_ASSERT(k % fetch_k == 0);
    NM_ASSERT(w->row_bytes <= (size_t)INT32_MAX / NC);
    const int64_t n_grouped = w->layout == NM_LAYOUT_PANEL16 ? w->n / NC * NC : 0;
    NM_ASSERT(n_grouped == 0 || nm_kernels_is_panel16_type(type));
    NM_ASSERT(!w2 || (w2->type == type && w2->n == w->n && w2->k == k &&
                      w2->row_bytes == w->row_bytes && w2->layout == w->layout));
    const int64_t kc = k < KC ? k : KC;
    const int64_t row_q_bytes = kc + kc / QB * (int64_t)sizeof(nm_xblock);
    _Alignas(64) uint8_t stack_xbuf[XBUF_BYTES];
    _Alignas(64) wpanel_block panel[KC / QB]; /* [kc / QB] blocks of NC rows */
    int64_t rb;
    /* [rb][kc] codes, then [rb][kc / QB] blocks */
    uint8_t *xbuf = xrows_buffer(m, row_q_bytes, MT, stack_xbuf, &rb);
    for (int64_t k0 = 0; k0 < k; k0 += kc) {
        const int64_t kn = k - k0 < kc ? k - k0 : kc;
        for (int64_t i0 = 0; i0 < m; i0 += rb) {
            const int64_t i1 = i0 + rb < m ? i0 + rb : m;
            const int64_t n_rows = (i1 - i0 + MT - 1) / MT * MT; /* whole tiles */
            int8_t *xq;
            nm_xblock *xm;
            quantise_rows(type, x, ldx, i0, i1, n_rows, k0, kn, 1, xbuf, &xq, &xm);
            for (int64_t j = j0; j < j1;) {
                const int64_t je =
                    q_cols(type, w, n_grouped, j, j1, k0, kn, i0, i1, xq, xm, panel, y, ldy);
                if (w2) {
                    q_cols(type, w2, n_grouped, j, j1, k0, kn, i0, i1, xq, xm, panel, y2, ldy2);
                    if (k0 + kn == k) nm_swiglu_block(y, ldy, y2, ldy2, i0, i1, j, je);
                }
                j = je;
            }
        }
    }
}

/* Both entry points: w2 NULL (y2 unused) is the plain matmul. */
static void matmul_any(const nm_mat *w, const nm_mat *w2, const float *x, int64_t ldx, int64_t m,
                       float *y, int64_t ldy, float *y2, int64_t ldy2, int64_t j0, int64_t j1) {
    if (w->type == NM_DTYPE_BF16) {
        matmul_bf16(w, w2, x, ldx, m, y, ldy, y2, ldy2, j0, j1);
        return;
    }
    if (m < AMX_MIN_ROWS || w->type == NM_DTYPE_Q6_K) { /* avx512vnni's own, the same bits */
        if (w2)
            nm_matmul_swiglu_avx512vnni_forward(w, w2, x, ldx, m, y, ldy, y2, ldy2, j0, j1);
        else
            nm_matmul_avx512vnni_forward(w, x, ldx, m, y, ldy, j0, j1);
        return;
    }
#define NM_MATMUL_Q(T) matmul_q(T, w, w2, x, ldx, m, y, ldy, y2, ldy2, j0, j1)
    NM_VNNI_FOR_EACH_QTYPE(w->type, NM_MATMUL_Q);
#undef NM_MATMUL_Q
}

static bool tile_type(uint32_t type) {
    return type == NM_DTYPE_BF16 || nm_matmul_avx512vnni_quantises(type);
}

void AMX_FN(nm_matmul_swiglu_amx)(const nm_mat *wg, const nm_mat *wu, const float *x, int64_t ldx,
                                  int64_t m, float *h, int64_t ldh, float *u, int64_t ldu,
                                  int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= wg->n);
    if (m <= 0 || j0 == j1) return;
    if (tile_type(wg->type) && nm_matmul_fusable(wg, wu)) {
        matmul_any(wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
        return;
    }
    nm_matmul_swiglu_by(AMX_FN(nm_matmul_amx), wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
}

void AMX_FN(nm_matmul_amx)(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                           int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
    if (m <= 0 || j0 == j1) return;
    if (tile_type(w->type))
        matmul_any(w, NULL, x, ldx, m, y, ldy, NULL, 0, j0, j1);
    else
        nm_matmul_avx512_forward(w, x, ldx, m, y, ldy, j0, j1);
}
#else
typedef int nm_amx_unused; /* an empty translation unit is not ISO C */
#endif
