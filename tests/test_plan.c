/* The planner: on synthetic calibrations and profiles whose answers are
 * worked out by hand in the comments; its refusals; random inputs against
 * the invariants every plan satisfies; the budgeted allocation against
 * exhaustive search and against one flat capacity; capacities rounded to
 * the device's row granule. */
#include "plan_fixtures.h"

#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

#define TMP(name) NM_BUILD_DIR "/test_plan_" name

/* ---- the planner on known answers ---- */

/* Every chunk of layer l: expert (i + 3l) % 8 receives base[i] of the
 * T * K = 32 assignments. */
static const int32_t base_loads[N_EXPERT] = {12, 8, 6, 4, 2, 0, 0, 0};

static nm_calib *constant_calib(const nm_model *m) {
    nm_calib *c = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_calib_new(shape(m), T, &c, &err), NM_OK);
    if (!c) return NULL;
    for (int chunk = 0; chunk < 10; chunk++)
        for (int l = 0; l < N_LAYER; l++) {
            int32_t loads[N_EXPERT];
            float w[T * K];
            for (int i = 0; i < N_EXPERT; i++)
                loads[(i + 3 * l) % N_EXPERT] = base_loads[i];
            for (int a = 0, e = 0; e < N_EXPERT; e++) /* 1, 1/2, 1/3, ... within each expert */
                for (int r = 0; r < loads[e]; r++)
                    w[a++] = 1.0f / (float)(r + 1);
            nm_calib_record(c, l, loads, N_EXPERT, w);
        }
    return c;
}

/* The group of expert id (by base rank i) in layer l, or NULL. */
static const nm_moe_group *group_of(const nm_plan *p, int l, int rank) {
    const int32_t e = (rank + 3 * l) % N_EXPERT;
    const nm_moe_layer_plan *lp = &p->moe.layers[l];
    for (int g = 0; g < lp->n_groups; g++)
        for (int i = 0; i < lp->groups[g].n_experts; i++)
            if (lp->groups[g].experts[i] == e) return &lp->groups[g];
    return NULL;
}

static int count_device_groups(const nm_plan *p) {
    int n = 0;
    for (int l = 0; l < p->moe.n_layer; l++)
        for (int g = 0; g < p->moe.layers[l].n_groups; g++)
            n += p->moe.layers[l].groups[g].on_device;
    return n;
}

