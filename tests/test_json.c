/* JSON parser, getters and writer: values checked against numbers and text
 * produced by Python (float.hex, repr, bytes.decode with 'replace'), an
 * independently written UTF-8 validator run over every
 * short byte sequence, malformed input with the exact line, column and
 * message, truncation at every byte, writer -> parser -> writer round trips,
 * files, and allocation-failure injection. */
#include "harness.h"

#include "base/base.h"
#include "json/json.h"

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------- */

/* Parses bytes from an exactly sized heap copy, so ASan sees any overread. */
static nm_status parse_n(const char *text, size_t n, nm_json **out, nm_error *err) {
    char *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, text, n);
    nm_status st = nm_json_parse(copy, n, out, err);
    free(copy);
    return st;
}

static nm_json *parse_ok(const char *text) {
    nm_json *v = NULL;
    nm_error err = {0};
    nm_status st = parse_n(text, strlen(text), &v, &err);
    if (st != NM_OK) fprintf(stderr, "  unexpected failure on %s: %s\n", text, err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return v;
}

/* Both trees hold the same values: numbers bit for bit, members in order. */
static bool same_tree(const nm_json *a, const nm_json *b) {
    nm_json_type t = nm_json_type_of(a);
    if (t != nm_json_type_of(b) || nm_json_len(a) != nm_json_len(b)) return false;
    switch (t) {
    case NM_JSON_NULL:
        return true;
    case NM_JSON_BOOL:
        return nm_json_bool(a) == nm_json_bool(b);
    case NM_JSON_NUMBER: {
        double x = nm_json_number(a), y = nm_json_number(b);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    case NM_JSON_STRING: {
        size_t la, lb;
        const char *sa = nm_json_string(a, &la), *sb = nm_json_string(b, &lb);
        return la == lb && memcmp(sa, sb, la) == 0 && sa[la] == 0 && sb[lb] == 0;
    }
    default:
        for (size_t i = 0; i < nm_json_len(a); i++) {
            if (t == NM_JSON_OBJECT &&
                (nm_json_key_len(a, i) != nm_json_key_len(b, i) ||
                 memcmp(nm_json_key_at(a, i), nm_json_key_at(b, i), nm_json_key_len(a, i))))
                return false;
            if (!same_tree(nm_json_at(a, i), nm_json_at(b, i))) return false;
        }
        return true;
    }
}

static char *write_tree(const nm_json *v, size_t *n) {
    nm_json_writer *w = nm_json_writer_memory();
    nm_json_write_value(w, v);
    char *text = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_json_writer_finish(w, &text, n, &err), NM_OK);
    return text;
}

/* ---- valid documents ----------------------------------------------------- */

static void test_valid(void) {
    nm_json *v =
        parse_ok(" {\"a\": [1, {\"b\": null}, true, false, \"x\"], \"c\": {}, \"d\": []}\n");
    CHECK_INT_EQ(nm_json_type_of(v), NM_JSON_OBJECT);
    CHECK_INT_EQ(nm_json_len(v), 3);
    CHECK(strcmp(nm_json_key_at(v, 2), "d") == 0);
    const nm_json *a = nm_json_get(v, "a");
    CHECK_INT_EQ(nm_json_len(a), 5);
    CHECK_NEAR(nm_json_number(nm_json_at(a, 0)), 1, 0);
    CHECK_INT_EQ(nm_json_type_of(nm_json_get(nm_json_at(a, 1), "b")), NM_JSON_NULL);
    CHECK(nm_json_bool(nm_json_at(a, 2)) && !nm_json_bool(nm_json_at(a, 3)));
    CHECK(strcmp(nm_json_string(nm_json_at(a, 4), NULL), "x") == 0);
    CHECK_INT_EQ(nm_json_type_of(nm_json_get(v, "c")), NM_JSON_OBJECT);
    CHECK_INT_EQ(nm_json_len(nm_json_get(v, "d")), 0);
    CHECK(nm_json_get(v, "zz") == NULL && nm_json_get(a, "a") == NULL);
    CHECK(nm_json_get(NULL, "a") == NULL && nm_json_len(NULL) == 0);
    nm_json_free(v);

    /* Escapes, with the UTF-8 bytes Python's json.loads(...).encode() gives. */
    static const struct {
        const char *text, *bytes;
        size_t len;
    } strings[] = {
        {"\"\\u00e9\\u20AC\"", "\xc3\xa9\xe2\x82\xac", 5},
        {"\"\\ud83e\\udd99\"", "\xf0\x9f\xa6\x99", 4},
        {"\"\\uDBFF\\uDFFF\"", "\xf4\x8f\xbf\xbf", 4},
        {"\"a\\u0000b\"", "a\0b", 3},
        {"\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t", 8},
        {"\"caf\xc3\xa9 \xf0\x9f\xa6\x99\"", "caf\xc3\xa9 \xf0\x9f\xa6\x99", 10},
        {"\"\\u007f\\u0080\\u07FF\\u0800\\uFFFF\"", "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf",
         11},
        {"\"\"", "", 0},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        nm_json *s = parse_ok(strings[i].text);
        size_t len = 99;
        const char *got = s ? nm_json_string(s, &len) : "";
        CHECK_INT_EQ(len, strings[i].len);
        CHECK(memcmp(got, strings[i].bytes, strings[i].len) == 0 && got[len] == 0);
        nm_json_free(s);
    }

    /* A UTF-8 byte order mark is skipped; a document may be a scalar. */
    nm_json *bom = parse_ok("\xef\xbb\xbf{}");
    CHECK(bom && nm_json_type_of(bom) == NM_JSON_OBJECT);
    nm_json_free(bom);
    nm_json *str = parse_ok(" \"x\" ");
    CHECK(str && nm_json_type_of(str) == NM_JSON_STRING);
    nm_json_free(str);
}

/* Numbers: the doubles are Python's float(text).hex(). */
static void test_numbers(void) {
    static const struct {
        const char *text;
        double want;
    } cases[] = {{"0", 0.0},
                 {"1e308", 0x1.1ccf385ebc8a0p+1023},
                 {"5e-324", 0x0.0000000000001p-1022},
                 {"4.9406564584124654e-324", 0x0.0000000000001p-1022},
                 {"9007199254740992", 0x1p+53},
                 {"-9007199254740992", -0x1p+53},
                 {"9007199254740993", 0x1p+53}, /* rounds to even */
                 {"0.1", 0x1.999999999999ap-4},
                 {"1E+2", 100.0},
                 {"-1.5e-3", -0x1.89374bc6a7efap-10},
                 {"123456789012345678901234567890", 0x1.8ee90ff6c373ep+96},
                 {"2.2250738585072011e-308", 0x0.fffffffffffffp-1022},
                 {"1.7976931348623157e308", 0x1.fffffffffffffp+1023},
                 {"1e-400", 0.0}, /* below the range: rounds to zero */
                 {"123.456e-789", 0.0},
                 {"0.000001", 0x1.0c6f7a0b5ed8dp-20},
                 {"1e22", 0x1.0f0cf064dd592p+73},
                 {"23456789012E66", 0x1.9ee093a64b854p+253},
                 {"-123456789012345", -0x1.c12218377de40p+46},
                 {"999999999999999", 0x1.c6bf52633fff8p+49},
                 {"9999999999999999", 0x1.1c37937e08000p+53},
                 {"3.141592653589793238462643383279", 0x1.921fb54442d18p+1},
                 {"1.0", 1.0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nm_json *v = parse_ok(cases[i].text);
        double got = v ? nm_json_number(v) : NAN;
        if (memcmp(&got, &cases[i].want, sizeof got) != 0) {
            fprintf(stderr, "  %s -> %a, want %a\n", cases[i].text, got, cases[i].want);
            CHECK(false);
        }
        nm_json_free(v);
    }
    nm_json *neg0 = parse_ok("[-0, -0.0, -0e5]");
    for (size_t i = 0; neg0 && i < 3; i++) {
        double z = nm_json_number(nm_json_at(neg0, i));
        CHECK(z == 0 && signbit(z));
    }
    nm_json_free(neg0);

    /* Every integer up to 2^53 is exact, read through int64 getters too. */
    nm_json *big = parse_ok("{\"n\": 9007199254740992, \"m\": -9007199254740991, \"e\": 1e3}");
    int64_t n = 0, m = 0, e = 0;
    nm_error err = {0};
    CHECK_INT_EQ(nm_json_get_int(big, "n", 0, INT64_MAX, &n, "t", &err), NM_OK);
    CHECK_INT_EQ(nm_json_get_int(big, "m", INT64_MIN, 0, &m, "t", &err), NM_OK);
    CHECK_INT_EQ(nm_json_get_int(big, "e", 0, 1000, &e, "t", &err), NM_OK);
    CHECK(n == 9007199254740992LL && m == -9007199254740991LL && e == 1000);
    nm_json_free(big);
}

/* ---- malformed input ----------------------------------------------------- */

typedef struct bad_case {
    const char *text;
    size_t len; /* 0: strlen(text) */
    int line, column;
    const char *what;
} bad_case;

static void expect_bad(const bad_case *c) {
    size_t n = c->len ? c->len : strlen(c->text);
    nm_json *v = (nm_json *)&v; /* must be reset to NULL */
    nm_error err = {0};
    nm_status st = parse_n(c->text, n, &v, &err);
    char want[512];
    snprintf(want, sizeof want, "line %d, column %d: %s", c->line, c->column, c->what);
    char shown[40];
    for (size_t i = 0; i < sizeof shown - 1; i++)
        shown[i] = i < n ? (c->text[i] >= 0x20 || c->text[i] < 0 ? c->text[i] : '.') : ' ';
    shown[sizeof shown - 1] = '\0';
    printf("  %s -> %s\n", shown, err.msg);
    CHECK_INT_EQ(st, NM_ERR_FORMAT);
    CHECK(v == NULL);
    if (strncmp(err.msg, want, strlen(want)) != 0) {
        fprintf(stderr, "  message\n    %s\n  does not start with\n    %s\n", err.msg, want);
        CHECK(false);
    }
}

static void test_malformed(void) {
    static const bad_case cases[] = {
        {"", 0, 1, 1, "the document is empty"},
        {"  \n\t ", 0, 2, 3, "the document is empty"},
        {"[1,]", 0, 1, 4, "trailing comma: expected a value after ',', got ']'"},
        {"{\"a\":1,}", 0, 1, 8, "trailing comma: expected a key after ',', got '}'"},
        {"[1 2]", 0, 1, 4, "expected ',' or ']' after an array element, got '2'"},
        {"[1,2", 0, 1, 5, "expected ',' or ']' after an array element, got end of input"},
        {"{\"a\":1", 0, 1, 7, "expected ',' or '}' after an object member, got end of input"},
        {"{\"a\" 1}", 0, 1, 6, "expected ':' after the key, got '1'"},
        {"{a:1}", 0, 1, 2, "expected a key in double quotes, got 'a'"},
        {"{'a':1}", 0, 1, 2, "keys are strings in double quotes, not single quotes"},
        {"['x']", 0, 1, 2, "strings are written in double quotes, not single quotes"},
        {"{\"a\":}", 0, 1, 6, "expected a value, got '}'"},
        {"[,1]", 0, 1, 2, "expected a value, got ','"},
        {"// note\n1", 0, 1, 1, "comments are not allowed in JSON"},
        {"[1] /* c */", 0, 1, 5, "unexpected '/' after the end of the document"},
        {"1 2", 0, 1, 3, "unexpected '2' after the end of the document"},
        {"{\"a\":1}}", 0, 1, 8, "unexpected '}' after the end of the document"},
        {"[1]\r\n  ]", 0, 2, 3, "unexpected ']' after the end of the document"},
        {"NaN", 0, 1, 1, "NaN is not a JSON number"},
        {"[Infinity]", 0, 1, 2, "Infinity is not a JSON number"},
        {"[-Infinity]", 0, 1, 2, "-Infinity is not a JSON number"},
        {"01", 0, 1, 1, "leading zeros are not allowed in numbers"},
        {"[-012]", 0, 1, 2, "leading zeros are not allowed in numbers"},
        {"+1", 0, 1, 1, "numbers cannot start with '+'"},
        {".5", 0, 1, 1, "a number needs a digit before '.'"},
        {"1.", 0, 1, 3, "expected a digit after '.', got end of input"},
        {"[1.e5]", 0, 1, 4, "expected a digit after '.', got 'e5'"},
        {"1e", 0, 1, 3, "expected a digit in the exponent, got end of input"},
        {"1E+", 0, 1, 4, "expected a digit in the exponent, got end of input"},
        {"-", 0, 1, 2, "expected a digit after '-', got end of input"},
        {"- 1", 0, 1, 2, "expected a digit after '-', got ' '"},
        {"1e400", 0, 1, 1, "number 1e400 is out of the range of a double"},
        {"[0, -1.8e308]", 0, 1, 5, "number -1.8e308 is out of the range of a double"},
        {"tru", 0, 1, 1, "expected a value, got 'tru'"},
        {"[True]", 0, 1, 2, "expected a value, got 'True'"},
        {"nulll", 0, 1, 5, "unexpected 'l' after the end of the document"},
        {"\"abc", 0, 1, 5, "end of input inside the string that starts at line 1, column 1"},
        {"[\"\\", 0, 1, 4, "end of input inside the string that starts at line 1, column 2"},
        {"[\"a\\x\"]", 0, 1, 4, "invalid escape '\\' followed by 'x' in a string"},
        {"\"\\'\"", 0, 1, 2, "invalid escape '\\' followed by '''"},
        {"\"\\u12G4\"", 0, 1, 2, "'\\u' must be followed by 4 hex digits"},
        {"\"\\u12\"", 0, 1, 2, "'\\u' must be followed by 4 hex digits"},
        {"\"\\ud800\"", 0, 1, 2, "lone high surrogate \\uD800 in a string"},
        {"\"\\ud800\\u0041\"", 0, 1, 2, "lone high surrogate \\uD800"},
        {"\"\\uD83E\\uD83E\"", 0, 1, 2, "lone high surrogate \\uD83E"},
        {"\"x\\udc00\"", 0, 1, 3, "lone low surrogate \\uDC00 in a string"},
        {"\"a\tb\"", 0, 1, 3, "unescaped control character U+0009 in a string"},
        {"\"line\nbreak\"", 0, 1, 6, "unescaped control character U+000A in a string"},
        {"\"a\0b\"", 5, 1, 3, "unescaped control character U+0000 in a string"},
        {"\"\xff\"", 0, 1, 2, "invalid UTF-8 in a string (bytes FF)"},
        {"\"\xc0\xaf\"", 0, 1, 2, "invalid UTF-8 in a string (bytes C0)"},
        {"\"\xed\xa0\x80\"", 0, 1, 2, "invalid UTF-8 in a string (bytes ED)"},
        {"\"ab\xe2\x82\"", 0, 1, 4, "invalid UTF-8 in a string (bytes E2 82)"},
        {"\"\xf4\x90\x80\x80\"", 0, 1, 2, "invalid UTF-8 in a string (bytes F4)"},
        {"\"\xf0\x9f\xa6", 0, 1, 2, "invalid UTF-8 in a string (bytes F0 9F A6)"},
        {"[\"\xc3\xa9\", \xff]", 0, 1, 7, "expected a value, got invalid UTF-8 byte 0xFF"},
        {"[\"\xe6\x97\xa5\xe6\x9c\xac\", x]", 0, 1, 8, "expected a value, got 'x'"},
        {"\x00", 1, 1, 1, "expected a value, got control character U+0000"},
        {"{\"a\":1,\"b\":2,\"a\":3}", 0, 1, 14, "duplicate key 'a'"},
        {"{\"k\\u0000\":1,\"k\\u0000\":2}", 0, 1, 14, "duplicate key 'k\\u0000'"},
        {"{\"a\":1,\"a\":[1,]}", 0, 1, 8, "duplicate key 'a'"},
        {"{\n  \"a\": [1,\n    2,,\n  ]\n}", 0, 3, 7, "expected a value, got ','"},
        {"{\"a\":{\"b\":[\"\xc3\xa9\xc3\xa9\"}]}", 0, 1, 16,
         "expected ',' or ']' after an array element, got '}'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_bad(&cases[i]);
    printf("  %zu malformed documents refused\n", sizeof cases / sizeof cases[0]);

    /* Depth: 64 levels parse, 65 do not, nor a hostile 100000. */
    char deep[100001 * 2];
    for (int depth = 63; depth <= 65; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        nm_json *v = NULL;
        nm_error err = {0};
        nm_status st = parse_n(deep, 2 * (size_t)depth, &v, &err);
        CHECK_INT_EQ(st, depth <= NM_JSON_MAX_DEPTH ? NM_OK : NM_ERR_FORMAT);
        if (depth > NM_JSON_MAX_DEPTH)
            CHECK(strcmp(err.msg, "line 1, column 65: nesting deeper than 64 levels") == 0);
        nm_json_free(v);
    }
    memset(deep, '[', 100000);
    bad_case opening = {deep, 100000, 1, 65, "nesting deeper than 64 levels"};
    expect_bad(&opening);
    char *nest = malloc(5 * 50000);
    for (size_t i = 0; i < 50000; i++)
        memcpy(nest + 5 * i, "[{\"\":", 5);
    bad_case objects = {nest, 5 * 50000, 1, 161, "nesting deeper than 64 levels"};
    expect_bad(&objects);
    free(nest);

    /* Over the size limit: refused before a byte is read. */
    nm_json *v = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_json_parse("{}", NM_JSON_MAX_BYTES + 1, &v, &err), NM_ERR_CAPACITY);
    CHECK(strstr(err.msg, "more than the limit") != NULL && v == NULL);
}

/* Every proper prefix of a document is refused, never read past its end. */
static void test_truncation(void) {
    const char *doc = "{\"name\": \"caf\xc3\xa9 \\ud83e\\udd99\\n\", \"ids\": [1, -2.5e-3, 0],\n"
                      " \"ok\": true, \"no\": false, \"z\": null, \"o\": {\"k\": [[], {}]}}";
    size_t n = strlen(doc);
    int refused = 0;
    for (size_t len = 0; len < n; len++) {
        nm_json *v = NULL;
        nm_error err = {0};
        nm_status st = parse_n(doc, len, &v, &err);
        refused += st == NM_ERR_FORMAT && v == NULL && strncmp(err.msg, "line ", 5) == 0;
    }
    CHECK_INT_EQ(refused, n);
    nm_json_free(parse_ok(doc));
}

/* ---- UTF-8 against an independent validator ------------------------------ */

/* Decodes by the bit patterns, then refuses overlong forms, surrogates and
 * code points past U+10FFFF (RFC 3629), the way the RFC states it rather
 * than the lead-byte table the library uses. */
static bool ref_utf8_ok(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return false;
        unsigned long cp = len == 1 ? c : c & (0x7F >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] >> 6) != 2) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const unsigned long min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
        i += len;
    }
    return true;
}

