/* The avx2 variant's matmul for quantised weights (Q8_0, Q4_0, Q4_K, Q5_K,
 * Q6_K) on CPUs without AVX-512: activations quantised to int8 blocks of 32
 * and multiplied with vpmaddubsw + vpmaddwd, as llama.cpp does on such
 * CPUs. It keeps avx512vnni's contract (the top of avx512vnni.c): the same
 * codes and block scales, the same exact integer sum per unit of 32 weights,
 * scaled and added in the same float order, so the two variants give the
 * same bits. F32, F16, BF16 and MXFP4 weights go to avx2.c's float path.
 * Compiled with -mavx2 -mfma -mf16c; only called when CPUID reports them.
 *
 * As in avx512vnni, one 32-bit lane per weight row (lane c of q[t] holds
 * codes 4t..4t+3 of row c), NC = 8 rows at a time: transposed from the
 * file's rows, or read from the panel16 layout (panel16.h) that
 * nm_mat_repack makes at load, half a group's 64-byte vectors at a time.
 * For more than RT_MAX activation rows a slice of K of the weights is
 * unpacked once into a panel that every register tile reads; fewer rows
 * (decoding) read them as they go. A tile broadcasts 4 activation codes at
 * a time. vpmaddubsw
 * multiplies unsigned bytes (weights) by signed ones (activations) and adds
 * pairs into saturating int16; the bounds below keep every int16 exact, so
 * the int32 sums equal avx512vnni's:
 *   activation codes lie in [-127, 127] (|x| / d <= 127 rounds to 127 at
 *   most), so a pair is at most 2 * 127 * w_max: Q4_0/Q4_K (w <= 15) 3810,
 *   eight pairs summed in int16 30480; Q5_K (w <= 31) 7874, four summed
 *   31496; Q6_K (w <= 63) 16002, two summed 32004; all below 32767.
 *   Q8_0 codes are signed: |w| (0..128, 128 for -128 read as unsigned) times
 *   the activation with w's sign (vpsignb; |q| <= 127 negates exactly), a
 *   pair at most 2 * 128 * 127 = 32512, widened to int32 at once. From a
 *   panel, where |w| and the mask m (-1 where w < 0) are made once for every
 *   row tile, the activation is flipped instead: q ^ m, which is q or
 *   -q - 1, times |w|, so w q = |w| (q ^ m) + |w| [w < 0], the last sum a
 *   constant of the weights per unit (q8_panel_unit) that starts the int32
 *   sum; the same integer, so the same bits. vpxor runs on every vector
 *   pipe where vpsignb has two (Zen 3: 512 x 768 x 2048 in 0.92 the time).
 *   q ^ m lies in [-128, 126]: a pair lies in [-32768, 32512]. */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"
#include "panel16.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* QB: elements per activation block; NC: weight rows per register (lanes;
 * half a group of the panel16 layout); RT_MAX: activation rows per register
 * tile (RT_MAX float and up to 3 RT_MAX integer accumulators + weights and
 * codes fit the 16 registers). */
enum { QB = PANEL_UNIT, NC = 8, RT_MAX = 4 };
/* Stack buffers per call (168 KiB, no heap): the quantised activation rows
 * of a row block over a slice of K (at most KC elements where a panel is
 * filled, KC_DIRECT where the tiles read the weights), and one panel of NC
 * weight rows over a slice (40 KiB). */
enum { XBUF_BYTES = 128 * 1024, KC = 4096, KC_DIRECT = 65536 };
/* Q8_0's slices in a panel, whose units take two blocks each: 32 units,
 * 20 KiB, which stay in L1 beside the row tiles' codes (with slices of 2048
 * the panel spills to L2: 512 x 768 x 2048 took 2% longer on Zen 3). */
enum { KC_Q8_0 = 1024 };

/* One unit of NC weight rows: q[t] lane c holds codes 4t..4t+3 of row c
 * (Q8_0 signed, the others unsigned as stored); s lane c the scale (dw;
 * dk * sc for Q4_K/Q5_K; dk for Q6_K); aux lane c dmin * mn as float bits
 * (Q4_K, Q5_K) or the sub-block scales sc1 | sc2 << 16 (Q6_K). */
typedef struct wblock {
    __m256i q[8];
    __m256 s;
    __m256i aux;
} wblock;

/* ---- activations: avx512vnni's quantisation on 8 lanes ---- */

/* n (a multiple of QB) values of x into codes q[n] and blocks meta[n / QB]. */
static void quantise_row(uint32_t type, const float *x, int64_t n, int8_t *q, nm_xblock *meta) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    /* packs leave the four vectors' dwords interleaved by 128-bit lane */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / QB; b++) {
        __m256 v[4];
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_loadu_ps(x + QB * b + 8 * i);
        /* the largest magnitude (max is exact in any order) */
        const __m256 a = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        float id;
        const float d = nm_int8_block_scale(amax, &id);
        const __m256 idv = _mm256_set1_ps(id);
        __m256i qi[4];
        for (int i = 0; i < 4; i++) /* nearest even (the default MXCSR mode) */
            qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv));
        const __m256i p =
            _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        _mm256_storeu_si256((__m256i *)(q + QB * b), _mm256_permutevar8x32_epi32(p, order));
        int32_t s[2] = {0, 0};
        for (int half = 0; half < 2 && type != NM_DTYPE_Q8_0; half++) { /* Q8_0: no sums */
            const __m256i s8 = _mm256_add_epi32(qi[2 * half], qi[2 * half + 1]);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
            s[half] = _mm_cvtsi128_si32(s4);
        }
        nm_xblock m = {.d = d};
        switch (type) {
        case NM_DTYPE_Q8_0:
            break;
        case NM_DTYPE_Q4_0:
            m.c = -8 * (s[0] + s[1]);
            break;
        case NM_DTYPE_Q6_K:
            m.c = -32 * s[0];
            m.c2 = -32 * s[1];
            break;
        default: /* Q4_K, Q5_K */
            m.f = -(d * (float)(s[0] + s[1]));
        }
        meta[b] = m;
    }
}

