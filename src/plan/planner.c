/* The planner: a calibration (per-chunk loads of every expert) and a
 * measured device profile in, a static plan out (DESIGN.md section 1).
 *
 * Tiers. Each expert gets the smallest tier >= the chosen quantile (0.95 by
 * default) of its per-chunk load, the largest tier if none is; an expert
 * never seen gets the smallest. Default tiers: the powers of two in
 * [T/64, T) and T. The mean load is T*k/E, T/16 to T/4 in the MoE models we
 * target, so T/64 is a cold expert's load; colder experts end up on the host
 * anyway, and halving steps waste at most half a tier in padding.
 *
 * Groups and residency. Within one layer and tier, experts are ordered by
 * their host cost (hottest first) and cut into consecutive groups of g;
 * each group goes to the device only if its device cost (the graph's time
 * for (g, tier), interpolated from the profile, dispatch included, plus the
 * expected host cost of its spills) beats the host cost of its expected
 * load (per expert host_expert_ms * P(active in a chunk) + host_row_ms *
 * mean load). g is the size that minimises the tier's predicted time per
 * chunk (device groups plus host groups), at most the largest expert count
 * the profile measured; ties go to the larger g, fewer dispatches.
 *
 * Memory. If the device groups hold more than the budget (weights of their
 * experts as the model stores them, plus the graph's input, output and two
 * d_ff buffers in f32, as the cpu device allocates), they are admitted in
 * order of predicted saving (host cost - device cost), each that still fits;
 * the others run on the host.
 *
 * Cost. Per layer: device_ms, the sum of the device graphs' times (the
 * executor dispatches every device group each chunk); host_ms, the host
 * groups' expected cost and the device groups' expected spills, in CPU time
 * (the profile measures one host thread while all are busy), plus the
 * host's per-chunk overhead of the MoE step (the profile's
 * host_overhead_ms, scaled from its chunk length to the plan's: table,
 * gather, scatter and combine grow with the tokens); chunk_ms = max of the
 * two, as they overlap. */
#include "plan-impl.h"

#include "base/base.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

nm_plan_params nm_plan_default_params(void) {
    return (nm_plan_params){
        .tiers = NULL,
        .n_tiers = 0,
        .quantile = 0.95,
        .overflow = NM_OVERFLOW_SPILL,
        /* measured on the shipped model with drop (docs/NPUMOE.md): the router
         * weight loses 5-20x less than the activation norms at every quantile */
        .salience = NM_SALIENCE_ROUTER,
        .device_memory_bytes = UINT64_MAX,
        .max_group_experts = 0,
    };
}

void nm_plan_free(nm_plan *plan) {
    if (!plan) return;
    for (int32_t l = 0; plan->moe.layers && l < plan->moe.n_layer; l++) {
        nm_moe_layer_plan *lp = &plan->moe.layers[l];
        for (int32_t g = 0; lp->groups && g < lp->n_groups; g++)
            nm_free(lp->groups[g].experts);
        nm_free(lp->groups);
    }
    nm_free(plan->moe.layers);
    nm_free(plan->layer_cost);
    nm_free(plan->tiers);
    nm_free(plan);
}

/* ---- graph time from the profile ---- */

/* The profile as a grid: ms[i][j] is the time of counts[i] experts of
 * capacity caps[j]. */
typedef struct grid {
    int32_t n_counts, n_caps;
    int32_t *counts; /* [n_counts] ascending */
    int32_t *caps;   /* [n_caps] ascending */
    double *ms;      /* [n_counts][n_caps] */
    double *line;    /* [n_counts] scratch */
    double dispatch_ms;
} grid;

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Sorted distinct values of v[0..n) in place; returns how many. */
static int32_t unique(int32_t *v, int32_t n) {
    qsort(v, (size_t)n, sizeof *v, cmp_i32);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (m == 0 || v[m - 1] != v[i]) v[m++] = v[i];
    return m;
}

static int32_t index_of(const int32_t *v, int32_t n, int32_t x) {
    const int32_t *p = bsearch(&x, v, (size_t)n, sizeof *v, cmp_i32);
    NM_ASSERT(p);
    return (int32_t)(p - v);
}

static void grid_free(grid *g) {
    nm_free(g->counts);
    nm_free(g->caps);
    nm_free(g->ms);
    nm_free(g->line);
}

