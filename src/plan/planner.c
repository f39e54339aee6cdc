/* The planner: a calibration (per-chunk loads of every expert) and a
 * measured device profile in, a static plan out (DESIGN.md section 1).
 *
 * Tiers, budget objective (the default). Each layer has a budget of rows
 * per chunk (given, from a device time and the profile's per-row cost, or
 * the rows the quantile rule below would reserve). Capacities are multiples
 * of a granule g; every expert starts at g, and g rows at a time go to the
 * expert whose next g rows save the most expected overflow per chunk: the
 * routing weight of the assignments beyond capacity (the lightest, which
 * router salience drops) with drop and router salience, else their count,
 * as nm_calib_predict_overflow expects them of a new chunk. Both are convex
 * and decreasing in the capacity, so this greedy allocation is optimal
 * (nm_plan_allocate; the argument is in docs/NPUMOE.md). The plan's
 * predicted drop rate is the same prediction at the chosen capacities.
 *
 * Tiers, quantile objective. Each expert gets the smallest tier >= the
 * chosen quantile (0.95 by default) of its per-chunk load, the largest tier
 * if none is; an expert never seen gets the smallest. Default tiers: the
 * powers of two in [T/64, T) and T. The mean load is T*k/E, T/16 to T/4 in
 * the MoE models we target, so T/64 is a cold expert's load; colder experts
 * end up on the host anyway, and halving steps waste at most half a tier in
 * padding. A device that computes rows in blocks (the profile's granule)
 * gets its capacities rounded up to them: the budget's default granule is
 * a multiple of it, and the default tiers are rounded up to one.
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
 * two, as they overlap.
 *
 * The dense part of a layer (attention and router, graph kind 2). It runs
 * before routing and routing before the experts, so nothing overlaps it:
 * a layer's dense part goes to the device when the profile measured the
 * device's launch (with its copies) cheaper than the host doing the same
 * work, else it stays on the host; both costs are per chunk of the
 * profile's length, scaled to the plan's. Every layer has the same form,
 * so the choice is the same in every layer. A profile without that
 * measurement (older files, a device without dense graphs for the
 * model's form) leaves a layer's dense part where its groups are: on the
 * device when one of them is, as sessions did before plans carried the
 * choice. params.dense forces either side. */
#include "plan-impl.h"

#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const objective_names[NM_PLAN_OBJECTIVE_COUNT] = {
    [NM_PLAN_BUDGET] = "budget",
    [NM_PLAN_QUANTILE] = "quantile",
};

const char *nm_plan_objective_name(nm_plan_objective objective) {
    return (unsigned)objective < NM_PLAN_OBJECTIVE_COUNT ? objective_names[objective] : "unknown";
}

static const char *const placement_names[NM_DENSE_PLACEMENT_COUNT] = {
    [NM_DENSE_BY_PROFILE] = "profile",
    [NM_DENSE_ON_HOST] = "host",
    [NM_DENSE_ON_DEVICE] = "device",
};

const char *nm_dense_placement_name(nm_dense_placement placement) {
    return (unsigned)placement < NM_DENSE_PLACEMENT_COUNT ? placement_names[placement] : "unknown";
}

nm_status nm_dense_placement_parse(const char *name, nm_dense_placement *out, nm_error *err) {
    for (int i = 0; name && i < NM_DENSE_PLACEMENT_COUNT; i++)
        if (strcmp(name, placement_names[i]) == 0) {
            *out = (nm_dense_placement)i;
            return NM_OK;
        }
    return nm_errorf(err, NM_ERR_INVALID_ARG,
                     "dense placement '%s': expected profile, host or device", name ? name : "");
}

