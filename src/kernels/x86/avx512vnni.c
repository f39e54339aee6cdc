/* AVX512-VNNI matmul for quantised weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
 * MXFP4): activations are quantised to int8 in blocks of 32 and multiplied
 * with vpdpbusd (64 byte products per instruction), as llama.cpp and
 * ik_llama.cpp do; not exact: each activation moves by up to half its
 * block's step. F32 and F16 weights go to the avx512 variant, BF16 to
 * avx512bf16 or, on Intel CPUs, to avx512 (nm_kernels_bf16_in_fp32). Compiled with
 * -mavx512f/bw/vl/dq -mavx512vnni -mavx512bf16 -mfma -mf16c; only called when CPUID reports them.
 *
 * Activations: block b of a row (32 values x) gets the float scale
 * d = max|x| / 127 and codes q = nearest-even integer of x * (1 / d) (d and
 * the codes 0 when d is below FLT_MIN; d NaN when a value is not finite, so
 * the outputs that read it are NaN). A row's codes depend on that row only.
 *
 * Weights: 16 weight rows (outputs) are processed at once, one per 32-bit
 * lane, with their codes as unsigned bytes (Q8_0 codes + 128, Q4_0 and
 * K-quant codes as stored, MXFP4 values v + 12: an E2M1 nibble's value
 * doubled, v in nm_mxfp4_values, from -12 to 12); the activation's codes
 * k..k+3 are broadcast to every lane. A unit of 32 weights (a Q8_0, Q4_0
 * or MXFP4 block, a K-quant sub-block or pair of Q6_K sub-blocks) meets
 * one activation block; output (i, j) is,
 * from acc = 0, over the units in order (Q6_K: within each half of a
 * super-block, units 0, 2, 1, 3, which share their low-bit bytes in pairs):
 *     Q8_0, Q4_0: acc = fma((float)dot, dw * d, acc)
 *     MXFP4:      acc = fma((float)dot, s * d, acc), s = 2^(e - 128):
 *                 half the block's E8M0 scale 2^(e - 127), as v is twice
 *                 the E2M1 value (nm_e8m0_half_to_f32, a float for every
 *                 e; s * d rounds only below FLT_MIN)
 *     Q4_K, Q5_K: acc = fma((float)dot, (dk * sc) * d, acc);
 *                 acc = fma(dmin * mn, -(d * sum q), acc)
 *     Q6_K:       acc = fma((float)(sc1 dot1 + sc2 dot2), dk * d, acc)
 * with dot the exact integer sum of w q over the unit (or its halves), the
 * codes' offset taken out with the code sums: sum (w + o) q - o sum q.
 * Integer sums do not depend on their order, so whether the weights are
 * transposed in registers (one row, or a few), repacked once into a panel
 * that many row tiles read, or read from the layout nm_mat_repack made at
 * load (NM_LAYOUT_PANEL16, below), and whatever m and [j0, j1), an output
 * has the same bits. */
#if defined(__x86_64__)
#include "vnni-blocks.h"

/* RT_MAX: activation rows per register tile (RT_MAX float and RT_MAX int
 * accumulators + 8 weight vectors fit the 32 registers). */
enum { RT_MAX = 6 };
_Static_assert(RT_MAX == 6, "the row loops' unroll pragmas in tile() name it");
/* Stack buffers per call (240 KiB in all): quantised activation rows (a
 * block of rows over a slice of K: XBUF_BYTES, or more rows in the
 * thread's kernel scratch, xrows_buffer) and one repacked panel of NC
 * weight rows over a slice of KC_PANEL (80 KiB); a tile that reads the
 * weights itself takes slices of up to KC_DIRECT. */
enum { KC_PANEL = 4096, KC_DIRECT = 65536 };

/* acc += one unit of weights (codes q[8], scale s, aux as in wpanel_block)
 * times one activation block (xr: its codes). */
