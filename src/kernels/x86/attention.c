/* Attention that streams keys and values in blocks with an online softmax,
 * for the AVX2 and AVX-512 variants: the queries that share a KV head (its
 * heads, times one or more rows of a sequence) lie in the lanes of float
 * vectors, so each key and value element is loaded once per pass of
 * queries and broadcast against them, and no row of scores per head is
 * materialised. Not here: the reference (ref/ref.c), which the tests
 * compare it with.
 *
 * Built twice from this source (attention-vec.h): with 8-lane vectors
 * (-mavx2 -mfma -mf16c; nm_attention_blocked_forward) and, by
 * attention-avx512.c, with 16 (nm_attention_blocked16_forward). A lane
 * does the same operations in both, so they give the same bits; the
 * 16-lane build doubles the FMAs per instruction where the core has two
 * 512-bit FMA pipes (Intel's Xeons; Zen 4 splits a 512-bit FMA in two, so
 * it gains nothing there), and the dispatcher gives it passes of more than
 * 16 queries (a decode step's 8 queries per KV head fill an 8-lane
 * vector). */
#if defined(__x86_64__)
#include "kernels/kernels-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdint.h>

#ifndef NM_ATTN_LANES
#define NM_ATTN_LANES 8
#endif
#include "attention-vec.h"

#if NM_ATTN_LANES == 16
#define ATTN_FORWARD nm_attention_blocked16_forward
#else
#define ATTN_FORWARD nm_attention_blocked_forward
#endif

/* A pass holds PASS_LANES queries (two vectors); keys come KEY_BLOCK at a
 * time, at positions that are multiples of KEY_BLOCK, whatever the rows of
 * the call: a query's bits depend on its own positions only. */
enum { PASS_LANES = 2 * LANES, KEY_BLOCK = 16 };
_Static_assert(NM_ATTENTION_HEAD_DIM_MAX == 576, "the pass scratch below is sized for it");

/* One pass's state, on the calling thread's stack (about 145 KiB with 8
 * lanes, 220 KiB with 16). */
typedef struct pass_scratch {
    _Alignas(64) float qt[NM_ATTENTION_HEAD_DIM_MAX * PASS_LANES]; /* [head_dim][P] queries^T */
    _Alignas(64) float ot[NM_ATTENTION_HEAD_DIM_MAX * PASS_LANES]; /* [head_dim][P] outputs */
    _Alignas(64) float p[KEY_BLOCK * PASS_LANES];    /* [KEY_BLOCK][P] scores, then weights */
    float kb[KEY_BLOCK * NM_ATTENTION_HEAD_DIM_MAX]; /* [KEY_BLOCK][head_dim] F16 keys widened */
    float vb[KEY_BLOCK * NM_ATTENTION_HEAD_DIM_MAX]; /* [KEY_BLOCK][head_dim] F16 values */
    _Alignas(64) float m[PASS_LANES];                /* running maximum per query */
    _Alignas(64) float l[PASS_LANES];                /* running denominator per query */
    _Alignas(64) float alpha[PASS_LANES];            /* this block's rescale of ot and l */
    int32_t lo[PASS_LANES], hi[PASS_LANES];          /* keys [lo, hi) per query */
} pass_scratch;

/* e^x for x <= 0 (e^-inf = 0), within about 2 ulp: x = n ln2 + r with |r|
 * <= ln2 / 2, e^r by its Taylor polynomial of degree 7 (truncation below
 * 1e-8 relative), then 2^n put into the exponent. Below -87, where e^x is
 * no longer a normal float, it gives 0. e^0 is exactly 1. */
