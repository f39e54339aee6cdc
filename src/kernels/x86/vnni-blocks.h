/* The int8 blocks that avx512vnni (avx512vnni.c) and amx (amx.c) share:
 * the activations quantised to int8 blocks, and NC weight rows of a block or
 * super-block unpacked into the lanes vpdpbusd reads, which are also the
 * rows of an AMX B tile (row t: dword t of each of the NC weight rows).
 * Both variants get the same integer sums from these, so the same bits
 * (the contract is described at the top of avx512vnni.c). Only the files
 * compiled with the AVX-512 VNNI flags include it. */
#ifndef NM_KERNELS_X86_VNNI_BLOCKS_H
#define NM_KERNELS_X86_VNNI_BLOCKS_H

#include "kernels/kernels-impl.h"
#include "panel16.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* QB: elements per activation block; NC: outputs per panel (one per lane,
 * a group of the panel16 layout); MX_OFFSET: added to MXFP4's values
 * (-12..12, nm_mxfp4_values) to make them the unsigned bytes vpdpbusd
 * reads. */
enum { QB = PANEL_UNIT, NC = PANEL_ROWS, MX_OFFSET = 12 };

/* One unit of NC weight rows as vpdpbusd reads them: q[t] lane c holds
 * codes 4t..4t+3 of row c (unsigned); s lane c its scale (dw; dk * sc for
 * Q4_K/Q5_K; dk for Q6_K); aux lane c: dmin * mn as float bits (Q4_K,
 * Q5_K) or the two sub-block scales sc1 | sc2 << 16 (Q6_K). */
typedef struct wpanel_block {
    __m512i q[8];
    __m512 s;
    __m512i aux;
} wpanel_block;

/* Where a tile's NC weight rows come from: the file's rows, row c at w +
 * off[c] (voff: the same offsets as a vector), or, when pk is set, a
 * group of the panel16 layout at pk (from the slice's first block). */
typedef struct wsrc {
    const uint8_t *w;
    const int32_t *off;
    __m512i voff;
    const uint8_t *pk;
} wsrc;

/* ---- activation quantisation ---- */

/* n (a multiple of QB) values of x into codes and blocks for weights of
 * type: block b's QB codes at q + b * q_step, its nm_xblock at meta[b *
 * meta_step]. */
static inline void quantise_row(uint32_t type, const float *x, int64_t n, int8_t *q, int64_t q_step,
                                nm_xblock *meta, int64_t meta_step) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / QB; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + QB * b), v1 = _mm512_loadu_ps(x + QB * b + 16);
        const float amax = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
        float d = amax / 127.0f, id = 0.0f;
        if (!(amax <= FLT_MAX)) /* NaN or infinity */
            d = NAN;
        else if (d >= FLT_MIN)
            id = 1.0f / d;
        else
            d = 0.0f;
        const __m512 idv = _mm512_set1_ps(id);
        /* cvtps rounds to nearest even (the default MXCSR mode) */
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
        _mm_storeu_si128((__m128i *)(q + q_step * b), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + q_step * b + 16), _mm512_cvtepi32_epi8(q1));
        const int32_t s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
        nm_xblock m = {.d = d};
        switch (type) {
        case NM_DTYPE_Q8_0:
            m.c = -128 * (s0 + s1);
            break;
        case NM_DTYPE_Q4_0:
            m.c = -8 * (s0 + s1);
            break;
        case NM_DTYPE_MXFP4:
            m.c = -MX_OFFSET * (s0 + s1);
            break;
        case NM_DTYPE_Q6_K:
            m.c = -32 * s0;
            m.c2 = -32 * s1;
            break;
        default: /* Q4_K, Q5_K */
            m.f = -(d * (float)(s0 + s1));
        }
        meta[b * meta_step] = m;
    }
}