ALWAYS_INLINE __m512 unit_dot(uint32_t type, const __m512i *q, __m512 s, __m512i aux,
                              const int8_t *xr, const nm_xblock *xb, __m512 acc) {
    /* Q6_K: one sum per half, each has its own scale; other types: two
     * chains (even and odd t) added at the end, so that a unit waits for
     * four vpdpbusd latencies, not eight (integer sums: the same bits) */
    const int halves = type == NM_DTYPE_Q6_K;
    __m512i dots[2] = {_mm512_set1_epi32(xb->c),
                       halves ? _mm512_set1_epi32(xb->c2) : _mm512_setzero_si512()};
    for (int t = 0; t < 8; t++) {
        int32_t x4;
        memcpy(&x4, xr + 4 * t, 4);
        const int c = halves ? t / 4 : t % 2;
        dots[c] = _mm512_dpbusd_epi32(dots[c], q[t], _mm512_set1_epi32(x4));
    }
    __m512 dot;
    if (type == NM_DTYPE_Q6_K) {
        /* (float)(sc1 dot1 + sc2 dot2) in float, where vpmulld is slow:
         * |dot| <= 16 * 32 * 127 and |sc| <= 128, so each product and
         * their sum stay below 2^24 and every step is exact */
        const __m512 s1 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(aux, 16), 16));
        const __m512 s2 = _mm512_cvtepi32_ps(_mm512_srai_epi32(aux, 16));
        dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[1]), s2,
                              _mm512_mul_ps(_mm512_cvtepi32_ps(dots[0]), s1));
    } else {
        dot = _mm512_cvtepi32_ps(_mm512_add_epi32(dots[0], dots[1]));
    }
    acc = _mm512_fmadd_ps(dot, _mm512_mul_ps(s, _mm512_set1_ps(xb->d)), acc);
    if (type == NM_DTYPE_Q4_K || type == NM_DTYPE_Q5_K)
        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(aux), _mm512_set1_ps(xb->f), acc);
    return acc;
}

/* ---- the register tile: rt activation rows x NC outputs over nb units ----
 * Weights come from a panel, or from src (packed: the panel16 layout),
 * transposed in registers. acc starts at 0 for the first slice of K, else
 * from y (the partial sums of the slices before: a float stored and
 * reloaded is the same float). pf: where the lines to fetch into L2 start
 * (part of the next NC rows), pf_fb of them per fetch g,
 * prefetched meanwhile (or NULL). */
ALWAYS_INLINE void tile(uint32_t type, int rt, const wpanel_block *panel, int packed,
                        const wsrc *src, const int8_t *xq, int64_t ldq, const nm_xblock *xm,
                        int64_t ldm, int64_t nb, float *y, int64_t ldy, __mmask16 cmask, int first,
                        const uint8_t *pf, size_t pf_fb) {
    enum { G_MAX = NM_QK_K / QB };
    const int g_units = units_per_fetch(type);
    /* the row loops below are unrolled (RT_MAX times) so that acc[] stays in
     * registers: gcc otherwise kept it on the stack, a load and a store per
     * unit and row */
    __m512 acc[RT_MAX];
    for (int r = 0; r < rt; r++)
        acc[r] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(cmask, y + r * ldy);
    for (int64_t g = 0; g < nb / g_units; g++) {
        if (pf)
            for (size_t at = (size_t)g * pf_fb / 64 * 64; at < (size_t)(g + 1) * pf_fb; at += 64)
                _mm_prefetch((const char *)pf + at, _MM_HINT_T1); /* the lines of fetch g */
        if (g_units > 1 && !panel) {
            /* a K-quant super-block read here: scales once, then each
             * part's codes used from registers */
            wpanel_block sc[G_MAX];
            __m512i h[8];
            kq_scales(type, packed, src, g, sc, h);
            for (int p = 0; p < 4; p++) {
                __m512i q[2][8];
                kq_codes(type, packed, src, g, p, h, q[0], q[1]);
                for (int i = 0; i < 2; i++) {
                    const int u = kq_unit(type, p, i);
                    const int64_t b = g * g_units + u;
#pragma GCC unroll 6
                    for (int r = 0; r < rt; r++)
                        acc[r] = unit_dot(type, q[i], sc[u].s, sc[u].aux, xq + r * ldq + QB * b,
                                          &xm[r * ldm + b], acc[r]);
                }
            }
            continue;
        }
        wpanel_block tmp[G_MAX];
        const wpanel_block *wb = tmp;
        if (panel)
            wb = panel + g * g_units;
        else
            fetch(type, packed, src, g, tmp);
        for (int ui = 0; ui < g_units; ui++) {
            /* K-quant units in the order the register path uses them */
            const int u = g_units > 1 ? kq_unit(type, ui / 2, ui % 2) : 0;
            const int64_t b = g * g_units + u;
#pragma GCC unroll 6
            for (int r = 0; r < rt; r++)
                acc[r] = unit_dot(type, wb[u].q, wb[u].s, wb[u].aux, xq + r * ldq + QB * b,
                                  &xm[r * ldm + b], acc[r]);
        }
    }
    for (int r = 0; r < rt; r++)
        _mm512_mask_storeu_ps(y + r * ldy, cmask, acc[r]);
}

