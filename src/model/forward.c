/* The forward pass shared by the architectures: a batch of tokens goes
 * through every layer at once (attention, then the MoE block grouped by
 * expert), writing K/V into an F32 cache. Buffers are sized once in
 * nm_model_state_new; nm_model_forward does not allocate. */
#include "model.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

struct nm_model_state {
    int32_t n_ctx;
    int32_t n_batch;
    int32_t n_kv; /* cache positions: n_ctx + room for a padded chunk */
    nm_pool *pool;
    size_t n_bytes;
    float *k_cache;                    /* [n_layer][n_kv][n_head_kv * head_dim], F32 cache */
    float *v_cache;                    /* [n_layer][n_kv][n_head_kv * head_dim], F32 cache */
    uint16_t *k_half;                  /* [n_layer][n_kv][n_head_kv * head_dim], F16 cache */
    uint16_t *v_half;                  /* [n_layer][n_kv][n_head_kv * head_dim], F16 cache */
    float *kv_new;                     /* [2][n_batch][n_head_kv * head_dim] F16 cache: new K, V */
    float *x;                          /* [n_batch][n_embd] residual stream       */
    float *xn;                         /* [n_batch][n_embd] normed input of a block */
    float *q;                          /* [n_batch][n_head * head_dim]            */
    float *att;                        /* [n_batch][n_head * head_dim]            */
    float *proj;                       /* [n_batch][n_embd] block output          */
    float *scores;                     /* [n_threads][n_kv] attention scratch     */
    float *router;                     /* [n_batch][n_expert] router logits       */
    float *probs;                      /* [n_expert] routing scratch              */
    int32_t *ids;                      /* [n_batch][k] chosen experts             */
    float *weights;                    /* [n_batch][k] their weights              */
    const nm_expert_weights **experts; /* [n_layer] the layers' expert stacks */
    nm_moe_exec *dense;                /* host MoE: decode, and every batch in dense mode */
    nm_moe_exec *prefill;              /* the static mode's executor, NULL in dense mode  */
    const float *rope_factors;         /* [n_rot / 2] the model's short or long ones, or NULL */
};

static float *alloc_floats(nm_model_state *st, size_t n, bool *ok) {
    size_t bytes;
    if (!nm_mul_size(n, sizeof(float), &bytes)) {
        *ok = false;
        return NULL;
    }
    float *p = nm_calloc(1, bytes);
    if (!p) *ok = false;
    st->n_bytes += bytes;
    return p;
}