ALWAYS_INLINE vf exp_nonpos(vf x) {
    const vf lim = vf_set1(-87.0f);
    const vm under = vf_lt(x, lim);
    x = vf_max(x, lim);
    const vf n = vf_round(vf_mul(x, vf_set1(1.44269504f)));
    /* ln 2 in two parts: the first has 16 significant bits, so n * it is exact */
    vf r = vf_fnma(n, vf_set1(0.693145751953125f), x);
    r = vf_fnma(n, vf_set1(1.42860682030941723e-6f), r);
    vf p = vf_set1(1.0f / 5040.0f);
    p = vf_fma(p, r, vf_set1(1.0f / 720.0f));
    p = vf_fma(p, r, vf_set1(1.0f / 120.0f));
    p = vf_fma(p, r, vf_set1(1.0f / 24.0f));
    p = vf_fma(p, r, vf_set1(1.0f / 6.0f));
    p = vf_fma(p, r, vf_set1(0.5f));
    p = vf_fma(p, r, vf_set1(1.0f));
    p = vf_fma(p, r, vf_set1(1.0f));
    return vf_zero_where(under, vf_mul(p, vf_pow2i(n)));
}

/* The micro-kernel of both products, c[i][lane] (+)= sum_t a[i * ai + t *
 * at] b[t][lane] for i < ni over nv vectors of lanes (b and c rows
 * PASS_LANES apart): one FMA chain over t per element, in t order,
 * whatever ni and nv. Scores: a = keys (t runs over dims), b = the
 * transposed queries, c from 0. Values: a = value rows (t runs over keys),
 * b = the weights, c = the outputs so far, rescaled by alpha first when
 * rescale. */
