/* The driver of npumoe quantize: reads a GGUF file, converts the tensors
 * nm_quant_choose picks (rows in parallel on the thread pool), copies the
 * rest and every key, and streams the result, one tensor in memory at a
 * time, to a temporary name that is renamed at the end. Not here: the type rules (mix.c), the block
 * formats (tensor/quantize.c). */
#include "quant.h"

#include "base/base.h"
#include "tensor/tensor.h"
#include "threads/threads.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define QUANTIZATION_VERSION 2 /* ggml's GGML_QNT_VERSION */

nm_quant_params nm_quant_default_params(void) {
    return (nm_quant_params){.kind = NM_QUANT_Q8_0, .n_threads = 1};
}

/* ---- converting one tensor on the pool -------------------------------------- */

typedef struct task_result {
    bool failed;
    int64_t row;
    nm_error err;
} task_result;

typedef struct convert_job {
    const nm_gguf_tensor *t;
    uint32_t type;          /* output type */
    int64_t n_cols, n_rows; /* ne[0], ne[1] * ne[2] * ne[3] */
    int64_t rows_per_task;
    size_t in_row_bytes, out_row_bytes;
    uint8_t *out;         /* [n_rows][out_row_bytes] */
    float *scratch;       /* [n_threads][n_cols] */
    task_result *results; /* [n_tasks] */
} convert_job;

/* F16 is the fallback of rows no block type divides; values it cannot hold
 * are refused like those a quantised type cannot hold. */
static nm_status to_f16(const float *x, uint8_t *dst, int64_t n, nm_error *err) {
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return nm_errorf(err, NM_ERR_INVALID_ARG, "element %lld is %s", (long long)i,
                             isnan(x[i]) ? "NaN" : "infinite");
        uint16_t h = nm_f32_to_f16(x[i]);
        if (!isfinite(nm_f16_to_f32(h))) {
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "element %lld (%g) is beyond f16's largest magnitude 65504",
                             (long long)i, (double)x[i]);
        }
        memcpy(dst + 2 * i, &h, 2);
    }
    return NM_OK;
}

static void convert_task(void *ctx, int task, int thread) {
    convert_job *job = ctx;
    task_result *res = &job->results[task];
    float *row = job->scratch + (size_t)thread * (size_t)job->n_cols;
    const uint8_t *in = job->t->data;
    const int64_t r0 = (int64_t)task * job->rows_per_task;
    const int64_t r1 =
        r0 + job->rows_per_task < job->n_rows ? r0 + job->rows_per_task : job->n_rows;
    for (int64_t r = r0; r < r1; r++) {
        nm_dequantize_row((nm_dtype)job->t->type, in + (size_t)r * job->in_row_bytes, row,
                          job->n_cols);
        uint8_t *dst = job->out + (size_t)r * job->out_row_bytes;
        nm_status st = job->type == NM_DTYPE_F16
                           ? to_f16(row, dst, job->n_cols, &res->err)
                           : nm_quantize_row((nm_dtype)job->type, row, dst, job->n_cols, &res->err);
        if (st != NM_OK) {
            res->failed = true;
            res->row = r;
            return;
        }
    }
}

static bool is_float_type(uint32_t type) {
    return type == NM_DTYPE_F32 || type == NM_DTYPE_F16 || type == NM_DTYPE_BF16;
}

