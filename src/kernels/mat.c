/* Views of weight matrices (one expert's matrix out of a stack), the
 * expert FFN composed from the matmul and SwiGLU kernels, and a matmul
 * split over a thread pool. */
#include "kernels-impl.h"

nm_mat nm_expert_mat(const nm_mat *first, size_t stride, int32_t e) {
    nm_mat m = *first;
    m.data = (const uint8_t *)first->data + (size_t)e * stride;
    return m;
}

void nm_expert_ffn_forward(const nm_expert_weights *w, int32_t e, const float *x, int64_t ldx,
                           int64_t m, float *gate, float *up, float *out, int64_t ldo) {
    const int64_t ff = w->gate.n, dm = w->down.n;
    const nm_mat wg = nm_expert_mat(&w->gate, w->gate_stride, e);
    const nm_mat wu = nm_expert_mat(&w->up, w->up_stride, e);
    const nm_mat wd = nm_expert_mat(&w->down, w->down_stride, e);
    nm_matmul_swiglu_forward(&wg, &wu, x, ldx, m, gate, ff, up, ff, 0, ff);
    nm_matmul_forward(&wd, gate, ff, m, out, ldo, 0, dm);
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
    const nm_mat *w;
    const float *x;
    int64_t ldx, m;
    float *y;
    int64_t ldy, tile;
} matmul_ctx;

static void matmul_task(void *p, int i, int thread) {
    (void)thread;
    const matmul_ctx *c = p;
    const int64_t j0 = (int64_t)i * c->tile;
    const int64_t j1 = j0 + c->tile < c->w->n ? j0 + c->tile : c->w->n;
    nm_matmul_forward(c->w, c->x, c->ldx, c->m, c->y, c->ldy, j0, j1);
}

void nm_matmul_parallel(nm_pool *pool, const nm_mat *w, const float *x, int64_t ldx, int64_t m,
                        float *y, int64_t ldy) {
    const int64_t n_threads = nm_pool_n_threads(pool);
    /* about 4 tiles per thread, so uneven tiles balance */
    const int64_t tile = ((w->n + 4 * n_threads - 1) / (4 * n_threads) + 15) / 16 * 16;
    matmul_ctx c = {.w = w, .x = x, .ldx = ldx, .m = m, .y = y, .ldy = ldy, .tile = tile};
    nm_pool_run(pool, matmul_task, &c, (int)((w->n + tile - 1) / tile));
}
