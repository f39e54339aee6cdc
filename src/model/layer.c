/* The computation of a layer, shared by every architecture: embedding,
 * the attention block, routing, the residual around the experts and the
 * output head, over buffers and a KV cache the engine owns (model.h,
 * nm_model_batch and nm_kv_view). Not here: the experts themselves (the
 * engine's MoE executor runs them between routing and the residual). */
#include "model.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

/* Reports [n_real][n_cols] values to the batch's tap; false = stop. */
static bool tap(const nm_model_batch *b, int32_t il, const char *name, const float *values,
                int64_t n_cols) {
    return !b->tap || b->tap(b->tap_ctx, il, name, values, b->n_real, n_cols);
}

/* y[m][N] = x[m][K] W^T over the pool. */
static void matmul(nm_pool *pool, const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                   int64_t ldy) {
    nm_matmul_parallel(pool, w, x, ldx, m, y, ldy);
}

/* ---- architecture plumbing: biases, llama.cpp's F16 activations ---- */

static void add_bias(float *y, const float *b, int64_t n) {
    if (b)
        for (int64_t i = 0; i < n; i++)
            y[i] += b[i];
}

/* Under --compat llama.cpp, the input of a matmul with F16 weights is
 * rounded to F16 first, as ggml's F16 vec_dot and sgemm paths convert it.
 * (The expert down projection's input is rounded by no one here: it lives
 * in the MoE executor, so F16 experts stay about 1e-4 apart.) */
static void compat_round_input(const nm_model *m, const nm_mat *w, float *x, int64_t n) {
    if (m->compat == NM_COMPAT_LLAMA_CPP && w->type == NM_DTYPE_F16) nm_model_round_f16(x, n);
}

/* ---- loops over a batch's rows, split over the pool ---- */

/* Rows per range: a row (a norm or a residual add of a few thousand
 * values) takes about a microsecond, a hand-off to the pool several. */
enum { ROWS_MIN = 16 };

typedef struct rows_ctx {
    const nm_model *m;
    const nm_layer *l;
    const nm_model_batch *b;
    const float *norm_w, *norm_b; /* norm_rows */
    float *dst;                   /* add_rows: dst += src (+ bias, summed first) */
    const float *src;
    const float *bias;
    float *k_new, *v_new; /* qkv_rows: this batch's keys and values */
} rows_ctx;

/* xn = norm(x) of rows [t0, t1). */
static void norm_rows(void *p, int64_t t0, int64_t t1) {
    const rows_ctx *c = p;
    const int64_t d = c->m->hp.n_embd;
    for (int64_t t = t0; t < t1; t++)
        nm_model_norm(&c->m->hp, c->b->x + t * d, c->norm_w, c->norm_b, c->b->xn + t * d, d);
}

static void norm_all(const nm_model *m, const nm_model_batch *b, int32_t n, const float *w,
                     const float *bias) {
    rows_ctx c = {.m = m, .b = b, .norm_w = w, .norm_b = bias};
    nm_pool_for(b->pool, n, ROWS_MIN, norm_rows, &c);
}

/* Rows [t0, t1): dst += src + bias (src + bias rounded first, as ggml adds
 * a projection's bias before the residual), or dst += src. */
static void add_rows(void *p, int64_t t0, int64_t t1) {
    const rows_ctx *c = p;
    const int64_t d = c->m->hp.n_embd;
    for (int64_t t = t0; t < t1; t++) {
        float *dst = c->dst + t * d;
        const float *src = c->src + t * d;
        if (c->bias)
            for (int64_t i = 0; i < d; i++)
                dst[i] += src[i] + c->bias[i];
        else
            for (int64_t i = 0; i < d; i++)
                dst[i] += src[i];
    }
}

static void add_all(const nm_model *m, const nm_model_batch *b, int32_t n, float *dst,
                    const float *src, const float *bias) {
    rows_ctx c = {.m = m, .b = b, .dst = dst, .src = src, .bias = bias};
    nm_pool_for(b->pool, n, ROWS_MIN, add_rows, &c);
}

