/* AVX-512 kernels: a register-tiled matmul (up to 4 activation rows x 4
 * weight rows per tile, the weight panel reused across a block of rows that
 * stays in L2) with weights widened to float in registers, and attention
 * with 16-lane dot products. Compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512dq -mfma -mf16c; only called when CPUID reports them. */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <immintrin.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* RT_MAX x CT_MAX accumulators + RT_MAX activation vectors + 1 weight vector
 * fit the 32 registers. Measured on this machine (bench/kernels.c, BF16
 * 64 x 768 x 2048): 4 x 4 ran at ~100 GFLOP/s, 8 x 2 at ~17 (gcc 12 did not
 * keep its 16 accumulators in registers). */
enum { RT_MAX = 4, CT_MAX = 4, L2_ROW_BLOCK_BYTES = 512 * 1024, PANEL_ELEMS = 16 * 1024 };
/* A single row (decode) streams GEMV_CT weight rows at once: more
 * independent streams in flight for a memory-bound loop. */
enum { GEMV_CT = 8 };

/* 16 weights of one row from element kk (kk % 16 == 0) as floats; lanes at
 * or past the row's end are 0 (mask). Q8_0 rows are whole blocks, so their
 * mask is always full. */
ALWAYS_INLINE __m512 load_w16(uint32_t type, const uint8_t *row, int64_t kk, __mmask16 mask,
                              int full) {
    switch (type) {
    case NM_DTYPE_F32:
        return full ? _mm512_loadu_ps((const float *)row + kk)
                    : _mm512_maskz_loadu_ps(mask, (const float *)row + kk);
    case NM_DTYPE_F16: {
        __m256i h = full ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + kk))
                         : _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + kk);
        return _mm512_cvtph_ps(h);
    }
    case NM_DTYPE_BF16: {
        __m256i b = full ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + kk))
                         : _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + kk);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    default: { /* Q8_0 */
        const uint8_t *blk = row + (size_t)(kk / NM_Q8_0_BLOCK) * NM_Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, blk, 2);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + kk % NM_Q8_0_BLOCK));
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
    }
}

/* y[r][c] = x[r] . w[c] for r < rt, c < ct. Each output is one 16-lane
 * accumulator (lane l sums k = l mod 16 with FMA, the tail masked) reduced
 * by _mm512_reduce_add_ps: the same operations for every tile shape. */