/* Rows [i0, i1) of x over [k0, k0 + kn) into buf: their codes (*xq), then
 * their blocks (*xm), each part n_rows rows long (n_rows >= i1 - i0); the
 * rows past i1 - i0 are zeros. Row by row (rows of kn codes, of kn / QB
 * blocks), or, tiled, by tiles of 16 rows (n_rows a multiple of 16) as
 * AMX's A tiles read them: tile t's block b is its 16 rows' QB codes one
 * after another at *xq + (t * nb + b) * 16 * QB, their blocks at *xm + (t *
 * nb + b) * 16, nb = kn / QB. */
static inline void quantise_rows(uint32_t type, const float *x, int64_t ldx, int64_t i0, int64_t i1,
                                 int64_t n_rows, int64_t k0, int64_t kn, int tiled, uint8_t *buf,
                                 int8_t **xq, nm_xblock **xm) {
    const int64_t nb = kn / QB;
    *xq = (int8_t *)buf;
    *xm = (nm_xblock *)(buf + n_rows * kn);
    if (tiled) {
        NM_ASSERT(n_rows % 16 == 0);
        const int64_t full = (i1 - i0) / 16 * 16; /* rows of whole tiles; the rest is zeroed */
        memset(*xq + full * kn, 0, (size_t)((n_rows - full) * kn));
        memset(*xm + full * nb, 0, (size_t)(n_rows - full) * (size_t)nb * sizeof(nm_xblock));
        for (int64_t i = i0; i < i1; i++) {
            const int64_t t = (i - i0) / 16, r = (i - i0) % 16;
            quantise_row(type, x + i * ldx + k0, kn, *xq + t * 16 * kn + r * QB, 16 * QB,
                         *xm + t * 16 * nb + r, 16);
        }
        return;
    }
    for (int64_t i = i0; i < i1; i++)
        quantise_row(type, x + i * ldx + k0, kn, *xq + (i - i0) * kn, QB, *xm + (i - i0) * nb, 1);
    memset(*xq + (i1 - i0) * kn, 0, (size_t)((n_rows - (i1 - i0)) * kn));
    memset(*xm + (i1 - i0) * nb, 0, (size_t)(n_rows - (i1 - i0)) * (size_t)nb * sizeof(nm_xblock));
}

/* XBUF_BYTES: quantised activation rows of a block in a kernel's stack;
 * XBIG_BYTES: those of a block in the thread's kernel scratch, taken when
 * a product has more rows than the stack holds. Every block of rows
 * unpacks the weights' panels and streams the weights once more: at K =
 * 4096 the stack holds 16 rows (amx) or 24 (avx512vnni), and for amx that
 * cost about what its tile products did. Half of a 2 MiB L2 leaves room
 * for the weights a block of rows meets (docs/PERFORMANCE.md). */
enum { XBUF_BYTES = 160 * 1024, XBIG_BYTES = 1024 * 1024 };

/* The buffer of a block of rows of row_q_bytes each for m rows: the stack
 * buffer (XBUF_BYTES), *rb rows of it (whole granules; it holds one), or,
 * when m rows need more than that and the scratch can be had, the
 * thread's kernel scratch, *rb rows of it (whole granules, no more than m
 * needs). */
static inline uint8_t *xrows_buffer(int64_t m, int64_t row_q_bytes, int64_t granule, uint8_t *stack,
                                    int64_t *rb) {
    int64_t rows = XBUF_BYTES / row_q_bytes / granule * granule;
    NM_ASSERT(rows >= granule);
    *rb = rows;
    if (m <= *rb) return stack;
    const int64_t need = (m + granule - 1) / granule * granule;
    rows = XBIG_BYTES / row_q_bytes / granule * granule;
    if (rows > need) rows = need;
    uint8_t *big = rows > *rb ? nm_kernel_scratch(XBIG_BYTES) : NULL;
    if (!big) return stack;
    *rb = rows;
    return big;
}

/* ---- weights: NC rows of one block, transposed to lanes ---- */