static void check_string_bytes(const unsigned char *b, size_t n, long *mismatches) {
    char text[8];
    text[0] = '"';
    memcpy(text + 1, b, n);
    text[n + 1] = '"';
    bool want = ref_utf8_ok(b, n);
    for (size_t k = 0; k < n; k++) {
        if (b[k] == '"' || b[k] == '\\') return; /* not plain string content */
        want &= b[k] >= 0x20;
    }
    nm_json *v = NULL;
    nm_status st = nm_json_parse(text, n + 2, &v, NULL);
    if ((st == NM_OK) != want && ++*mismatches <= 5)
        fprintf(stderr, "  bytes %02X %02X %02X %02X (%zu): parser %d, reference %d\n", b[0],
                n > 1 ? b[1] : 0, n > 2 ? b[2] : 0, n > 3 ? b[3] : 0, n, st == NM_OK, want);
    if (st == NM_OK) {
        size_t len;
        const char *s = nm_json_string(v, &len);
        if (len != n || memcmp(s, b, n) != 0) ++*mismatches;
    }
    nm_json_free(v);
}

static void test_utf8_exhaustive(void) {
    long mismatches = 0;
    unsigned char b[4];
    for (unsigned x = 0; x < 256; x++) {
        b[0] = (unsigned char)x;
        check_string_bytes(b, 1, &mismatches);
        for (unsigned y = 0; y < 256; y++) {
            b[1] = (unsigned char)y;
            check_string_bytes(b, 2, &mismatches);
            if (x < 0xC0) continue; /* 3 bytes: every lead that starts a sequence */
            for (unsigned z = 0; z < 256; z++) {
                b[2] = (unsigned char)z;
                check_string_bytes(b, 3, &mismatches);
            }
        }
    }
    static const unsigned char edges[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90,
                                          0x9F, 0xA0, 0xBF, 0xC0, 0xF4, 0xFF};
    for (unsigned x = 0xF0; x < 0x100; x++)
        for (unsigned y = 0; y < 256; y++)
            for (size_t z = 0; z < sizeof edges; z++)
                for (size_t t = 0; t < sizeof edges; t++) {
                    b[0] = (unsigned char)x, b[1] = (unsigned char)y;
                    b[2] = edges[z], b[3] = edges[t];
                    check_string_bytes(b, 4, &mismatches);
                }
    CHECK_INT_EQ(mismatches, 0);
}