/* p has passed nm_profile_check: a full grid without duplicates. */
static nm_status grid_build(const nm_profile *p, grid *g, nm_error *err) {
    memset(g, 0, sizeof *g);
    const size_t n = (size_t)p->n_points;
    g->counts = nm_malloc(n * sizeof(int32_t));
    g->caps = nm_malloc(n * sizeof(int32_t));
    g->ms = nm_malloc(n * sizeof(double));
    g->line = nm_malloc(n * sizeof(double));
    if (!g->counts || !g->caps || !g->ms || !g->line) {
        grid_free(g);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the profile's grid");
    }
    for (size_t i = 0; i < n; i++) {
        g->counts[i] = p->points[i].n_experts;
        g->caps[i] = p->points[i].capacity;
    }
    g->n_counts = unique(g->counts, (int32_t)n);
    g->n_caps = unique(g->caps, (int32_t)n);
    NM_ASSERT((size_t)g->n_counts * (size_t)g->n_caps == n);
    for (size_t i = 0; i < n; i++) {
        const int32_t a = index_of(g->counts, g->n_counts, p->points[i].n_experts);
        const int32_t b = index_of(g->caps, g->n_caps, p->points[i].capacity);
        g->ms[(size_t)a * (size_t)g->n_caps + (size_t)b] = p->points[i].graph_ms;
    }
    g->dispatch_ms = p->dispatch_ms;
    return NM_OK;
}

/* y at x from measured (xs, ys), m points. Between points: linear. Below
 * the first: the first's time (a smaller graph is not assumed cheaper, the
 * cautious side). Beyond the last: the last segment's slope (never
 * negative) continued; with one point, its compute time (beyond dispatch)
 * scaled with x, since a graph's work grows with experts and rows. */
static double interp(const int32_t *xs, const double *ys, int32_t m, double x, double dispatch) {
    if (x <= xs[0]) return ys[0];
    if (m == 1) return dispatch + fmax(0.0, ys[0] - dispatch) * x / xs[0];
    if (x >= xs[m - 1]) {
        const double slope = (ys[m - 1] - ys[m - 2]) / (double)(xs[m - 1] - xs[m - 2]);
        return ys[m - 1] + fmax(0.0, slope) * (x - xs[m - 1]);
    }
    int32_t i = 0;
    while (xs[i + 1] < x)
        i++;
    const double t = (x - xs[i]) / (double)(xs[i + 1] - xs[i]);
    return ys[i] + t * (ys[i + 1] - ys[i]);
}

/* Predicted submit + wait of one graph of n experts of capacity c:
 * bilinear over the grid, and never less than one dispatch. */
static double graph_ms(const grid *g, int32_t n, int32_t c) {
    for (int32_t i = 0; i < g->n_counts; i++)
        g->line[i] =
            interp(g->caps, g->ms + (size_t)i * (size_t)g->n_caps, g->n_caps, c, g->dispatch_ms);
    return fmax(g->dispatch_ms, interp(g->counts, g->line, g->n_counts, n, g->dispatch_ms));
}

/* ---- per expert ---- */

typedef struct expert_info {
    int32_t id;
    int32_t tier;    /* index into the tier set */
    double host_ms;  /* expected host cost per chunk on the host */
    double spill_ms; /* expected host cost per chunk of its spills at its tier */
} expert_info;

