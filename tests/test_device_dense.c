/* The cross-device test of graph kind 2, the dense part of a layer
 * (NM_GRAPH_DENSE): for each device that has it and each model (the
 * shipped one, the tiny models of every architecture, an F16 fixture), a
 * layer's graph over three chunks against the host's own layer code
 * (model/layer.c: nm_model_attention and nm_model_route over a KV cache of
 * the test's, and qwen2moe's shared expert from nm_model_ffn_residual on a
 * device that implements it), its K/V handed back and taken from the host,
 * what devices refuse, and sessions of a static mode whose dense parts run
 * on the device (a shared expert in the graph, or, on a device without it,
 * on the host) against dense mode's logits, prefill, decode and prefill
 * again. Every
 * comparison on `cpu` is bit for bit: it calls the same kernels in the same
 * order as the host. */
#include "harness.h"

#include "device/device.h"
#include "engine/engine-impl.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { T = 8, N_CHUNKS = 3, N_POS = 64 };

/* Each device and how far it may be from the host: `cpu` not at all;
 * `vulkan` (lavapipe in CI; skipped where none opens) sums in FP32 in its
 * own order, with the GPU's exp, sin and cos, against the host's exact
 * kernels (FP32 activations: the variants that round them to bfloat16 or
 * int8 are forced off for it): a layer's outputs and K/V (values of order
 * 1) within TOL_VK absolute (measured: up to 2e-5); whole sessions' logits
 * within TOL_VK_MODEL of each row's largest (as test_vulkan's models), since
 * the vulkan FFN graphs add their own rounding. */
#define TOL_VK 1e-4
#define TOL_VK_MODEL 1e-3
/* With an F16 cache both sides round K and V to half, nearest even; FP32
 * differences before the rounding can put a value on either side of a
 * rounding boundary, one half-ulp apart (2^-11 relative, 4.9e-4 for values
 * near 1), so a layer's outputs are held within that (measured: up to
 * 1.03e-4, on the shipped model) */
