/* The vulkan device (graph kind 1) on whatever Vulkan driver the machine
 * has (CI: Mesa's lavapipe): device listing and the errors of creation;
 * grouped FFN graphs of every weight type the shaders read, and one they
 * convert, against the host's reference kernels, also with gpt-oss's
 * expert biases and clamped SwiGLU; the memory budget; the static modes
 * with --device vulkan against dense on the tiny models (gpt-oss's, F16
 * and MXFP4, and deepseek2's among them) and the shipped one, drop against the cpu device,
 * all-on-device and all-on-host plans. The device accumulates in FP32 in another order than
 * the host: outputs are compared with a stated tolerance (TOL below). In a
 * build without Vulkan it checks the error that says so. Exits 77 (skipped)
 * when no Vulkan driver is found, unless NM_REQUIRE_VULKAN is set. */
#include "harness.h"

#include "base/base.h"
#include "device/device.h"
#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Largest |device - host| of an output row over the row's largest |host|
 * value. The products are the same; the sums run in another order (and
 * the host's F16/BF16 paths may round differently), so the error grows
 * like eps * sqrt(K) ~ 1e-6 here; 1e-4 leaves room without hiding a wrong
 * weight (which is off by ~1e-1 or more). */
#define TOL 1e-4
/* Logits of whole models vs dense: the FFN errors above pass through every
 * later layer. */
#define TOL_MODEL 1e-3

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rng_float(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* ---- graphs against the host ---- */

/* The worst row error (TOL's measure) of a graph run over random rows. */
static double run_graph(nm_device *dev, const nm_expert_weights *w, int32_t n, const int32_t *ex,
                        const int32_t *cap, nm_status *st, nm_error *err) {
    const int64_t dm = w->gate.k, ff = w->gate.n;
    const nm_ffn_spec spec = {.layer = 0,
                              .n_experts = n,
                              .experts = ex,
                              .capacity = cap,
                              .d_model = dm,
                              .d_ff = ff,
                              .weights = w};
    nm_graph *g = NULL;
    *st = dev->ops->compile(dev, &spec, &g, err);
    if (*st) return INFINITY;
    const int64_t rows = nm_ffn_spec_rows(&spec);
    float *in = dev->ops->input(g);
    for (int64_t i = 0; i < rows * dm; i++)
        in[i] = rng_float();
    dev->ops->submit(g);
    dev->ops->wait(g);
    const float *out = dev->ops->output(g);
    float *gt = malloc((size_t)(rows * ff) * sizeof(float));
    float *up = malloc((size_t)(rows * ff) * sizeof(float));
    float *want = malloc((size_t)(rows * dm) * sizeof(float));
    double worst = 0;
    for (int32_t i = 0, row = 0; i < n; row += cap[i++]) {
        nm_expert_ffn_forward(w, ex[i], in + row * dm, dm, cap[i], gt, up, want, dm);
        for (int32_t r = 0; r < cap[i]; r++) {
            double top = 0, diff = 0;
            for (int64_t j = 0; j < dm; j++) {
                top = fmax(top, fabs(want[r * dm + j]));
                const double d = fabs((double)out[(row + r) * dm + j] - want[r * dm + j]);
                if (!(d <= diff)) diff = d; /* NaN sticks */
            }
            const double rel = diff / fmax(top, 1e-30);
            if (!(rel <= worst)) worst = rel;
        }
    }
    free(gt);
    free(up);
    free(want);
    dev->ops->graph_free(g);
    return worst;
}

static void check_type(nm_device *dev, uint32_t type) {
    enum { N_EXPERT = 6 };
    nm_test_experts s =
        nm_test_experts_new(type, N_EXPERT, 256, 256, rng_float); /* K-quants need rows of 256 */
    nm_device_stats s0, s1;
    dev->ops->stats(dev, &s0);
    const int32_t ex[3] = {4, 0, 5}, cap[3] = {3, 1, 6};
    nm_status st;
    nm_error err = {0};
    const double worst = run_graph(dev, &s.w, 3, ex, cap, &st, &err);
    dev->ops->stats(dev, &s1);
    printf("%-5s 3 experts, 10 rows: worst row error %.3g (tolerance %g)\n", nm_dtype_name(type),
           worst, TOL);
    if (st) fprintf(stderr, "%s: %s\n", nm_dtype_name(type), err.msg);
    CHECK_INT_EQ(st, NM_OK);
    CHECK(worst <= TOL);
    CHECK_INT_EQ(s1.graphs_compiled - s0.graphs_compiled, 1);
    CHECK_INT_EQ(s1.dispatches - s0.dispatches, 1);
    CHECK_INT_EQ(s1.rows_computed - s0.rows_computed, 10);
    CHECK(s1.busy_ns > s0.busy_ns);
    /* uploaded once: three matrices per expert in the shaders' format */
    const bool read = type == NM_DTYPE_F32 || type == NM_DTYPE_F16 || type == NM_DTYPE_BF16 ||
                      type == NM_DTYPE_Q8_0 || type == NM_DTYPE_Q4_K || type == NM_DTYPE_MXFP4;
    const uint64_t mat = read ? s.w.gate.n * s.w.gate.row_bytes : 256 * 256 * 4;
    CHECK_INT_EQ(s1.upload_bytes - s0.upload_bytes, 3 * 3 * mat);
    CHECK_INT_EQ(s1.device_bytes, s0.device_bytes); /* freed */
    nm_test_experts_free(&s);
}

/* gpt-oss's experts (nm_expert_ffn_forward is the reference): gate, up and
 * down biases, each alone and all three, under SwiGLU and the clamped
 * SwiGLU (alpha 1.702, limit 7). Biases up to +-12 push many gate and up
 * values past the limit, so the clamps are exercised (counted below). */
static void check_biased(nm_device *dev, uint32_t type) {
    enum { N_EXPERT = 5, DM = 64, FF = 96 };
    nm_test_experts s = nm_test_experts_new(type, N_EXPERT, DM, FF, rng_float);
    float *gb = malloc(N_EXPERT * FF * sizeof(float)), *ub = malloc(N_EXPERT * FF * sizeof(float));
    float *db = malloc(N_EXPERT * DM * sizeof(float));
    for (int i = 0; i < N_EXPERT * FF; i++) {
        gb[i] = 12.0f * rng_float();
        ub[i] = 12.0f * rng_float();
    }
    for (int i = 0; i < N_EXPERT * DM; i++)
        db[i] = rng_float();
    int clamped = 0;
    for (int i = 0; i < N_EXPERT * FF; i++)
        clamped += (gb[i] > 8.0f) + (fabsf(ub[i]) > 8.0f); /* x W: sd ~0.33, so past 7 */
    CHECK(clamped > 20);
    const int32_t ex[3] = {3, 0, 4}, cap[3] = {2, 5, 1};
    for (int glu = 0; glu < 2; glu++)
        for (int which = 0; which < 4; which++) {
            nm_expert_weights w = s.w;
            w.glu = glu ? NM_GLU_SWIGLU_OAI : NM_GLU_SWIGLU;
            w.glu_alpha = 1.702f;
            w.glu_limit = 7.0f;
            w.gate_b = which == 0 || which == 3 ? gb : NULL;
            w.up_b = which == 1 || which == 3 ? ub : NULL;
            w.down_b = which == 2 || which == 3 ? db : NULL;
            nm_status st;
            nm_error err = {0};
            CHECK_INT_EQ(nm_device_check_ffn(dev, &w, 0, &err), NM_OK);
            const double worst = run_graph(dev, &w, 3, ex, cap, &st, &err);
            printf("%-5s %s, %s bias%s: worst row error %.3g (tolerance %g)\n", nm_dtype_name(type),
                   glu ? "clamped SwiGLU" : "SwiGLU",
                   (const char *[]){"gate", "up", "down", "every"}[which],
                   which == 3 ? "" : " only", worst, TOL);
            if (st) fprintf(stderr, "%s\n", err.msg);
            CHECK_INT_EQ(st, NM_OK);
            CHECK(worst <= TOL);
        }
    free(gb);
    free(ub);
    free(db);
    nm_test_experts_free(&s);
}

/* Several graphs in flight, waited in reverse order, each still right. */
static void check_in_flight(nm_device *dev) {
    nm_test_experts s = nm_test_experts_new(NM_DTYPE_Q8_0, 4, 64, 96, rng_float);
    enum { N = 3 };
    nm_graph *g[N];
    int32_t ex[N][1], cap[N][1];
    float *want[N];
    for (int k = 0; k < N; k++) {
        ex[k][0] = k;
        cap[k][0] = 2 + k;
        const nm_ffn_spec spec = {.n_experts = 1,
                                  .experts = ex[k],
                                  .capacity = cap[k],
                                  .d_model = 64,
                                  .d_ff = 96,
                                  .weights = &s.w};
        CHECK_INT_EQ(dev->ops->compile(dev, &spec, &g[k], NULL), NM_OK);
        float *in = dev->ops->input(g[k]);
        for (int64_t i = 0; i < cap[k][0] * 64; i++)
            in[i] = rng_float();
        want[k] = malloc((size_t)cap[k][0] * 64 * sizeof(float));
        float gt[8 * 96], up[8 * 96];
        nm_expert_ffn_forward(&s.w, k, in, 64, cap[k][0], gt, up, want[k], 64);
    }
    for (int k = 0; k < N; k++)
        dev->ops->submit(g[k]);
    for (int k = N - 1; k >= 0; k--) {
        dev->ops->wait(g[k]);
        const float *out = dev->ops->output(g[k]);
        double worst = 0;
        for (int64_t i = 0; i < cap[k][0] * 64; i++)
            worst = fmax(worst, fabs((double)out[i] - want[k][i]));
        CHECK(worst < TOL);
        free(want[k]);
        dev->ops->graph_free(g[k]);
    }
    nm_test_experts_free(&s);
}

/* A budget too small for a graph: refused with the numbers; a repacked
 * (host-only) layout: refused, saying what to do. */
static void check_refusals(void) {
    nm_test_experts s = nm_test_experts_new(NM_DTYPE_F32, 2, 64, 64, rng_float);
    const int32_t ex[1] = {1}, cap[1] = {4};
    const nm_ffn_spec spec = {
        .n_experts = 1, .experts = ex, .capacity = cap, .d_model = 64, .d_ff = 64, .weights = &s.w};
    nm_device *dev = NULL;
    nm_error err = {0};
    const nm_vulkan_device_params small = {.index = 0, .budget_bytes = 4096};
    CHECK_INT_EQ(nm_vulkan_device_new(&small, &dev, &err), NM_OK);
    if (dev) {
        nm_graph *g = NULL;
        CHECK_INT_EQ(dev->ops->compile(dev, &spec, &g, &err), NM_ERR_CAPACITY);
        printf("budget 4096: %s\n", err.msg);
        CHECK(strstr(err.msg, "budget of 4096 bytes") != NULL);
        CHECK(g == NULL);
        nm_device_stats st;
        dev->ops->stats(dev, &st);
        CHECK_INT_EQ(st.device_bytes, 0); /* nothing left behind */
        nm_device_close(dev);
    }
    const nm_vulkan_device_params big = {.index = 0, .budget_bytes = 0};
    CHECK_INT_EQ(nm_vulkan_device_new(&big, &dev, &err), NM_OK);
    if (dev) {
        nm_expert_weights w = s.w;
        w.gate.layout = NM_LAYOUT_PANEL16;
        const nm_ffn_spec packed = {.n_experts = 1,
                                    .experts = ex,
                                    .capacity = cap,
                                    .d_model = 64,
                                    .d_ff = 64,
                                    .weights = &w};
        nm_graph *g = NULL;
        CHECK_INT_EQ(dev->ops->compile(dev, &packed, &g, &err), NM_ERR_UNSUPPORTED);
        CHECK(strstr(err.msg, "--no-repack") != NULL);
        const int32_t bad[1] = {2};
        const nm_ffn_spec out_of_range = {.n_experts = 1,
                                          .experts = bad,
                                          .capacity = cap,
                                          .d_model = 64,
                                          .d_ff = 64,
                                          .weights = &s.w};
        CHECK_INT_EQ(dev->ops->compile(dev, &out_of_range, &g, &err), NM_ERR_INVALID_ARG);
        CHECK_INT_EQ(nm_device_check(dev, &err), NM_OK);
        nm_device_close(dev);
    }
    nm_test_experts_free(&s);
}

/* ---- listing and names ---- */

static void check_names(int n_vulkan) {
    nm_device *dev = NULL;
    nm_error err = {0};
    char name[32];
    snprintf(name, sizeof name, "vulkan:%d", n_vulkan);
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = name, .n_threads = 1}, &dev, &err),
                 NM_ERR_NOT_FOUND);
    printf("%s: %s\n", name, err.msg);
    CHECK(strstr(err.msg, "does not exist") != NULL);
    const char *bad[] = {"vulkan:", "vulkan:x", "vulkan:-1", "vulkan:1x", "vulkanx"};
    for (int i = 0; i < 5; i++) {
        const nm_status st =
            nm_device_open(&(nm_device_params){.name = bad[i], .n_threads = 1}, &dev, &err);
        CHECK(st == NM_ERR_INVALID_ARG || st == NM_ERR_UNSUPPORTED);
        CHECK(dev == NULL);
    }
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "vulkan", .n_threads = 1}, &dev, &err),
                 NM_OK);
    nm_device_close(dev);
    CHECK_INT_EQ(
        nm_device_open(&(nm_device_params){.name = "vulkan:0", .n_threads = 1}, &dev, &err), NM_OK);
    nm_device_close(dev);
}

