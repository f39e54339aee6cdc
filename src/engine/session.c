/* Sessions, the public nm_session over a loaded model and its runtime
 * (forward.c: KV cache, buffers, executors); evaluation splits the input
 * into batches of at most n_batch tokens, each run through all layers at
 * once. Also the tokenizer entry points of the public API. */
#include "engine-impl.h"

#include "base/base.h"
#include "plan/plan.h"

#include <string.h>
#include <sys/resource.h>

nm_session_params nm_session_default_params(void) {
    nm_session_params p = {.n_ctx = 0,
                           .n_batch = 0,
                           .n_threads = 0,
                           .mode = NM_MODE_DENSE,
                           .plan = NULL,
                           .device = NULL};
    return p;
}

nm_status nm_session_new(const nm_model *model, const nm_session_params *params, nm_session **out,
                         nm_error *err) {
    *out = NULL;
    nm_session_params p = params ? *params : nm_session_default_params();
    if (model->vocab_only)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the model was loaded for its vocabulary only: no weights to run");
    if (p.n_ctx < 0 || p.n_batch < 0 || p.n_threads < 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "session sizes must not be negative (ctx %d, batch %d, threads %d)",
                         p.n_ctx, p.n_batch, p.n_threads);
    if (p.n_ctx == 0) p.n_ctx = model->hp.n_ctx_train < 4096 ? model->hp.n_ctx_train : 4096;
    if (p.kv_type != NM_KV_F32 && p.kv_type != NM_KV_F16)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown KV cache type %d", (int)p.kv_type);
    if ((unsigned)p.mode >= NM_MODE_COUNT)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown mode %d", (int)p.mode);
    /* a plan's tiers and residency were chosen from one device's costs */
    if (p.plan && p.device && p.mode != NM_MODE_DENSE && p.mode != NM_MODE_NAIVE &&
        strcmp(p.plan->device, p.device->ops->name) != 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the plan was made for device '%s', not for device '%s': make one for "
                         "'%s' (npumoe profile --device %s, then npumoe plan)",
                         p.plan->device, p.device->ops->name, p.device->ops->name,
                         p.device->ops->name);
    if (p.n_batch == 0) p.n_batch = p.plan ? p.plan->moe.chunk : 512;
    if (p.n_threads == 0) p.n_threads = nm_cpu_count();
    nm_session *s = nm_calloc(1, sizeof *s);
    if (!s) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a session");
    s->model = model;
    s->mode = p.mode;
    s->device = p.device;
    nm_state_params sp = {.n_ctx = p.n_ctx,
                          .n_batch = p.n_batch,
                          .n_threads = p.n_threads,
                          .mode = p.mode,
                          .plan = p.plan ? &p.plan->moe : NULL,
                          .device = p.device,
                          .kv_type = p.kv_type,
                          .dense_on_device = p.plan ? p.plan->dense_on_device : NULL};
    nm_status st = nm_engine_state_new(model, &sp, &s->state, err);
    if (st != NM_OK) {
        nm_free(s);
        return st;
    }
    *out = s;
    return NM_OK;
}

void nm_session_free(nm_session *session) {
    if (!session) return;
    nm_engine_state_free(session->state);
    nm_free(session);
}

void nm_session_reset(nm_session *session) { session->n_past = 0; }

int32_t nm_session_n_past(const nm_session *session) { return session->n_past; }

int32_t nm_session_n_ctx(const nm_session *session) {
    return nm_engine_state_n_ctx(session->state);
}

int32_t nm_session_n_vocab(const nm_session *session) { return session->model->hp.n_vocab; }

