/* Routing, dispatch and the dense grouped expert execution. Each expert
 * writes its results into per-assignment rows, so experts run in parallel
 * without sharing outputs, and the combine adds the slots of a token in
 * router order, as llama.cpp does. */
#include "moe.h"

#include "base/base.h"

#include <math.h>
#include <string.h>

struct nm_moe_scratch {
    int32_t max_tokens;
    int32_t k;
    int32_t n_expert;
    int64_t d_model;
    int64_t d_ff;
    int n_threads;
    nm_moe_dispatch dispatch;
    int32_t *fill; /* [n_expert] cursor while building the dispatch */
    float *y;      /* [max_tokens * k][d_model] expert output per assignment */
    float *xg;     /* [n_threads][max_tokens][d_model] gathered rows        */
    float *gate;   /* [n_threads][max_tokens][d_ff]                          */
    float *up;     /* [n_threads][max_tokens][d_ff]                          */
};

nm_mat nm_expert_mat(const nm_mat *first, size_t stride, int32_t e) {
    nm_mat m = *first;
    m.data = (const uint8_t *)first->data + (size_t)e * stride;
    return m;
}

void nm_moe_route_softmax_topk(const float *logits, int32_t n_expert, int32_t k, bool renorm,
                               int32_t *ids, float *weights, float *probs) {
    NM_ASSERT(k >= 1 && k <= n_expert);
    memcpy(probs, logits, (size_t)n_expert * sizeof(float));
    nm_softmax_forward(probs, n_expert);
    for (int32_t s = 0; s < k; s++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int32_t j = 0; j < s; j++)
                taken |= ids[j] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        ids[s] = best;
        weights[s] = probs[best];
    }
    if (renorm) {
        float sum = 0.0f;
        for (int32_t s = 0; s < k; s++)
            sum += weights[s];
        for (int32_t s = 0; s < k; s++)
            weights[s] /= sum;
    }
}

nm_status nm_moe_scratch_new(int32_t max_tokens, int32_t k, int32_t n_expert, int64_t d_model,
                             int64_t d_ff, int n_threads, nm_moe_scratch **out, nm_error *err) {
    *out = NULL;
    NM_ASSERT(max_tokens > 0 && k > 0 && n_expert >= k && d_model > 0 && d_ff > 0 && n_threads > 0);
    nm_moe_scratch *s = nm_calloc(1, sizeof *s);
    if (!s) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for MoE buffers");
    s->max_tokens = max_tokens;
    s->k = k;
    s->n_expert = n_expert;
    s->d_model = d_model;
    s->d_ff = d_ff;
    s->n_threads = n_threads;
    const size_t n_assign = (size_t)max_tokens * (size_t)k;
    s->dispatch.offset = nm_calloc((size_t)n_expert + 1, sizeof(int32_t));
    s->dispatch.rows = nm_calloc(n_assign, sizeof(int32_t));
    s->fill = nm_calloc((size_t)n_expert, sizeof(int32_t));
    s->y = nm_calloc(n_assign * (size_t)d_model, sizeof(float));
    const size_t per_thread = (size_t)max_tokens * (size_t)n_threads;
    s->xg = nm_calloc(per_thread * (size_t)d_model, sizeof(float));
    s->gate = nm_calloc(per_thread * (size_t)d_ff, sizeof(float));
    s->up = nm_calloc(per_thread * (size_t)d_ff, sizeof(float));
    if (!s->dispatch.offset || !s->dispatch.rows || !s->fill || !s->y || !s->xg || !s->gate ||
        !s->up) {
        nm_moe_scratch_free(s);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for MoE buffers (%d tokens, %d experts)",
                         max_tokens, n_expert);
    }
    *out = s;
    return NM_OK;
}

void nm_moe_scratch_free(nm_moe_scratch *s) {
    if (!s) return;
    nm_free(s->dispatch.offset);
    nm_free(s->dispatch.rows);
    nm_free(s->fill);
    nm_free(s->y);
    nm_free(s->xg);
    nm_free(s->gate);
    nm_free(s->up);
    nm_free(s);
}

