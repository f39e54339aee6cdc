/* nm_batch: one decode step of several sessions in one pass (continuous
 * batching). The rows, one per session, go through every layer together:
 * the weights' matrix products (attention projections, router, experts,
 * head) run once over all rows; attention reads and writes each row's own
 * session cache (model.h, nm_model_batch's pos and kvs). The buffers are the
 * batch's, sized once; the sessions lend only their caches. */
#include "engine-impl.h"

#include "base/base.h"
#include "threads/threads.h"

#include <stdio.h>
#include <string.h>

struct nm_batch {
    const nm_model *model;
    int32_t max_rows, n_ctx;
    nm_pool *pool;
    float *x, *xn, *q, *att, *proj; /* [max_rows][...] as nm_model_batch */
    float *stage;                   /* [2][max_rows][kv_dim] new keys, values */
    float *scores;                  /* [n_threads][n_ctx] */
    float *router, *weights, *probs;
    float *shexp; /* [max_rows][..] the shared expert's work, or NULL */
    int32_t *ids; /* [max_rows][k] experts chosen */
    int32_t *pos; /* [max_rows] each row's position */
    nm_kv_view *kvs;
    const nm_expert_weights **experts; /* [n_moe_layers] */
    nm_moe_exec *moe;
};

/* n * size zeroed bytes, or NULL (then *ok = false). */
static void *zeroed(size_t n, size_t size, bool *ok) {
    size_t bytes;
    void *p = nm_mul_size(n, size, &bytes) ? nm_calloc(1, bytes ? bytes : 1) : NULL;
    if (!p) *ok = false;
    return p;
}

nm_status nm_batch_new(const nm_model *model, int32_t max_sessions, int32_t n_ctx, int n_threads,
                       nm_batch **out, nm_error *err) {
    *out = NULL;
    if (model->vocab_only)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the model was loaded for its vocabulary only: no weights to run");
    if (max_sessions < 1 || n_ctx < 1 || n_threads < 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "a batch needs at least 1 session and 1 position (%d sessions, %d "
                         "positions, %d threads)",
                         max_sessions, n_ctx, n_threads);
    if (n_threads == 0) n_threads = nm_cpu_count();
    const nm_hparams *hp = &model->hp;
    nm_batch *b = nm_calloc(1, sizeof *b);
    if (!b) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a batch");
    b->model = model;
    b->max_rows = max_sessions;
    b->n_ctx = n_ctx;
    nm_status st = nm_pool_new(n_threads, &b->pool, err);
    const size_t rows = (size_t)max_sessions, d = (size_t)hp->n_embd;
    const size_t q_dim = (size_t)nm_model_q_width(hp);
    const size_t kv_dim = (size_t)nm_model_kv_k_dim(hp), k = (size_t)hp->n_expert_used;
    bool ok = true;
    b->x = zeroed(rows * d, sizeof(float), &ok);
    b->xn = zeroed(rows * d, sizeof(float), &ok);
    b->q = zeroed(rows * q_dim, sizeof(float), &ok);
    b->att = zeroed(rows * q_dim, sizeof(float), &ok);
    b->proj = zeroed(rows * d, sizeof(float), &ok);
    b->stage = zeroed(2 * rows * kv_dim, sizeof(float), &ok);
    b->scores = zeroed((size_t)n_threads * (size_t)n_ctx, sizeof(float), &ok);
    b->router = zeroed(rows * (size_t)hp->n_expert, sizeof(float), &ok);
    b->weights = zeroed(rows * k, sizeof(float), &ok);
    b->probs = zeroed(rows * (size_t)hp->n_expert, sizeof(float), &ok);
    if (nm_model_shexp_scratch(hp) > 0) /* nm_model_batch.shexp */
        b->shexp = zeroed(rows * (size_t)nm_model_shexp_scratch(hp), sizeof(float), &ok);
    b->ids = zeroed(rows * k, sizeof(int32_t), &ok);
    b->pos = zeroed(rows, sizeof(int32_t), &ok);
    b->kvs = zeroed(rows, sizeof(nm_kv_view), &ok);
    b->experts = zeroed((size_t)nm_model_n_moe_layers(hp), sizeof *b->experts, &ok);
    if (st == NM_OK && !ok)
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for a batch of %d sessions", max_sessions);
    if (st == NM_OK) {
        for (int32_t l = 0; l < nm_model_n_moe_layers(hp); l++)
            b->experts[l] = nm_model_moe_experts(model, l);
        const nm_moe_exec_params ep = {.mode = NM_MODE_DENSE,
                                       .chunk = max_sessions,
                                       .n_layer = nm_model_n_moe_layers(hp),
                                       .weights = b->experts,
                                       .k = hp->n_expert_used,
                                       .n_threads = n_threads};
        st = nm_moe_exec_new(&ep, &b->moe, err);
    }
    if (st != NM_OK) {
        nm_batch_free(b);
        return st;
    }
    *out = b;
    return NM_OK;
}