void nm_session_get_metrics(nm_session *session, nm_session_metrics *out) {
    memset(out, 0, sizeof *out);
    nm_moe_exec *ex = nm_engine_state_prefill_exec(session->state);
    out->mode = ex ? session->mode : NM_MODE_DENSE;
    if (!ex) ex = nm_engine_state_dense_exec(session->state);
    out->n_layer = nm_model_n_moe_layers(&session->model->hp); /* the executor's layers */
    out->layers = nm_moe_exec_metrics(ex);
    for (int32_t l = 0; l < out->n_layer; l++) {
        const nm_moe_layer_metrics *m = &out->layers[l];
        nm_moe_layer_metrics *t = &out->total;
        t->chunks += m->chunks;
        t->assignments += m->assignments;
        t->dropped += m->dropped;
        t->weight += m->weight;
        t->dropped_weight += m->dropped_weight;
        t->spilled += m->spilled;
        t->host_rows += m->host_rows;
        t->device_rows += m->device_rows;
        t->reserved_rows += m->reserved_rows;
        t->dispatches += m->dispatches;
        t->host_ns += m->host_ns;
        t->wait_ns += m->wait_ns;
        t->moe_ns += m->moe_ns;
    }
    if (session->device) session->device->ops->stats(session->device, &out->device);
    out->device_layers = nm_engine_state_device_layers(session->state);
    for (int32_t l = 0; out->device_layers && l < out->n_layer; l++) {
        const nm_device_stats *d = &out->device_layers[l];
        nm_device_stats *t = &out->device_total;
        t->dispatches += d->dispatches;
        t->dense_dispatches += d->dense_dispatches;
        t->syncs += d->syncs;
        t->busy_ns += d->busy_ns;
        t->rows_computed += d->rows_computed;
        t->upload_bytes += d->upload_bytes;
    }
}

void nm_session_reset_metrics(nm_session *session) {
    nm_moe_exec *ex = nm_engine_state_prefill_exec(session->state);
    nm_moe_exec_reset_metrics(ex ? ex : nm_engine_state_dense_exec(session->state));
    nm_engine_state_reset_device_layers(session->state,
                                        nm_model_n_moe_layers(&session->model->hp));
}

void nm_session_set_load_fn(nm_session *session, nm_load_fn fn, void *ctx) {
    nm_moe_exec *ex = nm_engine_state_prefill_exec(session->state);
    nm_moe_exec_set_load_fn(ex ? ex : nm_engine_state_dense_exec(session->state), fn, ctx);
}

void nm_session_set_tap(nm_session *session, nm_tap_fn fn, void *ctx) {
    nm_engine_state_set_tap(session->state, fn, ctx);
}

size_t nm_session_bytes(const nm_session *session) { return nm_engine_state_bytes(session->state); }

nm_status nm_session_eval(nm_session *session, const int32_t *ids, int32_t n, float *logits,
                          bool all_logits, nm_error *err) {
    if (n < 1) return nm_errorf(err, NM_ERR_INVALID_ARG, "nothing to evaluate (%d tokens)", n);
    const int32_t n_ctx = nm_engine_state_n_ctx(session->state);
    if (n > n_ctx - session->n_past)
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "%d tokens do not fit: %d of the context's %d positions are used", n,
                         session->n_past, n_ctx);
    const int32_t n_batch = nm_engine_state_n_batch(session->state);
    const int32_t n_vocab = session->model->hp.n_vocab;
    for (int32_t done = 0; done < n;) {
        const int32_t nb = n - done < n_batch ? n - done : n_batch;
        const bool last = done + nb == n;
        float *out = NULL;
        if (logits && all_logits)
            out = logits + (size_t)done * n_vocab;
        else if (logits && last)
            out = logits;
        nm_status st = nm_engine_forward(session->model, session->state, ids + done, nb,
                                         session->n_past, out, all_logits, err);
        if (st != NM_OK) return st;
        session->n_past += nb;
        done += nb;
    }
    return NM_OK;
}

nm_status nm_tokenize(const nm_model *model, const char *text, size_t n_bytes, bool add_special,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_out, nm_error *err) {
    /* BOS only where the vocabulary asks for it (llama.cpp's add_special) */
    const bool add_bos = add_special && nm_tokenizer_add_bos(model->tok);
    return nm_tokenizer_encode(model->tok, text, n_bytes, add_bos, parse_special, ids, cap, n_out,
                               err);
}

int32_t nm_token_to_piece(const nm_model *model, int32_t id, bool render_special, char *buf,
                          size_t cap) {
    return nm_tokenizer_piece(model->tok, id, render_special, buf, cap);
}

bool nm_token_is_eog(const nm_model *model, int32_t id) {
    return nm_tokenizer_is_eog(model->tok, id);
}

uint64_t nm_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (uint64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}
