/* `npumoe profile`: what a device's graphs and the host's expert FFNs cost,
 * measured on a layer's own weights, for the planner's cost model. Timing
 * only: no results are checked here (tests/test_device.c does that). */
#include "device.h"

#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows per expert at which the host cost is measured. Powers of two up to 64
 * cover the loads cold experts see; the line fitted through them is what the
 * planner extrapolates from. */
static const int64_t host_rows[] = {1, 2, 4, 8, 16, 32, 64};
enum { N_HOST_ROWS = sizeof host_rows / sizeof host_rows[0] };

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double nm_median(double *v, int n) {
    NM_ASSERT(v && n >= 1);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Deterministic values in [-1, 1): the kernels' cost does not depend on
 * them, but zeros or denormals could. */
static void fill_random(float *x, int64_t n, uint32_t *state) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t s = *state;
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        *state = s;
        x[i] = (float)(s >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
}

/* Compiles spec, runs it once untimed (first touch of the buffers), then
 * reps times. *graph_ms: median submit + wait. *overhead_ms (if not NULL):
 * median of submit + wait minus the time the device reports executing
 * (busy_ns) in that same run. times: scratch [reps]. */
static nm_status time_graph(nm_device *dev, const nm_ffn_spec *spec, int reps, double *times,
                            double *graph_ms, double *overhead_ms, nm_error *err) {
    nm_graph *g = NULL;
    nm_status st = dev->ops->compile(dev, spec, &g, err);
    if (st) return st;
    uint32_t seed = 0x9e3779b9u;
    fill_random(dev->ops->input(g), nm_ffn_spec_rows(spec) * spec->d_model, &seed);
    dev->ops->submit(g);
    dev->ops->wait(g);
    for (int r = 0; r < reps; r++) {
        const int64_t t0 = nm_time_ns();
        dev->ops->submit(g);
        dev->ops->wait(g);
        times[r] = (double)(nm_time_ns() - t0) * 1e-6;
    }
    *graph_ms = nm_median(times, reps);
    if (overhead_ms) {
        nm_device_stats before, after;
        for (int r = 0; r < reps; r++) {
            dev->ops->stats(dev, &before);
            const int64_t t0 = nm_time_ns();
            dev->ops->submit(g);
            dev->ops->wait(g);
            const int64_t t1 = nm_time_ns();
            dev->ops->stats(dev, &after);
            times[r] = (double)(t1 - t0 - (after.busy_ns - before.busy_ns)) * 1e-6;
        }
        *overhead_ms = nm_median(times, reps);
    }
    dev->ops->graph_free(g);
    return NM_OK;
}

/* ---- the host side ---- */

typedef struct host_ctx {
    const nm_expert_weights *w;
    int64_t d_model, d_ff;
    int64_t m;       /* rows of this measurement */
    int64_t m_max;   /* rows the buffers hold per thread */
    float *x;        /* [n_threads][m_max][d_model] the rows, random */
    float *y;        /* [n_threads][m_max][d_model] */
    float *g;        /* [n_threads][m_max][d_ff] */
    float *u;        /* [n_threads][m_max][d_ff] */
    double *task_ms; /* [n_tasks] */
    int32_t expert0; /* task i runs expert (expert0 + i) % n_expert */
} host_ctx;

/* One expert over m rows on one host thread: the work one task of the dense
 * MoE does, with the same function (its gather, a copy of m rows, is left
 * out). */
static void host_expert_task(void *p, int i, int thread) {
    host_ctx *c = p;
    const nm_expert_weights *w = c->w;
    const int64_t dm = c->d_model, ff = c->d_ff, m = c->m;
    const int32_t e = (c->expert0 + i) % w->n_expert;
    const float *x = c->x + (size_t)thread * c->m_max * dm;
    float *y = c->y + (size_t)thread * c->m_max * dm;
    float *g = c->g + (size_t)thread * c->m_max * ff;
    float *u = c->u + (size_t)thread * c->m_max * ff;
    const int64_t t0 = nm_time_ns();
    nm_expert_ffn_forward(w, e, x, dm, m, g, u, y, dm);
    c->task_ms[i] = (double)(nm_time_ns() - t0) * 1e-6;
}

/* Least squares t = a + b m over n points. A negative intercept is noise
 * around a fixed cost too small to see (f32 weights need no conversion):
 * then the fit is redone with a = 0, the constrained least-squares answer,
 * rather than handing the planner a negative cost. */
static void fit_line(const double *m, const double *t, int n, double *a, double *b) {
    double sm = 0, st = 0;
    for (int i = 0; i < n; i++) {
        sm += m[i];
        st += t[i];
    }
    const double mm = sm / n, tm = st / n;
    double sxy = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        sxy += (m[i] - mm) * (t[i] - tm);
        sxx += (m[i] - mm) * (m[i] - mm);
    }
    *b = sxy / sxx;
    *a = tm - *b * mm;
    if (*a < 0) {
        double smt = 0, smm = 0;
        for (int i = 0; i < n; i++) {
            smt += m[i] * t[i];
            smm += m[i] * m[i];
        }
        *a = 0;
        *b = smt / smm;
    }
}