void nm_model_embed(const nm_model *m, const int32_t *ids, int32_t n, const nm_model_batch *b) {
    NM_ASSERT(n >= 1 && n <= b->n_rows);
    const int64_t d = m->hp.n_embd;
    for (int32_t t = 0; t < b->n_rows; t++)
        nm_dequantize_row((nm_dtype)m->tok_embd.type,
                          (const uint8_t *)m->tok_embd.data +
                              (size_t)ids[t < n ? t : n - 1] * m->tok_embd.row_bytes,
                          b->x + t * d, d);
}

/* ---- attention block ---- */

typedef struct attention_ctx {
    const nm_hparams *hp;
    const nm_layer *l;
    const nm_model_batch *b;
    const nm_kv_view *kv;
    int32_t rows_per_task;
} attention_ctx;

static void attention_task(void *p, int task, int thread) {
    const attention_ctx *c = p;
    const nm_hparams *hp = c->hp;
    const nm_model_batch *b = c->b;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    float *scores = b->scores + (size_t)thread * (size_t)b->scores_stride;
    const int32_t i0 = task * c->rows_per_task;
    const int32_t n = b->n_rows - i0 < c->rows_per_task ? b->n_rows - i0 : c->rows_per_task;
    const nm_kv_view *kv = b->kvs ? &b->kvs[i0] : c->kv;
    int32_t kv0[NM_ATTENTION_ROWS_MAX], n_kv[NM_ATTENTION_ROWS_MAX];
    for (int32_t r = 0; r < n; r++) {
        n_kv[r] = (b->pos ? b->pos[i0 + r] : b->n_past + i0 + r) + 1;
        /* a sliding window keeps the last `window` keys, the query's own included */
        const int32_t w = c->l->window;
        kv0[r] = w > 0 && n_kv[r] > w ? n_kv[r] - w : 0;
    }
    const float *q = b->q + i0 * q_dim;
    float *out = b->att + i0 * q_dim;
    if (kv->type == NM_KV_F16)
        nm_attention_rows_f16_forward(q, q_dim, kv->k, kv->v, kv_dim, kv0, n_kv, n, hp->n_head,
                                      hp->n_head_kv, hp->head_dim, scale, c->l->sinks, out, q_dim,
                                      scores);
    else
        nm_attention_rows_forward(q, q_dim, kv->k, kv->v, kv_dim, kv0, n_kv, n, hp->n_head,
                                  hp->n_head_kv, hp->head_dim, scale, c->l->sinks, out, q_dim,
                                  scores);
}

/* Rows [t0, t1) of q, k and v: biases, the QK norm, RoPE. */
static void qkv_rows(void *p, int64_t t0, int64_t t1) {
    const rows_ctx *c = p;
    const nm_hparams *hp = &c->m->hp;
    const nm_layer *l = c->l;
    const nm_model_batch *b = c->b;
    const int64_t hd = hp->head_dim;
    const int64_t q_dim = (int64_t)hp->n_head * hd, kv_dim = (int64_t)hp->n_head_kv * hd;
    float *k_new = c->k_new, *v_new = c->v_new;
    for (int64_t t = t0; t < t1; t++) {
        float *qt = b->q + t * q_dim, *kt = k_new + t * kv_dim, *vt = v_new + t * kv_dim;
        add_bias(qt, l->bq, q_dim);
        add_bias(kt, l->bk, kv_dim);
        add_bias(vt, l->bv, kv_dim);
        if (hp->qk_norm != NM_QK_NORM_NONE)
            nm_qk_norm_forward(qt, kt, hp->n_head, hp->n_head_kv, hd, l->q_norm, l->k_norm,
                               hp->qk_norm == NM_QK_NORM_HEAD, hp->rms_eps);
        const int32_t pos = b->pos ? b->pos[t] : b->n_past + (int32_t)t;
        nm_model_rope(hp, b->rope_factors, qt, hp->n_head, pos);
        nm_model_rope(hp, b->rope_factors, kt, hp->n_head_kv, pos);
    }
}