ALWAYS_INLINE void bcast_tile(int nv, int ni, const float *a, int64_t ai, int64_t at,
                              const float *b, int nt, bool accumulate, const vf *alpha,
                              bool rescale, float *c) {
    vf acc[8][2];
    for (int i = 0; i < ni; i++)
        for (int v = 0; v < nv; v++) {
            acc[i][v] = accumulate ? vf_load(c + i * PASS_LANES + LANES * v) : vf_zero();
            if (accumulate && rescale) acc[i][v] = vf_mul(acc[i][v], alpha[v]);
        }
    for (int t = 0; t < nt; t++) {
        vf bv[2];
        for (int v = 0; v < nv; v++)
            bv[v] = vf_load(b + t * PASS_LANES + LANES * v);
        for (int i = 0; i < ni; i++) {
            const vf x = vf_bcast(a + i * ai + t * at);
            for (int v = 0; v < nv; v++)
                acc[i][v] = vf_fma(x, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < ni; i++)
        for (int v = 0; v < nv; v++)
            vf_store(c + i * PASS_LANES + LANES * v, acc[i][v]);
}

/* The online softmax over one block of nk keys from position kb: masks the
 * scores outside each query's [lo, hi) to -inf, raises the running maximum,
 * turns the scores into weights e^(s - m) and sets alpha = e^(m_old - m),
 * by which l (here) and ot (in value_tile) are rescaled. Returns whether
 * some alpha is not 1 (a rescale by 1 changes nothing, so it is skipped). */
ALWAYS_INLINE bool softmax_block(int nv, pass_scratch *s, int32_t kb, int nk, float scale) {
    bool rescale = false;
    const vf ninf = vf_set1(-INFINITY);
    for (int c = 0; c < nv; c++) {
        const vi lo = vi_loadu(s->lo + LANES * c);
        const vi hi = vi_loadu(s->hi + LANES * c);
        const vf m_old = vf_load(s->m + LANES * c);
        vf mx = m_old;
        for (int k = 0; k < nk; k++) {
            float *pk = s->p + k * PASS_LANES + LANES * c;
            const vm keep = vi_within(lo, hi, vi_set1(kb + k));
            const vf sc = vf_blend(keep, ninf, vf_mul(vf_load(pk), vf_set1(scale)));
            vf_store(pk, sc);
            mx = vf_max(mx, sc);
        }
        /* a query with no key yet keeps m = -inf: its weights are e^-inf = 0 */
        const vm none = vf_eq(mx, ninf);
        const vf base = vf_blend(none, mx, vf_zero());
        /* (its ot and l are 0: any alpha will do, and 1 lets the rescale be skipped) */
        const vf alpha = vf_blend(none, exp_nonpos(vf_sub(m_old, base)), vf_set1(1.0f));
        vf l = vf_mul(vf_load(s->l + LANES * c), alpha);
        for (int k = 0; k < nk; k++) {
            float *pk = s->p + k * PASS_LANES + LANES * c;
            const vf w = exp_nonpos(vf_sub(vf_load(pk), base));
            vf_store(pk, w);
            l = vf_add(l, w);
        }
        vf_store(s->l + LANES * c, l);
        vf_store(s->m + LANES * c, mx);
        vf_store(s->alpha + LANES * c, alpha);
        rescale |= vm_any(vf_neq(alpha, vf_set1(1.0f)));
    }
    return rescale;
}

/* nk rows of head_dim halves (row stride kv_stride) into dst [nk][hd]. */
static void widen_rows(const uint16_t *src, int64_t kv_stride, int nk, int hd, float *dst) {
    for (int k = 0; k < nk; k++) {
        const uint16_t *row = src + k * kv_stride;
        float *out = dst + (size_t)k * (size_t)hd;
        int d = 0;
        for (; d + LANES <= hd; d += LANES)
            vf_storeu(out + d, vf_from_half(row + d));
        for (; d < hd; d++)
            out[d] = nm_f16_to_f32(row[d]);
    }
}

/* The block's scores and weights into s->p, then its values into s->ot,
 * for nv vectors of queries. k, v: the block's first key and value rows
 * (row strides ks, vs). */
ALWAYS_INLINE void attend_block(int nv, pass_scratch *s, const float *k, int64_t ks, const float *v,
                                int64_t vs, int32_t kb, int nk, int hd, float scale) {
    /* at least 8 accumulators (two FMA pipes, latency 4); with 16 lanes the
     * 32 registers hold 16, and a tile of 8 keys or dims loads each query
     * or softmax-weight vector for 16 FMAs, not 8 (the same bits: each output
     * is one FMA chain whatever the tile) */
    const int kt = nv == 2 && LANES == 8 ? 4 : 8;
    int i = 0;
    for (; i + kt <= nk; i += kt)
        bcast_tile(nv, kt, k + i * ks, ks, 1, s->qt, hd, false, NULL, false, s->p + i * PASS_LANES);
    for (; i < nk; i++)
        bcast_tile(nv, 1, k + i * ks, ks, 1, s->qt, hd, false, NULL, false, s->p + i * PASS_LANES);
    const bool rescale = softmax_block(nv, s, kb, nk, scale);
    const vf alpha[2] = {vf_load(s->alpha), vf_load(s->alpha + LANES)};
    const int dt = kt;
    int d = 0;
    for (; d + dt <= hd; d += dt)
        bcast_tile(nv, dt, v + d, 1, vs, s->p, nk, true, alpha, rescale, s->ot + d * PASS_LANES);
    for (; d < hd; d++)
        bcast_tile(nv, 1, v + d, 1, vs, s->p, nk, true, alpha, rescale, s->ot + d * PASS_LANES);
}

typedef struct attn_call {
    const float *q;
    int64_t ldq;
    const void *k, *v; /* float or uint16_t (half) */
    bool half;
    int64_t kv_stride;
    const int32_t *kv0, *n_kv;
    int n_head, group, hd;
    float scale;
    const float *sinks;
    float *out;
    int64_t ldo;
} attn_call;

/* Queries j0 .. j0 + nl - 1 of KV head kvh (query j: row j / group, head
 * kvh * group + j % group) over their keys. */
static void attend_pass(const attn_call *a, int kvh, int64_t j0, int nl, pass_scratch *s) {
    const int hd = a->hd;
    int32_t first = INT32_MAX, end = 0;
    for (int j = 0; j < PASS_LANES; j++) {
        const int64_t r = (j0 + j) / a->group;
        const int h = kvh * a->group + (int)((j0 + j) % a->group);
        const bool real = j < nl;
        for (int d = 0; d < hd; d++)
            s->qt[d * PASS_LANES + j] = real ? a->q[r * a->ldq + (int64_t)h * hd + d] : 0.0f;
        /* a lane past the queries attends to nothing */
        s->lo[j] = real ? a->kv0[r] : 0;
        s->hi[j] = real ? a->n_kv[r] : 0;
        /* a sink starts the softmax: in the maximum, e^0 in the denominator */
        s->m[j] = real && a->sinks ? a->sinks[h] : -INFINITY;
        s->l[j] = s->m[j] > -INFINITY ? 1.0f : 0.0f;
        if (real && s->lo[j] < first) first = s->lo[j];
        if (real && s->hi[j] > end) end = s->hi[j];
    }
    for (int i = 0; i < hd * PASS_LANES; i++)
        s->ot[i] = 0.0f;
    for (int j = 0; j < PASS_LANES; j++)
        s->alpha[j] = 1.0f;
    const int nv = nl > LANES ? 2 : 1;
    const int64_t off = (int64_t)kvh * hd;
    for (int32_t kb = first - first % KEY_BLOCK; kb < end; kb += KEY_BLOCK) {
        const int nk = end - kb < KEY_BLOCK ? end - kb : KEY_BLOCK;
        const float *k, *v;
        int64_t ks = a->kv_stride;
        if (a->half) {
            widen_rows((const uint16_t *)a->k + kb * a->kv_stride + off, a->kv_stride, nk, hd,
                       s->kb);
            widen_rows((const uint16_t *)a->v + kb * a->kv_stride + off, a->kv_stride, nk, hd,
                       s->vb);
            k = s->kb, v = s->vb, ks = hd;
        } else {
            k = (const float *)a->k + kb * a->kv_stride + off;
            v = (const float *)a->v + kb * a->kv_stride + off;
        }
        if (nv == 2)
            attend_block(2, s, k, ks, v, ks, kb, nk, hd, a->scale);
        else
            attend_block(1, s, k, ks, v, ks, kb, nk, hd, a->scale);
    }
    for (int j = 0; j < nl; j++) {
        const int64_t r = (j0 + j) / a->group;
        const int h = kvh * a->group + (int)((j0 + j) % a->group);
        const float inv = 1.0f / s->l[j];
        float *o = a->out + r * a->ldo + (int64_t)h * hd;
        for (int d = 0; d < hd; d++)
            o[d] = s->ot[d * PASS_LANES + j] * inv;
    }
}

void ATTN_FORWARD(const float *q, int64_t ldq, const void *k_cache, const void *v_cache, bool half,
                  int64_t kv_stride, const int32_t *kv0, const int32_t *n_kv, int32_t n_rows,
                  int n_head, int n_head_kv, int head_dim, float scale, const float *sinks,
                  float *out, int64_t ldo) {
    NM_ASSERT(n_head % n_head_kv == 0 && head_dim <= NM_ATTENTION_HEAD_DIM_MAX);
    for (int32_t r = 0; r < n_rows; r++)
        NM_ASSERT(kv0[r] >= 0 && kv0[r] < n_kv[r]);
    const attn_call a = {.q = q,
                         .ldq = ldq,
                         .k = k_cache,
                         .v = v_cache,
                         .half = half,
                         .kv_stride = kv_stride,
                         .kv0 = kv0,
                         .n_kv = n_kv,
                         .n_head = n_head,
                         .group = n_head / n_head_kv,
                         .hd = head_dim,
                         .scale = scale,
                         .sinks = sinks,
                         .out = out,
                         .ldo = ldo};
    pass_scratch s;
    const int64_t n_q = (int64_t)n_rows * a.group;
    for (int kvh = 0; kvh < n_head_kv; kvh++)
        for (int64_t j0 = 0; j0 < n_q; j0 += PASS_LANES)
            attend_pass(&a, kvh, j0, n_q - j0 < PASS_LANES ? (int)(n_q - j0) : PASS_LANES, &s);
}
#else
typedef int nm_attention_unused; /* an empty translation unit is not ISO C */
#endif