#define TOL_VK_F16 5e-4
static const struct {
    const char *name;
    double tol;
} devices[] = {{"cpu", 0.0}, {"vulkan", TOL_VK}};
enum { N_DEVICES = sizeof devices / sizeof devices[0] };

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float rng_float(void) {
    return (float)(nm_test_xorshift(&rng) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* Largest |a - b| over n values (0 only when every pair is equal). */
static double max_diff(const float *a, const float *b, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (d > worst || d != d) worst = d != d ? INFINITY : d;
    }
    return worst;
}

/* The host's layer over a chunk, and its cache. */
typedef struct host_layer {
    nm_pool *pool;
    nm_model_batch b;
    nm_kv_view kv;
    float *x, *xn, *q, *att, *proj, *scores, *router, *weights, *probs, *stage, *shexp;
    int32_t *ids;
    void *k, *v;
} host_layer;

static void host_new(host_layer *h, const nm_model *m, nm_kv_type kv_type) {
    const nm_hparams *hp = &m->hp;
    const size_t d = (size_t)hp->n_embd, q_dim = (size_t)hp->n_head * hp->head_dim;
    const size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t elem = kv_type == NM_KV_F16 ? 2 : 4;
    memset(h, 0, sizeof *h);
    nm_error err = {0};
    CHECK_INT_EQ(nm_pool_new(2, &h->pool, &err), NM_OK);
    h->x = calloc(T * d, 4);
    h->xn = calloc(T * d, 4);
    h->q = calloc(T * q_dim, 4);
    h->att = calloc(T * q_dim, 4);
    h->proj = calloc(T * d, 4);
    h->scores = calloc(2 * N_POS, 4);
    h->router = calloc((size_t)T * hp->n_expert, 4);
    h->weights = calloc((size_t)T * hp->n_expert_used, 4);
    h->ids = calloc((size_t)T * hp->n_expert_used, 4);
    h->probs = calloc((size_t)T * hp->n_expert, 4);
    h->stage = calloc(2 * T * kv_dim, 4);
    h->shexp = calloc((size_t)T * (size_t)nm_model_shexp_scratch(hp) + 1, 4);
    h->k = calloc(N_POS * kv_dim, elem);
    h->v = calloc(N_POS * kv_dim, elem);
    h->kv = (nm_kv_view){
        .type = kv_type, .k = h->k, .v = h->v, .stage = kv_type == NM_KV_F16 ? h->stage : NULL};
    h->b = (nm_model_batch){.pool = h->pool,
                            .n_rows = T,
                            .n_real = T,
                            .rope_factors = m->rope_factors_short,
                            .x = h->x,
                            .xn = h->xn,
                            .q = h->q,
                            .att = h->att,
                            .proj = h->proj,
                            .scores = h->scores,
                            .scores_stride = N_POS,
                            .router = h->router,
                            .ids = h->ids,
                            .weights = h->weights,
                            .probs = h->probs,
                            .shexp = h->shexp};
}

static void host_free(host_layer *h) {
    nm_pool_free(h->pool);
    free(h->x), free(h->xn), free(h->q), free(h->att), free(h->proj), free(h->scores);
    free(h->router), free(h->weights), free(h->ids), free(h->probs), free(h->stage);
    free(h->shexp);
    free(h->k), free(h->v);
}

/* A tap that keeps the host's shared expert output ([T][d_model] at ctx). */
static bool keep_shexp(void *ctx, int32_t layer, const char *name, const float *values,
                       int32_t n_rows, int64_t n_cols) {
    (void)layer;
    if (strcmp(name, "ffn_shexp_out") == 0)
        memcpy(ctx, values, (size_t)n_rows * (size_t)n_cols * sizeof(float));
    return true;
}

/* The host's shared expert of the chunk h.b routed last, into out
 * [T][d_model] (nm_model_ffn_residual, its tap; x is left changed). */
static void host_shexp(const nm_model *m, int32_t il, host_layer *h, float *out) {
    memset(h->proj, 0, (size_t)T * (size_t)m->hp.n_embd * sizeof(float));
    h->b.tap = keep_shexp;
    h->b.tap_ctx = out;
    CHECK(nm_model_ffn_residual(m, il, &h->b, NULL));
    h->b.tap = NULL;
}

/* One layer's graph against the host over N_CHUNKS chunks of random
 * residual streams at positions 0, T, 2T; then the K/V read back, and a
 * second graph given the host's K/V of the first two chunks that computes
 * the third alike. tol 0: bit for bit. */
static void check_layer(nm_device *dev, const nm_model *m, int32_t il, nm_kv_type kv_type,
                        double tol, const char *what) {
    const nm_hparams *hp = &m->hp;
    const size_t d = (size_t)hp->n_embd, n_e = (size_t)hp->n_expert;
    const size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t elem = kv_type == NM_KV_F16 ? 2 : 4;
    nm_dense_spec spec = nm_engine_dense_spec(m, il, T, N_POS, kv_type, m->rope_factors_short);
    /* as the engine: a shared expert the device does not implement stays
     * on the host, the rest of the layer goes to the device */
    nm_device_fit_dense(dev, &spec);
    const bool shexp = spec.n_ff_shexp > 0;
    CHECK_INT_EQ(shexp, m->layers[il].shexp_gate.data != NULL && m->compat != NM_COMPAT_LLAMA_CPP &&
                            (dev->ops->dense_features & NM_DENSE_F_SHARED_EXPERT) != 0);
    nm_error err = {0};
    if (nm_device_check_dense(dev, &spec, &err) != NM_OK) {
        printf("%s: layer %d, kv %s: %s\n", what, il, kv_type == NM_KV_F16 ? "f16" : "f32",
               err.msg);
        /* the reference device runs every form; another says which it lacks */
        CHECK(tol > 0.0 && strstr(err.msg, "does not implement") != NULL);
        return;
    }
    host_layer h;
    host_new(&h, m, kv_type);
    nm_graph *g = NULL, *g2 = NULL;
    CHECK_INT_EQ(dev->ops->compile_dense(dev, &spec, &g, &err), NM_OK);
    CHECK_INT_EQ(dev->ops->compile_dense(dev, &spec, &g2, &err), NM_OK);
    if (!g || !g2) {
        printf("%s: %s\n", what, err.msg);
        host_free(&h);
        return;
    }
    float *in = malloc(N_CHUNKS * T * d * 4);
    float *want_x = malloc(T * d * 4), *want_xn = malloc(T * d * 4), *want_r = malloc(T * n_e * 4);
    float *want_s = malloc(T * d * 4); /* the host's shared expert */
    for (size_t i = 0; i < N_CHUNKS * T * d; i++)
        in[i] = rng_float();
    /* xn leaves the host's nm_model_route rounded as the experts' input */
    const bool round_xn =
        m->compat == NM_COMPAT_LLAMA_CPP && m->layers[il].experts.gate.type == NM_DTYPE_F16;
    double worst = 0.0;
    for (int c = 0; c < N_CHUNKS; c++) {
        const float *xc = in + (size_t)c * T * d;
        memcpy(h.x, xc, T * d * 4);
        h.b.n_past = c * T;
        CHECK(nm_model_attention(m, il, &h.b, &h.kv) && nm_model_route(m, il, &h.b));
        memcpy(dev->ops->input(g), xc, T * d * 4);
        dev->ops->submit_dense(g, c * T);
        dev->ops->wait(g);
        nm_dense_outputs o;
        dev->ops->dense_outputs(g, &o);
        float *xn = malloc(T * d * 4);
        memcpy(xn, o.xn, T * d * 4);
        if (round_xn) nm_model_round_f16(xn, (int64_t)(T * d));
        const double ex = max_diff(o.x, h.x, T * d), exn = max_diff(xn, h.xn, T * d);
        const double er = max_diff(o.logits, h.router, T * n_e);
        free(xn);
        if (ex > worst) worst = ex;
        if (exn > worst) worst = exn;
        if (er > worst) worst = er;
        if (c == N_CHUNKS - 1) {
            memcpy(want_x, h.x, T * d * 4);
            memcpy(want_xn, h.xn, T * d * 4);
            memcpy(want_r, h.router, T * n_e * 4);
        }
        CHECK(shexp == (o.shexp != NULL));
        if (shexp) {
            host_shexp(m, il, &h, want_s);
            const double es = max_diff(o.shexp, want_s, T * d);
            if (es > worst) worst = es;
        }
    }
    /* the K/V of every chunk, as the host's cache holds them */
    const size_t kv_bytes = N_CHUNKS * T * kv_dim * elem;
    void *k = malloc(kv_bytes), *v = malloc(kv_bytes);
    dev->ops->kv_read(g, 0, N_CHUNKS * T, k, v);
    const bool kv_same = memcmp(k, h.k, kv_bytes) == 0 && memcmp(v, h.v, kv_bytes) == 0;
    if (kv_type == NM_KV_F32) {
        const size_t n_kv = N_CHUNKS * T * kv_dim;
        const double ek = max_diff(k, h.k, n_kv), ev = max_diff(v, h.v, n_kv);
        if (ek > worst) worst = ek;
        if (ev > worst) worst = ev;
    }
    /* the host's K/V of two chunks into a fresh graph, then the third */
    dev->ops->kv_write(g2, 0, 2 * T, h.k, h.v);
    memcpy(dev->ops->input(g2), in + 2 * (size_t)T * d, T * d * 4);
    dev->ops->submit_dense(g2, 2 * T);
    dev->ops->wait(g2);
    nm_dense_outputs o2;
    dev->ops->dense_outputs(g2, &o2);
    double e2 = max_diff(o2.x, want_x, T * d);
    const double e2r = max_diff(o2.logits, want_r, T * n_e);
    if (e2r > e2) e2 = e2r;
    if (!round_xn) {
        const double e2n = max_diff(o2.xn, want_xn, T * d);
        if (e2n > e2) e2 = e2n;
    }
    if (shexp) {
        const double e2s = max_diff(o2.shexp, want_s, T * d);
        if (e2s > e2) e2 = e2s;
    }
    printf("%s: layer %d, kv %s%s: max |device - host| %.3g over %d chunks, K/V %s, from the "
           "host's K/V %.3g\n",
           what, il, kv_type == NM_KV_F16 ? "f16" : "f32", shexp ? ", shared expert" : "", worst,
           N_CHUNKS, kv_same ? "equal" : "differ", e2);
    const double t = tol > 0.0 && kv_type == NM_KV_F16 ? TOL_VK_F16 : tol;
    CHECK(worst <= t);
    CHECK(e2 <= t);
    if (tol == 0.0) CHECK(kv_same);
    free(k), free(v), free(in), free(want_x), free(want_xn), free(want_r), free(want_s);
    dev->ops->graph_free(g);
    dev->ops->graph_free(g2);
    host_free(&h);
}

/* What every device refuses: bad shapes (nm_dense_spec_check, a device's
 * compile), and what a device lacks (nm_device_check_dense). */
static void check_refusals(nm_device *dev, const nm_model *m) {
    const nm_dense_spec good = nm_engine_dense_spec(m, 0, T, N_POS, NM_KV_F32, NULL);
    nm_error err = {0};
    nm_graph *g = (nm_graph *)&err; /* must come back NULL */
    nm_device_stats s0, s1;
    dev->ops->stats(dev, &s0);
    nm_dense_spec bad = good;
    bad.rows = 0;
    CHECK_INT_EQ(dev->ops->compile_dense(dev, &bad, &g, &err), NM_ERR_INVALID_ARG);
    CHECK(g == NULL);
    CHECK(strstr(err.msg, "0 rows over 64 positions") != NULL);
    bad = good;
    bad.n_pos = T - 1;
    CHECK_INT_EQ(nm_dense_spec_check(&bad, &err), NM_ERR_INVALID_ARG);
    bad = good;
    bad.n_head_kv = bad.n_head + 1;
    CHECK_INT_EQ(nm_dense_spec_check(&bad, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "kv heads dividing heads") != NULL);
    bad = good;
    bad.wk.n += 1;
    CHECK_INT_EQ(nm_dense_spec_check(&bad, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "k weights are") != NULL);
    bad = good;
    bad.n_rot = 3;
    CHECK_INT_EQ(nm_dense_spec_check(&bad, &err), NM_ERR_INVALID_ARG);
    bad = good;
    bad.ffn_norm = NULL;
    CHECK_INT_EQ(nm_dense_spec_check(&bad, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "norm's weights are missing") != NULL);
    dev->ops->stats(dev, &s1);
    CHECK_INT_EQ(s1.graphs_compiled, s0.graphs_compiled);
    CHECK_INT_EQ(s1.device_bytes, s0.device_bytes);

    /* a device without a feature the layer asks for, one without the graph
     * kind, and a weight type it does not compute */
    nm_device_ops ops = *dev->ops;
    nm_device lacking = {.ops = &ops, .ctx = dev->ctx};
    CHECK_INT_EQ(nm_device_check_dense(&lacking, &good, &err), NM_OK);
    bad = good;
    bad.qk_norm = NM_DENSE_QK_HEAD;
    bad.kv_type = NM_KV_F16;
    ops.dense_features = ~(uint32_t)NM_DENSE_F_KV_F16;
    CHECK_INT_EQ(nm_device_check_dense(&lacking, &bad, &err), NM_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "does not implement f16 kv cache in dense-part graphs (layer 0)") !=
          NULL);
    ops.dense_features = 0;
    CHECK_INT_EQ(nm_device_check_dense(&lacking, &bad, &err), NM_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "per-head q/k norm") != NULL);
    /* a shared expert (shapes only: never compiled here) of width n_expert */
    nm_dense_spec with = good;
    with.n_ff_shexp = good.n_expert;
    with.shexp_gate = with.shexp_up = with.shexp_gate_inp = good.router;
    with.shexp_gate_inp.n = 1;
    with.shexp_down = good.router;
    with.shexp_down.n = good.d_model;
    with.shexp_down.k = good.n_expert;
    CHECK_INT_EQ(nm_dense_spec_check(&with, &err), NM_OK);
    CHECK((nm_dense_spec_features(&with) ^ nm_dense_spec_features(&good)) ==
          NM_DENSE_F_SHARED_EXPERT);
    bad = with;
    bad.shexp_down.k += 1;
    CHECK_INT_EQ(nm_dense_spec_check(&bad, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "shared expert down weights are") != NULL);
    bad = with;
    bad.shexp_gate_inp.n = 2;
    CHECK_INT_EQ(nm_dense_spec_check(&bad, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "shared expert gate input weights are [2]") != NULL);
    bad = with;
    bad.round_f16 = true;
    CHECK_INT_EQ(nm_dense_spec_check(&bad, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "with f16 matmul inputs") != NULL);
    /* an optional block: a device without it refuses a spec that has it,
     * and nm_device_fit_dense leaves it to the host, the rest to the device */
    ops.dense_features = ~(uint32_t)NM_DENSE_F_SHARED_EXPERT;
    CHECK_INT_EQ(nm_device_check_dense(&lacking, &with, &err), NM_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "does not implement shared expert in dense-part graphs") != NULL);
    nm_dense_spec fit = with;
    nm_device_fit_dense(&lacking, &fit);
    CHECK(fit.n_ff_shexp == 0 && !fit.shexp_gate.data && !fit.shexp_gate_inp.data);
    CHECK_INT_EQ(nm_device_check_dense(&lacking, &fit, &err), NM_OK);
    CHECK_INT_EQ(nm_dense_spec_check(&fit, &err), NM_OK);
    ops.dense_features = dev->ops->dense_features | NM_DENSE_F_SHARED_EXPERT;
    fit = with;
    nm_device_fit_dense(&lacking, &fit);
    CHECK(fit.n_ff_shexp == with.n_ff_shexp && fit.shexp_down.data == with.shexp_down.data);
    CHECK_INT_EQ(nm_device_check_dense(&lacking, &fit, &err), NM_OK);
    bad = with;
    bad.shexp_up.type = NM_DTYPE_Q2_K;
    CHECK_INT_EQ(nm_device_check_dense(&lacking, &bad, &err), NM_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "q2_K weights (the shared expert up projection of layer 0)") != NULL);
    ops.compile_dense = NULL;
    CHECK_INT_EQ(nm_device_check_dense(&lacking, &good, &err), NM_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "has no dense-part graphs") != NULL);
    bad = good;
    bad.wv.type = NM_DTYPE_Q2_K;
    CHECK_INT_EQ(nm_device_check_dense(dev, &bad, &err), NM_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "q2_K weights (the v projection of layer 0)") != NULL);
    printf("%s: refusals checked\n", dev->ops->name);
}