/* ---- weights: NC rows into lanes ---- */

/* Where a tile's NC weight rows come from, from the slice's first fetch:
 * the file's rows r[c], or, when pk is set, half `half` of a group of the
 * panel16 layout (its rows 8 half.. 8 half + 7). */
typedef struct wsrc {
    const uint8_t *r[NC];
    const uint8_t *pk;
    int half;
} wsrc;

/* 16 bytes at r[c] + at of the NC rows: out[t] lane c is dword t of row c.
 * Register p holds [row p | row p + 4]; dword then qword interleaves within
 * the 128-bit halves finish the 4 x 4 transposes. */
ALWAYS_INLINE void transpose16(const uint8_t *const *r, size_t at, __m256i *out) {
    __m256i z[4];
    for (int p = 0; p < 4; p++)
        z[p] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(r[p] + at))),
            _mm_loadu_si128((const __m128i *)(r[p + 4] + at)), 1);
    const __m256i a0 = _mm256_unpacklo_epi32(z[0], z[1]), a1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i a2 = _mm256_unpacklo_epi32(z[2], z[3]), a3 = _mm256_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm256_unpacklo_epi64(a0, a2);
    out[1] = _mm256_unpackhi_epi64(a0, a2);
    out[2] = _mm256_unpacklo_epi64(a1, a3);
    out[3] = _mm256_unpackhi_epi64(a1, a3);
}

ALWAYS_INLINE void transpose32(const uint8_t *const *r, size_t at, __m256i *out) {
    transpose16(r, at, out);
    transpose16(r, at + 16, out + 4);
}

/* The f16 at r[c] + at of the NC rows, as floats. */
ALWAYS_INLINE __m256 f16_lanes(const uint8_t *const *r, size_t at) {
    uint16_t h[NC];
    for (int c = 0; c < NC; c++)
        memcpy(&h[c], r[c] + at, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* The low 16 bits of each lane as an f16, widened. */
ALWAYS_INLINE __m256 half_lo(__m256i v) {
    const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    const __m256i p =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, lo), _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(p));
}

/* In the panel16 layout: half h of the 64-byte vector at p; of the 8 at p;
 * of the 16 f16 at p, as floats. */
ALWAYS_INLINE __m256i pk_vec(const uint8_t *p, int h) {
    return _mm256_loadu_si256((const __m256i *)(p + 32 * h));
}
ALWAYS_INLINE void pk_vec8(const uint8_t *p, int h, __m256i *v) {
    for (int t = 0; t < 8; t++)
        v[t] = pk_vec(p + 64 * t, h);
}
ALWAYS_INLINE __m256 pk_f16(const uint8_t *p, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
}

/* The 8 vectors of 32 bytes of each row in the fetch at byte at of the
 * rows: transposed from the file's (the bytes at + file_at), or read from
 * the panel16 layout (at pk_at of its fetch). */
ALWAYS_INLINE void vec8(const wsrc *src, int packed, size_t at, size_t file_at, size_t pk_at,
                        __m256i *v) {
    if (packed)
        pk_vec8(src->pk + PANEL_ROWS * at + pk_at, src->half, v);
    else
        transpose32(src->r, at + file_at, v);
}

/* Q4_K/Q5_K: the eight units' scales (o[u].s = dk * sc_u, o[u].aux =
 * dmin * mn_u, rounded as the dequantisation rounds them) from dword t of
 * each row's super-block in hd[t]: d and dmin, then the 12 scale bytes
 * (nm_k4_scale_min) as a0, a1, a2: byte j of a0 holds sc_j (j < 4) and the
 * top bits of sc_{j+4} in bits 6-7, a1 the same for the mins, byte j of a2
 * the low nibbles of sc_{j+4} and mn_{j+4}. */
ALWAYS_INLINE void k4_scales(const __m256i *hd, wblock *o) {
    const __m256 dk = half_lo(hd[0]), dmin = half_lo(_mm256_srli_epi32(hd[0], 16));
    const __m256i m6 = _mm256_set1_epi32(63), m4 = _mm256_set1_epi32(15), m2 = _mm256_set1_epi32(3);
    for (int j = 0; j < 4; j++) {
        const __m256i sc_lo = _mm256_and_si256(_mm256_srli_epi32(hd[1], 8 * j), m6);
        const __m256i mn_lo = _mm256_and_si256(_mm256_srli_epi32(hd[2], 8 * j), m6);
        const __m256i sc_hi = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi32(hd[3], 8 * j), m4),
            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hd[1], 8 * j + 6), m2), 4));
        const __m256i mn_hi = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi32(hd[3], 8 * j + 4), m4),
            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hd[2], 8 * j + 6), m2), 4));
        o[j].s = _mm256_mul_ps(dk, _mm256_cvtepi32_ps(sc_lo));
        o[j].aux = _mm256_castps_si256(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn_lo)));
        o[j + 4].s = _mm256_mul_ps(dk, _mm256_cvtepi32_ps(sc_hi));
        o[j + 4].aux = _mm256_castps_si256(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn_hi)));
    }
}

