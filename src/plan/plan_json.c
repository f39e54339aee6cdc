/* The plan part's thin layer over jansson, the project's one JSON library:
 * parsing a document (the limits, messages with line and column), typed
 * getters whose messages name the path of a bad value, and building and
 * printing a document. Every byte of JSON is read and written by jansson;
 * nothing here parses or prints JSON itself. */
#include "plan-impl.h"

#include "base/base.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- parsing ---------------------------------------------------------------- */

nm_status nm_json_parse(const char *text, size_t n_bytes, json_t **out, nm_error *err) {
    NM_ASSERT(out && (text || n_bytes == 0));
    *out = NULL;
    if (n_bytes > NM_JSON_MAX_BYTES)
        return nm_errorf(err, NM_ERR_CAPACITY, "the document is %zu bytes, more than the limit of %zu",
                         n_bytes, NM_JSON_MAX_BYTES);
    /* RFC 8259 section 8.1 lets a parser ignore a UTF-8 byte order mark;
     * some editors write one, and jansson refuses it */
    const bool bom = n_bytes >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0;
    if (bom) {
        text += 3;
        n_bytes -= 3;
    }
    /* jansson ends a document at a NUL byte ("[1, 2\0]" reads as [1, 2]);
     * JSON text has none outside strings, where it is escaped */
    const char *nul = n_bytes ? memchr(text, '\0', n_bytes) : NULL;
    if (nul) {
        int line = 1, column = 1 + (bom ? 1 : 0);
        for (const char *c = text; c < nul; c++) {
            if (*c == '\n') {
                line++;
                column = 1;
            } else if (((unsigned char)*c & 0xC0) != 0x80) { /* a character's first byte */
                column++;
            }
        }
        return nm_errorf(err, NM_ERR_FORMAT, "line %d, column %d: a NUL byte", line, column);
    }
    json_error_t e;
    /* any value at the top (the readers say "expected an object, got 5");
     * a key twice in an object is refused, and \u0000 in a string too
     * (no JSON_ALLOW_NUL), so every string is a C string */
    json_t *root = json_loadb(n_bytes ? text : "", n_bytes, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES,
                              &e);
    if (root) {
        *out = root;
        return NM_OK;
    }
    if (json_error_code(&e) == json_error_out_of_memory)
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory parsing JSON");
    const int column = e.column + (bom && e.line == 1); /* the mark is a character of the line */
    for (char *c = e.text; *c; c++) /* jansson quotes the input near the error */
        if ((unsigned char)*c < 0x20 || *c == 0x7F) *c = '?';
    return nm_errorf(err, NM_ERR_FORMAT, "line %d, column %d: %s", e.line < 1 ? 1 : e.line,
                     column < 1 ? 1 : column, e.text);
}

/* Reads the whole stream, up to one byte past the limit (so that an
 * over-long pipe is reported as such). */
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

nm_status nm_json_parse_file(const char *path, json_t **out, nm_error *err) {
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
    if (st != NM_OK) nm_error_prefix(err, "%s", path);
    return st;
}

/* ---- typed getters ---------------------------------------------------------- */

/* The path of a value for messages: "where.key", "where" or "key". */
typedef struct path_text {
    char s[256];
} path_text;

static path_text path_of(const char *where, const char *key) {
    path_text p;
    bool has_where = where && *where;
    if (has_where && key)
        snprintf(p.s, sizeof p.s, "%s.%s", where, key);
    else
        snprintf(p.s, sizeof p.s, "%s", has_where ? where : key ? key : "");
    return p;
}

/* "path: " before a message, or nothing for an empty path. */
static const char *colon(const path_text *p) { return p->s[0] ? ": " : ""; }

