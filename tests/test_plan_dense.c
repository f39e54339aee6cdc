/* Where a plan puts each layer's dense part (attention and router, graph
 * kind 2): the planner on made-up profiles whose answers are closed forms
 * (a cheap device dense graph puts every layer there, an expensive one
 * none, a profile without the measurement follows the groups, a forced
 * placement wins); the decision through plan and profile files, older
 * files without it loading with today's rule; and sessions in npumoe mode
 * that follow the plan: every dense part forced onto the device with every
 * group on the host, and the reverse, against dense mode (the cpu device
 * bit for bit; vulkan, when a driver is here, within its tolerance), on
 * tiny-qwen3moe and on tiny-qwen2moe, whose shared expert goes with the
 * dense part. */
#include "harness.h"

#include "device/device.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#define TINY NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf"
#define TINY_SHEXP NM_SOURCE_DIR "/tests/vectors/tiny-qwen2moe/model.gguf"
#define TMP(name) NM_BUILD_DIR "/test_plan_dense_" name

/* vulkan against the host: each row's logits within 1e-3 of its largest
 * (test_device_dense's session tolerance) */
#define TOL_VK_MODEL 1e-3

enum { T = 16, N_PROMPT = 40, N_DECODE = 2 };

/* A calibration of m's shape over chunks of T where every expert of every
 * layer receives the same share of the T * k assignments. */
static nm_calib *uniform_calib(const nm_model *m) {
    nm_moe_shape shape;
    nm_model_moe_shape(m, &shape);
    nm_calib *c = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_calib_new(&shape, T, &c, &err), NM_OK);
    if (!c) return NULL;
    const int32_t n_expert = shape.n_expert, per = T * shape.k / n_expert;
    int32_t *loads = calloc((size_t)n_expert, sizeof *loads);
    float *w = calloc((size_t)T * (size_t)shape.k, sizeof *w);
    for (int32_t e = 0; e < n_expert; e++)
        loads[e] = per;
    for (int32_t i = 0; i < T * shape.k; i++)
        w[i] = 0.5f;
    for (int chunk = 0; chunk < 4; chunk++)
        for (int32_t l = 0; l < shape.n_layer; l++)
            nm_calib_record(c, l, loads, n_expert, w);
    free(loads);
    free(w);
    return c;
}

/* graph_ms = dispatch + 0.001 ms per row over {1, 2, 4} experts x {4, 16}
 * rows; the host 0.05 ms per expert + 0.01 ms per row; the dense part
 * dense_device_ms and dense_host_ms over chunks of `chunk`. */
static nm_profile_point points[6];

static nm_profile make_profile(const nm_model *m, const char *device, double dispatch,
                               double dense_device_ms, double dense_host_ms, int32_t chunk) {
    nm_profile p = {.d_model = m->hp.n_embd,
                    .d_ff = m->hp.n_ff_exp,
                    .weight_type = m->layers[0].experts.gate.type,
                    .dispatch_ms = dispatch,
                    .host_row_ms = 0.01,
                    .host_expert_ms = 0.05,
                    .chunk = chunk,
                    .host_overhead_ms = 0,
                    .dense_device_ms = dense_device_ms,
                    .dense_host_ms = dense_host_ms,
                    .n_points = 6,
                    .points = points};
    snprintf(p.device, sizeof p.device, "%s", device);
    const int32_t counts[3] = {1, 2, 4}, caps[2] = {4, 16};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            points[i * 2 + j] =
                (nm_profile_point){counts[i], caps[j], dispatch + 0.001 * counts[i] * caps[j]};
    return p;
}