bool nm_model_attention(const nm_model *m, int32_t il, const nm_model_batch *b,
                        const nm_kv_view *kv) {
    if (m->hp.n_lora_kv > 0) return nm_model_attention_mla(m, il, b, kv);
    const nm_hparams *hp = &m->hp;
    const nm_layer *l = &m->layers[il];
    const int32_t n = b->n_rows;
    const int64_t d = hp->n_embd, hd = hp->head_dim;
    const int64_t q_dim = (int64_t)hp->n_head * hd, kv_dim = (int64_t)hp->n_head_kv * hd;
    const size_t past_off = (size_t)b->n_past * kv_dim;
    const bool half = kv->type == NM_KV_F16, rows = b->kvs != NULL;
    NM_ASSERT(rows ? kv->stage != NULL : half == (kv->stage != NULL));
    /* [n][kv_dim]: straight into an F32 cache; staged, then converted, for
     * F16 or copied into each row's cache */
    float *k_new = half || rows ? kv->stage : (float *)kv->k + past_off;
    float *v_new = half || rows ? kv->stage + (size_t)n * kv_dim : (float *)kv->v + past_off;

    norm_all(m, b, n, l->attn_norm, l->attn_norm_b);
    if (!tap(b, il, "attn_norm", b->xn, d)) return false;
    /* by wq's type: converters give q, k and v one float type */
    compat_round_input(m, &l->wq, b->xn, (int64_t)n * d);
    const nm_mat *qkv_w[3] = {&l->wq, &l->wk, &l->wv};
    float *const qkv_y[3] = {b->q, k_new, v_new};
    const int64_t qkv_ld[3] = {q_dim, kv_dim, kv_dim};
    nm_matmul_parallel_n(b->pool, 3, qkv_w, b->xn, d, n, qkv_y, qkv_ld);
    rows_ctx qc = {.m = m, .l = l, .b = b, .k_new = k_new, .v_new = v_new};
    nm_pool_for(b->pool, n, ROWS_MIN, qkv_rows, &qc);
    if (!tap(b, il, "Qcur", b->q, q_dim) || !tap(b, il, "Kcur", k_new, kv_dim) ||
        !tap(b, il, "Vcur", v_new, kv_dim))
        return false;
    for (int32_t t = 0; rows && t < n; t++) {
        const nm_kv_view *r = &b->kvs[t];
        const size_t off = (size_t)b->pos[t] * kv_dim, at = (size_t)t * kv_dim;
        for (int64_t i = 0; i < kv_dim; i++)
            if (r->type == NM_KV_F16) {
                ((uint16_t *)r->k)[off + i] = nm_f32_to_f16(k_new[at + i]);
                ((uint16_t *)r->v)[off + i] = nm_f32_to_f16(v_new[at + i]);
            } else {
                ((float *)r->k)[off + i] = k_new[at + i];
                ((float *)r->v)[off + i] = v_new[at + i];
            }
    }
    if (half && !rows) {
        uint16_t *k_half = (uint16_t *)kv->k + past_off, *v_half = (uint16_t *)kv->v + past_off;
        for (int64_t i = 0; i < (int64_t)n * kv_dim; i++) {
            k_half[i] = nm_f32_to_f16(k_new[i]);
            v_half[i] = nm_f32_to_f16(v_new[i]);
        }
    }
    /* rows of the sequence together (the kernel puts the query heads of a
     * KV head from all of them side by side), rows with caches of their own
     * one at a time: a row's bits are the same either way */
    const int32_t per_task = rows ? 1 : nm_attention_rows_per_call(hp->n_head, hp->n_head_kv);
    attention_ctx c = {.hp = hp, .l = l, .b = b, .kv = kv, .rows_per_task = per_task};
    nm_pool_run(b->pool, attention_task, &c, (n + per_task - 1) / per_task);
    if (!tap(b, il, "kqv_out", b->att, q_dim)) return false;
    compat_round_input(m, &l->wo, b->att, (int64_t)n * q_dim);
    matmul(b->pool, &l->wo, b->att, q_dim, n, b->proj, d);
    add_all(m, b, n, b->x, b->proj, l->bo);
    return tap(b, il, "ffn_inp", b->x, d);
}

