/* The static-graph modes against the exact dense mode and llama.cpp's
 * goldens (tiny-qwen3moe, F32): with capacities that hold every load, every
 * mode gives dense's logits; spill gives them for any capacities; drop
 * accounting equals a brute-force recount from the routed loads; the
 * dropped assignments are exactly the lowest-salience ones; dispatch counts
 * per mode; a padded last chunk changes neither logits nor the KV cache. */
#include "harness.h"

#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VEC NM_VECTORS_DIR "/tiny-qwen3moe/"
enum { T = 16, MAX_IDS = 512, N_EXPERT = 8, N_LAYER = 3 };

/* Per-chunk loads seen by a session, for brute-force recounts. */
typedef struct load_log {
    int64_t n;
    int32_t loads[4096][N_EXPERT];
    int32_t layer[4096];
} load_log;

static void log_loads(void *ctx, int32_t layer, const int32_t *loads, int32_t n_expert,
                      const float *weights) {
    (void)weights;
    load_log *log = ctx;
    if (log->n >= 4096) return;
    memcpy(log->loads[log->n], loads, (size_t)n_expert * sizeof(int32_t));
    log->layer[log->n++] = layer;
}

/* Executor level: 6 tokens all routed to experts 0 and 1, capacity 2, drop:
 * the outputs show which assignments kept their slots, which must be the two
 * most salient for each expert under each policy. */
static void test_lowest_salience_dropped(nm_model *m, nm_device *dev) {
    enum { N = 6, K = 2, CAP = 2 };
    const nm_expert_weights *w = &m->layers[0].experts;
    const int64_t d = w->down.n, ff = w->gate.n;
    float x[N * 64], xn[N * 64], weights[N * K], out[N * 64];
    int32_t ids[N * K];
    uint64_t rng = 12345;
    for (int i = 0; i < N * 64; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(rng >> 11) * 0x1.0p-53 * 2 - 1) * (1 + i / 64);
    }
    for (int i = 0; i < N * 64; i++)
        xn[i] = x[(i + 64 * 3) % (N * 64)] * 0.5f; /* other order */
    for (int t = 0; t < N; t++) {
        ids[t * K] = 0;
        ids[t * K + 1] = 1;
        weights[t * K] = 0.5f + 0.07f * (float)((t * 5) % N); /* a permutation */
        weights[t * K + 1] = 0.9f - 0.11f * (float)t;
    }
    float f[2][N * 64], gate[N * 32], up[N * 32]; /* FFN_e(xn_t) on the host */
    CHECK(d == 64 && ff == 32);
    for (int e = 0; e < 2; e++)
        nm_expert_ffn_forward(w, e, xn, d, N, gate, up, f[e], d);

    const nm_salience policies[3] = {NM_SALIENCE_ROUTER, NM_SALIENCE_RESIDUAL, NM_SALIENCE_INPUT};
    for (int pi = 0; pi < 3; pi++) {
        static nm_test_plan tp;
        nm_test_parity_plan(&tp, T, N_LAYER, N_EXPERT, CAP, false, NM_OVERFLOW_DROP, policies[pi]);
        tp.plan.moe.chunk = N;
        const nm_expert_weights *layers[N_LAYER] = {w, &m->layers[1].experts,
                                                    &m->layers[2].experts};
        nm_moe_exec_params ep = {.mode = NM_MODE_GROUPED,
                                 .plan = &tp.plan.moe,
                                 .device = dev,
                                 .chunk = N,
                                 .n_layer = N_LAYER,
                                 .weights = layers,
                                 .k = K,
                                 .n_threads = 1};
        nm_moe_exec *ex = NULL;
        nm_error err = {0};
        CHECK_INT_EQ(nm_moe_exec_new(&ep, &ex, &err), NM_OK);
        nm_pool *pool = NULL;
        CHECK_INT_EQ(nm_pool_new(1, &pool, &err), NM_OK);
        if (!ex || !pool) return;
        nm_moe_exec_layer(ex, pool, 0, x, xn, N, ids, weights, out);
        for (int e = 0; e < 2; e++) {
            /* expected kept set: the CAP highest scores */
            float score[N];
            for (int t = 0; t < N; t++) {
                const float *act = policies[pi] == NM_SALIENCE_RESIDUAL ? x : xn;
                double ss = 0;
                for (int i = 0; i < d; i++)
                    ss += (double)act[t * d + i] * act[t * d + i];
                score[t] = policies[pi] == NM_SALIENCE_ROUTER ? weights[t * K + e] : (float)ss;
            }
            int kept_want = 0, kept_match = 0;
            for (int t = 0; t < N; t++) {
                int better = 0;
                for (int u = 0; u < N; u++)
                    better += score[u] > score[t];
                const bool want = better < CAP;
                kept_want += want;
                /* which of the four combinations the output row is */
                double best = INFINITY;
                int best_combo = -1;
                for (int combo = 0; combo < 4; combo++) {
                    double dist = 0;
                    for (int i = 0; i < d; i++) {
                        double v = ((combo & 1) ? weights[t * K] * f[0][t * d + i] : 0) +
                                   ((combo & 2) ? weights[t * K + 1] * f[1][t * d + i] : 0);
                        dist += fabs(v - out[t * d + i]);
                    }
                    if (dist < best) best = dist, best_combo = combo;
                }
                kept_match += (((best_combo >> e) & 1) != 0) == want;
            }
            CHECK_INT_EQ(kept_want, CAP);
            if (kept_match != N)
                fprintf(stderr, "salience %s expert %d: kept set differs\n",
                        nm_salience_name(policies[pi]), e);
            CHECK_INT_EQ(kept_match, N);
        }
        nm_pool_free(pool);
        nm_moe_exec_free(ex);
    }
}