size_t nm_json_format_number(double v, char buf[NM_JSON_NUMBER_CHARS]) {
    NM_ASSERT(isfinite(v));
    int n = 0;
    for (int digits = 1; digits <= 17; digits++) {
        n = snprintf(buf, NM_JSON_NUMBER_CHARS, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return (size_t)n;
}

/* What a value is, for "got ...": 1.5, "text", true, null, an array. */
static const char *describe(const json_t *v, char buf[80]) {
    switch (json_typeof(v)) {
    case JSON_NULL:
        return "null";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_INTEGER:
        snprintf(buf, 80, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    case JSON_REAL:
        nm_json_format_number(json_real_value(v), buf);
        return buf;
    case JSON_STRING: {
        const char *s = json_string_value(v);
        const size_t len = json_string_length(v);
        size_t o = 0, k = 0;
        buf[o++] = '"';
        for (; k < len && o < 64; k++) {
            unsigned char c = (unsigned char)s[k];
            if (o >= 48 && (c & 0xC0) != 0x80) break; /* cut at a character boundary */
            if (c == '"' || c == '\\') buf[o++] = '\\';
            if (c < 0x20 || c == 0x7F)
                o += (size_t)snprintf(buf + o, 80 - o, "\\u%04X", c);
            else
                buf[o++] = (char)c;
        }
        snprintf(buf + o, 80 - o, "%s\"", k < len ? "..." : "");
        return buf;
    }
    case JSON_ARRAY:
        return "an array";
    case JSON_OBJECT:
        return "an object";
    }
    NM_ASSERT(!"a jansson type");
    return "";
}

/* A bound for messages; infinite bounds are allowed for "no limit". */
static const char *bound_text(double b, char buf[NM_JSON_NUMBER_CHARS]) {
    if (isinf(b)) return b < 0 ? "-inf" : "inf";
    nm_json_format_number(b, buf);
    return buf;
}

static nm_status wrong(const json_t *v, const path_text *p, const char *expected, nm_error *err) {
    char buf[80];
    return nm_errorf(err, NM_ERR_FORMAT, "%s%sexpected %s, got %s", p->s, colon(p), expected,
                     describe(v, buf));
}

/* The member key of obj, or a NOT_FOUND / FORMAT status naming where. */
static nm_status member(const json_t *obj, const char *key, const char *where, const json_t **out,
                        nm_error *err) {
    NM_ASSERT(obj && key);
    if (!json_is_object(obj)) {
        path_text p = path_of(where, NULL);
        return wrong(obj, &p, "an object", err);
    }
    const json_t *v = json_object_get(obj, key);
    if (!v) {
        path_text p = path_of(where, NULL);
        return nm_errorf(err, NM_ERR_NOT_FOUND, "%s%smissing key '%s'", p.s, colon(&p), key);
    }
    *out = v;
    return NM_OK;
}

/* jansson keeps a number written without '.' or exponent as an exact
 * integer (refusing one beyond int64 while parsing) and any other as a
 * double; a double with no fractional part counts as an integer up to
 * 2^53, beyond which it cannot say which integer the text meant. */
static nm_status check_int(const json_t *v, int64_t lo, int64_t hi, int64_t *out,
                           const path_text *p, nm_error *err) {
    NM_ASSERT(lo <= hi);
    const double two53 = 9007199254740992.0, two63 = 9223372036854775808.0;
    char expected[96];
    snprintf(expected, sizeof expected, "an integer in [%" PRId64 ", %" PRId64 "]", lo, hi);
    int64_t i;
    if (json_is_integer(v)) {
        i = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        const double d = json_real_value(v);
        if (d != floor(d) || d < -two63 || d >= two63) return wrong(v, p, expected, err);
        i = (int64_t)d;
        if (i >= lo && i <= hi && fabs(d) > two53) {
            char buf[80];
            return nm_errorf(err, NM_ERR_FORMAT,
                             "%s%sexpected %s, got %s, beyond 2^53 where a JSON number with a "
                             "fraction or exponent cannot hold every integer exactly",
                             p->s, colon(p), expected, describe(v, buf));
        }
    } else {
        return wrong(v, p, expected, err);
    }
    if (i < lo || i > hi) return wrong(v, p, expected, err);
    *out = i;
    return NM_OK;
}

static nm_status check_num(const json_t *v, double lo, double hi, double *out, const path_text *p,
                           nm_error *err) {
    NM_ASSERT(lo <= hi); /* also refuses NaN bounds */
    char expected[96], lo_buf[NM_JSON_NUMBER_CHARS], hi_buf[NM_JSON_NUMBER_CHARS];
    snprintf(expected, sizeof expected, "a number in [%s, %s]", bound_text(lo, lo_buf),
             bound_text(hi, hi_buf));
    if (!json_is_number(v)) return wrong(v, p, expected, err);
    const double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return wrong(v, p, expected, err);
    *out = d;
    return NM_OK;
}

/* Member key of obj, and its path for messages. */
static nm_status lookup(const json_t *obj, const char *key, const char *where, const json_t **v,
                        path_text *p, nm_error *err) {
    nm_status st = member(obj, key, where, v, err);
    if (st == NM_OK) *p = path_of(where, key);
    return st;
}

nm_status nm_json_get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                          const char *where, nm_error *err) {
    const json_t *v = NULL; /* set on NM_OK; gcc doubts it under -fPIC */
    path_text p;
    nm_status st = lookup(obj, key, where, &v, &p, err);
    return st != NM_OK ? st : check_int(v, lo, hi, out, &p, err);
}

nm_status nm_json_get_num(const json_t *obj, const char *key, double lo, double hi, double *out,
                          const char *where, nm_error *err) {
    const json_t *v = NULL;
    path_text p;
    nm_status st = lookup(obj, key, where, &v, &p, err);
    return st != NM_OK ? st : check_num(v, lo, hi, out, &p, err);
}

nm_status nm_json_get_str(const json_t *obj, const char *key, const char **out, const char *where,
                          nm_error *err) {
    const json_t *v = NULL;
    path_text p;
    nm_status st = lookup(obj, key, where, &v, &p, err);
    if (st != NM_OK) return st;
    if (!json_is_string(v)) return wrong(v, &p, "a string", err);
    *out = json_string_value(v); /* no NUL inside: the parser refuses \u0000 */
    return NM_OK;
}

nm_status nm_json_get_bool(const json_t *obj, const char *key, bool *out, const char *where,
                           nm_error *err) {
    const json_t *v = NULL;
    path_text p;
    nm_status st = lookup(obj, key, where, &v, &p, err);
    if (st != NM_OK) return st;
    if (!json_is_boolean(v)) return wrong(v, &p, "true or false", err);
    *out = json_is_true(v);
    return NM_OK;
}

static nm_status get_container(const json_t *obj, const char *key, json_type type,
                               const json_t **out, const char *where, nm_error *err) {
    const json_t *v = NULL;
    path_text p;
    nm_status st = lookup(obj, key, where, &v, &p, err);
    if (st != NM_OK) return st;
    if (json_typeof(v) != type)
        return wrong(v, &p, type == JSON_ARRAY ? "an array" : "an object", err);
    *out = v;
    return NM_OK;
}

nm_status nm_json_get_arr(const json_t *obj, const char *key, const json_t **out,
                          const char *where, nm_error *err) {
    return get_container(obj, key, JSON_ARRAY, out, where, err);
}

nm_status nm_json_get_obj(const json_t *obj, const char *key, const json_t **out,
                          const char *where, nm_error *err) {
    return get_container(obj, key, JSON_OBJECT, out, where, err);
}

nm_status nm_json_as_int(const json_t *v, int64_t lo, int64_t hi, int64_t *out, const char *where,
                         nm_error *err) {
    NM_ASSERT(v);
    path_text p = path_of(where, NULL);
    return check_int(v, lo, hi, out, &p, err);
}

nm_status nm_json_as_num(const json_t *v, double lo, double hi, double *out, const char *where,
                         nm_error *err) {
    NM_ASSERT(v);
    path_text p = path_of(where, NULL);
    return check_num(v, lo, hi, out, &p, err);
}

const char *nm_json_type_name(const json_t *v) {
    NM_ASSERT(v);
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "bool";
    case JSON_NULL:
        return "null";
    }
    NM_ASSERT(!"a jansson type");
    return "";
}

/* ---- building and printing -------------------------------------------------- */

json_t *nm_json_num(double v) {
    NM_ASSERT(isfinite(v)); /* JSON has no NaN or infinity */
    /* a whole number is written as one ("6", not "6.0"), as before jansson */
    if (v == floor(v) && fabs(v) <= 9007199254740992.0 && !(v == 0 && signbit(v)))
        return json_integer((json_int_t)v);
    return json_real(v);
}

bool nm_json_put(json_t *obj, const char *key, json_t *v) {
    return json_object_set_new(obj, key, v) == 0; /* frees v and fails when obj is NULL */
}

bool nm_json_push(json_t *arr, json_t *v) { return json_array_append_new(arr, v) == 0; }

nm_status nm_json_print(json_t *root, bool ok, const char *what, char **text, size_t *n_bytes,
                        nm_error *err) {
    NM_ASSERT(text && n_bytes);
    *text = NULL;
    /* 17 significant digits read back as the same double (IEEE 754) */
    char *s = ok && root ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17) | JSON_ENCODE_ANY) : NULL;
    json_decref(root);
    if (!s) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a %s's text", what);
    const size_t n = strlen(s);
    char *t = nm_malloc(n + 2);
    if (t) {
        memcpy(t, s, n);
        memcpy(t + n, "\n", 2);
    }
    json_free_t free_fn = NULL; /* jansson's, which the program may have set */
    json_get_alloc_funcs(NULL, &free_fn);
    free_fn(s);
    if (!t) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a %s's text", what);
    *text = t;
    *n_bytes = n + 1;
    return NM_OK;
}