nm_status nm_model_state_new(const nm_model *m, const nm_state_params *p, nm_model_state **out,
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
    nm_model_state *st = nm_calloc(1, sizeof *st);
    if (!st) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a session");
    st->n_ctx = n_ctx;
    st->n_batch = n_batch;
    st->n_kv = n_ctx + (p->mode == NM_MODE_DENSE ? 0 : n_batch - 1);
    nm_status s = nm_pool_new(n_threads, &st->pool, err);
    if (s != NM_OK) {
        nm_free(st);
        return s;
    }
    const size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    const size_t nb = (size_t)n_batch, d = (size_t)hp->n_embd, k = (size_t)hp->n_expert_used;
    bool ok = true;
    const size_t n_cache = (size_t)hp->n_layer * (size_t)st->n_kv * kv_dim;
    if (p->kv_type == NM_KV_F16) {
        /* halves: alloc_floats counts 4 bytes per element, so ask for half as many */
        st->k_half = (uint16_t *)alloc_floats(st, (n_cache + 1) / 2, &ok);
        st->v_half = (uint16_t *)alloc_floats(st, (n_cache + 1) / 2, &ok);
        st->kv_new = alloc_floats(st, 2 * nb * kv_dim, &ok);
    } else {
        st->k_cache = alloc_floats(st, n_cache, &ok);
        st->v_cache = alloc_floats(st, n_cache, &ok);
    }
    st->x = alloc_floats(st, nb * d, &ok);
    st->xn = alloc_floats(st, nb * d, &ok);
    st->q = alloc_floats(st, nb * q_dim, &ok);
    st->att = alloc_floats(st, nb * q_dim, &ok);
    st->proj = alloc_floats(st, nb * d, &ok);
    st->scores = alloc_floats(st, (size_t)n_threads * (size_t)st->n_kv, &ok);
    st->router = alloc_floats(st, nb * (size_t)hp->n_expert, &ok);
    st->probs = alloc_floats(st, (size_t)hp->n_expert, &ok);
    st->weights = alloc_floats(st, nb * k, &ok);
    st->ids = nm_calloc(nb * k, sizeof(int32_t));
    st->experts = nm_calloc((size_t)hp->n_layer, sizeof *st->experts);
    if (!st->ids || !st->experts) ok = false;
    if (!ok) {
        nm_model_state_free(st);
        const bool f16 = p->kv_type == NM_KV_F16;
        return nm_errorf(err, NM_ERR_NOMEM,
                         "out of memory for a session of %d positions (KV cache %.1f MiB in %s)",
                         n_ctx, 2.0 * hp->n_layer * n_ctx * kv_dim * (f16 ? 2.0 : 4.0) / 1048576.0,
                         f16 ? "f16" : "f32");
    }
    for (int il = 0; il < hp->n_layer; il++)
        st->experts[il] = &m->layers[il].experts;
    /* llama.cpp and LongRoPE both take the long factors past the original
     * context; a session decides once by its size, as llama.cpp does. */
    st->rope_factors = n_ctx > hp->n_ctx_orig ? m->rope_factors_long : m->rope_factors_short;
    nm_moe_exec_params ep = {.mode = NM_MODE_DENSE,
                             .chunk = n_batch,
                             .n_layer = hp->n_layer,
                             .weights = st->experts,
                             .k = hp->n_expert_used,
                             .n_threads = n_threads};
    s = nm_moe_exec_new(&ep, &st->dense, err);
    if (s == NM_OK && p->mode != NM_MODE_DENSE) {
        ep.mode = p->mode;
        ep.plan = p->plan;
        ep.device = p->device;
        s = nm_moe_exec_new(&ep, &st->prefill, err);
    }
    if (s != NM_OK) {
        nm_model_state_free(st);
        return s;
    }
    *out = st;
    return NM_OK;
}

void nm_model_state_free(nm_model_state *st) {
    if (!st) return;
    nm_pool_free(st->pool);
    nm_free(st->k_cache);
    nm_free(st->v_cache);
    nm_free(st->k_half);
    nm_free(st->v_half);
    nm_free(st->kv_new);
    nm_free(st->x);
    nm_free(st->xn);
    nm_free(st->q);
    nm_free(st->att);
    nm_free(st->proj);
    nm_free(st->scores);
    nm_free(st->router);
    nm_free(st->probs);
    nm_free(st->ids);
    nm_free(st->weights);
    nm_moe_exec_free(st->prefill);
    nm_moe_exec_free(st->dense);
    nm_free(st->experts);
    nm_free(st);
}

int32_t nm_model_state_n_ctx(const nm_model_state *st) { return st->n_ctx; }
int32_t nm_model_state_n_batch(const nm_model_state *st) { return st->n_batch; }
size_t nm_model_state_bytes(const nm_model_state *st) { return st->n_bytes; }
nm_moe_exec *nm_model_state_prefill_exec(nm_model_state *st) { return st->prefill; }
nm_moe_exec *nm_model_state_dense_exec(nm_model_state *st) { return st->dense; }

/* ---- parallel matmul: output columns split into tiles ---- */

typedef struct matmul_ctx {
    const nm_mat *w;
    const float *x;
    int64_t ldx, m;
    float *y;
    int64_t ldy, tile;
} matmul_ctx;

static void matmul_task(void *p, int i, int thread) {
    (void)thread;
    const matmul_ctx *c = p;
    int64_t j0 = (int64_t)i * c->tile, j1 = j0 + c->tile;
    if (j1 > c->w->n) j1 = c->w->n;
    nm_matmul_forward(c->w, c->x, c->ldx, c->m, c->y, c->ldy, j0, j1);
}

