/* GGUF reader and writer: round trips of every value type and of tensors,
 * the real llama.cpp files in shared/vectors (facts checked against an
 * independent Python parse of the same bytes), malformed files that must be
 * refused with the right status and message, truncation at every length,
 * random byte corruption, and allocation-failure injection. */
#include "harness.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers -------------------------------------------------------------- */

static uint8_t *to_memory(const nm_gguf_writer *w, size_t *n_bytes) {
    uint8_t *bytes = NULL;
    nm_error err = {0};
    nm_status st = nm_gguf_writer_to_memory(w, &bytes, n_bytes, &err);
    CHECK_INT_EQ(st, NM_OK);
    return bytes;
}

/* Opens bytes[0..n) from an exactly sized copy, so that ASan sees any read
 * past the end. */
static nm_status open_copy(const uint8_t *bytes, size_t n, nm_gguf **out, void **copy,
                           nm_error *err) {
    *copy = malloc(n ? n : 1);
    if (n) memcpy(*copy, bytes, n);
    return nm_gguf_open_memory(*copy, n, out, err);
}

static void expect_fail(const char *label, const uint8_t *bytes, size_t n, nm_status want,
                        const char *substring) {
    nm_gguf *g = NULL;
    nm_error err = {0};
    void *copy;
    nm_status st = open_copy(bytes, n, &g, &copy, &err);
    printf("  %-30s -> [%s] %s\n", label, nm_status_str(st), err.msg);
    CHECK_INT_EQ(st, want);
    CHECK(g == NULL);
    if (!strstr(err.msg, substring)) {
        fprintf(stderr, "  %s: message lacks '%s'\n", label, substring);
        CHECK(strstr(err.msg, substring) != NULL);
    }
    nm_gguf_close(g);
    free(copy);
}

static size_t find_bytes(const uint8_t *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++) {
        if (memcmp(hay + i, needle, m) == 0) return i;
    }
    fprintf(stderr, "test bug: '%s' not in the file\n", needle);
    abort();
}

/* Byte position just after a key's (or tensor name's) bytes: the position of
 * a kv's type field or a tensor's n_dims. */
static size_t after_name(const uint8_t *bytes, size_t n, const char *name) {
    return find_bytes(bytes, n, name) + strlen(name);
}

static void poke(uint8_t *bytes, size_t at, uint64_t v, size_t n_bytes) {
    for (size_t i = 0; i < n_bytes; i++)
        bytes[at + i] = (uint8_t)(v >> (8 * i));
}

static uint64_t peek(const uint8_t *bytes, size_t at, size_t n_bytes) {
    uint64_t v = 0;
    for (size_t i = 0; i < n_bytes; i++)
        v |= (uint64_t)bytes[at + i] << (8 * i);
    return v;
}

static uint8_t *dup_bytes(const uint8_t *bytes, size_t n) {
    uint8_t *c = malloc(n);
    memcpy(c, bytes, n);
    return c;
}

/* A hand-built byte string for files the writer refuses to make. */
typedef struct bytes_out {
    uint8_t b[4096];
    size_t n;
} bytes_out;

static void out_le(bytes_out *o, uint64_t v, size_t n_bytes) {
    poke(o->b, o->n, v, n_bytes);
    o->n += n_bytes;
}

static void out_str(bytes_out *o, const char *s) {
    out_le(o, strlen(s), 8);
    memcpy(o->b + o->n, s, strlen(s));
    o->n += strlen(s);
}

static void out_header(bytes_out *o, uint64_t n_tensors, uint64_t n_kv) {
    memcpy(o->b, "GGUF", 4);
    o->n = 4;
    out_le(o, 3, 4);
    out_le(o, n_tensors, 8);
    out_le(o, n_kv, 8);
}

/* ---- round trip of metadata ----------------------------------------------- */

static void test_type_names(void) {
    CHECK(strcmp(nm_gguf_type_name(NM_GGUF_UINT8), "u8") == 0);
    CHECK(strcmp(nm_gguf_type_name(NM_GGUF_STRING), "str") == 0);
    CHECK(strcmp(nm_gguf_type_name(NM_GGUF_FLOAT64), "f64") == 0);
    CHECK(strcmp(nm_gguf_type_name(NM_GGUF_TYPE_COUNT), "unknown") == 0);
}

static const nm_gguf_value *must_find(const nm_gguf *g, const char *key) {
    const nm_gguf_value *v = nm_gguf_find(g, key);
    if (!v) fprintf(stderr, "key %s missing\n", key);
    CHECK(v != NULL);
    return v;
}

