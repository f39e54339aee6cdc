/* JSON files: reading one whole (any kind of file, up to the parser's size
 * limit) for nm_json_parse_file, and replacing one atomically for
 * nm_json_write_file. */
#include "json.h"

#include "base/base.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* ---- reading ------------------------------------------------------------- */

/* Reads the whole stream, up to one byte past the parser's limit (so that
 * an over-long file is reported as such). */
static nm_status read_all(FILE *f, char **out, size_t *n_out, nm_error *err) {
    size_t cap = 0, n = 0;
    struct stat st;
    if (fstat(fileno(f), &st) == 0) {
        if (S_ISDIR(st.st_mode)) return nm_errorf(err, NM_ERR_IO, "is a directory");
        if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > NM_JSON_MAX_BYTES)
            return nm_errorf(err, NM_ERR_CAPACITY,
                             "the file is %llu bytes, more than the limit of %zu (%zu MiB)",
                             (unsigned long long)st.st_size, NM_JSON_MAX_BYTES,
                             NM_JSON_MAX_BYTES >> 20);
        if (S_ISREG(st.st_mode) && st.st_size > 0) cap = (size_t)st.st_size + 1;
    }
    if (cap < 4096) cap = 4096;
    char *buf = nm_malloc(cap);
    if (!buf) return nm_errorf(err, NM_ERR_NOMEM, "out of memory reading the file");
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n > NM_JSON_MAX_BYTES || got == 0) break;
        if (n == cap) {
            size_t grown = cap > NM_JSON_MAX_BYTES / 2 ? NM_JSON_MAX_BYTES + 1 : cap * 2;
            char *bigger = nm_realloc(buf, grown);
            if (!bigger) {
                nm_free(buf);
                return nm_errorf(err, NM_ERR_NOMEM, "out of memory reading the file");
            }
            buf = bigger;
            cap = grown;
        }
    }
    if (ferror(f)) {
        nm_free(buf);
        return nm_errorf(err, NM_ERR_IO, "cannot read: %s", strerror(errno));
    }
    *out = buf;
    *n_out = n;
    return NM_OK;
}

nm_status nm_json_parse_file(const char *path, nm_json **out, nm_error *err) {
    NM_ASSERT(path && out);
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        nm_errorf(err, NM_ERR_IO, "cannot open: %s", strerror(errno));
        return nm_error_prefix(err, "%s", path);
    }
    char *text = NULL;
    size_t n = 0;
    nm_status st = read_all(f, &text, &n, err);
    fclose(f);
    if (st == NM_OK) {
        st = nm_json_parse(text, n, out, err);
        nm_free(text);
    }
    if (st != NM_OK) {
        nm_error_prefix(err, "%s", path);
        return st;
    }
    return NM_OK;
}

/* ---- replacing a file ----------------------------------------------------- */

nm_status nm_json_write_file(const char *path, const char *text, size_t n_bytes, nm_error *err) {
    NM_ASSERT(path && (text || n_bytes == 0));
    nm_outfile o;
    nm_status st = nm_outfile_open(path, &o, err);
    if (st == NM_OK) st = nm_outfile_write(&o, text, n_bytes, err);
    if (st == NM_OK) return nm_outfile_commit(&o, err);
    nm_outfile_abort(&o);
    return st;
}