/* ---- typed getters ------------------------------------------------------- */

static void expect_msg(nm_status st, nm_status want_st, const nm_error *err, const char *want) {
    CHECK_INT_EQ(st, want_st);
    if (strcmp(err->msg, want) != 0) {
        fprintf(stderr, "  message\n    %s\n  wanted\n    %s\n", err->msg, want);
        CHECK(false);
    }
}

static void test_getters(void) {
    nm_json *doc =
        parse_ok("{\"tier\": 1.5, \"name\": \"x\", \"n\": 3, \"flag\": true, \"z\": null,"
                 " \"big\": 9007199254740994, \"huge\": 1e19, \"s0\": \"a\\u0000b\","
                 " \"arr\": [1, 2.5, \"q\\\"\"], \"obj\": {}, \"neg\": -0}");
    const char *where = "plan: layers[3].groups[0]";
    nm_error err = {0};
    int64_t i = 42;
    double d = 42;
    const char *s = NULL;
    bool b = false;
    const nm_json *c = NULL;

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
               "beyond 2^53 where a JSON number cannot hold every integer exactly");
    expect_msg(nm_json_get_int(doc, "huge", INT64_MIN, INT64_MAX, &i, "f", &err), NM_ERR_FORMAT,
               &err,
               "f.huge: expected an integer in [-9223372036854775808, 9223372036854775807], "
               "got 1e+19");
    expect_msg(nm_json_get_int(doc, "z", 0, 1, &i, "", &err), NM_ERR_FORMAT, &err,
               "z: expected an integer in [0, 1], got null");
    CHECK_INT_EQ(nm_json_get_int(doc, "n", 3, 3, &i, where, &err), NM_OK);
    CHECK_INT_EQ(i, 3);
    CHECK_INT_EQ(nm_json_get_int(doc, "neg", 0, 0, &i, where, &err), NM_OK);
    CHECK_INT_EQ(i, 0);

    expect_msg(nm_json_get_num(doc, "tier", 0, 1, &d, "cal", &err), NM_ERR_FORMAT, &err,
               "cal.tier: expected a number in [0, 1], got 1.5");
    expect_msg(nm_json_get_num(doc, "flag", -INFINITY, INFINITY, &d, "cal", &err), NM_ERR_FORMAT,
               &err, "cal.flag: expected a number in [-inf, inf], got true");
    expect_msg(nm_json_get_num(doc, "arr", 0.25, 1e300, &d, "cal", &err), NM_ERR_FORMAT, &err,
               "cal.arr: expected a number in [0.25, 1e+300], got an array");
    CHECK_INT_EQ(nm_json_get_num(doc, "tier", 1.5, 1.5, &d, "cal", &err), NM_OK);
    CHECK_NEAR(d, 1.5, 0);

    CHECK_INT_EQ(nm_json_get_str(doc, "name", &s, where, &err), NM_OK);
    CHECK(s && strcmp(s, "x") == 0);
    expect_msg(nm_json_get_str(doc, "s0", &s, "p", &err), NM_ERR_FORMAT, &err,
               "p.s0: expected a string without NUL characters (\\u0000), got \"a\\u0000b\"");
    expect_msg(nm_json_get_str(doc, "obj", &s, "p", &err), NM_ERR_FORMAT, &err,
               "p.obj: expected a string, got an object");
    CHECK_INT_EQ(nm_json_get_bool(doc, "flag", &b, "p", &err), NM_OK);
    CHECK(b);
    expect_msg(nm_json_get_bool(doc, "z", &b, "p", &err), NM_ERR_FORMAT, &err,
               "p.z: expected true or false, got null");
    CHECK_INT_EQ(nm_json_get_arr(doc, "arr", &c, "p", &err), NM_OK);
    CHECK(c == nm_json_get(doc, "arr"));
    expect_msg(nm_json_get_arr(doc, "obj", &c, "p", &err), NM_ERR_FORMAT, &err,
               "p.obj: expected an array, got an object");
    expect_msg(nm_json_get_obj(doc, "arr", &c, "p", &err), NM_ERR_FORMAT, &err,
               "p.arr: expected an object, got an array");
    expect_msg(nm_json_get_obj(doc, "nope", &c, NULL, &err), NM_ERR_NOT_FOUND, &err,
               "missing key 'nope'");
    CHECK_INT_EQ(nm_json_get_obj(doc, "obj", &c, "p", &err), NM_OK);

    /* Elements of an array, and getters asked of something not an object. */
    const nm_json *arr = nm_json_get(doc, "arr");
    CHECK_INT_EQ(nm_json_as_int(nm_json_at(arr, 0), 0, 1, &i, "p.arr[0]", &err), NM_OK);
    CHECK_INT_EQ(i, 1);
    expect_msg(nm_json_as_int(nm_json_at(arr, 1), 0, 5, &i, "p.arr[1]", &err), NM_ERR_FORMAT, &err,
               "p.arr[1]: expected an integer in [0, 5], got 2.5");
    expect_msg(nm_json_as_num(nm_json_at(arr, 2), 0, 5, &d, "p.arr[2]", &err), NM_ERR_FORMAT, &err,
               "p.arr[2]: expected a number in [0, 5], got \"q\\\"\"");
    expect_msg(nm_json_get_int(arr, "n", 0, 1, &i, "p.arr", &err), NM_ERR_FORMAT, &err,
               "p.arr: expected an object, got an array");
    nm_json_free(doc);

    CHECK(strcmp(nm_json_type_name(NM_JSON_OBJECT), "object") == 0);
}

