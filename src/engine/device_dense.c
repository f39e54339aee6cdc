/* The dense part of a layer on the session's device (NM_GRAPH_DENSE): one
 * graph per layer the device supports, compiled with the session, each
 * keeping its layer's K/V of the prompt; the batch loop (forward.c) hands
 * a static chunk's residual stream to the layer's graph and takes back the
 * residual after attention, the experts' input, the router's logits and,
 * when the device computes it, the shared expert's output, so the host
 * keeps only routing and the MoE's dynamic part. Layers the
 * device does not support, and layers the session does not want there
 * (forward.c: the plan's choice, or where the layer's experts run), keep
 * their dense part on the host. */
#include "engine-impl.h"

#include "base/base.h"

#include <math.h>
#include <string.h>

struct nm_engine_dense {
    nm_device *dev;
    int32_t n_layer;
    int32_t rows; /* T */
    int64_t d_model;
    int32_t n_expert;
    int64_t kv_dim;
    size_t kv_elem;
    int32_t n_graphs;
    nm_graph **graphs; /* [n_layer] NULL: that layer's dense part stays on the host */
};

nm_dense_spec nm_engine_dense_spec(const nm_model *m, int32_t il, int32_t rows, int32_t n_pos,
                                   nm_kv_type kv_type, const float *rope_factors) {
    const nm_hparams *hp = &m->hp;
    const nm_layer *l = &m->layers[il];
    const bool shexp = l->shexp_gate.data && m->compat != NM_COMPAT_LLAMA_CPP;
    return (nm_dense_spec){
        .layer = il,
        .rows = rows,
        .n_pos = n_pos,
        .d_model = hp->n_embd,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .n_expert = hp->n_expert,
        .norm = hp->norm == NM_NORM_LAYER ? NM_DENSE_NORM_LAYER : NM_DENSE_NORM_RMS,
        .norm_eps = hp->rms_eps,
        .qk_norm = hp->qk_norm == NM_QK_NORM_HEAD    ? NM_DENSE_QK_HEAD
                   : hp->qk_norm == NM_QK_NORM_WHOLE ? NM_DENSE_QK_WHOLE
                                                     : NM_DENSE_QK_NONE,
        .rope = hp->rope == NM_ROPE_NORM ? NM_DENSE_ROPE_NORM : NM_DENSE_ROPE_NEOX,
        .n_rot = hp->n_rot,
        .rope_freq_base = hp->rope_freq_base,
        .rope_attn_factor = hp->rope_attn_factor,
        .rope_factors = rope_factors,
        .attn_scale = 1.0f / sqrtf((float)hp->head_dim), /* as nm_model_attention */
        .kv_type = kv_type,
        .round_f16 = m->compat == NM_COMPAT_LLAMA_CPP,
        .attn_norm = l->attn_norm,
        .attn_norm_b = l->attn_norm_b,
        .wq = l->wq,
        .wk = l->wk,
        .wv = l->wv,
        .wo = l->wo,
        .bq = l->bq,
        .bk = l->bk,
        .bv = l->bv,
        .bo = l->bo,
        .q_norm = l->q_norm,
        .k_norm = l->k_norm,
        .ffn_norm = l->ffn_norm,
        .ffn_norm_b = l->ffn_norm_b,
        .router = l->router,
        .n_ff_shexp = shexp ? hp->n_ff_shexp : 0,
        .shexp_gate = shexp ? l->shexp_gate : (nm_mat){0},
        .shexp_up = shexp ? l->shexp_up : (nm_mat){0},
        .shexp_down = shexp ? l->shexp_down : (nm_mat){0},
        .shexp_gate_inp = shexp ? l->shexp_gate_inp : (nm_mat){0},
    };
}

/* Whether nm_dense_spec can say what layer il computes before the experts:
 * a MoE layer with multi-head attention (not latent) and none of what the
 * spec has no field for: attention sinks, a sliding window, a router bias,
 * RoPE scaling (gpt-oss). Other layers keep their dense part on the host. */
