/* Reading a parsed tree: plain accessors (wrong use is a programmer error)
 * and typed getters, which turn a missing key, a wrong type or a value out
 * of range into a message that names the path of the value. */
#include "json-impl.h"

#include "base/base.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const type_names[NM_JSON_TYPE_COUNT] = {
    [NM_JSON_NULL] = "null",     [NM_JSON_BOOL] = "bool",   [NM_JSON_NUMBER] = "number",
    [NM_JSON_STRING] = "string", [NM_JSON_ARRAY] = "array", [NM_JSON_OBJECT] = "object",
};
_Static_assert(sizeof(type_names) / sizeof(type_names[0]) == NM_JSON_TYPE_COUNT,
               "one name per type");

const char *nm_json_type_name(nm_json_type type) {
    NM_ASSERT((unsigned)type < NM_JSON_TYPE_COUNT);
    return type_names[type];
}

nm_json_type nm_json_type_of(const nm_json *v) {
    NM_ASSERT(v);
    return (nm_json_type)v->type;
}

size_t nm_json_len(const nm_json *v) {
    if (!v) return 0;
    if (v->type == NM_JSON_ARRAY) return v->u.arr.n;
    if (v->type == NM_JSON_OBJECT) return v->u.obj.n;
    return 0;
}

const nm_json *nm_json_at(const nm_json *v, size_t i) {
    NM_ASSERT(i < nm_json_len(v));
    return v->type == NM_JSON_ARRAY ? &v->u.arr.items[i] : &v->u.obj.members[i].value;
}

const char *nm_json_key_at(const nm_json *obj, size_t i) {
    NM_ASSERT(obj && obj->type == NM_JSON_OBJECT && i < obj->u.obj.n);
    return obj->u.obj.members[i].key;
}

size_t nm_json_key_len(const nm_json *obj, size_t i) {
    NM_ASSERT(obj && obj->type == NM_JSON_OBJECT && i < obj->u.obj.n);
    return obj->u.obj.members[i].key_len;
}

const nm_json *nm_json_get(const nm_json *obj, const char *key) {
    NM_ASSERT(key);
    if (!obj || obj->type != NM_JSON_OBJECT) return NULL;
    size_t len = strlen(key);
    for (size_t i = 0; i < obj->u.obj.n; i++) {
        const nm_json_member *m = &obj->u.obj.members[i];
        if (m->key_len == len && memcmp(m->key, key, len) == 0) return &m->value;
    }
    return NULL;
}

double nm_json_number(const nm_json *v) {
    NM_ASSERT(v && v->type == NM_JSON_NUMBER);
    return v->u.num;
}

bool nm_json_bool(const nm_json *v) {
    NM_ASSERT(v && v->type == NM_JSON_BOOL);
    return v->u.b;
}

const char *nm_json_string(const nm_json *v, size_t *len) {
    NM_ASSERT(v && v->type == NM_JSON_STRING);
    if (len) *len = v->u.str.len;
    return v->u.str.ptr;
}

/* ---- typed getters ------------------------------------------------------- */

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

/* What a value is, for "got ...": 1.5, "text", true, null, an array. */
static const char *describe(const nm_json *v, char buf[80]) {
    switch ((nm_json_type)v->type) {
    case NM_JSON_NULL:
        return "null";
    case NM_JSON_BOOL:
        return v->u.b ? "true" : "false";
    case NM_JSON_NUMBER:
        nm_json_format_number(v->u.num, buf);
        return buf;
    case NM_JSON_STRING: {
        size_t o = 0, k = 0;
        buf[o++] = '"';
        for (; k < v->u.str.len && o < 64; k++) {
            unsigned char c = (unsigned char)v->u.str.ptr[k];
            if (o >= 48 && (c & 0xC0) != 0x80) break; /* cut at a character boundary */
            if (c == '"' || c == '\\') buf[o++] = '\\';
            if (c < 0x20 || c == 0x7F)
                o += (size_t)snprintf(buf + o, 80 - o, "\\u%04X", c);
            else
                buf[o++] = (char)c;
        }
        snprintf(buf + o, 80 - o, "%s\"", k < v->u.str.len ? "..." : "");
        return buf;
    }
    case NM_JSON_ARRAY:
        return "an array";
    case NM_JSON_OBJECT:
        return "an object";
    case NM_JSON_TYPE_COUNT:
        break;
    }
    NM_ASSERT(!"valid type");
    return "";
}

/* A bound for messages; infinite bounds are allowed for "no limit". */
static const char *bound_text(double b, char buf[NM_JSON_NUMBER_CHARS]) {
    if (isinf(b)) return b < 0 ? "-inf" : "inf";
    nm_json_format_number(b, buf);
    return buf;
}

static nm_status wrong(const nm_json *v, const path_text *p, const char *expected, nm_error *err) {
    char buf[80];
    return nm_errorf(err, NM_ERR_FORMAT, "%s%sexpected %s, got %s", p->s, colon(p), expected,
                     describe(v, buf));
}

/* The member key of obj, or a NOT_FOUND / FORMAT status naming where. */
static nm_status member(const nm_json *obj, const char *key, const char *where, const nm_json **out,
                        nm_error *err) {
    NM_ASSERT(obj && key);
    if (obj->type != NM_JSON_OBJECT) {
        path_text p = path_of(where, NULL);
        return wrong(obj, &p, "an object", err);
    }
    const nm_json *v = nm_json_get(obj, key);
    if (!v) {
        path_text p = path_of(where, NULL);
        return nm_errorf(err, NM_ERR_NOT_FOUND, "%s%smissing key '%s'", p.s, colon(&p), key);
    }
    *out = v;
    return NM_OK;
}

