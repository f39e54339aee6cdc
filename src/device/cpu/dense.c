/* The `cpu` device's dense-part graphs (NM_GRAPH_DENSE): the blocks of an
 * nm_dense_spec with the host's kernels, in the order the host's own layer
 * (model/layer.c) calls them, so the outputs and the K/V are the host's bit
 * for bit whatever the thread counts. The graph's K/V live in buffers of
 * its own, as on an accelerator. Queueing and fences are cpu.c's. */
#include "cpu-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

struct nm_cpu_dense {
    nm_dense_spec spec; /* the weights and vectors stay the host's */
    int64_t q_dim, kv_dim;
    size_t kv_elem; /* bytes of one K or V element: 4 (F32) or 2 (F16) */
    bool round_qkv; /* round the projections' input to F16 (compat, F16 wq) */
    bool round_o;   /* round the output projection's input (compat, F16 wo) */
    int32_t pos;    /* the launch's first position */
    float *x;       /* [rows][d_model] input, written by the host */
    float *x_out;   /* [rows][d_model] x after attention */
    float *xn;      /* [rows][d_model] its ffn norm */
    float *logits;  /* [rows][n_expert] */
    float *sh_gate; /* [rows][n_ff_shexp] the shared expert's gate, then its SwiGLU */
    float *sh_up;   /* [rows][n_ff_shexp] */
    float *sh_out;  /* [rows][d_model] its output, gated */
    float *sh_g;    /* [rows] its gate's logit */
    float *a;       /* [rows][d_model] the attention norm's output */
    float *q;       /* [rows][q_dim] */
    float *att;     /* [rows][q_dim] */
    float *proj;    /* [rows][d_model] */
    float *stage;   /* F16 cache: [2][rows][kv_dim] new K, V in F32; else NULL */
    void *k;        /* [n_pos][kv_dim] of kv_type */
    void *v;        /* [n_pos][kv_dim] of kv_type */
    float *scores;  /* [n_threads][n_pos] attention scratch */
    size_t bytes;
};

/* norm(x) * w + b over n values by the spec's norm. */
static void norm(const nm_dense_spec *s, const float *x, const float *w, const float *b, float *y,
                 int64_t n) {
    nm_norm_bias_forward(s->norm == NM_DENSE_NORM_LAYER, x, w, b, y, n, s->norm_eps);
}

static void add_bias(float *y, const float *b, int64_t n) {
    if (b)
        for (int64_t i = 0; i < n; i++)
            y[i] += b[i];
}

static void round_f16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = nm_f16_to_f32(nm_f32_to_f16(x[i]));
}

/* Row t's new keys and values in F32: in the cache (F32) or the stage. */
static float *new_k(const nm_cpu_dense *g, int32_t t) {
    if (g->stage) return g->stage + (size_t)t * g->kv_dim;
    return (float *)g->k + (size_t)(g->pos + t) * g->kv_dim;
}

static float *new_v(const nm_cpu_dense *g, int32_t t) {
    if (g->stage) return g->stage + ((size_t)g->spec.rows + t) * g->kv_dim;
    return (float *)g->v + (size_t)(g->pos + t) * g->kv_dim;
}

static void attn_norm_task(void *p, int t, int thread) {
    (void)thread;
    const nm_cpu_dense *g = p;
    const nm_dense_spec *s = &g->spec;
    float *a = g->a + (size_t)t * s->d_model;
    norm(s, g->x + (size_t)t * s->d_model, s->attn_norm, s->attn_norm_b, a, s->d_model);
    if (g->round_qkv) round_f16(a, s->d_model);
}