/* Fetch g of the NC rows (packed: from the panel16 layout) into
 * o[units_per_fetch]: its scales and its codes as the tiles read them. */
ALWAYS_INLINE void fetch(uint32_t type, int packed, const wsrc *src, int64_t g, wblock *o) {
    const size_t at = (size_t)g * fetch_bytes(type);
    const uint8_t *pb = packed ? src->pk + PANEL_ROWS * at : NULL;
    const int h = src->half;
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i v[8];
    switch (type) {
    case NM_DTYPE_Q8_0: /* the layout's codes are + 128: flipped back */
        o->s = packed ? pk_f16(pb, h) : f16_lanes(src->r, at);
        vec8(src, packed, at, 2, 2 * PANEL_ROWS, o->q);
        if (packed)
            for (int t = 0; t < 8; t++)
                o->q[t] = _mm256_xor_si256(o->q[t], _mm256_set1_epi8((char)0x80));
        return;
    case NM_DTYPE_Q4_0: /* element l: low nibble of qs[l], l + 16: its high one */
        if (packed) {
            o->s = pk_f16(pb, h);
            for (int t = 0; t < 4; t++)
                v[t] = pk_vec(pb + 2 * PANEL_ROWS + 64 * t, h);
        } else {
            o->s = f16_lanes(src->r, at);
            transpose16(src->r, at + 2, v);
        }
        for (int t = 0; t < 4; t++) {
            o->q[t] = _mm256_and_si256(v[t], nib);
            o->q[t + 4] = _mm256_and_si256(_mm256_srli_epi16(v[t], 4), nib);
        }
        return;
    case NM_DTYPE_Q4_K:
    case NM_DTYPE_Q5_K: {
        /* part p reads qs[32p..], low nibbles for sub-block 2p, high ones
         * for 2p + 1; Q5_K adds 16 where bit j of qh[l] is set (element l
         * of sub-block j) */
        __m256i hd[4], hb[8];
        if (packed)
            for (int i = 0; i < 4; i++)
                hd[i] = pk_vec(pb + 64 * i, h);
        else
            transpose16(src->r, at, hd);
        k4_scales(hd, o);
        if (type == NM_DTYPE_Q5_K)
            vec8(src, packed, at, kq_high_at(type, 0), pk_high_at(type, 0), hb);
        const __m256i bit4 = _mm256_set1_epi8(0x10);
        for (int p = 0; p < 4; p++) {
            vec8(src, packed, at, kq_codes_at(type, p), pk_codes_at(type, p), v);
            for (int t = 0; t < 8; t++) {
                __m256i q0 = _mm256_and_si256(v[t], nib);
                __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(v[t], 4), nib);
                if (type == NM_DTYPE_Q5_K) {
                    /* bit j of each qh byte moved to bit 4 (j = 2p, 2p + 1;
                     * shifts within a dword move no other byte's bit there) */
                    const __m256i h0 = 2 * p <= 4 ? _mm256_slli_epi32(hb[t], 4 - 2 * p)
                                                  : _mm256_srli_epi32(hb[t], 2 * p - 4);
                    const __m256i h1 = 2 * p + 1 <= 4 ? _mm256_slli_epi32(hb[t], 3 - 2 * p)
                                                      : _mm256_srli_epi32(hb[t], 2 * p - 3);
                    q0 = _mm256_or_si256(q0, _mm256_and_si256(h0, bit4));
                    q1 = _mm256_or_si256(q1, _mm256_and_si256(h1, bit4));
                }
                o[kq_unit(type, p, 0)].q[t] = q0;
                o[kq_unit(type, p, 1)].q[t] = q1;
            }
        }
        return;
    }
    default: { /* Q6_K */
        /* unit u uses scales 2u and 2u + 1, kept as the pair of int16
         * (sc1 & 0xffff) | sc2 << 16 */
        if (packed) {
            const __m256 dk = pk_f16(pb + PK_Q6_D, h);
            for (int u = 0; u < 8; u++) {
                o[u].aux = _mm256_cvtepi8_epi16(
                    _mm_loadu_si128((const __m128i *)(pb + 2 * PANEL_ROWS * u + 16 * h)));
                o[u].s = dk;
            }
        } else {
            /* in the file: bytes 2u % 4 and 2u % 4 + 1 of scale word u / 2;
             * dk the last two bytes */
            __m256i sw[4];
            transpose16(src->r, at + 192, sw);
            const __m256 dk = f16_lanes(src->r, at + NM_Q6_K_BYTES - 2);
            for (int u = 0; u < 8; u++) {
                const int k = 2 * u;
                const __m256i s1 =
                    _mm256_srai_epi32(_mm256_slli_epi32(sw[k / 4], 24 - 8 * (k % 4)), 24);
                const __m256i s2 =
                    _mm256_srai_epi32(_mm256_slli_epi32(sw[k / 4], 16 - 8 * (k % 4)), 24);
                o[u].aux = _mm256_or_si256(_mm256_and_si256(s1, _mm256_set1_epi32(0xffff)),
                                           _mm256_slli_epi32(s2, 16));
                o[u].s = dk;
            }
        }
        /* in half hh, unit g takes the low (g < 2) or high nibbles of
         * ql[64hh + 32 (g & 1)..] and bits 2g..2g+1 of qh[32hh..] above
         * them: part p = 2hh + j gives units g = j and j + 2 */
        const __m256i top = _mm256_set1_epi8(0x30);
        for (int hh = 0; hh < 2; hh++) {
            __m256i hq[8];
            vec8(src, packed, at, kq_high_at(type, 2 * hh), pk_high_at(type, 2 * hh), hq);
            for (int j = 0; j < 2; j++) {
                const int p = 2 * hh + j;
                vec8(src, packed, at, kq_codes_at(type, p), pk_codes_at(type, p), v);
                for (int t = 0; t < 8; t++) {
                    const __m256i h0 = _mm256_slli_epi32(hq[t], 4 - 2 * j);
                    const __m256i h1 = j == 0 ? hq[t] : _mm256_srli_epi32(hq[t], 2);
                    o[kq_unit(type, p, 0)].q[t] =
                        _mm256_or_si256(_mm256_and_si256(v[t], nib), _mm256_and_si256(h0, top));
                    o[kq_unit(type, p, 1)].q[t] =
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v[t], 4), nib),
                                        _mm256_and_si256(h1, top));
                }
            }
        }
    }
    }
}