/* Converts t to type into a new buffer *out of *n_bytes (caller frees). */
static nm_status convert_tensor(nm_pool *pool, const nm_gguf_tensor *t, uint32_t type,
                                uint8_t **out, size_t *n_bytes, nm_error *err) {
    *out = NULL;
    convert_job job = {.t = t, .type = type, .n_cols = t->ne[0]};
    job.n_rows = t->ne[1] * t->ne[2] * t->ne[3]; /* validated by the reader */
    size_t total;
    if (!nm_dtype_row_bytes(t->type, job.n_cols, &job.in_row_bytes) ||
        !nm_dtype_row_bytes(type, job.n_cols, &job.out_row_bytes) ||
        !nm_mul_size(job.out_row_bytes, (size_t)job.n_rows, &total)) {
        return nm_errorf(err, NM_ERR_INVALID_ARG, "rows of %lld elements do not fit %s",
                         (long long)job.n_cols, nm_dtype_name(type));
    }
    /* enough tasks to balance the threads, each at least ~16K elements */
    const int n_threads = nm_pool_n_threads(pool);
    int64_t per = (job.n_rows + 8 * n_threads - 1) / (8 * n_threads);
    int64_t min_rows = (16384 + job.n_cols - 1) / job.n_cols;
    if (per < min_rows) per = min_rows;
    if (per < 1) per = 1;
    job.rows_per_task = per;
    const int64_t n_tasks = (job.n_rows + per - 1) / per;
    NM_ASSERT(n_tasks <= 8 * (int64_t)n_threads);

    size_t scratch_bytes;
    job.out = nm_malloc(total ? total : 1);
    job.results = nm_calloc((size_t)n_tasks, sizeof *job.results);
    job.scratch = nm_mul_size((size_t)n_threads * sizeof(float), (size_t)job.n_cols, &scratch_bytes)
                      ? nm_malloc(scratch_bytes)
                      : NULL;
    nm_status st = NM_OK;
    if (!job.out || !job.results || !job.scratch) {
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for %zu bytes of %s", total,
                       nm_dtype_name(type));
    } else {
        nm_pool_run(pool, convert_task, &job, (int)n_tasks);
        /* tasks cover rows in order: the first failed task holds the first bad row */
        for (int64_t i = 0; i < n_tasks; i++) {
            const task_result *res = &job.results[i];
            if (!res->failed) continue;
            st = res->err.status;
            if (!err) break;
            *err = res->err;
            if (t->ne[2] > 1) {
                nm_error_prefix(err, "row %lld of matrix %lld", (long long)(res->row % t->ne[1]),
                                (long long)(res->row / t->ne[1]));
            } else {
                nm_error_prefix(err, "row %lld", (long long)res->row);
            }
            nm_error_prefix(err, "cannot make %s", nm_dtype_name(type));
            break;
        }
    }
    nm_free(job.results);
    nm_free(job.scratch);
    if (st != NM_OK) {
        nm_free(job.out);
        return st;
    }
    *out = job.out;
    *n_bytes = total;
    return NM_OK;
}

/* ---- the file --------------------------------------------------------------- */

static char *cstr(nm_gguf_str s) {
    char *c = nm_malloc((size_t)s.len + 1);
    if (c) {
        memcpy(c, s.ptr, (size_t)s.len);
        c[s.len] = '\0';
    }
    return c;
}

/* Copies every key, replacing general.file_type and
 * general.quantization_version in place (appended when absent). */
static nm_status copy_keys(const nm_gguf *g, nm_quant_kind kind, nm_gguf_writer *w, nm_error *err) {
    bool have_ftype = false, have_version = false;
    for (uint64_t i = 0; i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        char *key = cstr(kv->key);
        if (!key) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a key");
        nm_status st;
        if (strcmp(key, "general.file_type") == 0) {
            st = nm_gguf_writer_set_u32(w, key, nm_quant_file_type(kind));
            have_ftype = true;
        } else if (strcmp(key, "general.quantization_version") == 0) {
            st = nm_gguf_writer_set_u32(w, key, QUANTIZATION_VERSION);
            have_version = true;
        } else {
            st = nm_gguf_writer_set_value(w, key, &kv->value);
        }
        if (st != NM_OK) {
            nm_errorf(err, st, "cannot copy key '%s' (%s)", key, nm_status_str(st));
            nm_free(key);
            return st;
        }
        nm_free(key);
    }
    nm_status st = NM_OK;
    if (!have_ftype) st = nm_gguf_writer_set_u32(w, "general.file_type", nm_quant_file_type(kind));
    if (st == NM_OK && !have_version)
        st = nm_gguf_writer_set_u32(w, "general.quantization_version", QUANTIZATION_VERSION);
    if (st != NM_OK) return nm_errorf(err, st, "cannot add the quantisation keys");
    return NM_OK;
}

/* Everything that can be refused before any work. */
static nm_status check_input(const char *in_path, const char *out_path, const nm_gguf *g,
                             const nm_quant_choice *choices, nm_error *err) {
    const nm_gguf_value *split = nm_gguf_find(g, "split.count");
    if (split) {
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s is one part of a split model: merge it first "
                         "(llama-gguf-split --merge)",
                         in_path);
    }
    if (nm_gguf_n_tensors(g) == 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "%s has no tensors (a vocabulary-only file?): nothing to quantize",
                         in_path);
    for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        if (choices[i].convert && !is_float_type(t->type)) {
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "tensor %.*s is %s: only f32, f16 and bf16 tensors are quantised "
                             "(requantising a quantised tensor loses accuracy; start from the "
                             "f16/bf16 file)",
                             (int)t->name.len, t->name.ptr, nm_dtype_name(t->type));
        }
    }
    struct stat si, so;
    if (stat(out_path, &so) == 0) {
        if (S_ISDIR(so.st_mode)) return nm_errorf(err, NM_ERR_IO, "%s: is a directory", out_path);
        if (stat(in_path, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
            return nm_errorf(err, NM_ERR_INVALID_ARG, "%s: the output would replace the input",
                             out_path);
        }
    }
    return NM_OK;
}