/* Every thread of the pool runs one expert task at once, as the dense MoE
 * keeps them all busy, so memory traffic is shared as it will be; the cost of
 * one task at each row count, t[k], is the median over all tasks of all
 * reps. */
static void time_host_rows(host_ctx *c, nm_pool *pool, int reps, double *t,
                           void (*progress)(void *, int, int), void *progress_ctx, int done,
                           int total) {
    const int n_threads = nm_pool_n_threads(pool);
    double *task_ms = c->task_ms;
    for (int k = 0; k < N_HOST_ROWS; k++) {
        c->m = host_rows[k];
        c->expert0 = 0;
        nm_pool_run(pool, host_expert_task, c, n_threads); /* warm-up, untimed */
        for (int r = 0; r < reps; r++) {
            c->expert0 = (r * n_threads) % c->w->n_expert;
            /* task_ms is indexed by task: each rep writes its own slice */
            c->task_ms = task_ms + (size_t)r * (size_t)n_threads;
            nm_pool_run(pool, host_expert_task, c, n_threads);
            c->task_ms = task_ms;
        }
        t[k] = nm_median(task_ms, n_threads * reps);
        if (progress) progress(progress_ctx, ++done, total);
    }
}

/* Measurements of the host that give a per-row cost <= 0 (times falling as
 * rows grow: another process took the cores while the small row counts were
 * timed) are repeated with twice the reps, up to this many times, before the
 * profile is refused. */
enum { HOST_RETRIES = 3 };

static nm_status profile_host(const nm_expert_weights *w, int64_t d_model, int64_t d_ff, int reps,
                              nm_pool *pool, double *host_expert_ms, double *host_row_ms,
                              void (*progress)(void *, int, int), void *progress_ctx, int done,
                              int total, nm_error *err) {
    const int n_threads = nm_pool_n_threads(pool);
    const int64_t m_max = host_rows[N_HOST_ROWS - 1];
    const size_t per_thread = (size_t)n_threads * (size_t)m_max;
    const int max_reps = reps << HOST_RETRIES;
    host_ctx c = {.w = w, .d_model = d_model, .d_ff = d_ff, .m_max = m_max};
    c.x = nm_malloc(per_thread * (size_t)d_model * sizeof(float));
    c.y = nm_malloc(per_thread * (size_t)d_model * sizeof(float));
    c.g = nm_malloc(per_thread * (size_t)d_ff * sizeof(float));
    c.u = nm_malloc(per_thread * (size_t)d_ff * sizeof(float));
    c.task_ms = nm_malloc((size_t)n_threads * (size_t)max_reps * sizeof(double));
    nm_status st = NM_OK;
    if (!c.x || !c.y || !c.g || !c.u || !c.task_ms) {
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for the host measurement");
        goto out;
    }
    uint32_t seed = 0x2545f491u;
    fill_random(c.x, (int64_t)per_thread * d_model, &seed);
    double ms[N_HOST_ROWS], t[N_HOST_ROWS];
    for (int k = 0; k < N_HOST_ROWS; k++)
        ms[k] = (double)host_rows[k];
    for (int attempt = 0;; attempt++) {
        /* progress counts the first pass; a repeat is not in the total */
        time_host_rows(&c, pool, reps << attempt, t, attempt == 0 ? progress : NULL, progress_ctx,
                       done, total);
        fit_line(ms, t, N_HOST_ROWS, host_expert_ms, host_row_ms);
        if (*host_row_ms > 0) break;
        if (attempt == HOST_RETRIES) {
            st = nm_errorf(err, NM_ERR_INVALID_ARG,
                           "the host's cost per row did not come out positive in %d "
                           "measurements up to %d reps (%.4g ms at 1 row, %.4g ms at %lld): "
                           "the cores are too busy to time; rerun on a quieter machine",
                           HOST_RETRIES + 1, max_reps, t[0], t[N_HOST_ROWS - 1], (long long)m_max);
            goto out;
        }
    }
    /* n_threads tasks of that cost finish together: the wall time the host
     * adds per expert and per row is the task cost shared by the threads */
    *host_expert_ms /= n_threads;
    *host_row_ms /= n_threads;
out:
    nm_free(c.x);
    nm_free(c.y);
    nm_free(c.g);
    nm_free(c.u);
    nm_free(c.task_ms);
    return st;
}

/* ---- the whole measurement ---- */

