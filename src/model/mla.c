/* Multi-head latent attention (DeepSeek-V2), over a cache that holds per
 * position only the normed latent c [n_lora_kv] and the RoPE key k_pe
 * [n_rot] every head shares. kv_b's key rows are absorbed into the query
 * (q_lat = W_kb^T q_nope per head, with an F32 copy of W_kb^T made at
 * load, nm_model_mla_prepare) and its value rows applied after the
 * softmax (v = W_vb o_lat), so that q.k = q_lat.c + q_pe.k_pe and the
 * values are W_vb c: the same products llama.cpp computes from its full
 * K/V cache, summed in another order. Not here: the rest of the layer. */
#include "model.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

static bool tap(const nm_model_batch *b, int32_t il, const char *name, const float *values,
                int64_t n_cols) {
    return !b->tap || b->tap(b->tap_ctx, il, name, values, b->n_real, n_cols);
}

/* Widths of one head in the spaces the block moves through. */
typedef struct mla_dims {
    int64_t nope, rot, lora, v;
    int64_t qk;  /* nope + rot: a head of q as projected */
    int64_t lat; /* lora + rot: a head of the absorbed q, and a cache row */
    int64_t kvb; /* nope + v: a head's rows of wkv_b */
} mla_dims;

static mla_dims dims_of(const nm_hparams *hp) {
    return (mla_dims){.nope = hp->n_nope,
                      .rot = hp->n_rot,
                      .lora = hp->n_lora_kv,
                      .v = hp->n_v_head,
                      .qk = hp->head_dim,
                      .lat = (int64_t)hp->n_lora_kv + hp->n_rot,
                      .kvb = (int64_t)hp->n_nope + hp->n_v_head};
}

/* The rows of head h's values in wkv_b, as a matrix of their own: wkv_b
 * is never repacked, so its rows are the file's. */
static nm_mat kvb_values(const nm_layer *l, const mla_dims *dd, int h) {
    nm_mat w = l->wkv_b;
    const int64_t first = h * dd->kvb + dd->nope;
    w.data = (const uint8_t *)l->wkv_b.data + (size_t)first * l->wkv_b.row_bytes;
    w.n = dd->v;
    return w;
}

nm_status nm_model_mla_prepare(nm_model *m, nm_error *err) {
    const nm_hparams *hp = &m->hp;
    const mla_dims dd = dims_of(hp);
    const size_t per_layer = (size_t)hp->n_head * (size_t)dd.lora * (size_t)dd.nope;
    NM_ASSERT(!m->mla_k_t);
    m->mla_k_t = nm_malloc((size_t)hp->n_layer * per_layer * sizeof(float));
    float *row = nm_malloc((size_t)dd.lora * sizeof(float));
    if (!m->mla_k_t || !row) {
        nm_free(row);
        return nm_errorf(err, NM_ERR_NOMEM,
                         "out of memory for the transposed key rows of attn_kv_b (%.1f MiB)",
                         (double)((size_t)hp->n_layer * per_layer * sizeof(float)) / 1048576.0);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        nm_layer *l = &m->layers[il];
        float *t = m->mla_k_t + (size_t)il * per_layer;
        for (int h = 0; h < hp->n_head; h++)
            for (int64_t i = 0; i < dd.nope; i++) {
                const uint8_t *src =
                    (const uint8_t *)l->wkv_b.data + (size_t)(h * dd.kvb + i) * l->wkv_b.row_bytes;
                nm_dequantize_row((nm_dtype)l->wkv_b.type, src, row, dd.lora);
                for (int64_t c = 0; c < dd.lora; c++)
                    t[((size_t)h * dd.lora + c) * dd.nope + i] = row[c];
            }
        l->wk_b_t = (nm_mat){.data = t,
                             .type = NM_DTYPE_F32,
                             .n = (int64_t)hp->n_head * dd.lora,
                             .k = dd.nope,
                             .row_bytes = (size_t)dd.nope * sizeof(float)};
    }
    nm_free(row);
    return NM_OK;
}

