/* Dispatch and the dense grouped expert execution. Each expert
 * writes its results into per-assignment rows, so experts run in parallel
 * without sharing outputs, and the combine adds the slots of a token in
 * router order, as llama.cpp does. */
#include "moe-impl.h"

#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    s->jobs = nm_calloc(2 * (size_t)n_expert, sizeof(nm_host_job));
    s->pieces = nm_calloc(2 * (size_t)n_expert + 2 * (size_t)n_threads, sizeof(nm_host_job));
    if (!s->jobs || !s->pieces || !s->dispatch.offset || !s->dispatch.rows || !s->fill || !s->y ||
        !s->xg || !s->gate || !s->up) {
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
    nm_free(s->jobs);
    nm_free(s->pieces);
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

typedef struct host_ctx {
    const nm_expert_weights *w;
    const float *x;
    nm_moe_scratch *s;
    const nm_host_job *jobs;
} host_ctx;

/* One task = one job: gather its rows, run the expert, scatter to y. */
static void host_job_task(void *p, int i, int thread) {
    const host_ctx *c = p;
    nm_moe_scratch *s = c->s;
    const nm_host_job *job = &c->jobs[i];
    const int64_t dm = s->d_model, ff = s->d_ff;
    float *xg = s->xg + (size_t)thread * s->max_tokens * dm;  /* [m][d_model] */
    float *g = s->gate + (size_t)thread * s->max_tokens * ff; /* [m][d_ff]    */
    float *u = s->up + (size_t)thread * s->max_tokens * ff;   /* [m][d_ff]    */
    for (int32_t r = 0; r < job->n_rows; r++) {
        const int32_t token = job->rows[r] / s->k;
        memcpy(xg + (size_t)r * dm, c->x + (size_t)token * dm, (size_t)dm * sizeof(float));
    }
    /* the gathered rows are dead once gate and up are computed: their buffer
     * takes the down output */
    nm_expert_ffn_forward(c->w, job->expert, xg, dm, job->n_rows, g, u, xg, dm);
    for (int32_t r = 0; r < job->n_rows; r++)
        memcpy(s->y + (size_t)job->rows[r] * dm, xg + (size_t)r * dm, (size_t)dm * sizeof(float));
}

void nm_moe_run_host_jobs(nm_pool *pool, const nm_expert_weights *w, const float *x,
                          nm_moe_scratch *s, nm_host_job *jobs, int32_t n_jobs) {
    /* most rows first, so the big ones start early */
    for (int32_t i = 1; i < n_jobs; i++) {
        nm_host_job job = jobs[i];
        int32_t j = i;
        while (j > 0 && jobs[j - 1].n_rows < job.n_rows) {
            jobs[j] = jobs[j - 1];
            j--;
        }
        jobs[j] = job;
    }
    int64_t total = 0;
    for (int32_t i = 0; i < n_jobs; i++)
        total += jobs[i].n_rows;
    const int n_threads = nm_pool_n_threads(pool);
    /* pieces of at most cap rows: sum ceil(n / cap) <= n_jobs + total / cap
     * <= n_jobs + 2 * n_threads */
    int64_t cap = (total + 2 * n_threads - 1) / (2 * n_threads);
    if (cap < 16) cap = 16;
    int32_t n_pieces = 0;
    for (int32_t i = 0; i < n_jobs; i++)
        for (int32_t r0 = 0; r0 < jobs[i].n_rows; r0 += (int32_t)cap) {
            const int32_t left = jobs[i].n_rows - r0;
            NM_ASSERT(n_pieces < 2 * s->n_expert + 2 * s->n_threads);
            s->pieces[n_pieces++] = (nm_host_job){.expert = jobs[i].expert,
                                                  .n_rows = left < cap ? left : (int32_t)cap,
                                                  .rows = jobs[i].rows + r0};
        }
    host_ctx ctx = {.w = w, .x = x, .s = s, .jobs = s->pieces};
    nm_pool_run(pool, host_job_task, &ctx, n_pieces);
}

typedef struct combine_ctx {
    const nm_moe_scratch *s;
    const float *weights;
    const uint8_t *keep;
    float *out;
} combine_ctx;

static void combine_tokens(void *p, int64_t t0, int64_t t1) {
    const combine_ctx *c = p;
    const nm_moe_scratch *s = c->s;
    const float *weights = c->weights;
    const uint8_t *keep = c->keep;
    float *out = c->out;
    const int64_t dm = s->d_model;
    for (int64_t t = t0; t < t1; t++) {
        float *o = out + (size_t)t * dm;
        memset(o, 0, (size_t)dm * sizeof(float));
        for (int32_t slot = 0; slot < s->k; slot++) {
            const int64_t a = t * s->k + slot;
            if (keep && !keep[a]) continue;
            const float wt = weights[a];
            const float *ya = s->y + (size_t)a * dm;
            for (int64_t i = 0; i < dm; i++)
                o[i] += wt * ya[i];
        }
    }
}

void nm_moe_combine(nm_pool *pool, const nm_moe_scratch *s, int32_t n_tokens, const float *weights,
                    const uint8_t *keep, float *out) {
    combine_ctx c = {.s = s, .weights = weights, .keep = keep, .out = out};
    /* a token's sum is a few thousand FMAs per slot */
    nm_pool_for(pool, n_tokens, 8, combine_tokens, &c);
}

void nm_moe_forward_dense(nm_pool *pool, const nm_expert_weights *w, const float *x,
                          int32_t n_tokens, const int32_t *ids, const float *weights, float *out,
                          nm_moe_scratch *s) {
    nm_moe_dispatch_build(s, ids, n_tokens);
    nm_moe_dense_dispatched(pool, w, x, n_tokens, weights, out, s);
}

void nm_moe_dense_dispatched(nm_pool *pool, const nm_expert_weights *w, const float *x,
                             int32_t n_tokens, const float *weights, float *out,
                             nm_moe_scratch *s) {
    const nm_moe_dispatch *d = &s->dispatch;
    int32_t n_jobs = 0;
    for (int32_t e = 0; e < s->n_expert; e++)
        if (d->offset[e + 1] > d->offset[e])
            s->jobs[n_jobs++] = (nm_host_job){.expert = e,
                                              .n_rows = d->offset[e + 1] - d->offset[e],
                                              .rows = d->rows + d->offset[e]};
    nm_moe_run_host_jobs(pool, w, x, s, s->jobs, n_jobs);
    nm_moe_combine(pool, s, n_tokens, weights, NULL, out);
}

/* ---- measuring the host MoE step ---- */

static int cmp_ms(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

nm_status nm_moe_time_host_layer(nm_pool *pool, const nm_expert_weights *const *layers,
                                 int32_t n_layer, int64_t d_model, int64_t d_ff, int32_t n_tokens,
                                 int32_t k, int reps, double *ms, int32_t *loads, nm_error *err) {
    NM_ASSERT(pool && layers && n_layer >= 1 && n_tokens >= 1 && reps >= 1 && ms && loads);
    const int32_t n_expert = layers[0]->n_expert;
    if (k < 1 || k > n_expert)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "%d experts per token of %d", k, n_expert);
    const size_t n_assign = (size_t)n_tokens * (size_t)k;
    nm_moe_scratch *s = NULL;
    nm_status st =
        nm_moe_scratch_new(n_tokens, k, n_expert, d_model, d_ff, nm_pool_n_threads(pool), &s, err);
    if (st) return st;
    float *x = nm_malloc((size_t)n_tokens * (size_t)d_model * sizeof(float));
    float *out = nm_malloc((size_t)n_tokens * (size_t)d_model * sizeof(float));
    float *weights = nm_malloc(n_assign * sizeof(float));
    int32_t *ids = nm_malloc(n_assign * sizeof(int32_t));
    double *times = nm_malloc((size_t)reps * sizeof(double));
    if (!x || !out || !weights || !ids || !times) {
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory measuring the host MoE step");
        goto out;
    }
    nm_rng rng;
    nm_rng_seed(&rng, 0x6d6f652d686f7374ull);
    for (size_t i = 0; i < (size_t)n_tokens * (size_t)d_model; i++)
        x[i] = (float)(2.0 * nm_rng_unit(&rng) - 1.0);
    memset(loads, 0, (size_t)n_expert * sizeof(int32_t));
    for (int32_t t = 0; t < n_tokens; t++) {
        int32_t *id = ids + (size_t)t * (size_t)k;
        for (int32_t slot = 0; slot < k; slot++) {
            bool taken;
            do { /* k distinct experts, each uniform */
                id[slot] = (int32_t)(nm_rng_unit(&rng) * n_expert);
                taken = false;
                for (int32_t j = 0; j < slot; j++)
                    taken |= id[j] == id[slot];
            } while (taken);
            weights[(size_t)t * (size_t)k + (size_t)slot] = 1.0f / (float)k;
            loads[id[slot]]++;
        }
    }
    /* Three rounds of reps runs, the median of each, the smallest kept: a
     * transient slows runs down and never speeds them up (right after a
     * device profile frees its large graph buffers, the first tens of runs
     * measured up to twice the steady time). One untimed run first. */
    nm_moe_forward_dense(pool, layers[0], x, n_tokens, ids, weights, out, s);
    *ms = INFINITY;
    for (int round = 0; round < 3; round++) {
        for (int r = 0; r < reps; r++) {
            const int64_t t0 = nm_time_ns();
            nm_moe_forward_dense(pool, layers[r % n_layer], x, n_tokens, ids, weights, out, s);
            times[r] = (double)(nm_time_ns() - t0) * 1e-6;
        }
        qsort(times, (size_t)reps, sizeof *times, cmp_ms);
        const double med =
            reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
        if (med < *ms) *ms = med;
    }
out:
    nm_free(x);
    nm_free(out);
    nm_free(weights);
    nm_free(ids);
    nm_free(times);
    nm_moe_scratch_free(s);
    return st;
}
