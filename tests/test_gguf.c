/* GGUF reader and writer: round trips of every value type and of tensors,
 * the real llama.cpp files in shared/vectors (facts checked against an
 * independent Python parse of the same bytes), pages dropped and read
 * again, and files written from streamed tensors. Malformed files are
 * test_gguf_malformed's. */
#include "harness.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

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
    return nm_test_finish("test_gguf");
}
