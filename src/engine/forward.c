/* The runtime of a session: the KV cache (F32, or F16 to halve it), the
 * work buffers, the thread pool and the MoE executors (dense, and the
 * static mode's with its plan and device), sized once in
 * nm_engine_state_new; and the batch loop: a batch goes through every layer
 * at once, the model's blocks (model/layer.c) around the executor's
 * experts. nm_engine_forward does not allocate. */
#include "engine-impl.h"

#include "base/base.h"

#include <string.h>

struct nm_engine_state {
    int32_t n_ctx;
    int32_t n_batch;
    int32_t n_kv; /* cache positions: n_ctx + room for a padded chunk */
    nm_pool *pool;
    size_t n_bytes;
    nm_kv_type kv_type;
    void *k_cache;                     /* [n_layer][n_kv][nm_model_kv_k_dim] of kv_type */
    void *v_cache;                     /* [n_layer][n_kv][nm_model_kv_v_dim]; NULL: none (MLA) */
    float *kv_stage;                   /* [2][n_batch][nm_model_kv_k_dim] F16 cache: new K, V */
    float *x;                          /* [n_batch][n_embd] residual stream       */
    float *xn;                         /* [n_batch][n_embd] normed input of a block */
    float *q;                          /* [n_batch][nm_model_q_width]             */
    float *att;                        /* [n_batch][nm_model_q_width]             */
    float *proj;                       /* [n_batch][n_embd] block output          */
    float *scores;                     /* [n_threads][n_kv] attention scratch     */
    float *router;                     /* [n_batch][n_expert] router logits       */
    float *probs;                      /* [n_batch][n_expert] routing scratch     */
    float *shexp;                      /* [n_batch][..] shared expert, or NULL    */
    int32_t *ids;                      /* [n_batch][k] chosen experts             */
    float *weights;                    /* [n_batch][k] their weights              */
    const nm_expert_weights **experts; /* [n_moe_layers] the MoE layers' expert stacks */
    nm_moe_exec *dense;                /* host MoE: decode, and every batch in dense mode */
    nm_moe_exec *prefill;              /* the static mode's executor, NULL in dense mode  */
    /* The static mode's dense graphs on its device (NULL in dense mode), and
     * how far each copy of those layers' K/V is valid: positions below
     * kv_host_n in the host's cache, below kv_dev_n in the graphs. A batch
     * first brings its side's copy up to n_past from the other. */
    nm_engine_dense *dense_dev;
    int32_t kv_host_n, kv_dev_n;
    nm_device *device;          /* the static mode's, or NULL */
    nm_device_stats *dev_layer; /* [MoE layers] the device's work inside each layer's step of
                                   static chunks, since creation or the last reset */
    const float *rope_factors;  /* [n_rot / 2] the model's short or long ones, or NULL */
    nm_tap_fn tap;              /* the session's tap, NULL: none */
    void *tap_ctx;
    const char *stop_name; /* the tensor whose tap asked to stop the batch, or NULL */
    int32_t stop_layer;
};

static void *alloc_bytes(nm_engine_state *st, size_t n, size_t size, bool *ok) {
    size_t bytes;
    if (!nm_mul_size(n, size, &bytes)) {
        *ok = false;
        return NULL;
    }
    void *p = nm_calloc(1, bytes);
    if (!p) *ok = false;
    st->n_bytes += bytes;
    return p;
}

static float *alloc_floats(nm_engine_state *st, size_t n, bool *ok) {
    return alloc_bytes(st, n, sizeof(float), ok);
}