/* Q8_0 units in a panel take two blocks each: o[0] the unit fetched, whose
 * codes become |w| and whose aux lane c the sum of |w| over row c's
 * negative codes, and o[1].q[t] the bytes of -1 where w < 0 (0 elsewhere),
 * which unit_rows' products in a panel use instead of vpsignb (see there). */
enum { Q8_PANEL_BLOCKS = 2 };
ALWAYS_INLINE void q8_panel_unit(wblock *o) {
    const __m256i ones8 = _mm256_set1_epi8(1);
    __m256i c = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        const __m256i w = o[0].q[t], aw = _mm256_abs_epi8(w);
        const __m256i neg = _mm256_cmpgt_epi8(_mm256_setzero_si256(), w);
        /* |w| where w < 0, bytes summed in pairs (at most 256; over the
         * unit at most 2048 in int16), then into fours */
        c = _mm256_add_epi16(c, _mm256_maddubs_epi16(_mm256_and_si256(aw, neg), ones8));
        o[0].q[t] = aw;
        o[1].q[t] = neg;
    }
    o[0].aux = _mm256_madd_epi16(c, _mm256_set1_epi16(1));
}

/* Blocks per unit in a panel. */
ALWAYS_INLINE int panel_blocks(uint32_t type) {
    return type == NM_DTYPE_Q8_0 ? Q8_PANEL_BLOCKS : 1;
}

/* acc[r] += one unit of weights (wb) times activation block b of row r
 * (codes xrow[r] + QB * b, block mrow[r][b]), in avx512vnni's float order;
 * flip: Q8_0's unit from a panel (q8_panel_unit's two blocks). */
ALWAYS_INLINE void unit_rows(uint32_t type, int flip, int rt, const wblock *wb,
                             const int8_t *const *xrow, const nm_xblock *const *mrow, int64_t b,
                             __m256 *acc) {
    /* products summed in int16 before widening (the bounds at the top) */
    const int group = type == NM_DTYPE_Q8_0   ? 1
                      : type == NM_DTYPE_Q6_K ? 2
                      : type == NM_DTYPE_Q5_K ? 4
                                              : 8;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s16[RT_MAX], s32[RT_MAX], first_half[RT_MAX];
    for (int r = 0; r < rt; r++) {
        s16[r] = first_half[r] = _mm256_setzero_si256();
        s32[r] =
            type == NM_DTYPE_Q8_0 && flip ? _mm256_load_si256(&wb->aux) : _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) {
        const __m256i w = _mm256_load_si256(&wb->q[t]);
        const __m256i aw = type == NM_DTYPE_Q8_0 && !flip ? _mm256_abs_epi8(w) : w;
        const __m256i neg = type == NM_DTYPE_Q8_0 && flip ? _mm256_load_si256(&wb[1].q[t]) : w;
        for (int r = 0; r < rt; r++) {
            int32_t x4;
            memcpy(&x4, xrow[r] + QB * b + 4 * t, 4);
            __m256i xv = _mm256_set1_epi32(x4);
            if (type == NM_DTYPE_Q8_0)
                xv = flip ? _mm256_xor_si256(xv, neg) : _mm256_sign_epi8(xv, w);
            const __m256i p = _mm256_maddubs_epi16(aw, xv);
            s16[r] = t % group == 0 ? p : _mm256_add_epi16(s16[r], p);
            /* the sums in this order: gcc otherwise moves every product
             * ahead of them and spills them (16 registers) */
            __asm__("" : "+x"(s16[r]));
            if (t % group == group - 1) {
                s32[r] = _mm256_add_epi32(s32[r], _mm256_madd_epi16(s16[r], ones));
                __asm__("" : "+x"(s32[r]));
            }
        }
        if (type == NM_DTYPE_Q6_K && t == 3)
            for (int r = 0; r < rt; r++) {
                first_half[r] = s32[r];
                s32[r] = _mm256_setzero_si256();
            }
    }
    for (int r = 0; r < rt; r++) {
        const nm_xblock *m = &mrow[r][b];
        __m256i dot;
        if (type == NM_DTYPE_Q6_K) {
            const __m256i s1 = _mm256_srai_epi32(_mm256_slli_epi32(wb->aux, 16), 16);
            const __m256i s2 = _mm256_srai_epi32(wb->aux, 16);
            dot = _mm256_add_epi32(
                _mm256_mullo_epi32(_mm256_add_epi32(first_half[r], _mm256_set1_epi32(m->c)), s1),
                _mm256_mullo_epi32(_mm256_add_epi32(s32[r], _mm256_set1_epi32(m->c2)), s2));
        } else if (type == NM_DTYPE_Q4_0) {
            dot = _mm256_add_epi32(s32[r], _mm256_set1_epi32(m->c));
        } else { /* Q8_0's codes are signed, the K-quants' mins come after */
            dot = s32[r];
        }
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                 _mm256_mul_ps(wb->s, _mm256_set1_ps(m->d)), acc[r]);
        if (type == NM_DTYPE_Q4_K || type == NM_DTYPE_Q5_K)
            acc[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(wb->aux), _mm256_set1_ps(m->f), acc[r]);
    }
}