static void test_roundtrip_values(void) {
    nm_gguf_writer *w = nm_gguf_writer_new();
    CHECK(w != NULL);
    /* Every scalar type through set_value, at the edges of its range. */
    const nm_gguf_value scalars[] = {
        {.type = NM_GGUF_UINT8, .v.u64 = 255},
        {.type = NM_GGUF_INT8, .v.i64 = -128},
        {.type = NM_GGUF_UINT16, .v.u64 = 65535},
        {.type = NM_GGUF_INT16, .v.i64 = -32768},
        {.type = NM_GGUF_UINT32, .v.u64 = 4000000000u},
        {.type = NM_GGUF_INT32, .v.i64 = INT32_MIN},
        {.type = NM_GGUF_FLOAT32, .v.f64 = 0.1f},
        {.type = NM_GGUF_BOOL, .v.b = true},
        {.type = NM_GGUF_STRING, .v.str = {"a\0b\xc3\xa9", 5}},
        {.type = NM_GGUF_UINT64, .v.u64 = UINT64_MAX},
        {.type = NM_GGUF_INT64, .v.i64 = INT64_MIN},
        {.type = NM_GGUF_FLOAT64, .v.f64 = 1.0 / 3.0},
    };
    const char *scalar_keys[] = {"t.u8",  "t.i8",   "t.u16", "t.i16", "t.u32", "t.i32",
                                 "t.f32", "t.bool", "t.str", "t.u64", "t.i64", "t.f64"};
    size_t n_scalars = sizeof scalars / sizeof scalars[0];
    for (size_t i = 0; i < n_scalars; i++) {
        CHECK_INT_EQ(nm_gguf_writer_set_value(w, scalar_keys[i], &scalars[i]), NM_OK);
    }
    CHECK_INT_EQ(nm_gguf_writer_set_u32(w, "s.u32", 7), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_i32(w, "s.i32", -7), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_u64(w, "s.u64", 1ull << 40), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_f32(w, "s.f32", 1e-6f), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_bool(w, "s.bool", false), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_str(w, "s.str", "qwen3moe"), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_str(w, "s.empty", ""), NM_OK);

    /* Arrays of every numeric type. */
    const uint8_t a_u8[] = {0, 1, 255};
    const int8_t a_i8[] = {-128, 0, 127};
    const uint16_t a_u16[] = {1, 65535};
    const int16_t a_i16[] = {-32768, 32767};
    const uint32_t a_u32[] = {0, 4294967295u};
    const int32_t a_i32[] = {-1, 2, -3, 4};
    const float a_f32[] = {0.5f, -2.25f};
    const uint8_t a_bool[] = {1, 0, 1};
    const uint64_t a_u64[] = {UINT64_MAX, 3};
    const int64_t a_i64[] = {INT64_MIN, -5};
    const double a_f64[] = {1e300, -0.125};
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.u8", NM_GGUF_UINT8, a_u8, 3), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.i8", NM_GGUF_INT8, a_i8, 3), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.u16", NM_GGUF_UINT16, a_u16, 2), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.i16", NM_GGUF_INT16, a_i16, 2), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.u32", NM_GGUF_UINT32, a_u32, 2), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.i32", NM_GGUF_INT32, a_i32, 4), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.f32", NM_GGUF_FLOAT32, a_f32, 2), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.bool", NM_GGUF_BOOL, a_bool, 3), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.u64", NM_GGUF_UINT64, a_u64, 2), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.i64", NM_GGUF_INT64, a_i64, 2), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.f64", NM_GGUF_FLOAT64, a_f64, 2), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "a.empty", NM_GGUF_INT32, NULL, 0), NM_OK);
    const char *strs[] = {"hello", "", "\xe4\xb8\xad"};
    CHECK_INT_EQ(nm_gguf_writer_set_arr_str(w, "a.str", strs, 3), NM_OK);

    /* Nested: [[1, 2, 3], [], [4]] of i32, [["x", "yz"], ["w"]] of strings,
     * and an array 8 levels deep (the most the reader accepts). */
    const int32_t n1[] = {1, 2, 3}, n3[] = {4};
    const nm_gguf_value inner_i32[] = {
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_INT32, 3, n1}},
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_INT32, 0, NULL}},
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_INT32, 1, n3}},
    };
    const nm_gguf_value nested_i32 = {.type = NM_GGUF_ARRAY,
                                      .v.arr = {NM_GGUF_ARRAY, 3, inner_i32}};
    const nm_gguf_str s0[] = {{"x", 1}, {"yz", 2}}, s1[] = {{"w", 1}};
    const nm_gguf_value inner_str[] = {
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_STRING, 2, s0}},
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_STRING, 1, s1}},
    };
    const nm_gguf_value nested_str = {.type = NM_GGUF_ARRAY,
                                      .v.arr = {NM_GGUF_ARRAY, 2, inner_str}};
    CHECK_INT_EQ(nm_gguf_writer_set_value(w, "n.i32", &nested_i32), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_set_value(w, "n.str", &nested_str), NM_OK);
    nm_gguf_value deep[9];
    const uint8_t leaf[] = {42};
    deep[0] = (nm_gguf_value){.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_UINT8, 1, leaf}};
    for (int i = 1; i < 9; i++) {
        deep[i] = (nm_gguf_value){.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_ARRAY, 1, &deep[i - 1]}};
    }
    CHECK_INT_EQ(nm_gguf_writer_set_value(w, "n.deep8", &deep[7]), NM_OK);

    /* What the writer must refuse. */
    CHECK_INT_EQ(nm_gguf_writer_set_value(w, "n.deep9", &deep[8]), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_set_u32(w, "s.u32", 8), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_set_u32(w, "", 8), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_set_u32(w, "general.alignment", 48), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_set_u64(w, "general.alignment", 64), NM_ERR_INVALID_ARG);
    const nm_gguf_value bad_i8 = {.type = NM_GGUF_INT8, .v.i64 = 128};
    CHECK_INT_EQ(nm_gguf_writer_set_value(w, "bad.i8", &bad_i8), NM_ERR_INVALID_ARG);
    const uint8_t bad_bools[] = {0, 2};
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "bad.bool", NM_GGUF_BOOL, bad_bools, 2),
                 NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_set_arr(w, "bad.str", NM_GGUF_STRING, strs, 3), NM_ERR_INVALID_ARG);

    size_t n;
    uint8_t *bytes = to_memory(w, &n);
    nm_gguf_writer_free(w);
    nm_gguf *g = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_open_memory(bytes, n, &g, &err), NM_OK);
    if (!g) {
        fprintf(stderr, "round trip: %s\n", err.msg);
        nm_free(bytes);
        return;
    }
    CHECK_INT_EQ(nm_gguf_version(g), 3);
    CHECK_INT_EQ(nm_gguf_alignment(g), 32);
    CHECK_INT_EQ(nm_gguf_n_tensors(g), 0);
    CHECK_INT_EQ(nm_gguf_file_bytes(g), n);
    CHECK_INT_EQ(nm_gguf_n_kv(g), n_scalars + 7 + 13 + 3);
    /* File order is kept. */
    CHECK(nm_gguf_str_eq(nm_gguf_kv_at(g, 0)->key, "t.u8"));
    CHECK(nm_gguf_str_eq(nm_gguf_kv_at(g, n_scalars)->key, "s.u32"));

    for (size_t i = 0; i < n_scalars; i++) {
        const nm_gguf_value *v = must_find(g, scalar_keys[i]);
        if (!v) continue;
        CHECK_INT_EQ(v->type, scalars[i].type);
    }
    CHECK_INT_EQ(must_find(g, "t.u8")->v.u64, 255);
    CHECK_INT_EQ(must_find(g, "t.i8")->v.i64, -128);
    CHECK_INT_EQ(must_find(g, "t.u16")->v.u64, 65535);
    CHECK_INT_EQ(must_find(g, "t.i16")->v.i64, -32768);
    CHECK_INT_EQ(must_find(g, "t.u32")->v.u64, 4000000000u);
    CHECK_INT_EQ(must_find(g, "t.i32")->v.i64, INT32_MIN);
    CHECK(must_find(g, "t.f32")->v.f64 == (double)0.1f);
    CHECK(must_find(g, "t.bool")->v.b == true);
    nm_gguf_str s = must_find(g, "t.str")->v.str;
    CHECK(s.len == 5 && memcmp(s.ptr, "a\0b\xc3\xa9", 5) == 0);
    CHECK(must_find(g, "t.u64")->v.u64 == UINT64_MAX);
    CHECK(must_find(g, "t.i64")->v.i64 == INT64_MIN);
    CHECK(must_find(g, "t.f64")->v.f64 == 1.0 / 3.0);
    CHECK(nm_gguf_find(g, "t.u") == NULL);
    CHECK(nm_gguf_find(g, "t.u88") == NULL);

    /* Typed getters: widths convert when the value fits. */
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f32;
    bool b;
    nm_gguf_str str;
    CHECK_INT_EQ(nm_gguf_get_u32(g, "s.u32", &u32, &err), NM_OK);
    CHECK_INT_EQ(u32, 7);
    CHECK_INT_EQ(nm_gguf_get_u32(g, "t.u8", &u32, &err), NM_OK);
    CHECK_INT_EQ(u32, 255);
    CHECK_INT_EQ(nm_gguf_get_i32(g, "t.i16", &i32, &err), NM_OK);
    CHECK_INT_EQ(i32, -32768);
    CHECK_INT_EQ(nm_gguf_get_i32(g, "s.u32", &i32, &err), NM_OK);
    CHECK_INT_EQ(i32, 7);
    CHECK_INT_EQ(nm_gguf_get_u64(g, "s.u64", &u64, &err), NM_OK);
    CHECK(u64 == 1ull << 40);
    CHECK_INT_EQ(nm_gguf_get_u64(g, "s.i32", &u64, &err), NM_ERR_FORMAT);
    CHECK(strstr(err.msg, "s.i32") != NULL);
    CHECK_INT_EQ(nm_gguf_get_u32(g, "s.u64", &u32, &err), NM_ERR_FORMAT);
    CHECK(strstr(err.msg, "out of range for u32") != NULL);
    printf("  getter range: %s\n", err.msg);
    CHECK_INT_EQ(nm_gguf_get_i32(g, "t.u32", &i32, &err), NM_ERR_FORMAT);
    CHECK_INT_EQ(nm_gguf_get_u32(g, "t.i8", &u32, &err), NM_ERR_FORMAT);
    CHECK_INT_EQ(nm_gguf_get_u32(g, "s.str", &u32, &err), NM_ERR_FORMAT);
    CHECK(strstr(err.msg, "has type str") != NULL);
    CHECK_INT_EQ(nm_gguf_get_u32(g, "t.bool", &u32, &err), NM_ERR_FORMAT);
    CHECK_INT_EQ(nm_gguf_get_u32(g, "no.such.key", &u32, &err), NM_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "no.such.key") != NULL);
    CHECK_INT_EQ(nm_gguf_get_f32(g, "s.f32", &f32, &err), NM_OK);
    CHECK(f32 == 1e-6f);
    CHECK_INT_EQ(nm_gguf_get_f32(g, "t.f64", &f32, &err), NM_OK);
    CHECK(f32 == (float)(1.0 / 3.0));
    CHECK_INT_EQ(nm_gguf_get_f32(g, "s.u32", &f32, &err), NM_ERR_FORMAT);
    CHECK_INT_EQ(nm_gguf_get_bool(g, "s.bool", &b, &err), NM_OK);
    CHECK(b == false);
    CHECK_INT_EQ(nm_gguf_get_bool(g, "s.u32", &b, &err), NM_ERR_FORMAT);
    CHECK_INT_EQ(nm_gguf_get_str(g, "s.str", &str, &err), NM_OK);
    CHECK(nm_gguf_str_eq(str, "qwen3moe"));
    CHECK(!nm_gguf_str_eq(str, "qwen3"));
    CHECK_INT_EQ(nm_gguf_get_str(g, "s.empty", &str, &err), NM_OK);
    CHECK(nm_gguf_str_eq(str, ""));
    CHECK_INT_EQ(nm_gguf_get_str(g, "s.u32", &str, &err), NM_ERR_FORMAT);

    /* Arrays. */
    const nm_gguf_value *arr;
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.i32", NM_GGUF_INT32, &arr, &err), NM_OK);
    CHECK_INT_EQ(arr->v.arr.n, 4);
    for (int i = 0; i < 4; i++)
        CHECK_INT_EQ(nm_gguf_arr_i64(arr, (uint64_t)i), a_i32[i]);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.i32", NM_GGUF_UINT32, &arr, &err), NM_ERR_FORMAT);
    CHECK(strstr(err.msg, "array of i32") != NULL);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "s.u32", NM_GGUF_TYPE_COUNT, &arr, &err), NM_ERR_FORMAT);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.u8", NM_GGUF_TYPE_COUNT, &arr, &err), NM_OK);
    for (int i = 0; i < 3; i++)
        CHECK_INT_EQ(nm_gguf_arr_i64(arr, (uint64_t)i), a_u8[i]);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.i8", NM_GGUF_INT8, &arr, &err), NM_OK);
    for (int i = 0; i < 3; i++)
        CHECK_INT_EQ(nm_gguf_arr_i64(arr, (uint64_t)i), a_i8[i]);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.u16", NM_GGUF_UINT16, &arr, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_arr_i64(arr, 1), 65535);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.i16", NM_GGUF_INT16, &arr, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_arr_i64(arr, 0), -32768);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.u32", NM_GGUF_UINT32, &arr, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_arr_i64(arr, 1), 4294967295ll);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.f32", NM_GGUF_FLOAT32, &arr, &err), NM_OK);
    CHECK(nm_gguf_arr_f64(arr, 1) == -2.25);
    CHECK_INT_EQ(nm_gguf_arr_i64(arr, 1), -2);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.bool", NM_GGUF_BOOL, &arr, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_arr_i64(arr, 0) + nm_gguf_arr_i64(arr, 1) + nm_gguf_arr_i64(arr, 2), 2);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.u64", NM_GGUF_UINT64, &arr, &err), NM_OK);
    CHECK(nm_gguf_arr_i64(arr, 0) == INT64_MAX); /* saturates, documented */
    CHECK(nm_gguf_arr_f64(arr, 0) == 18446744073709551615.0);
    CHECK_INT_EQ(nm_gguf_arr_i64(arr, 1), 3);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.i64", NM_GGUF_INT64, &arr, &err), NM_OK);
    CHECK(nm_gguf_arr_i64(arr, 0) == INT64_MIN);
    CHECK(nm_gguf_arr_f64(arr, 1) == -5.0);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.f64", NM_GGUF_FLOAT64, &arr, &err), NM_OK);
    CHECK(nm_gguf_arr_f64(arr, 0) == 1e300 && nm_gguf_arr_f64(arr, 1) == -0.125);
    CHECK(nm_gguf_arr_i64(arr, 0) == INT64_MAX);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.empty", NM_GGUF_INT32, &arr, &err), NM_OK);
    CHECK_INT_EQ(arr->v.arr.n, 0);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "a.str", NM_GGUF_STRING, &arr, &err), NM_OK);
    CHECK_INT_EQ(arr->v.arr.n, 3);
    CHECK(nm_gguf_str_eq(nm_gguf_arr_str(arr, 0), "hello"));
    CHECK(nm_gguf_str_eq(nm_gguf_arr_str(arr, 1), ""));
    CHECK(nm_gguf_str_eq(nm_gguf_arr_str(arr, 2), "\xe4\xb8\xad"));

    CHECK_INT_EQ(nm_gguf_get_arr(g, "n.i32", NM_GGUF_ARRAY, &arr, &err), NM_OK);
    CHECK_INT_EQ(arr->v.arr.n, 3);
    const nm_gguf_value *items = arr->v.arr.data;
    CHECK_INT_EQ(items[0].type, NM_GGUF_ARRAY);
    CHECK_INT_EQ(items[0].v.arr.type, NM_GGUF_INT32);
    CHECK_INT_EQ(items[0].v.arr.n, 3);
    CHECK_INT_EQ(nm_gguf_arr_i64(&items[0], 2), 3);
    CHECK_INT_EQ(items[1].v.arr.n, 0);
    CHECK_INT_EQ(nm_gguf_arr_i64(&items[2], 0), 4);
    CHECK_INT_EQ(nm_gguf_get_arr(g, "n.str", NM_GGUF_ARRAY, &arr, &err), NM_OK);
    items = arr->v.arr.data;
    CHECK_INT_EQ(items[0].v.arr.type, NM_GGUF_STRING);
    CHECK(nm_gguf_str_eq(nm_gguf_arr_str(&items[0], 1), "yz"));
    CHECK(nm_gguf_str_eq(nm_gguf_arr_str(&items[1], 0), "w"));
    const nm_gguf_value *v = must_find(g, "n.deep8");
    int levels = 0;
    while (v && v->type == NM_GGUF_ARRAY && v->v.arr.type == NM_GGUF_ARRAY) {
        v = v->v.arr.data;
        levels++;
    }
    CHECK_INT_EQ(levels, 7);
    CHECK(v && v->v.arr.type == NM_GGUF_UINT8 && nm_gguf_arr_i64(v, 0) == 42);

    /* A kv read back copies into a new file unchanged. */
    nm_gguf_writer *w2 = nm_gguf_writer_new();
    for (uint64_t i = 0; i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        CHECK_INT_EQ(nm_gguf_writer_set_value(w2, key, &kv->value), NM_OK);
    }
    size_t n2;
    uint8_t *bytes2 = to_memory(w2, &n2);
    CHECK(n2 == n && bytes2 && memcmp(bytes, bytes2, n) == 0);
    nm_free(bytes2);
    nm_gguf_writer_free(w2);
    nm_gguf_close(g);
    nm_free(bytes);
}

