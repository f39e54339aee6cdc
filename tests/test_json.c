/* The plan part's JSON layer over jansson (src/plan/plan_json.c) and the
 * three files it carries: line and column of malformed documents (counted
 * by hand), the limits (size, depth, duplicate keys, numbers beyond a
 * double or an int64), every proper prefix of a file refused, the typed
 * getters' messages, numbers printed so that C's strtod reads back the
 * same double, and the calibration, profile and plan files written by
 * the hand-written JSON code this replaced (tests/files/) loading with the
 * values their text holds and saving back to the same document. */
#include "harness.h"

#include "base/base.h"
#include "plan/plan-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef NM_SOURCE_DIR
#define NM_SOURCE_DIR "."
#endif
#define FILES NM_SOURCE_DIR "/tests/files/"

/* ---- helpers ------------------------------------------------------------- */

/* Parses bytes from an exactly sized heap copy, so ASan sees any overread. */
static nm_status parse_n(const char *text, size_t n, json_t **out, nm_error *err) {
    char *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, text, n);
    nm_status st = nm_json_parse(copy, n, out, err);
    free(copy);
    return st;
}

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void expect_msg(nm_status st, nm_status want_st, const nm_error *err, const char *want) {
    CHECK_INT_EQ(st, want_st);
    if (strcmp(err->msg, want) != 0) {
        fprintf(stderr, "  message\n    %s\n  wanted\n    %s\n", err->msg, want);
        CHECK(false);
    }
}

static char *read_text(const char *path, size_t *n) {
    char *t = (char *)nm_test_read_file(path, n);
    if (!t) fprintf(stderr, "cannot read %s\n", path);
    CHECK(t != NULL);
    return t;
}

/* ---- malformed documents ------------------------------------------------- */

typedef struct bad_case {
    const char *text;
    size_t n; /* 0: strlen(text) */
    const char *prefix; /* the message starts with it: where, counted by hand */
    const char *part;   /* and holds this (jansson's words) */
} bad_case;