/* ---- the static modes on whole models ---- */

enum { T = 16, MAX_IDS = 512 };

enum { MAX_LAYER = 8 };

/* Logits of the ids prefilled in chunks of T plus 3 greedy steps; the
 * metrics, with each layer's drops in dropped (the session owns mt->layers,
 * which are gone on return). */
static void run_mode(nm_model *m, nm_mode mode, const nm_plan *plan, nm_device *dev,
                     const int32_t *ids, int n, float *out, nm_session_metrics *mt,
                     uint64_t *dropped) {
    /* the harness's plans name the cpu device; a session refuses a plan made
     * for another device, so each run names the device it runs on */
    nm_plan named;
    if (plan && dev) {
        named = *plan;
        snprintf(named.device, sizeof named.device, "%s", dev->ops->name);
        plan = &named;
    }
    nm_session *s = nm_test_mode_session(m, T, mode, plan, dev);
    if (!s) return;
    nm_test_run_greedy(s, ids, n, 3, out, m->hp.n_vocab, NULL, NULL);
    if (mt) nm_session_get_metrics(s, mt);
    for (int l = 0; dropped && l < mt->n_layer && l < MAX_LAYER; l++)
        dropped[l] = mt->layers[l].dropped;
    if (mt) mt->layers = NULL;
    nm_session_free(s);
}