/* The 16 f16 scales at byte offsets off (lanes) from p, as floats. */
ALWAYS_INLINE __m512 gather_f16(const uint8_t *p, __m512i off) {
    const __m512i g = _mm512_i32gather_epi32(off, p, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
}

/* 32 bytes at w + off[c] + at of each of the NC rows, transposed: out[t]
 * lane c is dword t of row c. Register p < 4 starts as [row p | row p + 4],
 * p >= 4 as [row p + 4 | row p + 8]; dword then qword interleaves within
 * 128-bit lanes gather one dword of four rows per lane, z[t] = [t | t + 4
 * of rows 0-3 | t | t + 4 of rows 4-7] (z[t + 4]: rows 8-15), and 128-bit
 * shuffles join them in row order. */
ALWAYS_INLINE void transpose32(const uint8_t *w, const int32_t *off, size_t at, __m512i *out) {
    __m512i z[8], h[8];
    for (int p = 0; p < 8; p++) {
        const int r = p < 4 ? p : p + 4;
        const __m256i lo = _mm256_loadu_si256((const __m256i *)(w + off[r] + at));
        const __m256i hi = _mm256_loadu_si256((const __m256i *)(w + off[r + 4] + at));
        z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    for (int p = 0; p < 8; p += 2) {
        h[p] = _mm512_unpacklo_epi32(z[p], z[p + 1]);
        h[p + 1] = _mm512_unpackhi_epi32(z[p], z[p + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
        z[g] = _mm512_unpacklo_epi64(h[g], h[g + 2]);
        z[g + 1] = _mm512_unpackhi_epi64(h[g], h[g + 2]);
        z[g + 2] = _mm512_unpacklo_epi64(h[g + 1], h[g + 3]);
        z[g + 3] = _mm512_unpackhi_epi64(h[g + 1], h[g + 3]);
    }
    for (int t = 0; t < 4; t++) {
        out[t] = _mm512_shuffle_i32x4(z[t], z[t + 4], _MM_SHUFFLE(2, 0, 2, 0));
        out[t + 4] = _mm512_shuffle_i32x4(z[t], z[t + 4], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

ALWAYS_INLINE void load8(const uint8_t *p, __m512i *v) {
    for (int t = 0; t < 8; t++)
        v[t] = _mm512_loadu_si512(p + 64 * t);
}

/* ---- Q8_0, Q4_0 and MXFP4: one block of 32 per fetch. In the panel16
 * layout (panel16.h) a block of the NC rows is their NC scales, then the
 * eight vectors of q8_0_codes or the four of block_nibbles ---- */

/* The codes of the Q8_0 blocks at byte at of the NC rows, + 128 (as
 * unsigned bytes), transposed: q[t] lane c holds codes 4t..4t+3 of row c. */
ALWAYS_INLINE void q8_0_codes(const uint8_t *w, const int32_t *off, size_t at, __m512i *q) {
    transpose32(w, off, at + 2, q);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int t = 0; t < 8; t++)
        q[t] = _mm512_xor_si512(q[t], flip);
}

/* The 16 bytes of packed nibbles at byte at of the NC rows (a Q4_0 or
 * MXFP4 block's qs): register p starts as [row p | p + 4 | p + 8 | p + 12]
 * (4 dwords each); dword then qword interleaves leave in r[t] dword t of
 * every row in order, whose low nibbles are codes 4t.. and high nibbles
 * 16 + 4t.. */
ALWAYS_INLINE void block_nibbles(const uint8_t *w, const int32_t *off, size_t at, __m512i *r) {
    for (int p = 0; p < 4; p++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(w + off[p] + at)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(w + off[p + 4] + at)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(w + off[p + 8] + at)), 2);
        r[p] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(w + off[p + 12] + at)), 3);
    }
    const __m512i lo01 = _mm512_unpacklo_epi32(r[0], r[1]),
                  hi01 = _mm512_unpackhi_epi32(r[0], r[1]);
    const __m512i lo23 = _mm512_unpacklo_epi32(r[2], r[3]),
                  hi23 = _mm512_unpackhi_epi32(r[2], r[3]);
    r[0] = _mm512_unpacklo_epi64(lo01, lo23);
    r[1] = _mm512_unpackhi_epi64(lo01, lo23);
    r[2] = _mm512_unpacklo_epi64(hi01, hi23);
    r[3] = _mm512_unpackhi_epi64(hi01, hi23);
}

/* 2^(e - 128) for the E8M0 bytes e (0..255, lanes) as nm_e8m0_half_to_f32
 * gives it: the exponent field e - 1, or for e = 0, 1 the denormals 2^-128,
 * 2^-127 (bit 21 + e of the fraction). Exact: every value is a float. */
ALWAYS_INLINE __m512 e8m0_half(__m512i e) {
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i denormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, denormal));
}