/* Hottest first within a tier; tiers from the largest. */
static int by_tier_then_heat(const void *pa, const void *pb) {
    const expert_info *a = pa, *b = pb;
    if (a->tier != b->tier) return a->tier > b->tier ? -1 : 1;
    if (a->host_ms != b->host_ms) return a->host_ms > b->host_ms ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Host cost of the assignments beyond capacity c: each chunk that overflows
 * is one more host job of (load - c) rows. */
static double spill_ms(const nm_calib *calib, int32_t l, int32_t e, int32_t c,
                       const nm_profile *p) {
    const int64_t *h = calib->hist + ((size_t)l * (size_t)calib->n_expert + (size_t)e) *
                                         (size_t)(calib->chunk + 1);
    double n = 0, over = 0, rows = 0;
    for (int32_t x = 0; x <= calib->chunk; x++) {
        n += (double)h[x];
        if (x > c) {
            over += (double)h[x];
            rows += (double)(x - c) * (double)h[x];
        }
    }
    return n > 0 ? (p->host_expert_ms * over + p->host_row_ms * rows) / n : 0.0;
}

/* ---- groups ---- */

/* What the planner knows about one group beyond nm_moe_group. */
typedef struct group_info {
    int32_t layer, index;
    double device_ms; /* graph time */
    double spill_ms;  /* host cost of spills when on the device */
    double host_ms;   /* host cost when on the host */
    uint64_t bytes;   /* device memory when on the device */
} group_info;

typedef struct planner {
    const nm_model *model;
    const nm_calib *calib;
    const nm_profile *profile;
    nm_plan_params params;
    grid grid;
    int32_t max_group;
    expert_info *experts; /* [n_expert] scratch */
    group_info *info;     /* [n_layer * n_expert] */
    int32_t n_info;
    nm_plan *plan;
} planner;

/* Cost of the tier's m experts (ordered hottest first) cut into groups of
 * g, each group where it is cheaper. */
static double tier_cost(const planner *pl, const expert_info *ex, int32_t m, int32_t g,
                        int32_t capacity) {
    double total = 0;
    for (int32_t s = 0; s < m; s += g) {
        const int32_t n = m - s < g ? m - s : g;
        double host = 0, dev = graph_ms(&pl->grid, n, capacity);
        for (int32_t i = s; i < s + n; i++) {
            host += ex[i].host_ms;
            dev += ex[i].spill_ms;
        }
        total += dev < host ? dev : host;
    }
    return total;
}

static nm_status emit_groups(planner *pl, int32_t l, const expert_info *ex, int32_t m, int32_t g,
                             int32_t capacity, nm_error *err) {
    nm_moe_layer_plan *lp = &pl->plan->moe.layers[l];
    const nm_expert_weights *w = &pl->model->layers[l].experts;
    const uint64_t expert_bytes = (uint64_t)w->gate.row_bytes * (uint64_t)w->gate.n +
                                  (uint64_t)w->up.row_bytes * (uint64_t)w->up.n +
                                  (uint64_t)w->down.row_bytes * (uint64_t)w->down.n;
    const uint64_t row_bytes =
        2 * sizeof(float) * ((uint64_t)pl->model->hp.n_embd + (uint64_t)pl->model->hp.n_ff_exp);
    for (int32_t s = 0; s < m; s += g) {
        const int32_t n = m - s < g ? m - s : g;
        nm_moe_group *grp = &lp->groups[lp->n_groups];
        grp->experts = nm_malloc((size_t)n * sizeof(int32_t));
        if (!grp->experts) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
        grp->capacity = capacity;
        grp->n_experts = n;
        group_info *gi = &pl->info[pl->n_info++];
        *gi = (group_info){.layer = l,
                           .index = lp->n_groups,
                           .device_ms = graph_ms(&pl->grid, n, capacity),
                           .bytes = (uint64_t)n * (expert_bytes + (uint64_t)capacity * row_bytes)};
        for (int32_t i = 0; i < n; i++) {
            grp->experts[i] = ex[s + i].id;
            gi->host_ms += ex[s + i].host_ms;
            gi->spill_ms += ex[s + i].spill_ms;
        }
        grp->on_device = gi->device_ms + gi->spill_ms < gi->host_ms;
        lp->n_groups++;
    }
    return NM_OK;
}

static nm_status plan_layer(planner *pl, int32_t l, nm_error *err) {
    const nm_calib *calib = pl->calib;
    const nm_profile *p = pl->profile;
    const int32_t n_expert = calib->n_expert;
    const int32_t *tiers = pl->plan->tiers;
    const int32_t n_tiers = pl->plan->n_tiers;
    expert_info *ex = pl->experts;
    for (int32_t e = 0; e < n_expert; e++) {
        const int32_t need = nm_calib_quantile(calib, l, e, pl->params.quantile);
        int32_t t = 0;
        while (t < n_tiers - 1 && tiers[t] < need)
            t++;
        ex[e] = (expert_info){
            .id = e,
            .tier = t,
            .host_ms = p->host_expert_ms * nm_calib_p_active(calib, l, e) +
                       p->host_row_ms * nm_calib_mean(calib, l, e),
            .spill_ms =
                pl->params.overflow == NM_OVERFLOW_SPILL ? spill_ms(calib, l, e, tiers[t], p) : 0.0,
        };
    }
    qsort(ex, (size_t)n_expert, sizeof *ex, by_tier_then_heat);
    pl->plan->moe.layers[l].groups = nm_calloc((size_t)n_expert, sizeof(nm_moe_group));
    if (!pl->plan->moe.layers[l].groups)
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    for (int32_t s = 0; s < n_expert;) {
        int32_t m = 1;
        while (s + m < n_expert && ex[s + m].tier == ex[s].tier)
            m++;
        const int32_t capacity = tiers[ex[s].tier];
        const int32_t g_max = m < pl->max_group ? m : pl->max_group;
        int32_t best_g = g_max;
        double best = tier_cost(pl, ex + s, m, g_max, capacity);
        for (int32_t g = g_max - 1; g >= 1; g--) {
            const double cost = tier_cost(pl, ex + s, m, g, capacity);
            if (cost < best - 1e-12 * fmax(1.0, best)) {
                best = cost;
                best_g = g;
            }
        }
        nm_status st = emit_groups(pl, l, ex + s, m, best_g, capacity, err);
        if (st != NM_OK) return st;
        s += m;
    }
    return NM_OK;
}

/* Larger saving first; then layer and group order, so plans are
 * reproducible. */
static int by_saving(const void *pa, const void *pb) {
    const group_info *a = *(const group_info *const *)pa, *b = *(const group_info *const *)pb;
    const double sa = a->host_ms - a->device_ms - a->spill_ms;
    const double sb = b->host_ms - b->device_ms - b->spill_ms;
    if (sa != sb) return sa > sb ? -1 : 1;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

static nm_status apply_budget(planner *pl, nm_error *err) {
    nm_plan *plan = pl->plan;
    const uint64_t budget = pl->params.device_memory_bytes;
    uint64_t total = 0;
    int32_t n_dev = 0;
    for (int32_t i = 0; i < pl->n_info; i++) {
        const group_info *gi = &pl->info[i];
        if (!plan->moe.layers[gi->layer].groups[gi->index].on_device) continue;
        total += gi->bytes;
        n_dev++;
    }
    if (total <= budget) return NM_OK;
    const group_info **order = nm_malloc((size_t)(n_dev > 0 ? n_dev : 1) * sizeof *order);
    if (!order) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    n_dev = 0;
    for (int32_t i = 0; i < pl->n_info; i++)
        if (plan->moe.layers[pl->info[i].layer].groups[pl->info[i].index].on_device)
            order[n_dev++] = &pl->info[i];
    qsort(order, (size_t)n_dev, sizeof *order, by_saving);
    uint64_t used = 0;
    for (int32_t i = 0; i < n_dev; i++) {
        nm_moe_group *grp = &plan->moe.layers[order[i]->layer].groups[order[i]->index];
        if (order[i]->bytes <= budget - used)
            used += order[i]->bytes;
        else
            grp->on_device = false;
    }
    nm_free(order);
    return NM_OK;
}

static void compute_costs(planner *pl) {
    nm_plan *plan = pl->plan;
    plan->predicted_chunk_ms = 0;
    plan->device_bytes = 0;
    for (int32_t i = 0; i < pl->n_info; i++) {
        const group_info *gi = &pl->info[i];
        nm_plan_cost *c = &plan->layer_cost[gi->layer];
        if (plan->moe.layers[gi->layer].groups[gi->index].on_device) {
            c->device_ms += gi->device_ms;
            c->host_ms += gi->spill_ms;
            plan->device_bytes += gi->bytes;
        } else {
            c->host_ms += gi->host_ms;
        }
    }
    const double overhead_ms =
        pl->profile->host_overhead_ms * (double)pl->calib->chunk / (double)pl->profile->chunk;
    for (int32_t l = 0; l < plan->moe.n_layer; l++) {
        nm_plan_cost *c = &plan->layer_cost[l];
        c->host_ms += overhead_ms;
        c->chunk_ms = fmax(c->device_ms, c->host_ms);
        plan->predicted_chunk_ms += c->chunk_ms;
    }
}

/* ---- checks ---- */

static nm_status check_params(const nm_plan_params *p, int32_t chunk, nm_error *err) {
    if (!(p->quantile > 0.0 && p->quantile <= 1.0))
        return nm_errorf(err, NM_ERR_INVALID_ARG, "quantile %g is not in (0, 1]", p->quantile);
    if ((unsigned)p->overflow >= NM_OVERFLOW_COUNT || (unsigned)p->salience >= NM_SALIENCE_COUNT)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown overflow (%d) or salience (%d) policy",
                         (int)p->overflow, (int)p->salience);
    if (p->max_group_experts < 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "max_group_experts %d is negative",
                         p->max_group_experts);
    if (!p->tiers) return NM_OK;
    if (p->n_tiers < 1 || p->n_tiers > NM_PLAN_MAX_TIERS)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "%d tiers: expected 1 to %d", p->n_tiers,
                         NM_PLAN_MAX_TIERS);
    for (int32_t i = 0; i < p->n_tiers; i++) {
        if (p->tiers[i] < 1 || p->tiers[i] > chunk)
            return nm_errorf(err, NM_ERR_INVALID_ARG, "tier %d is not in [1, chunk %d]",
                             p->tiers[i], chunk);
        if (i > 0 && p->tiers[i] <= p->tiers[i - 1])
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "tiers must be strictly ascending: %d follows %d", p->tiers[i],
                             p->tiers[i - 1]);
    }
    return NM_OK;
}