/* ---- round trip of tensors ------------------------------------------------ */

typedef struct tensor_case {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    uint64_t n_bytes; /* worked out by hand from ggml's block sizes */
} tensor_case;

static const tensor_case tensor_cases[] = {
    {"f32.a", NM_DTYPE_F32, 2, {5, 3, 1, 1}, 5 * 3 * 4},
    {"f16.b", NM_DTYPE_F16, 1, {7, 1, 1, 1}, 7 * 2},
    {"q8_0.c", NM_DTYPE_Q8_0, 2, {64, 2, 1, 1}, 2 * 2 * 34},
    {"q4_K.d", NM_DTYPE_Q4_K, 3, {256, 1, 2, 1}, 2 * 144},
    {"bf16.e", NM_DTYPE_BF16, 4, {3, 2, 2, 2}, 24 * 2},
};
#define N_TENSOR_CASES (sizeof tensor_cases / sizeof tensor_cases[0])

static uint8_t pattern_byte(size_t tensor, size_t i) { return (uint8_t)(i * 7 + tensor * 31 + 1); }

/* alignment 0 leaves general.alignment unset. */
static nm_gguf_writer *tensor_writer(uint32_t alignment) {
    nm_gguf_writer *w = nm_gguf_writer_new();
    CHECK_INT_EQ(nm_gguf_writer_set_str(w, "general.architecture", "test"), NM_OK);
    if (alignment) CHECK_INT_EQ(nm_gguf_writer_set_u32(w, "general.alignment", alignment), NM_OK);
    for (size_t t = 0; t < N_TENSOR_CASES; t++) {
        const tensor_case *c = &tensor_cases[t];
        uint8_t data[512]; /* [n_bytes] */
        for (size_t i = 0; i < c->n_bytes; i++)
            data[i] = pattern_byte(t, i);
        CHECK_INT_EQ(
            nm_gguf_writer_add_tensor(w, c->name, c->type, c->n_dims, c->ne, data, c->n_bytes),
            NM_OK);
    }
    return w;
}