/* Lines to fetch into L2 while a tile runs: for fetch g, pf_len bytes from
 * at + g * step (none when at is NULL). */
typedef struct prefetch {
    const uint8_t *at;
    size_t step, len;
} prefetch;

/* Share `slot` of n_slots of those lines for fetch g, so that they go out
 * spread over the fetch's units: all at once, they stalled the loop on the
 * misses in flight (one-row Q6_K output head 0.75 the time spread, Zen 3). */
ALWAYS_INLINE void prefetch_part(prefetch pf, int64_t g, int slot, int n_slots) {
    if (!pf.at) return;
    const int n_lines = (int)((pf.len + 63) / 64);
    for (int l = slot * n_lines / n_slots; l < (slot + 1) * n_lines / n_slots; l++)
        _mm_prefetch((const char *)pf.at + (size_t)g * pf.step + 64 * (size_t)l, _MM_HINT_T1);
}

/* rt rows x NC outputs over the nb units of a slice, the weights from a
 * panel, or fetched from src as they are used (packed: from the panel16
 * layout). acc starts at 0 for the first slice of K, else from y (a float
 * stored and reloaded is the same float); cmask: the lanes that are
 * outputs. K-quant units in avx512vnni's order (kq_unit). */
ALWAYS_INLINE void tile(uint32_t type, int rt, const wblock *panel, int packed, const wsrc *src,
                        const int8_t *xq, int64_t ldq, const nm_xblock *xm, int64_t ldm, int64_t nb,
                        float *y, int64_t ldy, __m256i cmask, int first, prefetch pf) {
    enum { G_MAX = NM_QK_K / QB };
    const int g_units = units_per_fetch(type);
    __m256 acc[RT_MAX];
    /* the rows' codes and blocks, one pointer each (with ldq in the
     * addresses gcc keeps every row-and-t offset apart and reloads them) */
    const int8_t *xrow[RT_MAX];
    const nm_xblock *mrow[RT_MAX];
    /* masked moves only where some lanes are not outputs (vmaskmovps
     * stores are slow on AMD's cores) */
    const int full = _mm256_movemask_ps(_mm256_castsi256_ps(cmask)) == 0xff;
    for (int r = 0; r < rt; r++) {
        acc[r] = first  ? _mm256_setzero_ps()
                 : full ? _mm256_loadu_ps(y + r * ldy)
                        : _mm256_maskload_ps(y + r * ldy, cmask);
        xrow[r] = xq + r * ldq;
        mrow[r] = xm + r * ldm;
    }
    for (int64_t g = 0; g < nb / g_units; g++) {
        _Alignas(32) wblock tmp[G_MAX];
        const wblock *wb = panel ? panel + g * g_units * panel_blocks(type) : tmp;
        if (!panel) fetch(type, packed, src, g, tmp);
        for (int ui = 0; ui < g_units; ui++) {
            prefetch_part(pf, g, ui, g_units);
            const int u = g_units > 1 ? kq_unit(type, ui / 2, ui % 2) : 0;
            const int64_t b = g * g_units + u;
            unit_rows(type, panel != NULL, rt, wb + u, xrow, mrow, b, acc);
        }
    }
    for (int r = 0; r < rt; r++)
        if (full)
            _mm256_storeu_ps(y + r * ldy, acc[r]);
        else
            _mm256_maskstore_ps(y + r * ldy, cmask, acc[r]);
}

/* One activation row against a whole group of the panel16 layout (src: its
 * half 0), both halves fetch by fetch, so that each 64-byte vector is read
 * whole, once, and the group's bytes in one ascending stream (a half at a
 * time read every line twice, 50% slower from memory); pf: the lines of
 * the next group. Each output's units in tile()'s order: its bits. */
ALWAYS_INLINE void tile_group(uint32_t type, const wsrc *src, const int8_t *xq,
                              const nm_xblock *xm, int64_t nb, float *y, prefetch pf) {
    enum { G_MAX = NM_QK_K / QB };
    const int g_units = units_per_fetch(type);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    wsrc halves[2] = {*src, *src};
    halves[1].half = 1;
    for (int64_t g = 0; g < nb / g_units; g++) {
        for (int h = 0; h < 2; h++) {
            _Alignas(32) wblock tmp[G_MAX];
            fetch(type, 1, &halves[h], g, tmp);
            for (int ui = 0; ui < g_units; ui++) {
                prefetch_part(pf, g, h * g_units + ui, 2 * g_units);
                const int u = g_units > 1 ? kq_unit(type, ui / 2, ui % 2) : 0;
                unit_rows(type, 0, 1, tmp + u, &xq, &xm, g * g_units + u, &acc[h]);
            }
        }
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + NC, acc[1]);
}