nm_plan_params nm_plan_default_params(void) {
    return (nm_plan_params){
        .objective = NM_PLAN_BUDGET,
        .tiers = NULL,
        .n_tiers = 0,
        .quantile = 0.95,
        .overflow = NM_OVERFLOW_SPILL,
        /* measured on the shipped model with drop (docs/NPUMOE.md): the router
         * weight loses 5-20x less than the activation norms at every quantile */
        .salience = NM_SALIENCE_ROUTER,
        .device_memory_bytes = UINT64_MAX,
        .max_group_experts = 0,
        .dense = NM_DENSE_BY_PROFILE,
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
    nm_free(plan->budget_rows);
    nm_free(plan->dense_on_device);
    nm_free(plan);
}

nm_status nm_plan_row_ms(const nm_profile *profile, double *row_ms, nm_error *err) {
    NM_ASSERT(profile && row_ms);
    *row_ms = 0;
    int64_t best_rows = 0;
    double best_ms = 0;
    for (int32_t i = 0; i < profile->n_points; i++) {
        const nm_profile_point *pt = &profile->points[i];
        const int64_t rows = (int64_t)pt->n_experts * pt->capacity;
        if (rows > best_rows) {
            best_rows = rows;
            best_ms = pt->graph_ms;
        }
    }
    const double ms = best_rows > 0 ? (best_ms - profile->dispatch_ms) / (double)best_rows : 0;
    if (!(ms > 0))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the profile's largest graph (%lld rows) costs no more than a dispatch: "
                         "no per-row cost to turn a time into rows",
                         (long long)best_rows);
    *row_ms = ms;
    return NM_OK;
}

void nm_plan_allocate(const double *loss, int32_t n, int32_t m, int64_t budget, int32_t *steps) {
    NM_ASSERT(loss && steps && n >= 1 && m >= 0 && budget >= 0);
    for (int32_t e = 0; e < n; e++)
        steps[e] = 0;
    for (int64_t used = 0; used < budget; used++) {
        int32_t best = -1;
        double best_saving = 0;
        for (int32_t e = 0; e < n; e++) {
            if (steps[e] == m) continue;
            const double *le = loss + (size_t)e * (size_t)(m + 1);
            const double saving = le[steps[e]] - le[steps[e] + 1];
            if (saving > best_saving) {
                best_saving = saving;
                best = e;
            }
        }
        if (best < 0) break; /* nothing left to save */
        steps[best]++;
    }
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

/* ---- the model's shape ---- */

const nm_expert_weights *nm_moe_shape_experts(const nm_moe_shape *shape, int32_t layer) {
    NM_ASSERT(shape->layer_experts && layer >= 0 && layer < shape->n_layer);
    return shape->layer_experts(shape->ctx, layer);
}

uint64_t nm_moe_shape_expert_bytes(const nm_moe_shape *shape, int32_t layer) {
    const nm_expert_weights *w = nm_moe_shape_experts(shape, layer);
    return (uint64_t)w->gate.row_bytes * (uint64_t)w->gate.n +
           (uint64_t)w->up.row_bytes * (uint64_t)w->up.n +
           (uint64_t)w->down.row_bytes * (uint64_t)w->down.n;
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
    const nm_moe_shape *shape;
    const nm_calib *calib;
    const nm_profile *profile;
    nm_plan_params params;
    grid grid;
    int32_t max_group;
    expert_info *experts; /* [n_expert] scratch */
    int32_t *caps;        /* [n_expert] scratch */
    double *pred;         /* [chunk + 1] scratch: predicted overflow by capacity */
    /* expected per chunk, summed over layers and experts: assignments over
     * capacity, their routing weight, all routing weight */
    double drop_count, drop_weight, total_weight;
    group_info *info; /* [n_layer * n_expert] */
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
    const uint64_t expert_bytes = nm_moe_shape_expert_bytes(pl->shape, l);
    const nm_expert_weights *w = nm_moe_shape_experts(pl->shape, l);
    const uint64_t row_bytes =
        2 * sizeof(float) * ((uint64_t)pl->shape->d_model + (uint64_t)pl->shape->d_ff);
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
        /* the profile measured (and its device supports) one weight type:
         * a layer of another stays on the host */
        grp->on_device =
            w->gate.type == pl->profile->weight_type && gi->device_ms + gi->spill_ms < gi->host_ms;
        lp->n_groups++;
    }
    return NM_OK;
}

/* ---- capacities ---- */