/* base: where the file's bytes start, or NULL for a mapping (then only the
 * addresses and contents are checked). */
static void check_tensors(const nm_gguf *g, const uint8_t *base, uint64_t alignment) {
    CHECK_INT_EQ(nm_gguf_alignment(g), alignment);
    CHECK_INT_EQ(nm_gguf_n_tensors(g), N_TENSOR_CASES);
    for (size_t t = 0; t < N_TENSOR_CASES && t < nm_gguf_n_tensors(g); t++) {
        const tensor_case *c = &tensor_cases[t];
        const nm_gguf_tensor *x = nm_gguf_tensor_at(g, t);
        CHECK(nm_gguf_str_eq(x->name, c->name));
        CHECK(nm_gguf_find_tensor(g, c->name) == x);
        CHECK_INT_EQ(x->type, c->type);
        CHECK_INT_EQ(x->n_dims, c->n_dims);
        for (int d = 0; d < 4; d++)
            CHECK_INT_EQ(x->ne[d], c->ne[d]);
        CHECK_INT_EQ(x->n_bytes, c->n_bytes);
        CHECK_INT_EQ(x->offset % alignment, 0);
        int same = 1;
        for (size_t i = 0; i < c->n_bytes; i++) {
            same &= ((const uint8_t *)x->data)[i] == pattern_byte(t, i);
        }
        CHECK(same);
        if (!base) {
            CHECK_INT_EQ((uintptr_t)x->data % alignment, 0);
            continue;
        }
        size_t at = (size_t)((const uint8_t *)x->data - base);
        CHECK_INT_EQ(at % alignment, 0);
        /* Padding up to the next alignment boundary is zero. */
        size_t end = at + (size_t)x->n_bytes;
        size_t padded = (end + alignment - 1) / alignment * alignment;
        int zero = 1;
        for (size_t i = end; i < padded; i++)
            zero &= base[i] == 0;
        CHECK(zero);
        CHECK(padded <= nm_gguf_file_bytes(g));
    }
    CHECK(nm_gguf_find_tensor(g, "f32") == NULL);
    CHECK(nm_gguf_find_tensor(g, "zzz") == NULL);
}

static void test_roundtrip_tensors(void) {
    const uint32_t alignments[] = {0, 64, 1, 4096};
    for (size_t a = 0; a < sizeof alignments / sizeof alignments[0]; a++) {
        nm_gguf_writer *w = tensor_writer(alignments[a]);
        size_t n;
        uint8_t *bytes = to_memory(w, &n);
        nm_gguf_writer_free(w);
        nm_gguf *g = NULL;
        nm_error err = {0};
        CHECK_INT_EQ(nm_gguf_open_memory(bytes, n, &g, &err), NM_OK);
        if (g) check_tensors(g, bytes, alignments[a] ? alignments[a] : 32);
        nm_gguf_close(g);
        nm_free(bytes);
    }

    /* What add_tensor must refuse. */
    nm_gguf_writer *w = tensor_writer(0);
    uint8_t data[64] = {0};
    const int64_t ne4[] = {4, 1}, ne48[] = {48}, ne0[] = {0}, neg[] = {4, -1};
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "f32.a", NM_DTYPE_F32, 1, ne4, data, 16),
                 NM_ERR_INVALID_ARG); /* duplicate */
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "x", NM_DTYPE_F32, 1, ne4, data, 12),
                 NM_ERR_INVALID_ARG); /* wrong size */
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "x", NM_DTYPE_Q8_0, 1, ne48, data, 51),
                 NM_ERR_INVALID_ARG); /* not whole blocks */
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "x", 4, 1, ne4, data, 16), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "x", NM_DTYPE_F32, 1, ne0, data, 0),
                 NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "x", NM_DTYPE_F32, 2, neg, data, 16),
                 NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "x", NM_DTYPE_F32, 5, ne4, data, 16),
                 NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "", NM_DTYPE_F32, 1, ne4, data, 16),
                 NM_ERR_INVALID_ARG);

    /* Through a file and nm_gguf_open (mmap). */
    char path[1024];
    snprintf(path, sizeof path, "%s/test_gguf_tmp.gguf", NM_BUILD_DIR);
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_writer_write_file(w, path, &err), NM_OK);
    nm_gguf_writer_free(w);
    nm_gguf *g = NULL;
    CHECK_INT_EQ(nm_gguf_open(path, &g, &err), NM_OK);
    if (g) {
        /* A mapping starts on a page boundary, so the addresses themselves
         * are aligned. */
        check_tensors(g, NULL, 32);
    }
    nm_gguf_close(g);

    /* Errors from nm_gguf_open name the path. */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/test_gguf_no_such_file.gguf", NM_BUILD_DIR);
    CHECK_INT_EQ(nm_gguf_open(bad, &g, &err), NM_ERR_IO);
    CHECK(g == NULL && strstr(err.msg, bad) != NULL);
    printf("  missing file -> %s\n", err.msg);
    CHECK_INT_EQ(nm_gguf_open(NM_BUILD_DIR, &g, &err), NM_ERR_IO);
    printf("  directory    -> %s\n", err.msg);
    FILE *f = fopen(path, "wb");
    fputs("GGUF", f);
    fclose(f);
    CHECK_INT_EQ(nm_gguf_open(path, &g, &err), NM_ERR_FORMAT);
    CHECK(strncmp(err.msg, path, strlen(path)) == 0);
    printf("  short file   -> %s\n", err.msg);
    f = fopen(path, "wb");
    fclose(f);
    CHECK_INT_EQ(nm_gguf_open(path, &g, &err), NM_ERR_FORMAT);
    printf("  empty file   -> %s\n", err.msg);
    remove(path);
}

/* ---- the real files written by llama.cpp's tools ---------------------------- */

