/* The static-graph modes on every architecture (olmoe, llama/Mixtral, phimoe
 * in both semantics), with no architecture code in the executor: for each
 * tiny model, with capacities that hold every load, naive, tiers, grouped
 * and npumoe give dense's logits (prefill in padded chunks of 16, then
 * decode steps), capacity 1 with spill too, and the routed assignments
 * reported to calibration are n_tokens * k per layer. */
#include "harness.h"

#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { T = 16, MAX_IDS = 512, MAX_EXPERT = 16, MAX_LAYER = 4 };

static int read_prompt(const char *dir, int line_no, int32_t *out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/prompts.txt", dir);
    return nm_test_read_ints(path, line_no, out, MAX_IDS);
}

/* Two groups per layer (even and odd experts); the odd one on the host. */
typedef struct test_plan {
    nm_plan plan;
    nm_moe_layer_plan layers[MAX_LAYER];
    nm_moe_group groups[MAX_LAYER][2];
    int32_t experts[MAX_LAYER][2][MAX_EXPERT / 2];
} test_plan;

static void make_plan(test_plan *tp, int32_t n_layer, int32_t n_expert, int32_t capacity,
                      nm_overflow overflow) {
    memset(tp, 0, sizeof *tp);
    nm_moe_plan *p = &tp->plan.moe;
    p->chunk = T;
    p->n_layer = n_layer;
    p->n_expert = n_expert;
    p->overflow = overflow;
    p->salience = NM_SALIENCE_ROUTER;
    p->layers = tp->layers;
    for (int l = 0; l < n_layer; l++) {
        tp->layers[l].n_groups = 2;
        tp->layers[l].groups = tp->groups[l];
        for (int g = 0; g < 2; g++) {
            for (int i = 0; i < n_expert / 2; i++)
                tp->experts[l][g][i] = 2 * i + g;
            tp->groups[l][g] = (nm_moe_group){.capacity = capacity,
                                              .n_experts = n_expert / 2,
                                              .experts = tp->experts[l][g],
                                              .on_device = g == 0};
        }
    }
}

static double max_rel(const float *a, const float *b, size_t rows, int n_vocab) {
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        double max_d = 0, max_b = 0;
        for (int i = 0; i < n_vocab; i++) {
            double d = fabs((double)a[r * n_vocab + i] - b[r * n_vocab + i]);
            if (!(d <= max_d)) max_d = isnan(d) ? INFINITY : d;
            if (fabs(b[r * n_vocab + i]) > max_b) max_b = fabs(b[r * n_vocab + i]);
        }
        if (max_d / max_b > worst) worst = max_d / max_b;
    }
    return worst;
}

static nm_session *open_session(nm_model *m, nm_mode mode, const nm_plan *plan, nm_device *dev) {
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 512;
    sp.n_batch = T;
    sp.n_threads = 2;
    sp.mode = mode;
    sp.plan = plan;
    sp.device = dev;
    nm_session *s = NULL;
    nm_error err = {0};
    nm_status st = nm_session_new(m, &sp, &s, &err);
    if (st != NM_OK) fprintf(stderr, "session (%s): %s\n", nm_mode_name(mode), err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return s;
}

static void run(nm_session *s, const int32_t *ids, int n, int n_decode, float *out, int n_vocab) {
    nm_error err = {0};
    CHECK_INT_EQ(nm_session_eval(s, ids, n, out, true, &err), NM_OK);
    const float *last = out + (size_t)(n - 1) * n_vocab;
    for (int i = 0; i < n_decode; i++) {
        int32_t next = nm_argmax(last, n_vocab);
        float *row = out + (size_t)(n + i) * n_vocab;
        CHECK_INT_EQ(nm_session_eval(s, &next, 1, row, false, &err), NM_OK);
        last = row;
    }
}

static int64_t n_routed;
static void count_loads(void *ctx, int32_t layer, const int32_t *loads, int32_t n_expert) {
    (void)ctx;
    (void)layer;
    for (int32_t e = 0; e < n_expert; e++)
        n_routed += loads[e];
}

static void check_model(const char *name, nm_compat compat, nm_device *dev) {
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/%s", NM_VECTORS_DIR, name);
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    nm_model_params mp = nm_model_default_params();
    mp.compat = compat;
    nm_model *m = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_model_load(path, &mp, &m, &err), NM_OK);
    if (!m) return;
    const int nv = m->hp.n_vocab, n_layer = m->hp.n_layer, n_expert = m->hp.n_expert;
    CHECK(n_layer <= MAX_LAYER && n_expert <= MAX_EXPERT && n_expert % 2 == 0);
    int32_t ids[MAX_IDS];
    const int n = read_prompt(dir, 3, ids); /* 100 tokens: 6 chunks of 16 and a padded 4 */
    CHECK_INT_EQ(n, 100);
    const int n_decode = 5, rows = n + n_decode;
    float *dense = malloc((size_t)rows * nv * sizeof(float));
    float *got = malloc((size_t)rows * nv * sizeof(float));

    nm_session *s = open_session(m, NM_MODE_DENSE, NULL, NULL);
    if (s) run(s, ids, n, n_decode, dense, nv);
    nm_session_free(s);

    static test_plan full, spill;
    make_plan(&full, n_layer, n_expert, T, NM_OVERFLOW_DROP);
    make_plan(&spill, n_layer, n_expert, 1, NM_OVERFLOW_SPILL);
    const nm_mode modes[5] = {NM_MODE_NAIVE, NM_MODE_TIERS, NM_MODE_GROUPED, NM_MODE_NPUMOE,
                              NM_MODE_GROUPED};
    for (int i = 0; i < 5; i++) {
        const bool spilling = i == 4;
        s = open_session(m, modes[i], spilling ? &spill.plan : &full.plan, dev);
        if (!s) continue;
        n_routed = 0;
        nm_session_set_load_fn(s, count_loads, NULL);
        run(s, ids, n, n_decode, got, nv);
        const double e = max_rel(got, dense, (size_t)rows, nv);
        nm_session_metrics mt;
        nm_session_get_metrics(s, &mt);
        printf("%s%s: %-8s %s: max rel vs dense %.3g, %llu dropped, %llu spilled\n", name,
               compat == NM_COMPAT_LLAMA_CPP ? " (llama.cpp)" : "", nm_mode_name(modes[i]),
               spilling ? "capacity 1 spill" : "full capacity", e,
               (unsigned long long)mt.total.dropped, (unsigned long long)mt.total.spilled);
        CHECK(e < 1e-5);
        CHECK_INT_EQ(mt.total.dropped, 0);
        CHECK_INT_EQ(n_routed, (int64_t)n * m->hp.n_expert_used * n_layer);
        if (spilling) CHECK(mt.total.spilled > 0);
        nm_session_free(s);
    }
    free(dense);
    free(got);
    nm_model_free(m);
}

int main(void) {
    nm_device *dev = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_device_new("cpu", 1, &dev, &err), NM_OK);
    if (!dev) return nm_test_finish("test_static_arch");
    check_model("tiny-olmoe", NM_COMPAT_NONE, dev);
    check_model("tiny-mixtral", NM_COMPAT_LLAMA_CPP, dev);
    check_model("tiny-phimoe", NM_COMPAT_LLAMA_CPP, dev);
    check_model("tiny-phimoe", NM_COMPAT_NONE, dev);
    nm_device_free(dev);
    return nm_test_finish("test_static_arch");
}