/* The quantile rule: the index of the smallest of tiers[0..n) >= the
 * expert's quantile load, the last if none is. */
static int32_t quantile_tier(const planner *pl, int32_t l, int32_t e, const int32_t *tiers,
                             int32_t n) {
    const int32_t need = nm_calib_quantile(pl->calib, l, e, pl->params.quantile);
    int32_t t = 0;
    while (t < n - 1 && tiers[t] < need)
        t++;
    return t;
}

/* Whether the budget objective weighs what overflows by its routing weight
 * (drop with router salience drops the lightest) or counts it. */
static bool weighs(const nm_plan_params *p) {
    return p->overflow == NM_OVERFLOW_DROP && p->salience == NM_SALIENCE_ROUTER;
}

/* Each expert's capacity in layer l: cap[n_expert] out. */
static nm_status layer_capacities(const planner *pl, int32_t l, int32_t *cap, nm_error *err) {
    const int32_t n_expert = pl->calib->n_expert;
    const nm_plan *plan = pl->plan;
    if (plan->objective == NM_PLAN_QUANTILE) {
        for (int32_t e = 0; e < n_expert; e++)
            cap[e] = plan->tiers[quantile_tier(pl, l, e, plan->tiers, plan->n_tiers)];
        return NM_OK;
    }
    const int32_t g = plan->granule, m = plan->n_tiers - 1;
    const int64_t budget = plan->budget_rows[l];
    if (budget < (int64_t)n_expert * g)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "layer %d: a budget of %lld rows per chunk is less than the smallest "
                         "tier, %d rows, for each of %d experts",
                         l, (long long)budget, g, n_expert);
    double *loss = nm_malloc((size_t)n_expert * (size_t)(m + 1) * sizeof(double));
    int32_t *steps = nm_malloc((size_t)n_expert * sizeof(int32_t));
    if (!loss || !steps) {
        nm_free(loss);
        nm_free(steps);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    }
    for (int32_t e = 0; e < n_expert; e++) {
        nm_calib_predict_overflow(pl->calib, l, e, weighs(&pl->params), pl->pred);
        for (int32_t j = 0; j <= m; j++)
            loss[(size_t)e * (size_t)(m + 1) + (size_t)j] = pl->pred[plan->tiers[j]];
    }
    nm_plan_allocate(loss, n_expert, m, (budget - (int64_t)n_expert * g) / g, steps);
    for (int32_t e = 0; e < n_expert; e++)
        cap[e] = plan->tiers[steps[e]];
    nm_free(loss);
    nm_free(steps);
    return NM_OK;
}