ALWAYS_INLINE void tile(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                        const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    __m512 acc[RT_MAX][GEMV_CT];
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            acc[r][c] = _mm512_setzero_ps();
    int64_t kk = 0;
    for (; kk + 16 <= k; kk += 16) {
        __m512 xv[RT_MAX];
        for (int r = 0; r < rt; r++)
            xv[r] = _mm512_loadu_ps(x + r * ldx + kk);
        for (int c = 0; c < ct; c++) {
            const __m512 wv = load_w16(type, w + (size_t)c * row_bytes, kk, 0xffff, 1);
            for (int r = 0; r < rt; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    if (kk < k) {
        const __mmask16 mask = (__mmask16)((1u << (k - kk)) - 1);
        __m512 xv[RT_MAX];
        for (int r = 0; r < rt; r++)
            xv[r] = _mm512_maskz_loadu_ps(mask, x + r * ldx + kk);
        for (int c = 0; c < ct; c++) {
            const __m512 wv = load_w16(type, w + (size_t)c * row_bytes, kk, mask, 0);
            for (int r = 0; r < rt; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    for (int r = 0; r < rt; r++)
        for (int c = 0; c < ct; c++)
            y[r * ldy + c] = _mm512_reduce_add_ps(acc[r][c]);
}

/* Tile shapes with constant bounds, so acc[][] lives in registers. */
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

ALWAYS_INLINE void tile_rows(uint32_t type, int rt, int ct, const float *x, int64_t ldx,
                             const uint8_t *w, size_t row_bytes, int64_t k, float *y, int64_t ldy) {
    if (ct == CT_MAX) {
        tile_rt(type, rt, CT_MAX, x, ldx, w, row_bytes, k, y, ldy);
        return;
    }
    for (int c = 0; c < ct; c++)
        tile_rt(type, rt, 1, x, ldx, w + (size_t)c * row_bytes, row_bytes, k, y + c, ldy);
}

ALWAYS_INLINE void matmul_type(uint32_t type, const nm_mat *w, const float *x, int64_t ldx,
                               int64_t m, float *y, int64_t ldy, int64_t j0, int64_t j1) {
    const int64_t k = w->k;
    /* activation rows that stay in L2 while the weight panels pass over them */
    int64_t rb = L2_ROW_BLOCK_BYTES / (k * (int64_t)sizeof(float)) / RT_MAX * RT_MAX;
    if (rb < RT_MAX) rb = RT_MAX;
    const uint8_t *base = w->data;
    if (m == 1) {
        int64_t j = j0;
        for (; j + GEMV_CT <= j1; j += GEMV_CT)
            tile(type, 1, GEMV_CT, x, ldx, base + (size_t)j * w->row_bytes, w->row_bytes, k, y + j,
                 ldy);
        for (; j < j1; j++)
            tile(type, 1, 1, x, ldx, base + (size_t)j * w->row_bytes, w->row_bytes, k, y + j, ldy);
        return;
    }
    /* With more than one row tile, a panel of CT_MAX weight rows is widened
     * to float once into a stack buffer (at most 64 KiB) and read as F32 by
     * every row tile: the same values, converted once instead of per tile. */
    const int64_t ldp = (k + 15) / 16 * 16;
    if (type != NM_DTYPE_F32 && m > RT_MAX && ldp * CT_MAX <= PANEL_ELEMS) {
        float panel[PANEL_ELEMS]; /* [CT_MAX][ldp] weight rows as float */
        for (int64_t i0 = 0; i0 < m; i0 += rb) {
            const int64_t i1 = i0 + rb < m ? i0 + rb : m;
            for (int64_t j = j0; j < j1; j += CT_MAX) {
                const int ct = (int)(j1 - j < CT_MAX ? j1 - j : CT_MAX);
                for (int c = 0; c < ct; c++) {
                    const uint8_t *row = base + (size_t)(j + c) * w->row_bytes;
                    int64_t kk = 0;
                    for (; kk + 16 <= k; kk += 16)
                        _mm512_storeu_ps(panel + c * ldp + kk, load_w16(type, row, kk, 0xffff, 1));
                    if (kk < k)
                        _mm512_storeu_ps(
                            panel + c * ldp + kk,
                            load_w16(type, row, kk, (__mmask16)((1u << (k - kk)) - 1), 0));
                }
                const uint8_t *pw = (const uint8_t *)panel;
                const size_t prb = (size_t)ldp * sizeof(float);
                for (int64_t i = i0; i < i1; i += RT_MAX) {
                    const int rt = (int)(i1 - i < RT_MAX ? i1 - i : RT_MAX);
                    tile_rows(NM_DTYPE_F32, rt, ct, x + i * ldx, ldx, pw, prb, k, y + i * ldy + j,
                              ldy);
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

void nm_matmul_avx512_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                              int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
    switch (w->type) {
    case NM_DTYPE_F32:
        matmul_type(NM_DTYPE_F32, w, x, ldx, m, y, ldy, j0, j1);
        return;
    case NM_DTYPE_F16:
        matmul_type(NM_DTYPE_F16, w, x, ldx, m, y, ldy, j0, j1);
        return;
    case NM_DTYPE_BF16:
        matmul_type(NM_DTYPE_BF16, w, x, ldx, m, y, ldy, j0, j1);
        return;
    case NM_DTYPE_Q8_0:
        NM_ASSERT(w->k % NM_Q8_0_BLOCK == 0);
        matmul_type(NM_DTYPE_Q8_0, w, x, ldx, m, y, ldy, j0, j1);
        return;
    default:
        NM_ASSERT(!"nm_matmul_avx512_forward: unsupported type");
    }
}

static float dot16(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        const __mmask16 mask = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i),
                              _mm512_maskz_loadu_ps(mask, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* out += p * v over n floats */
static void axpy16(float *out, float p, const float *v, int n) {
    const __m512 pv = _mm512_set1_ps(p);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i,
                         _mm512_fmadd_ps(pv, _mm512_loadu_ps(v + i), _mm512_loadu_ps(out + i)));
    if (i < n) {
        const __mmask16 mask = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(out + i, mask,
                              _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(mask, v + i),
                                              _mm512_maskz_loadu_ps(mask, out + i)));
    }
}

/* The sums of four accumulators as one vector [sum a, sum b, sum c, sum d]:
 * pairs interleaved and added, then the 128-bit quarters: 13 instructions
 * where four _mm512_reduce_add_ps take about 32. */
ALWAYS_INLINE __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    /* per 128-bit quarter: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, d */
    const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* scores[t] = q . k_t * scale for t < n_kv: four positions at a time share
 * each q vector and one reduction. */
static void scores_forward(const float *qh, const float *k, int64_t kv_stride, int32_t n_kv,
                           int head_dim, float scale, float *scores) {
    const int n_full = head_dim / 16;
    const __mmask16 tail = (__mmask16)((1u << (head_dim % 16)) - 1);
    int32_t t = 0;
    for (; t + 4 <= n_kv; t += 4) {
        const float *k0 = k + t * kv_stride, *k1 = k0 + kv_stride, *k2 = k1 + kv_stride,
                    *k3 = k2 + kv_stride;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int d = 0;
        for (int c = 0; c < n_full; c++, d += 16) {
            const __m512 qv = _mm512_loadu_ps(qh + d);
            a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + d), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k1 + d), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k2 + d), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k3 + d), a3);
        }
        if (tail) {
            const __m512 qv = _mm512_maskz_loadu_ps(tail, qh + d);
            a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, k0 + d), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, k1 + d), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, k2 + d), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, k3 + d), a3);
        }
        _mm_storeu_ps(scores + t, _mm_mul_ps(reduce4(a0, a1, a2, a3), _mm_set1_ps(scale)));
    }
    for (; t < n_kv; t++)
        scores[t] = dot16(qh, k + t * kv_stride, head_dim) * scale;
}