static void test_planner_known(const nm_model *m) {
    nm_calib *c = constant_calib(m);
    if (!c) return;
    const nm_plan_params qp = qparams();
    /* Host cost of an expert with load x in every chunk: 0.05 + 0.01 x when
     * x > 0, else 0; per layer 5 * 0.05 + 0.01 * 32 = 0.57. Default tiers
     * for T = 16: 1 2 4 8 16; needs 12 8 6 4 2 0 0 0 -> tiers 16 8 8 4 2 1 1 1. */
    const double all_host_ms = 0.57;

    /* A: dispatch of a second: everything on the host. */
    nm_profile prof = make_profile(1000, 0.001);
    nm_plan *p = make_plan(m, c, &prof, &qp);
    if (p) {
        CHECK_INT_EQ(p->n_tiers, 5);
        CHECK_INT_EQ(p->tiers[0], 1);
        CHECK_INT_EQ(p->tiers[4], 16);
        CHECK_INT_EQ(count_device_groups(p), 0);
        CHECK_INT_EQ(p->device_bytes, 0);
        for (int l = 0; l < N_LAYER; l++) {
            CHECK_NEAR(p->layer_cost[l].device_ms, 0, 0);
            CHECK_NEAR(p->layer_cost[l].host_ms, all_host_ms, 1e-12);
        }
        CHECK_NEAR(p->predicted_chunk_ms, 3 * all_host_ms, 1e-12);
        nm_plan_free(p);
        /* the host's per-chunk overhead, measured over chunks of 64 tokens,
         * scales to the plan's 16: a quarter of it is added to every layer */
        prof.chunk = 64;
        prof.host_overhead_ms = 0.2;
        p = make_plan(m, c, &prof, &qp);
        for (int l = 0; p && l < N_LAYER; l++)
            CHECK_NEAR(p->layer_cost[l].host_ms, all_host_ms + 0.05, 1e-12);
        if (p) CHECK_NEAR(p->predicted_chunk_ms, 3 * (all_host_ms + 0.05), 1e-12);
        prof.host_overhead_ms = 0;
    }
    if (p) {
        const int32_t tier_of_rank[N_EXPERT] = {16, 8, 8, 4, 2, 1, 1, 1};
        for (int l = 0; l < N_LAYER; l++)
            for (int r = 0; r < N_EXPERT; r++) {
                const nm_moe_group *g = group_of(p, l, r);
                CHECK(g && g->capacity == tier_of_rank[r]);
            }
        CHECK(strcmp(p->device, "synthetic") == 0);
    }
    nm_plan_free(p);

    /* B: no dispatch cost, graph 0.001 ms per row: every expert with load
     * goes to the device (0.001 * rows < its host cost); the three never
     * seen cost nothing on the host and stay there. Tier 8 holds ranks 1 and
     * 2: one graph of 2 costs 0.016 like two of 1, and ties go to fewer
     * graphs. device_ms = 0.016 + 0.016 + 0.004 + 0.002. */
    prof = make_profile(0, 0.001);
    p = make_plan(m, c, &prof, &qp);
    if (p) {
        for (int l = 0; l < N_LAYER; l++) {
            for (int r = 0; r < 5; r++)
                CHECK(group_of(p, l, r) && group_of(p, l, r)->on_device);
            for (int r = 5; r < 8; r++)
                CHECK(group_of(p, l, r) && !group_of(p, l, r)->on_device);
            CHECK(group_of(p, l, 1) == group_of(p, l, 2));
            CHECK(group_of(p, l, 5) == group_of(p, l, 7));
            CHECK_INT_EQ(p->moe.layers[l].n_groups, 5);
            CHECK_NEAR(p->layer_cost[l].device_ms, 0.038, 1e-12);
            CHECK_NEAR(p->layer_cost[l].host_ms, 0, 1e-12);
        }
        CHECK_NEAR(p->predicted_chunk_ms, 3 * 0.038, 1e-12);
        /* f32 experts: 3 matrices of 64 x 32; buffers: 2 x (64 + 32) f32 per row */
        const uint64_t expert = 3 * 64 * 32 * 4, row = 2 * (64 + 32) * 4;
        CHECK_INT_EQ(p->device_bytes, 3 * (5 * expert + (16 + 8 + 8 + 4 + 2) * row));
    }
    nm_plan_free(p);

    /* B': the same profile measured with F16 weights, not the model's F32:
     * the device is not known to run these experts, all stay on the host */
    prof.weight_type = NM_DTYPE_F16;
    p = make_plan(m, c, &prof, &qp);
    if (p) {
        CHECK_INT_EQ(count_device_groups(p), 0);
        CHECK_INT_EQ(p->device_bytes, 0);
        CHECK_NEAR(p->predicted_chunk_ms, 3 * all_host_ms, 1e-12);
    }
    nm_plan_free(p);
    prof.weight_type = NM_DTYPE_F32;

    /* C: the same with a budget of 0 bytes: all on the host. */
    nm_plan_params pp = qparams();
    pp.device_memory_bytes = 0;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        CHECK_INT_EQ(count_device_groups(p), 0);
        CHECK_NEAR(p->predicted_chunk_ms, 3 * all_host_ms, 1e-12);
    }
    nm_plan_free(p);

    /* D: a budget of one tier-16 single-expert group (24576 + 16 * 768 =
     * 36864 bytes). By saving: tier 8's pair saves 0.24 - 0.016 but needs
     * 61440 bytes; next, layer 0's rank 0 (0.17 - 0.016) fits; nothing else
     * fits in what is left. */
    pp.device_memory_bytes = 36864;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        CHECK_INT_EQ(count_device_groups(p), 1);
        CHECK(group_of(p, 0, 0)->on_device && group_of(p, 0, 0)->capacity == 16);
        CHECK_INT_EQ(p->device_bytes, 36864);
        CHECK_NEAR(p->layer_cost[0].device_ms, 0.016, 1e-12);
        CHECK_NEAR(p->layer_cost[0].host_ms, all_host_ms - 0.17, 1e-12);
        CHECK_NEAR(p->layer_cost[1].host_ms, all_host_ms, 1e-12);
    }
    nm_plan_free(p);

    /* E: dispatch 0.1 ms. rank 0: 0.116 < 0.17, device. Tier 8 as one
     * graph: 0.116 < 0.13 + 0.11, device (as two graphs 0.216: worse).
     * rank 3: 0.104 > 0.09 and rank 4: 0.102 > 0.07, host. */
    prof = make_profile(0.1, 0.001);
    p = make_plan(m, c, &prof, &qp);
    if (p) {
        for (int l = 0; l < N_LAYER; l++) {
            CHECK(group_of(p, l, 0)->on_device);
            CHECK(group_of(p, l, 1)->on_device && group_of(p, l, 1) == group_of(p, l, 2));
            CHECK(!group_of(p, l, 3)->on_device && !group_of(p, l, 4)->on_device);
            CHECK_NEAR(p->layer_cost[l].device_ms, 0.232, 1e-12);
            CHECK_NEAR(p->layer_cost[l].host_ms, 0.16, 1e-12);
            CHECK_NEAR(p->layer_cost[l].chunk_ms, 0.232, 1e-12);
        }
    }
    nm_plan_free(p);

    /* F: one tier of 2 rows: ranks 0-3 overflow every chunk. Spilled, each
     * costs 0.05 + 0.01 * (load - 2) on the host: 0.15 0.11 0.09 0.07.
     * Groups of 5 (ranks 0-4, 0.010 + 0.42 < 0.57) and the three idle on
     * the host: 0.43 per layer, as groups of 1; ties go to the larger. */
    prof = make_profile(0, 0.001);
    const int32_t two[] = {2};
    pp = qparams();
    pp.tiers = two;
    pp.n_tiers = 1;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        for (int l = 0; l < N_LAYER; l++) {
            CHECK_INT_EQ(group_of(p, l, 0)->n_experts, 5);
            CHECK(group_of(p, l, 0)->on_device && group_of(p, l, 4) == group_of(p, l, 0));
            CHECK(!group_of(p, l, 5)->on_device);
            CHECK_NEAR(p->layer_cost[l].device_ms, 0.010, 1e-12);
            CHECK_NEAR(p->layer_cost[l].host_ms, 0.42, 1e-12);
        }
    }
    nm_plan_free(p);
    /* ... dropped instead, the overflow costs nothing: 0.010 per layer. */
    pp.overflow = NM_OVERFLOW_DROP;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        CHECK_INT_EQ(p->moe.overflow, NM_OVERFLOW_DROP);
        for (int l = 0; l < N_LAYER; l++) {
            CHECK_NEAR(p->layer_cost[l].device_ms, 0.010, 1e-12);
            CHECK_NEAR(p->layer_cost[l].host_ms, 0, 1e-12);
        }
    }
    nm_plan_free(p);

    /* G: at most one expert per graph. */
    pp = qparams();
    pp.max_group_experts = 1;
    p = make_plan(m, c, &prof, &pp);
    if (p)
        for (int l = 0; l < N_LAYER; l++)
            CHECK_INT_EQ(p->moe.layers[l].n_groups, N_EXPERT);
    nm_plan_free(p);

    /* H: a quantile of 0.5 on constant loads changes nothing; custom tiers
     * that do not reach the load give the largest. */
    const int32_t small[] = {3, 5};
    pp = qparams();
    pp.tiers = small;
    pp.n_tiers = 2;
    pp.quantile = 0.5;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        CHECK_INT_EQ(group_of(p, 1, 0)->capacity, 5);
        CHECK_INT_EQ(group_of(p, 1, 3)->capacity, 5);
        CHECK_INT_EQ(group_of(p, 1, 4)->capacity, 3);
        CHECK_INT_EQ(group_of(p, 1, 7)->capacity, 3);
    }
    nm_plan_free(p);
    nm_calib_free(c);
}