static void test_real_files(void) {
    char path[1024];
    nm_error err = {0};
    nm_gguf *g = NULL;
    /* Expected values from an independent Python parse of the same files. */
    snprintf(path, sizeof path, "%s/tiny-qwen3moe/model.gguf", NM_VECTORS_DIR);
    CHECK_INT_EQ(nm_gguf_open(path, &g, &err), NM_OK);
    if (!g) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    CHECK_INT_EQ(nm_gguf_version(g), 3);
    CHECK_INT_EQ(nm_gguf_n_kv(g), 28);
    CHECK_INT_EQ(nm_gguf_n_tensors(g), 39);
    CHECK_INT_EQ(nm_gguf_file_bytes(g), 2974048);
    nm_gguf_str s;
    CHECK_INT_EQ(nm_gguf_get_str(g, "general.architecture", &s, &err), NM_OK);
    CHECK(nm_gguf_str_eq(s, "qwen3moe"));
    uint32_t u;
    CHECK_INT_EQ(nm_gguf_get_u32(g, "qwen3moe.block_count", &u, &err), NM_OK);
    CHECK_INT_EQ(u, 3);
    CHECK_INT_EQ(nm_gguf_get_u32(g, "qwen3moe.expert_count", &u, &err), NM_OK);
    CHECK_INT_EQ(u, 8);
    CHECK_INT_EQ(nm_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u, &err), NM_OK);
    CHECK_INT_EQ(u, 4098);
    float f;
    CHECK_INT_EQ(nm_gguf_get_f32(g, "qwen3moe.rope.freq_base", &f, &err), NM_OK);
    CHECK(f == 1e6f);
    CHECK_INT_EQ(nm_gguf_get_f32(g, "qwen3moe.attention.layer_norm_rms_epsilon", &f, &err), NM_OK);
    CHECK(f == 1e-6f);
    bool b = true;
    CHECK_INT_EQ(nm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, &err), NM_OK);
    CHECK(b == false);
    const nm_gguf_value *arr;
    CHECK_INT_EQ(nm_gguf_get_arr(g, "tokenizer.ggml.tokens", NM_GGUF_STRING, &arr, &err), NM_OK);
    CHECK_INT_EQ(arr->v.arr.n, 4099);
    CHECK(nm_gguf_str_eq(nm_gguf_arr_str(arr, 0), "!"));
    CHECK(nm_gguf_str_eq(nm_gguf_arr_str(arr, 4098), "<|im_end|>"));
    CHECK_INT_EQ(nm_gguf_get_arr(g, "tokenizer.ggml.merges", NM_GGUF_STRING, &arr, &err), NM_OK);
    CHECK_INT_EQ(arr->v.arr.n, 3840);
    CHECK(nm_gguf_str_eq(nm_gguf_arr_str(arr, 0), "\xc4\xa0 \xc4\xa0"));
    CHECK_INT_EQ(nm_gguf_get_arr(g, "tokenizer.ggml.token_type", NM_GGUF_INT32, &arr, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_arr_i64(arr, 0), 1);

    const nm_gguf_tensor *t = nm_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t != NULL);
    if (t) {
        CHECK_INT_EQ(t->n_dims, 2);
        CHECK_INT_EQ(t->ne[0], 64);
        CHECK_INT_EQ(t->ne[1], 4099);
        CHECK_INT_EQ(t->type, NM_DTYPE_F32);
        CHECK_INT_EQ(t->offset, 0);
        CHECK_INT_EQ(t->n_bytes, 64 * 4099 * 4);
        /* The data section starts at byte 129760 of the file. */
        size_t n_file;
        unsigned char *file = nm_test_read_file(path, &n_file);
        CHECK(file && memcmp(t->data, file + 129760, (size_t)t->n_bytes) == 0);
        free(file);
    }
    t = nm_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
    CHECK(t && t->n_dims == 3 && t->ne[0] == 32 && t->ne[1] == 64 && t->ne[2] == 8);
    t = nm_gguf_find_tensor(g, "output.weight");
    CHECK(t && t->offset == 1794944 && t->ne[0] == 64 && t->ne[1] == 4099);
    CHECK(nm_gguf_str_eq(nm_gguf_tensor_at(g, 38)->name, "output.weight"));
    nm_gguf_close(g);

    snprintf(path, sizeof path, "%s/qwen3-vocab.gguf", NM_VECTORS_DIR);
    CHECK_INT_EQ(nm_gguf_open(path, &g, &err), NM_OK);
    if (g) {
        CHECK_INT_EQ(nm_gguf_n_tensors(g), 0);
        CHECK_INT_EQ(nm_gguf_n_kv(g), 28);
        CHECK_INT_EQ(nm_gguf_get_arr(g, "tokenizer.ggml.tokens", NM_GGUF_STRING, &arr, &err),
                     NM_OK);
        CHECK_INT_EQ(arr->v.arr.n, 151936);
        CHECK_INT_EQ(nm_gguf_get_arr(g, "tokenizer.ggml.merges", NM_GGUF_STRING, &arr, &err),
                     NM_OK);
        CHECK_INT_EQ(arr->v.arr.n, 151387);
        CHECK_INT_EQ(nm_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u, &err), NM_OK);
        CHECK_INT_EQ(u, 151645);
        CHECK_INT_EQ(nm_gguf_get_str(g, "general.name", &s, &err), NM_OK);
        CHECK(nm_gguf_str_eq(s, "Qwen3 30B A3B"));
        nm_gguf_close(g);
    }

    /* Every other file in the vectors opens, quantized types included. */
    const char *others[] = {"llama2-vocab.gguf",
                            "mistral-vocab.gguf",
                            "tiny-mixtral/model.gguf",
                            "tiny-olmoe/model.gguf",
                            "tiny-phimoe/model.gguf",
                            "tiny-qwen3moe-q-Q4_0/model.gguf",
                            "tiny-qwen3moe-q-Q4_K_M/model.gguf",
                            "tiny-qwen3moe-q-Q6_K/model.gguf",
                            "tiny-qwen3moe-q-Q8_0/model.gguf"};
    int seen_q4_k = 0;
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", NM_VECTORS_DIR, others[i]);
        nm_status st = nm_gguf_open(path, &g, &err);
        if (st != NM_OK) fprintf(stderr, "%s\n", err.msg);
        CHECK_INT_EQ(st, NM_OK);
        for (uint64_t k = 0; g && k < nm_gguf_n_tensors(g); k++) {
            seen_q4_k |= nm_gguf_tensor_at(g, k)->type == NM_DTYPE_Q4_K;
        }
        nm_gguf_close(g);
    }
    CHECK(seen_q4_k);
}

/* ---- malformed files ------------------------------------------------------ */

/* The base every malformed case patches: a few kvs of several kinds and three
 * tensors; the last tensor's size is a multiple of 32, so the file ends
 * exactly where its data does. */
static nm_status build_small(nm_gguf_writer **out) {
    nm_gguf_writer *w = nm_gguf_writer_new();
    *out = w;
    if (!w) return NM_ERR_NOMEM;
    const char *list[] = {"x", "yy"};
    const int32_t nums[] = {1, 2, 3}, in0[] = {1, 2}, in1[] = {3};
    const nm_gguf_value inner[] = {
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_INT32, 2, in0}},
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_INT32, 1, in1}},
    };
    const nm_gguf_value nest = {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_ARRAY, 2, inner}};
    float first[16] = {0};    /* [2][8] */
    uint8_t second[68] = {0}; /* [2] rows of one q8_0 block */
    uint16_t third[16] = {0}; /* [16] f16 */
    const int64_t ne_first[] = {8, 2}, ne_second[] = {32, 2}, ne_third[] = {16};
    nm_status st = nm_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    if (st == NM_OK) st = nm_gguf_writer_set_u32(w, "general.alignment", 32);
    if (st == NM_OK) st = nm_gguf_writer_set_u32(w, "a.count", 7);
    if (st == NM_OK) st = nm_gguf_writer_set_bool(w, "a.flag", true);
    if (st == NM_OK) st = nm_gguf_writer_set_str(w, "a.text", "hello");
    if (st == NM_OK) st = nm_gguf_writer_set_arr_str(w, "a.list", list, 2);
    if (st == NM_OK) st = nm_gguf_writer_set_arr(w, "a.nums", NM_GGUF_INT32, nums, 3);
    if (st == NM_OK) st = nm_gguf_writer_set_value(w, "a.nest", &nest);
    if (st == NM_OK) {
        st = nm_gguf_writer_add_tensor(w, "t.first", NM_DTYPE_F32, 2, ne_first, first, 64);
    }
    if (st == NM_OK) {
        st = nm_gguf_writer_add_tensor(w, "t.second", NM_DTYPE_Q8_0, 2, ne_second, second, 68);
    }
    if (st == NM_OK) {
        st = nm_gguf_writer_add_tensor(w, "t.third", NM_DTYPE_F16, 1, ne_third, third, 32);
    }
    return st;
}

