/* --dump FILE: the tensors the session's tap reports (npumoe.h,
 * nm_session_set_tap), one line each, as llama.cpp's eval-callback tool
 * prints them: where, which, its shape, its sum, and the first values of its
 * first and last rows. Written as every output file is (nm_outfile): the
 * file appears whole at the end, or not at all when the command fails. */
#include "cli.h"

#include <inttypes.h>

enum { DUMP_VALUES = 4 }; /* values shown from the first and the last row */

static void dump_row(FILE *f, const float *row, int64_t n_cols) {
    const int64_t n = n_cols < DUMP_VALUES ? n_cols : DUMP_VALUES;
    for (int64_t j = 0; j < n; j++)
        fprintf(f, " %.6g", row[j]);
    if (n < n_cols) fputs(" ...", f);
}

static bool dump_tensor(void *ctx, int32_t layer, const char *name, const float *values,
                        int32_t n_rows, int64_t n_cols) {
    cli_dump *d = ctx;
    FILE *f = d->out.f;
    double sum = 0;
    for (int64_t i = 0; i < (int64_t)n_rows * n_cols; i++)
        sum += values[i];
    d->n_tensors++;
    fprintf(f, "%-3" PRId32 " %-15s [%" PRId32 " x %" PRId64 "] sum=%.9g first:", layer, name, n_rows,
            n_cols, sum);
    dump_row(f, values, n_cols);
    if (n_rows > 1) {
        fputs(" last:", f);
        dump_row(f, values + (int64_t)(n_rows - 1) * n_cols, n_cols);
    }
    fputc('\n', f);
    return true;
}

nm_status dump_start(nm_session *session, const char *path, cli_dump *d, nm_error *err) {
    *d = (cli_dump){0};
    if (!path) return NM_OK;
    nm_status st = nm_outfile_open(path, &d->out, err);
    if (st != NM_OK) return st;
    d->open = true;
    d->path = path;
    fprintf(d->out.f, "# npumoe --dump: layer (-1: after the last), tensor, [rows x columns], "
                      "sum, first values of the first and the last row\n");
    nm_session_set_tap(session, dump_tensor, d);
    return NM_OK;
}

nm_status dump_finish(nm_session *session, cli_dump *d, nm_status st, nm_error *err) {
    if (!d->open) return st;
    if (session) nm_session_set_tap(session, NULL, NULL);
    d->open = false;
    if (st != NM_OK) {
        nm_outfile_abort(&d->out);
        return st;
    }
    st = nm_outfile_commit(&d->out, err);
    if (st == NM_OK)
        fprintf(stderr, "dump: %" PRIu64 " tensors written to %s\n", d->n_tensors, d->path);
    return st;
}