static nm_status plan_layer(planner *pl, int32_t l, nm_error *err) {
    const nm_calib *calib = pl->calib;
    const nm_profile *p = pl->profile;
    const int32_t n_expert = calib->n_expert;
    const int32_t *tiers = pl->plan->tiers;
    const int32_t n_tiers = pl->plan->n_tiers;
    expert_info *ex = pl->experts;
    int32_t *cap = pl->caps;
    nm_status st = layer_capacities(pl, l, cap, err);
    if (st != NM_OK) return st;
    if (pl->plan->objective == NM_PLAN_QUANTILE) /* the rows the rule reserves */
        for (int32_t e = 0; e < n_expert; e++)
            pl->plan->budget_rows[l] += cap[e];
    for (int32_t e = 0; e < n_expert; e++) {
        int32_t t = 0;
        while (t < n_tiers && tiers[t] != cap[e])
            t++;
        NM_ASSERT(t < n_tiers);
        nm_calib_predict_overflow(calib, l, e, false, pl->pred);
        pl->drop_count += pl->pred[cap[e]];
        nm_calib_predict_overflow(calib, l, e, true, pl->pred);
        pl->drop_weight += pl->pred[cap[e]];
        pl->total_weight += pl->pred[0];
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
        st = emit_groups(pl, l, ex + s, m, best_g, capacity, err);
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

/* Where each layer's dense part runs (the comment at the top), and its
 * predicted cost there. After compute_costs and the residency. */
static nm_status place_dense(planner *pl, nm_error *err) {
    nm_plan *plan = pl->plan;
    const nm_profile *p = pl->profile;
    plan->dense_on_device = nm_calloc((size_t)plan->moe.n_layer, sizeof(bool));
    if (!plan->dense_on_device) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    const bool measured = p->dense_device_ms > 0 && p->dense_host_ms > 0;
    const double scale = (double)pl->calib->chunk / (double)p->chunk;
    for (int32_t l = 0; l < plan->moe.n_layer; l++) {
        bool on = false;
        if (pl->params.dense == NM_DENSE_ON_DEVICE) {
            on = true;
        } else if (pl->params.dense == NM_DENSE_BY_PROFILE && measured) {
            on = p->dense_device_ms < p->dense_host_ms;
        } else if (pl->params.dense == NM_DENSE_BY_PROFILE) {
            const nm_moe_layer_plan *lp = &plan->moe.layers[l];
            for (int32_t g = 0; g < lp->n_groups; g++)
                on = on || lp->groups[g].on_device;
        }
        plan->dense_on_device[l] = on;
        plan->layer_cost[l].dense_ms =
            measured ? (on ? p->dense_device_ms : p->dense_host_ms) * scale : 0.0;
    }
    return NM_OK;
}

/* ---- checks ---- */

static nm_status check_params(const nm_plan_params *p, int32_t chunk, nm_error *err) {
    if ((unsigned)p->objective >= NM_PLAN_OBJECTIVE_COUNT)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown objective %d", (int)p->objective);
    if (p->budget_rows < 0 || !(p->budget_ms >= 0 && p->budget_ms <= 1e9))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "budget of %lld rows or %g ms: expected >= 0 (0 = the default)",
                         (long long)p->budget_rows, p->budget_ms);
    if (p->objective == NM_PLAN_BUDGET && p->tiers)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the budget objective takes its tiers from the granule (multiples of "
                         "it); tiers are for the quantile objective");
    if (p->objective == NM_PLAN_BUDGET && p->granule != 0 &&
        (p->granule < 1 || p->granule > chunk || chunk % p->granule != 0 ||
         chunk / p->granule > NM_PLAN_MAX_TIERS))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "granule %d: expected a divisor of the chunk (%d) of at least chunk/%d",
                         p->granule, chunk, NM_PLAN_MAX_TIERS);
    if (p->objective == NM_PLAN_QUANTILE && (p->budget_rows || p->budget_ms || p->granule))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "a budget or a granule is for the budget objective, not the quantile "
                         "one");
    if (!(p->quantile > 0.0 && p->quantile <= 1.0))
        return nm_errorf(err, NM_ERR_INVALID_ARG, "quantile %g is not in (0, 1]", p->quantile);
    if ((unsigned)p->overflow >= NM_OVERFLOW_COUNT || (unsigned)p->salience >= NM_SALIENCE_COUNT)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown overflow (%d) or salience (%d) policy",
                         (int)p->overflow, (int)p->salience);
    if ((unsigned)p->dense >= NM_DENSE_PLACEMENT_COUNT)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown dense placement %d", (int)p->dense);
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

/* The quantile objective's default tiers: the powers of two in [T/64, T)
 * and T; returns how many. */
static int32_t default_tiers(int32_t chunk, int32_t *tiers) {
    int32_t n = 0;
    for (int64_t c = 1; c < chunk; c *= 2)
        if (c * 64 >= chunk) tiers[n++] = (int32_t)c;
    tiers[n++] = chunk;
    return n;
}

/* The default tiers rounded up to multiples of the device's granule dev_g
 * (capped at the chunk), without repeats; returns how many. */
static int32_t device_tiers(int32_t chunk, int32_t dev_g, int32_t *tiers) {
    const int32_t n_def = default_tiers(chunk, tiers);
    int32_t n = 0;
    for (int32_t i = 0; i < n_def; i++) {
        int32_t t = dev_g > 1 ? (tiers[i] + dev_g - 1) / dev_g * dev_g : tiers[i];
        if (t > chunk) t = chunk;
        if (n == 0 || t > tiers[n - 1]) tiers[n++] = t;
    }
    return n;
}

