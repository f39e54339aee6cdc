/* Lookups over an opened GGUF: keys and tensors by name (binary search over
 * the tables the reader sorted), typed getters that convert integer widths
 * only when the value fits, and element access to packed arrays. */
#include "gguf-impl.h"

#include "base/base.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

static const char *const type_names[NM_GGUF_TYPE_COUNT] = {
    [NM_GGUF_UINT8] = "u8",    [NM_GGUF_INT8] = "i8",    [NM_GGUF_UINT16] = "u16",
    [NM_GGUF_INT16] = "i16",   [NM_GGUF_UINT32] = "u32", [NM_GGUF_INT32] = "i32",
    [NM_GGUF_FLOAT32] = "f32", [NM_GGUF_BOOL] = "bool",  [NM_GGUF_STRING] = "str",
    [NM_GGUF_ARRAY] = "arr",   [NM_GGUF_UINT64] = "u64", [NM_GGUF_INT64] = "i64",
    [NM_GGUF_FLOAT64] = "f64",
};
_Static_assert(sizeof(type_names) / sizeof(type_names[0]) == NM_GGUF_TYPE_COUNT,
               "one name per GGUF value type");

static const uint8_t scalar_bytes[NM_GGUF_TYPE_COUNT] = {
    [NM_GGUF_UINT8] = 1,   [NM_GGUF_INT8] = 1,  [NM_GGUF_UINT16] = 2,  [NM_GGUF_INT16] = 2,
    [NM_GGUF_UINT32] = 4,  [NM_GGUF_INT32] = 4, [NM_GGUF_FLOAT32] = 4, [NM_GGUF_BOOL] = 1,
    [NM_GGUF_STRING] = 0,  [NM_GGUF_ARRAY] = 0, [NM_GGUF_UINT64] = 8,  [NM_GGUF_INT64] = 8,
    [NM_GGUF_FLOAT64] = 8,
};

const char *nm_gguf_type_name(nm_gguf_type type) {
    if ((unsigned)type >= NM_GGUF_TYPE_COUNT) return "unknown";
    return type_names[type];
}

size_t nm_gguf_scalar_bytes(nm_gguf_type type) {
    NM_ASSERT((unsigned)type < NM_GGUF_TYPE_COUNT);
    return scalar_bytes[type];
}