/* Tile heights with constant bounds, so the accumulators live in registers. */
ALWAYS_INLINE void tile_rt(uint32_t type, int rt, const wpanel_block *panel, int packed,
                           const wsrc *src, const int8_t *xq, int64_t ldq, const nm_xblock *xm,
                           int64_t ldm, int64_t nb, float *y, int64_t ldy, __mmask16 cmask,
                           int first, const uint8_t *pf, size_t pf_fb) {
#define NM_TILE(R)                                                                                 \
    tile(type, R, panel, packed, src, xq, ldq, xm, ldm, nb, y, ldy, cmask, first, pf, pf_fb)
    switch (rt) {
    case 6:
        NM_TILE(6);
        return;
    case 5:
        NM_TILE(5);
        return;
    case 4:
        NM_TILE(4);
        return;
    case 3:
        NM_TILE(3);
        return;
    case 2:
        NM_TILE(2);
        return;
    default:
        NM_TILE(1);
        return;
    }
#undef NM_TILE
}

/* Dispatches on where the weights come from (a panel, the panel16 layout,
 * the file's rows) and on prefetching, so that the loads of the block loop
 * are not behind run-time tests. */
ALWAYS_INLINE void tile_src(uint32_t type, int rt, const wpanel_block *panel, const wsrc *src,
                            const int8_t *xq, int64_t ldq, const nm_xblock *xm, int64_t ldm,
                            int64_t nb, float *y, int64_t ldy, __mmask16 cmask, int first,
                            const uint8_t *pf, size_t pf_fb) {
    if (panel && pf)
        tile_rt(type, rt, panel, 0, NULL, xq, ldq, xm, ldm, nb, y, ldy, cmask, first, pf, pf_fb);
    else if (panel)
        tile_rt(type, rt, panel, 0, NULL, xq, ldq, xm, ldm, nb, y, ldy, cmask, first, NULL, pf_fb);
    else if (src->pk && pf)
        tile_rt(type, rt, NULL, 1, src, xq, ldq, xm, ldm, nb, y, ldy, cmask, first, pf, pf_fb);
    else if (src->pk)
        tile_rt(type, rt, NULL, 1, src, xq, ldq, xm, ldm, nb, y, ldy, cmask, first, NULL, pf_fb);
    else if (pf)
        tile_rt(type, rt, NULL, 0, src, xq, ldq, xm, ldm, nb, y, ldy, cmask, first, pf, pf_fb);
    else
        tile_rt(type, rt, NULL, 0, src, xq, ldq, xm, ldm, nb, y, ldy, cmask, first, NULL, pf_fb);
}

/* Outputs [j, je) of w (one group of NC rows at most; returns je) for the
 * quantised activation rows [i0, i1) over the slice k0 + [0, kn). */
