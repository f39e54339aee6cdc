/* The pretty-printing JSON writer. Output
 * collects in a buffer; a file writer flushes it in large pieces. An array
 * holding only numbers is written on one line; when a first non-number
 * element arrives the line is re-laid out one element per line, so the
 * buffer keeps an open one-line array until it closes. */
#include "json-impl.h"

#include "base/base.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- numbers ------------------------------------------------------------- */

/* Rewrites the C locale's decimal point in buf as '.', in place. */
static void to_dot(char *buf) {
    const char *point = localeconv()->decimal_point;
    if (!point || !*point || strcmp(point, ".") == 0) return;
    char *at = strstr(buf, point);
    if (!at) return;
    size_t len = strlen(point);
    *at = '.';
    memmove(at + 1, at + len, strlen(at + len) + 1);
}

size_t nm_json_format_number(double v, char buf[NM_JSON_NUMBER_CHARS]) {
    NM_ASSERT(isfinite(v));
    NM_ASSERT(buf != NULL); /* also tells gcc's -Wformat-truncation under ASan */
    if (v == floor(v) && fabs(v) <= 9007199254740992.0) {
        if (v == 0 && signbit(v)) return (size_t)snprintf(buf, NM_JSON_NUMBER_CHARS, "-0");
        return (size_t)snprintf(buf, NM_JSON_NUMBER_CHARS, "%" PRId64, (int64_t)v);
    }
    /* The fewest digits that read back as v; 17 always do. A normal double
     * holds every 15-digit decimal, so when 15 digits read back, %g has
     * already dropped the zeros down to the shortest form; subnormals hold
     * fewer digits and search from 1. strtod reads the locale's own decimal
     * point, so the check runs before to_dot. */
    for (int digits = fabs(v) < DBL_MIN ? 1 : 15; digits <= 17; digits++) {
        snprintf(buf, NM_JSON_NUMBER_CHARS, "%.*g", digits, v);
        if (digits == 17 || strtod(buf, NULL) == v) break;
    }
    to_dot(buf);
    return strlen(buf);
}

/* ---- the writer ---------------------------------------------------------- */

#define FLUSH_BYTES ((size_t)1 << 16)

typedef struct level {
    char kind;       /* '[' or '{' */
    bool one_line;   /* an array of numbers so far, written "[1, 2" */
    size_t n_items;  /* elements, or members (counted at the key) */
    size_t items_at; /* buffer offset just past the '[' (one_line only) */
} level;

struct nm_json_writer {
    FILE *f;   /* NULL: memory writer */
    char *buf; /* [cap], [0, len) not yet flushed (file) or the text (memory) */
    size_t len, cap;
    bool nomem;         /* a buffer could not grow: output stopped */
    int io_errno;       /* nonzero: a write to f failed */
    int depth;          /* open containers: levels[1..depth] */
    bool key_due_value; /* in an object, a key was written and its value is due */
    bool done;          /* the top-level value is complete */
    level levels[NM_JSON_MAX_DEPTH + 1];
};

static nm_json_writer *writer_new(FILE *f) {
    nm_json_writer *w = nm_calloc(1, sizeof *w);
    if (!w) return NULL;
    w->cap = 256;
    w->buf = nm_malloc(w->cap);
    if (!w->buf) {
        nm_free(w);
        return NULL;
    }
    w->f = f;
    return w;
}

nm_json_writer *nm_json_writer_file(FILE *f) {
    NM_ASSERT(f);
    return writer_new(f);
}

nm_json_writer *nm_json_writer_memory(void) { return writer_new(NULL); }

void nm_json_writer_free(nm_json_writer *w) {
    if (!w) return;
    nm_free(w->buf);
    nm_free(w);
}

static bool reserve(nm_json_writer *w, size_t more) {
    if (w->nomem || w->io_errno) return false;
    size_t need;
    if (!nm_add_size(w->len, more, &need)) {
        w->nomem = true;
        return false;
    }
    if (need <= w->cap) return true;
    size_t cap = w->cap;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *grown = nm_realloc(w->buf, cap);
    if (!grown) {
        w->nomem = true;
        return false;
    }
    w->buf = grown;
    w->cap = cap;
    return true;
}

static void put(nm_json_writer *w, const char *s, size_t n) {
    if (!reserve(w, n)) return;
    memcpy(w->buf + w->len, s, n);
    w->len += n;
}

static void put_s(nm_json_writer *w, const char *s) { put(w, s, strlen(s)); }

static void put_indent(nm_json_writer *w, int depth) {
    if (!reserve(w, 1 + 2 * (size_t)depth)) return;
    w->buf[w->len++] = '\n';
    memset(w->buf + w->len, ' ', 2 * (size_t)depth);
    w->len += 2 * (size_t)depth;
}