static void test_planner_refusals(const nm_model *m, const nm_model *other, const nm_calib *c) {
    nm_profile prof = make_profile(0.1, 0.001);
    nm_plan *p = NULL;
    nm_error err = {0};
    nm_plan_params pp = qparams();
    if (other) {
        nm_fingerprint fo, fm;
        nm_model_fingerprint(other, &fo);
        nm_model_fingerprint(m, &fm);
        CHECK_INT_EQ(nm_plan_make(shape(other), c, &prof, NULL, &p, &err), NM_ERR_INVALID_ARG);
        CHECK_MSG(err, "another model");
        CHECK_MSG(err, fo.hex);
        CHECK_MSG(err, fm.hex);
    }
    prof.d_model = 128;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, NULL, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "d_model 128");
    prof = make_profile(0.1, 0.001);
    prof.d_ff = 31;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, NULL, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "d_ff 31");
    prof = make_profile(0.1, 0.001);
    prof.host_row_ms = NAN;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, NULL, &p, &err), NM_ERR_FORMAT);
    CHECK_MSG(err, "host_row_ms");
    prof = make_profile(0.1, 0.001);
    const double bad_q[] = {0, -0.5, 1.5, NAN};
    for (int i = 0; i < 4; i++) {
        pp.quantile = bad_q[i];
        CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
        CHECK_MSG(err, "quantile");
    }
    pp = qparams();
    const int32_t unsorted[] = {4, 2}, too_big[] = {4, 17};
    pp.tiers = unsorted;
    pp.n_tiers = 2;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "ascending");
    pp.tiers = too_big;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "tier 17");
    /* the budget objective's own */
    pp = nm_plan_default_params();
    pp.tiers = too_big;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "tiers are for the quantile objective");
    pp = nm_plan_default_params();
    pp.granule = 3;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "granule 3: expected a divisor of the chunk (16)");
    pp.granule = 2;
    pp.budget_rows = 15;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "layer 0: a budget of 15 rows per chunk is less than the smallest tier, 2 rows");
    pp.budget_rows = -1;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "budget of -1 rows");
    pp = qparams();
    pp.budget_rows = 64;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "for the budget objective");
    pp = nm_plan_default_params();
    pp.budget_ms = 1;
    nm_profile flat = make_profile(0.1, 0); /* every graph costs one dispatch */
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &flat, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "no per-row cost");
    nm_calib *empty = NULL;
    CHECK_INT_EQ(nm_calib_new(shape(m), T, &empty, &err), NM_OK);
    if (empty) {
        CHECK_INT_EQ(nm_plan_make(shape(m), empty, &prof, NULL, &p, &err), NM_ERR_INVALID_ARG);
        CHECK_MSG(err, "no chunks");
    }
    nm_calib_free(empty);
    CHECK(p == NULL);
}

