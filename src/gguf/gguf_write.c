/* The GGUF v3 writer for tools and tests: keys are serialised when added,
 * tensor data is copied when added (or, for a streamed file, asked for when
 * the writer gets to it), and the file is laid out once at the end
 * (alignment 32 or general.alignment; padding bytes are zero). It refuses
 * anything the reader would refuse, so what it writes always reads back. */
#include "gguf-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define DEFAULT_ALIGNMENT 32
#define ALIGNMENT_KEY "general.alignment"

/* A growing byte string; the first failed allocation sticks, so a sequence
 * of puts is checked once at the end. */
typedef struct bytebuf {
    uint8_t *p; /* [cap], n used */
    size_t n, cap;
    bool failed;
} bytebuf;

typedef struct writer_kv {
    char *key;      /* NUL-terminated copy, for duplicate checks */
    uint8_t *bytes; /* [n_bytes]: key, type and value as in the file */
    size_t n_bytes;
} writer_kv;

typedef struct writer_tensor {
    char *name; /* NUL-terminated copy */
    uint32_t type, n_dims;
    int64_t ne[4];
    uint8_t *data; /* [n_bytes] copy, NULL when deferred */
    uint64_t n_bytes;
    bool deferred; /* the data comes from a source when the file is streamed */
} writer_tensor;

struct nm_gguf_writer {
    writer_kv *kvs; /* [cap_kv], n_kv used */
    size_t n_kv, cap_kv;
    writer_tensor *tensors; /* [cap_tensors], n_tensors used */
    size_t n_tensors, cap_tensors;
    uint32_t alignment;
};

