/* JSON files: reading one whole (any kind of file, up to the parser's size
 * limit) for nm_json_parse_file, and replacing one atomically for
 * nm_json_write_file. */
#include "json.h"

#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* ---- atomic replacement of a file ---------------------------------------- */

static nm_status io_fail(const char *path, const char *what, int errnum, nm_error *err) {
    return nm_errorf(err, NM_ERR_IO, "%s: %s: %s", path, what, strerror(errnum));
}

/* Writes all of text to fd, then forces it to disk. 0 or an errno. */
static int write_all(int fd, const char *text, size_t n_bytes) {
    while (n_bytes > 0) {
        ssize_t got = write(fd, text, n_bytes);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return got < 0 ? errno : EIO;
        text += got;
        n_bytes -= (size_t)got;
    }
    return fsync(fd) == 0 ? 0 : errno;
}

nm_status nm_json_write_file(const char *path, const char *text, size_t n_bytes, nm_error *err) {
    NM_ASSERT(path && (text || n_bytes == 0));
    size_t tmp_bytes;
    if (!nm_add_size(strlen(path), 64, &tmp_bytes))
        return nm_errorf(err, NM_ERR_NOMEM, "%s: path too long", path);
    char *tmp = nm_malloc(tmp_bytes);
    if (!tmp) return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory", path);
    /* A name no other writer picks: the process and the time, retried if
     * taken (O_EXCL) so a stale temporary file is never reused. */
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        snprintf(tmp, tmp_bytes, "%s.%ld.%" PRId64 ".tmp", path, (long)getpid(),
                 nm_time_ns() + attempt);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        nm_status st = io_fail(path, "cannot create a temporary file beside it", errno, err);
        nm_free(tmp);
        return st;
    }
    /* Keep the permissions of the file being replaced. */
    struct stat old;
    if (stat(path, &old) == 0 && S_ISREG(old.st_mode)) (void)fchmod(fd, old.st_mode & 07777);
    int errnum = write_all(fd, text, n_bytes);
    if (close(fd) != 0 && errnum == 0) errnum = errno;
    nm_status st = NM_OK;
    if (errnum != 0) {
        st = io_fail(path, "cannot write", errnum, err);
    } else if (rename(tmp, path) != 0) {
        st = io_fail(path, "cannot replace", errno, err);
    }
    if (st != NM_OK) unlink(tmp);
    nm_free(tmp);
    return st;
}