nm_status nm_engine_state_new(const nm_model *m, const nm_state_params *p, nm_engine_state **out,
                              nm_error *err) {
    *out = NULL;
    const nm_hparams *hp = &m->hp;
    int32_t n_ctx = p->n_ctx, n_batch = p->n_batch;
    const int n_threads = p->n_threads;
    if (n_ctx < 1)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "context size %d must be at least 1", n_ctx);
    if (n_batch < 1)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "batch size %d must be at least 1", n_batch);
    /* a batch never holds more than the context, but a static chunk keeps its
     * shape: the cache has room for the padding of a last chunk */
    if (p->mode == NM_MODE_DENSE && n_batch > n_ctx) n_batch = n_ctx;
    nm_engine_state *st = nm_calloc(1, sizeof *st);
    if (!st) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a session");
    st->n_ctx = n_ctx;
    st->n_batch = n_batch;
    st->n_kv = n_ctx + (p->mode == NM_MODE_DENSE ? 0 : n_batch - 1);
    st->kv_type = p->kv_type;
    nm_status s = nm_pool_new(n_threads, &st->pool, err);
    if (s != NM_OK) {
        nm_free(st);
        return s;
    }
    const size_t kv_dim = (size_t)nm_model_kv_k_dim(hp), v_dim = (size_t)nm_model_kv_v_dim(hp);
    const size_t q_dim = (size_t)nm_model_q_width(hp);
    const size_t nb = (size_t)n_batch, d = (size_t)hp->n_embd, k = (size_t)hp->n_expert_used;
    bool ok = true;
    const size_t n_cache = (size_t)hp->n_layer * (size_t)st->n_kv * kv_dim;
    const bool f16 = p->kv_type == NM_KV_F16;
    const size_t elem = f16 ? sizeof(uint16_t) : sizeof(float);
    st->k_cache = alloc_bytes(st, n_cache, elem, &ok);
    if (v_dim > 0) st->v_cache = alloc_bytes(st, (size_t)hp->n_layer * st->n_kv * v_dim, elem, &ok);
    if (f16) st->kv_stage = alloc_floats(st, 2 * nb * kv_dim, &ok);
    st->x = alloc_floats(st, nb * d, &ok);
    st->xn = alloc_floats(st, nb * d, &ok);
    st->q = alloc_floats(st, nb * q_dim, &ok);
    st->att = alloc_floats(st, nb * q_dim, &ok);
    st->proj = alloc_floats(st, nb * d, &ok);
    st->scores = alloc_floats(st, (size_t)n_threads * (size_t)st->n_kv, &ok);
    st->router = alloc_floats(st, nb * (size_t)hp->n_expert, &ok);
    st->probs = alloc_floats(st, nb * (size_t)hp->n_expert, &ok);
    st->weights = alloc_floats(st, nb * k, &ok);
    if (nm_model_shexp_scratch(hp) > 0) /* nm_model_batch.shexp */
        st->shexp = alloc_floats(st, nb * (size_t)nm_model_shexp_scratch(hp), &ok);
    st->ids = nm_calloc(nb * k, sizeof(int32_t));
    const int32_t n_moe = nm_model_n_moe_layers(hp);
    st->device = p->mode == NM_MODE_DENSE ? NULL : p->device;
    if (st->device) {
        st->dev_layer = nm_calloc((size_t)n_moe, sizeof *st->dev_layer);
        if (!st->dev_layer) ok = false;
    }
    st->experts = nm_calloc((size_t)n_moe, sizeof *st->experts);
    if (!st->ids || !st->experts) ok = false;
    if (!ok) {
        nm_engine_state_free(st);
        return nm_errorf(
            err, NM_ERR_NOMEM,
            "out of memory for a session of %d positions (KV cache %.1f MiB in %s)", n_ctx,
            (double)hp->n_layer * n_ctx * (kv_dim + v_dim) * (f16 ? 2.0 : 4.0) / 1048576.0,
            f16 ? "f16" : "f32");
    }
    for (int32_t l = 0; l < n_moe; l++)
        st->experts[l] = nm_model_moe_experts(m, l);
    /* llama.cpp and LongRoPE both take the long factors past the original
     * context; a session decides once by its size, as llama.cpp does. */
    st->rope_factors = n_ctx > hp->n_ctx_orig ? m->rope_factors_long : m->rope_factors_short;
    nm_moe_exec_params ep = {.mode = NM_MODE_DENSE,
                             .chunk = n_batch,
                             .n_layer = n_moe,
                             .weights = st->experts,
                             .k = hp->n_expert_used,
                             .n_threads = n_threads};
    s = nm_moe_exec_new(&ep, &st->dense, err);
    if (s == NM_OK && p->mode != NM_MODE_DENSE) {
        ep.mode = p->mode;
        ep.plan = p->plan;
        ep.device = p->device;
        s = nm_moe_exec_new(&ep, &st->prefill, err);
        bool *want = s == NM_OK ? nm_malloc((size_t)hp->n_layer * sizeof *want) : NULL;
        if (s == NM_OK && !want) s = nm_errorf(err, NM_ERR_NOMEM, "out of memory for a session");
        for (int32_t il = 0; want && il < hp->n_layer; il++) {
            /* the plan's and the executor's layers are the MoE layers */
            const int32_t ml = nm_model_moe_index(hp, il);
            want[il] =
                nm_model_layer_is_moe(hp, il) && (p->mode == NM_MODE_NPUMOE && p->dense_on_device
                                                      ? p->dense_on_device[ml]
                                                      : nm_moe_exec_uses_device(st->prefill, ml));
        }
        if (s == NM_OK)
            s = nm_engine_dense_new(m, p->device, want, n_batch, st->n_kv, p->kv_type,
                                    st->rope_factors, &st->dense_dev, err);
        nm_free(want);
    }
    if (s != NM_OK) {
        nm_engine_state_free(st);
        return s;
    }
    *out = st;
    return NM_OK;
}