static uint8_t *small_file(size_t *n) {
    nm_gguf_writer *w;
    CHECK_INT_EQ(build_small(&w), NM_OK);
    uint8_t *bytes = to_memory(w, n);
    nm_gguf_writer_free(w);
    return bytes;
}

/* Field positions in the small file. */
static size_t kv_type_at(const uint8_t *f, size_t n, const char *key) {
    return after_name(f, n, key);
}
static size_t kv_value_at(const uint8_t *f, size_t n, const char *key) {
    return after_name(f, n, key) + 4;
}
static size_t str_len_at(const uint8_t *f, size_t n, const char *s) {
    return find_bytes(f, n, s) - 8;
}
static size_t tensor_ndims_at(const uint8_t *f, size_t n, const char *name) {
    return after_name(f, n, name);
}
static size_t tensor_ne_at(const uint8_t *f, size_t n, const char *name, int d) {
    return after_name(f, n, name) + 4 + 8 * (size_t)d;
}
static size_t tensor_type_at(const uint8_t *f, size_t n, const char *name) {
    size_t at = after_name(f, n, name);
    return at + 4 + 8 * peek(f, at, 4);
}
static size_t tensor_offset_at(const uint8_t *f, size_t n, const char *name) {
    return tensor_type_at(f, n, name) + 4;
}

/* One malformed case: a fresh copy of the small file with one field set. */
static void patched(const char *label, const uint8_t *base, size_t n, size_t at, uint64_t v,
                    size_t n_bytes, nm_status want, const char *substring) {
    uint8_t *f = dup_bytes(base, n);
    poke(f, at, v, n_bytes);
    expect_fail(label, f, n, want, substring);
    free(f);
}

static void test_malformed(void) {
    size_t n;
    uint8_t *base = small_file(&n);
    nm_gguf *g = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_open_memory(base, n, &g, &err), NM_OK);
    nm_gguf_close(g);
    const uint8_t *f = base;

    patched("bad magic", f, n, 0, 'X', 1, NM_ERR_FORMAT, "bad magic 'XGUF'");
    patched("byte-swapped magic", f, n, 0, 0x47475546, 4, NM_ERR_UNSUPPORTED, "big-endian");
    patched("version 1", f, n, 4, 1, 4, NM_ERR_UNSUPPORTED, "version 1");
    patched("version 4", f, n, 4, 4, 4, NM_ERR_UNSUPPORTED, "GGUF version 4 is not supported");
    patched("big-endian version", f, n, 4, 0x03000000, 4, NM_ERR_UNSUPPORTED, "big-endian");
    expect_fail("short header", f, 16, NM_ERR_FORMAT, "shorter than the 24-byte GGUF header");
    expect_fail("empty file", f, 0, NM_ERR_FORMAT, "too short");
    patched("kv count lie", f, n, 16, 1000000000000ull, 8, NM_ERR_FORMAT,
            "claims 1000000000000 key-value pairs");
    patched("tensor count lie", f, n, 8, 1ull << 40, 8, NM_ERR_FORMAT, "1099511627776 tensors");
    patched("key length past end", f, n, str_len_at(f, n, "a.count"), 1ull << 40, 8, NM_ERR_FORMAT,
            "kv 2: key length 1099511627776");
    patched("empty key", f, n, str_len_at(f, n, "a.count"), 0, 8, NM_ERR_FORMAT,
            "kv 2: key is empty");
    patched("unknown value type", f, n, kv_type_at(f, n, "a.count"), 13, 4, NM_ERR_FORMAT,
            "kv 2 'a.count': unknown value type 13");
    patched("string past end", f, n, str_len_at(f, n, "hello"), 1ull << 50, 8, NM_ERR_FORMAT,
            "kv 4 'a.text': string length");
    patched("array count overflow", f, n, kv_value_at(f, n, "a.nums") + 4, 1ull << 62, 8,
            NM_ERR_FORMAT, "kv 6 'a.nums': array of 4611686018427387904 i32 elements");
    patched("array count wraps size", f, n, kv_value_at(f, n, "a.nums") + 4, UINT64_MAX / 2 + 2, 8,
            NM_ERR_FORMAT, "cannot fit");
    patched("array element type", f, n, kv_value_at(f, n, "a.nums"), 99, 4, NM_ERR_FORMAT,
            "array of unknown element type 99");
    patched("string element past end", f, n, str_len_at(f, n, "yy"), 1ull << 33, 8, NM_ERR_FORMAT,
            "kv 5 'a.list': element 1: string length 8589934592");
    patched("string array count lie", f, n, kv_value_at(f, n, "a.list") + 4, 1ull << 40, 8,
            NM_ERR_FORMAT, "str elements");
    /* a.nest: ARRAY, then inner 0 = (i32, 2, ...): its count sits 12 bytes in. */
    patched("nested count lie", f, n, kv_value_at(f, n, "a.nest") + 12 + 4, 1ull << 40, 8,
            NM_ERR_FORMAT, "kv 7 'a.nest': element 0: array of 1099511627776 i32");
    patched("nested element type", f, n, kv_value_at(f, n, "a.nest") + 12, 77, 4, NM_ERR_FORMAT,
            "element 0: array of unknown element type 77");
    patched("bool not 0/1", f, n, kv_value_at(f, n, "a.flag"), 2, 1, NM_ERR_FORMAT,
            "kv 3 'a.flag': bool value 2 is neither 0 nor 1");
    patched("alignment type", f, n, kv_type_at(f, n, "general.alignment"), NM_GGUF_INT32, 4,
            NM_ERR_FORMAT, "general.alignment has type i32, must be u32");
    patched("alignment zero", f, n, kv_value_at(f, n, "general.alignment"), 0, 4, NM_ERR_FORMAT,
            "general.alignment = 0 is not a nonzero power of two");
    patched("alignment 48", f, n, kv_value_at(f, n, "general.alignment"), 48, 4, NM_ERR_FORMAT,
            "general.alignment = 48");
    patched("duplicate key", f, n, find_bytes(f, n, "a.text") + 2, 0x67616c66, 4, NM_ERR_FORMAT,
            "duplicate key 'a.flag' (kv 3 and kv 4)");
    patched("duplicate tensor", f, n, find_bytes(f, n, "t.third") + 2, 0x7473726966, 5,
            NM_ERR_FORMAT, "duplicate tensor name 't.first' (tensor 0 and tensor 2)");
    patched("n_dims 0", f, n, tensor_ndims_at(f, n, "t.first"), 0, 4, NM_ERR_FORMAT,
            "tensor 't.first': n_dims 0 is not in 1..4");
    patched("n_dims 5", f, n, tensor_ndims_at(f, n, "t.first"), 5, 4, NM_ERR_FORMAT,
            "n_dims 5 is not in 1..4");
    patched("dimension zero", f, n, tensor_ne_at(f, n, "t.first", 1), 0, 8, NM_ERR_FORMAT,
            "tensor 't.first': ne[1] = 0 is not positive");
    patched("dimension negative", f, n, tensor_ne_at(f, n, "t.first", 0), (uint64_t)-3, 8,
            NM_ERR_FORMAT, "ne[0] = -3 is not positive");
    {
        uint8_t *c = dup_bytes(f, n);
        poke(c, tensor_ne_at(c, n, "t.first", 0), 1ull << 40, 8);
        poke(c, tensor_ne_at(c, n, "t.first", 1), 1ull << 30, 8);
        expect_fail("element count overflow", c, n, NM_ERR_FORMAT, "overflows int64 at ne[1]");
        poke(c, tensor_ne_at(c, n, "t.first", 1), 1ull << 22, 8);
        expect_fail("byte size overflow", c, n, NM_ERR_FORMAT,
                    "tensor 't.first': size in bytes overflows");
        free(c);
    }
    patched("ne[0] not whole blocks", f, n, tensor_ne_at(f, n, "t.second", 0), 48, 8, NM_ERR_FORMAT,
            "tensor 't.second': ne[0] = 48 is not a multiple of the q8_0 block size 32");
    patched("unknown type id", f, n, tensor_type_at(f, n, "t.first"), 99, 4, NM_ERR_FORMAT,
            "tensor 't.first': type id 99 is not a ggml type");
    patched("removed type id", f, n, tensor_type_at(f, n, "t.first"), 4, 4, NM_ERR_UNSUPPORTED,
            "type 4 (q4_2) was removed");
    uint64_t off2 = peek(f, tensor_offset_at(f, n, "t.second"), 8);
    uint64_t off3 = peek(f, tensor_offset_at(f, n, "t.third"), 8);
    patched("offset misaligned", f, n, tensor_offset_at(f, n, "t.second"), off2 + 4, 8,
            NM_ERR_FORMAT, "tensor 't.second': offset 68 is not a multiple of the alignment 32");
    char want[160];
    snprintf(want, sizeof want,
             "tensor 't.third': data [offset %llu, 32 bytes] runs past the end of the file (%zu "
             "bytes)",
             (unsigned long long)off3 + 1024, n);
    patched("data past end", f, n, tensor_offset_at(f, n, "t.third"), off3 + 1024, 8, NM_ERR_FORMAT,
            want);
    patched("data offset huge", f, n, tensor_offset_at(f, n, "t.third"), UINT64_MAX - 31, 8,
            NM_ERR_FORMAT, "runs past the end of the file");
    expect_fail("truncated data", f, n - 1, NM_ERR_FORMAT,
                "tensor 't.third': data [offset 160, 32 bytes] runs past the end");
    patched("overlap", f, n, tensor_offset_at(f, n, "t.second"), 32, 8, NM_ERR_FORMAT,
            "tensors 't.first' [offset 0, 64 bytes] and 't.second' [offset 32, 68 bytes] overlap");
    patched("empty tensor name", f, n, str_len_at(f, n, "t.first"), 0, 8, NM_ERR_FORMAT,
            "tensor 0: name is empty");
    patched("tensor name past end", f, n, str_len_at(f, n, "t.first"), 1ull << 45, 8, NM_ERR_FORMAT,
            "tensor 0: name length");

    /* Nesting: 8 levels read, 9 are refused (the writer cannot make 9). */
    for (int levels = 8; levels <= 9; levels++) {
        bytes_out o;
        out_header(&o, 0, 1);
        out_str(&o, "deep");
        out_le(&o, NM_GGUF_ARRAY, 4);
        for (int l = 1; l < levels; l++) {
            out_le(&o, NM_GGUF_ARRAY, 4);
            out_le(&o, 1, 8);
        }
        out_le(&o, NM_GGUF_UINT8, 4);
        out_le(&o, 0, 8);
        if (levels == 8) {
            CHECK_INT_EQ(nm_gguf_open_memory(o.b, o.n, &g, &err), NM_OK);
            nm_gguf_close(g);
        } else {
            expect_fail("nesting too deep", o.b, o.n, NM_ERR_FORMAT,
                        "kv 0 'deep': element 0: element 0: element 0: element 0: element 0: "
                        "element 0: element 0: element 0: arrays nested deeper than 8 levels");
        }
    }
    /* Non-printable key bytes are escaped in messages. */
    {
        bytes_out o;
        out_header(&o, 0, 1);
        out_str(&o, "k\x01\xff");
        out_le(&o, 200, 4);
        out_le(&o, 0, 1);
        expect_fail("escaped key", o.b, o.n, NM_ERR_FORMAT,
                    "kv 0 'k\\x01\\xff': unknown value type 200");
    }
    nm_free(base);
}