/* ---- MoE block, around the experts ---- */

bool nm_model_route(const nm_model *m, int32_t il, const nm_model_batch *b) {
    const nm_hparams *hp = &m->hp;
    const nm_layer *l = &m->layers[il];
    const int32_t n = b->n_real;
    const int64_t d = hp->n_embd;
    norm_all(m, b, n, l->ffn_norm, l->ffn_norm_b);
    if (!tap(b, il, "ffn_norm", b->xn, d)) return false;
    if (!nm_model_layer_is_moe(hp, il)) return true; /* no router: its FFN in the residual */
    matmul(b->pool, &l->router, b->xn, d, n, b->router, hp->n_expert);
    for (int32_t t = 0; t < n; t++)
        add_bias(b->router + (size_t)t * hp->n_expert, l->router_b, hp->n_expert);
    return nm_model_route_logits(m, il, b);
}

/* The routing of rows [t0, t1), each with its own row of the scratch. */
static void route_rows(void *p, int64_t t0, int64_t t1) {
    const rows_ctx *c = p;
    const nm_hparams *hp = &c->m->hp;
    const nm_model_batch *b = c->b;
    const int64_t ne = hp->n_expert, k = hp->n_expert_used;
    for (int64_t t = t0; t < t1; t++)
        c->m->route(hp, b->router + t * ne, b->ids + t * k, b->weights + t * k, b->probs + t * ne);
}

bool nm_model_route_logits(const nm_model *m, int32_t il, const nm_model_batch *b) {
    const nm_hparams *hp = &m->hp;
    const nm_layer *l = &m->layers[il];
    const int32_t n = b->n_real;
    const int64_t d = hp->n_embd;
    if (!tap(b, il, "ffn_moe_logits", b->router, hp->n_expert)) return false;
    rows_ctx c = {.m = m, .b = b};
    nm_pool_for(b->pool, n, ROWS_MIN, route_rows, &c);
    compat_round_input(m, &l->experts.gate, b->xn, (int64_t)n * d);
    return true;
}

int64_t nm_model_shexp_scratch(const nm_hparams *hp) {
    int64_t ff = hp->n_ff_shexp;
    if (hp->n_layer_dense_lead > 0 && hp->n_ff > ff) ff = hp->n_ff;
    return ff > 0 ? 2 * ff + hp->n_embd + 1 : 0;
}

/* out[n][d] = down(silu(gate xn) * up xn) over the real rows, in the
 * batch's shexp scratch ([n][ff] gate, [n][ff] up, then out). */
static float *swiglu_ffn(const nm_model *m, const nm_mat *w_gate, const nm_mat *w_up,
                         const nm_mat *w_down, const nm_model_batch *b) {
    const int64_t d = m->hp.n_embd, ff = w_gate->n, n = b->n_real;
    float *gate = b->shexp, *up = gate + n * ff, *out = up + n * ff;
    const nm_mat *gu_w[2] = {w_gate, w_up};
    float *const gu_y[2] = {gate, up};
    const int64_t gu_ld[2] = {ff, ff};
    nm_matmul_parallel_n(b->pool, 2, gu_w, b->xn, d, n, gu_y, gu_ld);
    nm_swiglu_forward(gate, up, gate, n * ff);
    compat_round_input(m, w_down, gate, n * ff);
    matmul(b->pool, w_down, gate, ff, n, out, d);
    return out;
}

/* out[n][d] *= sigmoid(gate_inp . xn) over the real rows, the gate's
 * logits in the scratch after out. */