nm_status nm_device_profile(nm_device *dev, const nm_expert_weights *w, int64_t d_model,
                            int64_t d_ff, const int32_t *grid_experts, int n_grid_experts,
                            const int32_t *grid_capacity, int n_grid_capacity, int reps,
                            nm_pool *host_pool, void (*progress)(void *ctx, int done, int total),
                            void *progress_ctx, nm_profile *out, nm_error *err) {
    NM_ASSERT(dev && w && host_pool && out);
    memset(out, 0, sizeof *out);
    if (reps < 1) return nm_errorf(err, NM_ERR_INVALID_ARG, "profile: reps %d is not >= 1", reps);
    if (n_grid_experts < 1 || n_grid_capacity < 1)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "profile: the grid is empty (%d expert counts, %d capacities)",
                         n_grid_experts, n_grid_capacity);
    int32_t max_experts = 1;
    for (int i = 0; i < n_grid_experts; i++) {
        if (grid_experts[i] < 1 || grid_experts[i] > w->n_expert)
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "profile: %d experts per graph is not in 1..%d (the layer's experts)",
                             grid_experts[i], w->n_expert);
        if (grid_experts[i] > max_experts) max_experts = grid_experts[i];
    }
    for (int i = 0; i < n_grid_capacity; i++)
        if (grid_capacity[i] < 1)
            return nm_errorf(err, NM_ERR_INVALID_ARG, "profile: capacity %d is not >= 1",
                             grid_capacity[i]);
    /* the graphs below are spec'd as layer 0, whichever layer w is */
    if (nm_device_check_ffn(dev, w, 0, err) != NM_OK) return nm_error_prefix(err, "profile");

    const int n_points = n_grid_experts * n_grid_capacity;
    const int total = 1 + n_points + N_HOST_ROWS;
    int done = 0;
    int32_t *experts = nm_malloc((size_t)max_experts * sizeof(int32_t));
    int32_t *capacity = nm_malloc((size_t)max_experts * sizeof(int32_t));
    double *times = nm_malloc((size_t)reps * sizeof(double));
    out->points = nm_calloc((size_t)n_points, sizeof *out->points);
    nm_status st = NM_OK;
    if (!experts || !capacity || !times || !out->points) {
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for %d points", n_points);
        goto out;
    }
    snprintf(out->device, sizeof out->device, "%s", dev->ops->name);
    out->d_model = d_model;
    out->d_ff = d_ff;
    out->weight_type = w->gate.type;
    out->granule = nm_device_row_granule(dev);
    for (int32_t i = 0; i < max_experts; i++)
        experts[i] = i;
    nm_ffn_spec spec = {.layer = 0,
                        .experts = experts,
                        .capacity = capacity,
                        .d_model = d_model,
                        .d_ff = d_ff,
                        .weights = w};

    /* dispatch_ms: the round trip of the smallest graph (one expert, one
     * row) minus the execution time the device reports for that same run,
     * median over reps. It is the price of one more graph beyond its
     * compute, which grouping saves; the subtraction is per run so it stays
     * positive however noisy. On the cpu device it is the hand-off to the
     * device thread and back (two thread wake-ups). */
    spec.n_experts = 1;
    capacity[0] = 1;
    double smallest_ms;
    st = time_graph(dev, &spec, reps, times, &smallest_ms, &out->dispatch_ms, err);
    if (st) goto out;
    if (progress) progress(progress_ctx, ++done, total);

    for (int i = 0; i < n_grid_experts; i++) {
        for (int j = 0; j < n_grid_capacity; j++) {
            spec.n_experts = grid_experts[i];
            for (int32_t e = 0; e < spec.n_experts; e++)
                capacity[e] = grid_capacity[j];
            nm_profile_point *pt = &out->points[out->n_points];
            pt->n_experts = grid_experts[i];
            pt->capacity = grid_capacity[j];
            st = time_graph(dev, &spec, reps, times, &pt->graph_ms, NULL, err);
            if (st) goto out;
            out->n_points++;
            if (progress) progress(progress_ctx, ++done, total);
        }
    }
    st = profile_host(w, d_model, d_ff, reps, host_pool, &out->host_expert_ms, &out->host_row_ms,
                      progress, progress_ctx, done, total, err);
out:
    nm_free(experts);
    nm_free(capacity);
    nm_free(times);
    if (st) {
        nm_error_prefix(err, "profile");
        nm_profile_free(out);
    }
    return st;
}

void nm_profile_free(nm_profile *p) {
    if (!p) return;
    nm_free(p->points);
    p->points = NULL;
    p->n_points = 0;
}

void nm_profile_set_overhead(nm_profile *p, int32_t chunk, double step_ms, const int32_t *loads,
                             int32_t n_expert) {
    NM_ASSERT(p && chunk >= 1 && loads && n_expert >= 1);
    double fit_ms = 0;
    for (int32_t e = 0; e < n_expert; e++)
        if (loads[e] > 0) fit_ms += p->host_expert_ms + p->host_row_ms * loads[e];
    p->chunk = chunk;
    p->host_overhead_ms = step_ms > fit_ms ? step_ms - fit_ms : 0.0;
}