/* ---- writer -------------------------------------------------------------- */

/* A compact document and the writer's layout of it, written by hand; the
 * numbers are Python's repr() of the same doubles (integral ones as
 * integers). */
static const char sample_src[] =
    "{\"name\":\"npumoe\",\"ids\":[1,2,-3],\"mixed\":[1.5,2,\"x\",[],{}],\"nested\":{\"a\":[0,[1,"
    "2]]},\"esc\":\"q\\\"b\\\\s\\/\\n\\t\\r\\b\\f\\u0001\\u001F\x7f \xc3\xa9\",\"k\\u0000ey\":null,"
    "\"t\":true,\"f\":false,\"nums\":[0.1,-0,1e300,5e-324,9007199254740992,100.0,-0.0015,"
    "1.2345678901234568e+29,2.225073858507201e-308,1e-06,1e16,9007199254740994,123456.789]}";

static const char sample_text[] =
    "{\n"
    "  \"name\": \"npumoe\",\n"
    "  \"ids\": [1, 2, -3],\n"
    "  \"mixed\": [\n    1.5,\n    2,\n    \"x\",\n    [],\n    {}\n  ],\n"
    "  \"nested\": {\n    \"a\": [\n      0,\n      [1, 2]\n    ]\n  },\n"
    "  \"esc\": \"q\\\"b\\\\s/\\n\\t\\r\\b\\f\\u0001\\u001f\x7f \xc3\xa9\",\n"
    "  \"k\\u0000ey\": null,\n"
    "  \"t\": true,\n"
    "  \"f\": false,\n"
    "  \"nums\": [0.1, -0, 1e+300, 5e-324, 9007199254740992, 100, -0.0015, "
    "1.2345678901234568e+29, 2.225073858507201e-308, 1e-06, 1e+16, 9007199254740994, "
    "123456.789]\n"
    "}\n";