static void test_malformed(void) {
    /* jansson reports the column after the token it stopped at */
    const bad_case cases[] = {
        {"", 0, "line 1, column 1: ", "end of file"},
        {"{\n  \"a\": tru\n}", 0, "line 2, column 10: ", "'tru'"},
        {"[1,]", 0, "line 1, column 4: ", "']'"},
        {"{\"a\": 1, \"a\": 2}", 0, "line 1, column 12: ", "duplicate object key"},
        {"[NaN]", 0, "line 1, column 4: ", "'NaN'"},
        {"[-Infinity]", 0, "line 1, column 2: ", "'-'"},
        {"[1e400]", 0, "line 1, column 6: ", "overflow"},
        {"[9223372036854775808]", 0, "line 1, column 20: ", "too big integer"},
        {"[\"a\\u0000b\"]", 0, "line 1, column 11: ", "\\u0000"},
        {"[\"\xff\"]", 0, "line 1, column 2: ", "0xff"},
        {"[\"\\ud800\"]", 0, "line 1, column 9: ", "invalid Unicode"},
        {"[\"\xc3\xa9\", x]", 0, "line 1, column 7: ", "'x'"}, /* é is one column */
        {"[01]", 0, "line 1, column 2: ", "'0'"},
        {"{\"a\" 1}", 0, "line 1, column 6: ", "':' expected"},
        {"[1] 2", 0, "line 1, column 5: ", "end of file expected"},
        /* jansson would end the document at a NUL byte: refused before it */
        {"[1, 2\0]", 7, "line 1, column 6: ", "a NUL byte"},
        {"{\n \"\xc3\xa9\": 1}\0", 12, "line 2, column 9: ", "a NUL byte"},
        {"\xEF\xBB\xBF[1,]", 0, "line 1, column 5: ", "']'"}, /* the mark counts as one */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        nm_error err = {0};
        json_t *v = (json_t *)1;
        nm_status st = parse_n(c->text, c->n ? c->n : strlen(c->text), &v, &err);
        CHECK_INT_EQ(st, NM_ERR_FORMAT);
        CHECK(v == NULL);
        if (!starts_with(err.msg, c->prefix) || !strstr(err.msg, c->part)) {
            fprintf(stderr, "  case %zu: message\n    %s\n  wanted\n    %s...%s\n", i, err.msg,
                    c->prefix, c->part);
            CHECK(false);
        }
    }

    /* Nesting: jansson's limit is 2048 levels; deeper is refused, not a
     * stack overflow, and 2000 levels read. */
    enum { DEEP = 100000 };
    char *deep = malloc(2 * DEEP);
    memset(deep, '[', DEEP);
    memset(deep + DEEP, ']', DEEP);
    nm_error err = {0};
    json_t *v = NULL;
    CHECK_INT_EQ(parse_n(deep, 2 * DEEP, &v, &err), NM_ERR_FORMAT);
    CHECK(strstr(err.msg, "depth") != NULL);
    memmove(deep + 2000, deep + DEEP, 2000);
    CHECK_INT_EQ(parse_n(deep, 4000, &v, &err), NM_OK);
    json_decref(v);
    free(deep);

    /* What is accepted: a byte order mark, any value at the top, a number
     * below the double range (it becomes 0), an integer at the int64 edge. */
    CHECK_INT_EQ(parse_n("\xEF\xBB\xBF{\"a\": 1}", 11, &v, &err), NM_OK);
    CHECK(json_integer_value(json_object_get(v, "a")) == 1);
    json_decref(v);
    CHECK_INT_EQ(parse_n("[1e-400, -9223372036854775808, 5]", 33, &v, &err), NM_OK);
    CHECK(json_real_value(json_array_get(v, 0)) == 0.0);
    CHECK(json_integer_value(json_array_get(v, 1)) == INT64_MIN);
    json_decref(v);
    CHECK_INT_EQ(parse_n(" 5 ", 3, &v, &err), NM_OK);
    json_decref(v);

    /* The size limit is checked before anything is read. */
    CHECK_INT_EQ(nm_json_parse("x", NM_JSON_MAX_BYTES + 1, &v, &err), NM_ERR_CAPACITY);
    CHECK(v == NULL);
}

/* Every proper prefix of each file is refused with a message, never read
 * past its end (the copy is exactly sized for ASan). */
static void test_truncation(void) {
    const char *names[3] = {"tiny.calib.json", "tiny.profile.json", "tiny.plan.json"};
    for (int k = 0; k < 3; k++) {
        char path[512];
        snprintf(path, sizeof path, FILES "%s", names[k]);
        size_t n = 0;
        char *text = read_text(path, &n);
        if (!text) continue;
        while (n > 0 && text[n - 1] == '\n') /* a prefix without the newline is whole */
            n--;
        long wrong = 0;
        for (size_t len = 0; len < n; len++) {
            char *copy = malloc(len ? len : 1);
            memcpy(copy, text, len);
            nm_error err = {0};
            nm_status st;
            if (k == 0) {
                nm_calib *c = NULL;
                st = nm_calib_load_memory(copy, len, "t", &c, &err);
                nm_calib_free(c);
            } else if (k == 1) {
                nm_profile p;
                st = nm_profile_load_memory(copy, len, "t", &p, &err);
                if (st == NM_OK) nm_profile_free(&p);
            } else {
                nm_plan *p = NULL;
                st = nm_plan_load_memory(copy, len, "t", NULL, &p, &err);
                nm_plan_free(p);
            }
            wrong += st != NM_ERR_FORMAT || !starts_with(err.msg, "t: line ");
            free(copy);
        }
        if (wrong) fprintf(stderr, "  %s: %ld prefixes not refused as malformed\n", names[k], wrong);
        CHECK_INT_EQ(wrong, 0);
        free(text);
    }
}

/* ---- typed getters ------------------------------------------------------- */