/* A device that runs no F32 graph (the cpu device's table with another
 * supports): every mode that would hand it a graph over the tiny model's F32
 * experts is refused before anything is compiled; npumoe with every group
 * on the host hands it none and runs. */
static nm_device_ops no_f32_ops;

static bool no_f32(const nm_device *dev, uint32_t type, nm_graph_op op) {
    (void)dev;
    return op == NM_GRAPH_FFN && type != NM_DTYPE_F32;
}

static void test_unsupported_device(nm_model *m, nm_device *cpu) {
    no_f32_ops = *cpu->ops;
    no_f32_ops.supports = no_f32;
    nm_device fake = {.ops = &no_f32_ops, .ctx = cpu->ctx};
    CHECK(nm_device_supports(cpu, NM_DTYPE_F32, NM_GRAPH_FFN));
    CHECK(!nm_device_supports(&fake, NM_DTYPE_F32, NM_GRAPH_FFN));
    static nm_test_plan on_dev, all_host;
    nm_test_parity_plan(&on_dev, T, N_LAYER, N_EXPERT, T, true, NM_OVERFLOW_SPILL,
                        NM_SALIENCE_ROUTER);
    nm_test_parity_plan(&all_host, T, N_LAYER, N_EXPERT, T, true, NM_OVERFLOW_SPILL,
                        NM_SALIENCE_ROUTER);
    for (int l = 0; l < N_LAYER; l++)
        all_host.groups[l][0].on_device = all_host.groups[l][1].on_device = false;
    nm_device_stats s0, s1;
    cpu->ops->stats(cpu, &s0);
    const nm_mode modes[4] = {NM_MODE_NAIVE, NM_MODE_TIERS, NM_MODE_GROUPED, NM_MODE_NPUMOE};
    for (int i = 0; i < 4; i++) {
        nm_session_params sp = nm_session_default_params();
        sp.n_ctx = 64;
        sp.n_batch = T;
        sp.n_threads = 1;
        sp.mode = modes[i];
        sp.plan = &on_dev.plan;
        sp.device = &fake;
        nm_session *s = NULL;
        nm_error err = {0};
        CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_ERR_UNSUPPORTED);
        CHECK(s == NULL);
        char want[160];
        snprintf(want, sizeof want,
                 "mode %s: the cpu device cannot run expert FFN graphs over f32 weights (the "
                 "gate matrices of layer 0)",
                 nm_mode_name(modes[i]));
        CHECK(strstr(err.msg, want) != NULL);
        if (!strstr(err.msg, want)) fprintf(stderr, "  expected '%s' in: %s\n", want, err.msg);
        if (modes[i] != NM_MODE_NPUMOE) continue;
        sp.plan = &all_host.plan;
        CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
        nm_session_free(s);
    }
    cpu->ops->stats(cpu, &s1);
    CHECK_INT_EQ(s1.graphs_compiled, s0.graphs_compiled);
}