static nm_status check_int(const nm_json *v, int64_t lo, int64_t hi, int64_t *out,
                           const path_text *p, nm_error *err) {
    NM_ASSERT(lo <= hi);
    const double two53 = 9007199254740992.0, two63 = 9223372036854775808.0;
    char expected[96];
    snprintf(expected, sizeof expected, "an integer in [%" PRId64 ", %" PRId64 "]", lo, hi);
    if (v->type != NM_JSON_NUMBER) return wrong(v, p, expected, err);
    double d = v->u.num;
    if (d != floor(d) || d < -two63 || d >= two63) return wrong(v, p, expected, err);
    int64_t i = (int64_t)d;
    if (i < lo || i > hi) return wrong(v, p, expected, err);
    if (fabs(d) > two53) {
        char buf[80];
        return nm_errorf(err, NM_ERR_FORMAT,
                         "%s%sexpected %s, got %s, beyond 2^53 where a JSON number cannot "
                         "hold every integer exactly",
                         p->s, colon(p), expected, describe(v, buf));
    }
    *out = i;
    return NM_OK;
}

static nm_status check_num(const nm_json *v, double lo, double hi, double *out, const path_text *p,
                           nm_error *err) {
    NM_ASSERT(lo <= hi); /* also refuses NaN bounds */
    char expected[96], lo_buf[NM_JSON_NUMBER_CHARS], hi_buf[NM_JSON_NUMBER_CHARS];
    snprintf(expected, sizeof expected, "a number in [%s, %s]", bound_text(lo, lo_buf),
             bound_text(hi, hi_buf));
    if (v->type != NM_JSON_NUMBER || v->u.num < lo || v->u.num > hi)
        return wrong(v, p, expected, err);
    *out = v->u.num;
    return NM_OK;
}

nm_status nm_json_get_int(const nm_json *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                          const char *where, nm_error *err) {
    const nm_json *v = NULL; /* set on NM_OK; gcc doubts it under -fPIC */
    nm_status st = member(obj, key, where, &v, err);
    if (st != NM_OK) return st;
    path_text p = path_of(where, key);
    return check_int(v, lo, hi, out, &p, err);
}

nm_status nm_json_get_num(const nm_json *obj, const char *key, double lo, double hi, double *out,
                          const char *where, nm_error *err) {
    const nm_json *v = NULL; /* set on NM_OK; gcc doubts it under -fPIC */
    nm_status st = member(obj, key, where, &v, err);
    if (st != NM_OK) return st;
    path_text p = path_of(where, key);
    return check_num(v, lo, hi, out, &p, err);
}

nm_status nm_json_get_str(const nm_json *obj, const char *key, const char **out, const char *where,
                          nm_error *err) {
    const nm_json *v = NULL; /* set on NM_OK; gcc doubts it under -fPIC */
    nm_status st = member(obj, key, where, &v, err);
    if (st != NM_OK) return st;
    path_text p = path_of(where, key);
    if (v->type != NM_JSON_STRING) return wrong(v, &p, "a string", err);
    if (memchr(v->u.str.ptr, '\0', v->u.str.len))
        return wrong(v, &p, "a string without NUL characters (\\u0000)", err);
    *out = v->u.str.ptr;
    return NM_OK;
}

nm_status nm_json_get_bool(const nm_json *obj, const char *key, bool *out, const char *where,
                           nm_error *err) {
    const nm_json *v = NULL; /* set on NM_OK; gcc doubts it under -fPIC */
    nm_status st = member(obj, key, where, &v, err);
    if (st != NM_OK) return st;
    path_text p = path_of(where, key);
    if (v->type != NM_JSON_BOOL) return wrong(v, &p, "true or false", err);
    *out = v->u.b;
    return NM_OK;
}

static nm_status get_container(const nm_json *obj, const char *key, nm_json_type type,
                               const nm_json **out, const char *where, nm_error *err) {
    const nm_json *v = NULL; /* set on NM_OK; gcc doubts it under -fPIC */
    nm_status st = member(obj, key, where, &v, err);
    if (st != NM_OK) return st;
    path_text p = path_of(where, key);
    if (v->type != type) return wrong(v, &p, type == NM_JSON_ARRAY ? "an array" : "an object", err);
    *out = v;
    return NM_OK;
}

nm_status nm_json_get_arr(const nm_json *obj, const char *key, const nm_json **out,
                          const char *where, nm_error *err) {
    return get_container(obj, key, NM_JSON_ARRAY, out, where, err);
}

nm_status nm_json_get_obj(const nm_json *obj, const char *key, const nm_json **out,
                          const char *where, nm_error *err) {
    return get_container(obj, key, NM_JSON_OBJECT, out, where, err);
}

nm_status nm_json_as_int(const nm_json *v, int64_t lo, int64_t hi, int64_t *out, const char *where,
                         nm_error *err) {
    NM_ASSERT(v);
    path_text p = path_of(where, NULL);
    return check_int(v, lo, hi, out, &p, err);
}

nm_status nm_json_as_num(const nm_json *v, double lo, double hi, double *out, const char *where,
                         nm_error *err) {
    NM_ASSERT(v);
    path_text p = path_of(where, NULL);
    return check_num(v, lo, hi, out, &p, err);
}