/* ---- truncation, corruption, allocation failure ----------------------------- */

/* Reads everything the reader returns, so that ASan/UBSan see any pointer
 * that lies. Returns a checksum to keep the reads. */
static uint64_t walk_value(const nm_gguf_value *v) {
    uint64_t sum = (uint64_t)v->type;
    if (v->type == NM_GGUF_STRING) {
        for (uint64_t i = 0; i < v->v.str.len; i++)
            sum += (uint8_t)v->v.str.ptr[i];
    } else if (v->type == NM_GGUF_ARRAY) {
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            if (v->v.arr.type == NM_GGUF_STRING) {
                nm_gguf_value s = {.type = NM_GGUF_STRING, .v.str = nm_gguf_arr_str(v, i)};
                sum += walk_value(&s);
            } else if (v->v.arr.type == NM_GGUF_ARRAY) {
                sum += walk_value(&((const nm_gguf_value *)v->v.arr.data)[i]);
            } else {
                sum += (uint64_t)nm_gguf_arr_i64(v, i) + (uint64_t)(nm_gguf_arr_f64(v, i) != 0);
            }
        }
    }
    return sum;
}

static uint64_t walk(const nm_gguf *g) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        sum += kv->key.len + walk_value(&kv->value);
    }
    for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        if (t->n_bytes) sum += d[0] + d[t->n_bytes - 1];
    }
    return sum;
}