static void put(bytebuf *b, const void *src, size_t n) {
    if (b->failed || n == 0) return;
    if (n > b->cap - b->n) {
        size_t need, cap = b->cap ? b->cap : 64;
        if (!nm_add_size(b->n, n, &need)) {
            b->failed = true;
            return;
        }
        while (cap < need) {
            if (!nm_mul_size(cap, 2, &cap)) {
                cap = need;
                break;
            }
        }
        uint8_t *p = nm_realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_le(bytebuf *b, uint64_t v, size_t n_bytes) {
    uint8_t le[8];
    for (size_t i = 0; i < n_bytes; i++)
        le[i] = (uint8_t)(v >> (8 * i));
    put(b, le, n_bytes);
}

static void put_str(bytebuf *b, const char *s, uint64_t len) {
    put_le(b, len, 8);
    if (len > SIZE_MAX) {
        b->failed = true;
        return;
    }
    put(b, s, (size_t)len);
}

static char *copy_cstr(const char *s) {
    size_t n = strlen(s);
    char *c = nm_malloc(n + 1);
    if (c) memcpy(c, s, n + 1);
    return c;
}

nm_gguf_writer *nm_gguf_writer_new(void) {
    nm_gguf_writer *w = nm_calloc(1, sizeof *w);
    if (w) w->alignment = DEFAULT_ALIGNMENT;
    return w;
}

void nm_gguf_writer_free(nm_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        nm_free(w->kvs[i].key);
        nm_free(w->kvs[i].bytes);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        nm_free(w->tensors[i].name);
        nm_free(w->tensors[i].data);
    }
    nm_free(w->kvs);
    nm_free(w->tensors);
    nm_free(w);
}

/* Doubles *cap when n == *cap; false when out of memory (nothing changed). */
static bool grow(void **items, size_t *cap, size_t n, size_t item_bytes) {
    if (n < *cap) return true;
    size_t new_cap = *cap ? *cap * 2 : 16, n_bytes;
    if (!nm_mul_size(new_cap, item_bytes, &n_bytes)) return false;
    void *p = nm_realloc(*items, n_bytes);
    if (!p) return false;
    *items = p;
    *cap = new_cap;
    return true;
}

static bool int_fits(const nm_gguf_value *v) {
    switch (v->type) {
    case NM_GGUF_UINT8:
        return v->v.u64 <= UINT8_MAX;
    case NM_GGUF_UINT16:
        return v->v.u64 <= UINT16_MAX;
    case NM_GGUF_UINT32:
        return v->v.u64 <= UINT32_MAX;
    case NM_GGUF_INT8:
        return v->v.i64 >= INT8_MIN && v->v.i64 <= INT8_MAX;
    case NM_GGUF_INT16:
        return v->v.i64 >= INT16_MIN && v->v.i64 <= INT16_MAX;
    case NM_GGUF_INT32:
        return v->v.i64 >= INT32_MIN && v->v.i64 <= INT32_MAX;
    default:
        return true;
    }
}

/* Whether the reader would accept v; depth counts the enclosing arrays. */
static bool value_ok(const nm_gguf_value *v, int depth) {
    if ((unsigned)v->type >= NM_GGUF_TYPE_COUNT || !int_fits(v)) return false;
    if (v->type == NM_GGUF_STRING) return v->v.str.len == 0 || v->v.str.ptr != NULL;
    if (v->type != NM_GGUF_ARRAY) return true;
    if (depth + 1 > NM_GGUF_MAX_DEPTH) return false;
    nm_gguf_type elem = v->v.arr.type;
    uint64_t n = v->v.arr.n;
    if ((unsigned)elem >= NM_GGUF_TYPE_COUNT) return false;
    if (n == 0) return true;
    if (v->v.arr.data == NULL) return false;
    if (elem == NM_GGUF_BOOL) {
        const uint8_t *b = v->v.arr.data;
        for (uint64_t i = 0; i < n; i++) {
            if (b[i] > 1) return false;
        }
    } else if (elem == NM_GGUF_STRING) {
        const nm_gguf_str *s = v->v.arr.data;
        for (uint64_t i = 0; i < n; i++) {
            if (s[i].len != 0 && s[i].ptr == NULL) return false;
        }
    } else if (elem == NM_GGUF_ARRAY) {
        const nm_gguf_value *items = v->v.arr.data;
        for (uint64_t i = 0; i < n; i++) {
            if (items[i].type != NM_GGUF_ARRAY || !value_ok(&items[i], depth + 1)) return false;
        }
    }
    return true;
}

static void put_array_body(bytebuf *b, const nm_gguf_value *v);

static void put_value(bytebuf *b, const nm_gguf_value *v) {
    size_t n_bytes = nm_gguf_scalar_bytes(v->type);
    switch (v->type) {
    case NM_GGUF_UINT8:
    case NM_GGUF_UINT16:
    case NM_GGUF_UINT32:
    case NM_GGUF_UINT64:
        put_le(b, v->v.u64, n_bytes);
        break;
    case NM_GGUF_INT8:
    case NM_GGUF_INT16:
    case NM_GGUF_INT32:
    case NM_GGUF_INT64:
        put_le(b, (uint64_t)v->v.i64, n_bytes);
        break;
    case NM_GGUF_FLOAT32: {
        float f = (float)v->v.f64;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        put_le(b, bits, 4);
        break;
    }
    case NM_GGUF_FLOAT64: {
        uint64_t bits;
        memcpy(&bits, &v->v.f64, sizeof bits);
        put_le(b, bits, 8);
        break;
    }
    case NM_GGUF_BOOL:
        put_le(b, v->v.b ? 1 : 0, 1);
        break;
    case NM_GGUF_STRING:
        put_str(b, v->v.str.ptr, v->v.str.len);
        break;
    case NM_GGUF_ARRAY:
        put_array_body(b, v);
        break;
    default:
        NM_ASSERT(!"value checked by value_ok");
    }
}

static void put_array_body(bytebuf *b, const nm_gguf_value *v) {
    nm_gguf_type elem = v->v.arr.type;
    uint64_t n = v->v.arr.n;
    put_le(b, (uint64_t)elem, 4);
    put_le(b, n, 8);
    size_t elem_bytes = nm_gguf_scalar_bytes(elem), total;
    if (elem_bytes) {
        /* Packed host-order elements; the file is little-endian, as is every
         * host npumoe builds for. */
        if (n > SIZE_MAX || !nm_mul_size((size_t)n, elem_bytes, &total)) {
            b->failed = true;
            return;
        }
        put(b, v->v.arr.data, total);
    } else if (elem == NM_GGUF_STRING) {
        const nm_gguf_str *s = v->v.arr.data;
        for (uint64_t i = 0; i < n && !b->failed; i++)
            put_str(b, s[i].ptr, s[i].len);
    } else {
        const nm_gguf_value *items = v->v.arr.data;
        for (uint64_t i = 0; i < n && !b->failed; i++)
            put_array_body(b, &items[i]);
    }
}

/* Checks the key and starts its serialisation (key and type) in b. */
static nm_status begin_kv(const nm_gguf_writer *w, const char *key, nm_gguf_type type, bytebuf *b) {
    NM_ASSERT(key != NULL);
    if (key[0] == '\0') return NM_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) return NM_ERR_INVALID_ARG;
    }
    if (strcmp(key, ALIGNMENT_KEY) == 0 && type != NM_GGUF_UINT32) return NM_ERR_INVALID_ARG;
    *b = (bytebuf){0};
    put_str(b, key, strlen(key));
    put_le(b, (uint64_t)type, 4);
    return NM_OK;
}