/* Tile heights with constant bounds, so the accumulators live in registers. */
ALWAYS_INLINE void tile_rt(uint32_t type, int rt, const wblock *panel, int packed, const wsrc *src,
                           const int8_t *xq, int64_t ldq, const nm_xblock *xm, int64_t ldm,
                           int64_t nb, float *y, int64_t ldy, __m256i cmask, int first,
                           prefetch pf) {
#define NM_TILE(R) tile(type, R, panel, packed, src, xq, ldq, xm, ldm, nb, y, ldy, cmask, first, pf)
    switch (rt) {
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
    }
#undef NM_TILE
}

/* Outputs [j, je) of w (within one register's NC rows; returns je) for the
 * quantised activation rows [i0, i1) over the slice k0 + [0, kn): with
 * use_panel the slice's weights unpacked once into panel for every tile,
 * else each tile reads them itself. Rows below n_grouped are in the
 * panel16 layout, the register's first row then the first of its half
 * group. */
ALWAYS_INLINE int64_t col_group(uint32_t type, const nm_mat *w, int64_t n_grouped, int64_t j,
                                int64_t j1, int64_t k0, int64_t kn, int64_t i0, int64_t i1,
                                const int8_t *xq, const nm_xblock *xm, int use_panel, wblock *panel,
                                float *y, int64_t ldy) {
    const int64_t fetch_k = QB * units_per_fetch(type), nb = kn / QB;
    const size_t at = (size_t)(k0 / fetch_k) * fetch_bytes(type);
    const int packed = j < n_grouped;
    const int64_t jl = packed ? j / NC * NC : j; /* lane 0's row */
    const size_t fb = fetch_bytes(type);
    if (packed && !use_panel && i1 - i0 == 1 && kn == w->k && j % PANEL_ROWS == 0 &&
        j + PANEL_ROWS <= j1) {
        /* one row against the whole group (tile_group), the next one's
         * lines fetched into L2 meanwhile where it is wanted too */
        const uint8_t *grp = (const uint8_t *)w->data + (size_t)j * w->row_bytes;
        const int next = j + 2 * PANEL_ROWS <= j1 && j + 2 * PANEL_ROWS <= n_grouped;
        const prefetch pf = {.at = next ? grp + (size_t)PANEL_ROWS * w->row_bytes : NULL,
                             .step = PANEL_ROWS * fb,
                             .len = PANEL_ROWS * fb};
        const wsrc src = {.pk = grp, .half = 0};
        tile_group(type, &src, xq, xm, kn / QB, y + i0 * ldy + j, pf);
        return j + PANEL_ROWS;
    }
    const int64_t je = jl + NC < j1 ? jl + NC : j1;
    wsrc src = {.pk = NULL};
    if (packed) {
        src.pk = (const uint8_t *)w->data + (size_t)(jl / PANEL_ROWS * PANEL_ROWS) * w->row_bytes +
                 PANEL_ROWS * at;
        src.half = (int)(jl % PANEL_ROWS / NC);
    } else {
        for (int c = 0; c < NC; c++) /* lanes past je repeat the last row */
            src.r[c] = (const uint8_t *)w->data +
                       (size_t)(jl + c < je ? jl + c : je - 1) * w->row_bytes + at;
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i cmask =
        _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(je - jl)), lane),
                         _mm256_cmpgt_epi32(lane, _mm256_set1_epi32((int)(j - jl) - 1)));
    for (int64_t g = 0; g < kn / fetch_k && use_panel; g++) {
        wblock *pg = panel + g * units_per_fetch(type) * panel_blocks(type);
        if (packed)
            fetch(type, 1, &src, g, pg);
        else
            fetch(type, 0, &src, g, pg);
        if (type == NM_DTYPE_Q8_0) q8_panel_unit(pg);
    }
    /* A tile that reads the weights itself (decoding) fetches the next
     * rows into L2 meanwhile, as avx512vnni does (see there): whole rows
     * only (kn == k), where they lie one after another. In the panel16
     * layout those are the next group, whose fetch g each half takes half
     * of; in the file's, the next NC rows. */
    prefetch pf = {.at = NULL};
    const int64_t g0 = jl / PANEL_ROWS * PANEL_ROWS; /* the group's first row */
    if (!use_panel && kn == w->k && packed && g0 + 2 * PANEL_ROWS <= j1 &&
        g0 + 2 * PANEL_ROWS <= n_grouped)
        pf = (prefetch){.at = (const uint8_t *)w->data + (size_t)(g0 + PANEL_ROWS) * w->row_bytes +
                              (size_t)src.half * NC * fb,
                        .step = PANEL_ROWS * fb,
                        .len = NC * fb};
    else if (!use_panel && kn == w->k && !packed && jl + 2 * NC <= j1)
        pf = (prefetch){.at = (const uint8_t *)w->data + (size_t)(jl + NC) * w->row_bytes,
                        .step = NC * fb,
                        .len = NC * fb};
    /* Row tiles over a panel: the next group's slice of the panel16 layout
     * (whose lines both halves read: half 0 fetches the first half of
     * them, half 1 the rest) into L2 meanwhile, a share before each tile,
     * so that the next panel's unpacking does not wait on memory. */
    prefetch next = {.at = NULL};
    const int64_t gn = g0 + PANEL_ROWS;
    if (use_panel && packed && gn + PANEL_ROWS <= n_grouped && gn < j1) {
        const size_t len = PANEL_ROWS * (size_t)(kn / fetch_k) * fb / 2;
        next = (prefetch){.at = (const uint8_t *)w->data + (size_t)gn * w->row_bytes +
                                PANEL_ROWS * at + (size_t)src.half * len,
                          .len = len};
    }
    const int n_tiles = (int)((i1 - i0 + RT_MAX - 1) / RT_MAX);
    for (int64_t i = i0; i < i1; i += RT_MAX) {
        const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
        prefetch_part(next, 0, (int)((i - i0) / RT_MAX), n_tiles);
        const int8_t *xqi = xq + (i - i0) * kn;
        const nm_xblock *xmi = xm + (i - i0) * nb;
        float *yi = y + i * ldy + jl;
        const int first = k0 == 0;
        if (use_panel)
            tile_rt(type, rt, panel, 0, NULL, xqi, kn, xmi, nb, nb, yi, ldy, cmask, first, pf);
        else if (packed)
            tile_rt(type, rt, NULL, 1, &src, xqi, kn, xmi, nb, nb, yi, ldy, cmask, first, pf);
        else
            tile_rt(type, rt, NULL, 0, &src, xqi, kn, xmi, nb, nb, yi, ldy, cmask, first, pf);
    }
    return je;
}