typedef struct absorb_ctx {
    const nm_layer *l;
    mla_dims dd;
    int32_t n, n_head;
    const float *q; /* [n][n_head][qk] */
    float *q_lat;   /* [n][n_head][lat] */
} absorb_ctx;

/* Head h: q_lat[t][h][:lora] = W_kb,h^T q_nope[t][h], a matmul with the
 * head's rows of wk_b_t. */
static void absorb_task(void *p, int h, int thread) {
    (void)thread;
    const absorb_ctx *c = p;
    const mla_dims *dd = &c->dd;
    nm_mat w = c->l->wk_b_t;
    w.data = (const uint8_t *)w.data + (size_t)h * (size_t)dd->lora * w.row_bytes;
    w.n = dd->lora;
    nm_matmul_forward(&w, c->q + (size_t)h * dd->qk, (int64_t)c->n_head * dd->qk, c->n,
                      c->q_lat + (size_t)h * dd->lat, (int64_t)c->n_head * dd->lat, 0, dd->lora);
}

typedef struct attend_ctx {
    const nm_hparams *hp;
    const nm_model_batch *b;
    const nm_kv_view *kv;
    mla_dims dd;
    int32_t rows_per_task;
} attend_ctx;

/* Rows of a task: every head against the cache as one shared key/value
 * head of width lat (values = the same rows; the k_pe part of the output
 * is unused). */
static void attend_task(void *p, int task, int thread) {
    const attend_ctx *c = p;
    const nm_model_batch *b = c->b;
    const int64_t w = (int64_t)c->hp->n_head * c->dd.lat;
    float *scores = b->scores + (size_t)thread * (size_t)b->scores_stride;
    const int32_t i0 = task * c->rows_per_task;
    const int32_t n = b->n_rows - i0 < c->rows_per_task ? b->n_rows - i0 : c->rows_per_task;
    const nm_kv_view *kv = b->kvs ? &b->kvs[i0] : c->kv;
    int32_t kv0[NM_ATTENTION_ROWS_MAX] = {0}, n_kv[NM_ATTENTION_ROWS_MAX];
    for (int32_t r = 0; r < n; r++)
        n_kv[r] = (b->pos ? b->pos[i0 + r] : b->n_past + i0 + r) + 1;
    const int lat = (int)c->dd.lat;
    const float scale = c->hp->attn_scale;
    if (kv->type == NM_KV_F16)
        nm_attention_rows_f16_forward(b->q + i0 * w, w, kv->k, kv->k, lat, kv0, n_kv, n,
                                      c->hp->n_head, 1, lat, scale, NULL, b->att + i0 * w, w,
                                      scores);
    else
        nm_attention_rows_forward(b->q + i0 * w, w, kv->k, kv->k, lat, kv0, n_kv, n, c->hp->n_head,
                                  1, lat, scale, NULL, b->att + i0 * w, w, scores);
}