static void check_text(const char *got, const char *want) {
    if (!got || strcmp(got, want) != 0) {
        fprintf(stderr, "  writer output:\n%s  wanted:\n%s", got ? got : "(null)\n", want);
        CHECK(false);
    }
}

#define FFFD "\xef\xbf\xbd"

static void test_writer(void) {
    /* The layout, then writer -> parser -> writer gives the same bytes. */
    nm_json *v = parse_ok(sample_src), *back = parse_ok(sample_text);
    size_t n = 0, n2 = 0;
    char *text = v ? write_tree(v, &n) : NULL, *again = back ? write_tree(back, &n2) : NULL;
    check_text(text, sample_text);
    CHECK(v && back && same_tree(v, back) && n == strlen(sample_text));
    CHECK(again && n2 == n && memcmp(again, text, n) == 0);
    nm_free(text);
    nm_free(again);
    nm_json_free(v);
    nm_json_free(back);

    /* Each call, with int64 extremes printed exactly. */
    nm_json_writer *w = nm_json_writer_memory();
    nm_json_begin_array(w);
    nm_json_write_int(w, INT64_MIN);
    nm_json_write_int(w, INT64_MAX);
    nm_json_write_num(w, -0.0);
    nm_json_begin_object(w);
    nm_json_key(w, "s");
    nm_json_write_str(w, "");
    nm_json_key_n(w, "k\0", 2);
    nm_json_write_bool(w, false);
    nm_json_end_object(w);
    nm_json_write_null(w);
    nm_json_end_array(w);
    nm_error err = {0};
    CHECK_INT_EQ(nm_json_writer_finish(w, &text, &n, &err), NM_OK);
    check_text(text, "[\n  -9223372036854775808,\n  9223372036854775807,\n  -0,\n  {\n    "
                     "\"s\": \"\",\n    \"k\\u0000\": false\n  },\n  null\n]\n");
    nm_free(text);

    /* Invalid UTF-8 becomes U+FFFD per maximal subpart, as Python's
     * bytes.decode('utf-8', 'replace') does. */
    static const struct {
        const char *bytes, *want;
    } bad[] = {
        {"a\377b", "\"a" FFFD "b\"\n"},
        {"\342\202a", "\"" FFFD "a\"\n"},
        {"\xf0\x80\x80", "\"" FFFD FFFD FFFD "\"\n"},
        {"\xf4\x8f\xbf", "\"" FFFD "\"\n"},
        {"\xed\xa0\x80", "\"" FFFD FFFD FFFD "\"\n"},
        {"\xc0\xaf", "\"" FFFD FFFD "\"\n"},
        {"\xf1\x80\x80\xe1\x80\xc2x", "\"" FFFD FFFD FFFD "x\"\n"},
        {"\xe0\x9f\x80", "\"" FFFD FFFD FFFD "\"\n"},
        {"\xf0\x9f\xa6", "\"" FFFD "\"\n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        w = nm_json_writer_memory();
        nm_json_write_str(w, bad[i].bytes);
        CHECK_INT_EQ(nm_json_writer_finish(w, &text, &n, &err), NM_OK);
        check_text(text, bad[i].want);
        nm_free(text);
    }
    nm_json_writer_free(nm_json_writer_memory());
    nm_json_writer_free(NULL);
}

/* A file writer flushes as it goes but must still re-lay a long one-line
 * array; its bytes equal the memory writer's. */
static void write_long(nm_json_writer *w) {
    static char pad[70001];
    memset(pad, 'a', 70000);
    nm_json_begin_object(w);
    nm_json_key(w, "pad");
    nm_json_write_str(w, pad);
    nm_json_key(w, "vals");
    nm_json_begin_array(w);
    for (int i = 0; i < 20000; i++)
        nm_json_write_int(w, i * 7 - 5);
    nm_json_write_str(w, "end");
    nm_json_end_array(w);
    nm_json_key(w, "row");
    nm_json_begin_array(w);
    for (int i = 0; i < 30000; i++)
        nm_json_write_num(w, i + 0.5);
    nm_json_end_array(w);
    nm_json_end_object(w);
}

static void test_file_writer(void) {
    nm_json_writer *w = nm_json_writer_memory();
    write_long(w);
    char *want = NULL;
    size_t n_want = 0;
    nm_error err = {0};
    CHECK_INT_EQ(nm_json_writer_finish(w, &want, &n_want, &err), NM_OK);
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f || !want) return;
    w = nm_json_writer_file(f);
    write_long(w);
    CHECK_INT_EQ(nm_json_writer_finish(w, NULL, NULL, &err), NM_OK);
    long size = ftell(f);
    char *got = malloc((size_t)size + 1);
    rewind(f);
    CHECK(fread(got, 1, (size_t)size, f) == (size_t)size);
    CHECK(size == (long)n_want && memcmp(got, want, n_want) == 0);
    CHECK(strstr(want, "\n    -5,\n    2,\n") && strstr(want, "\n    \"end\"\n  ],\n"));
    CHECK(strstr(want, "\"row\": [0.5, 1.5, 2.5,") != NULL);
    fclose(f);
    free(got);
    nm_free(want);

    /* A full disk is reported when finishing. */
    FILE *full = fopen("/dev/full", "w");
    if (full) {
        w = nm_json_writer_file(full);
        write_long(w);
        CHECK_INT_EQ(nm_json_writer_finish(w, NULL, NULL, &err), NM_ERR_IO);
        CHECK(strstr(err.msg, "cannot write JSON: ") != NULL);
        fclose(full);
    }
}