/* y = x w^T over [j0, j1); with w2 (same type, shape and layout as w),
 * also y2 = x w2^T from the same quantised activations, and then, group of
 * columns by group, y = silu(y) * y2 (nm_swiglu_forward) once the last
 * slice of K is summed: the bits of two calls and nm_swiglu_forward. */
ALWAYS_INLINE void matmul_q(uint32_t type, const nm_mat *w, const nm_mat *w2, const float *x,
                            int64_t ldx, int64_t m, float *y, int64_t ldy, float *y2, int64_t ldy2,
                            int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    NM_ASSERT(k % (QB * units_per_fetch(type)) == 0);
    NM_ASSERT(!w2 || nm_matmul_fusable(w, w2));
    /* rows in whole groups of the panel16 layout (0 in the file's) */
    const int64_t n_grouped = w->layout == NM_LAYOUT_PANEL16 ? w->n / PANEL_ROWS * PANEL_ROWS : 0;
    /* Several row tiles share a panel, unpacked once per row block; one
     * tile (m <= RT_MAX) reads the weights as it goes. */
    const int use_panel = m > RT_MAX;
    const int64_t kc_max = !use_panel              ? KC_DIRECT
                           : type == NM_DTYPE_Q8_0 ? KC_Q8_0
                                                   : KC,
                  kc = k < kc_max ? k : kc_max;
    const int64_t row_q_bytes = kc + kc / QB * (int64_t)sizeof(nm_xblock);
    int64_t rb = XBUF_BYTES / row_q_bytes;
    if (rb > RT_MAX) rb = rb / RT_MAX * RT_MAX;
    _Alignas(32) uint8_t xbuf[XBUF_BYTES]; /* [rb][kc] codes, then [rb][kc / QB] blocks */
    _Alignas(32) wblock panel[KC / QB];    /* [kc / QB] units of NC rows (Q8_0: 2 blocks each) */
    _Static_assert(KC_Q8_0 * Q8_PANEL_BLOCKS <= KC, "Q8_0's slice fits the panel");
    for (int64_t k0 = 0; k0 < k; k0 += kc) {
        const int64_t kn = k - k0 < kc ? k - k0 : kc, nb = kn / QB;
        for (int64_t i0 = 0; i0 < m; i0 += rb) {
            const int64_t i1 = i0 + rb < m ? i0 + rb : m;
            int8_t *xq = (int8_t *)xbuf;
            nm_xblock *xm = (nm_xblock *)(xbuf + (i1 - i0) * kn);
            for (int64_t i = i0; i < i1; i++)
                quantise_row(type, x + i * ldx + k0, kn, xq + (i - i0) * kn, xm + (i - i0) * nb);
            for (int64_t j = j0; j < j1;) {
                /* w's columns from j, then w2's, then their SwiGLU */
                const nm_mat *mats[2] = {w, w2};
                float *outs[2] = {y, y2};
                const int64_t ld[2] = {ldy, ldy2};
                int64_t je = j;
                for (int mi = 0; mi < (w2 ? 2 : 1); mi++)
                    je = col_group(type, mats[mi], n_grouped, j, j1, k0, kn, i0, i1, xq, xm,
                                   use_panel, panel, outs[mi], ld[mi]);
                if (w2 && k0 + kn == k) nm_swiglu_block(y, ldy, y2, ldy2, i0, i1, j, je);
                j = je;
            }
        }
    }
}

/* The 8 vectors of the 32 bytes at r[c] + at of the NC rows into half h
 * of the 8 vectors at dst. */
static void put_vec8(const uint8_t *const *r, size_t at, int h, uint8_t *dst) {
    __m256i v[8];
    transpose32(r, at, v);
    for (int t = 0; t < 8; t++)
        _mm256_storeu_si256((__m256i *)(dst + 64 * t + 32 * h), v[t]);
}