static nm_plan *make_plan(const nm_model *m, const nm_calib *c, const nm_profile *prof,
                          nm_dense_placement dense) {
    nm_moe_shape shape;
    nm_model_moe_shape(m, &shape);
    nm_plan_params pp = nm_plan_default_params();
    pp.dense = dense;
    nm_plan *p = NULL;
    nm_error err = {0};
    const nm_status st = nm_plan_make(&shape, c, prof, &pp, &p, &err);
    if (st != NM_OK) fprintf(stderr, "nm_plan_make: %s\n", err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return p;
}

static bool layer_has_device_group(const nm_plan *p, int32_t l) {
    const nm_moe_layer_plan *lp = &p->moe.layers[l];
    for (int32_t g = 0; g < lp->n_groups; g++)
        if (lp->groups[g].on_device) return true;
    return false;
}

/* Every layer's dense part on the device (on) or the host, each costing
 * ms per chunk; and the plan's summary of it. */
static void check_placement(const nm_plan *p, bool on, double ms, const char *what) {
    const int32_t n_layer = p->moe.n_layer;
    CHECK(p->dense_on_device != NULL);
    if (!p->dense_on_device) return;
    for (int32_t l = 0; l < n_layer; l++) {
        CHECK_INT_EQ(p->dense_on_device[l], on);
        CHECK_NEAR(p->layer_cost[l].dense_ms, ms, 1e-12);
    }
    nm_plan_info pi;
    nm_plan_get_info(p, &pi);
    CHECK_INT_EQ(pi.dense_device_layers, on ? n_layer : 0);
    CHECK_NEAR(pi.predicted_dense_ms, n_layer * ms, 1e-12);
    printf("%s: dense part on the %s in %d layers, %.3f ms per chunk\n", what,
           on ? "device" : "host", pi.dense_device_layers, pi.predicted_dense_ms);
}

static void test_planner(const nm_model *m, const nm_calib *c) {
    /* profile chunk 8, plan chunk T = 16: every cost doubles */
    nm_profile cheap = make_profile(m, "synthetic", 1000, 0.5, 2.0, 8);
    nm_plan *p = make_plan(m, c, &cheap, NM_DENSE_BY_PROFILE);
    if (p) {
        CHECK(!layer_has_device_group(p, 0)); /* a dispatch of a second: groups on the host */
        check_placement(p, true, 1.0, "cheap device dense graph");
    }
    nm_plan_free(p);
    nm_profile dear = make_profile(m, "synthetic", 0, 3.0, 2.0, 8);
    p = make_plan(m, c, &dear, NM_DENSE_BY_PROFILE);
    if (p) {
        CHECK(layer_has_device_group(p, 0)); /* free dispatches: groups on the device */
        check_placement(p, false, 4.0, "expensive device dense graph");
    }
    nm_plan_free(p);
    /* equal costs: the host (the device must be cheaper) */
    nm_profile tie = make_profile(m, "synthetic", 0, 2.0, 2.0, 16);
    p = make_plan(m, c, &tie, NM_DENSE_BY_PROFILE);
    if (p) check_placement(p, false, 2.0, "equal costs");
    nm_plan_free(p);
    /* forced, against the profile */
    p = make_plan(m, c, &dear, NM_DENSE_ON_DEVICE);
    if (p) check_placement(p, true, 6.0, "forced onto the device");
    nm_plan_free(p);
    p = make_plan(m, c, &cheap, NM_DENSE_ON_HOST);
    if (p) check_placement(p, false, 4.0, "forced onto the host");
    nm_plan_free(p);
    /* not measured: the groups decide, and no cost is predicted */
    for (int free_dispatch = 0; free_dispatch <= 1; free_dispatch++) {
        nm_profile none = make_profile(m, "synthetic", free_dispatch ? 0 : 1000, 0, 0, 8);
        p = make_plan(m, c, &none, NM_DENSE_BY_PROFILE);
        if (!p) continue;
        CHECK(p->dense_on_device != NULL);
        for (int32_t l = 0; p->dense_on_device && l < p->moe.n_layer; l++) {
            CHECK_INT_EQ(p->dense_on_device[l], layer_has_device_group(p, l));
            CHECK_INT_EQ(p->dense_on_device[l], free_dispatch);
            CHECK_NEAR(p->layer_cost[l].dense_ms, 0, 0);
        }
        nm_plan_free(p);
    }
    /* names */
    nm_dense_placement d = NM_DENSE_ON_HOST;
    nm_error err = {0};
    for (int i = 0; i < NM_DENSE_PLACEMENT_COUNT; i++) {
        CHECK_INT_EQ(
            nm_dense_placement_parse(nm_dense_placement_name((nm_dense_placement)i), &d, &err),
            NM_OK);
        CHECK_INT_EQ(d, i);
    }
    CHECK(strcmp(nm_dense_placement_name(NM_DENSE_BY_PROFILE), "profile") == 0);
    CHECK_INT_EQ(nm_dense_placement_parse("gpu", &d, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "'gpu'") && strstr(err.msg, "profile, host or device"));
    nm_moe_shape shape;
    nm_model_moe_shape(m, &shape);
    nm_plan_params bad = nm_plan_default_params();
    bad.dense = NM_DENSE_PLACEMENT_COUNT;
    p = NULL;
    CHECK_INT_EQ(nm_plan_make(&shape, c, &cheap, &bad, &p, &err), NM_ERR_INVALID_ARG);
    CHECK(p == NULL && strstr(err.msg, "dense placement"));
}

/* Reads path into memory (NUL-terminated); NULL if it cannot. */
static char *slurp(const char *path) {
    size_t n = 0;
    char *text = (char *)nm_test_read_file(path, &n);
    char *z = text ? realloc(text, n + 1) : NULL;
    if (!z) {
        free(text);
        return NULL;
    }
    z[n] = '\0';
    return z;
}

/* The text with the first `from` replaced by `to` (caller frees). */
static char *edit(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    CHECK(at != NULL);
    if (!at) return NULL;
    const size_t n = strlen(text), nf = strlen(from), nt = strlen(to);
    char *out = malloc(n - nf + nt + 1);
    memcpy(out, text, (size_t)(at - text));
    memcpy(out + (at - text), to, nt);
    memcpy(out + (at - text) + nt, at + nf, n - (size_t)(at - text) - nf + 1);
    return out;
}

/* Removes the member at `at` of a JSON object (up to the comma after its
 * value, with the blanks that follow), in place. */
static void drop_member(char *at) {
    char *end = strchr(at, ',');
    CHECK(end != NULL);
    if (!end) return;
    end++;
    while (*end == ' ' || *end == '\n')
        end++;
    memmove(at, end, strlen(end) + 1);
}

/* Removes every member named key (its value followed by a comma). */
static void drop_key(char *text, const char *key) {
    char *at;
    while ((at = strstr(text, key)) != NULL)
        drop_member(at);
}

static void test_files(const nm_model *m, const nm_calib *c) {
    nm_moe_shape shape;
    nm_model_moe_shape(m, &shape);
    nm_error err = {0};
    /* the profile keeps both times; a file without them is "not measured" */
    nm_profile prof = make_profile(m, "synthetic", 1000, 0.5, 2.0, 16);
    CHECK_INT_EQ(nm_profile_save(&prof, TMP("a.profile.json"), &err), NM_OK);
    nm_profile r;
    CHECK_INT_EQ(nm_profile_load(TMP("a.profile.json"), &r, &err), NM_OK);
    CHECK(r.dense_device_ms == 0.5 && r.dense_host_ms == 2.0);
    nm_profile_free(&r);
    char *text = slurp(TMP("a.profile.json"));
    CHECK(text != NULL);
    if (text) {
        char *old = strdup(text);
        drop_key(old, "\"dense_device_ms\"");
        drop_key(old, "\"dense_host_ms\"");
        CHECK(strstr(old, "dense") == NULL);
        CHECK_INT_EQ(nm_profile_load_memory(old, strlen(old), "old", &r, &err), NM_OK);
        CHECK(r.dense_device_ms == 0 && r.dense_host_ms == 0);
        nm_profile_free(&r);
        free(old);
        /* one side measured, not the other: refused */
        char *half = edit(text, "\"dense_host_ms\": 2", "\"dense_host_ms\": 0");
        if (half) {
            CHECK_INT_EQ(nm_profile_load_memory(half, strlen(half), "half", &r, &err),
                         NM_ERR_FORMAT);
            CHECK(strstr(err.msg, "both measured or neither") != NULL);
        }
        free(half);
        half = edit(text, "\"dense_device_ms\": 0.5", "\"dense_device_ms\": -1");
        if (half) {
            CHECK_INT_EQ(nm_profile_load_memory(half, strlen(half), "neg", &r, &err),
                         NM_ERR_FORMAT);
            CHECK(strstr(err.msg, "dense_device_ms") != NULL);
        }
        free(half);
        free(text);
    }

    /* the plan keeps each layer's choice and cost */
    nm_plan *p = make_plan(m, c, &prof, NM_DENSE_BY_PROFILE);
    if (!p) return;
    CHECK_INT_EQ(nm_plan_save(p, TMP("a.plan.json"), &err), NM_OK);
    nm_plan *q = NULL;
    CHECK_INT_EQ(nm_plan_load(TMP("a.plan.json"), &shape, &q, &err), NM_OK);
    if (q) check_placement(q, true, 0.5, "plan file");
    nm_plan_free(q);
    text = slurp(TMP("a.plan.json"));
    CHECK(text != NULL);
    if (text) {
        /* a plan made before the choice: no "dense", no "dense_ms" */
        char *old = strdup(text);
        drop_key(old, "\"dense\"");
        drop_key(old, "\"dense_ms\"");
        CHECK(strstr(old, "dense") == NULL);
        q = NULL;
        CHECK_INT_EQ(nm_plan_load_memory(old, strlen(old), "old", &shape, &q, &err), NM_OK);
        if (!q) fprintf(stderr, "old plan: %s\n", err.msg);
        if (q) {
            CHECK(q->dense_on_device == NULL);
            CHECK_NEAR(q->layer_cost[0].dense_ms, 0, 0);
            nm_plan_info pi;
            nm_plan_get_info(q, &pi);
            CHECK_INT_EQ(pi.dense_device_layers, -1);
        }
        nm_plan_free(q);
        /* the choice in layer 1 but not layer 0, and a bad value */
        char *part = strdup(text);
        char *first = strstr(part, "\"dense\": ");
        if (first) drop_member(first);
        q = NULL;
        CHECK_INT_EQ(nm_plan_load_memory(part, strlen(part), "part", &shape, &q, &err),
                     NM_ERR_FORMAT);
        CHECK(strstr(err.msg, "layers[1].dense") && strstr(err.msg, "every layer or none"));
        free(part);
        part = edit(text, "\"dense\": \"device\"", "\"dense\": \"npu\"");
        if (part) {
            CHECK_INT_EQ(nm_plan_load_memory(part, strlen(part), "bad", &shape, &q, &err),
                         NM_ERR_FORMAT);
            CHECK(strstr(err.msg, "layers[0].dense") && strstr(err.msg, "\"npu\""));
        }
        free(part);
        /* a layer after the first without it */
        char *last = strdup(text), *at = NULL, *next = last;
        while ((next = strstr(next, "\"dense\": ")) != NULL)
            at = next++;
        if (at) drop_member(at);
        CHECK_INT_EQ(nm_plan_load_memory(last, strlen(last), "last", &shape, &q, &err),
                     NM_ERR_FORMAT);
        CHECK(strstr(err.msg, "missing key 'dense'") != NULL);
        free(last);
        free(old);
        free(text);
    }
    /* the summary says where */
    char *desc = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&desc, &n);
    if (f) {
        nm_plan_describe(p, f);
        fclose(f);
        CHECK(strstr(desc, "dense part: on the device in 3 of 3 layers") != NULL);
        CHECK(strstr(desc, "dense part on the device, 0.5000 ms") != NULL);
        free(desc);
    }
    nm_plan_free(p);
}

