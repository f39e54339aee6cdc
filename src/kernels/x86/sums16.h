/* Horizontal sums of 16-lane float accumulators, for the kernels whose
 * outputs are each one accumulator (avx512, avx512bf16): one order of
 * additions for every output, written out so that no compiler picks
 * another, and the same as GCC's _mm512_reduce_add_ps: the 128-bit quarters
 * as (Q0 + Q2) + (Q1 + Q3), then the four lanes as (e0 + e2) + (e1 + e3).
 * Needs AVX512F and AVX512DQ. */
#ifndef NM_KERNELS_X86_SUMS16_H
#define NM_KERNELS_X86_SUMS16_H

#include <immintrin.h>
#include <stdint.h>

static inline __attribute__((always_inline)) float nm_sum16(__m512 a) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 e = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}

/* y[r * ldy + c] = nm_sum16(acc[r * stride + c]) for r < rt, c < ct (both
 * at most 4). A whole 4 x 4 tile reduces its 16 accumulators together, the
 * same additions per output transposed as they go (45 vector operations
 * where 16 separate sums take 128); other shapes fill the tree with copies
 * of their last accumulators and keep their own outputs. */
static inline __attribute__((always_inline)) void
nm_store_sums4x4(int rt, int ct, const __m512 *acc, int stride, float *y, int64_t ldy) {
    if (rt == 1 && ct == 1) {
        y[0] = nm_sum16(acc[0]);
        return;
    }
    __m512 t[4];
    for (int c = 0; c < 4; c++) {
        const int cc = c < ct ? c : ct - 1;
        __m512 p[2];
        for (int h = 0; h < 2; h++) {
            /* [a02 a13 b02 b13]: a, b the accumulators of rows 2h, 2h + 1 */
            const __m512 a = acc[(2 * h < rt ? 2 * h : rt - 1) * stride + cc];
            const __m512 b = acc[(2 * h + 1 < rt ? 2 * h + 1 : rt - 1) * stride + cc];
            p[h] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
        }
        /* quarter r: the four lanes (Q0 + Q2) + (Q1 + Q3) of row r */
        t[c] = _mm512_add_ps(_mm512_shuffle_f32x4(p[0], p[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(p[0], p[1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    /* per quarter [e0 + e2 of c, of c + 1, e1 + e3 of c, of c + 1] */
    const __m512 v0 = _mm512_add_ps(_mm512_unpacklo_ps(t[0], t[1]), _mm512_unpackhi_ps(t[0], t[1]));
    const __m512 v1 = _mm512_add_ps(_mm512_unpacklo_ps(t[2], t[3]), _mm512_unpackhi_ps(t[2], t[3]));
    /* quarter r: the sums of row r, columns 0..3 */
    const __m512 z = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(v0), _mm512_castps_pd(v1))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(v0), _mm512_castps_pd(v1))));
    const __m128 rows[4] = {_mm512_castps512_ps128(z), _mm512_extractf32x4_ps(z, 1),
                            _mm512_extractf32x4_ps(z, 2), _mm512_extractf32x4_ps(z, 3)};
    for (int r = 0; r < rt; r++) {
        if (ct == 4)
            _mm_storeu_ps(y + r * ldy, rows[r]);
        else
            _mm_mask_storeu_ps(y + r * ldy, (__mmask8)((1u << ct) - 1), rows[r]);
    }
}

#endif