int main(void) {
    nm_model *m = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_model_load(VEC "model.gguf", NULL, &m, &err), NM_OK);
    nm_device *dev = NULL;
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "cpu", .n_threads = 1}, &dev, &err),
                 NM_OK);
    if (!m || !dev) return nm_test_finish("test_static");
    const int nv = m->hp.n_vocab;
    int32_t ids[MAX_IDS];
    const int n = nm_test_read_ints(VEC "prompts.txt", 3, ids,
                                    MAX_IDS); /* 100 tokens: 6 chunks of 16 and a padded 4 */
    CHECK_INT_EQ(n, 100);
    const int n_decode = 5, rows = n + n_decode;
    float *dense = malloc((size_t)rows * nv * sizeof(float));
    float *got = malloc((size_t)rows * nv * sizeof(float));
    static load_log log;

    /* the reference: dense mode, chunks of T, then decode */
    nm_session *s = nm_test_mode_session(m, T, NM_MODE_DENSE, NULL, NULL);
    log.n = 0;
    nm_test_run_greedy(s, ids, n, n_decode, dense, nv, log_loads, &log);
    nm_session_free(s);

    /* capacities that hold every load: every mode equals dense */
    static nm_test_plan full, tiny_spill, tiny_drop;
    nm_test_parity_plan(&full, T, N_LAYER, N_EXPERT, T, true, NM_OVERFLOW_DROP, NM_SALIENCE_ROUTER);
    const nm_mode modes[4] = {NM_MODE_NAIVE, NM_MODE_TIERS, NM_MODE_GROUPED, NM_MODE_NPUMOE};
    for (int i = 0; i < 4; i++) {
        s = nm_test_mode_session(m, T, modes[i], &full.plan, dev);
        if (!s) continue;
        log.n = 0;
        nm_test_run_greedy(s, ids, n, n_decode, got, nv, log_loads, &log);
        double e = nm_test_rows_rel_err(got, dense, (size_t)rows, nv);
        printf("%-8s full capacity: max rel vs dense %.3g (prefill + %d decode steps)\n",
               nm_mode_name(modes[i]), e, n_decode);
        CHECK(e < 1e-5);
        nm_session_metrics mt;
        nm_session_get_metrics(s, &mt);
        CHECK_INT_EQ(mt.total.dropped, 0);
        CHECK_INT_EQ(mt.total.spilled, 0);
        CHECK_INT_EQ(mt.total.assignments, (uint64_t)n * 2 * N_LAYER);
        /* dispatches: naive and tiers one per active expert per layer and
         * chunk; grouped one per group; npumoe one per device group */
        uint64_t want = 0;
        for (int64_t c = 0; c < log.n; c++)
            for (int e2 = 0; e2 < N_EXPERT; e2++)
                if (modes[i] == NM_MODE_NAIVE || modes[i] == NM_MODE_TIERS)
                    want += log.loads[c][e2] > 0;
        if (modes[i] == NM_MODE_GROUPED) want = (uint64_t)log.n * 2;
        if (modes[i] == NM_MODE_NPUMOE) want = (uint64_t)log.n * 1;
        CHECK_INT_EQ(log.n, 7 * N_LAYER);
        CHECK_INT_EQ(mt.total.dispatches, want);
        if (modes[i] == NM_MODE_NPUMOE) CHECK(mt.total.host_rows > 0 && mt.total.device_rows > 0);
        nm_session_free(s);
    }

    /* capacity 1 with spill: still exactly dense */
    nm_test_parity_plan(&tiny_spill, T, N_LAYER, N_EXPERT, 1, false, NM_OVERFLOW_SPILL,
                        NM_SALIENCE_ROUTER);
    s = nm_test_mode_session(m, T, NM_MODE_GROUPED, &tiny_spill.plan, dev);
    if (s) {
        log.n = 0;
        nm_test_run_greedy(s, ids, n, n_decode, got, nv, log_loads, &log);
        double e = nm_test_rows_rel_err(got, dense, (size_t)rows, nv);
        nm_session_metrics mt;
        nm_session_get_metrics(s, &mt);
        printf("grouped capacity 1 spill: max rel vs dense %.3g, %llu of %llu spilled\n", e,
               (unsigned long long)mt.total.spilled, (unsigned long long)mt.total.assignments);
        CHECK(e < 1e-5);
        uint64_t over = 0;
        for (int64_t c = 0; c < log.n; c++)
            for (int e2 = 0; e2 < N_EXPERT; e2++)
                over += log.loads[c][e2] > 1 ? log.loads[c][e2] - 1 : 0;
        CHECK_INT_EQ(mt.total.spilled, over);
        CHECK_INT_EQ(mt.total.dropped, 0);
        nm_session_free(s);
    }

    /* capacity 3 with drop: the recount from the routed loads */
    const nm_salience saliences[3] = {NM_SALIENCE_ROUTER, NM_SALIENCE_RESIDUAL, NM_SALIENCE_INPUT};
    for (int si = 0; si < 3; si++) {
        nm_test_parity_plan(&tiny_drop, T, N_LAYER, N_EXPERT, 3, false, NM_OVERFLOW_DROP,
                            saliences[si]);
        s = nm_test_mode_session(m, T, NM_MODE_GROUPED, &tiny_drop.plan, dev);
        if (!s) continue;
        log.n = 0;
        nm_test_run_greedy(s, ids, n, 0, got, nv, log_loads, &log);
        nm_session_metrics mt;
        nm_session_get_metrics(s, &mt);
        uint64_t over = 0;
        for (int64_t c = 0; c < log.n; c++)
            for (int e2 = 0; e2 < N_EXPERT; e2++)
                over += log.loads[c][e2] > 3 ? log.loads[c][e2] - 3 : 0;
        printf("grouped capacity 3 drop (%s): %llu dropped, recount %llu, max rel vs dense %.3g\n",
               nm_salience_name(saliences[si]), (unsigned long long)mt.total.dropped,
               (unsigned long long)over, nm_test_rows_rel_err(got, dense, (size_t)n, nv));
        CHECK(over > 0);
        CHECK_INT_EQ(mt.total.dropped, over);
        CHECK_INT_EQ(mt.total.device_rows + mt.total.dropped, mt.total.assignments);
        CHECK_INT_EQ(mt.total.reserved_rows, (uint64_t)log.n * N_EXPERT * 3);
        nm_session_free(s);
    }

    test_lowest_salience_dropped(m, dev);
    test_unsupported_device(m, dev);

    /* a plan for another shape or chunk is refused */
    s = NULL;
    nm_session_params sp = nm_session_default_params();
    sp.n_batch = 32;
    sp.mode = NM_MODE_GROUPED;
    sp.plan = &full.plan;
    sp.device = dev;
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "chunks of 16") != NULL);
    sp.n_batch = T;
    sp.device = NULL;
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_ERR_INVALID_ARG);
    sp.device = dev;
    sp.plan = NULL;
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_ERR_INVALID_ARG);
    full.groups[1][0].experts[0] = 1; /* expert 1 twice, expert 0 nowhere */
    sp.plan = &full.plan;
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "layer 1") != NULL);

    free(dense);
    free(got);
    nm_device_close(dev);
    nm_model_free(m);
    return nm_test_finish("test_static");
}
