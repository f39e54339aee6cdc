/* npumoe quantize: a quantised copy of a GGUF model (library: quant/), with
 * one progress line per tensor and a summary on stderr. */
#include "cli.h"

#include <inttypes.h>
#include <stdio.h>

static const double MIB = 1024.0 * 1024.0;

static void report_tensor(void *ctx, const nm_quantize_progress *p) {
    (void)ctx;
    char shape[96];
    int len = snprintf(shape, sizeof shape, "[%" PRId64, p->ne[0]);
    for (uint32_t d = 1; d < p->n_dims && len > 0 && (size_t)len < sizeof shape; d++)
        len += snprintf(shape + len, sizeof shape - (size_t)len, ", %" PRId64, p->ne[d]);
    if (len > 0 && (size_t)len < sizeof shape)
        snprintf(shape + len, sizeof shape - (size_t)len, "]");
    fprintf(stderr, "[%4" PRIu64 "/%4" PRIu64 "] %-34.*s %-18s %5s -> %-5s %8.3f -> %8.3f MiB",
            p->index + 1, p->n_tensors, (int)p->name_len, p->name, shape, p->type_in, p->type_out,
            (double)p->in_bytes / MIB, (double)p->out_bytes / MIB);
    if (p->fell_back) {
        fprintf(stderr, "  (fallback: %s needs rows of a multiple of %u, these have %" PRId64 ")",
                p->type_wanted, p->wanted_block, p->ne[0]);
    } else if (!p->eligible) {
        fprintf(stderr, "  (kept)");
    }
    fputc('\n', stderr);
}

int cmd_quantize(const cli_options *o) {
    if (!o->output) return fail("quantize needs -o OUT.gguf%s%s", "", "");
    if (!o->quant_type)
        return fail("quantize needs --type TYPE (see npumoe quantize --help)%s%s", "", "");
    nm_error err = {0};
    nm_quantize_params p = nm_quantize_default_params();
    p.type = o->quant_type;
    p.n_threads = o->threads;
    p.progress = report_tensor;
    nm_quantize_summary s;
    const double t0 = now_s();
    if (nm_quantize(o->model, o->output, &p, &s, &err) != NM_OK) return fail_err(&err);
    const double bits = s.n_elements ? 8.0 * (double)s.out_data_bytes / (double)s.n_elements : 0;
    fprintf(stderr,
            "quantize: %s (%s, general.file_type %u) -> %s: %" PRIu64 " tensors, %" PRIu64
            " converted, %" PRIu64 " kept as they are; %" PRIu64
            " fell back to another type (row length)\n",
            o->model, s.type, s.file_type, o->output, s.n_tensors, s.n_converted,
            s.n_tensors - s.n_converted, s.n_fallback);
    fprintf(stderr,
            "quantize: tensor data %.2f MiB -> %.2f MiB (%.2f bits per weight), file %.2f MiB, "
            "%.2f s with %d threads\n",
            (double)s.in_data_bytes / MIB, (double)s.out_data_bytes / MIB, bits,
            (double)s.out_file_bytes / MIB, now_s() - t0, s.n_threads);
    return 0;
}