/* A device whose memory budget cannot hold a layer's dense graph refuses
 * it with the numbers and holds nothing after. */
static void check_budget(const char *name, nm_model *m) {
    nm_device *dev = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(
        nm_device_open(&(nm_device_params){.name = name, .memory_budget_bytes = 4096}, &dev, &err),
        NM_OK);
    if (!dev) return;
    const nm_dense_spec spec = nm_engine_dense_spec(m, 0, T, N_POS, NM_KV_F32, NULL);
    nm_graph *g = NULL;
    CHECK_INT_EQ(dev->ops->compile_dense(dev, &spec, &g, &err), NM_ERR_CAPACITY);
    CHECK(g == NULL && strstr(err.msg, "budget of 4096 bytes") != NULL);
    printf("%s, budget 4096: %s\n", name, err.msg);
    nm_device_stats s;
    dev->ops->stats(dev, &s);
    CHECK_INT_EQ(s.device_bytes, 0);
    nm_device_close(dev);
}

/* Tokens [0, n) of a deterministic prompt within the vocabulary. */
static void make_ids(int32_t *ids, int n, int32_t n_vocab) {
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % n_vocab);
}

enum { N_FIRST = 20, N_SECOND = 12, N_ROWS = N_FIRST + 3 + N_SECOND + 2 };

