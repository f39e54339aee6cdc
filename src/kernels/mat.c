/* Views of weight matrices (one expert's matrix out of a stack) and the
 * expert FFN composed from the matmul and SwiGLU kernels. */
#include "kernels.h"

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
    nm_matmul_forward(&wg, x, ldx, m, gate, ff, 0, ff);
    nm_matmul_forward(&wu, x, ldx, m, up, ff, 0, ff);
    nm_swiglu_forward(gate, up, gate, m * ff);
    nm_matmul_forward(&wd, gate, ff, m, out, ldo, 0, dm);
}
