/* Weights prepared for the kernels once, at load: the variant in use decides
 * which matrices it reads faster from a layout of its own (nm_mat_repack_wanted)
 * or from anonymous memory in the file's (nm_mat_copy_wanted), and this file
 * copies them there, so that no caller names a variant or a layout. Not the
 * layouts themselves: those are the variants' (x86/). */
#include "kernels-impl.h"

#include "threads/threads.h"

#include <string.h>
#include <sys/mman.h>

/* Rows copied at a time: whole groups of 16 of about this many bytes, so
 * that the source pages of them can be released soon after they are read
 * (the peak stays near the final size, not that plus the largest tensor),
 * and the threads share the work evenly. */
enum { PART_BYTES = 4 << 20 };

/* One part of the copy: rows of one matrix, where they go, and whether in
 * the variant's layout or as they are. */
typedef struct part {
    nm_mat rows;
    uint8_t *dst;
    bool repack;
} part;

/* The copies: sizes and parts are counted while buf is NULL, then laid out
 * in buf. */
typedef struct copy_ctx {
    uint8_t *buf;
    size_t used;
    int32_t n_tensors;
    int32_t n_as_is;
    bool repack; /* whether copies in the variant's layout are made */
    bool as_is;  /* whether copies in the file's layout are made */
    part *parts; /* [n_parts] when buf is set */
    size_t n_parts;
    nm_release_fn release;
    void *release_ctx;
} copy_ctx;

/* A matrix (count 1) or a stack of count matrices stride bytes apart: its
 * copy in the variant's layout or in the file's, if the variant wants one. */
static void copy_item(copy_ctx *c, const nm_prepare_item *it) {
    nm_mat *first = it->mat;
    const bool repack = c->repack && nm_mat_repack_wanted(first);
    if (!repack && !(c->as_is && nm_mat_copy_wanted(first))) return;
    const size_t mat_bytes = (size_t)first->n * first->row_bytes;
    const size_t stride = it->count == 1 ? mat_bytes : it->stride;
    NM_ASSERT(stride == mat_bytes && it->count >= 1);
    const size_t bytes = stride * (size_t)it->count;
    uint8_t *dst = c->buf ? c->buf + c->used : NULL;
    c->used += (bytes + 63) / 64 * 64; /* each copy starts on a cache line */
    c->n_tensors++;
    c->n_as_is += !repack;
    int64_t rows = (int64_t)(PART_BYTES / first->row_bytes) / 16 * 16;
    if (rows < 16) rows = 16;
    for (int32_t e = 0; e < it->count; e++) {
        const nm_mat mat = nm_expert_mat(first, stride, e);
        for (int64_t r0 = 0; r0 < mat.n;) {
            /* the last part takes the rows after the last whole part */
            const int64_t r1 = mat.n - r0 < 2 * rows ? mat.n : r0 + rows;
            if (dst) {
                part *p = &c->parts[c->n_parts];
                p->rows = mat;
                p->rows.data = (const uint8_t *)mat.data + (size_t)r0 * mat.row_bytes;
                p->rows.n = r1 - r0;
                p->dst = dst + (size_t)e * stride + (size_t)r0 * mat.row_bytes;
                p->repack = repack;
            }
            c->n_parts++;
            r0 = r1;
        }
    }
    if (!dst) return;
    /* the parts above hold the file's rows; from now on the matrix is the
     * copy, as nm_mat_repack describes it or as the file lays it out */
    first->data = dst;
    if (repack) first->layout = NM_LAYOUT_PANEL16;
}

static void copy_all(copy_ctx *c, const nm_prepare_item *items, size_t n_items) {
    for (size_t i = 0; i < n_items; i++)
        copy_item(c, &items[i]);
}

static void copy_task(void *ctx, int i, int thread) {
    (void)thread;
    const copy_ctx *c = ctx;
    const part *p = &c->parts[i];
    if (p->repack)
        nm_mat_repack(&p->rows, p->dst);
    else
        memcpy(p->dst, p->rows.data, (size_t)p->rows.n * p->rows.row_bytes);
    if (c->release) c->release(c->release_ctx, p->rows.data, (size_t)p->rows.n * p->rows.row_bytes);
}

nm_status nm_kernels_prepare(nm_prepare_item *items, size_t n_items, uint64_t budget,
                             nm_release_fn release, void *release_ctx, nm_prepared *out,
                             nm_error *err) {
    NM_ASSERT(out && (items || n_items == 0));
    *out = (nm_prepared){.isa = nm_kernels_active()};
    /* all the copies; if they do not fit, the repacked ones alone; if those
     * do not either, none */
    copy_ctx c = {.repack = true, .as_is = true};
    copy_all(&c, items, n_items);
    const size_t wanted = c.used;
    if (c.used > budget && c.n_as_is > 0) {
        c = (copy_ctx){.repack = true};
        copy_all(&c, items, n_items);
    }
    if (c.used > budget) c = (copy_ctx){0};
    const size_t unfit = wanted - c.used;
    if (c.used == 0) {
        out->unfit_bytes = unfit;
        return NM_OK;
    }
    const bool repack = c.repack, as_is = c.as_is;
    if (c.n_parts > INT32_MAX)
        return nm_errorf(err, NM_ERR_UNSUPPORTED, "%zu parts of weights to repack", c.n_parts);
    void *buf = mmap(NULL, c.used, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return nm_errorf(err, NM_ERR_NOMEM,
                         "out of memory for the weights in the kernels' layout (%.1f MiB); "
                         "--no-repack computes from the file's",
                         (double)c.used / 1048576.0);
    /* huge pages where the system gives them: a fault per 2 MiB instead of
     * per 4 KiB as the copy is written (a bare test here, 2.8 GiB: 0.9-1.1 s
     * with, 1.2-1.3 s without, after a first run of 2.6-3.3 s either way);
     * advice, so a failure is harmless */
    (void)madvise(buf, c.used, MADV_HUGEPAGE);
    part *parts = nm_calloc(c.n_parts, sizeof *parts);
    nm_pool *pool = NULL;
    nm_status st = parts ? nm_pool_new(nm_cpu_count(), &pool, err)
                         : nm_errorf(err, NM_ERR_NOMEM, "out of memory for the repacking");
    if (st == NM_OK) {
        const size_t bytes = c.used;
        c = (copy_ctx){.buf = buf,
                       .repack = repack,
                       .as_is = as_is,
                       .parts = parts,
                       .release = release,
                       .release_ctx = release_ctx};
        copy_all(&c, items, n_items);
        NM_ASSERT(c.used == bytes);
        nm_pool_run(pool, copy_task, &c, (int)c.n_parts);
        (void)mprotect(buf, c.used, PROT_READ); /* read-only like a file; advice too */
        out->data = buf;
        out->bytes = c.used;
        out->n_tensors = c.n_tensors;
        out->n_as_is = c.n_as_is;
        out->unfit_bytes = unfit;
    } else {
        munmap(buf, c.used);
    }
    nm_pool_free(pool);
    nm_free(parts);
    return st;
}

void nm_prepared_free(nm_prepared *prepared) {
    if (prepared && prepared->data) munmap(prepared->data, prepared->bytes);
    if (prepared) *prepared = (nm_prepared){0};
}