/* Prefill N_FIRST tokens (chunks of T: the last padded), 3 decode steps,
 * prefill N_SECOND more, 2 decode steps; every row's logits into out
 * [N_ROWS][n_vocab]. The second prefill starts where the host decoded, so
 * the device takes those positions' K/V from the host. */
/* One decode step of s: nm_session_eval, or, with a batch, nm_batch_decode
 * (the serving path, which must first bring the prompt's K/V home from the
 * device's dense graphs). */
static nm_status decode(nm_session *s, int32_t id, float *row, nm_batch *batch) {
    nm_error err = {0};
    const nm_status st = batch ? nm_batch_decode(batch, &s, &id, 1, row, &err)
                               : nm_session_eval(s, &id, 1, row, false, &err);
    if (st != NM_OK) printf("decode: %s\n", err.msg);
    return st;
}

static void run_sequence(nm_session *s, int32_t n_vocab, float *out, nm_batch *batch) {
    int32_t ids[N_FIRST + N_SECOND];
    make_ids(ids, N_FIRST + N_SECOND, n_vocab);
    nm_error err = {0};
    float *row = out;
    CHECK_INT_EQ(nm_session_eval(s, ids, N_FIRST, row, true, &err), NM_OK);
    row += (size_t)N_FIRST * n_vocab;
    for (int i = 0; i < 3; i++, row += n_vocab) {
        int32_t next = nm_argmax(row - n_vocab, n_vocab);
        CHECK_INT_EQ(decode(s, next, row, batch), NM_OK);
    }
    CHECK_INT_EQ(nm_session_eval(s, ids + N_FIRST, N_SECOND, row, true, &err), NM_OK);
    row += (size_t)N_SECOND * n_vocab;
    for (int i = 0; i < 2; i++, row += n_vocab) {
        int32_t next = nm_argmax(row - n_vocab, n_vocab);
        CHECK_INT_EQ(decode(s, next, row, batch), NM_OK);
    }
}