/* Block b of the NC rows: Q8_0 (codes + 128), Q4_0 (codes as unsigned
 * bytes) or MXFP4 (each nibble's value nm_mxfp4_values + MX_OFFSET, looked
 * up 16 at a time by vpshufb). */
ALWAYS_INLINE void fetch_block(uint32_t type, int packed, const wsrc *src, int64_t b,
                               wpanel_block *o) {
    const size_t bytes = type == NM_DTYPE_Q8_0   ? NM_Q8_0_BYTES
                         : type == NM_DTYPE_Q4_0 ? NM_Q4_0_BYTES
                                                 : NM_MXFP4_BYTES;
    const size_t at = (size_t)b * bytes;
    const int mx = type == NM_DTYPE_MXFP4;
    const size_t scale_bytes = mx ? 1 : 2; /* E8M0 or f16 */
    const uint8_t *pb = packed ? src->pk + NC * at : NULL;
    if (packed && mx)
        o->s = e8m0_half(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)pb)));
    else if (packed)
        o->s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pb));
    else if (mx) /* the word from the scale byte on, its low byte */
        o->s = e8m0_half(_mm512_and_si512(_mm512_i32gather_epi32(src->voff, src->w + at, 1),
                                          _mm512_set1_epi32(0xff)));
    else
        o->s = gather_f16(src->w + at, src->voff);
    if (type == NM_DTYPE_Q8_0) {
        if (packed)
            load8(pb + scale_bytes * NC, o->q);
        else
            q8_0_codes(src->w, src->off, at, o->q);
        return;
    }
    __m512i r[4];
    if (packed)
        for (int t = 0; t < 4; t++)
            r[t] = _mm512_loadu_si512(pb + scale_bytes * NC + 64 * t);
    else
        block_nibbles(src->w, src->off, at + scale_bytes, r);
    const __m512i nib = _mm512_set1_epi8(0x0f);
    /* nm_mxfp4_values + MX_OFFSET, in each 128-bit lane */
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    for (int t = 0; t < 4; t++) {
        o->q[t] = _mm512_and_si512(r[t], nib);
        o->q[t + 4] = _mm512_and_si512(_mm512_srli_epi32(r[t], 4), nib);
        if (mx) {
            o->q[t] = _mm512_shuffle_epi8(lut, o->q[t]);
            o->q[t + 4] = _mm512_shuffle_epi8(lut, o->q[t + 4]);
        }
    }
}

/* The 32-bit words at byte at of the NC rows (lanes). */
ALWAYS_INLINE __m512i gather32(const uint8_t *w, __m512i voff, size_t at) {
    return _mm512_i32gather_epi32(voff, w + at, 1);
}

ALWAYS_INLINE __m512 half_lo(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }

/* Sub-block scales and mins of a Q4_K/Q5_K super-block from its first 16
 * bytes as four words per lane (dd: d and dmin; a0..a2: the 12 bytes of
 * nm_k4_scale_min): ds[j] = dk * sc_j, ms[j] = dmin * mn_j (as the
 * dequantisation rounds them). Byte j of a0 holds sc_j (j < 4) and the top
 * bits of sc_{j+4} in bits 6-7; a1 the same for the mins; byte j of a2 the
 * low nibbles of sc_{j+4} (low) and mn_{j+4} (high). */
