/* The public quantize function (npumoe.h) over quant/: the type by name,
 * progress in public terms (names and shapes, no GGUF structs). */
#include "engine.h"

#include "quant/quant.h"
#include "tensor/tensor.h"

#include <string.h>

nm_quantize_params nm_quantize_default_params(void) {
    return (nm_quantize_params){.type = "q8_0", .n_threads = 0, .progress = NULL};
}

typedef struct relay {
    const nm_quantize_params *params;
} relay;

/* One finished tensor in public terms. */
static void relay_progress(void *ctx, const nm_quant_progress *q) {
    const nm_quantize_params *p = ((const relay *)ctx)->params;
    const nm_gguf_tensor *t = q->tensor;
    nm_quantize_progress out = {
        .index = q->index,
        .n_tensors = q->n_tensors,
        .name = t->name.ptr,
        .name_len = t->name.len,
        .n_dims = t->n_dims,
        .type_in = nm_dtype_name(t->type),
        .type_out = nm_dtype_name(q->choice->type),
        .type_wanted = nm_dtype_name(q->choice->wanted),
        .wanted_block = nm_dtype_traits_of(q->choice->wanted)->block_size,
        .eligible = q->choice->eligible,
        .fell_back = q->choice->eligible && q->choice->type != q->choice->wanted,
        .in_bytes = t->n_bytes,
        .out_bytes = q->out_bytes,
    };
    memcpy(out.ne, t->ne, sizeof out.ne);
    p->progress(p->progress_ctx, &out);
}

nm_status nm_quantize(const char *in_path, const char *out_path, const nm_quantize_params *params,
                      nm_quantize_summary *summary, nm_error *err) {
    const nm_quantize_params p = params ? *params : nm_quantize_default_params();
    nm_quant_params qp = nm_quant_default_params();
    nm_status st = nm_quant_kind_parse(p.type ? p.type : "q8_0", &qp.kind, err);
    if (st != NM_OK) return st;
    qp.n_threads = p.n_threads ? p.n_threads : nm_cpu_count();
    relay r = {&p};
    if (p.progress) {
        qp.progress = relay_progress;
        qp.progress_ctx = &r;
    }
    nm_quantize_summary s = {0};
    st = nm_quantize_file(in_path, out_path, &qp, &s, err);
    s.type = nm_quant_kind_name(qp.kind);
    s.file_type = nm_quant_file_type(qp.kind);
    s.n_threads = qp.n_threads;
    if (st == NM_OK && summary) *summary = s;
    return st;
}