/* Appends the finished kv in b (taking its bytes) or frees b. */
static nm_status finish_kv(nm_gguf_writer *w, const char *key, bytebuf *b) {
    char *copy = b->failed ? NULL : copy_cstr(key);
    if (!copy || !grow((void **)&w->kvs, &w->cap_kv, w->n_kv, sizeof *w->kvs)) {
        nm_free(copy);
        nm_free(b->p);
        return NM_ERR_NOMEM;
    }
    w->kvs[w->n_kv++] = (writer_kv){.key = copy, .bytes = b->p, .n_bytes = b->n};
    return NM_OK;
}

nm_status nm_gguf_writer_set_value(nm_gguf_writer *w, const char *key, const nm_gguf_value *value) {
    NM_ASSERT(w != NULL && value != NULL);
    if (!value_ok(value, 0)) return NM_ERR_INVALID_ARG;
    bool is_alignment = key && strcmp(key, ALIGNMENT_KEY) == 0;
    if (is_alignment) {
        uint64_t a = value->v.u64;
        if (value->type != NM_GGUF_UINT32 || a == 0 || (a & (a - 1)) != 0) {
            return NM_ERR_INVALID_ARG;
        }
    }
    bytebuf b;
    nm_status st = begin_kv(w, key, value->type, &b);
    if (st != NM_OK) return st;
    put_value(&b, value);
    st = finish_kv(w, key, &b);
    if (st == NM_OK && is_alignment) w->alignment = (uint32_t)value->v.u64;
    return st;
}

nm_status nm_gguf_writer_set_u32(nm_gguf_writer *w, const char *key, uint32_t v) {
    nm_gguf_value value = {.type = NM_GGUF_UINT32, .v.u64 = v};
    return nm_gguf_writer_set_value(w, key, &value);
}

nm_status nm_gguf_writer_set_i32(nm_gguf_writer *w, const char *key, int32_t v) {
    nm_gguf_value value = {.type = NM_GGUF_INT32, .v.i64 = v};
    return nm_gguf_writer_set_value(w, key, &value);
}

nm_status nm_gguf_writer_set_u64(nm_gguf_writer *w, const char *key, uint64_t v) {
    nm_gguf_value value = {.type = NM_GGUF_UINT64, .v.u64 = v};
    return nm_gguf_writer_set_value(w, key, &value);
}

nm_status nm_gguf_writer_set_f32(nm_gguf_writer *w, const char *key, float v) {
    nm_gguf_value value = {.type = NM_GGUF_FLOAT32, .v.f64 = v};
    return nm_gguf_writer_set_value(w, key, &value);
}

nm_status nm_gguf_writer_set_bool(nm_gguf_writer *w, const char *key, bool v) {
    nm_gguf_value value = {.type = NM_GGUF_BOOL, .v.b = v};
    return nm_gguf_writer_set_value(w, key, &value);
}

nm_status nm_gguf_writer_set_str(nm_gguf_writer *w, const char *key, const char *v) {
    NM_ASSERT(v != NULL);
    nm_gguf_value value = {.type = NM_GGUF_STRING, .v.str = {v, strlen(v)}};
    return nm_gguf_writer_set_value(w, key, &value);
}

nm_status nm_gguf_writer_set_arr(nm_gguf_writer *w, const char *key, nm_gguf_type elem,
                                 const void *data, uint64_t n) {
    if ((unsigned)elem >= NM_GGUF_TYPE_COUNT || nm_gguf_scalar_bytes(elem) == 0) {
        return NM_ERR_INVALID_ARG;
    }
    nm_gguf_value value = {.type = NM_GGUF_ARRAY, .v.arr = {elem, n, data}};
    return nm_gguf_writer_set_value(w, key, &value);
}

nm_status nm_gguf_writer_set_arr_str(nm_gguf_writer *w, const char *key, const char *const *strs,
                                     uint64_t n) {
    NM_ASSERT(w != NULL && (strs != NULL || n == 0));
    for (uint64_t i = 0; i < n; i++)
        NM_ASSERT(strs[i] != NULL);
    bytebuf b;
    nm_status st = begin_kv(w, key, NM_GGUF_ARRAY, &b);
    if (st != NM_OK) return st;
    put_le(&b, NM_GGUF_STRING, 4);
    put_le(&b, n, 8);
    for (uint64_t i = 0; i < n && !b.failed; i++)
        put_str(&b, strs[i], strlen(strs[i]));
    return finish_kv(w, key, &b);
}