/* out = sum_t p_t v_t with the output row in NCH registers (head_dim ==
 * 16 * NCH): each value row is read once and nothing is stored until the end. */
ALWAYS_INLINE void values_regs(int nch, const float *p, const float *v, int64_t kv_stride,
                               int32_t n_kv, float *out) {
    __m512 o[16];
    for (int c = 0; c < nch; c++)
        o[c] = _mm512_setzero_ps();
    for (int32_t t = 0; t < n_kv; t++) {
        const __m512 pv = _mm512_set1_ps(p[t]);
        const float *vt = v + t * kv_stride;
        for (int c = 0; c < nch; c++)
            o[c] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(vt + 16 * c), o[c]);
    }
    for (int c = 0; c < nch; c++)
        _mm512_storeu_ps(out + 16 * c, o[c]);
}

void nm_attention_avx512_forward(const float *q, const float *k_cache, const float *v_cache,
                                 int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                                 int head_dim, float scale, float *out, float *scores) {
    NM_ASSERT(n_head % n_head_kv == 0);
    const int group = n_head / n_head_kv;
    for (int h = 0; h < n_head; h++) {
        const float *qh = q + (size_t)h * head_dim;
        const int64_t kv_off = (int64_t)(h / group) * head_dim;
        scores_forward(qh, k_cache + kv_off, kv_stride, n_kv, head_dim, scale, scores);
        nm_softmax_forward(scores, n_kv);
        float *oh = out + (size_t)h * head_dim;
        const float *v = v_cache + kv_off;
        switch (head_dim) {
        case 128:
            values_regs(8, scores, v, kv_stride, n_kv, oh);
            break;
        case 64:
            values_regs(4, scores, v, kv_stride, n_kv, oh);
            break;
        case 256:
            values_regs(16, scores, v, kv_stride, n_kv, oh);
            break;
        default:
            memset(oh, 0, (size_t)head_dim * sizeof(float));
            for (int32_t t = 0; t < n_kv; t++)
                axpy16(oh, scores[t], v + t * kv_stride, head_dim);
        }
    }
}
/* 16 halves (masked) as floats. */
ALWAYS_INLINE __m512 load_h16(const uint16_t *p, __mmask16 mask) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}

void nm_attention_f16_avx512_forward(const float *q, const uint16_t *k_cache,
                                     const uint16_t *v_cache, int64_t kv_stride, int32_t n_kv,
                                     int n_head, int n_head_kv, int head_dim, float scale,
                                     float *out, float *scores) {
    NM_ASSERT(n_head % n_head_kv == 0);
    const int group = n_head / n_head_kv;
    for (int h = 0; h < n_head; h++) {
        const float *qh = q + (size_t)h * head_dim;
        const int64_t kv_off = (int64_t)(h / group) * head_dim;
        for (int32_t t = 0; t < n_kv; t++) {
            const uint16_t *kt = k_cache + t * kv_stride + kv_off;
            __m512 acc = _mm512_setzero_ps();
            for (int d = 0; d < head_dim; d += 16) {
                const __mmask16 m =
                    (__mmask16)(head_dim - d >= 16 ? 0xffff : (1u << (head_dim - d)) - 1);
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qh + d), load_h16(kt + d, m), acc);
            }
            scores[t] = _mm512_reduce_add_ps(acc) * scale;
        }
        nm_softmax_forward(scores, n_kv);
        float *oh = out + (size_t)h * head_dim;
        for (int d = 0; d < head_dim; d += 16) {
            const __mmask16 m =
                (__mmask16)(head_dim - d >= 16 ? 0xffff : (1u << (head_dim - d)) - 1);
            __m512 o = _mm512_setzero_ps();
            for (int32_t t = 0; t < n_kv; t++)
                o = _mm512_fmadd_ps(_mm512_set1_ps(scores[t]),
                                    load_h16(v_cache + t * kv_stride + kv_off + d, m), o);
            _mm512_mask_storeu_ps(oh + d, m, o);
        }
    }
}
#else
typedef int nm_avx512_unused; /* an empty translation unit is not ISO C */
#endif