/* Writes buf[0, n) to the file and keeps the rest. */
static void flush_prefix(nm_json_writer *w, size_t n) {
    if (!w->f || n == 0 || w->nomem || w->io_errno) return;
    if (fwrite(w->buf, 1, n, w->f) != n) {
        w->io_errno = errno ? errno : EIO;
        return;
    }
    memmove(w->buf, w->buf + n, w->len - n);
    w->len -= n;
    if (w->depth > 0 && w->levels[w->depth].one_line) w->levels[w->depth].items_at -= n;
}

/* A file writer keeps at most about FLUSH_BYTES, plus an open one-line
 * array (only the innermost level can be one: it holds numbers alone). */
static void maybe_flush(nm_json_writer *w) {
    if (!w->f || w->len < FLUSH_BYTES) return;
    const level *top = w->depth > 0 ? &w->levels[w->depth] : NULL;
    flush_prefix(w, top && top->one_line ? top->items_at : w->len);
}

/* Re-lays the open one-line array "[1, 2, 3" one element per line, in
 * place from the back (the text only grows, so nothing is overwritten before
 * it is moved). The numbers hold no ' ', so a space ends each token. */
static void break_line(nm_json_writer *w, level *l) {
    l->one_line = false;
    const size_t n = l->n_items, pad = 1 + 2 * (size_t)w->depth; /* "\n" and the indent */
    const size_t old = w->len - l->items_at, grown = old - 2 * (n - 1) + n * pad + (n - 1);
    if (!reserve(w, grown - old)) return;
    char *b = w->buf + l->items_at;
    size_t src = old, dst = grown;
    for (size_t k = n; k-- > 0;) {
        size_t tok = src;
        while (tok > 0 && b[tok - 1] != ' ')
            tok--;
        if (k + 1 < n) b[--dst] = ',';
        dst -= src - tok;
        memmove(b + dst, b + tok, src - tok);
        dst -= pad;
        b[dst] = '\n';
        memset(b + dst + 1, ' ', pad - 1);
        src = tok >= 2 ? tok - 2 : 0; /* before the ", " */
    }
    NM_ASSERT(dst == 0);
    w->len = l->items_at + grown;
}

/* Separator and indentation before a value; asserts a value is allowed. */
static void before_value(nm_json_writer *w, bool is_number) {
    NM_ASSERT(!w->done);
    if (w->depth == 0) return;
    level *l = &w->levels[w->depth];
    if (l->kind == '{') {
        NM_ASSERT(w->key_due_value); /* a value where a key is due */
        w->key_due_value = false;
        return;
    }
    if (l->n_items == 0 && is_number) {
        l->one_line = true;
        l->items_at = w->len;
    } else if (l->one_line && is_number) {
        put(w, ", ", 2);
    } else {
        if (l->one_line) break_line(w, l);
        if (l->n_items > 0) put(w, ",", 1);
        put_indent(w, w->depth);
    }
    l->n_items++;
}

static void after_value(nm_json_writer *w) {
    if (w->depth == 0) w->done = true;
    maybe_flush(w);
}

static void begin(nm_json_writer *w, char kind) {
    before_value(w, false);
    NM_ASSERT(w->depth < NM_JSON_MAX_DEPTH);
    w->levels[++w->depth] = (level){.kind = kind};
    put(w, &kind, 1);
}

static void end(nm_json_writer *w, char kind) {
    NM_ASSERT(w->depth > 0 && w->levels[w->depth].kind == kind && !w->key_due_value);
    const level *l = &w->levels[w->depth];
    if (l->n_items > 0 && !l->one_line) put_indent(w, w->depth - 1);
    put(w, kind == '[' ? "]" : "}", 1);
    w->depth--;
    after_value(w);
}

void nm_json_begin_object(nm_json_writer *w) { begin(w, '{'); }
void nm_json_end_object(nm_json_writer *w) { end(w, '{'); }
void nm_json_begin_array(nm_json_writer *w) { begin(w, '['); }
void nm_json_end_array(nm_json_writer *w) { end(w, '['); }

/* A quoted, escaped string; invalid UTF-8 becomes U+FFFD (see json.h). */
static void put_string(nm_json_writer *w, const char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    put(w, "\"", 1);
    size_t run = 0; /* start of the bytes that go out as they are */
    for (size_t i = 0; i < len;) {
        unsigned c = u[i];
        size_t skip = 1;
        const char *subst = NULL;
        char esc[7];
        if (c >= 0x80) {
            size_t bad, k = nm_json_utf8_len(u + i, len - i, &bad);
            if (k) {
                i += k;
                continue;
            }
            subst = "\xEF\xBF\xBD";
            skip = bad;
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = '\0';
            subst = esc;
        } else if (c < 0x20) {
            const char *named = c == '\n'   ? "\\n"
                                : c == '\t' ? "\\t"
                                : c == '\r' ? "\\r"
                                : c == '\b' ? "\\b"
                                : c == '\f' ? "\\f"
                                            : NULL;
            if (named) {
                subst = named;
            } else {
                memcpy(esc, "\\u00", 4);
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 15];
                esc[6] = '\0';
                subst = esc;
            }
        } else {
            i++;
            continue;
        }
        put(w, s + run, i - run);
        put_s(w, subst);
        i += skip;
        run = i;
    }
    put(w, s + run, len - run);
    put(w, "\"", 1);
}