ALWAYS_INLINE int64_t col_group(uint32_t type, const nm_mat *w, int64_t n_grouped, int64_t j,
                                int64_t j1, int64_t k0, int64_t kn, int64_t i0, int64_t i1,
                                const int8_t *xq, const nm_xblock *xm, int use_panel,
                                wpanel_block *panel, float *y, int64_t ldy) {
    const int64_t k = w->k, nb = kn / QB;
    const int64_t fetch_k = QB * units_per_fetch(type); /* elements per fetch */
    int32_t off[NC];
    const wrows rows = panel_rows(type, w, n_grouped, j, j1, k0, off);
    const int64_t jl = rows.jl;
    const uint8_t *wj = rows.wj;
    const wsrc src = rows.src;
    const __mmask16 cmask = rows.cmask;
    /* A tile that reads the weights itself (one row, or a few)
     * prefetches the next NC rows (contiguous when the slice is
     * whole rows) into L2 meanwhile, in one sweep: the file's NC
     * rows are NC short streams, which the hardware prefetchers
     * follow badly, and even the one ascending stream of the
     * panel16 layout is read far slower without. Measured: Q8_0
     * 1 x 16384 x 2048 (bench/kernels.c) 2.5 ms without, 2.5-3.2
     * ms into L1, 1.1-1.4 ms into L2; tg128 of the Q4_K_M model
     * of docs/PERFORMANCE.md, 2 threads, 56 tokens/s without,
     * 77-80 with, 73-78 with the prefetch two groups ahead. */
    /* A panel's row tiles prefetch the next NC rows too, each tile a
     * part: from memory those rows otherwise arrive only as the next panel
     * is filled (one thread, 128 distinct 32 x 768 x 2048 matrices, the
     * least ms per matrix of 3 passes: Q8_0 0.49-0.51 without, 0.41-0.47
     * with; Q4_K repacked 0.49-0.54 without, 0.42-0.46 with). */
    const uint8_t *pf = kn == k && jl + 2 * NC <= j1 ? wj + NC * w->row_bytes : NULL;
    const int64_t n_tiles = (i1 - i0 + RT_MAX - 1) / RT_MAX;
    const size_t fb = NC * fetch_bytes(type);
    /* Q8_0 in the panel16 layout is what its panel would hold (scales and
     * codes by plain loads): the row tiles read the group in place */
    const int fill = use_panel && !(type == NM_DTYPE_Q8_0 && src.pk);
    if (fill) fill_panel(type, &src, kn / fetch_k, panel);
    /* tiles of balanced heights (32 rows: 6 6 5 5 5 5, not 6 x 5 and 2): a
     * short tile costs nearly a full one (one thread, Q4_K 768 x 2048:
     * 30 rows 0.336 ms, 32 rows 0.396 ms, 36 rows 0.391 ms) */
    for (int64_t t = 0; t < n_tiles; t++) {
        const int64_t i = i0 + t * (i1 - i0) / n_tiles;
        const int rt = (int)(i0 + (t + 1) * (i1 - i0) / n_tiles - i);
        /* a panel's tiles share the next rows' lines, tile t the t-th
         * n_tiles-th of each fetch's */
        const size_t pf_fb = use_panel ? (fb + (size_t)n_tiles - 1) / (size_t)n_tiles : fb;
        const uint8_t *pf_t = !pf         ? NULL
                              : use_panel ? pf + (size_t)t * pf_fb * (size_t)(kn / fetch_k)
                                          : pf;
        tile_src(type, rt, fill ? panel : NULL, &src, xq + (i - i0) * kn, kn, xm + (i - i0) * nb,
                 nb, nb, y + i * ldy + jl, ldy, cmask, k0 == 0, pf_t, pf_fb);
    }
    return rows.je;
}

/* y = x w^T over [j0, j1); with w2 (same type, shape and layout as w),
 * also y2 = x w2^T from the same quantised activations, and then, group of
 * columns by group, y = silu(y) * y2 (nm_swiglu_forward) once the last
 * slice of K is summed: the bits of two calls and nm_swiglu_forward. */