/* A realistic case: skewed random loads, a profile with a dispatch cost
 * and a sublinear graph time, every default. Checks the invariants and
 * that each group sits where its own costs say. */
static void test_planner_random(const nm_model *m, const nm_calib *c) {
    nm_profile prof = make_profile(0.06, 0.0004);
    for (int i = 0; i < prof.n_points; i++)
        grid_points[i].graph_ms =
            0.06 + 0.002 * sqrt(grid_points[i].n_experts * grid_points[i].capacity);
    nm_plan *p = make_plan(m, c, &prof, NULL);
    if (!p) return;
    CHECK(count_device_groups(p) > 0);
    int n_host = 0;
    for (int l = 0; l < N_LAYER; l++)
        for (int g = 0; g < p->moe.layers[l].n_groups; g++)
            n_host += !p->moe.layers[l].groups[g].on_device;
    CHECK(n_host > 0);
    nm_plan_free(p);
}

/* ---- the budgeted allocation ---- */

/* The least total loss over every allocation of at most budget steps,
 * enumerated: (m + 1)^n of them. */
static double exhaustive_min(const double *loss, int n, int m, int64_t budget) {
    int32_t steps[8] = {0};
    double best = INFINITY;
    for (;;) {
        int64_t used = 0;
        double total = 0;
        for (int e = 0; e < n; e++) {
            used += steps[e];
            total += loss[e * (m + 1) + steps[e]];
        }
        if (used <= budget && total < best) best = total;
        int e = 0;
        while (e < n && steps[e] == m)
            steps[e++] = 0;
        if (e == n) return best;
        steps[e]++;
    }
}