void nm_json_key_n(nm_json_writer *w, const char *key, size_t len) {
    NM_ASSERT(key || len == 0);
    NM_ASSERT(w->depth > 0 && w->levels[w->depth].kind == '{' && !w->key_due_value);
    level *l = &w->levels[w->depth];
    if (l->n_items > 0) put(w, ",", 1);
    put_indent(w, w->depth);
    put_string(w, key ? key : "", len);
    put(w, ": ", 2);
    l->n_items++;
    w->key_due_value = true;
}

void nm_json_key(nm_json_writer *w, const char *key) {
    NM_ASSERT(key);
    nm_json_key_n(w, key, strlen(key));
}

void nm_json_write_str_n(nm_json_writer *w, const char *s, size_t len) {
    NM_ASSERT(s || len == 0);
    before_value(w, false);
    put_string(w, s ? s : "", len);
    after_value(w);
}

void nm_json_write_str(nm_json_writer *w, const char *s) {
    NM_ASSERT(s);
    nm_json_write_str_n(w, s, strlen(s));
}

void nm_json_write_num(nm_json_writer *w, double v) {
    NM_ASSERT(isfinite(v)); /* callers must not produce NaN or infinities */
    char buf[NM_JSON_NUMBER_CHARS];
    size_t n = nm_json_format_number(v, buf);
    before_value(w, true);
    put(w, buf, n);
    after_value(w);
}

void nm_json_write_int(nm_json_writer *w, int64_t v) {
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%" PRId64, v);
    before_value(w, true);
    put(w, buf, (size_t)n);
    after_value(w);
}

void nm_json_write_bool(nm_json_writer *w, bool v) {
    before_value(w, false);
    put_s(w, v ? "true" : "false");
    after_value(w);
}

void nm_json_write_null(nm_json_writer *w) {
    before_value(w, false);
    put(w, "null", 4);
    after_value(w);
}

void nm_json_write_value(nm_json_writer *w, const nm_json *v) {
    NM_ASSERT(v);
    switch ((nm_json_type)v->type) {
    case NM_JSON_NULL:
        nm_json_write_null(w);
        return;
    case NM_JSON_BOOL:
        nm_json_write_bool(w, v->u.b);
        return;
    case NM_JSON_NUMBER:
        nm_json_write_num(w, v->u.num);
        return;
    case NM_JSON_STRING:
        nm_json_write_str_n(w, v->u.str.ptr, v->u.str.len);
        return;
    case NM_JSON_ARRAY:
        nm_json_begin_array(w);
        for (size_t i = 0; i < v->u.arr.n; i++)
            nm_json_write_value(w, &v->u.arr.items[i]);
        nm_json_end_array(w);
        return;
    case NM_JSON_OBJECT:
        nm_json_begin_object(w);
        for (size_t i = 0; i < v->u.obj.n; i++) {
            const nm_json_member *m = &v->u.obj.members[i];
            nm_json_key_n(w, m->key, m->key_len);
            nm_json_write_value(w, &m->value);
        }
        nm_json_end_object(w);
        return;
    case NM_JSON_TYPE_COUNT:
        break;
    }
    NM_ASSERT(!"valid type");
}

nm_status nm_json_writer_finish(nm_json_writer *w, char **text, size_t *n_bytes, nm_error *err) {
    NM_ASSERT(w);
    NM_ASSERT(w->done); /* every container closed after one top-level value */
    NM_ASSERT(w->f || (text && n_bytes));
    put(w, "\n", 1);
    if (!w->f) {
        *text = NULL;
        *n_bytes = 0;
        if (reserve(w, 1)) {
            w->buf[w->len] = '\0';
            *text = w->buf;
            *n_bytes = w->len;
            w->buf = NULL;
        }
    } else {
        flush_prefix(w, w->len);
        if (!w->nomem && !w->io_errno && fflush(w->f) != 0) w->io_errno = errno ? errno : EIO;
    }
    bool nomem = w->nomem;
    int io_errno = w->io_errno;
    nm_json_writer_free(w);
    if (nomem) return nm_errorf(err, NM_ERR_NOMEM, "out of memory while writing JSON");
    if (io_errno) return nm_errorf(err, NM_ERR_IO, "cannot write JSON: %s", strerror(io_errno));
    return NM_OK;
}