void nm_engine_state_free(nm_engine_state *st) {
    if (!st) return;
    nm_pool_free(st->pool);
    nm_free(st->k_cache);
    nm_free(st->v_cache);
    nm_free(st->kv_stage);
    nm_free(st->x);
    nm_free(st->xn);
    nm_free(st->q);
    nm_free(st->att);
    nm_free(st->proj);
    nm_free(st->scores);
    nm_free(st->router);
    nm_free(st->probs);
    nm_free(st->shexp);
    nm_free(st->ids);
    nm_free(st->weights);
    nm_free(st->dev_layer);
    nm_engine_dense_free(st->dense_dev);
    nm_moe_exec_free(st->prefill);
    nm_moe_exec_free(st->dense);
    nm_free(st->experts);
    nm_free(st);
}

int32_t nm_engine_state_n_ctx(const nm_engine_state *st) { return st->n_ctx; }
int32_t nm_engine_state_n_batch(const nm_engine_state *st) { return st->n_batch; }
size_t nm_engine_state_bytes(const nm_engine_state *st) { return st->n_bytes; }
nm_moe_exec *nm_engine_state_prefill_exec(nm_engine_state *st) { return st->prefill; }
nm_moe_exec *nm_engine_state_dense_exec(nm_engine_state *st) { return st->dense; }
int32_t nm_engine_state_dense_layers(const nm_engine_state *st) {
    return nm_engine_dense_count(st->dense_dev);
}

const nm_device_stats *nm_engine_state_device_layers(const nm_engine_state *st) {
    return st->dev_layer;
}

void nm_engine_state_reset_device_layers(nm_engine_state *st, int32_t n_layer) {
    if (st->dev_layer) memset(st->dev_layer, 0, (size_t)n_layer * sizeof *st->dev_layer);
}

/* acc += the device's work between a and b (what it counts over time) */
static void add_device_work(nm_device_stats *acc, const nm_device_stats *a,
                            const nm_device_stats *b) {
    acc->dispatches += b->dispatches - a->dispatches;
    acc->dense_dispatches += b->dense_dispatches - a->dense_dispatches;
    acc->syncs += b->syncs - a->syncs;
    acc->busy_ns += b->busy_ns - a->busy_ns;
    acc->rows_computed += b->rows_computed - a->rows_computed;
    acc->upload_bytes += b->upload_bytes - a->upload_bytes;
}

void nm_engine_state_set_tap(nm_engine_state *st, nm_tap_fn fn, void *ctx) {
    st->tap = fn;
    st->tap_ctx = fn ? ctx : NULL;
}

/* The blocks' tap when the session has one: the session's, remembering
 * where it asked to stop. */