static void check_model(const char *path, const int32_t *ids, int n, nm_device *vk,
                        nm_device *cpu) {
    printf("---- %s\n", path);
    nm_model *m = NULL;
    nm_error err = {0};
    nm_model_params mp = nm_model_default_params();
    mp.no_repack = true; /* the device reads the file's layout */
    CHECK_INT_EQ(nm_model_load(path, &mp, &m, &err), NM_OK);
    if (!m) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return;
    }
    const int nv = m->hp.n_vocab, rows = n + 3;
    const int32_t nl = nm_model_n_moe_layers(&m->hp), ne = m->hp.n_expert;
    float *dense = malloc((size_t)rows * nv * sizeof(float));
    float *got = malloc((size_t)rows * nv * sizeof(float));
    float *ref = malloc((size_t)rows * nv * sizeof(float));
    run_mode(m, NM_MODE_DENSE, NULL, NULL, ids, n, dense, NULL, NULL);
    static nm_test_plan full, odd_host, spill, drop;
    nm_test_parity_plan(&full, T, nl, ne, T, false, NM_OVERFLOW_DROP, NM_SALIENCE_ROUTER);
    nm_test_parity_plan(&odd_host, T, nl, ne, T, true, NM_OVERFLOW_DROP, NM_SALIENCE_ROUTER);
    const nm_mode modes[4] = {NM_MODE_NAIVE, NM_MODE_TIERS, NM_MODE_GROUPED, NM_MODE_NPUMOE};
    for (int i = 0; i < 4; i++) {
        nm_session_metrics mt;
        run_mode(m, modes[i], &odd_host.plan, vk, ids, n, got, &mt, NULL);
        const double e = nm_test_rows_rel_err(got, dense, (size_t)rows, nv);
        printf("%s %-7s full capacity, odd experts on the host: max rel vs dense %.3g\n", path,
               nm_mode_name(modes[i]), e);
        CHECK(e < TOL_MODEL);
        CHECK(mt.total.device_rows > 0);
        CHECK_INT_EQ(mt.total.dropped, 0);
        CHECK_INT_EQ(nm_device_check(vk, &err), NM_OK);
    }
    /* a plan made for the cpu device is refused on vulkan, naming both */
    nm_session_params sp = nm_session_default_params();
    sp.mode = NM_MODE_GROUPED;
    sp.plan = &full.plan;
    sp.device = vk;
    nm_session *refused = NULL;
    CHECK_INT_EQ(nm_session_new(m, &sp, &refused, &err), NM_ERR_INVALID_ARG);
    CHECK(refused == NULL);
    CHECK(strstr(err.msg, "'cpu'") != NULL && strstr(err.msg, "'vulkan'") != NULL);
    /* forced residency, both ways: every group on the device, then none */
    nm_session_metrics mt;
    run_mode(m, NM_MODE_NPUMOE, &full.plan, vk, ids, n, got, &mt, NULL);
    double e = nm_test_rows_rel_err(got, dense, (size_t)rows, nv);
    printf("%s npumoe all on the device: max rel vs dense %.3g, %llu device rows, %llu host\n",
           path, e, (unsigned long long)mt.total.device_rows,
           (unsigned long long)mt.total.host_rows);
    CHECK(e < TOL_MODEL);
    CHECK(mt.total.device_rows > 0);
    CHECK_INT_EQ(mt.total.device_rows, mt.total.assignments);
    for (int l = 0; l < nl; l++)
        full.groups[l][0].on_device = full.groups[l][1].on_device = false;
    run_mode(m, NM_MODE_NPUMOE, &full.plan, vk, ids, n, got, &mt, NULL);
    e = nm_test_rows_rel_err(got, dense, (size_t)rows, nv);
    printf("%s npumoe all on the host: max rel vs dense %.3g, %llu device rows\n", path, e,
           (unsigned long long)mt.total.device_rows);
    CHECK(e < TOL_MODEL);
    CHECK_INT_EQ(mt.total.device_rows, 0);
    CHECK_INT_EQ(mt.total.dispatches, 0);
    /* capacity 1, spill: dense within tolerance */
    nm_test_parity_plan(&spill, T, nl, ne, 1, false, NM_OVERFLOW_SPILL, NM_SALIENCE_ROUTER);
    run_mode(m, NM_MODE_GROUPED, &spill.plan, vk, ids, n, got, &mt, NULL);
    e = nm_test_rows_rel_err(got, dense, (size_t)rows, nv);
    printf("%s grouped capacity 1 spill: max rel vs dense %.3g, %llu spilled\n", path, e,
           (unsigned long long)mt.total.spilled);
    CHECK(e < TOL_MODEL);
    CHECK(mt.total.spilled > 0);
    /* capacity 2, drop: the cpu device's drops, so the cpu device's logits */
    nm_test_parity_plan(&drop, T, nl, ne, 2, false, NM_OVERFLOW_DROP, NM_SALIENCE_ROUTER);
    nm_session_metrics mc;
    uint64_t drop_cpu[MAX_LAYER] = {0}, drop_vk[MAX_LAYER] = {0};
    run_mode(m, NM_MODE_GROUPED, &drop.plan, cpu, ids, n, ref, &mc, drop_cpu);
    run_mode(m, NM_MODE_GROUPED, &drop.plan, vk, ids, n, got, &mt, drop_vk);
    e = nm_test_rows_rel_err(got, ref, (size_t)rows, nv);
    printf("%s grouped capacity 2 drop: %llu dropped (cpu device %llu), max rel vs the cpu "
           "device %.3g, vs dense %.3g\n",
           path, (unsigned long long)mt.total.dropped, (unsigned long long)mc.total.dropped, e,
           nm_test_rows_rel_err(got, dense, (size_t)rows, nv));
    CHECK(mt.total.dropped > 0);
    CHECK_INT_EQ(mt.total.dropped, mc.total.dropped);
    for (int l = 0; l < nl && l < MAX_LAYER; l++)
        CHECK_INT_EQ(drop_vk[l], drop_cpu[l]);
    CHECK(e < TOL_MODEL);
    free(dense);
    free(got);
    free(ref);
    nm_model_free(m);
}