/* Rows 8 h.. 8 h + 7 (r) of a group's fetch at byte at into the fetch pb
 * of the panel16 layout: their codes; the scales are pk_put_scales's. */
static void repack_half(uint32_t type, const uint8_t *const *r, size_t at, int h, uint8_t *pb) {
    if (type == NM_DTYPE_Q8_0) { /* codes + 128 after 16 f16 d */
        __m256i v[8];
        transpose32(r, at + 2, v);
        for (int t = 0; t < 8; t++)
            _mm256_storeu_si256((__m256i *)(pb + 2 * PANEL_ROWS + 64 * t + 32 * h),
                                _mm256_xor_si256(v[t], _mm256_set1_epi8((char)0x80)));
    } else if (type == NM_DTYPE_Q4_0) { /* qs after 16 f16 d */
        __m256i v[4];
        transpose16(r, at + 2, v);
        for (int t = 0; t < 4; t++)
            _mm256_storeu_si256((__m256i *)(pb + 2 * PANEL_ROWS + 64 * t + 32 * h), v[t]);
    } else {
        for (int p = 0; p < 4; p++)
            put_vec8(r, at + kq_codes_at(type, p), h, pb + pk_codes_at(type, p));
        const int n_high = type == NM_DTYPE_Q6_K ? 4 : type == NM_DTYPE_Q5_K ? 1 : 0;
        for (int p = 0; p < n_high; p += 2)
            put_vec8(r, at + kq_high_at(type, p), h, pb + pk_high_at(type, p));
    }
}

void nm_avx2_repack(const nm_mat *w, void *dst) {
    const uint32_t type = w->type;
    NM_ASSERT(nm_matmul_avx2_quantises(type) && w->layout == NM_LAYOUT_ROWS);
    NM_ASSERT(w->k % (QB * units_per_fetch(type)) == 0);
    const size_t fb = fetch_bytes(type);
    const int64_t n_fetch = w->k / (QB * units_per_fetch(type));
    const int64_t n_grouped = w->n / PANEL_ROWS * PANEL_ROWS;
    for (int64_t j = 0; j < n_grouped; j += PANEL_ROWS) {
        const uint8_t *rows = (const uint8_t *)w->data + (size_t)j * w->row_bytes;
        uint8_t *out = (uint8_t *)dst + (size_t)j * w->row_bytes;
        for (int64_t f = 0; f < n_fetch; f++) {
            const size_t at = (size_t)f * fb;
            uint8_t *pb = out + PANEL_ROWS * at;
            for (int c = 0; c < PANEL_ROWS; c++)
                pk_put_scales(type, rows + (size_t)c * w->row_bytes + at, c, pb);
            for (int h = 0; h < 2; h++) {
                const uint8_t *r[NC];
                for (int c = 0; c < NC; c++)
                    r[c] = rows + (size_t)(NC * h + c) * w->row_bytes;
                repack_half(type, r, at, h, pb);
            }
        }
    }
    memcpy((uint8_t *)dst + (size_t)n_grouped * w->row_bytes,
           (const uint8_t *)w->data + (size_t)n_grouped * w->row_bytes,
           (size_t)(w->n - n_grouped) * w->row_bytes);
}

bool nm_matmul_avx2_quantises(uint32_t type) {
    return type == NM_DTYPE_Q8_0 || type == NM_DTYPE_Q4_0 || type == NM_DTYPE_Q4_K ||
           type == NM_DTYPE_Q5_K || type == NM_DTYPE_Q6_K;
}

/* Both entry points: w2 NULL (y2 unused) is the plain matmul. */
static void matmul_any(const nm_mat *w, const nm_mat *w2, const float *x, int64_t ldx, int64_t m,
                       float *y, int64_t ldy, float *y2, int64_t ldy2, int64_t j0, int64_t j1) {
    /* matmul_q specialised per type (T a constant) */
#define NM_CASE(T)                                                                                 \
    case T:                                                                                        \
        matmul_q(T, w, w2, x, ldx, m, y, ldy, y2, ldy2, j0, j1);                                   \
        return;
    switch (w->type) {
        NM_CASE(NM_DTYPE_Q8_0)
        NM_CASE(NM_DTYPE_Q4_0)
        NM_CASE(NM_DTYPE_Q4_K)
        NM_CASE(NM_DTYPE_Q5_K)
        NM_CASE(NM_DTYPE_Q6_K)
    default:
        NM_ASSERT(!"not a type avx2 quantises for");
    }
#undef NM_CASE
}

void nm_matmul_avx2_int8_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                                 int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
    if (!nm_matmul_avx2_quantises(w->type)) {
        nm_matmul_avx2_forward(w, x, ldx, m, y, ldy, j0, j1);
        return;
    }
    if (m > 0 && j0 < j1) matmul_any(w, NULL, x, ldx, m, y, ldy, NULL, 0, j0, j1);
}

void nm_matmul_swiglu_avx2_forward(const nm_mat *wg, const nm_mat *wu, const float *x, int64_t ldx,
                                   int64_t m, float *h, int64_t ldh, float *u, int64_t ldu,
                                   int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= wg->n);
    if (m <= 0 || j0 == j1) return;
    if (nm_matmul_avx2_quantises(wg->type) && nm_matmul_fusable(wg, wu)) {
        matmul_any(wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
        return;
    }
    nm_matmul_swiglu_by(nm_matmul_avx2_int8_forward, wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
}
#else
typedef int nm_avx2_int8_unused; /* an empty translation unit is not ISO C */
#endif