/* A plan of one group per layer holding every expert at capacity T (no
 * drop), on the device except layer 0's when host0. */
typedef struct one_group_plan {
    nm_plan plan;
    nm_moe_layer_plan *layers;
    nm_moe_group *groups;
    int32_t *experts;
} one_group_plan;

static void plan_new(one_group_plan *p, const nm_model *m, const char *device, bool host0) {
    const int32_t n_layer = m->hp.n_layer, n_expert = m->hp.n_expert;
    memset(p, 0, sizeof *p);
    p->layers = calloc((size_t)n_layer, sizeof *p->layers);
    p->groups = calloc((size_t)n_layer, sizeof *p->groups);
    p->experts = calloc((size_t)n_expert, sizeof *p->experts);
    for (int32_t e = 0; e < n_expert; e++)
        p->experts[e] = e;
    for (int32_t l = 0; l < n_layer; l++) {
        p->groups[l] = (nm_moe_group){.capacity = T,
                                      .n_experts = n_expert,
                                      .experts = p->experts,
                                      .on_device = !(host0 && l == 0)};
        p->layers[l] = (nm_moe_layer_plan){.n_groups = 1, .groups = &p->groups[l]};
    }
    snprintf(p->plan.device, sizeof p->plan.device, "%s", device);
    p->plan.moe = (nm_moe_plan){.chunk = T,
                                .n_layer = n_layer,
                                .n_expert = n_expert,
                                .overflow = NM_OVERFLOW_DROP,
                                .salience = NM_SALIENCE_ROUTER,
                                .layers = p->layers};
}