static void test_truncation(void) {
    size_t n;
    uint8_t *f = small_file(&n);
    int failed_right = 0;
    for (size_t len = 0; len < n; len++) {
        nm_gguf *g = NULL;
        nm_error err = {0};
        void *copy;
        nm_status st = open_copy(f, len, &g, &copy, &err);
        failed_right += st == NM_ERR_FORMAT && g == NULL && err.msg[0] != '\0';
        if (st != NM_ERR_FORMAT) fprintf(stderr, "prefix %zu: [%d] %s\n", len, st, err.msg);
        nm_gguf_close(g);
        free(copy);
    }
    CHECK_INT_EQ(failed_right, n);
    printf("  truncation: all %zu prefixes refused\n", n);
    nm_free(f);
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_corruption(void) {
    size_t n;
    uint8_t *f = small_file(&n);
    uint64_t seed = 0x9e3779b97f4a7c15ull, sum = 0;
    int opened = 0, refused = 0;
    for (int iter = 0; iter < 20000; iter++) {
        uint8_t *c = dup_bytes(f, n);
        int flips = 1 + (int)(xorshift(&seed) % 4);
        for (int k = 0; k < flips; k++)
            c[xorshift(&seed) % n] ^= (uint8_t)(1 + xorshift(&seed) % 255);
        nm_gguf *g = NULL;
        nm_error err = {0};
        nm_status st = nm_gguf_open_memory(c, n, &g, &err);
        if (st == NM_OK) {
            sum += walk(g);
            opened++;
        } else {
            refused += err.msg[0] != '\0' && g == NULL;
        }
        nm_gguf_close(g);
        free(c);
    }
    printf("  corruption: 20000 files, %d opened, %d refused (checksum %llu)\n", opened, refused,
           (unsigned long long)sum);
    CHECK_INT_EQ(opened + refused, 20000);
    CHECK(refused > 0 && opened > 0);
    nm_free(f);
}

static void test_alloc_failure(void) {
    size_t n;
    uint8_t *f = small_file(&n);
    /* Reader: each allocation point in turn fails; all must report NOMEM. */
    long points = -1;
    for (long i = 0; i < 100; i++) {
        nm_gguf *g = NULL;
        nm_error err = {0};
        nm_alloc_fail_after(i);
        nm_status st = nm_gguf_open_memory(f, n, &g, &err);
        nm_alloc_fail_after(-1);
        if (st == NM_OK) {
            points = i;
            nm_gguf_close(g);
            break;
        }
        CHECK_INT_EQ(st, NM_ERR_NOMEM);
        CHECK(g == NULL && err.msg[0] != '\0');
    }
    printf("  reader: %ld allocation points, each failure reported\n", points);
    CHECK(points >= 6);

    /* Writer: the same, through building and laying out the small file. */
    points = -1;
    for (long i = 0; i < 200; i++) {
        nm_gguf_writer *w;
        nm_alloc_fail_after(i);
        nm_status st = build_small(&w);
        uint8_t *bytes = NULL;
        size_t n2 = 0;
        nm_error err = {0};
        if (st == NM_OK) st = nm_gguf_writer_to_memory(w, &bytes, &n2, &err);
        nm_alloc_fail_after(-1);
        nm_gguf_writer_free(w);
        if (st == NM_OK) {
            CHECK(n2 == n && memcmp(bytes, f, n) == 0);
            nm_free(bytes);
            points = i;
            break;
        }
        CHECK_INT_EQ(st, NM_ERR_NOMEM);
    }
    printf("  writer: %ld allocation points, each failure reported\n", points);
    CHECK(points >= 10);
    nm_free(f);
}

/* Pages of a mapped file dropped from memory read back the same; ranges
 * outside the file, and files over the caller's memory, are left alone. */
static void test_drop_pages(void) {
    enum { N = 12000 }; /* 48000 bytes: several whole pages */
    float *v = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
        v[i] = (float)i * 0.25f - 7.0f;
    nm_gguf_writer *w = nm_gguf_writer_new();
    const int64_t ne[] = {N};
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, "v", NM_DTYPE_F32, 1, ne, v, N * sizeof(float)),
                 NM_OK);
    char path[1024];
    snprintf(path, sizeof path, "%s/test_gguf_drop.gguf", NM_BUILD_DIR);
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_writer_write_file(w, path, &err), NM_OK);
    size_t n_bytes = 0;
    uint8_t *bytes = NULL;
    CHECK_INT_EQ(nm_gguf_writer_to_memory(w, &bytes, &n_bytes, &err), NM_OK);
    nm_gguf_writer_free(w);
    nm_gguf *g = NULL, *gm = NULL;
    CHECK_INT_EQ(nm_gguf_open(path, &g, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_open_memory(bytes, n_bytes, &gm, &err), NM_OK);
    for (int round = 0; g && gm && round < 2; round++) {
        const nm_gguf_tensor *t = nm_gguf_find_tensor(g, "v");
        const nm_gguf_tensor *tm = nm_gguf_find_tensor(gm, "v");
        CHECK(t && tm && memcmp(t->data, v, N * sizeof(float)) == 0);
        CHECK(tm && memcmp(tm->data, v, N * sizeof(float)) == 0);
        if (!t || !tm) break;
        nm_gguf_drop_pages(g, t->data, N * sizeof(float)); /* read again next round */
        nm_gguf_drop_pages(gm, tm->data, N * sizeof(float));
        nm_gguf_drop_pages(g, v, N * sizeof(float));                   /* not the file's */
        nm_gguf_drop_pages(g, t->data, (size_t)nm_gguf_file_bytes(g)); /* past its end */
    }
    nm_gguf_close(g);
    nm_gguf_close(gm);
    nm_free(bytes);
    free(v);
    remove(path);
}

/* A streamed file equals the one built in memory; a source's error stops
 * it and leaves no file; without data the memory writer refuses. */
typedef struct stream_src {
    const uint8_t *data[2];
    int calls, fail_at;
} stream_src;

static nm_status give(void *ctx, size_t i, const void **data, nm_error *err) {
    stream_src *s = ctx;
    if (s->calls++ == s->fail_at) return nm_errorf(err, NM_ERR_IO, "source failed at %zu", i);
    *data = s->data[i];
    return NM_OK;
}

static void test_stream(void) {
    uint8_t a[6 * 34], b[40 * 4];
    for (size_t i = 0; i < sizeof a; i++)
        a[i] = (uint8_t)(i * 7 % 61); /* q8_0 blocks with small f16 scales */
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = (uint8_t)(i % 13);
    const int64_t ne_a[] = {64, 3}, ne_b[] = {40};
    nm_gguf_writer *copy = nm_gguf_writer_new(), *lazy = nm_gguf_writer_new();
    for (int v = 0; v < 2; v++) {
        nm_gguf_writer *w = v ? lazy : copy;
        CHECK_INT_EQ(nm_gguf_writer_set_u32(w, "general.alignment", 64), NM_OK);
        CHECK_INT_EQ(nm_gguf_writer_set_str(w, "general.name", "stream"), NM_OK);
    }
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(copy, "a", NM_DTYPE_Q8_0, 2, ne_a, a, sizeof a), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_add_tensor(copy, "b", NM_DTYPE_F32, 1, ne_b, b, sizeof b), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_add_tensor_info(lazy, "a", NM_DTYPE_Q8_0, 2, ne_a), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_add_tensor_info(lazy, "b", NM_DTYPE_F32, 1, ne_b), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_add_tensor_info(lazy, "b", NM_DTYPE_F32, 1, ne_b),
                 NM_ERR_INVALID_ARG); /* duplicate */
    const int64_t ne_bad[] = {48};
    CHECK_INT_EQ(nm_gguf_writer_add_tensor_info(lazy, "c", NM_DTYPE_Q8_0, 1, ne_bad),
                 NM_ERR_INVALID_ARG); /* not whole blocks */
    nm_error err = {0};
    uint8_t *want = NULL, *none = NULL;
    size_t n_want = 0, n_none = 0;
    CHECK_INT_EQ(nm_gguf_writer_to_memory(copy, &want, &n_want, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_writer_to_memory(lazy, &none, &n_none, &err), NM_ERR_INVALID_ARG);
    CHECK(none == NULL && strstr(err.msg, "'a'") != NULL);
    char path[1024];
    snprintf(path, sizeof path, "%s/test_gguf_stream.gguf", NM_BUILD_DIR);
    CHECK_INT_EQ(nm_gguf_writer_write_file(lazy, path, &err), NM_ERR_INVALID_ARG);
    stream_src src = {.data = {a, b}, .fail_at = -1};
    CHECK_INT_EQ(nm_gguf_writer_stream_file(lazy, path, give, &src, &err), NM_OK);
    CHECK_INT_EQ(src.calls, 2);
    size_t n_got = 0;
    uint8_t *got = nm_test_read_file(path, &n_got);
    CHECK(got && n_got == n_want && memcmp(got, want, n_want) == 0);
    free(got);
    src = (stream_src){.data = {a, b}, .fail_at = 1};
    CHECK_INT_EQ(nm_gguf_writer_stream_file(lazy, path, give, &src, &err), NM_ERR_IO);
    CHECK(strstr(err.msg, "source failed at 1") != NULL);
    got = nm_test_read_file(path, &n_got); /* no partial file: the old one is untouched */
    CHECK(got && n_got == n_want && memcmp(got, want, n_want) == 0);
    free(got);
    remove(path);
    nm_free(want);
    nm_gguf_writer_free(copy);
    nm_gguf_writer_free(lazy);
}

int main(void) {
    test_type_names();
    test_drop_pages();
    test_stream();
    test_roundtrip_values();
    test_roundtrip_tensors();
    test_real_files();
    test_malformed();
    test_truncation();
    test_corruption();
    test_alloc_failure();
    return nm_test_finish("test_gguf");
}