static bool engine_tap(void *ctx, int32_t layer, const char *name, const float *values,
                       int32_t n_rows, int64_t n_cols) {
    nm_engine_state *st = ctx;
    if (st->tap(st->tap_ctx, layer, name, values, n_rows, n_cols)) return true;
    st->stop_name = name;
    st->stop_layer = layer;
    return false;
}

const float *nm_engine_state_rope_factors(const nm_engine_state *st) { return st->rope_factors; }

nm_kv_view nm_engine_state_kv(const nm_model *m, const nm_engine_state *st, int32_t il) {
    const size_t k_dim = (size_t)nm_model_kv_k_dim(&m->hp),
                 v_dim = (size_t)nm_model_kv_v_dim(&m->hp);
    const size_t pos = (size_t)il * (size_t)st->n_kv;
    const size_t elem = st->kv_type == NM_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    return (nm_kv_view){.type = st->kv_type,
                        .k = (char *)st->k_cache + pos * k_dim * elem,
                        .v = st->v_cache ? (char *)st->v_cache + pos * v_dim * elem : NULL,
                        .stage = st->kv_stage};
}

/* Brings the copy of the device layers' K/V that the batch at n_past uses
 * (the graphs', or the host's cache) up to n_past from the other, which is
 * valid that far: the prompt's K/V stay on the device during prefill and
 * come to the host's cache before the first batch the host computes (the
 * first decode step). */
static void kv_sync(const nm_model *m, nm_engine_state *st, bool on_device, int32_t n_past) {
    int32_t *have = on_device ? &st->kv_dev_n : &st->kv_host_n;
    if (*have >= n_past) return;
    NM_ASSERT((on_device ? st->kv_host_n : st->kv_dev_n) >= n_past);
    for (int32_t il = 0; il < m->hp.n_layer; il++)
        if (nm_engine_dense_has(st->dense_dev, il)) {
            const nm_kv_view kv = nm_engine_state_kv(m, st, il);
            nm_engine_dense_kv(st->dense_dev, il, &kv, *have, n_past - *have, on_device);
        }
    *have = n_past;
}

/* After a batch at n_past: the side that computed it is valid to n_past +
 * n (n_past when it failed), the other side no further than n_past. */
static void kv_written(nm_engine_state *st, bool on_device, int32_t n_past, int32_t n, bool ok) {
    int32_t *wrote = on_device ? &st->kv_dev_n : &st->kv_host_n;
    int32_t *other = on_device ? &st->kv_host_n : &st->kv_dev_n;
    *wrote = ok ? n_past + n : (*wrote < n_past ? *wrote : n_past);
    if (*other > n_past) *other = n_past;
}

nm_status nm_engine_state_kv_to_host(const nm_model *m, nm_engine_state *st, int32_t n_past,
                                     nm_error *err) {
    if (!st->dense_dev) return NM_OK;
    kv_sync(m, st, false, n_past);
    return nm_device_check(st->device, err);
}

void nm_engine_state_host_wrote(nm_engine_state *st, int32_t n_past) {
    if (st->dense_dev) kv_written(st, false, n_past, 1, true);
}

/* The batch of n_rows rows (n_real real) at n_past over st's buffers. */
static nm_model_batch batch_of(nm_engine_state *st, int32_t n_rows, int32_t n_real,
                               int32_t n_past) {
    return (nm_model_batch){.pool = st->pool,
                            .n_rows = n_rows,
                            .n_real = n_real,
                            .n_past = n_past,
                            .rope_factors = st->rope_factors,
                            .x = st->x,
                            .xn = st->xn,
                            .q = st->q,
                            .att = st->att,
                            .proj = st->proj,
                            .scores = st->scores,
                            .scores_stride = st->n_kv,
                            .router = st->router,
                            .ids = st->ids,
                            .weights = st->weights,
                            .probs = st->probs,
                            .shexp = st->shexp,
                            .tap = st->tap ? engine_tap : NULL,
                            .tap_ctx = st};
}