static double allocation_loss(const double *loss, int n, int m, const int32_t *steps) {
    double total = 0;
    for (int e = 0; e < n; e++)
        total += loss[e * (m + 1) + steps[e]];
    return total;
}

/* nm_plan_allocate against exhaustive search: random convex decreasing
 * losses (with ties and flat stretches, on a grid of eighths) and the
 * overflow of calibrated experts, every budget from none to more than all
 * steps. */
static void test_allocate_exhaustive(const nm_calib *c) {
    double loss[6 * 6];
    int32_t steps[6];
    int n_cases = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int n = 2 + trial % 4, m = 1 + (trial / 4) % 5;
        for (int e = 0; e < n; e++) {
            double d[6];
            for (int j = 0; j < m; j++)
                d[j] = (double)(rng() % 9) / 8; /* 0, 1/8, ..., 1: ties are common */
            for (int j = 1; j < m; j++)         /* sorted descending: convex */
                for (int i = j; i > 0 && d[i] > d[i - 1]; i--) {
                    const double t = d[i];
                    d[i] = d[i - 1];
                    d[i - 1] = t;
                }
            loss[e * (m + 1)] = 4 + (double)(rng() % 8);
            for (int j = 1; j <= m; j++)
                loss[e * (m + 1) + j] = loss[e * (m + 1) + j - 1] - d[j - 1];
        }
        for (int64_t budget = 0; budget <= (int64_t)n * m + 1; budget++) {
            nm_plan_allocate(loss, n, m, budget, steps);
            int64_t used = 0;
            for (int e = 0; e < n; e++) {
                CHECK(steps[e] >= 0 && steps[e] <= m);
                used += steps[e];
            }
            CHECK(used <= budget);
            CHECK_NEAR(allocation_loss(loss, n, m, steps), exhaustive_min(loss, n, m, budget),
                       1e-12);
            n_cases++;
        }
    }
    /* calibrated experts: 4 of a layer at capacities 2, 4, ..., 16 (7 steps
     * past the first), by weight and by count */
    for (int l = 0; l < N_LAYER; l++)
        for (int by_weight = 0; by_weight < 2; by_weight++) {
            const int n = 4, m = 7;
            double cl[4 * 8];
            for (int e = 0; e < n; e++)
                for (int j = 0; j <= m; j++) {
                    const int32_t cap = 2 * (j + 1), id = (2 * e + l) % N_EXPERT;
                    double pred[T + 1];
                    nm_calib_predict_overflow(c, l, id, by_weight, pred);
                    cl[e * (m + 1) + j] = pred[cap];
                }
            for (int64_t budget = 0; budget <= n * m; budget++) {
                nm_plan_allocate(cl, n, m, budget, steps);
                CHECK_NEAR(allocation_loss(cl, n, m, steps), exhaustive_min(cl, n, m, budget),
                           1e-12);
                n_cases++;
            }
        }
    CHECK(n_cases > 1000);
}

/* Expected overflow per chunk of a layer's plan, by weight or count. */
static double plan_loss(const nm_plan *p, const nm_calib *c, int l, bool by_weight) {
    double total = 0;
    for (int g = 0; g < p->moe.layers[l].n_groups; g++) {
        const nm_moe_group *grp = &p->moe.layers[l].groups[g];
        for (int i = 0; i < grp->n_experts; i++) {
            double pred[T + 1];
            nm_calib_predict_overflow(c, l, grp->experts[i], by_weight, pred);
            total += pred[grp->capacity];
        }
    }
    return total;
}

/* The device's row granule (the profile's) as the planner's default: the
 * budget's granule a multiple of it dividing the chunk, the quantile
 * objective's default tiers rounded up to it; without one (0, 1, or one
 * no multiple of which divides the chunk), today's default. */