static void test_files(void) {
    char dir[] = "/tmp/nm_json_XXXXXX", path[256], missing[256];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/plan.json", dir);
    nm_error err = {0};
    CHECK_INT_EQ(nm_json_write_file(path, sample_text, strlen(sample_text), &err), NM_OK);
    nm_json *v = NULL, *ref = parse_ok(sample_text);
    CHECK_INT_EQ(nm_json_parse_file(path, &v, &err), NM_OK);
    CHECK(v && ref && same_tree(v, ref));
    nm_json_free(v);
    nm_json_free(ref);

    /* Replacing keeps the old file's permissions and leaves no temporary. */
    const char *bad = "{\n  \"a\": tru\n}";
    CHECK(chmod(path, 0640) == 0);
    CHECK_INT_EQ(nm_json_write_file(path, bad, strlen(bad), &err), NM_OK);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0640);
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        entries += e->d_name[0] != '.';
    if (d) closedir(d);
    CHECK_INT_EQ(entries, 1);

    char want[512];
    snprintf(want, sizeof want, "%s: line 2, column 8: expected a value, got 'tru'", path);
    expect_msg(nm_json_parse_file(path, &v, &err), NM_ERR_FORMAT, &err, want);
    CHECK(v == NULL);
    snprintf(missing, sizeof missing, "%s/nope.json", dir);
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", missing);
    expect_msg(nm_json_parse_file(missing, &v, &err), NM_ERR_IO, &err, want);
    snprintf(want, sizeof want, "%s: is a directory", dir);
    expect_msg(nm_json_parse_file(dir, &v, &err), NM_ERR_IO, &err, want);
    snprintf(missing, sizeof missing, "%s/no/such/dir.json", dir);
    CHECK_INT_EQ(nm_json_write_file(missing, "1", 1, &err), NM_ERR_IO);
    CHECK(strncmp(err.msg, missing, strlen(missing)) == 0);

    /* A directory is refused before anything is created beside it. */
    snprintf(missing, sizeof missing, "%s/sub", dir);
    CHECK(mkdir(missing, 0700) == 0);
    CHECK_INT_EQ(nm_json_write_file(missing, "1", 1, &err), NM_ERR_IO);
    CHECK(strstr(err.msg, "is a directory") != NULL);
    d = opendir(dir);
    entries = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        entries += e->d_name[0] != '.';
    if (d) closedir(d);
    CHECK_INT_EQ(entries, 2);
    CHECK(rmdir(missing) == 0);

    /* A symbolic link: the file it points to is replaced, the link stays;
     * a link to nothing is refused. */
    char link[512];
    snprintf(link, sizeof link, "%s/link.json", dir);
    CHECK(symlink("plan.json", link) == 0);
    CHECK_INT_EQ(nm_json_write_file(link, "[7]", 3, &err), NM_OK);
    struct stat lst;
    CHECK(lstat(link, &lst) == 0 && S_ISLNK(lst.st_mode));
    CHECK_INT_EQ(nm_json_parse_file(path, &v, &err), NM_OK);
    CHECK(v && nm_json_number(nm_json_at(v, 0)) == 7);
    nm_json_free(v);
    CHECK(unlink(link) == 0 && symlink("gone.json", link) == 0);
    CHECK_INT_EQ(nm_json_write_file(link, "1", 1, &err), NM_ERR_IO);
    CHECK(strstr(err.msg, "symbolic link to a missing file") != NULL);
    CHECK(unlink(link) == 0);
    /* A character device is written directly, never replaced. */
    CHECK_INT_EQ(nm_json_write_file("/dev/null", "1", 1, &err), NM_OK);
    CHECK(stat("/dev/null", &lst) == 0 && S_ISCHR(lst.st_mode));

    /* A pipe: no size up front, read until its end. */
    snprintf(missing, sizeof missing, "%s/pipe.json", dir);
    CHECK(mkfifo(missing, 0600) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen(missing, "w");
        fputs("[", f);
        for (int i = 0; i < 20000; i++)
            fprintf(f, "%s%d", i ? ", " : "", i);
        fputs("]", f);
        fclose(f);
        _exit(0);
    }
    CHECK_INT_EQ(nm_json_parse_file(missing, &v, &err), NM_OK);
    CHECK(nm_json_len(v) == 20000 && nm_json_number(nm_json_at(v, 19999)) == 19999);
    nm_json_free(v);
    waitpid(pid, NULL, 0);
    unlink(missing);
    unlink(path);
    CHECK(rmdir(dir) == 0);
}