static void test_getters(void) {
    nm_error err = {0};
    json_t *doc = NULL;
    const char src[] = "{\"tier\": 1.5, \"name\": \"x\", \"n\": 3, \"flag\": true, \"z\": null,"
                       " \"big\": 9007199254740994.0, \"exact\": 9007199254740993,"
                       " \"huge\": 1e19, \"two\": 2.0, \"kilo\": 1e3,"
                       " \"arr\": [1, 2.5, \"q\\\"\"], \"obj\": {}, \"neg\": -0}";
    CHECK_INT_EQ(parse_n(src, strlen(src), &doc, &err), NM_OK);
    if (!doc) return;
    const char *where = "plan: layers[3].groups[0]";
    int64_t i = 42;
    double d = 42;
    const char *s = NULL;
    bool b = false;
    const json_t *c = NULL;

    expect_msg(nm_json_get_int(doc, "tier", 1, 4096, &i, where, &err), NM_ERR_FORMAT, &err,
               "plan: layers[3].groups[0].tier: expected an integer in [1, 4096], got 1.5");
    CHECK_INT_EQ(i, 42); /* untouched on failure */
    expect_msg(nm_json_get_int(doc, "tiers", 1, 4096, &i, where, &err), NM_ERR_NOT_FOUND, &err,
               "plan: layers[3].groups[0]: missing key 'tiers'");
    expect_msg(nm_json_get_int(doc, "n", 1, 2, &i, where, &err), NM_ERR_FORMAT, &err,
               "plan: layers[3].groups[0].n: expected an integer in [1, 2], got 3");
    expect_msg(nm_json_get_int(doc, "name", -1, 1, &i, NULL, &err), NM_ERR_FORMAT, &err,
               "name: expected an integer in [-1, 1], got \"x\"");
    expect_msg(nm_json_get_int(doc, "big", 0, INT64_MAX, &i, "f", &err), NM_ERR_FORMAT, &err,
               "f.big: expected an integer in [0, 9223372036854775807], got 9007199254740994, "
               "beyond 2^53 where a JSON number with a fraction or exponent cannot hold every "
               "integer exactly");
    expect_msg(nm_json_get_int(doc, "huge", INT64_MIN, INT64_MAX, &i, "f", &err), NM_ERR_FORMAT,
               &err,
               "f.huge: expected an integer in [-9223372036854775808, 9223372036854775807], "
               "got 1e+19");
    expect_msg(nm_json_get_int(doc, "z", 0, 1, &i, "", &err), NM_ERR_FORMAT, &err,
               "z: expected an integer in [0, 1], got null");
    /* written as an integer, it is exact beyond 2^53 */
    CHECK_INT_EQ(nm_json_get_int(doc, "exact", 0, INT64_MAX, &i, where, &err), NM_OK);
    CHECK(i == 9007199254740993LL);
    CHECK_INT_EQ(nm_json_get_int(doc, "n", 3, 3, &i, where, &err), NM_OK);
    CHECK_INT_EQ(i, 3);
    CHECK_INT_EQ(nm_json_get_int(doc, "neg", 0, 0, &i, where, &err), NM_OK);
    CHECK_INT_EQ(i, 0);
    CHECK_INT_EQ(nm_json_get_int(doc, "two", 2, 2, &i, where, &err), NM_OK);
    CHECK_INT_EQ(nm_json_get_int(doc, "kilo", 0, 1000, &i, where, &err), NM_OK);
    CHECK_INT_EQ(i, 1000);

    expect_msg(nm_json_get_num(doc, "tier", 0, 1, &d, "cal", &err), NM_ERR_FORMAT, &err,
               "cal.tier: expected a number in [0, 1], got 1.5");
    expect_msg(nm_json_get_num(doc, "flag", -INFINITY, INFINITY, &d, "cal", &err), NM_ERR_FORMAT,
               &err, "cal.flag: expected a number in [-inf, inf], got true");
    expect_msg(nm_json_get_num(doc, "arr", 0.25, 1e300, &d, "cal", &err), NM_ERR_FORMAT, &err,
               "cal.arr: expected a number in [0.25, 1e+300], got an array");
    CHECK_INT_EQ(nm_json_get_num(doc, "tier", 1.5, 1.5, &d, "cal", &err), NM_OK);
    CHECK(d == 1.5);
    CHECK_INT_EQ(nm_json_get_num(doc, "n", 0, 10, &d, "cal", &err), NM_OK); /* an integer */
    CHECK(d == 3.0);

    CHECK_INT_EQ(nm_json_get_str(doc, "name", &s, where, &err), NM_OK);
    CHECK(s && strcmp(s, "x") == 0);
    expect_msg(nm_json_get_str(doc, "obj", &s, "p", &err), NM_ERR_FORMAT, &err,
               "p.obj: expected a string, got an object");
    CHECK_INT_EQ(nm_json_get_bool(doc, "flag", &b, "p", &err), NM_OK);
    CHECK(b);
    expect_msg(nm_json_get_bool(doc, "z", &b, "p", &err), NM_ERR_FORMAT, &err,
               "p.z: expected true or false, got null");
    CHECK_INT_EQ(nm_json_get_arr(doc, "arr", &c, "p", &err), NM_OK);
    CHECK(c == json_object_get(doc, "arr"));
    expect_msg(nm_json_get_arr(doc, "obj", &c, "p", &err), NM_ERR_FORMAT, &err,
               "p.obj: expected an array, got an object");
    expect_msg(nm_json_get_obj(doc, "arr", &c, "p", &err), NM_ERR_FORMAT, &err,
               "p.arr: expected an object, got an array");
    expect_msg(nm_json_get_obj(doc, "nope", &c, NULL, &err), NM_ERR_NOT_FOUND, &err,
               "missing key 'nope'");
    CHECK_INT_EQ(nm_json_get_obj(doc, "obj", &c, "p", &err), NM_OK);

    /* Elements of an array, and getters asked of something not an object. */
    const json_t *arr = json_object_get(doc, "arr");
    CHECK_INT_EQ(nm_json_as_int(json_array_get(arr, 0), 0, 1, &i, "p.arr[0]", &err), NM_OK);
    CHECK_INT_EQ(i, 1);
    expect_msg(nm_json_as_int(json_array_get(arr, 1), 0, 5, &i, "p.arr[1]", &err), NM_ERR_FORMAT,
               &err, "p.arr[1]: expected an integer in [0, 5], got 2.5");
    expect_msg(nm_json_as_num(json_array_get(arr, 2), 0, 5, &d, "p.arr[2]", &err), NM_ERR_FORMAT,
               &err, "p.arr[2]: expected a number in [0, 5], got \"q\\\"\"");
    expect_msg(nm_json_get_int(arr, "n", 0, 1, &i, "p.arr", &err), NM_ERR_FORMAT, &err,
               "p.arr: expected an object, got an array");
    CHECK(strcmp(nm_json_type_name(doc), "object") == 0);
    CHECK(strcmp(nm_json_type_name(arr), "array") == 0);
    CHECK(strcmp(nm_json_type_name(json_object_get(doc, "n")), "number") == 0);
    json_decref(doc);

    /* A long string is cut in the message at a character boundary. */
    char longdoc[256];
    snprintf(longdoc, sizeof longdoc, "{\"k\": \"%s\"}",
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9");
    CHECK_INT_EQ(parse_n(longdoc, strlen(longdoc), &doc, &err), NM_OK);
    CHECK_INT_EQ(nm_json_get_int(doc, "k", 0, 1, &i, NULL, &err), NM_ERR_FORMAT);
    /* '"' and 24 two-byte characters fill 49 bytes, then "..." */
    CHECK(strstr(err.msg, "\xc3\xa9...\"") != NULL && strlen(strstr(err.msg, "got ")) == 4 + 49 + 4);
    json_decref(doc);
}

/* ---- numbers ------------------------------------------------------------- */

/* The shortest text of a double, for messages: the digits Python's repr
 * prints (repr(0.1), repr(1/3), repr(5e-324), repr(1e300)). */
static void test_format_number(void) {
    const struct {
        double v;
        const char *want;
    } cases[] = {{0.1, "0.1"},
                 {1.0 / 3.0, "0.3333333333333333"},
                 {5e-324, "5e-324"},
                 {1e300, "1e+300"},
                 {0.95, "0.95"},
                 {-2.5, "-2.5"},
                 {2.0 / 3.0, "0.6666666666666666"},
                 {1.7976931348623157e308, "1.7976931348623157e+308"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[NM_JSON_NUMBER_CHARS];
        nm_json_format_number(cases[i].v, buf);
        if (strcmp(buf, cases[i].want) != 0)
            fprintf(stderr, "  format %.17g: %s, want %s\n", cases[i].v, buf, cases[i].want);
        CHECK(strcmp(buf, cases[i].want) == 0);
    }
}

/* nm_json_num and nm_json_print: whole numbers up to 2^53 as integers,
 * others as doubles that C's strtod reads back bit for bit. */
static void test_print_numbers(void) {
    uint64_t state = 0x9E3779B97F4A7C15u;
    json_t *arr = json_array();
    enum { N = 4000 };
    double *want = malloc(N * sizeof(double));
    bool ok = true;
    for (int i = 0; i < N; i++) {
        double v;
        do { /* random bit patterns: every exponent, subnormals, both signs */
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            memcpy(&v, &state, sizeof v);
        } while (!isfinite(v));
        if (i % 4 == 1) v = (double)(int64_t)(state % 2000001) - 1000000.0; /* whole */
        if (i == 2) v = -0.0;
        if (i == 3) v = 9007199254740992.0 * 4; /* whole, beyond 2^53 */
        want[i] = v;
        ok = nm_json_push(arr, nm_json_num(v)) && ok;
    }
    CHECK(ok);
    CHECK(json_is_integer(json_array_get(arr, 1)));
    CHECK(json_is_real(json_array_get(arr, 2))); /* -0 keeps its sign */
    CHECK(json_is_real(json_array_get(arr, 3)));
    char *text = NULL;
    size_t n = 0;
    nm_error err = {0};
    CHECK_INT_EQ(nm_json_print(arr, ok, "test", &text, &n, &err), NM_OK);
    if (!text) {
        free(want);
        return;
    }
    CHECK(n == strlen(text) && text[n - 1] == '\n');
    /* read back with strtod, not jansson: the numbers are the lines of the
     * array, one per line */
    int bad = 0, count = 0;
    char *p = strchr(text, '[');
    for (int i = 0; p && i < N; i++) {
        char *end;
        double got = strtod(p + 1, &end);
        bad += end == p + 1 || memcmp(&got, &want[i], sizeof got) != 0;
        count++;
        p = strchr(end, i + 1 < N ? ',' : ']');
    }
    CHECK_INT_EQ(count, N);
    CHECK_INT_EQ(bad, 0);
    nm_free(text);
    free(want);
}

/* ---- the files ----------------------------------------------------------- */

/* The saved text and the file read as trees by jansson: the same keys in
 * the same order, the same values and number kinds (integer or not). */
static void check_same_document(const char *file_text, size_t file_n, const char *saved,
                                size_t saved_n, const char *what) {
    json_error_t je;
    json_t *a = json_loadb(file_text, file_n, 0, &je), *b = json_loadb(saved, saved_n, 0, &je);
    CHECK(a && b);
    const bool same = a && b && json_equal(a, b);
    if (!same) fprintf(stderr, "  %s: saved document differs from the file\n", what);
    CHECK(same);
    /* keys in the file's order */
    void *ia = json_object_iter(a), *ib = json_object_iter(b);
    for (; ia && ib; ia = json_object_iter_next(a, ia), ib = json_object_iter_next(b, ib)) {
        CHECK(strcmp(json_object_iter_key(ia), json_object_iter_key(ib)) == 0);
    }
    CHECK(ia == NULL && ib == NULL);
    json_decref(a);
    json_decref(b);
}

/* Files written by the hand-written writer before jansson (tests/files/,
 * made by `npumoe calibrate/profile/plan` on the tiny model): they load,
 * hold what their text says, and save back to the same document. */
static void test_old_files(void) {
    nm_error err = {0};
    size_t n = 0, n2 = 0;
    char *text, *saved = NULL, *again = NULL;

    text = read_text(FILES "tiny.calib.json", &n);
    nm_calib *c = NULL;
    CHECK_INT_EQ(nm_calib_load(FILES "tiny.calib.json", &c, &err), NM_OK);
    if (c && text) {
        CHECK(strcmp(c->fingerprint.hex, "046e6037b96f0ec8") == 0);
        CHECK_INT_EQ(c->chunk, 16);
        CHECK_INT_EQ(c->k, 2);
        CHECK_INT_EQ(c->n_layer, 3);
        CHECK_INT_EQ(c->n_expert, 8);
        CHECK_INT_EQ(c->n_chunks, 62);
        CHECK_INT_EQ(c->n_tokens, 992);
        CHECK_INT_EQ(nm_calib_save_memory(c, &saved, &n2, &err), NM_OK);
        if (saved) check_same_document(text, n, saved, n2, "calibration");
        nm_calib *c2 = NULL;
        size_t n3 = 0;
        CHECK_INT_EQ(nm_calib_load_memory(saved, n2, "saved", &c2, &err), NM_OK);
        if (c2) CHECK_INT_EQ(nm_calib_save_memory(c2, &again, &n3, &err), NM_OK);
        CHECK(again && n3 == n2 && memcmp(again, saved, n2) == 0);
        nm_calib_free(c2);
    }
    nm_calib_free(c);
    free(text);
    nm_free(saved);
    nm_free(again);
    saved = again = NULL;

    text = read_text(FILES "tiny.profile.json", &n);
    nm_profile p;
    CHECK_INT_EQ(nm_profile_load(FILES "tiny.profile.json", &p, &err), NM_OK);
    if (p.points && text) {
        CHECK(strcmp(p.device, "cpu") == 0);
        CHECK_INT_EQ(p.d_model, 64);
        CHECK_INT_EQ(p.d_ff, 32);
        CHECK(p.dispatch_ms == 0.003477);
        CHECK(p.host_row_ms == 0.0005699423929767398);
        CHECK(p.points[0].graph_ms == 0.0062109999999999995);
        CHECK_INT_EQ(p.points[0].capacity, 4);
        CHECK_INT_EQ(nm_profile_save_memory(&p, &saved, &n2, &err), NM_OK);
        if (saved) check_same_document(text, n, saved, n2, "profile");
        nm_profile_free(&p);
    }
    free(text);
    nm_free(saved);
    saved = NULL;

    const char *plans[2] = {FILES "tiny.plan.json", FILES "tiny-quantile.plan.json"};
    for (int k = 0; k < 2; k++) {
        text = read_text(plans[k], &n);
        nm_plan *plan = NULL;
        CHECK_INT_EQ(nm_plan_load(plans[k], NULL, &plan, &err), NM_OK);
        if (!plan) fprintf(stderr, "  %s\n", err.msg);
        if (plan && text) {
            CHECK_INT_EQ(plan->moe.chunk, 16);
            CHECK_INT_EQ(plan->n_tiers, k == 0 ? 16 : 2);
            CHECK_INT_EQ(plan->tiers[plan->n_tiers - 1], 16);
            CHECK_INT_EQ(plan->objective, k == 0 ? NM_PLAN_BUDGET : NM_PLAN_QUANTILE);
            CHECK(plan->quantile == (k == 0 ? 0.95 : 0.8999999761581421));
            CHECK_INT_EQ(plan->moe.overflow, k == 0 ? NM_OVERFLOW_SPILL : NM_OVERFLOW_DROP);
            CHECK_INT_EQ(plan->budget_rows[0], k == 0 ? 53 : 68);
            CHECK_INT_EQ(nm_plan_save_memory(plan, &saved, &n2, &err), NM_OK);
            if (saved) check_same_document(text, n, saved, n2, plans[k]);
        }
        nm_plan_free(plan);
        free(text);
        nm_free(saved);
        saved = NULL;
    }
}

/* Reading files: errors name the path; a pipe has no size up front; a file
 * over the limit is refused from its size. */
static void test_parse_file(void) {
    char dir[] = "/tmp/nm_json_XXXXXX", path[256], want[512];
    CHECK(mkdtemp(dir) != NULL);
    nm_error err = {0};
    json_t *v = (json_t *)1;
    snprintf(path, sizeof path, "%s/nope.json", dir);
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", path);
    expect_msg(nm_json_parse_file(path, &v, &err), NM_ERR_IO, &err, want);
    CHECK(v == NULL);
    snprintf(want, sizeof want, "%s: is a directory", dir);
    expect_msg(nm_json_parse_file(dir, &v, &err), NM_ERR_IO, &err, want);

    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\n  \"a\": tru\n}", f);
    fclose(f);
    CHECK_INT_EQ(nm_json_parse_file(path, &v, &err), NM_ERR_FORMAT);
    snprintf(want, sizeof want, "%s: line 2, column 10: ", path);
    CHECK(starts_with(err.msg, want));

    /* sparse: no disk used */
    CHECK(truncate(path, (off_t)NM_JSON_MAX_BYTES + 1) == 0);
    CHECK_INT_EQ(nm_json_parse_file(path, &v, &err), NM_ERR_CAPACITY);
    CHECK(starts_with(err.msg, path) && strstr(err.msg, "more than the limit"));
    unlink(path);

    snprintf(path, sizeof path, "%s/pipe.json", dir);
    CHECK(mkfifo(path, 0600) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *w = fopen(path, "w");
        fputs("[", w);
        for (int i = 0; i < 20000; i++)
            fprintf(w, "%s%d", i ? ", " : "", i);
        fputs("]", w);
        fclose(w);
        _exit(0);
    }
    CHECK_INT_EQ(nm_json_parse_file(path, &v, &err), NM_OK);
    CHECK(json_array_size(v) == 20000 && json_integer_value(json_array_get(v, 19999)) == 19999);
    json_decref(v);
    waitpid(pid, NULL, 0);
    unlink(path);
    CHECK(rmdir(dir) == 0);
}

/* ---- allocation failures ------------------------------------------------- */

static void test_alloc_failures(void) {
    nm_error err = {0};
    json_t *v = (json_t *)1;
    nm_alloc_fail_after(0); /* the file's buffer */
    nm_status st = nm_json_parse_file(FILES "tiny.plan.json", &v, &err);
    nm_alloc_fail_after(-1);
    CHECK_INT_EQ(st, NM_ERR_NOMEM);
    CHECK(v == NULL);

    char *text = (char *)1;
    size_t n = 0;
    json_t *doc = json_pack("{s:[i,i]}", "a", 1, 2);
    nm_alloc_fail_after(0); /* the copy with the newline */
    st = nm_json_print(doc, true, "test", &text, &n, &err);
    nm_alloc_fail_after(-1);
    CHECK_INT_EQ(st, NM_ERR_NOMEM);
    CHECK(text == NULL && strstr(err.msg, "test's text"));
    /* a failed build (ok false, or a NULL root) is reported, and freed */
    expect_msg(nm_json_print(json_object(), false, "plan", &text, &n, &err), NM_ERR_NOMEM, &err,
               "out of memory for a plan's text");
    CHECK_INT_EQ(nm_json_print(NULL, true, "plan", &text, &n, &err), NM_ERR_NOMEM);
    /* nm_json_put and nm_json_push take their value even when they fail */
    CHECK(!nm_json_put(NULL, "k", json_integer(1)));
    CHECK(!nm_json_push(NULL, json_string("x")));
    CHECK(!nm_json_put(NULL, "k", NULL));
}

int main(void) {
    test_malformed();
    test_truncation();
    test_getters();
    test_format_number();
    test_print_numbers();
    test_old_files();
    test_parse_file();
    test_alloc_failures();
    return nm_test_finish("test_json");
}