/* y[m][N] = x[m][K] W^T over the pool. */
static void matmul(nm_pool *pool, const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                   int64_t ldy) {
    const int64_t n_threads = nm_pool_n_threads(pool);
    /* a multiple of 16 columns, which the quantised kernels compute at once */
    const int64_t tile = ((w->n + 4 * n_threads - 1) / (4 * n_threads) + 15) / 16 * 16;
    matmul_ctx c = {.w = w, .x = x, .ldx = ldx, .m = m, .y = y, .ldy = ldy, .tile = tile};
    nm_pool_run(pool, matmul_task, &c, (int)((w->n + tile - 1) / tile));
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

/* ---- attention block ---- */

typedef struct attention_ctx {
    const nm_hparams *hp;
    nm_model_state *st;
    const float *k_cache, *v_cache;  /* this layer's, F32 cache */
    const uint16_t *k_half, *v_half; /* this layer's, F16 cache */
    int32_t n_past;
} attention_ctx;

static void attention_task(void *p, int i, int thread) {
    const attention_ctx *c = p;
    const nm_hparams *hp = c->hp;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    float *scores = c->st->scores + (size_t)thread * c->st->n_kv;
    if (c->k_half)
        nm_attention_f16_forward(c->st->q + i * q_dim, c->k_half, c->v_half, kv_dim,
                                 c->n_past + i + 1, hp->n_head, hp->n_head_kv, hp->head_dim, scale,
                                 c->st->att + i * q_dim, scores);
    else
        nm_attention_forward(c->st->q + i * q_dim, c->k_cache, c->v_cache, kv_dim,
                             c->n_past + i + 1, hp->n_head, hp->n_head_kv, hp->head_dim, scale,
                             c->st->att + i * q_dim, scores);
}

/* x += Wo · attention(rope(norm_h(Wq xn)), rope(norm_h(Wk xn)), Wv xn), xn = rmsnorm(x). */
static void attention_block(const nm_model *m, nm_model_state *st, int il, int32_t n,
                            int32_t n_past) {
    const nm_hparams *hp = &m->hp;
    const nm_layer *l = &m->layers[il];
    const int64_t d = hp->n_embd, hd = hp->head_dim;
    const int64_t q_dim = (int64_t)hp->n_head * hd, kv_dim = (int64_t)hp->n_head_kv * hd;
    const size_t layer_off = (size_t)il * st->n_kv * kv_dim, past_off = (size_t)n_past * kv_dim;
    /* [n][kv_dim]: straight into an F32 cache; staged, then converted, for F16 */
    float *k_new = st->k_half ? st->kv_new : st->k_cache + layer_off + past_off;
    float *v_new =
        st->k_half ? st->kv_new + (size_t)st->n_batch * kv_dim : st->v_cache + layer_off + past_off;

    for (int32_t t = 0; t < n; t++)
        nm_model_norm(hp, st->x + t * d, l->attn_norm, l->attn_norm_b, st->xn + t * d, d);
    /* by wq's type: converters give q, k and v one float type */
    compat_round_input(m, &l->wq, st->xn, (int64_t)n * d);
    matmul(st->pool, &l->wq, st->xn, d, n, st->q, q_dim);
    matmul(st->pool, &l->wk, st->xn, d, n, k_new, kv_dim);
    matmul(st->pool, &l->wv, st->xn, d, n, v_new, kv_dim);
    for (int32_t t = 0; t < n; t++) {
        float *qt = st->q + t * q_dim, *kt = k_new + t * kv_dim, *vt = v_new + t * kv_dim;
        add_bias(qt, l->bq, q_dim);
        add_bias(kt, l->bk, kv_dim);
        add_bias(vt, l->bv, kv_dim);
        if (hp->qk_norm == NM_QK_NORM_HEAD) {
            for (int h = 0; h < hp->n_head; h++)
                nm_rmsnorm_forward(qt + h * hd, l->q_norm, qt + h * hd, hd, hp->rms_eps);
            for (int h = 0; h < hp->n_head_kv; h++)
                nm_rmsnorm_forward(kt + h * hd, l->k_norm, kt + h * hd, hd, hp->rms_eps);
        } else if (hp->qk_norm == NM_QK_NORM_WHOLE) {
            nm_rmsnorm_forward(qt, l->q_norm, qt, q_dim, hp->rms_eps);
            nm_rmsnorm_forward(kt, l->k_norm, kt, kv_dim, hp->rms_eps);
        }
        nm_model_rope(hp, st->rope_factors, qt, hp->n_head, n_past + t);
        nm_model_rope(hp, st->rope_factors, kt, hp->n_head_kv, n_past + t);
    }
    attention_ctx c = {.hp = hp, .st = st, .n_past = n_past};
    if (st->k_half) {
        for (int64_t i = 0; i < (int64_t)n * kv_dim; i++) {
            st->k_half[layer_off + past_off + (size_t)i] = nm_f32_to_f16(k_new[i]);
            st->v_half[layer_off + past_off + (size_t)i] = nm_f32_to_f16(v_new[i]);
        }
        c.k_half = st->k_half + layer_off;
        c.v_half = st->v_half + layer_off;
    } else {
        c.k_cache = st->k_cache + layer_off;
        c.v_cache = st->v_cache + layer_off;
    }
    nm_pool_run(st->pool, attention_task, &c, n);
    compat_round_input(m, &l->wo, st->att, (int64_t)n * q_dim);
    matmul(st->pool, &l->wo, st->att, q_dim, n, st->proj, d);
    for (int32_t t = 0; t < n; t++)
        add_bias(st->proj + t * d, l->bo, d);
    for (int64_t i = 0; i < (int64_t)n * d; i++)
        st->x[i] += st->proj[i];
}

/* ---- MoE block ---- */

/* x += MoE(rmsnorm(x)) for the n real rows (padding rows get nothing),
 * routed by the architecture, run by the executor ex. */
static void moe_block(const nm_model *m, nm_model_state *st, nm_moe_exec *ex, int il, int32_t n) {
    const nm_hparams *hp = &m->hp;
    const nm_layer *l = &m->layers[il];
    const int64_t d = hp->n_embd, k = hp->n_expert_used;
    for (int32_t t = 0; t < n; t++)
        nm_model_norm(hp, st->x + t * d, l->ffn_norm, l->ffn_norm_b, st->xn + t * d, d);
    matmul(st->pool, &l->router, st->xn, d, n, st->router, hp->n_expert);
    for (int32_t t = 0; t < n; t++)
        m->route(hp, st->router + (size_t)t * hp->n_expert, st->ids + t * k, st->weights + t * k,
                 st->probs);
    compat_round_input(m, &l->experts.gate, st->xn, (int64_t)n * d);
    nm_moe_exec_layer(ex, st->pool, il, st->x, st->xn, n, st->ids, st->weights, st->proj);
    for (int64_t i = 0; i < (int64_t)n * d; i++)
        st->x[i] += st->proj[i];
}

nm_status nm_model_forward(const nm_model *m, nm_model_state *st, const int32_t *ids, int32_t n,
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
    const int64_t d = hp->n_embd;
    /* A prompt batch in a static mode is a chunk of exactly n_batch rows:
     * the rows past n repeat the last token at the following positions.
     * They are computed (a static graph would), attend only to earlier
     * rows, are never routed, and their K/V land past n_past + n, where the
     * next batch overwrites them: no real row sees them. */
    nm_moe_exec *ex = st->prefill && n > 1 ? st->prefill : st->dense;
    const int32_t n_rows = ex == st->prefill ? st->n_batch : n;
    for (int32_t t = 0; t < n_rows; t++)
        nm_dequantize_row((nm_dtype)m->tok_embd.type,
                          (const uint8_t *)m->tok_embd.data +
                              (size_t)ids[t < n ? t : n - 1] * m->tok_embd.row_bytes,
                          st->x + t * d, d);
    for (int il = 0; il < hp->n_layer; il++) {
        attention_block(m, st, il, n_rows, n_past);
        moe_block(m, st, ex, il, n);
    }
    /* a device that failed (lost) under the chunk's graphs: the chunk's
     * results are void, and the device's message says why */
    nm_status dst = nm_moe_exec_check(ex, err);
    if (dst) return dst;
    if (!logits) return NM_OK;
    const int32_t first = all_logits ? 0 : n - 1;
    for (int32_t t = first; t < n; t++)
        nm_model_norm(hp, st->x + t * d, m->output_norm, m->output_norm_b, st->xn + t * d, d);
    compat_round_input(m, &m->output, st->xn + (size_t)first * d, (int64_t)(n - first) * d);
    matmul(st->pool, &m->output, st->xn + (size_t)first * d, d, n - first, logits, hp->n_vocab);
    for (int32_t t = 0; t < n - first; t++)
        add_bias(logits + (size_t)t * hp->n_vocab, m->output_b, hp->n_vocab);
    return NM_OK;
}
