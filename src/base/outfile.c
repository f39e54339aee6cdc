/* Files the library writes for a command (models, calibrations, profiles,
 * plans, reports): where the bytes go is decided and checked before the
 * work, and nothing but the target ever changes. Not here: what is written. */
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *copy_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *c = nm_malloc(n);
    if (c) memcpy(c, s, n);
    return c;
}

/* The file that writing to path reaches, and how to write it: *direct for a
 * character device or a FIFO, a temporary file and a rename otherwise.
 * *target is nm_malloc'd. */
static nm_status resolve(const char *path, char **target, bool *direct, mode_t *keep_mode,
                         nm_error *err) {
    *target = NULL;
    *direct = false;
    *keep_mode = 0;
    if (!path[0]) return nm_errorf(err, NM_ERR_INVALID_ARG, "the output path is empty");
    struct stat ls, st;
    if (lstat(path, &ls) != 0) {
        if (errno != ENOENT)
            return nm_errorf(err, NM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        *target = copy_str(path); /* a new name: the directory decides, when creating */
        return *target ? NM_OK : nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory", path);
    }
    if (S_ISLNK(ls.st_mode)) {
        /* write where the link points, never replace the link itself; a link
         * to nothing is refused, as cp does */
        if (stat(path, &st) != 0)
            return nm_errorf(err, NM_ERR_IO,
                             "%s: is a symbolic link to a missing file (%s): not writing "
                             "through it",
                             path, strerror(errno));
        char *real = realpath(path, NULL);
        if (!real)
            return nm_errorf(err, NM_ERR_IO, "%s: cannot resolve the symbolic link: %s", path,
                             strerror(errno));
        *target = copy_str(real);
        free(real);
        if (!*target) return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory", path);
    } else {
        st = ls;
        *target = copy_str(path);
        if (!*target) return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory", path);
    }
    if (S_ISREG(st.st_mode)) {
        *keep_mode = st.st_mode & 07777;
        return NM_OK;
    }
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
        *direct = true;
        return NM_OK;
    }
    const char *what = S_ISDIR(st.st_mode)    ? "is a directory"
                       : S_ISBLK(st.st_mode)  ? "is a block device"
                       : S_ISSOCK(st.st_mode) ? "is a socket"
                                              : "is not a regular file";
    nm_free(*target);
    *target = NULL;
    return nm_errorf(err, NM_ERR_IO,
                     "%s: %s: an output must be a regular file (or a new name), a character "
                     "device or a FIFO",
                     path, what);
}

nm_status nm_outfile_open(const char *path, nm_outfile *o, nm_error *err) {
    NM_ASSERT(path && o);
    memset(o, 0, sizeof *o);
    bool direct;
    mode_t keep_mode;
    nm_status st = resolve(path, &o->target, &direct, &keep_mode, err);
    if (st != NM_OK) return st;
    o->path = copy_str(path);
    if (!o->path) {
        nm_outfile_abort(o);
        return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory", path);
    }
    int fd = -1;
    if (direct) {
        fd = open(o->target, O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            nm_outfile_abort(o);
            return nm_errorf(err, NM_ERR_IO, "%s: cannot open for writing: %s", path, strerror(e));
        }
    } else {
        size_t tmp_bytes;
        if (!nm_add_size(strlen(o->target), 64, &tmp_bytes) || !(o->tmp = nm_malloc(tmp_bytes))) {
            nm_outfile_abort(o);
            return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory", path);
        }
        /* beside the target, so the rename stays on one file system; a name
         * no other writer picks (O_EXCL), so a stale file is never reused */
        for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
            snprintf(o->tmp, tmp_bytes, "%s.%ld.%" PRId64 ".tmp", o->target, (long)getpid(),
                     nm_time_ns() + attempt);
            fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            if (fd < 0 && errno != EEXIST) break;
        }
        if (fd < 0) {
            int e = errno;
            nm_free(o->tmp);
            o->tmp = NULL;
            nm_outfile_abort(o);
            return nm_errorf(err, NM_ERR_IO, "%s: cannot create: %s", path, strerror(e));
        }
        if (keep_mode) (void)fchmod(fd, keep_mode); /* the permissions of the file replaced */
    }
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        nm_outfile_abort(o);
        return nm_errorf(err, NM_ERR_NOMEM, "%s: cannot open a stream: %s", path, strerror(e));
    }
    return NM_OK;
}

nm_status nm_outfile_check(const char *path, nm_error *err) {
    NM_ASSERT(path);
    char *target = NULL;
    bool direct;
    mode_t keep_mode;
    nm_status st = resolve(path, &target, &direct, &keep_mode, err);
    if (st != NM_OK) return st;
    if (direct) {
        /* opening a FIFO for writing would wait for a reader */
        if (access(target, W_OK) != 0)
            st =
                nm_errorf(err, NM_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
        nm_free(target);
        return st;
    }
    nm_free(target);
    nm_outfile o;
    st = nm_outfile_open(path, &o, err);
    if (st == NM_OK) nm_outfile_abort(&o);
    return st;
}

nm_status nm_outfile_write(nm_outfile *o, const void *data, size_t n_bytes, nm_error *err) {
    NM_ASSERT(o && o->f && (data || n_bytes == 0));
    if (fwrite(data, 1, n_bytes, o->f) != n_bytes)
        return nm_errorf(err, NM_ERR_IO, "%s: cannot write: %s", o->path, strerror(errno));
    return NM_OK;
}

nm_status nm_outfile_commit(nm_outfile *o, nm_error *err) {
    NM_ASSERT(o && o->f);
    int e = 0;
    if (fflush(o->f) != 0 || ferror(o->f)) e = errno ? errno : EIO;
    /* a regular file reaches the disk before it replaces the old one */
    if (!e && o->tmp && fsync(fileno(o->f)) != 0) e = errno;
    if (fclose(o->f) != 0 && !e) e = errno;
    o->f = NULL;
    nm_status st = NM_OK;
    if (e) {
        st = nm_errorf(err, NM_ERR_IO, "%s: cannot write: %s", o->path, strerror(e));
    } else if (o->tmp && rename(o->tmp, o->target) != 0) {
        st = nm_errorf(err, NM_ERR_IO, "%s: cannot replace: %s", o->path, strerror(errno));
    } else if (o->tmp) {
        nm_free(o->tmp);
        o->tmp = NULL; /* renamed: nothing to remove */
    }
    nm_outfile_abort(o);
    return st;
}

void nm_outfile_abort(nm_outfile *o) {
    if (!o) return;
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    nm_free(o->tmp);
    nm_free(o->target);
    nm_free(o->path);
    memset(o, 0, sizeof *o);
}
