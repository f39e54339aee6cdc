/* libFuzzer target for the JSON parser and writer: any input must either be
 * refused with a positioned message or parse into a tree that every getter
 * can walk; what parses is written back, must re-parse into an equal tree,
 * and writing that gives the same bytes again. The input is also written as
 * one string, which must always come back as valid JSON holding the input
 * (when it is valid UTF-8). */
#include "base/base.h"
#include "json/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A broken invariant is a finding: abort so libFuzzer records the input. */
static void require(int cond) {
    if (!cond) abort();
}

static bool same_tree(const nm_json *a, const nm_json *b) {
    nm_json_type t = nm_json_type_of(a);
    if (t != nm_json_type_of(b) || nm_json_len(a) != nm_json_len(b)) return false;
    if (t == NM_JSON_BOOL) return nm_json_bool(a) == nm_json_bool(b);
    if (t == NM_JSON_NUMBER) {
        double x = nm_json_number(a), y = nm_json_number(b);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    if (t == NM_JSON_STRING) {
        size_t la, lb;
        const char *sa = nm_json_string(a, &la), *sb = nm_json_string(b, &lb);
        return la == lb && memcmp(sa, sb, la) == 0;
    }
    for (size_t i = 0; i < nm_json_len(a); i++) {
        if (t == NM_JSON_OBJECT) {
            size_t la = nm_json_key_len(a, i);
            if (la != nm_json_key_len(b, i) ||
                memcmp(nm_json_key_at(a, i), nm_json_key_at(b, i), la))
                return false;
        }
        if (!same_tree(nm_json_at(a, i), nm_json_at(b, i))) return false;
    }
    return true;
}

/* Visits every value and asks every getter of every member. */
static void walk(const nm_json *v, int depth) {
    require(depth <= NM_JSON_MAX_DEPTH);
    nm_json_type t = nm_json_type_of(v);
    if (t == NM_JSON_NUMBER) require(isfinite(nm_json_number(v)));
    if (t == NM_JSON_STRING) {
        size_t len;
        const char *s = nm_json_string(v, &len);
        require(s[len] == '\0');
    }
    nm_error err;
    for (size_t i = 0; i < nm_json_len(v); i++) {
        const nm_json *item = nm_json_at(v, i);
        int64_t i64;
        double d;
        if (nm_json_as_int(item, -1000, 1000, &i64, "v", &err) == NM_OK)
            require(i64 >= -1000 && i64 <= 1000 && nm_json_number(item) == (double)i64);
        if (nm_json_as_num(item, -1, 1, &d, "v", &err) == NM_OK) require(d >= -1 && d <= 1);
        if (t == NM_JSON_OBJECT) {
            const char *key = nm_json_key_at(v, i);
            require(key[nm_json_key_len(v, i)] == '\0');
            /* Keys are unique, so a key without NULs finds its own member. */
            if (strlen(key) == nm_json_key_len(v, i)) require(nm_json_get(v, key) == item);
            const char *s;
            bool b;
            const nm_json *c;
            nm_status st[6] = {
                nm_json_get_int(v, key, INT64_MIN, INT64_MAX, &i64, "w", &err),
                nm_json_get_num(v, key, -INFINITY, INFINITY, &d, "w", &err),
                nm_json_get_str(v, key, &s, "w", &err),
                nm_json_get_bool(v, key, &b, "w", &err),
                nm_json_get_arr(v, key, &c, "w", &err),
                nm_json_get_obj(v, key, &c, "w", &err),
            };
            for (int k = 0; k < 6; k++)
                require(st[k] == NM_OK || st[k] == NM_ERR_FORMAT || st[k] == NM_ERR_NOT_FOUND);
        }
        walk(item, depth + (t == NM_JSON_ARRAY || t == NM_JSON_OBJECT));
    }
}

static char *write(const nm_json *v, size_t *n) {
    nm_json_writer *w = nm_json_writer_memory();
    require(w != NULL);
    nm_json_write_value(w, v);
    char *text = NULL;
    require(nm_json_writer_finish(w, &text, n, NULL) == NM_OK);
    return text;
}

static void round_trip(const nm_json *v) {
    size_t n1, n2;
    char *t1 = write(v, &n1);
    nm_json *back = NULL;
    nm_error err;
    require(nm_json_parse(t1, n1, &back, &err) == NM_OK);
    require(same_tree(v, back));
    char *t2 = write(back, &n2);
    require(n1 == n2 && memcmp(t1, t2, n1) == 0);
    nm_free(t1);
    nm_free(t2);
    nm_json_free(back);
}

/* The input as one string: the output always parses. Invalid UTF-8 turns
 * into U+FFFD, so when the input holds no 0xEF byte (no U+FFFD of its own),
 * the output holds U+FFFD exactly when the input was not UTF-8, and
 * otherwise holds the input unchanged. */
static void write_as_string(const uint8_t *data, size_t size) {
    nm_json_writer *w = nm_json_writer_memory();
    require(w != NULL);
    nm_json_write_str_n(w, (const char *)data, size);
    char *text = NULL;
    size_t n;
    require(nm_json_writer_finish(w, &text, &n, NULL) == NM_OK);
    nm_json *v = NULL;
    require(nm_json_parse(text, n, &v, NULL) == NM_OK);
    size_t len;
    const char *s = nm_json_string(v, &len);
    bool replaced = false;
    for (size_t i = 0; i + 3 <= len && !replaced; i++)
        replaced = memcmp(s + i, "\xEF\xBF\xBD", 3) == 0;
    if (!replaced && memchr(data, 0xEF, size) == NULL)
        require(len == size && memcmp(s, data, size) == 0);
    nm_json_free(v);
    nm_free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nm_json *v = NULL;
    nm_error err;
    nm_status st = nm_json_parse((const char *)data, size, &v, &err);
    if (st == NM_OK) {
        walk(v, 0);
        round_trip(v);
        nm_json_free(v);
    } else {
        require(v == NULL && st == NM_ERR_FORMAT);
        require(strncmp(err.msg, "line ", 5) == 0);
    }
    if (size < 4096) write_as_string(data, size);
    return 0;
}