ALWAYS_INLINE void k4_scales(__m512i dd, __m512i a0, __m512i a1, __m512i a2, __m512 *ds,
                             __m512 *ms) {
    const __m512 dk = half_lo(dd), dmin = half_lo(_mm512_srli_epi32(dd, 16));
    const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
    for (int j = 0; j < 4; j++) {
        const __m512i sc_lo = _mm512_and_si512(_mm512_srli_epi32(a0, 8 * j), m6);
        const __m512i mn_lo = _mm512_and_si512(_mm512_srli_epi32(a1, 8 * j), m6);
        const __m512i sc_hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32(a2, 8 * j), m4),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a0, 8 * j + 6), m2), 4));
        const __m512i mn_hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32(a2, 8 * j + 4), m4),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a1, 8 * j + 6), m2), 4));
        ds[j] = _mm512_mul_ps(dk, _mm512_cvtepi32_ps(sc_lo));
        ms[j] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn_lo));
        ds[j + 4] = _mm512_mul_ps(dk, _mm512_cvtepi32_ps(sc_hi));
        ms[j + 4] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn_hi));
    }
}

/* ---- K-quants: their units and parts as panel16.h gives them ---- */

/* The scales of super-block sb's eight units into o[u].s and o[u].aux;
 * for Q5_K also its qh bytes transposed into h[8]. packed: from src->pk. */
ALWAYS_INLINE void kq_scales(uint32_t type, int packed, const wsrc *src, int64_t sb,
                             wpanel_block *o, __m512i *h) {
    const size_t at = (size_t)sb * kq_bytes(type);
    const uint8_t *pb = packed ? src->pk + NC * at : NULL; /* scales first */
    if (type != NM_DTYPE_Q6_K) {
        __m512i dd, a0, a1, a2;
        if (packed) {
            dd = _mm512_loadu_si512(pb);
            a0 = _mm512_loadu_si512(pb + 64);
            a1 = _mm512_loadu_si512(pb + 128);
            a2 = _mm512_loadu_si512(pb + 192);
        } else {
            dd = gather32(src->w, src->voff, at);
            a0 = gather32(src->w, src->voff, at + 4);
            a1 = gather32(src->w, src->voff, at + 8);
            a2 = gather32(src->w, src->voff, at + 12);
        }
        __m512 ds[8], ms[8];
        k4_scales(dd, a0, a1, a2, ds, ms);
        for (int j = 0; j < 8; j++) {
            o[j].s = ds[j];
            o[j].aux = _mm512_castps_si512(ms[j]);
        }
        if (type == NM_DTYPE_Q5_K) {
            if (packed)
                load8(pb + pk_high_at(type, 0), h);
            else
                transpose32(src->w, src->off, at + kq_high_at(type, 0), h);
        }
        return;
    }
    /* Q6_K: unit u uses scales 2u and 2u + 1, kept as the pair of int16
     * (sc1 & 0xffff) | sc2 << 16 */
    if (packed) {
        const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pb + PK_Q6_D)));
        for (int u = 0; u < 8; u++) {
            o[u].aux = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(pb + 2 * NC * u)));
            o[u].s = dk;
        }
        return;
    }
    /* in the file dk is the last two bytes (read the word ending there);
     * the scales of unit u are bytes 2u % 4 and 2u % 4 + 1 of scale word
     * 2u / 4 */
    const __m512 dk =
        half_lo(_mm512_srli_epi32(gather32(src->w, src->voff, at + NM_Q6_K_BYTES - 4), 16));
    for (int u = 0; u < 8; u++) {
        const int k = 2 * u;
        const __m512i wsc = gather32(src->w, src->voff, at + 192 + 4 * (k / 4));
        const __m512i s1 = _mm512_srai_epi32(_mm512_slli_epi32(wsc, 24 - 8 * (k % 4)), 24);
        const __m512i s2 = _mm512_srai_epi32(_mm512_slli_epi32(wsc, 16 - 8 * (k % 4)), 24);
        o[u].aux = _mm512_or_si512(_mm512_and_si512(s1, _mm512_set1_epi32(0xffff)),
                                   _mm512_slli_epi32(s2, 16));
        o[u].s = dk;
    }
}