bool nm_model_attention_mla(const nm_model *m, int32_t il, const nm_model_batch *b,
                            const nm_kv_view *kv) {
    const nm_hparams *hp = &m->hp;
    const nm_layer *l = &m->layers[il];
    const mla_dims dd = dims_of(hp);
    const int32_t n = b->n_rows, n_head = hp->n_head;
    const int64_t d = hp->n_embd;
    const bool half = kv->type == NM_KV_F16, rows = b->kvs != NULL;
    NM_ASSERT(rows ? kv->stage != NULL : half == (kv->stage != NULL));
    /* [n][lat]: the rows' latents and k_pe, straight into an F32 cache,
     * staged for an F16 one or for each row's own cache */
    float *kv_new = half || rows ? kv->stage : (float *)kv->k + (size_t)b->n_past * dd.lat;
    /* q as projected, [n][n_head][qk], lives in att until the attention
     * overwrites it; q_a's output ([n][n_lora_q]) in q before q_lat */
    float *q = b->att;

    for (int32_t t = 0; t < n; t++)
        nm_model_norm(hp, b->x + t * d, l->attn_norm, NULL, b->xn + t * d, d);
    if (!tap(b, il, "attn_norm", b->xn, d)) return false;
    if (hp->n_lora_q > 0) {
        const int64_t r = hp->n_lora_q;
        nm_matmul_parallel(b->pool, &l->wq_a, b->xn, d, n, b->q, r);
        for (int32_t t = 0; t < n; t++)
            nm_model_norm(hp, b->q + t * r, l->q_a_norm, NULL, b->q + t * r, r);
        nm_matmul_parallel(b->pool, &l->wq_b, b->q, r, n, q, n_head * dd.qk);
    } else {
        nm_matmul_parallel(b->pool, &l->wq, b->xn, d, n, q, n_head * dd.qk);
    }
    nm_matmul_parallel(b->pool, &l->wkv_a, b->xn, d, n, kv_new, dd.lat);
    for (int32_t t = 0; t < n; t++) {
        const int32_t pos = b->pos ? b->pos[t] : b->n_past + t;
        float *c = kv_new + t * dd.lat;
        nm_model_norm(hp, c, l->kv_a_norm, NULL, c, dd.lora);
        /* q_pe of every head (stride qk) and the one k_pe */
        nm_model_rope(hp, NULL, q + (size_t)t * n_head * dd.qk + dd.nope, n_head, pos);
        nm_model_rope(hp, NULL, c + dd.lora, 1, pos);
    }
    if (!tap(b, il, "Qcur", q, n_head * dd.qk) || !tap(b, il, "kv_compressed", kv_new, dd.lat))
        return false;
    absorb_ctx ac = {.l = l, .dd = dd, .n = n, .n_head = n_head, .q = q, .q_lat = b->q};
    nm_pool_run(b->pool, absorb_task, &ac, n_head);
    for (int32_t t = 0; t < n; t++)
        for (int h = 0; h < n_head; h++)
            memcpy(b->q + ((size_t)t * n_head + h) * dd.lat + dd.lora,
                   q + ((size_t)t * n_head + h) * dd.qk + dd.nope, (size_t)dd.rot * sizeof(float));
    for (int32_t t = 0; rows && t < n; t++) {
        const nm_kv_view *r = &b->kvs[t];
        const size_t off = (size_t)b->pos[t] * dd.lat, at = (size_t)t * dd.lat;
        for (int64_t i = 0; i < dd.lat; i++)
            if (r->type == NM_KV_F16)
                ((uint16_t *)r->k)[off + i] = nm_f32_to_f16(kv_new[at + i]);
            else
                ((float *)r->k)[off + i] = kv_new[at + i];
    }
    if (half && !rows) {
        uint16_t *k_half = (uint16_t *)kv->k + (size_t)b->n_past * dd.lat;
        for (int64_t i = 0; i < (int64_t)n * dd.lat; i++)
            k_half[i] = nm_f32_to_f16(kv_new[i]);
    }
    /* rows with caches of their own one at a time (the same bits) */
    const int32_t per_task = rows ? 1 : nm_attention_rows_per_call(n_head, 1);
    attend_ctx c = {.hp = hp, .b = b, .kv = kv, .dd = dd, .rows_per_task = per_task};
    nm_pool_run(b->pool, attend_task, &c, (n + per_task - 1) / per_task);
    /* v per head from its latent output: [n][n_head][v] into q */
    for (int h = 0; h < n_head; h++) {
        const nm_mat wv = kvb_values(l, &dd, h);
        nm_matmul_parallel(b->pool, &wv, b->att + h * dd.lat, n_head * dd.lat, n, b->q + h * dd.v,
                           n_head * dd.v);
    }
    if (!tap(b, il, "kqv_out", b->q, n_head * dd.v)) return false;
    nm_matmul_parallel(b->pool, &l->wo, b->q, n_head * dd.v, n, b->proj, d);
    for (int64_t i = 0; i < (int64_t)n * d; i++)
        b->x[i] += b->proj[i];
    return tap(b, il, "ffn_inp", b->x, d);
}