nm_status nm_engine_forward(const nm_model *m, nm_engine_state *st, const int32_t *ids, int32_t n,
                            int32_t n_past, float *logits, bool all_logits, nm_error *err) {
    const nm_hparams *hp = &m->hp;
    if (n < 1 || n > st->n_batch)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "batch of %d tokens is not in 1..%d", n,
                         st->n_batch);
    if (n_past < 0 || n_past > st->n_ctx - n)
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "%d cached + %d new positions exceed the context of %d", n_past, n,
                         st->n_ctx);
    for (int32_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= hp->n_vocab)
            return nm_errorf(err, NM_ERR_INVALID_ARG, "token id %d at position %d is not in 0..%d",
                             ids[t], n_past + t, hp->n_vocab - 1);
    /* A prompt batch in a static mode is a chunk of exactly n_batch rows:
     * the rows past n repeat the last token at the following positions.
     * They are computed (a static graph would), attend only to earlier
     * rows, are never routed, and their K/V land past n_past + n, where the
     * next batch overwrites them: no real row sees them. */
    nm_moe_exec *ex = st->prefill && n > 1 ? st->prefill : st->dense;
    const nm_model_batch b = batch_of(st, ex == st->prefill ? st->n_batch : n, n, n_past);
    /* A static chunk's dense parts go to the device's graphs, except under
     * a tap, which sees every block's tensors only on the host. */
    const bool on_device = ex == st->prefill && st->dense_dev && !st->tap;
    if (st->dense_dev) {
        kv_sync(m, st, on_device, n_past);
        /* a device that failed, before or in the copies of K/V: the cache
         * the batch would read is not the prompt's */
        const nm_status kst = nm_device_check(st->device, err);
        if (kst != NM_OK) return kst;
    }
    nm_model_embed(m, ids, n, &b);
    st->stop_name = NULL;
    /* the device's work per layer of static chunks (metrics) */
    const bool count = ex == st->prefill && st->dev_layer;
    nm_device_stats before, after;
    for (int32_t il = 0; il < hp->n_layer && !st->stop_name; il++) {
        if (count) st->device->ops->stats(st->device, &before);
        const float *shexp = NULL; /* the shared expert, when the device computed it */
        if (on_device && nm_engine_dense_has(st->dense_dev, il)) {
            shexp = nm_engine_dense_layer(st->dense_dev, il, &b);
            if (!nm_model_route_logits(m, il, &b)) break;
        } else {
            const nm_kv_view kv = nm_engine_state_kv(m, st, il);
            if (!nm_model_attention(m, il, &b, &kv) || !nm_model_route(m, il, &b)) break;
        }
        if (nm_model_layer_is_moe(hp, il)) { /* a dense layer's FFN is in the residual */
            const int32_t ml = nm_model_moe_index(hp, il);
            nm_moe_exec_layer(ex, st->pool, ml, st->x, st->xn, n, st->ids, st->weights, st->proj);
            if (count) {
                st->device->ops->stats(st->device, &after);
                add_device_work(&st->dev_layer[ml], &before, &after);
            }
        }
        nm_model_ffn_residual(m, il, &b, shexp);
    }
    /* a device that failed (lost) under the chunk's graphs: the chunk's
     * results are void, and the device's message says why */
    nm_status dst = st->device ? nm_device_check(st->device, err) : nm_moe_exec_check(ex, err);
    if (st->dense_dev) kv_written(st, on_device, n_past, n, dst == NM_OK && !st->stop_name);
    if (dst) return dst;
    if (!st->stop_name && logits) nm_model_output(m, &b, all_logits ? 0 : n - 1, logits);
    if (st->stop_name)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the tap stopped the evaluation at layer %d, tensor %s (positions %d..%d)",
                         st->stop_layer, st->stop_name, n_past, n_past + n - 1);
    return NM_OK;
}

/* One timed repetition: layer il's dense part of the chunk x0 on the host
 * (d NULL) or on d's graph, with the shared expert (on the device when the
 * graph computes it) and the residual, the experts' output proj zero. */