/* The codes of part p of super-block sb: units kq_unit(type, p, 0) into q0
 * and kq_unit(type, p, 1) into q1.
 * Q4_K: sub-block pair p reads qs[32p..], low nibbles for sub-block 2p, high
 *   ones for 2p + 1.
 * Q5_K: as Q4_K, plus 16 where bit j of qh[l] is set (element l of
 *   sub-block j; h: qh transposed).
 * Q6_K: in half h, unit g takes the low (g < 2) or high nibbles of
 *   ql[64h + 32 (g & 1)..] and bits 2g..2g+1 of qh[32h..] above them. */
ALWAYS_INLINE void kq_codes(uint32_t type, int packed, const wsrc *src, int64_t sb, int p,
                            const __m512i *h, __m512i *q0, __m512i *q1) {
    const size_t at = (size_t)sb * kq_bytes(type);
    const uint8_t *pb = packed ? src->pk + NC * at : NULL;
    const __m512i nib = _mm512_set1_epi8(0x0f);
    __m512i v[8];
    if (packed)
        load8(pb + pk_codes_at(type, p), v);
    else
        transpose32(src->w, src->off, at + kq_codes_at(type, p), v);
    if (type == NM_DTYPE_Q6_K) {
        const int j = p % 2;
        __m512i hq[8];
        if (packed)
            load8(pb + pk_high_at(type, p), hq);
        else
            transpose32(src->w, src->off, at + kq_high_at(type, p), hq);
        const __m512i top = _mm512_set1_epi8(0x30);
        for (int t = 0; t < 8; t++) {
            /* bits 2g, 2g + 1 of each qh byte moved to bits 4, 5 (g = j, j + 2) */
            const __m512i h0 = _mm512_slli_epi32(hq[t], 4 - 2 * j);
            const __m512i h1 = j == 0 ? hq[t] : _mm512_srli_epi32(hq[t], 2);
            q0[t] = _mm512_or_si512(_mm512_and_si512(v[t], nib), _mm512_and_si512(h0, top));
            q1[t] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(v[t], 4), nib),
                                    _mm512_and_si512(h1, top));
        }
        return;
    }
    for (int t = 0; t < 8; t++) {
        q0[t] = _mm512_and_si512(v[t], nib);
        q1[t] = _mm512_and_si512(_mm512_srli_epi32(v[t], 4), nib);
        if (type == NM_DTYPE_Q5_K) {
            /* bit j of each qh byte moved to bit 4, j = 2p, 2p + 1 */
            const __m512i bit4 = _mm512_set1_epi8(0x10);
            const __m512i h0 = 2 * p <= 4 ? _mm512_slli_epi32(h[t], 4 - 2 * p)
                                          : _mm512_srli_epi32(h[t], 2 * p - 4);
            const __m512i h1 = 2 * p + 1 <= 4 ? _mm512_slli_epi32(h[t], 3 - 2 * p)
                                              : _mm512_srli_epi32(h[t], 2 * p - 3);
            q0[t] = _mm512_or_si512(q0[t], _mm512_and_si512(h0, bit4));
            q1[t] = _mm512_or_si512(q1[t], _mm512_and_si512(h1, bit4));
        }
    }
}

/* Super-block sb of a K-quant into o[8]. */
ALWAYS_INLINE void fetch_kq(uint32_t type, int packed, const wsrc *src, int64_t sb,
                            wpanel_block *o) {
    __m512i h[8];
    kq_scales(type, packed, src, sb, o, h);
    for (int p = 0; p < 4; p++)
        kq_codes(type, packed, src, sb, p, h, o[kq_unit(type, p, 0)].q, o[kq_unit(type, p, 1)].q);
}