/* The budget objective's granule when none is asked for. A device that
 * computes dev_g > 1 rows at once (the profile's granule: 16 for the cpu
 * device under amx) gets the smallest multiple of dev_g that divides the
 * chunk in at most NM_PLAN_MAX_TIERS tiers, so no capacity leaves part of
 * its last row block idle; otherwise (1, a profile that does not record
 * it, or a chunk no such multiple divides) the smallest divisor of the
 * chunk >= chunk/16. */
static int32_t default_granule(int32_t chunk, int32_t dev_g) {
    if (dev_g > 1)
        for (int32_t g = dev_g; g <= chunk; g += dev_g)
            if (chunk % g == 0 && chunk / g <= NM_PLAN_MAX_TIERS) return g;
    int32_t g = chunk / 16 > 1 ? chunk / 16 : 1;
    while (chunk % g != 0)
        g++;
    return g;
}

static nm_status set_tiers(nm_plan *plan, const nm_plan_params *p, int32_t chunk, int32_t dev_g,
                           nm_error *err) {
    int32_t tiers[NM_PLAN_MAX_TIERS], n = 0;
    if (p->objective == NM_PLAN_BUDGET) {
        const int32_t g = p->granule ? p->granule : default_granule(chunk, dev_g);
        plan->granule = g;
        for (n = 0; n < chunk / g; n++)
            tiers[n] = (n + 1) * g;
    } else if (p->tiers) {
        for (n = 0; n < p->n_tiers; n++)
            tiers[n] = p->tiers[n];
    } else {
        n = device_tiers(chunk, dev_g, tiers);
    }
    plan->tiers = nm_malloc((size_t)n * sizeof(int32_t));
    if (!plan->tiers) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    memcpy(plan->tiers, tiers, (size_t)n * sizeof(int32_t));
    plan->n_tiers = n;
    return NM_OK;
}

/* Each layer's budget of rows per chunk (budget objective). */
static nm_status set_budgets(planner *pl, nm_error *err) {
    nm_plan *plan = pl->plan;
    const nm_plan_params *p = &pl->params;
    plan->budget_rows = nm_calloc((size_t)plan->moe.n_layer, sizeof(int64_t));
    if (!plan->budget_rows) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    if (plan->objective != NM_PLAN_BUDGET) return NM_OK;
    double row_ms = 0;
    if (!p->budget_rows && p->budget_ms > 0) {
        nm_status st = nm_plan_row_ms(pl->profile, &row_ms, err);
        if (st != NM_OK) return st;
    }
    int32_t tiers[NM_PLAN_MAX_TIERS]; /* the quantile rule's, as set_tiers makes them */
    const int32_t n = device_tiers(plan->moe.chunk, pl->profile->granule, tiers);
    for (int32_t l = 0; l < plan->moe.n_layer; l++) {
        int64_t rows = p->budget_rows;
        if (!rows && p->budget_ms > 0)
            rows = (int64_t)floor(p->budget_ms / row_ms);
        else if (!rows)
            for (int32_t e = 0; e < plan->moe.n_expert; e++)
                rows += tiers[quantile_tier(pl, l, e, tiers, n)];
        /* no expert holds more than a chunk: a larger budget buys nothing */
        const int64_t all = (int64_t)plan->moe.n_expert * plan->moe.chunk;
        plan->budget_rows[l] = rows < all ? rows : all;
    }
    return NM_OK;
}

static nm_status check_inputs(const nm_moe_shape *shape, const nm_calib *calib,
                              const nm_profile *profile, nm_error *err) {
    nm_status st = nm_calib_check_shape(calib, shape, err);
    if (st != NM_OK) return st;
    if (calib->n_chunks < 1)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "the calibration has recorded no chunks");
    if ((st = nm_profile_check(profile, err)) != NM_OK) {
        nm_error_prefix(err, "the profile");
        return st;
    }
    if (profile->d_model != shape->d_model || profile->d_ff != shape->d_ff)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the profile was measured with d_model %lld and d_ff %lld, the model has "
                         "d_model %d and d_ff %d",
                         (long long)profile->d_model, (long long)profile->d_ff, shape->d_model,
                         shape->d_ff);
    return NM_OK;
}