/* Biases, q/k norms and RoPE of row t, then its K/V into an F16 cache. */
static void qk_task(void *p, int t, int thread) {
    (void)thread;
    const nm_cpu_dense *g = p;
    const nm_dense_spec *s = &g->spec;
    const int hd = s->head_dim;
    float *qt = g->q + (size_t)t * g->q_dim, *kt = new_k(g, t), *vt = new_v(g, t);
    add_bias(qt, s->bq, g->q_dim);
    add_bias(kt, s->bk, g->kv_dim);
    add_bias(vt, s->bv, g->kv_dim);
    if (s->qk_norm != NM_DENSE_QK_NONE)
        nm_qk_norm_forward(qt, kt, s->n_head, s->n_head_kv, hd, s->q_norm, s->k_norm,
                           s->qk_norm == NM_DENSE_QK_HEAD, s->norm_eps);
    const bool neox = s->rope == NM_DENSE_ROPE_NEOX;
    const int32_t pos = g->pos + t;
    nm_rope_forward(qt, s->n_head, hd, s->n_rot, pos, s->rope_freq_base, neox, s->rope_factors,
                    s->rope_attn_factor);
    nm_rope_forward(kt, s->n_head_kv, hd, s->n_rot, pos, s->rope_freq_base, neox, s->rope_factors,
                    s->rope_attn_factor);
    if (g->stage) {
        uint16_t *kh = (uint16_t *)g->k + (size_t)pos * g->kv_dim;
        uint16_t *vh = (uint16_t *)g->v + (size_t)pos * g->kv_dim;
        for (int64_t i = 0; i < g->kv_dim; i++) {
            kh[i] = nm_f32_to_f16(kt[i]);
            vh[i] = nm_f32_to_f16(vt[i]);
        }
    }
}

static void attention_task(void *p, int task, int thread) {
    const nm_cpu_dense *g = p;
    const nm_dense_spec *s = &g->spec;
    float *scores = g->scores + (size_t)thread * (size_t)s->n_pos;
    const int32_t per = nm_attention_rows_per_call(s->n_head, s->n_head_kv);
    const int32_t t0 = task * per;
    const int32_t n = s->rows - t0 < per ? s->rows - t0 : per;
    const float *qt = g->q + (size_t)t0 * g->q_dim;
    float *out = g->att + (size_t)t0 * g->q_dim;
    int32_t kv0[NM_ATTENTION_ROWS_MAX] = {0}, n_kv[NM_ATTENTION_ROWS_MAX];
    for (int32_t r = 0; r < n; r++)
        n_kv[r] = g->pos + t0 + r + 1;
    if (s->kv_type == NM_KV_F16)
        nm_attention_rows_f16_forward(qt, g->q_dim, g->k, g->v, g->kv_dim, kv0, n_kv, n, s->n_head,
                                      s->n_head_kv, s->head_dim, s->attn_scale, NULL, out, g->q_dim,
                                      scores);
    else
        nm_attention_rows_forward(qt, g->q_dim, g->k, g->v, g->kv_dim, kv0, n_kv, n, s->n_head,
                                  s->n_head_kv, s->head_dim, s->attn_scale, NULL, out, g->q_dim,
                                  scores);
    if (g->round_o) round_f16(out, (int64_t)n * g->q_dim);
}

/* x_out = x + (Wo o + bo), and its ffn norm. */
static void residual_task(void *p, int t, int thread) {
    (void)thread;
    const nm_cpu_dense *g = p;
    const nm_dense_spec *s = &g->spec;
    const int64_t d = s->d_model;
    const size_t off = (size_t)t * (size_t)d;
    float *proj = g->proj + off, *x_out = g->x_out + off;
    add_bias(proj, s->bo, d);
    for (int64_t i = 0; i < d; i++)
        x_out[i] = g->x[off + i] + proj[i];
    norm(s, x_out, s->ffn_norm, s->ffn_norm_b, g->xn + off, d);
}

/* Row t's shared expert output scaled by sigmoid of its gate's logit. */
static void shexp_gate_task(void *p, int t, int thread) {
    (void)thread;
    const nm_cpu_dense *g = p;
    const int64_t d = g->spec.d_model;
    const float s = 1.0f / (1.0f + expf(-g->sh_g[t]));
    for (int64_t i = 0; i < d; i++)
        g->sh_out[(size_t)t * d + i] *= s;
}