/* Fetch g (block or super-block) of the NC rows into o[units_per_fetch]. */
ALWAYS_INLINE void fetch(uint32_t type, int packed, const wsrc *src, int64_t g, wpanel_block *o) {
    if (is_block32(type))
        fetch_block(type, packed, src, g, o);
    else
        fetch_kq(type, packed, src, g, o);
}

/* CALL(T) for the quantised type `type` with T a constant, so that an
 * always-inline kernel is specialised per type; other types assert. */
#define NM_VNNI_FOR_EACH_QTYPE(type, CALL)                                                         \
    do {                                                                                           \
        switch (type) {                                                                            \
        case NM_DTYPE_Q8_0:                                                                        \
            CALL(NM_DTYPE_Q8_0);                                                                   \
            break;                                                                                 \
        case NM_DTYPE_Q4_0:                                                                        \
            CALL(NM_DTYPE_Q4_0);                                                                   \
            break;                                                                                 \
        case NM_DTYPE_Q4_K:                                                                        \
            CALL(NM_DTYPE_Q4_K);                                                                   \
            break;                                                                                 \
        case NM_DTYPE_Q5_K:                                                                        \
            CALL(NM_DTYPE_Q5_K);                                                                   \
            break;                                                                                 \
        case NM_DTYPE_Q6_K:                                                                        \
            CALL(NM_DTYPE_Q6_K);                                                                   \
            break;                                                                                 \
        case NM_DTYPE_MXFP4:                                                                       \
            CALL(NM_DTYPE_MXFP4);                                                                  \
            break;                                                                                 \
        default:                                                                                   \
            NM_ASSERT(!"not a type the int8 kernels quantise for");                                \
        }                                                                                          \
    } while (0)

/* The NC weight rows of a panel from output row j on, for the slice of K
 * from k0: lane c is row jl + c; a whole group of the panel16 layout (rows
 * below n_grouped), of which [j, je) are wanted, or the file's rows [j, je)
 * (je <= j1); cmask: the wanted lanes; wj: row jl in w. */
typedef struct wrows {
    int64_t jl, je;
    __mmask16 cmask;
    const uint8_t *wj;
    wsrc src;
} wrows;

/* off: [NC] storage for the lanes' byte offsets (src.off points to it). */
ALWAYS_INLINE wrows panel_rows(uint32_t type, const nm_mat *w, int64_t n_grouped, int64_t j,
                               int64_t j1, int64_t k0, int32_t *off) {
    wrows r;
    const int grouped = j < n_grouped;
    r.jl = grouped ? j / NC * NC : j;
    r.je = r.jl + NC < j1 ? r.jl + NC : j1;
    const int ct = (int)(r.je - r.jl);
    for (int c = 0; c < NC; c++) /* lanes past ct repeat the last row */
        off[c] = (int32_t)((size_t)(c < ct ? c : ct - 1) * w->row_bytes);
    r.wj = (const uint8_t *)w->data + (size_t)r.jl * w->row_bytes;
    const size_t at = (size_t)(k0 / (QB * units_per_fetch(type))) * fetch_bytes(type);
    r.src = (wsrc){.w = r.wj + at,
                   .off = off,
                   .voff = _mm512_loadu_si512(off),
                   .pk = grouped ? r.wj + NC * at : NULL};
    r.cmask = (__mmask16)(((1u << ct) - 1) & ~((1u << (j - r.jl)) - 1));
    return r;
}

/* The n_fetch fetches of a panel's rows (src) into panel. */
ALWAYS_INLINE void fill_panel(uint32_t type, const wsrc *src, int64_t n_fetch,
                              wpanel_block *panel) {
    for (int64_t g = 0; g < n_fetch; g++) {
        if (src->pk)
            fetch(type, 1, src, g, &panel[g * units_per_fetch(type)]);
        else
            fetch(type, 0, src, g, &panel[g * units_per_fetch(type)]);
    }
}

#endif /* NM_KERNELS_X86_VNNI_BLOCKS_H */