/* Every tensor declared with its output type and shape; the data comes
 * when the file is streamed (give_tensor). */
static nm_status declare_tensors(const nm_gguf *g, const nm_quant_choice *choices,
                                 nm_gguf_writer *w, nm_error *err) {
    for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        char *name = cstr(t->name);
        nm_status st =
            name ? nm_gguf_writer_add_tensor_info(w, name, choices[i].type, t->n_dims, t->ne)
                 : NM_ERR_NOMEM;
        nm_free(name);
        if (st != NM_OK)
            return nm_errorf(err, st, "tensor %.*s: cannot add it to the output (%s)",
                             (int)t->name.len, t->name.ptr, nm_status_str(st));
    }
    return NM_OK;
}

/* The tensors' data as the writer streams the file: one converted tensor
 * in memory at a time; the input's pages leave memory once read. */
typedef struct tensor_feed {
    const nm_gguf *g;
    const nm_quant_choice *choices;
    const nm_quant_params *p;
    nm_pool *pool;
    nm_quant_summary *sum;
    uint8_t *owned; /* the last converted tensor */
} tensor_feed;

static nm_status give_tensor(void *ctx, size_t i, const void **data, nm_error *err) {
    tensor_feed *f = ctx;
    const nm_gguf_tensor *t = nm_gguf_tensor_at(f->g, i);
    const nm_quant_choice *c = &f->choices[i];
    nm_free(f->owned);
    f->owned = NULL;
    size_t n_bytes = (size_t)t->n_bytes;
    *data = t->data;
    if (c->convert) {
        nm_status st = convert_tensor(f->pool, t, c->type, &f->owned, &n_bytes, err);
        if (st != NM_OK) return nm_error_prefix(err, "tensor %.*s", (int)t->name.len, t->name.ptr);
        *data = f->owned;
        nm_gguf_drop_pages(f->g, t->data, (size_t)t->n_bytes);
    }
    nm_quant_summary *sum = f->sum;
    sum->n_elements += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    sum->in_data_bytes += t->n_bytes;
    sum->out_data_bytes += n_bytes;
    sum->n_converted += c->convert;
    sum->n_fallback += c->eligible && c->type != c->wanted;
    if (f->p->progress) {
        nm_quant_progress pr = {.index = i,
                                .n_tensors = nm_gguf_n_tensors(f->g),
                                .tensor = t,
                                .choice = c,
                                .out_bytes = n_bytes};
        f->p->progress(f->p->progress_ctx, &pr);
    }
    return NM_OK;
}

nm_status nm_quantize_file(const char *in_path, const char *out_path, const nm_quant_params *p,
                           nm_quant_summary *summary, nm_error *err) {
    NM_ASSERT(in_path && out_path && p && (unsigned)p->kind < NM_QUANT_KIND_COUNT &&
              p->n_threads >= 1);
    nm_quant_summary sum = {0};
    nm_gguf *g = NULL;
    nm_quant_choice *choices = NULL;
    nm_gguf_writer *w = NULL;
    nm_pool *pool = NULL;
    nm_outfile out = {0};

    nm_status st = nm_gguf_open(in_path, &g, err);
    if (st == NM_OK) {
        sum.n_tensors = nm_gguf_n_tensors(g);
        choices = nm_calloc(sum.n_tensors ? (size_t)sum.n_tensors : 1, sizeof *choices);
        if (!choices) st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for the tensor table");
    }
    if (st == NM_OK) st = nm_quant_choose(g, p->kind, choices, err);
    if (st == NM_OK) st = check_input(in_path, out_path, g, choices, err);
    /* fail now, not after the work, when the output cannot be written */
    if (st == NM_OK) st = nm_outfile_open(out_path, &out, err);
    if (st == NM_OK) {
        w = nm_gguf_writer_new();
        if (!w) st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for the GGUF writer");
    }
    if (st == NM_OK) st = copy_keys(g, p->kind, w, err);
    if (st == NM_OK) st = nm_pool_new(p->n_threads, &pool, err);
    if (st == NM_OK) st = declare_tensors(g, choices, w, err);
    if (st == NM_OK) {
        tensor_feed feed = {.g = g, .choices = choices, .p = p, .pool = pool, .sum = &sum};
        st =
            nm_gguf_writer_stream(w, out.f, out_path, give_tensor, &feed, &sum.out_file_bytes, err);
        nm_free(feed.owned);
    }
    if (st == NM_OK)
        st = nm_outfile_commit(&out, err);
    else
        nm_outfile_abort(&out); /* the target is untouched */
    nm_pool_free(pool);
    nm_gguf_writer_free(w);
    nm_free(choices);
    nm_gguf_close(g);
    if (summary) *summary = sum;
    return st;
}