/* Misuse of the writer is a programmer error: the process aborts. */
static void test_writer_misuse(void) {
    for (int kind = 0; kind < 6; kind++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            (void)!freopen("/dev/null", "w", stderr);
            nm_json_writer *w = nm_json_writer_memory();
            char *text;
            size_t n;
            nm_json_begin_object(w);
            if (kind == 0) nm_json_write_int(w, 1); /* a value where a key is due */
            if (kind == 1) nm_json_end_array(w);    /* unbalanced end */
            if (kind == 2) nm_json_writer_finish(w, &text, &n, NULL); /* incomplete */
            if (kind == 3) {
                nm_json_key(w, "a");
                nm_json_write_num(w, NAN);
            }
            if (kind == 4) {
                nm_json_key(w, "a");
                nm_json_key(w, "b"); /* a key where a value is due */
            }
            if (kind == 5) {
                nm_json_end_object(w);
                nm_json_write_null(w); /* a second top-level value */
            }
            _exit(0);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    }
}

/* ---- allocation failures ------------------------------------------------- */

static void test_alloc_failures(void) {
    /* Big enough for several arena chunks, strings with blocks of their own
     * (the first allocation among them), an indexed object (> 16 keys),
     * escapes and a number too long for the stack buffer. */
    char *doc = malloc(64 * 1024);
    size_t o =
        (size_t)sprintf(doc, "{\"%03000d\": 1%0120d.5, \"s\": \"\\u00e9\\n%05000d\"", 0, 0, 7);
    for (int i = 0; i < 300; i++)
        o += (size_t)sprintf(doc + o, ", \"key%03d\": [%d, \"v%d\", {\"x\": [true, null]}]", i, i,
                             i);
    strcpy(doc + o, "}");
    nm_json *ref = parse_ok(doc);
    size_t n_ref = 0;
    char *ref_text = write_tree(ref, &n_ref);
    int steps[4] = {0};
    for (int what = 0; what < 4; what++) {
        char path[] = "/tmp/nm_json_alloc_XXXXXX";
        int fd = what >= 2 ? mkstemp(path) : -1;
        if (fd >= 0) close(fd);
        if (what == 3) nm_json_write_file(path, doc, strlen(doc), NULL);
        for (long k = 0;; k++) {
            nm_json *v = NULL;
            char *text = NULL;
            size_t n = 0;
            nm_error err = {0};
            nm_status st = NM_OK;
            nm_alloc_fail_after(k);
            if (what == 0) {
                st = nm_json_parse(doc, strlen(doc), &v, &err);
            } else if (what == 1) {
                nm_json_writer *w = nm_json_writer_memory();
                if (!w) {
                    nm_alloc_fail_after(-1);
                    continue;
                }
                nm_json_write_value(w, ref);
                st = nm_json_writer_finish(w, &text, &n, &err);
            } else if (what == 2) {
                st = nm_json_write_file(path, ref_text, n_ref, &err);
            } else {
                st = nm_json_parse_file(path, &v, &err);
            }
            nm_alloc_fail_after(-1);
            if (st == NM_OK) {
                CHECK(what == 1   ? n == n_ref && memcmp(text, ref_text, n) == 0
                      : what == 2 ? true
                                  : same_tree(v, ref));
                nm_json_free(v);
                nm_free(text);
                steps[what] = (int)k;
                break;
            }
            CHECK_INT_EQ(st, NM_ERR_NOMEM);
            CHECK(v == NULL && text == NULL);
        }
        if (what >= 2) unlink(path);
    }
    printf("  allocation failures: parse %d, writer %d, write_file %d, parse_file %d\n", steps[0],
           steps[1], steps[2], steps[3]);
    CHECK(steps[0] > 5 && steps[1] > 3);
    nm_json_free(ref);
    nm_free(ref_text);
    free(doc);
}

int main(void) {
    test_valid();
    test_numbers();
    test_malformed();
    test_truncation();
    test_utf8_exhaustive();
    test_getters();
    test_writer();
    test_file_writer();
    test_files();
    test_writer_misuse();
    test_alloc_failures();
    return nm_test_finish("test_json");
}