ALWAYS_INLINE void matmul_q(uint32_t type, const nm_mat *w, const nm_mat *w2, const float *x,
                            int64_t ldx, int64_t m, float *y, int64_t ldy, float *y2, int64_t ldy2,
                            int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    const int64_t fetch_k = QB * units_per_fetch(type); /* elements per fetch */
    NM_ASSERT(k % fetch_k == 0);
    NM_ASSERT(w->row_bytes <= (size_t)INT32_MAX / NC); /* gather offsets are int32 */
    /* rows in whole groups of the panel16 layout (0 in the file's) */
    const int64_t n_grouped = w->layout == NM_LAYOUT_PANEL16 ? w->n / NC * NC : 0;
    NM_ASSERT(n_grouped == 0 || nm_kernels_is_panel16_type(type));
    NM_ASSERT(!w2 || (w2->type == type && w2->n == w->n && w2->k == k &&
                      w2->row_bytes == w->row_bytes && w2->layout == w->layout));
    /* Several row tiles share a panel, repacked once per row block; one tile
     * (m <= RT_MAX) transposes the weights in registers as it goes. */
    const int use_panel = m > RT_MAX;
    const int64_t kc =
        k < (use_panel ? KC_PANEL : KC_DIRECT) ? k : (use_panel ? KC_PANEL : KC_DIRECT);
    const int64_t row_q_bytes = kc + kc / QB * (int64_t)sizeof(nm_xblock);
    _Alignas(64) uint8_t stack_xbuf[XBUF_BYTES];
    _Alignas(64) wpanel_block panel[KC_PANEL / QB]; /* [kc / QB] blocks of NC rows */
    int64_t rb;
    /* [rb][kc] codes, then [rb][kc / QB] blocks; one row (of KC_DIRECT) for a
     * single tile */
    uint8_t *xbuf = xrows_buffer(m, row_q_bytes, use_panel ? RT_MAX : 1, stack_xbuf, &rb);
    for (int64_t k0 = 0; k0 < k; k0 += kc) {
        const int64_t kn = k - k0 < kc ? k - k0 : kc;
        for (int64_t i0 = 0; i0 < m; i0 += rb) {
            const int64_t i1 = i0 + rb < m ? i0 + rb : m;
            int8_t *xq;
            nm_xblock *xm;
            quantise_rows(type, x, ldx, i0, i1, i1 - i0, k0, kn, 0, xbuf, &xq, &xm);
            for (int64_t j = j0; j < j1;) {
                const int64_t je = col_group(type, w, n_grouped, j, j1, k0, kn, i0, i1, xq, xm,
                                             use_panel, panel, y, ldy);
                if (w2) {
                    col_group(type, w2, n_grouped, j, j1, k0, kn, i0, i1, xq, xm, use_panel, panel,
                              y2, ldy2);
                    if (k0 + kn == k) nm_swiglu_block(y, ldy, y2, ldy2, i0, i1, j, je);
                }
                j = je;
            }
        }
    }
}

/* Fetch at byte at of the NC rows rows + off[c], written at pb in the
 * panel16 layout. */
static void repack_fetch(uint32_t type, const uint8_t *rows, const int32_t *off, size_t at,
                         uint8_t *pb) {
    for (int c = 0; c < NC; c++)
        pk_put_scales(type, rows + off[c] + at, c, pb);
    __m512i v[8];
    if (is_block32(type)) {
        const size_t scale_bytes = type == NM_DTYPE_MXFP4 ? 1 : 2; /* E8M0 or f16 */
        const int n_vec = type == NM_DTYPE_Q8_0 ? 8 : 4;
        if (type == NM_DTYPE_Q8_0)
            q8_0_codes(rows, off, at, v);
        else
            block_nibbles(rows, off, at + scale_bytes, v);
        for (int t = 0; t < n_vec; t++)
            _mm512_storeu_si512(pb + scale_bytes * NC + 64 * t, v[t]);
        return;
    }
    for (int p = 0; p < 4; p++) {
        transpose32(rows, off, at + kq_codes_at(type, p), v);
        for (int t = 0; t < 8; t++)
            _mm512_storeu_si512(pb + pk_codes_at(type, p) + 64 * t, v[t]);
    }
    const int n_high = type == NM_DTYPE_Q6_K ? 4 : type == NM_DTYPE_Q5_K ? 1 : 0;
    for (int p = 0; p < n_high; p += 2) {
        transpose32(rows, off, at + kq_high_at(type, p), v);
        for (int t = 0; t < 8; t++)
            _mm512_storeu_si512(pb + pk_high_at(type, p) + 64 * t, v[t]);
    }
}