static void test_planner_granule(const nm_model *m, const nm_calib *c) {
    nm_profile prof = make_profile(0.06, 0.0004);
    const struct {
        int32_t device, budget_g, n_quantile_tiers;
        int32_t quantile_tiers[5];
    } cases[] = {
        {16, 16, 1, {16}},           /* the cpu device under amx */
        {4, 4, 3, {4, 8, 16}},       /* 1 2 4 8 16 rounded up to 4 */
        {8, 8, 2, {8, 16}},          /* 1 2 4 8 16 rounded up to 8 */
        {0, 1, 5, {1, 2, 4, 8, 16}}, /* a profile without it */
        {1, 1, 5, {1, 2, 4, 8, 16}}, /* no preference */
        {3, 1, 4, {3, 6, 9, 16}},    /* 3 divides no multiple of 16 below it */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prof.granule = cases[i].device;
        nm_plan *p = make_plan(m, c, &prof, NULL);
        if (p) {
            CHECK_INT_EQ(p->granule, cases[i].budget_g);
            CHECK_INT_EQ(p->n_tiers, T / cases[i].budget_g);
            for (int l = 0; l < N_LAYER; l++)
                for (int g = 0; g < p->moe.layers[l].n_groups; g++) {
                    const int32_t cap = p->moe.layers[l].groups[g].capacity;
                    CHECK_INT_EQ(cap % cases[i].budget_g, 0);
                    if (cases[i].device > 1 && T % cases[i].device == 0)
                        CHECK_INT_EQ(cap % cases[i].device, 0);
                }
        }
        nm_plan_free(p);
        /* an explicit granule wins */
        nm_plan_params bp = nm_plan_default_params();
        bp.granule = 2;
        bp.budget_rows = N_EXPERT * 16;
        p = make_plan(m, c, &prof, &bp);
        if (p) CHECK_INT_EQ(p->granule, 2);
        nm_plan_free(p);
        nm_plan_params qp = qparams();
        p = make_plan(m, c, &prof, &qp);
        if (p) {
            CHECK_INT_EQ(p->n_tiers, cases[i].n_quantile_tiers);
            for (int t = 0; t < p->n_tiers && t < cases[i].n_quantile_tiers; t++)
                CHECK_INT_EQ(p->tiers[t], cases[i].quantile_tiers[t]);
        }
        nm_plan_free(p);
    }
}

/* The planner's budget objective on skewed random loads: exactly the
 * exhaustive optimum per layer (granule 4: 4^8 allocations), never worse
 * than one flat capacity with the same rows, the default budget the
 * quantile rule's rows, a budget in ms turned into rows, the predicted
 * weight share. */