int main(void) {
    nm_device_info *list = NULL;
    int n = 0;
    char why[512];
    nm_error err = {0};
    CHECK_INT_EQ(nm_device_list(&list, &n, why, sizeof why, &err), NM_OK);
    CHECK(n >= 1 && strcmp(list[0].name, "cpu") == 0);
    for (int i = 0; i < n; i++)
        printf("device %-9s %s; %s; %.1f GiB; float16 %s, int8 %s\n", list[i].name,
               list[i].description, list[i].driver, (double)list[i].memory_bytes / (1 << 30),
               list[i].float16 ? "yes" : "no", list[i].int8 ? "yes" : "no");
    const int n_vulkan = n - 1;
    nm_free(list);
    if (n_vulkan == 0) {
        printf("no Vulkan device: %s\n", why);
        CHECK(why[0] != '\0');
        nm_device *dev = NULL;
        CHECK(nm_device_open(&(nm_device_params){.name = "vulkan", .n_threads = 1}, &dev, &err) !=
              NM_OK);
        CHECK(dev == NULL && err.msg[0] != '\0');
        printf("--device vulkan: %s\n", err.msg);
        if (getenv("NM_REQUIRE_VULKAN")) {
            fprintf(stderr, "NM_REQUIRE_VULKAN is set and no Vulkan device can be used\n");
            return 1;
        }
        nm_test_finish("test_vulkan");
        return 77;
    }
    /* the reference the device is held to: the plain C kernels */
    CHECK(nm_kernels_force(NM_KERNELS_REF));
    check_names(n_vulkan);
    nm_device *vk = NULL, *cpu = NULL;
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "vulkan", .n_threads = 1}, &vk, &err),
                 NM_OK);
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "cpu", .n_threads = 1}, &cpu, &err),
                 NM_OK);
    if (!vk || !cpu) return nm_test_finish("test_vulkan");
    const uint32_t types[6] = {NM_DTYPE_F32,  NM_DTYPE_F16,  NM_DTYPE_BF16,
                               NM_DTYPE_Q8_0, NM_DTYPE_Q4_K, NM_DTYPE_Q6_K};
    for (int i = 0; i < 6; i++)
        CHECK(nm_device_supports(vk, types[i], NM_GRAPH_FFN));
    /* what it says it supports, it runs: every such type, not only those */
    for (uint32_t t = 0; t < NM_DTYPE_COUNT; t++)
        if (nm_device_supports(vk, t, NM_GRAPH_FFN)) check_type(vk, t);
    CHECK(!nm_device_supports(vk, NM_DTYPE_Q2_K, NM_GRAPH_FFN));
    check_biased(vk, NM_DTYPE_F16);
    check_biased(vk, NM_DTYPE_MXFP4);
    check_in_flight(vk);
    check_refusals();

    int32_t ids[MAX_IDS];
    const int n_ids =
        nm_test_read_ints(NM_VECTORS_DIR "/tiny-qwen3moe/prompts.txt", 3, ids, MAX_IDS);
    CHECK(n_ids >= 40);
    const int n_use = n_ids < 40 ? n_ids : 40; /* 2 chunks of 16 and a padded 8 */
    check_model(NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf", ids, n_use, vk, cpu);
    check_model(NM_VECTORS_DIR "/tiny-qwen3moe-q-Q4_K_M/model.gguf", ids, n_use, vk, cpu);
    check_model(NM_BUILD_DIR "/models/default.gguf", ids, n_use, vk, cpu);
    /* gpt-oss: biased experts, the clamped SwiGLU, MXFP4 experts (the dense
     * part stays on the host: attention sinks); deepseek2: a leading dense
     * layer, shared experts and latent attention on the host */
    const char *own[3] = {"tiny-gptoss", "tiny-gptoss-mxfp4", "tiny-deepseek2"};
    for (int i = 0; i < 3; i++) {
        char dir[512], path[1024];
        snprintf(dir, sizeof dir, "%s/tests/vectors/%s", NM_SOURCE_DIR, own[i]);
        snprintf(path, sizeof path, "%s/prompts.txt", dir);
        const int n_g = nm_test_read_ints(path, 3, ids, MAX_IDS);
        CHECK(n_g >= 40);
        snprintf(path, sizeof path, "%s/model.gguf", dir);
        check_model(path, ids, n_g < 40 ? n_g : 40, vk, cpu);
    }
    nm_device_close(cpu);
    nm_device_close(vk);
    return nm_test_finish("test_vulkan");
}
