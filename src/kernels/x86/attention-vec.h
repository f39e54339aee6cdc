/* The float vectors attention.c is written in: 8 lanes (AVX2) or, with
 * NM_ATTN_LANES 16, 16 lanes (AVX-512), as one set of names, so that one
 * source gives both builds. Each operation is the same IEEE operation per
 * lane in both widths (the masks are vectors of lanes under AVX2 and mask
 * registers under AVX-512), so a lane computes the same bits in either. */
#ifndef NM_KERNELS_X86_ATTENTION_VEC_H
#define NM_KERNELS_X86_ATTENTION_VEC_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

#if NM_ATTN_LANES == 16
enum { LANES = 16 };
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vm;

ALWAYS_INLINE vf vf_load(const float *p) { return _mm512_load_ps(p); }
ALWAYS_INLINE vf vf_loadu(const float *p) { return _mm512_loadu_ps(p); }
ALWAYS_INLINE void vf_store(float *p, vf v) { _mm512_store_ps(p, v); }
ALWAYS_INLINE void vf_storeu(float *p, vf v) { _mm512_storeu_ps(p, v); }
ALWAYS_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE vf vf_set1(float x) { return _mm512_set1_ps(x); }
ALWAYS_INLINE vf vf_bcast(const float *p) { return _mm512_set1_ps(*p); }
ALWAYS_INLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
ALWAYS_INLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
ALWAYS_INLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
ALWAYS_INLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
ALWAYS_INLINE vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
ALWAYS_INLINE vf vf_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
ALWAYS_INLINE vf vf_round(vf a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ALWAYS_INLINE vm vf_lt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
ALWAYS_INLINE vm vf_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
ALWAYS_INLINE vm vf_neq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ); }
/* m ? b : a, lane by lane */
ALWAYS_INLINE vf vf_blend(vm m, vf a, vf b) { return _mm512_mask_blend_ps(m, a, b); }
ALWAYS_INLINE vf vf_zero_where(vm m, vf a) { return _mm512_maskz_mov_ps((__mmask16)~m, a); }
ALWAYS_INLINE bool vm_any(vm m) { return m != 0; }
/* 2^n for the integers n in a (as float), by the exponent field */
ALWAYS_INLINE vf vf_pow2i(vf n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
ALWAYS_INLINE vi vi_loadu(const int32_t *p) { return _mm512_loadu_si512(p); }
ALWAYS_INLINE vi vi_set1(int32_t x) { return _mm512_set1_epi32(x); }
/* lanes where lo <= pos < hi */
ALWAYS_INLINE vm vi_within(vi lo, vi hi, vi pos) {
    return _mm512_cmpgt_epi32_mask(hi, pos) & ~_mm512_cmpgt_epi32_mask(lo, pos);
}
/* LANES halves at p as floats */
ALWAYS_INLINE vf vf_from_half(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
#else
enum { LANES = 8 };
typedef __m256 vf;
typedef __m256i vi;
typedef __m256 vm;

ALWAYS_INLINE vf vf_load(const float *p) { return _mm256_load_ps(p); }
ALWAYS_INLINE vf vf_loadu(const float *p) { return _mm256_loadu_ps(p); }
ALWAYS_INLINE void vf_store(float *p, vf v) { _mm256_store_ps(p, v); }
ALWAYS_INLINE void vf_storeu(float *p, vf v) { _mm256_storeu_ps(p, v); }
ALWAYS_INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE vf vf_set1(float x) { return _mm256_set1_ps(x); }
ALWAYS_INLINE vf vf_bcast(const float *p) { return _mm256_broadcast_ss(p); }
ALWAYS_INLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
ALWAYS_INLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
ALWAYS_INLINE vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
ALWAYS_INLINE vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
ALWAYS_INLINE vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE vf vf_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
ALWAYS_INLINE vf vf_round(vf a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ALWAYS_INLINE vm vf_lt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
ALWAYS_INLINE vm vf_eq(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
ALWAYS_INLINE vm vf_neq(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_NEQ_UQ); }
ALWAYS_INLINE vf vf_blend(vm m, vf a, vf b) { return _mm256_blendv_ps(a, b, m); }
ALWAYS_INLINE vf vf_zero_where(vm m, vf a) { return _mm256_andnot_ps(m, a); }
ALWAYS_INLINE bool vm_any(vm m) { return _mm256_movemask_ps(m) != 0; }
ALWAYS_INLINE vf vf_pow2i(vf n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
ALWAYS_INLINE vi vi_loadu(const int32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
ALWAYS_INLINE vi vi_set1(int32_t x) { return _mm256_set1_epi32(x); }
ALWAYS_INLINE vm vi_within(vi lo, vi hi, vi pos) {
    return _mm256_castsi256_ps(
        _mm256_andnot_si256(_mm256_cmpgt_epi32(lo, pos), _mm256_cmpgt_epi32(hi, pos)));
}
ALWAYS_INLINE vf vf_from_half(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#endif

#endif /* NM_KERNELS_X86_ATTENTION_VEC_H */