static void test_planner_budget(const nm_model *m, const nm_calib *c) {
    nm_profile prof = make_profile(0.06, 0.0004);
    for (int by_weight = 0; by_weight < 2; by_weight++) {
        nm_plan_params pp = nm_plan_default_params();
        pp.overflow = by_weight ? NM_OVERFLOW_DROP : NM_OVERFLOW_SPILL;
        pp.salience = NM_SALIENCE_ROUTER;
        pp.granule = 4;
        for (int64_t budget = 32; budget <= 80; budget += 12) {
            pp.budget_rows = budget;
            nm_plan *p = make_plan(m, c, &prof, &pp);
            if (!p) continue;
            CHECK_INT_EQ(p->n_tiers, 4);
            CHECK_INT_EQ(p->granule, 4);
            for (int l = 0; l < N_LAYER; l++) {
                CHECK_INT_EQ(p->budget_rows[l], budget);
                double loss[N_EXPERT * 4];
                for (int e = 0; e < N_EXPERT; e++) {
                    double pred[T + 1];
                    nm_calib_predict_overflow(c, l, e, by_weight, pred);
                    for (int j = 0; j < 4; j++)
                        loss[e * 4 + j] = pred[4 * (j + 1)];
                }
                const double best = exhaustive_min(loss, N_EXPERT, 3, (budget - 32) / 4);
                CHECK_NEAR(plan_loss(p, c, l, by_weight), best, 1e-9);
            }
            nm_plan_free(p);
        }
        /* granule 1 against one flat capacity f for every expert */
        pp.granule = 1;
        for (int32_t f = 1; f <= T; f++) {
            pp.budget_rows = (int64_t)N_EXPERT * f;
            nm_plan *p = make_plan(m, c, &prof, &pp);
            for (int l = 0; p && l < N_LAYER; l++) {
                double flat = 0;
                for (int e = 0; e < N_EXPERT; e++) {
                    double pred[T + 1];
                    nm_calib_predict_overflow(c, l, e, by_weight, pred);
                    flat += pred[f];
                }
                CHECK(plan_loss(p, c, l, by_weight) <= flat + 1e-12);
            }
            nm_plan_free(p);
        }
    }
    /* the default budget: the rows of the quantile rule's plan */
    nm_plan_params qp = qparams();
    nm_plan *q = make_plan(m, c, &prof, &qp);
    nm_plan *p = make_plan(m, c, &prof, NULL);
    if (p && q) {
        CHECK_INT_EQ(p->granule, 1); /* the smallest divisor of 16 >= 16/16 */
        CHECK_INT_EQ(p->n_tiers, 16);
        for (int l = 0; l < N_LAYER; l++)
            CHECK_INT_EQ(p->budget_rows[l], q->budget_rows[l]);
        /* the share of routing weight over capacity */
        double w = 0, total = 0;
        for (int l = 0; l < N_LAYER; l++) {
            w += plan_loss(p, c, l, true);
            for (int e = 0; e < N_EXPERT; e++) {
                double pred[T + 1];
                nm_calib_predict_overflow(c, l, e, true, pred);
                total += pred[0];
            }
        }
        CHECK_NEAR(p->predicted_drop_weight, w / total, 1e-12);
    }
    nm_plan_free(p);
    nm_plan_free(q);
    /* a budget beyond every expert holding a whole chunk is that */
    nm_plan_params big = nm_plan_default_params();
    big.budget_rows = (int64_t)1 << 40;
    p = make_plan(m, c, &prof, &big);
    for (int l = 0; p && l < N_LAYER; l++) {
        CHECK_INT_EQ(p->budget_rows[l], N_EXPERT * T);
        CHECK_NEAR(plan_loss(p, c, l, false), 0, 0);
    }
    if (p) {
        nm_error e2 = {0};
        nm_plan *r = NULL;
        CHECK_INT_EQ(nm_plan_save(p, TMP("big.plan.json"), &e2), NM_OK);
        CHECK_INT_EQ(nm_plan_load(TMP("big.plan.json"), shape(m), &r, &e2), NM_OK);
        nm_plan_free(r);
    }
    nm_plan_free(p);
    /* 0.0004 ms per row: 0.01602 ms is 40 rows */
    double row_ms = 0;
    nm_error err = {0};
    CHECK_INT_EQ(nm_plan_row_ms(&prof, &row_ms, &err), NM_OK);
    CHECK_NEAR(row_ms, 0.0004, 1e-15);
    nm_plan_params pp = nm_plan_default_params();
    pp.budget_ms = 0.01602;
    pp.granule = 1;
    p = make_plan(m, c, &prof, &pp);
    for (int l = 0; p && l < N_LAYER; l++)
        CHECK_INT_EQ(p->budget_rows[l], 40);
    nm_plan_free(p);
}

int main(void) {
    nm_model *tiny = load_model(TINY);
    if (!tiny) return nm_test_finish("test_plan");
    /* a model of the same architecture with another fingerprint */
    CHECK(write_variant(TMP("f16.gguf"), true, false));
    nm_model *other = load_model(TMP("f16.gguf"));
    static raw_loads raw;
    make_loads(&raw);
    nm_calib *c = calib_from(tiny, &raw);
    test_planner_known(tiny);
    if (c) {
        test_planner_refusals(tiny, other, c);
        test_planner_random(tiny, c);
        test_allocate_exhaustive(c);
        test_planner_budget(tiny, c);
        test_planner_granule(tiny, c);
    }
    nm_calib_free(c);
    nm_model_free(other);
    nm_model_free(tiny);
    return nm_test_finish("test_plan");
}