static nm_status set_tiers(nm_plan *plan, const nm_plan_params *p, int32_t chunk, nm_error *err) {
    int32_t tiers[NM_PLAN_MAX_TIERS], n = 0;
    if (p->tiers) {
        for (n = 0; n < p->n_tiers; n++)
            tiers[n] = p->tiers[n];
    } else {
        for (int64_t c = 1; c < chunk; c *= 2)
            if (c * 64 >= chunk) tiers[n++] = (int32_t)c;
        tiers[n++] = chunk;
    }
    plan->tiers = nm_malloc((size_t)n * sizeof(int32_t));
    if (!plan->tiers) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    memcpy(plan->tiers, tiers, (size_t)n * sizeof(int32_t));
    plan->n_tiers = n;
    return NM_OK;
}

static nm_status check_inputs(const nm_model *model, const nm_calib *calib,
                              const nm_profile *profile, nm_error *err) {
    nm_status st = nm_calib_check_model(calib, model, err);
    if (st != NM_OK) return st;
    if (calib->n_chunks < 1)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "the calibration has recorded no chunks");
    if ((st = nm_profile_check(profile, err)) != NM_OK) {
        nm_error_prefix(err, "the profile");
        return st;
    }
    if (profile->d_model != model->hp.n_embd || profile->d_ff != model->hp.n_ff_exp)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the profile was measured with d_model %lld and d_ff %lld, the model has "
                         "d_model %d and d_ff %d",
                         (long long)profile->d_model, (long long)profile->d_ff, model->hp.n_embd,
                         model->hp.n_ff_exp);
    return NM_OK;
}