void nm_avx512vnni_repack(const nm_mat *w, void *dst) {
    const uint32_t type = w->type;
    NM_ASSERT(nm_kernels_is_panel16_type(type) && w->layout == NM_LAYOUT_ROWS);
    NM_ASSERT(w->k % (QB * units_per_fetch(type)) == 0);
    NM_ASSERT(w->row_bytes <= (size_t)INT32_MAX / NC);
    const size_t fb = fetch_bytes(type);
    const int64_t n_fetch = w->k / (QB * units_per_fetch(type)), n_grouped = w->n / NC * NC;
    int32_t off[NC];
    for (int c = 0; c < NC; c++)
        off[c] = (int32_t)((size_t)c * w->row_bytes);
    for (int64_t j = 0; j < n_grouped; j += NC) {
        const uint8_t *rows = (const uint8_t *)w->data + (size_t)j * w->row_bytes;
        uint8_t *out = (uint8_t *)dst + (size_t)j * w->row_bytes;
        for (int64_t f = 0; f < n_fetch; f++)
            repack_fetch(type, rows, off, (size_t)f * fb, out + NC * (size_t)f * fb);
    }
    memcpy((uint8_t *)dst + (size_t)n_grouped * w->row_bytes,
           (const uint8_t *)w->data + (size_t)n_grouped * w->row_bytes,
           (size_t)(w->n - n_grouped) * w->row_bytes);
}

bool nm_matmul_avx512vnni_quantises(uint32_t type) { return nm_kernels_is_panel16_type(type); }

/* Both entry points: w2 NULL (y2 unused) is the plain matmul. */
static void matmul_any(const nm_mat *w, const nm_mat *w2, const float *x, int64_t ldx, int64_t m,
                       float *y, int64_t ldy, float *y2, int64_t ldy2, int64_t j0, int64_t j1) {
#define NM_MATMUL_Q(T) matmul_q(T, w, w2, x, ldx, m, y, ldy, y2, ldy2, j0, j1)
    NM_VNNI_FOR_EACH_QTYPE(w->type, NM_MATMUL_Q);
#undef NM_MATMUL_Q
}

void nm_matmul_swiglu_avx512vnni_forward(const nm_mat *wg, const nm_mat *wu, const float *x,
                                         int64_t ldx, int64_t m, float *h, int64_t ldh, float *u,
                                         int64_t ldu, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= wg->n);
    if (m <= 0 || j0 == j1) return;
    if (nm_matmul_avx512vnni_quantises(wg->type) && nm_matmul_fusable(wg, wu)) {
        matmul_any(wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
        return;
    }
    nm_matmul_swiglu_by(nm_matmul_avx512vnni_forward, wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
}

void nm_matmul_avx512vnni_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                                  int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
    switch (w->type) {
    case NM_DTYPE_Q8_0:
    case NM_DTYPE_Q4_0:
    case NM_DTYPE_Q4_K:
    case NM_DTYPE_Q5_K:
    case NM_DTYPE_Q6_K:
    case NM_DTYPE_MXFP4:
        matmul_any(w, NULL, x, ldx, m, y, ldy, NULL, 0, j0, j1);
        return;
    case NM_DTYPE_BF16:
        if (!nm_kernels_bf16_in_fp32()) {
            nm_matmul_avx512bf16_forward(w, x, ldx, m, y, ldy, j0, j1);
            return;
        }
        nm_matmul_avx512_forward(w, x, ldx, m, y, ldy, j0, j1);
        return;
    default:
        nm_matmul_avx512_forward(w, x, ldx, m, y, ldy, j0, j1);
    }
}
#else
typedef int nm_avx512vnni_unused; /* an empty translation unit is not ISO C */
#endif