/* Declares a tensor; data is copied, or NULL: given when the file is
 * streamed. */
static nm_status add_tensor(nm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                            const int64_t *ne, const void *data, uint64_t n_bytes, bool deferred) {
    NM_ASSERT(w != NULL && name != NULL && (ne != NULL || n_dims == 0));
    if (name[0] == '\0' || n_dims == 0 || n_dims > 4) return NM_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) return NM_ERR_INVALID_ARG;
    }
    writer_tensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}, .deferred = deferred};
    int64_t n_rows = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return NM_ERR_INVALID_ARG;
        if (d > 0 && n_rows > INT64_MAX / ne[d]) return NM_ERR_INVALID_ARG;
        if (d > 0) n_rows *= ne[d];
        t.ne[d] = ne[d];
    }
    size_t row_bytes, expect;
    if (!nm_dtype_row_bytes(type, ne[0], &row_bytes) || (uint64_t)n_rows > SIZE_MAX ||
        !nm_mul_size(row_bytes, (size_t)n_rows, &expect) ||
        (!deferred && (expect != n_bytes || (n_bytes > 0 && data == NULL)))) {
        return NM_ERR_INVALID_ARG;
    }
    t.n_bytes = expect;
    t.name = copy_cstr(name);
    t.data = deferred ? NULL : nm_malloc((size_t)expect);
    if (!t.name || (!deferred && !t.data) ||
        !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors)) {
        nm_free(t.name);
        nm_free(t.data);
        return NM_ERR_NOMEM;
    }
    if (!deferred) memcpy(t.data, data, (size_t)expect);
    w->tensors[w->n_tensors++] = t;
    return NM_OK;
}

nm_status nm_gguf_writer_add_tensor(nm_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    uint64_t n_bytes) {
    return add_tensor(w, name, type, n_dims, ne, data, n_bytes, false);
}

nm_status nm_gguf_writer_add_tensor_info(nm_gguf_writer *w, const char *name, uint32_t type,
                                         uint32_t n_dims, const int64_t *ne) {
    return add_tensor(w, name, type, n_dims, ne, NULL, 0, true);
}

static bool align_up(size_t n, size_t alignment, size_t *out) {
    size_t r = n % alignment;
    return r == 0 ? (*out = n, true) : nm_add_size(n, alignment - r, out);
}

/* Where things go: the header, keys and tensor infos take head_bytes; the
 * data section starts aligned at data_start, every tensor in it starts
 * aligned and is padded to the alignment; the file is total bytes. With
 * no tensors there is no data section and no padding, as llama.cpp writes
 * vocab-only files. */
typedef struct file_layout {
    size_t head_bytes, data_start, total;
} file_layout;

static nm_status layout_of(const nm_gguf_writer *w, file_layout *l, nm_error *err) {
    size_t size = 24, data_bytes = 0;
    bool ok = true;
    for (size_t i = 0; i < w->n_kv && ok; i++)
        ok = nm_add_size(size, w->kvs[i].n_bytes, &size);
    for (size_t i = 0; i < w->n_tensors && ok; i++) {
        const writer_tensor *t = &w->tensors[i];
        ok = nm_add_size(size, 8 + strlen(t->name) + 4 + 8 * (size_t)t->n_dims + 4 + 8, &size) &&
             nm_add_size(data_bytes, (size_t)t->n_bytes, &data_bytes) &&
             align_up(data_bytes, w->alignment, &data_bytes);
    }
    l->head_bytes = size;
    l->data_start = size;
    l->total = size;
    if (ok && w->n_tensors > 0)
        ok = align_up(size, w->alignment, &l->data_start) &&
             nm_add_size(l->data_start, data_bytes, &l->total);
    if (!ok) return nm_errorf(err, NM_ERR_NOMEM, "GGUF file size overflows size_t");
    return NM_OK;
}