nm_status nm_plan_make(const nm_model *model, const nm_calib *calib, const nm_profile *profile,
                       const nm_plan_params *params, nm_plan **out, nm_error *err) {
    NM_ASSERT(model && calib && profile && out);
    *out = NULL;
    planner pl = {.model = model, .calib = calib, .profile = profile};
    pl.params = params ? *params : nm_plan_default_params();
    nm_status st = check_inputs(model, calib, profile, err);
    if (st == NM_OK) st = check_params(&pl.params, calib->chunk, err);
    if (st != NM_OK) return st;
    if ((st = grid_build(profile, &pl.grid, err)) != NM_OK) return st;
    pl.max_group = pl.params.max_group_experts;
    if (pl.max_group == 0) pl.max_group = pl.grid.counts[pl.grid.n_counts - 1];

    const int32_t n_layer = calib->n_layer, n_expert = calib->n_expert;
    nm_plan *plan = nm_calloc(1, sizeof *plan);
    pl.plan = plan;
    pl.experts = nm_malloc((size_t)n_expert * sizeof *pl.experts);
    pl.info = nm_malloc((size_t)n_layer * (size_t)n_expert * sizeof *pl.info);
    if (plan) {
        plan->moe.layers = nm_calloc((size_t)n_layer, sizeof *plan->moe.layers);
        plan->layer_cost = nm_calloc((size_t)n_layer, sizeof *plan->layer_cost);
        plan->moe.n_layer = n_layer; /* after layers: nm_plan_free walks them */
    }
    if (!plan || !pl.experts || !pl.info || !plan->moe.layers || !plan->layer_cost)
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    if (st == NM_OK) {
        plan->fingerprint = calib->fingerprint;
        snprintf(plan->device, sizeof plan->device, "%s", profile->device);
        plan->moe.chunk = calib->chunk;
        plan->moe.n_expert = n_expert;
        plan->moe.overflow = pl.params.overflow;
        plan->moe.salience = pl.params.salience;
        plan->quantile = pl.params.quantile;
        st = set_tiers(plan, &pl.params, calib->chunk, err);
    }
    for (int32_t l = 0; l < n_layer && st == NM_OK; l++)
        st = plan_layer(&pl, l, err);
    if (st == NM_OK) st = apply_budget(&pl, err);
    if (st == NM_OK) {
        compute_costs(&pl);
        st = nm_moe_plan_check(&plan->moe, n_layer, n_expert, err);
        NM_ASSERT(st == NM_OK || st == NM_ERR_NOMEM); /* every expert is placed once */
    }
    grid_free(&pl.grid);
    nm_free(pl.experts);
    nm_free(pl.info);
    if (st != NM_OK) {
        nm_plan_free(plan);
        return st;
    }
    *out = plan;
    return NM_OK;
}
