/* npumoe quantize: a quantised copy of a GGUF model (library: quant/), with
 * one progress line per tensor and a summary on stderr. */
#include "cli.h"

#include "quant/quant.h"
#include "tensor/tensor.h"
#include "threads/threads.h"

#include <inttypes.h>
#include <stdio.h>

static const double MIB = 1024.0 * 1024.0;

static void report_tensor(void *ctx, const nm_quant_progress *p) {
    (void)ctx;
    const nm_gguf_tensor *t = p->tensor;
    const nm_quant_choice *c = p->choice;
    char shape[96];
    int len = snprintf(shape, sizeof shape, "[%" PRId64, t->ne[0]);
    for (uint32_t d = 1; d < t->n_dims && len > 0 && (size_t)len < sizeof shape; d++)
        len += snprintf(shape + len, sizeof shape - (size_t)len, ", %" PRId64, t->ne[d]);
    if (len > 0 && (size_t)len < sizeof shape)
        snprintf(shape + len, sizeof shape - (size_t)len, "]");
    fprintf(stderr, "[%4" PRIu64 "/%4" PRIu64 "] %-34.*s %-18s %5s -> %-5s %8.3f -> %8.3f MiB",
            p->index + 1, p->n_tensors, (int)t->name.len, t->name.ptr, shape,
            nm_dtype_name(t->type), nm_dtype_name(c->type), (double)t->n_bytes / MIB,
            (double)p->out_bytes / MIB);
    if (c->eligible && c->type != c->wanted) {
        const nm_dtype_traits *tr = nm_dtype_traits_of(c->wanted);
        fprintf(stderr, "  (fallback: %s needs rows of a multiple of %u, these have %" PRId64 ")",
                nm_dtype_name(c->wanted), tr->block_size, t->ne[0]);
    } else if (!c->eligible) {
        fprintf(stderr, "  (kept)");
    }
    fputc('\n', stderr);
}

int cmd_quantize(const cli_options *o) {
    if (!o->output) return fail("quantize needs -o OUT.gguf%s%s", "", "");
    if (!o->quant_type)
        return fail("quantize needs --type TYPE (see npumoe quantize --help)%s%s", "", "");
    nm_error err = {0};
    nm_quant_params p = nm_quant_default_params();
    if (nm_quant_kind_parse(o->quant_type, &p.kind, &err) != NM_OK) return fail_err(&err);
    p.n_threads = o->threads ? o->threads : nm_cpu_count();
    p.progress = report_tensor;
    nm_quant_summary s;
    const double t0 = now_s();
    if (nm_quantize_file(o->model, o->output, &p, &s, &err) != NM_OK) return fail_err(&err);
    const double bits = s.n_elements ? 8.0 * (double)s.out_data_bytes / (double)s.n_elements : 0;
    fprintf(stderr,
            "quantize: %s (%s, general.file_type %u) -> %s: %" PRIu64 " tensors, %" PRIu64
            " converted, %" PRIu64 " kept as they are; %" PRIu64
            " fell back to another type (row length)\n",
            o->model, nm_quant_kind_name(p.kind), nm_quant_file_type(p.kind), o->output,
            s.n_tensors, s.n_converted, s.n_tensors - s.n_converted, s.n_fallback);
    fprintf(stderr,
            "quantize: tensor data %.2f MiB -> %.2f MiB (%.2f bits per weight), file %.2f MiB, "
            "%.2f s with %d threads\n",
            (double)s.in_data_bytes / MIB, (double)s.out_data_bytes / MIB, bits,
            (double)s.out_file_bytes / MIB, now_s() - t0, p.n_threads);
    return 0;
}