nm_status nm_plan_make(const nm_moe_shape *shape, const nm_calib *calib, const nm_profile *profile,
                       const nm_plan_params *params, nm_plan **out, nm_error *err) {
    NM_ASSERT(shape && calib && profile && out);
    *out = NULL;
    planner pl = {.shape = shape, .calib = calib, .profile = profile};
    pl.params = params ? *params : nm_plan_default_params();
    nm_status st = check_inputs(shape, calib, profile, err);
    if (st == NM_OK) st = check_params(&pl.params, calib->chunk, err);
    if (st != NM_OK) return st;
    if ((st = grid_build(profile, &pl.grid, err)) != NM_OK) return st;
    pl.max_group = pl.params.max_group_experts;
    if (pl.max_group == 0) pl.max_group = pl.grid.counts[pl.grid.n_counts - 1];

    const int32_t n_layer = calib->n_layer, n_expert = calib->n_expert;
    nm_plan *plan = nm_calloc(1, sizeof *plan);
    pl.plan = plan;
    pl.experts = nm_malloc((size_t)n_expert * sizeof *pl.experts);
    pl.caps = nm_malloc((size_t)n_expert * sizeof *pl.caps);
    pl.pred = nm_malloc((size_t)(calib->chunk + 1) * sizeof *pl.pred);
    pl.info = nm_malloc((size_t)n_layer * (size_t)n_expert * sizeof *pl.info);
    if (plan) {
        plan->moe.layers = nm_calloc((size_t)n_layer, sizeof *plan->moe.layers);
        plan->layer_cost = nm_calloc((size_t)n_layer, sizeof *plan->layer_cost);
        plan->moe.n_layer = n_layer; /* after layers: nm_plan_free walks them */
    }
    if (!plan || !pl.experts || !pl.caps || !pl.pred || !pl.info || !plan->moe.layers ||
        !plan->layer_cost)
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    if (st == NM_OK) {
        plan->fingerprint = calib->fingerprint;
        plan->first_layer = shape->first_layer;
        plan->n_shared = shape->n_shared;
        plan->d_ff_shared = shape->d_ff_shared;
        snprintf(plan->device, sizeof plan->device, "%s", profile->device);
        plan->moe.chunk = calib->chunk;
        plan->moe.n_expert = n_expert;
        plan->moe.overflow = pl.params.overflow;
        plan->moe.salience = pl.params.salience;
        plan->quantile = pl.params.quantile;
        plan->objective = pl.params.objective;
        st = set_tiers(plan, &pl.params, calib->chunk, profile->granule, err);
    }
    if (st == NM_OK) st = set_budgets(&pl, err);
    for (int32_t l = 0; l < n_layer && st == NM_OK; l++)
        st = plan_layer(&pl, l, err);
    if (st == NM_OK) {
        /* n_tokens * k assignments over n_chunks chunks in every layer */
        const double per_chunk =
            (double)calib->n_tokens * calib->k / (double)calib->n_chunks * n_layer;
        plan->predicted_drop_rate = pl.drop_count / per_chunk;
        plan->predicted_drop_weight = pl.total_weight > 0 ? pl.drop_weight / pl.total_weight : 0;
        st = apply_budget(&pl, err);
    }
    if (st == NM_OK) {
        compute_costs(&pl);
        st = place_dense(&pl, err);
    }
    if (st == NM_OK) {
        st = nm_moe_plan_check(&plan->moe, n_layer, n_expert, err);
        NM_ASSERT(st == NM_OK || st == NM_ERR_NOMEM); /* every expert is placed once */
    }
    grid_free(&pl.grid);
    nm_free(pl.experts);
    nm_free(pl.caps);
    nm_free(pl.pred);
    nm_free(pl.info);
    if (st != NM_OK) {
        nm_plan_free(plan);
        return st;
    }
    *out = plan;
    return NM_OK;
}