static void plan_free(one_group_plan *p) { free(p->layers), free(p->groups), free(p->experts); }

/* Sessions of a static mode with every capacity at T on dev against dense
 * mode, with kv_type's cache: `grouped` (every layer's dense part on the
 * device) and `npumoe` with layer 0's experts on the host (its dense part
 * too); for a model with a shared expert, `grouped` again on dev as a
 * device without NM_DENSE_F_SHARED_EXPERT: the same launches, the shared
 * expert on the host, and less memory on the device when dev has it. */
static void check_sessions(nm_device *dev, nm_model *m, nm_kv_type kv_type, double tol,
                           const char *what) {
    const int32_t nv = m->hp.n_vocab, n_layer = m->hp.n_layer;
    float *want = malloc((size_t)N_ROWS * nv * 4), *got = malloc((size_t)N_ROWS * nv * 4);
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 128;
    sp.n_batch = T;
    sp.n_threads = 2;
    sp.kv_type = kv_type;
    nm_session *s = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
    if (s) run_sequence(s, nv, want, NULL);
    nm_session_free(s);

    const bool has_shexp = m->hp.n_ff_shexp > 0 && m->compat != NM_COMPAT_LLAMA_CPP;
    nm_device_ops lacking_ops = *dev->ops;
    lacking_ops.dense_features &= ~(uint32_t)NM_DENSE_F_SHARED_EXPERT;
    nm_device lacking = {.ops = &lacking_ops, .ctx = dev->ctx};
    uint64_t held[3] = {0}; /* device bytes of each session */
    for (int variant = 0; variant < (has_shexp ? 3 : 2); variant++) {
        const int host0 = variant == 1;
        nm_device *on = variant == 2 ? &lacking : dev;
        one_group_plan plan;
        plan_new(&plan, m, dev->ops->name, host0);
        sp.mode = host0 ? NM_MODE_NPUMOE : NM_MODE_GROUPED;
        sp.plan = &plan.plan;
        sp.device = on;
        s = NULL;
        nm_device_stats s0, s1;
        dev->ops->stats(dev, &s0);
        CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
        if (!s) {
            printf("%s: %s\n", what, err.msg);
            plan_free(&plan);
            continue;
        }
        dev->ops->stats(dev, &s1);
        held[variant] = s1.device_bytes - s0.device_bytes;
        run_sequence(s, nv, got, NULL);
        dev->ops->stats(dev, &s1);
        /* the layers run their dense part on the device when it has their
         * form, a shared expert or not */
        nm_dense_spec spec0 = nm_engine_dense_spec(m, 0, T, 128, kv_type, NULL);
        nm_device_fit_dense(on, &spec0);
        const bool on_device = nm_device_check_dense(on, &spec0, &err) == NM_OK;
        const double e = tol == 0.0 ? max_diff(got, want, (size_t)N_ROWS * nv)
                                    : nm_test_rows_rel_err(got, want, N_ROWS, nv);
        /* 3 + 2 chunks, each device layer's dense part one launch */
        const uint64_t launches = s1.dense_dispatches - s0.dense_dispatches;
        printf("%s, kv %s: %s on %s%s vs dense, %d rows of logits: max %s %.3g; %llu dense "
               "launches, %llu device bytes\n",
               what, kv_type == NM_KV_F16 ? "f16" : "f32", nm_mode_name(sp.mode), dev->ops->name,
               variant == 2 ? " without the shared expert" : "", N_ROWS,
               tol == 0.0 ? "diff" : "rel", e, (unsigned long long)launches,
               (unsigned long long)held[variant]);
        CHECK(e <= (tol == 0.0 ? 0.0 : TOL_VK_MODEL));
        CHECK_INT_EQ(launches, on_device ? (uint64_t)5 * (uint64_t)(n_layer - host0) : 0);
        nm_session_free(s);
        /* the decode steps as a server takes them (nm_batch_decode): the same */
        nm_batch *batch = NULL;
        CHECK_INT_EQ(nm_batch_new(m, 1, sp.n_ctx, 2, &batch, &err), NM_OK);
        s = NULL;
        CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
        if (s && batch) {
            run_sequence(s, nv, got, batch);
            const double eb = tol == 0.0 ? max_diff(got, want, (size_t)N_ROWS * nv)
                                         : nm_test_rows_rel_err(got, want, N_ROWS, nv);
            printf("%s, kv %s: %s on %s, decode steps by nm_batch_decode, vs dense: max %s "
                   "%.3g\n",
                   what, kv_type == NM_KV_F16 ? "f16" : "f32", nm_mode_name(sp.mode),
                   dev->ops->name, tol == 0.0 ? "diff" : "rel", eb);
            CHECK(eb <= (tol == 0.0 ? 0.0 : TOL_VK_MODEL));
        }
        nm_batch_free(batch);
        nm_session_free(s);
        dev->ops->stats(dev, &s1);
        CHECK_INT_EQ(s1.device_bytes, s0.device_bytes);
        plan_free(&plan);
    }
    /* the graphs with the shared expert hold its buffers (and weights) */
    if (has_shexp && (dev->ops->dense_features & NM_DENSE_F_SHARED_EXPERT))
        CHECK(held[0] > held[2]);
    else if (has_shexp)
        CHECK_INT_EQ(held[0], held[2]);
    free(want), free(got);
}