/* The header, keys and tensor infos into head (head_bytes of it). */
static void put_head(const nm_gguf_writer *w, bytebuf *head) {
    put(head, "GGUF", 4);
    put_le(head, 3, 4);
    put_le(head, w->n_tensors, 8);
    put_le(head, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++)
        put(head, w->kvs[i].bytes, w->kvs[i].n_bytes);
    size_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        put_str(head, t->name, strlen(t->name));
        put_le(head, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_le(head, (uint64_t)t->ne[d], 8);
        put_le(head, t->type, 4);
        put_le(head, offset, 8);
        align_up(offset + (size_t)t->n_bytes, w->alignment, &offset);
    }
}

nm_status nm_gguf_writer_to_memory(const nm_gguf_writer *w, uint8_t **out, size_t *n_bytes,
                                   nm_error *err) {
    NM_ASSERT(w != NULL && out != NULL && n_bytes != NULL);
    *out = NULL;
    *n_bytes = 0;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].deferred)
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "tensor '%s' has no data here: stream the file instead",
                             w->tensors[i].name);
    file_layout l;
    nm_status st = layout_of(w, &l, err);
    if (st != NM_OK) return st;
    uint8_t *file = nm_calloc(1, l.total); /* zero padding comes for free */
    if (!file) {
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a GGUF file of %zu bytes", l.total);
    }
    bytebuf head = {.p = file, .n = 0, .cap = l.total};
    put_head(w, &head);
    NM_ASSERT(!head.failed && head.n == l.head_bytes);
    size_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        memcpy(file + l.data_start + offset, t->data, (size_t)t->n_bytes);
        align_up(offset + (size_t)t->n_bytes, w->alignment, &offset);
    }
    *out = file;
    *n_bytes = l.total;
    return NM_OK;
}

/* n zero bytes to f. */
static bool write_zeros(FILE *f, size_t n) {
    static const uint8_t zeros[4096];
    while (n > 0) {
        const size_t k = n < sizeof zeros ? n : sizeof zeros;
        if (fwrite(zeros, 1, k, f) != k) return false;
        n -= k;
    }
    return true;
}

nm_status nm_gguf_writer_stream(const nm_gguf_writer *w, FILE *f, const char *name,
                                nm_gguf_tensor_source source, void *ctx, uint64_t *n_bytes,
                                nm_error *err) {
    NM_ASSERT(w != NULL && f != NULL && name != NULL);
    for (size_t i = 0; i < w->n_tensors && !source; i++)
        if (w->tensors[i].deferred)
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "%s: tensor '%s' has no data and no source gives it", name,
                             w->tensors[i].name);
    file_layout l;
    nm_status st = layout_of(w, &l, err);
    if (st != NM_OK) return nm_error_prefix(err, "%s", name);
    bytebuf head = {0};
    put_head(w, &head);
    if (head.failed) {
        nm_free(head.p);
        return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory for the GGUF header", name);
    }
    bool ok = fwrite(head.p, 1, head.n, f) == head.n && write_zeros(f, l.data_start - head.n);
    nm_free(head.p);
    for (size_t i = 0; i < w->n_tensors && ok && st == NM_OK; i++) {
        const writer_tensor *t = &w->tensors[i];
        const void *data = t->data;
        if (t->deferred) st = source(ctx, i, &data, err);
        size_t end;
        align_up((size_t)t->n_bytes, w->alignment, &end);
        if (st == NM_OK)
            ok = fwrite(data, 1, (size_t)t->n_bytes, f) == (size_t)t->n_bytes &&
                 write_zeros(f, end - (size_t)t->n_bytes);
    }
    if (st == NM_OK && ok) ok = fflush(f) == 0;
    if (st == NM_OK && !ok)
        st = nm_errorf(err, NM_ERR_IO, "%s: cannot write %zu bytes: %s", name, l.total,
                       strerror(errno));
    if (st == NM_OK && n_bytes) *n_bytes = (uint64_t)l.total;
    return st;
}

nm_status nm_gguf_writer_stream_file(const nm_gguf_writer *w, const char *path,
                                     nm_gguf_tensor_source source, void *ctx, nm_error *err) {
    NM_ASSERT(w != NULL && path != NULL);
    nm_outfile o;
    nm_status st = nm_outfile_open(path, &o, err);
    if (st == NM_OK) st = nm_gguf_writer_stream(w, o.f, path, source, ctx, NULL, err);
    if (st == NM_OK) return nm_outfile_commit(&o, err);
    nm_outfile_abort(&o); /* no partial file */
    return st;
}

nm_status nm_gguf_writer_write_file(const nm_gguf_writer *w, const char *path, nm_error *err) {
    return nm_gguf_writer_stream_file(w, path, NULL, NULL, err);
}