bool nm_engine_dense_expresses(const nm_model *m, int32_t il) {
    const nm_layer *l = &m->layers[il];
    return nm_model_layer_is_moe(&m->hp, il) && m->hp.n_lora_kv == 0 && !l->sinks &&
           l->window == 0 && !l->router_b && !m->hp.rope_scaled;
}

nm_status nm_engine_dense_new(const nm_model *m, nm_device *dev, const bool *want, int32_t rows,
                              int32_t n_pos, nm_kv_type kv_type, const float *rope_factors,
                              nm_engine_dense **out, nm_error *err) {
    *out = NULL;
    const nm_hparams *hp = &m->hp;
    nm_engine_dense *d = nm_calloc(1, sizeof *d);
    if (d) d->graphs = nm_calloc((size_t)hp->n_layer, sizeof *d->graphs);
    if (!d || !d->graphs) {
        nm_free(d);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the device's dense graphs");
    }
    d->dev = dev;
    d->n_layer = hp->n_layer;
    d->rows = rows;
    d->d_model = hp->n_embd;
    d->n_expert = hp->n_expert;
    d->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    d->kv_elem = kv_type == NM_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        if (!want[il] || !nm_engine_dense_expresses(m, il)) continue;
        nm_dense_spec spec = nm_engine_dense_spec(m, il, rows, n_pos, kv_type, rope_factors);
        nm_device_fit_dense(dev, &spec); /* the host computes what the device leaves */
        nm_error why = {0};
        /* a form the device does not implement: the host keeps the layer */
        if (nm_device_check_dense(dev, &spec, &why) != NM_OK) continue;
        nm_status st = dev->ops->compile_dense(dev, &spec, &d->graphs[il], err);
        if (st) {
            nm_error_prefix(err, "the device's dense graphs");
            nm_engine_dense_free(d);
            return st;
        }
        d->n_graphs++;
    }
    *out = d;
    return NM_OK;
}

void nm_engine_dense_free(nm_engine_dense *d) {
    if (!d) return;
    for (int32_t il = 0; il < d->n_layer; il++)
        if (d->graphs[il]) d->dev->ops->graph_free(d->graphs[il]);
    nm_free(d->graphs);
    nm_free(d);
}

int32_t nm_engine_dense_count(const nm_engine_dense *d) { return d ? d->n_graphs : 0; }

bool nm_engine_dense_has(const nm_engine_dense *d, int32_t il) {
    return d && d->graphs[il] != NULL;
}

const float *nm_engine_dense_layer(nm_engine_dense *d, int32_t il, const nm_model_batch *b) {
    nm_graph *g = d->graphs[il];
    const nm_device_ops *ops = d->dev->ops;
    NM_ASSERT(g && b->n_rows == d->rows);
    const size_t x_bytes = (size_t)d->rows * (size_t)d->d_model * sizeof(float);
    memcpy(ops->input(g), b->x, x_bytes);
    ops->submit_dense(g, b->n_past);
    ops->wait(g);
    nm_dense_outputs o;
    ops->dense_outputs(g, &o);
    memcpy(b->x, o.x, x_bytes);
    memcpy(b->xn, o.xn, x_bytes);
    memcpy(b->router, o.logits, (size_t)b->n_real * (size_t)d->n_expert * sizeof(float));
    return o.shexp;
}

void nm_engine_dense_kv(nm_engine_dense *d, int32_t il, const nm_kv_view *kv, int32_t pos0,
                        int32_t n, bool to_device) {
    nm_graph *g = d->graphs[il];
    NM_ASSERT(g);
    const size_t off = (size_t)pos0 * (size_t)d->kv_dim * d->kv_elem;
    char *k = (char *)kv->k + off, *v = (char *)kv->v + off;
    if (to_device)
        d->dev->ops->kv_write(g, pos0, n, k, v);
    else
        d->dev->ops->kv_read(g, pos0, n, k, v);
}