static void check_model(nm_device *dev, int n_threads, const char *path, nm_compat compat,
                        double tol) {
    nm_model_params mp = nm_model_default_params();
    mp.compat = compat;
    mp.no_repack = true; /* devices other than cpu read the file's layout */
    nm_model *m = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_model_load(path, &mp, &m, &err), NM_OK);
    if (!m) {
        printf("%s: %s\n", path, err.msg);
        return;
    }
    /* the folder of a vectors model, else the file */
    const char *name =
        strstr(path, "/vectors/") ? strstr(path, "/vectors/") + 9 : strrchr(path, '/') + 1;
    char what[256];
    snprintf(what, sizeof what, "%s/%d %.*s%s", dev->ops->name, n_threads,
             (int)strcspn(name, strstr(path, "/vectors/") ? "/" : ""), name,
             compat == NM_COMPAT_LLAMA_CPP ? " (llama.cpp)" : "");
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        check_layer(dev, m, il, NM_KV_F32, tol, what);
        check_layer(dev, m, il, NM_KV_F16, tol, what);
    }
    check_sessions(dev, m, NM_KV_F32, tol, what);
    check_sessions(dev, m, NM_KV_F16, tol, what);
    nm_model_free(m);
}

int main(void) {
    static const struct {
        const char *path;
        nm_compat compat;
    } models[] = {
        {NM_SOURCE_DIR "/models/npumoe-tiny-moe.gguf", NM_COMPAT_NONE},
        {NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf", NM_COMPAT_NONE},
        {NM_VECTORS_DIR "/tiny-olmoe/model.gguf", NM_COMPAT_NONE},
        {NM_VECTORS_DIR "/tiny-mixtral/model.gguf", NM_COMPAT_LLAMA_CPP},
        {NM_VECTORS_DIR "/tiny-mixtral/model.gguf", NM_COMPAT_NONE},
        {NM_VECTORS_DIR "/tiny-phimoe/model.gguf", NM_COMPAT_NONE},
        {NM_VECTORS_DIR "/tiny-phimoe/model.gguf", NM_COMPAT_LLAMA_CPP},
        {NM_BUILD_DIR "/models/fixture-f16-e32.gguf", NM_COMPAT_LLAMA_CPP},
        {NM_BUILD_DIR "/models/fixture-bf16-tied.gguf", NM_COMPAT_NONE},
        {NM_VECTORS_DIR "/tiny-qwen3moe-q-Q4_K_M/model.gguf", NM_COMPAT_NONE},
        {NM_SOURCE_DIR "/tests/vectors/tiny-qwen2moe/model.gguf", NM_COMPAT_NONE},
        {NM_SOURCE_DIR "/tests/vectors/tiny-qwen2moe/model.gguf", NM_COMPAT_LLAMA_CPP},
    };
    for (int d = 0; d < N_DEVICES; d++) {
        const bool cpu = strcmp(devices[d].name, "cpu") == 0;
        for (int n_threads = 1; n_threads <= (cpu ? 3 : 1); n_threads += 2) {
            nm_device *dev = NULL;
            nm_error err = {0};
            if (!cpu) CHECK(nm_kernels_force(nm_kernels_exact()));
            const nm_status st = nm_device_open(
                &(nm_device_params){.name = devices[d].name, .n_threads = n_threads}, &dev, &err);
            if (!cpu && st != NM_OK) {
                /* no driver here: skipped, unless required (tools/test.sh) */
                printf("%s: skipped: %s\n", devices[d].name, err.msg);
                CHECK(!getenv("NM_REQUIRE_VULKAN"));
                continue;
            }
            CHECK_INT_EQ(st, NM_OK);
            if (!dev) continue;
            /* every device runs the dense part over an F16 cache */
            CHECK((dev->ops->dense_features & NM_DENSE_F_KV_F16) != 0);
            for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
                check_model(dev, n_threads, models[i].path, models[i].compat, devices[d].tol);
            nm_model *m = NULL;
            nm_model_params mp = nm_model_default_params();
            mp.no_repack = true;
            CHECK_INT_EQ(nm_model_load(models[0].path, &mp, &m, &err), NM_OK);
            if (m) check_refusals(dev, m);
            if (m && !cpu) check_budget(devices[d].name, m);
            nm_model_free(m);
            nm_device_stats s;
            dev->ops->stats(dev, &s);
            CHECK_INT_EQ(s.device_bytes, 0);
            nm_device_close(dev);
        }
    }
    return nm_test_finish("test_device_dense");
}
