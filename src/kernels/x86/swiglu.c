/* nm_swiglu_forward with AVX2 vectors, for avx2 and every AVX-512 variant:
 * e^-g as kernels-impl.h describes it, four doubles at a time, with the
 * operations of ref/ref.c's exp_ref in the same order (no -mfma here, so
 * none is fused), then g / (1 + e) * u in float as ref.c does: the same
 * bits. */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"

#include <immintrin.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* e^x for four floats, as doubles; NaN stays NaN (max and min return
 * their second operand when one is NaN). */
ALWAYS_INLINE __m128 exp4(__m128 x) {
    __m256d xd = _mm256_cvtps_pd(x);
    xd = _mm256_min_pd(_mm256_set1_pd(NM_EXP_CLAMP),
                       _mm256_max_pd(_mm256_set1_pd(-NM_EXP_CLAMP), xd));
    const __m256d z = _mm256_mul_pd(xd, _mm256_set1_pd(NM_EXP_LOG2E));
    const __m256d shifted = _mm256_add_pd(z, _mm256_set1_pd(NM_EXP_SHIFT));
    const __m256d kd = _mm256_sub_pd(shifted, _mm256_set1_pd(NM_EXP_SHIFT));
    const __m256d f = _mm256_sub_pd(z, kd);
    __m256d p = _mm256_set1_pd(nm_exp_poly[0]);
    for (int i = 1; i < 11; i++)
        p = _mm256_add_pd(_mm256_mul_pd(p, f), _mm256_set1_pd(nm_exp_poly[i]));
    const __m256i bits = _mm256_slli_epi64(
        _mm256_add_epi64(_mm256_castpd_si256(shifted), _mm256_set1_epi64x(1023)), 52);
    return _mm256_cvtpd_ps(_mm256_mul_pd(p, _mm256_castsi256_pd(bits)));
}

/* e^-g of four elements of g */
ALWAYS_INLINE __m128 exp_neg4(const float *g) {
    return exp4(_mm_xor_ps(_mm_loadu_ps(g), _mm_set1_ps(-0.0f)));
}

/* h = g / (1 + e) * u for four elements, e = e^-g */
ALWAYS_INLINE void put4(const float *g, const float *u, __m128 e, float *h) {
    _mm_storeu_ps(h, _mm_mul_ps(_mm_div_ps(_mm_loadu_ps(g), _mm_add_ps(_mm_set1_ps(1.0f), e)),
                                _mm_loadu_ps(u)));
}

void nm_swiglu_avx2_forward(const float *g, const float *u, float *h, int64_t n) {
    int64_t i = 0;
    /* four independent polynomials at a time (each is a chain of 20
     * dependent operations): 1.65 ns per element where one at a time took
     * 2.35 */
    for (; i + 16 <= n; i += 16) {
        __m128 e[4];
        for (int v = 0; v < 4; v++)
            e[v] = exp_neg4(g + i + 4 * v);
        for (int v = 0; v < 4; v++)
            put4(g + i + 4 * v, u + i + 4 * v, e[v], h + i + 4 * v);
    }
    for (; i + 4 <= n; i += 4)
        put4(g + i, u + i, exp_neg4(g + i), h + i);
    if (i < n) nm_swiglu_ref_forward(g + i, u + i, h + i, n - i);
}
#else
typedef int nm_swiglu_unused; /* an empty translation unit is not ISO C */
#endif