static void scale_by_shexp_gate(const nm_model *m, const nm_layer *l, const nm_model_batch *b,
                                float *out) {
    const int64_t d = m->hp.n_embd, n = b->n_real;
    float *g = out + n * d; /* [n] the gate's logit */
    matmul(b->pool, &l->shexp_gate_inp, b->xn, d, n, g, 1);
    for (int64_t t = 0; t < n; t++) {
        const float s = 1.0f / (1.0f + expf(-g[t]));
        for (int64_t i = 0; i < d; i++)
            out[t * d + i] *= s;
    }
}

/* proj += sigmoid(gate_inp . xn) * down(silu(gate xn) * up xn) over the real
 * rows (no sigmoid when the architecture's shared experts are ungated), or
 * proj += done when a device computed it: the shared expert, in the order
 * llama.cpp adds it (routed experts' sum, then the shared output, then the
 * residual). */
static bool shared_expert(const nm_model *m, const nm_layer *l, int32_t il, const nm_model_batch *b,
                          const float *done) {
    const int64_t d = m->hp.n_embd, n = b->n_real;
    const float *out = done;
    if (!done) {
        float *own = swiglu_ffn(m, &l->shexp_gate, &l->shexp_up, &l->shexp_down, b);
        if (l->shexp_gate_inp.data) scale_by_shexp_gate(m, l, b, own);
        out = own;
    }
    if (!tap(b, il, "ffn_shexp_out", out, d)) return false;
    add_all(m, b, (int32_t)n, b->proj, out, NULL);
    return true;
}

bool nm_model_ffn_residual(const nm_model *m, int32_t il, const nm_model_batch *b,
                           const float *shexp) {
    const int64_t d = m->hp.n_embd;
    const nm_layer *l = &m->layers[il];
    if (!nm_model_layer_is_moe(&m->hp, il)) {
        float *out = swiglu_ffn(m, &l->ffn_gate, &l->ffn_up, &l->ffn_down, b);
        if (!tap(b, il, "ffn_out", out, d)) return false;
        add_all(m, b, b->n_real, b->x, out, NULL);
        return tap(b, il, "l_out", b->x, d);
    }
    if (!tap(b, il, "ffn_moe_out", b->proj, d)) return false;
    NM_ASSERT(!shexp || l->shexp_gate.data);
    if (l->shexp_gate.data && !shared_expert(m, l, il, b, shexp)) return false;
    add_all(m, b, b->n_real, b->x, b->proj, NULL);
    return tap(b, il, "l_out", b->x, d);
}

const nm_expert_weights *nm_model_moe_experts(const nm_model *m, int32_t moe_layer) {
    NM_ASSERT(moe_layer >= 0 && moe_layer < nm_model_n_moe_layers(&m->hp));
    return &m->layers[moe_layer + m->hp.n_layer_dense_lead].experts;
}

/* ---- output head ---- */

bool nm_model_output(const nm_model *m, const nm_model_batch *b, int32_t first, float *logits) {
    const nm_hparams *hp = &m->hp;
    const int32_t n = b->n_real;
    const int64_t d = hp->n_embd;
    NM_ASSERT(first >= 0 && first < n);
    float *xn = b->xn + (size_t)first * d;
    for (int32_t t = first; t < n; t++)
        nm_model_norm(hp, b->x + t * d, m->output_norm, m->output_norm_b, b->xn + t * d, d);
    /* the tap sees the rows asked for, not n_real */
    if (b->tap && !b->tap(b->tap_ctx, -1, "result_norm", xn, n - first, d)) return false;
    compat_round_input(m, &m->output, xn, (int64_t)(n - first) * d);
    matmul(b->pool, &m->output, xn, d, n - first, logits, hp->n_vocab);
    for (int32_t t = 0; t < n - first; t++)
        add_bias(logits + (size_t)t * hp->n_vocab, m->output_b, hp->n_vocab);
    return !b->tap || b->tap(b->tap_ctx, -1, "result_output", logits, n - first, hp->n_vocab);
}
