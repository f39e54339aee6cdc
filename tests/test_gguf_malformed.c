/* GGUF files that must be refused: malformed files with the right status
 * and message, truncation at every length, random byte corruption, and
 * allocation-failure injection (no leak under LeakSanitizer). */
#include "harness.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

#include <stdlib.h>
#include <string.h>

/* ---- helpers -------------------------------------------------------------- */

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
    uint8_t *bytes = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_writer_to_memory(w, &bytes, n, &err), NM_OK);
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
int main(void) {
    test_malformed();
    test_truncation();
    test_corruption();
    test_alloc_failure();
    return nm_test_finish("test_gguf_malformed");
}