static double time_dense_once(const nm_model *m, int32_t il, nm_engine_state *st,
                              nm_engine_dense *d, const float *x0) {
    const nm_model_batch b = batch_of(st, st->n_batch, st->n_batch, 0);
    const size_t n_x = (size_t)st->n_batch * (size_t)m->hp.n_embd;
    memcpy(st->x, x0, n_x * sizeof(float));
    memset(st->proj, 0, n_x * sizeof(float));
    const int64_t t0 = nm_time_ns();
    const float *shexp = NULL;
    if (d) {
        shexp = nm_engine_dense_layer(d, il, &b);
        nm_model_route_logits(m, il, &b);
    } else {
        const nm_kv_view kv = nm_engine_state_kv(m, st, il);
        nm_model_attention(m, il, &b, &kv);
        nm_model_route(m, il, &b);
    }
    nm_model_ffn_residual(m, il, &b, shexp);
    return (double)(nm_time_ns() - t0) * 1e-6;
}

nm_status nm_engine_time_dense(const nm_model *m, nm_device *dev, int32_t chunk, int n_threads,
                               int reps, double *host_ms, double *device_ms, nm_error *err) {
    NM_ASSERT(m && dev && chunk >= 1 && reps >= 1 && host_ms && device_ms);
    *host_ms = *device_ms = 0;
    const nm_state_params sp = {.n_ctx = chunk,
                                .n_batch = chunk,
                                .n_threads = n_threads,
                                .mode = NM_MODE_DENSE,
                                .kv_type = NM_KV_F32};
    nm_engine_state *st = NULL;
    nm_status s = nm_engine_state_new(m, &sp, &st, err);
    if (s != NM_OK) return s;
    const size_t n_x = (size_t)chunk * (size_t)m->hp.n_embd;
    float *x0 = nm_malloc(n_x * sizeof *x0);
    double *times = nm_malloc((size_t)reps * sizeof *times);
    int32_t *ids = nm_malloc((size_t)chunk * sizeof *ids);
    bool *want = nm_calloc((size_t)m->hp.n_layer, sizeof *want);
    nm_engine_dense *d = NULL;
    if (!x0 || !times || !ids || !want) {
        s = nm_errorf(err, NM_ERR_NOMEM, "out of memory timing the dense part");
        goto out;
    }
    /* real embeddings (a spread of the vocabulary), as a prompt gives */
    for (int32_t t = 0; t < chunk; t++)
        ids[t] = (int32_t)(((int64_t)t * 7919) % m->hp.n_vocab);
    const nm_model_batch b = batch_of(st, chunk, chunk, 0);
    nm_model_embed(m, ids, chunk, &b);
    memcpy(x0, st->x, n_x * sizeof *x0);
    const int32_t il = m->hp.n_layer_dense_lead; /* the first MoE layer */
    time_dense_once(m, il, st, NULL, x0);        /* untimed: first touch */
    for (int r = 0; r < reps; r++)
        times[r] = time_dense_once(m, il, st, NULL, x0);
    *host_ms = nm_median(times, reps);
    if (!nm_engine_dense_expresses(m, il)) goto out; /* not measured */
    nm_dense_spec spec = nm_engine_dense_spec(m, il, chunk, chunk, NM_KV_F32, st->rope_factors);
    nm_device_fit_dense(dev, &spec);
    nm_error why = {0};
    if (nm_device_check_dense(dev, &spec, &why) != NM_OK) goto out; /* not measured */
    want[il] = true;
    s = nm_engine_dense_new(m, dev, want, chunk, chunk, NM_KV_F32, st->rope_factors, &d, err);
    if (s == NM_OK) time_dense_once(m, il, st, d, x0);
    for (int r = 0; s == NM_OK && r < reps; r++)
        times[r] = time_dense_once(m, il, st, d, x0);
    if (s == NM_OK) s = nm_device_check(dev, err);
    if (s == NM_OK) *device_ms = nm_median(times, reps);
out:
    nm_engine_dense_free(d);
    nm_engine_state_free(st);
    nm_free(x0);
    nm_free(times);
    nm_free(ids);
    nm_free(want);
    return s;
}