/* The shared expert on xn, as the host's (model/layer.c: shared_expert). */
static void shared_expert(nm_cpu_dense *g, nm_pool *pool) {
    const nm_dense_spec *s = &g->spec;
    const int32_t n = s->rows;
    const int64_t d = s->d_model, ff = s->n_ff_shexp;
    const nm_mat *gu_w[2] = {&s->shexp_gate, &s->shexp_up};
    float *const gu_y[2] = {g->sh_gate, g->sh_up};
    const int64_t gu_ld[2] = {ff, ff};
    nm_matmul_parallel_n(pool, 2, gu_w, g->xn, d, n, gu_y, gu_ld);
    nm_swiglu_forward(g->sh_gate, g->sh_up, g->sh_gate, (int64_t)n * ff);
    nm_matmul_parallel(pool, &s->shexp_down, g->sh_gate, ff, n, g->sh_out, d);
    if (!s->shexp_gate_inp.data) return;
    nm_matmul_parallel(pool, &s->shexp_gate_inp, g->xn, d, n, g->sh_g, 1);
    nm_pool_run(pool, shexp_gate_task, g, n);
}

void nm_cpu_dense_run(nm_cpu_dense *g, nm_pool *pool) {
    const nm_dense_spec *s = &g->spec;
    const int32_t n = s->rows;
    const int64_t d = s->d_model;
    nm_pool_run(pool, attn_norm_task, g, n);
    const nm_mat *qkv_w[3] = {&s->wq, &s->wk, &s->wv};
    float *const qkv_y[3] = {g->q, new_k(g, 0), new_v(g, 0)};
    const int64_t qkv_ld[3] = {g->q_dim, g->kv_dim, g->kv_dim};
    nm_matmul_parallel_n(pool, 3, qkv_w, g->a, d, n, qkv_y, qkv_ld);
    nm_pool_run(pool, qk_task, g, n);
    const int32_t per = nm_attention_rows_per_call(s->n_head, s->n_head_kv);
    nm_pool_run(pool, attention_task, g, (n + per - 1) / per);
    nm_matmul_parallel(pool, &s->wo, g->att, g->q_dim, n, g->proj, d);
    nm_pool_run(pool, residual_task, g, n);
    nm_matmul_parallel(pool, &s->router, g->xn, d, n, g->logits, s->n_expert);
    if (s->n_ff_shexp > 0) shared_expert(g, pool);
}

void nm_cpu_dense_set_pos(nm_cpu_dense *g, int32_t pos) {
    NM_ASSERT(pos >= 0 && pos <= g->spec.n_pos - g->spec.rows);
    g->pos = pos;
}

float *nm_cpu_dense_input(nm_cpu_dense *g) { return g->x; }

void nm_cpu_dense_outputs(const nm_cpu_dense *g, nm_dense_outputs *out) {
    *out = (nm_dense_outputs){.x = g->x_out, .xn = g->xn, .logits = g->logits, .shexp = g->sh_out};
}

int32_t nm_cpu_dense_rows(const nm_cpu_dense *g) { return g->spec.rows; }

size_t nm_cpu_dense_bytes(const nm_cpu_dense *g) { return g->bytes; }

void nm_cpu_dense_kv_copy(nm_cpu_dense *g, int32_t pos0, int32_t n, void *k, void *v,
                          bool to_graph) {
    NM_ASSERT(pos0 >= 0 && n >= 0 && pos0 <= g->spec.n_pos - n);
    const size_t off = (size_t)pos0 * (size_t)g->kv_dim * g->kv_elem;
    const size_t bytes = (size_t)n * (size_t)g->kv_dim * g->kv_elem;
    char *gk = (char *)g->k + off, *gv = (char *)g->v + off;
    memcpy(to_graph ? gk : k, to_graph ? k : gk, bytes);
    memcpy(to_graph ? gv : v, to_graph ? v : gv, bytes);
}

void nm_cpu_dense_free(nm_cpu_dense *g) {
    if (!g) return;
    nm_free(g->x);
    nm_free(g->x_out);
    nm_free(g->xn);
    nm_free(g->logits);
    nm_free(g->sh_gate);
    nm_free(g->sh_up);
    nm_free(g->sh_out);
    nm_free(g->sh_g);
    nm_free(g->a);
    nm_free(g->q);
    nm_free(g->att);
    nm_free(g->proj);
    nm_free(g->stage);
    nm_free(g->k);
    nm_free(g->v);
    nm_free(g->scores);
    nm_free(g);
}

