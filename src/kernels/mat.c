/* Views of weight matrices (one expert's matrix out of a stack), the
 * expert FFN composed from the matmul and SwiGLU kernels, and a matmul
 * split over a thread pool. */
#include "kernels-impl.h"

#include <pthread.h>
#include <stdint.h>

nm_mat nm_expert_mat(const nm_mat *first, size_t stride, int32_t e) {
    nm_mat m = *first;
    m.data = (const uint8_t *)first->data + (size_t)e * stride;
    return m;
}

bool nm_expert_weights_plain(const nm_expert_weights *w) {
    return !w->gate_b && !w->up_b && !w->down_b && w->glu == NM_GLU_SWIGLU;
}

void nm_expert_glu_forward(const nm_expert_weights *w, int32_t e, float *gate, const float *up,
                           int64_t ld, int64_t m, int64_t j0, int64_t j1) {
    const int64_t ff = w->gate.n, n = j1 - j0;
    const float *gb = w->gate_b ? w->gate_b + (size_t)e * (size_t)ff + j0 : NULL;
    const float *ub = w->up_b ? w->up_b + (size_t)e * (size_t)ff + j0 : NULL;
    float biased[64];
    for (int64_t r = 0; r < m; r++) {
        float *g = gate + r * ld + j0;
        const float *u = up + r * ld + j0;
        /* the biases are added first, as ggml adds them before the op */
        for (int64_t c = 0; c < n; c += 64) {
            const int64_t len = n - c < 64 ? n - c : 64;
            const float *uc = u + c;
            if (gb)
                for (int64_t i = 0; i < len; i++)
                    g[c + i] += gb[c + i];
            if (ub) {
                for (int64_t i = 0; i < len; i++)
                    biased[i] = u[c + i] + ub[c + i];
                uc = biased;
            }
            if (w->glu == NM_GLU_SWIGLU_OAI)
                nm_swiglu_oai_forward(g + c, uc, g + c, len, w->glu_alpha, w->glu_limit);
            else
                nm_swiglu_forward(g + c, uc, g + c, len);
        }
    }
}

void nm_expert_down_bias(const nm_expert_weights *w, int32_t e, float *out, int64_t ldo, int64_t m,
                         int64_t j0, int64_t j1) {
    if (!w->down_b) return;
    const float *b = w->down_b + (size_t)e * (size_t)w->down.n;
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = j0; j < j1; j++)
            out[r * ldo + j] += b[j];
}

void nm_expert_ffn_forward(const nm_expert_weights *w, int32_t e, const float *x, int64_t ldx,
                           int64_t m, float *gate, float *up, float *out, int64_t ldo) {
    const int64_t ff = w->gate.n, dm = w->down.n;
    const nm_mat wg = nm_expert_mat(&w->gate, w->gate_stride, e);
    const nm_mat wu = nm_expert_mat(&w->up, w->up_stride, e);
    const nm_mat wd = nm_expert_mat(&w->down, w->down_stride, e);
    if (nm_expert_weights_plain(w)) {
        nm_matmul_swiglu_forward(&wg, &wu, x, ldx, m, gate, ff, up, ff, 0, ff);
    } else {
        nm_matmul_forward(&wg, x, ldx, m, gate, ff, 0, ff);
        nm_matmul_forward(&wu, x, ldx, m, up, ff, 0, ff);
        nm_expert_glu_forward(w, e, gate, up, ff, m, 0, ff);
    }
    nm_matmul_forward(&wd, gate, ff, m, out, ldo, 0, dm);
    nm_expert_down_bias(w, e, out, ldo, m, 0, dm);
}

void nm_matmul_swiglu_by(nm_matmul_fn fn, const nm_mat *wg, const nm_mat *wu, const float *x,
                         int64_t ldx, int64_t m, float *h, int64_t ldh, float *u, int64_t ldu,
                         int64_t j0, int64_t j1) {
    fn(wg, x, ldx, m, h, ldh, j0, j1);
    fn(wu, x, ldx, m, u, ldu, j0, j1);
    for (int64_t i = 0; i < m; i++)
        nm_swiglu_forward(h + i * ldh + j0, u + i * ldu + j0, h + i * ldh + j0, j1 - j0);
}