/* ---- sessions that follow the plan ---- */

/* The prompt's logits (all rows) and N_DECODE greedy decode steps'. */
static void run(nm_session *s, int32_t n_vocab, float *logits) {
    int32_t ids[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        ids[i] = (i * 37 + 11) % n_vocab;
    nm_error err = {0};
    CHECK_INT_EQ(nm_session_eval(s, ids, N_PROMPT, logits, true, &err), NM_OK);
    float *row = logits + (size_t)(N_PROMPT - 1) * n_vocab;
    for (int i = 0; i < N_DECODE; i++, row += n_vocab) {
        int32_t next = 0;
        for (int32_t v = 1; v < n_vocab; v++)
            if (row[v] > row[next]) next = v;
        CHECK_INT_EQ(nm_session_eval(s, &next, 1, row + n_vocab, false, &err), NM_OK);
    }
}

/* npumoe sessions on dev: every dense part forced onto the device with the
 * groups on the host, and every dense part forced onto the host with the
 * groups on the device; both against dense mode. */
static void test_sessions(nm_device *dev, const nm_model *m, const nm_calib *c, double tol) {
    const int32_t nv = m->hp.n_vocab, n_layer = m->hp.n_layer;
    const int n_rows = N_PROMPT + N_DECODE;
    float *want = malloc((size_t)n_rows * nv * sizeof(float));
    float *got = malloc((size_t)n_rows * nv * sizeof(float));
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 128;
    sp.n_batch = T;
    sp.n_threads = 2;
    nm_session *s = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
    if (s) run(s, nv, want);
    nm_session_free(s);
    const int32_t n_chunks = (N_PROMPT + T - 1) / T;
    for (int dense_on = 0; dense_on <= 1; dense_on++) {
        /* groups on the host: a dispatch of a second; on the device: free */
        nm_profile prof = make_profile(m, dev->ops->name, dense_on ? 1000 : 0, 1, 1, T);
        nm_plan *plan = make_plan(m, c, &prof, dense_on ? NM_DENSE_ON_DEVICE : NM_DENSE_ON_HOST);
        if (!plan) continue;
        int n_device_groups = 0;
        for (int32_t l = 0; l < n_layer; l++)
            n_device_groups += layer_has_device_group(plan, l);
        CHECK_INT_EQ(n_device_groups, dense_on ? 0 : n_layer);
        sp.mode = NM_MODE_NPUMOE;
        sp.plan = plan;
        sp.device = dev;
        nm_device_stats s0, s1;
        dev->ops->stats(dev, &s0);
        s = NULL;
        CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
        if (s) run(s, nv, got);
        /* the metrics: each layer's dispatches and syncs of the static
         * chunks (the decode steps run on the host) */
        nm_session_metrics mt;
        if (s) nm_session_get_metrics(s, &mt);
        CHECK(s && mt.device_layers != NULL);
        uint64_t sum = 0;
        for (int32_t l = 0; s && mt.device_layers && l < n_layer; l++) {
            const nm_device_stats *d = &mt.device_layers[l];
            CHECK_INT_EQ(d->dense_dispatches, dense_on ? n_chunks : 0);
            CHECK_INT_EQ(d->syncs, d->dispatches); /* each graph waited for once */
            CHECK(dense_on ? d->dispatches == (uint64_t)n_chunks
                           : d->dispatches >= (uint64_t)n_chunks);
            sum += d->dispatches;
        }
        if (s) CHECK_INT_EQ(mt.device_total.dispatches, sum);
        nm_session_free(s);
        dev->ops->stats(dev, &s1);
        const uint64_t dense = s1.dense_dispatches - s0.dense_dispatches;
        const uint64_t ffn = s1.dispatches - s0.dispatches - dense;
        const double e = nm_test_rows_rel_err(got, want, n_rows, nv);
        printf("%s: npumoe, dense parts forced onto the %s: %llu dense launches, %llu group "
               "launches; logits vs dense: max rel %.3g\n",
               dev->ops->name, dense_on ? "device" : "host", (unsigned long long)dense,
               (unsigned long long)ffn, e);
        CHECK_INT_EQ(dense, dense_on ? (uint64_t)n_chunks * (uint64_t)n_layer : 0);
        CHECK(dense_on ? ffn == 0 : ffn > 0);
        if (tol == 0.0)
            CHECK(memcmp(got, want, (size_t)n_rows * nv * sizeof(float)) == 0);
        else
            CHECK(e <= tol);
        nm_plan_free(plan);
    }
    free(want);
    free(got);
}

/* nm_profile_measure times the dense part on both sides when the device
 * has the model's form, and on neither when it does not. */
static void test_measure(nm_device *dev, const nm_model *m, const char *what, bool has_form) {
    nm_profile_params pp = nm_profile_default_params();
    const int32_t experts[1] = {1}, caps[1] = {4};
    pp.chunk = T;
    pp.grid_experts = experts;
    pp.n_grid_experts = 1;
    pp.grid_capacity = caps;
    pp.n_grid_capacity = 1;
    pp.reps = 1;
    pp.n_threads = 2;
    nm_profile prof;
    nm_error err = {0};
    CHECK_INT_EQ(nm_profile_measure(m, dev, &pp, &prof, &err), NM_OK);
    printf("%s: profile of the dense part: device %.4f ms, host %.4f ms\n", what,
           prof.dense_device_ms, prof.dense_host_ms);
    if (has_form)
        CHECK(prof.dense_device_ms > 0 && prof.dense_host_ms > 0);
    else
        CHECK(prof.dense_device_ms == 0 && prof.dense_host_ms == 0);
    CHECK_INT_EQ(nm_profile_check(&prof, &err), NM_OK);
    nm_profile_free(&prof);
}

int main(void) {
    nm_model *m = NULL;
    nm_error err = {0};
    nm_model_params mp = nm_model_default_params();
    mp.no_repack = true; /* devices other than cpu read the file's layout */
    CHECK_INT_EQ(nm_model_load(TINY, &mp, &m, &err), NM_OK);
    if (!m) {
        fprintf(stderr, "%s\n", err.msg);
        return nm_test_finish("test_plan_dense");
    }
    nm_calib *c = uniform_calib(m);
    nm_model *q2 = NULL; /* a shared expert */
    CHECK_INT_EQ(nm_model_load(TINY_SHEXP, &mp, &q2, &err), NM_OK);
    nm_calib *c2 = q2 ? uniform_calib(q2) : NULL;
    if (c && c2) {
        test_planner(m, c);
        test_files(m, c);
        static const char *const names[] = {"cpu", "vulkan"};
        for (int d = 0; d < 2; d++) {
            const bool cpu = d == 0;
            if (!cpu) CHECK(nm_kernels_force(nm_kernels_exact()));
            nm_device *dev = NULL;
            const nm_status st =
                nm_device_open(&(nm_device_params){.name = names[d], .n_threads = 2}, &dev, &err);
            if (!cpu && st != NM_OK) {
                printf("vulkan: skipped: %s\n", err.msg);
                CHECK(!getenv("NM_REQUIRE_VULKAN"));
                continue;
            }
            CHECK_INT_EQ(st, NM_OK);
            if (dev) test_sessions(dev, m, c, cpu ? 0.0 : TOL_VK_MODEL);
            if (dev) test_measure(dev, m, names[d], true);
            if (dev) {
                printf("%s, tiny-qwen2moe (the shared expert %s):\n", names[d],
                       dev->ops->dense_features & NM_DENSE_F_SHARED_EXPERT ? "in the dense graphs"
                                                                           : "on the host");
                test_sessions(dev, q2, c2, cpu ? 0.0 : TOL_VK_MODEL);
                test_measure(dev, q2, cpu ? "cpu, tiny-qwen2moe" : "vulkan, tiny-qwen2moe", true);
            }
            /* vulkan lacks llama.cpp's F16 rounding: no dense graph to time */
            nm_model *f16 = NULL;
            mp.compat = NM_COMPAT_LLAMA_CPP;
            if (dev && !cpu) {
                CHECK_INT_EQ(
                    nm_model_load(NM_BUILD_DIR "/models/fixture-f16-e32.gguf", &mp, &f16, &err),
                    NM_OK);
                if (f16) test_measure(dev, f16, "vulkan, f16 with --compat llama.cpp", false);
            }
            mp.compat = NM_COMPAT_NONE;
            nm_model_free(f16);
            nm_device_close(dev);
        }
    }
    nm_calib_free(c);
    nm_calib_free(c2);
    nm_model_free(q2);
    nm_model_free(m);
    return nm_test_finish("test_plan_dense");
}