int nm_gguf_str_cmp(nm_gguf_str a, nm_gguf_str b) {
    uint64_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

bool nm_gguf_str_eq(nm_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

uint32_t nm_gguf_version(const nm_gguf *g) { return g->version; }
uint64_t nm_gguf_alignment(const nm_gguf *g) { return g->alignment; }
uint64_t nm_gguf_file_bytes(const nm_gguf *g) { return g->file_bytes; }
uint64_t nm_gguf_n_kv(const nm_gguf *g) { return g->n_kv; }
uint64_t nm_gguf_n_tensors(const nm_gguf *g) { return g->n_tensors; }

const nm_gguf_kv *nm_gguf_kv_at(const nm_gguf *g, uint64_t i) {
    NM_ASSERT(i < g->n_kv);
    return &g->kvs[i];
}

const nm_gguf_tensor *nm_gguf_tensor_at(const nm_gguf *g, uint64_t i) {
    NM_ASSERT(i < g->n_tensors);
    return &g->tensors[i];
}

const nm_gguf_value *nm_gguf_find(const nm_gguf *g, const char *key) {
    nm_gguf_str want = {key, strlen(key)};
    uint64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = nm_gguf_str_cmp(g->kv_sorted[mid]->key, want);
        if (c == 0) return &g->kv_sorted[mid]->value;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const nm_gguf_tensor *nm_gguf_find_tensor(const nm_gguf *g, const char *name) {
    nm_gguf_str want = {name, strlen(name)};
    uint64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = nm_gguf_str_cmp(g->tensor_sorted[mid]->name, want);
        if (c == 0) return g->tensor_sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static bool is_unsigned(nm_gguf_type t) {
    return t == NM_GGUF_UINT8 || t == NM_GGUF_UINT16 || t == NM_GGUF_UINT32 || t == NM_GGUF_UINT64;
}

static bool is_signed(nm_gguf_type t) {
    return t == NM_GGUF_INT8 || t == NM_GGUF_INT16 || t == NM_GGUF_INT32 || t == NM_GGUF_INT64;
}

static nm_status find_or_fail(const nm_gguf *g, const char *key, const nm_gguf_value **out,
                              nm_error *err) {
    *out = nm_gguf_find(g, key);
    if (!*out) return nm_errorf(err, NM_ERR_NOT_FOUND, "key '%s' not found", key);
    return NM_OK;
}

/* An integer key of any width, checked against [lo, hi], the range of the
 * requested type `want`; the result goes to whichever of out_u/out_i is set. */
static nm_status get_int(const nm_gguf *g, const char *key, const char *want, int64_t lo,
                         uint64_t hi, uint64_t *out_u, int64_t *out_i, nm_error *err) {
    const nm_gguf_value *v;
    nm_status st = find_or_fail(g, key, &v, err);
    if (st != NM_OK) return st;
    if (is_unsigned(v->type)) {
        if (v->v.u64 > hi) {
            return nm_errorf(err, NM_ERR_FORMAT,
                             "key '%s' = %" PRIu64 " (%s) is out of range for %s", key, v->v.u64,
                             nm_gguf_type_name(v->type), want);
        }
        if (out_u) *out_u = v->v.u64;
        if (out_i) *out_i = (int64_t)v->v.u64;
        return NM_OK;
    }
    if (is_signed(v->type)) {
        if (v->v.i64 < lo || (v->v.i64 >= 0 && (uint64_t)v->v.i64 > hi)) {
            return nm_errorf(err, NM_ERR_FORMAT,
                             "key '%s' = %" PRId64 " (%s) is out of range for %s", key, v->v.i64,
                             nm_gguf_type_name(v->type), want);
        }
        if (out_u) *out_u = (uint64_t)v->v.i64;
        if (out_i) *out_i = v->v.i64;
        return NM_OK;
    }
    return nm_errorf(err, NM_ERR_FORMAT, "key '%s' has type %s, expected an integer (%s)", key,
                     nm_gguf_type_name(v->type), want);
}

nm_status nm_gguf_get_u32(const nm_gguf *g, const char *key, uint32_t *out, nm_error *err) {
    uint64_t u = 0; /* set on NM_OK; -fPIC's inlining makes gcc doubt it */
    nm_status st = get_int(g, key, "u32", 0, UINT32_MAX, &u, NULL, err);
    if (st == NM_OK) *out = (uint32_t)u;
    return st;
}

nm_status nm_gguf_get_i32(const nm_gguf *g, const char *key, int32_t *out, nm_error *err) {
    int64_t i = 0; /* likewise */
    nm_status st = get_int(g, key, "i32", INT32_MIN, INT32_MAX, NULL, &i, err);
    if (st == NM_OK) *out = (int32_t)i;
    return st;
}

nm_status nm_gguf_get_u64(const nm_gguf *g, const char *key, uint64_t *out, nm_error *err) {
    return get_int(g, key, "u64", 0, UINT64_MAX, out, NULL, err);
}

nm_status nm_gguf_get_f32(const nm_gguf *g, const char *key, float *out, nm_error *err) {
    const nm_gguf_value *v;
    nm_status st = find_or_fail(g, key, &v, err);
    if (st != NM_OK) return st;
    if (v->type != NM_GGUF_FLOAT32 && v->type != NM_GGUF_FLOAT64) {
        return nm_errorf(err, NM_ERR_FORMAT, "key '%s' has type %s, expected f32 or f64", key,
                         nm_gguf_type_name(v->type));
    }
    if (isfinite(v->v.f64) && fabs(v->v.f64) > FLT_MAX) {
        return nm_errorf(err, NM_ERR_FORMAT, "key '%s' = %g is out of range for f32", key,
                         v->v.f64);
    }
    *out = (float)v->v.f64;
    return NM_OK;
}

nm_status nm_gguf_get_bool(const nm_gguf *g, const char *key, bool *out, nm_error *err) {
    const nm_gguf_value *v;
    nm_status st = find_or_fail(g, key, &v, err);
    if (st != NM_OK) return st;
    if (v->type != NM_GGUF_BOOL) {
        return nm_errorf(err, NM_ERR_FORMAT, "key '%s' has type %s, expected bool", key,
                         nm_gguf_type_name(v->type));
    }
    *out = v->v.b;
    return NM_OK;
}

nm_status nm_gguf_get_str(const nm_gguf *g, const char *key, nm_gguf_str *out, nm_error *err) {
    const nm_gguf_value *v;
    nm_status st = find_or_fail(g, key, &v, err);
    if (st != NM_OK) return st;
    if (v->type != NM_GGUF_STRING) {
        return nm_errorf(err, NM_ERR_FORMAT, "key '%s' has type %s, expected str", key,
                         nm_gguf_type_name(v->type));
    }
    *out = v->v.str;
    return NM_OK;
}

nm_status nm_gguf_get_arr(const nm_gguf *g, const char *key, nm_gguf_type elem,
                          const nm_gguf_value **out, nm_error *err) {
    const nm_gguf_value *v;
    nm_status st = find_or_fail(g, key, &v, err);
    if (st != NM_OK) return st;
    if (v->type != NM_GGUF_ARRAY) {
        return nm_errorf(err, NM_ERR_FORMAT, "key '%s' has type %s, expected an array", key,
                         nm_gguf_type_name(v->type));
    }
    if (elem != NM_GGUF_TYPE_COUNT && v->v.arr.type != elem) {
        return nm_errorf(err, NM_ERR_FORMAT, "key '%s' is an array of %s, expected an array of %s",
                         key, nm_gguf_type_name(v->v.arr.type), nm_gguf_type_name(elem));
    }
    *out = v;
    return NM_OK;
}

/* Element i of a packed numeric array, as raw little-endian bits. */
static uint64_t element_bits(const nm_gguf_value *arr, uint64_t i, size_t *n_bytes) {
    NM_ASSERT(arr->type == NM_GGUF_ARRAY && i < arr->v.arr.n);
    *n_bytes = nm_gguf_scalar_bytes(arr->v.arr.type);
    NM_ASSERT(*n_bytes != 0);
    const uint8_t *p = (const uint8_t *)arr->v.arr.data + i * *n_bytes;
    uint64_t bits = 0;
    for (size_t k = 0; k < *n_bytes; k++)
        bits |= (uint64_t)p[k] << (8 * k);
    return bits;
}

static int64_t bits_to_i64(uint64_t bits, size_t n_bytes) {
    if (n_bytes < 8 && (bits >> (8 * n_bytes - 1)) & 1) bits |= ~(uint64_t)0 << (8 * n_bytes);
    int64_t v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static double bits_to_f64(uint64_t bits, nm_gguf_type type) {
    if (type == NM_GGUF_FLOAT32) {
        uint32_t b32 = (uint32_t)bits;
        float f;
        memcpy(&f, &b32, sizeof f);
        return f;
    }
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

int64_t nm_gguf_arr_i64(const nm_gguf_value *arr, uint64_t i) {
    size_t n_bytes;
    uint64_t bits = element_bits(arr, i, &n_bytes);
    nm_gguf_type t = arr->v.arr.type;
    if (is_signed(t)) return bits_to_i64(bits, n_bytes);
    if (t == NM_GGUF_FLOAT32 || t == NM_GGUF_FLOAT64) {
        /* The interface has no error path here; a float read as an integer
         * truncates toward zero and saturates, NaN reads as 0. */
        double d = bits_to_f64(bits, t);
        if (d != d) return 0;
        if (d >= 9223372036854775807.0) return INT64_MAX;
        if (d <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)d;
    }
    /* Unsigned and bool; a u64 above INT64_MAX saturates for the same
     * reason. */
    return bits > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)bits;
}

double nm_gguf_arr_f64(const nm_gguf_value *arr, uint64_t i) {
    size_t n_bytes;
    uint64_t bits = element_bits(arr, i, &n_bytes);
    nm_gguf_type t = arr->v.arr.type;
    if (t == NM_GGUF_FLOAT32 || t == NM_GGUF_FLOAT64) return bits_to_f64(bits, t);
    if (is_signed(t)) return (double)bits_to_i64(bits, n_bytes);
    return (double)bits;
}

nm_gguf_str nm_gguf_arr_str(const nm_gguf_value *arr, uint64_t i) {
    NM_ASSERT(arr->type == NM_GGUF_ARRAY && arr->v.arr.type == NM_GGUF_STRING && i < arr->v.arr.n);
    return ((const nm_gguf_str *)arr->v.arr.data)[i];
}