/* calloc of n elements of size, counted in g->bytes; NULL on overflow too. */
static void *alloc_counted(nm_cpu_dense *g, size_t n, size_t size) {
    size_t bytes;
    if (!nm_mul_size(n, size, &bytes) || !nm_add_size(g->bytes, bytes, &g->bytes)) return NULL;
    return nm_calloc(n, size);
}

nm_status nm_cpu_dense_new(const nm_dense_spec *spec, int n_threads, nm_cpu_dense **out,
                           nm_error *err) {
    *out = NULL;
    const nm_mat *mats[9] = {&spec->wq,       &spec->wk,         &spec->wv,
                             &spec->wo,       &spec->router,     &spec->shexp_gate,
                             &spec->shexp_up, &spec->shexp_down, &spec->shexp_gate_inp};
    const int n_mats = spec->n_ff_shexp == 0 ? 5 : spec->shexp_gate_inp.data ? 9 : 8;
    for (int i = 0; i < n_mats; i++)
        if (!nm_dtype_is_supported(mats[i]->type))
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "dense graph of layer %d: the cpu device cannot compute %s weights",
                             spec->layer, nm_dtype_name(mats[i]->type));
    nm_cpu_dense *g = nm_calloc(1, sizeof *g);
    if (!g) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a dense graph");
    g->spec = *spec;
    g->q_dim = (int64_t)spec->n_head * spec->head_dim;
    g->kv_dim = (int64_t)spec->n_head_kv * spec->head_dim;
    g->kv_elem = spec->kv_type == NM_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    g->round_qkv = spec->round_f16 && spec->wq.type == NM_DTYPE_F16;
    g->round_o = spec->round_f16 && spec->wo.type == NM_DTYPE_F16;
    const size_t rows = (size_t)spec->rows, d = (size_t)spec->d_model;
    const size_t kv_cells = (size_t)spec->n_pos * (size_t)g->kv_dim;
    g->x = alloc_counted(g, rows * d, sizeof(float));
    g->x_out = alloc_counted(g, rows * d, sizeof(float));
    g->xn = alloc_counted(g, rows * d, sizeof(float));
    g->a = alloc_counted(g, rows * d, sizeof(float));
    g->proj = alloc_counted(g, rows * d, sizeof(float));
    g->logits = alloc_counted(g, rows * (size_t)spec->n_expert, sizeof(float));
    g->q = alloc_counted(g, rows * (size_t)g->q_dim, sizeof(float));
    g->att = alloc_counted(g, rows * (size_t)g->q_dim, sizeof(float));
    g->k = alloc_counted(g, kv_cells, g->kv_elem);
    g->v = alloc_counted(g, kv_cells, g->kv_elem);
    g->scores = alloc_counted(g, (size_t)n_threads * (size_t)spec->n_pos, sizeof(float));
    bool ok = g->x && g->x_out && g->xn && g->a && g->proj && g->logits && g->q && g->att && g->k &&
              g->v && g->scores;
    if (ok && spec->n_ff_shexp > 0) {
        const size_t ff = (size_t)spec->n_ff_shexp;
        g->sh_gate = alloc_counted(g, rows * ff, sizeof(float));
        g->sh_up = alloc_counted(g, rows * ff, sizeof(float));
        g->sh_out = alloc_counted(g, rows * d, sizeof(float));
        g->sh_g = alloc_counted(g, rows, sizeof(float));
        ok = g->sh_gate && g->sh_up && g->sh_out && g->sh_g;
    }
    if (ok && spec->kv_type == NM_KV_F16) {
        g->stage = alloc_counted(g, 2 * rows * (size_t)g->kv_dim, sizeof(float));
        ok = g->stage != NULL;
    }
    if (!ok) {
        const size_t bytes = g->bytes;
        nm_cpu_dense_free(g);
        return nm_errorf(err, NM_ERR_NOMEM,
                         "out of memory for the dense graph of layer %d (%d rows, %d positions, "
                         "%zu bytes)",
                         spec->layer, spec->rows, spec->n_pos, bytes);
    }
    *out = g;
    return NM_OK;
}