typedef struct matmul_ctx {
    const nm_mat *const *w;
    const float *x;
    int64_t ldx, m;
    float *const *y;
    const int64_t *ldy;
    int64_t tile;
    int first_task[NM_MATMUL_MAX_N + 1]; /* matrix i's tasks: [first_task[i], first_task[i + 1]) */
} matmul_ctx;

static void matmul_task(void *p, int i, int thread) {
    (void)thread;
    const matmul_ctx *c = p;
    int a = 0;
    while (i >= c->first_task[a + 1])
        a++;
    const nm_mat *w = c->w[a];
    const int64_t j0 = (int64_t)(i - c->first_task[a]) * c->tile;
    const int64_t j1 = j0 + c->tile < w->n ? j0 + c->tile : w->n;
    nm_matmul_forward(w, c->x, c->ldx, c->m, c->y[a], c->ldy[a], j0, j1);
}

void nm_matmul_parallel_n(nm_pool *pool, int n_w, const nm_mat *const *w, const float *x,
                          int64_t ldx, int64_t m, float *const *y, const int64_t *ldy) {
    NM_ASSERT(n_w >= 1 && n_w <= NM_MATMUL_MAX_N);
    const int64_t n_threads = nm_pool_n_threads(pool);
    int64_t n_all = 0;
    for (int a = 0; a < n_w; a++) {
        NM_ASSERT(w[a]->k == w[0]->k);
        n_all += w[a]->n;
    }
    /* about 2 tiles per thread, so that a thread slowed down is helped;
     * not more: each tile quantises or rounds all of x again (one 512 x
     * 2048 x 4096 Q8_0 product took 10% longer in 4 a thread than in 2,
     * docs/PERFORMANCE.md) */
    const int64_t tile = ((n_all + 2 * n_threads - 1) / (2 * n_threads) + 15) / 16 * 16;
    matmul_ctx c = {.w = w, .x = x, .ldx = ldx, .m = m, .y = y, .ldy = ldy, .tile = tile};
    for (int a = 0; a < n_w; a++)
        c.first_task[a + 1] = c.first_task[a] + (int)((w[a]->n + tile - 1) / tile);
    nm_pool_run(pool, matmul_task, &c, c.first_task[n_w]);
}

void nm_matmul_parallel(nm_pool *pool, const nm_mat *w, const float *x, int64_t ldx, int64_t m,
                        float *y, int64_t ldy) {
    nm_matmul_parallel_n(pool, 1, &w, x, ldx, m, &y, &ldy);
}

/* ---- per-thread kernel scratch ---- */

typedef struct scratch {
    void *block; /* from nm_malloc, freed with nm_free */
    void *aligned;
    size_t n_bytes; /* usable from aligned */
} scratch;

static _Thread_local scratch thread_scratch;
static pthread_key_t scratch_key; /* its destructor frees an exiting thread's block */
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_ok;

static void scratch_release(void *p) {
    scratch *s = p;
    nm_free(s->block);
    *s = (scratch){0};
}

static void scratch_key_create(void) {
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_release) == 0;
}

void *nm_kernel_scratch(size_t n_bytes) {
    scratch *s = &thread_scratch;
    if (s->n_bytes >= n_bytes) return s->aligned;
    pthread_once(&scratch_once, scratch_key_create);
    /* without the key an exiting thread would leak its block */
    if (!scratch_key_ok || n_bytes > SIZE_MAX - 63) return NULL;
    void *block = nm_malloc(n_bytes + 63);
    if (!block) return NULL;
    if (!s->block && pthread_setspecific(scratch_key, s) != 0) {
        nm_free(block);
        return NULL;
    }
    nm_free(s->block);
    s->block = block;
    s->aligned = (void *)(((uintptr_t)block + 63) & ~(uintptr_t)63);
    s->n_bytes = n_bytes;
    return s->aligned;
}