const nm_moe_dispatch *nm_moe_dispatch_build(nm_moe_scratch *s, const int32_t *ids,
                                             int32_t n_tokens) {
    NM_ASSERT(n_tokens >= 0 && n_tokens <= s->max_tokens);
    nm_moe_dispatch *d = &s->dispatch;
    d->n_expert = s->n_expert;
    d->n_tokens = n_tokens;
    d->k = s->k;
    const int32_t n_assign = n_tokens * s->k;
    memset(d->offset, 0, ((size_t)s->n_expert + 1) * sizeof(int32_t));
    for (int32_t a = 0; a < n_assign; a++) {
        NM_ASSERT(ids[a] >= 0 && ids[a] < s->n_expert);
        d->offset[ids[a] + 1]++;
    }
    for (int32_t e = 0; e < s->n_expert; e++)
        d->offset[e + 1] += d->offset[e];
    memcpy(s->fill, d->offset, (size_t)s->n_expert * sizeof(int32_t));
    for (int32_t a = 0; a < n_assign; a++)
        d->rows[s->fill[ids[a]]++] = a;
    return d;
}

typedef struct dense_ctx {
    const nm_expert_weights *w;
    const float *x;
    nm_moe_scratch *s;
    const int32_t *active; /* [n_active] expert ids with at least one row */
} dense_ctx;

/* One task = one expert over all its rows. */
static void dense_expert_task(void *p, int i, int thread) {
    const dense_ctx *c = p;
    nm_moe_scratch *s = c->s;
    const nm_moe_dispatch *d = &s->dispatch;
    const int32_t e = c->active[i];
    const int32_t r0 = d->offset[e], m = d->offset[e + 1] - r0;
    const int64_t dm = s->d_model, ff = s->d_ff;
    float *xg = s->xg + (size_t)thread * s->max_tokens * dm;  /* [m][d_model] */
    float *g = s->gate + (size_t)thread * s->max_tokens * ff; /* [m][d_ff]    */
    float *u = s->up + (size_t)thread * s->max_tokens * ff;   /* [m][d_ff]    */
    for (int32_t r = 0; r < m; r++) {
        const int32_t token = d->rows[r0 + r] / s->k;
        memcpy(xg + (size_t)r * dm, c->x + (size_t)token * dm, (size_t)dm * sizeof(float));
    }
    const nm_mat wg = nm_expert_mat(&c->w->gate, c->w->gate_stride, e);
    const nm_mat wu = nm_expert_mat(&c->w->up, c->w->up_stride, e);
    const nm_mat wd = nm_expert_mat(&c->w->down, c->w->down_stride, e);
    nm_matmul_forward(&wg, xg, dm, m, g, ff, 0, ff);
    nm_matmul_forward(&wu, xg, dm, m, u, ff, 0, ff);
    nm_swiglu_forward(g, u, g, (int64_t)m * ff);
    /* the gathered rows are dead now: their buffer takes the down output */
    nm_matmul_forward(&wd, g, ff, m, xg, dm, 0, dm);
    for (int32_t r = 0; r < m; r++) {
        const int32_t a = d->rows[r0 + r];
        memcpy(s->y + (size_t)a * dm, xg + (size_t)r * dm, (size_t)dm * sizeof(float));
    }
}

void nm_moe_forward_dense(nm_pool *pool, const nm_expert_weights *w, const float *x,
                          int32_t n_tokens, const int32_t *ids, const float *weights, float *out,
                          nm_moe_scratch *s) {
    const nm_moe_dispatch *d = nm_moe_dispatch_build(s, ids, n_tokens);
    /* the experts with rows, most rows first so the big ones start early */
    int32_t *active = s->fill;
    int32_t n_active = 0;
    for (int32_t e = 0; e < s->n_expert; e++)
        if (d->offset[e + 1] > d->offset[e]) active[n_active++] = e;
    for (int32_t i = 1; i < n_active; i++) {
        int32_t e = active[i], load = d->offset[e + 1] - d->offset[e], j = i;
        while (j > 0 && d->offset[active[j - 1] + 1] - d->offset[active[j - 1]] < load) {
            active[j] = active[j - 1];
            j--;
        }
        active[j] = e;
    }
    dense_ctx ctx = {.w = w, .x = x, .s = s, .active = active};
    nm_pool_run(pool, dense_expert_task, &ctx, n_active);

    const int64_t dm = s->d_model;
    for (int32_t t = 0; t < n_tokens; t++) {
        float *o = out + (size_t)t * dm;
        memset(o, 0, (size_t)dm * sizeof(float));
        for (int32_t slot = 0; slot < s->k; slot++) {
            const int32_t a = t * s->k + slot;
            const float wt = weights[a];
            const float *ya = s->y + (size_t)a * dm;
            for (int64_t i = 0; i < dm; i++)
                o[i] += wt * ya[i];
        }
    }
}