void nm_batch_free(nm_batch *b) {
    if (!b) return;
    nm_moe_exec_free(b->moe);
    nm_pool_free(b->pool);
    nm_free(b->x);
    nm_free(b->xn);
    nm_free(b->q);
    nm_free(b->att);
    nm_free(b->proj);
    nm_free(b->stage);
    nm_free(b->scores);
    nm_free(b->router);
    nm_free(b->weights);
    nm_free(b->probs);
    nm_free(b->shexp);
    nm_free(b->ids);
    nm_free(b->pos);
    nm_free(b->kvs);
    nm_free(b->experts);
    nm_free(b);
}

/* Why sessions[i] cannot take part, or NM_OK. */
static nm_status check_session(const nm_batch *b, nm_session *const *sessions, int32_t i,
                               const int32_t *ids, nm_error *err) {
    const nm_session *s = sessions[i];
    if (!s) return nm_errorf(err, NM_ERR_INVALID_ARG, "session %d is NULL", i);
    if (s->model != b->model)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "session %d is of another model than the batch",
                         i);
    for (int32_t j = 0; j < i; j++)
        if (sessions[j] == s)
            return nm_errorf(err, NM_ERR_INVALID_ARG, "sessions %d and %d are the same session", j,
                             i);
    if (ids[i] < 0 || ids[i] >= b->model->hp.n_vocab)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "token id %d of session %d is not in 0..%d",
                         ids[i], i, b->model->hp.n_vocab - 1);
    if (s->n_past >= nm_engine_state_n_ctx(s->state) || s->n_past >= b->n_ctx)
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "session %d has no free position: %d of its %d positions are used (the "
                         "batch reaches %d)",
                         i, s->n_past, nm_engine_state_n_ctx(s->state), b->n_ctx);
    if (nm_engine_state_rope_factors(s->state) != nm_engine_state_rope_factors(sessions[0]->state))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "sessions 0 and %d have contexts on both sides of the model's original "
                         "%d positions (other RoPE factors): decode them in separate batches",
                         i, b->model->hp.n_ctx_orig);
    return NM_OK;
}

nm_status nm_batch_decode(nm_batch *b, nm_session *const *sessions, const int32_t *ids, int32_t n,
                          float *logits, nm_error *err) {
    const nm_model *m = b->model;
    if (n < 1 || n > b->max_rows)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "%d sessions is not in 1..%d", n, b->max_rows);
    for (int32_t i = 0; i < n; i++) {
        nm_status st = check_session(b, sessions, i, ids, err);
        if (st != NM_OK) return st;
    }
    for (int32_t i = 0; i < n; i++) {
        b->pos[i] = sessions[i]->n_past;
        /* a static prefill may have left the prompt's K/V on a device
         * (one that failed copying them: its error, naming the session) */
        nm_status st = nm_engine_state_kv_to_host(m, sessions[i]->state, b->pos[i], err);
        if (st != NM_OK) return nm_error_prefix(err, "session %d", i);
    }
    const nm_model_batch mb = {.pool = b->pool,
                               .n_rows = n,
                               .n_real = n,
                               .rope_factors = nm_engine_state_rope_factors(sessions[0]->state),
                               .x = b->x,
                               .xn = b->xn,
                               .q = b->q,
                               .att = b->att,
                               .proj = b->proj,
                               .scores = b->scores,
                               .scores_stride = b->n_ctx,
                               .router = b->router,
                               .ids = b->ids,
                               .weights = b->weights,
                               .probs = b->probs,
                               .shexp = b->shexp,
                               .pos = b->pos,
                               .kvs = b->kvs};
    const nm_kv_view lend = {.type = NM_KV_F32, .stage = b->stage};
    nm_model_embed(m, ids, n, &mb);
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        for (int32_t i = 0; i < n; i++)
            b->kvs[i] = nm_engine_state_kv(m, sessions[i]->state, il);
        /* without a tap the blocks never stop */
        nm_model_attention(m, il, &mb, &lend);
        nm_model_route(m, il, &mb);
        if (nm_model_layer_is_moe(&m->hp, il))
            nm_moe_exec_layer(b->moe, b->pool, nm_model_moe_index(&m->hp, il), b->x, b->xn, n,
                              b->ids, b->weights, b->proj);
        nm_model_ffn_residual(m, il, &mb, NULL);
    }
    if (logits) nm_model_output(m, &mb, 0, logits);
    for (int32_t i = 0; i < n; i++) {
        nm_engine_state_host_wrote(sessions[i]->state, sessions[i]->n_past);
        sessions[i]->n_past++;
    }
    return NM_OK;
}
