/* The GGUF reader: maps a file (or takes caller memory), decodes the header,
 * every metadata value and the tensor table, and checks everything a hostile
 * file can lie about before any of it is used. Lookups are in gguf_get.c.
 * Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 * n_kv x (string key, u32 type, value), n_tensors x (string name, u32 n_dims,
 * i64 ne[n_dims], u32 type, u64 offset), padding to the alignment, data. */
#include "gguf-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_BYTES 24 /* magic, version, n_tensors, n_kv */
#define DEFAULT_ALIGNMENT 32

/* The fewest bytes one entry can occupy, so that a count in the header can be
 * checked against the file size before anything is allocated for it:
 * a kv is key length (8) + a non-empty key (1) + type (4) + a 1-byte value;
 * a tensor is name length (8) + name (1) + n_dims (4) + one ne (8) + type (4)
 * + offset (8). Inside arrays: a string is at least its length (8), a nested
 * array at least its element type and count (12). */
#define MIN_KV_BYTES 14
#define MIN_TENSOR_BYTES 33
#define MIN_STRING_BYTES 8
#define MIN_ARRAY_BYTES 12

/* Longest name quoted in a message; longer ones end in "...". */
#define SHOW_CHARS 96

typedef struct cursor {
    const uint8_t *base; /* [size] */
    uint64_t size;
    uint64_t pos;
} cursor;

typedef struct parser {
    cursor c;
    nm_gguf *g; /* owns the tables allocated while parsing */
    nm_error *err;
} parser;

static uint64_t bytes_left(const cursor *c) { return c->size - c->pos; }

/* Quotes a name from the file for a message: printable ASCII as is, other
 * bytes as \xNN, cut to SHOW_CHARS. */
static const char *show(nm_gguf_str s, char buf[SHOW_CHARS + 8]) {
    size_t n = 0;
    for (uint64_t i = 0; i < s.len; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (n + 4 > SHOW_CHARS) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
            buf[n++] = (char)ch;
        } else {
            static const char hex[] = "0123456789abcdef";
            buf[n++] = '\\';
            buf[n++] = 'x';
            buf[n++] = hex[ch >> 4];
            buf[n++] = hex[ch & 15];
        }
    }
    buf[n] = '\0';
    return buf;
}

static uint64_t load_le(const uint8_t *p, size_t n_bytes) {
    uint64_t v = 0;
    for (size_t i = 0; i < n_bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Two's-complement value of the low `bits` bits of x. */
static int64_t sign_extend(uint64_t x, unsigned bits) {
    if (bits < 64 && (x >> (bits - 1)) & 1) x |= ~(uint64_t)0 << bits;
    int64_t v;
    memcpy(&v, &x, sizeof v);
    return v;
}

static nm_status past_end(const parser *p, const char *what, uint64_t need) {
    return nm_errorf(p->err, NM_ERR_FORMAT,
                     "%s at byte %" PRIu64 " needs %" PRIu64
                     " bytes, past the end of the file (%" PRIu64 " bytes)",
                     what, p->c.pos, need, p->c.size);
}

/* Outputs are set even on failure: the compiler cannot see that nm_errorf
 * never returns NM_OK, and would warn about later uses. */
static nm_status read_uint(parser *p, size_t n_bytes, const char *what, uint64_t *out) {
    *out = 0;
    if (bytes_left(&p->c) < n_bytes) return past_end(p, what, n_bytes);
    *out = load_le(p->c.base + p->c.pos, n_bytes);
    p->c.pos += n_bytes;
    return NM_OK;
}

static nm_status read_u32(parser *p, const char *what, uint32_t *out) {
    uint64_t v;
    nm_status st = read_uint(p, 4, what, &v);
    *out = (uint32_t)v;
    return st;
}

static nm_status read_str(parser *p, const char *what, nm_gguf_str *out) {
    uint64_t len;
    *out = (nm_gguf_str){NULL, 0};
    nm_status st = read_uint(p, 8, what, &len);
    if (st != NM_OK) return st;
    if (len > bytes_left(&p->c)) {
        return nm_errorf(p->err, NM_ERR_FORMAT,
                         "%s length %" PRIu64 " at byte %" PRIu64
                         " runs past the end of the file (%" PRIu64 " bytes)",
                         what, len, p->c.pos - 8, p->c.size);
    }
    out->ptr = (const char *)p->c.base + p->c.pos;
    out->len = len;
    p->c.pos += len;
    return NM_OK;
}

/* A table of n elements owned by the reader until close. */
static nm_status alloc_table(parser *p, uint64_t n, size_t elem_bytes, void **out) {
    size_t payload, total;
    if (n > SIZE_MAX || !nm_mul_size((size_t)n, elem_bytes, &payload) ||
        !nm_add_size(payload, sizeof(nm_gguf_block), &total)) {
        return nm_errorf(p->err, NM_ERR_NOMEM, "table of %" PRIu64 " elements is too large", n);
    }
    nm_gguf_block *b = nm_malloc(total);
    if (!b) {
        return nm_errorf(p->err, NM_ERR_NOMEM, "out of memory for a table of %" PRIu64 " elements",
                         n);
    }
    b->next = p->g->blocks;
    p->g->blocks = b;
    *out = b + 1;
    return NM_OK;
}

static nm_status parse_value(parser *p, nm_gguf_type type, int depth, nm_gguf_value *out);

/* An array body (element type, count, elements); depth counts the arrays
 * that enclose it, itself included. */
static nm_status parse_array(parser *p, int depth, nm_gguf_value *out) {
    if (depth > NM_GGUF_MAX_DEPTH) {
        return nm_errorf(p->err, NM_ERR_FORMAT, "arrays nested deeper than %d levels",
                         NM_GGUF_MAX_DEPTH);
    }
    uint32_t elem;
    uint64_t n;
    nm_status st = read_u32(p, "array element type", &elem);
    if (st == NM_OK) st = read_uint(p, 8, "array element count", &n);
    if (st != NM_OK) return st;
    if (elem >= NM_GGUF_TYPE_COUNT) {
        return nm_errorf(p->err, NM_ERR_FORMAT, "array of unknown element type %" PRIu32, elem);
    }
    out->type = NM_GGUF_ARRAY;
    out->v.arr.type = (nm_gguf_type)elem;
    out->v.arr.n = n;
    out->v.arr.data = NULL;

    size_t elem_bytes = nm_gguf_scalar_bytes((nm_gguf_type)elem);
    uint64_t min_bytes = elem_bytes               ? elem_bytes
                         : elem == NM_GGUF_STRING ? MIN_STRING_BYTES
                                                  : MIN_ARRAY_BYTES;
    if (n > bytes_left(&p->c) / min_bytes) {
        return nm_errorf(p->err, NM_ERR_FORMAT,
                         "array of %" PRIu64 " %s elements at byte %" PRIu64
                         " cannot fit in the %" PRIu64 " bytes left in the file",
                         n, nm_gguf_type_name((nm_gguf_type)elem), p->c.pos, bytes_left(&p->c));
    }

    if (elem_bytes) {
        const uint8_t *data = p->c.base + p->c.pos;
        if (elem == NM_GGUF_BOOL) {
            for (uint64_t i = 0; i < n; i++) {
                if (data[i] > 1) {
                    return nm_errorf(p->err, NM_ERR_FORMAT,
                                     "element %" PRIu64 ": bool value %u is neither 0 nor 1", i,
                                     data[i]);
                }
            }
        }
        out->v.arr.data = data;
        p->c.pos += n * elem_bytes;
        return NM_OK;
    }
    if (n == 0) return NM_OK;

    if (elem == NM_GGUF_STRING) {
        nm_gguf_str *strs; /* [n] */
        st = alloc_table(p, n, sizeof *strs, (void **)&strs);
        if (st != NM_OK) return st;
        out->v.arr.data = strs;
        for (uint64_t i = 0; i < n; i++) {
            st = read_str(p, "string", &strs[i]);
            if (st != NM_OK) return nm_error_prefix(p->err, "element %" PRIu64, i);
        }
        return NM_OK;
    }

    nm_gguf_value *items; /* [n], each an ARRAY */
    st = alloc_table(p, n, sizeof *items, (void **)&items);
    if (st != NM_OK) return st;
    out->v.arr.data = items;
    for (uint64_t i = 0; i < n; i++) {
        st = parse_array(p, depth + 1, &items[i]);
        if (st != NM_OK) return nm_error_prefix(p->err, "element %" PRIu64, i);
    }
    return NM_OK;
}

static nm_status parse_value(parser *p, nm_gguf_type type, int depth, nm_gguf_value *out) {
    memset(out, 0, sizeof *out);
    out->type = type;
    if (type == NM_GGUF_STRING) return read_str(p, "string", &out->v.str);
    if (type == NM_GGUF_ARRAY) return parse_array(p, depth + 1, out);

    size_t n_bytes = nm_gguf_scalar_bytes(type);
    uint64_t bits;
    nm_status st = read_uint(p, n_bytes, nm_gguf_type_name(type), &bits);
    if (st != NM_OK) return st;
    switch (type) {
    case NM_GGUF_UINT8:
    case NM_GGUF_UINT16:
    case NM_GGUF_UINT32:
    case NM_GGUF_UINT64:
        out->v.u64 = bits;
        break;
    case NM_GGUF_INT8:
    case NM_GGUF_INT16:
    case NM_GGUF_INT32:
    case NM_GGUF_INT64:
        out->v.i64 = sign_extend(bits, (unsigned)(8 * n_bytes));
        break;
    case NM_GGUF_FLOAT32: {
        uint32_t b32 = (uint32_t)bits;
        float f;
        memcpy(&f, &b32, sizeof f);
        out->v.f64 = f;
        break;
    }
    case NM_GGUF_FLOAT64:
        memcpy(&out->v.f64, &bits, sizeof out->v.f64);
        break;
    case NM_GGUF_BOOL:
        if (bits > 1) {
            return nm_errorf(p->err, NM_ERR_FORMAT, "bool value %" PRIu64 " is neither 0 nor 1",
                             bits);
        }
        out->v.b = bits == 1;
        break;
    default:
        NM_ASSERT(!"value type checked by the caller");
    }
    return NM_OK;
}

static nm_status parse_header(parser *p) {
    nm_gguf *g = p->g;
    const uint8_t *b = p->c.base;
    if (p->c.size < 4) {
        return nm_errorf(p->err, NM_ERR_FORMAT,
                         "file is %" PRIu64 " bytes, too short for the GGUF magic", p->c.size);
    }
    if (memcmp(b, "GGUF", 4) != 0) {
        char shown[SHOW_CHARS + 8];
        nm_gguf_str magic = {(const char *)b, 4};
        if (memcmp(b, "FUGG", 4) == 0) {
            return nm_errorf(p->err, NM_ERR_UNSUPPORTED,
                             "byte-swapped magic 'FUGG': big-endian GGUF is not supported");
        }
        return nm_errorf(p->err, NM_ERR_FORMAT, "bad magic '%s', not a GGUF file (expected 'GGUF')",
                         show(magic, shown));
    }
    p->c.pos = 4;
    nm_status st = read_u32(p, "version", &g->version);
    if (st != NM_OK) return st;
    /* A big-endian writer puts the small version number in the high bytes. */
    if ((g->version & 0xffff) == 0 && g->version != 0) {
        return nm_errorf(p->err, NM_ERR_UNSUPPORTED,
                         "version field 0x%08" PRIx32
                         " reads as a big-endian GGUF; only little-endian files are supported",
                         g->version);
    }
    if (g->version == 1) {
        return nm_errorf(p->err, NM_ERR_UNSUPPORTED,
                         "GGUF version 1 (32-bit counts) is not supported; only versions 2 and 3");
    }
    if (g->version != 2 && g->version != 3) {
        return nm_errorf(p->err, NM_ERR_UNSUPPORTED,
                         "GGUF version %" PRIu32 " is not supported; only versions 2 and 3",
                         g->version);
    }
    if (p->c.size < HEADER_BYTES) {
        return nm_errorf(p->err, NM_ERR_FORMAT,
                         "file is %" PRIu64 " bytes, shorter than the %d-byte GGUF header",
                         p->c.size, HEADER_BYTES);
    }
    read_uint(p, 8, "tensor count", &g->n_tensors);
    read_uint(p, 8, "kv count", &g->n_kv);

    uint64_t left = bytes_left(&p->c);
    if (g->n_kv > left / MIN_KV_BYTES) {
        return nm_errorf(p->err, NM_ERR_FORMAT,
                         "header claims %" PRIu64 " key-value pairs, but the %" PRIu64
                         " bytes after the header hold at most %" PRIu64,
                         g->n_kv, left, left / MIN_KV_BYTES);
    }
    if (g->n_tensors > (left - g->n_kv * MIN_KV_BYTES) / MIN_TENSOR_BYTES) {
        return nm_errorf(p->err, NM_ERR_FORMAT,
                         "header claims %" PRIu64 " tensors and %" PRIu64
                         " key-value pairs, more than the %" PRIu64
                         " bytes after the header can hold",
                         g->n_tensors, g->n_kv, left);
    }
    return NM_OK;
}

static int cmp_kv_key(const void *a, const void *b) {
    const nm_gguf_kv *x = *(const nm_gguf_kv *const *)a;
    const nm_gguf_kv *y = *(const nm_gguf_kv *const *)b;
    int c = nm_gguf_str_cmp(x->key, y->key);
    /* Ties in file order, so a duplicate is reported with its first index. */
    return c ? c : (x < y ? -1 : x > y);
}

static nm_status parse_kvs(parser *p) {
    nm_gguf *g = p->g;
    char shown[SHOW_CHARS + 8];
    g->kvs = nm_calloc((size_t)g->n_kv, sizeof *g->kvs);
    g->kv_sorted = nm_calloc((size_t)g->n_kv, sizeof *g->kv_sorted);
    if (!g->kvs || !g->kv_sorted) {
        return nm_errorf(p->err, NM_ERR_NOMEM, "out of memory for %" PRIu64 " key-value pairs",
                         g->n_kv);
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        nm_gguf_kv *kv = &g->kvs[i];
        nm_status st = read_str(p, "key", &kv->key);
        if (st != NM_OK) return nm_error_prefix(p->err, "kv %" PRIu64, i);
        if (kv->key.len == 0) {
            return nm_errorf(p->err, NM_ERR_FORMAT, "kv %" PRIu64 ": key is empty", i);
        }
        uint32_t type;
        st = read_u32(p, "value type", &type);
        if (st == NM_OK && type >= NM_GGUF_TYPE_COUNT) {
            st = nm_errorf(p->err, NM_ERR_FORMAT, "unknown value type %" PRIu32, type);
        }
        if (st == NM_OK) st = parse_value(p, (nm_gguf_type)type, 0, &kv->value);
        if (st != NM_OK)
            return nm_error_prefix(p->err, "kv %" PRIu64 " '%s'", i, show(kv->key, shown));
        g->kv_sorted[i] = kv;
    }
    if (g->n_kv > 0) qsort(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, cmp_kv_key);
    for (uint64_t i = 1; i < g->n_kv; i++) {
        const nm_gguf_kv *a = g->kv_sorted[i - 1], *b = g->kv_sorted[i];
        if (nm_gguf_str_cmp(a->key, b->key) == 0) {
            return nm_errorf(p->err, NM_ERR_FORMAT,
                             "duplicate key '%s' (kv %" PRIu64 " and kv %" PRIu64 ")",
                             show(a->key, shown), (uint64_t)(a - g->kvs), (uint64_t)(b - g->kvs));
        }
    }

    g->alignment = DEFAULT_ALIGNMENT;
    const nm_gguf_value *align = nm_gguf_find(g, "general.alignment");
    if (align) {
        if (align->type != NM_GGUF_UINT32) {
            return nm_errorf(p->err, NM_ERR_FORMAT, "general.alignment has type %s, must be u32",
                             nm_gguf_type_name(align->type));
        }
        uint64_t a = align->v.u64;
        if (a == 0 || (a & (a - 1)) != 0) {
            return nm_errorf(p->err, NM_ERR_FORMAT,
                             "general.alignment = %" PRIu64 " is not a nonzero power of two", a);
        }
        g->alignment = a;
    }
    return NM_OK;
}

/* Type ids ggml once defined and then removed: a file may name them, but
 * nothing can read it any more. */
static const char *removed_type_name(uint32_t type) {
    switch (type) {
    case 4:
        return "q4_2";
    case 5:
        return "q4_3";
    case 31:
        return "q4_0_4_4";
    case 32:
        return "q4_0_4_8";
    case 33:
        return "q4_0_8_8";
    case 36:
        return "iq4_nl_4_4";
    case 37:
        return "iq4_nl_4_8";
    case 38:
        return "iq4_nl_8_8";
    default:
        return NULL;
    }
}

/* The info of one tensor after its name; messages are prefixed by the
 * caller. */
static nm_status parse_tensor_shape(parser *p, nm_gguf_tensor *t) {
    nm_status st = read_u32(p, "n_dims", &t->n_dims);
    if (st != NM_OK) return st;
    if (t->n_dims == 0 || t->n_dims > 4) {
        return nm_errorf(p->err, NM_ERR_FORMAT, "n_dims %" PRIu32 " is not in 1..4", t->n_dims);
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < 4; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t bits;
        st = read_uint(p, 8, "ne", &bits);
        if (st != NM_OK) return st;
        t->ne[d] = sign_extend(bits, 64);
        if (t->ne[d] <= 0) {
            return nm_errorf(p->err, NM_ERR_FORMAT, "ne[%" PRIu32 "] = %" PRId64 " is not positive",
                             d, t->ne[d]);
        }
        if (n_elements > INT64_MAX / t->ne[d]) {
            return nm_errorf(p->err, NM_ERR_FORMAT,
                             "element count overflows int64 at ne[%" PRIu32 "] = %" PRId64, d,
                             t->ne[d]);
        }
        n_elements *= t->ne[d];
    }
    st = read_u32(p, "type", &t->type);
    if (st != NM_OK) return st;
    const nm_dtype_traits *traits = nm_dtype_traits_of(t->type);
    if (!traits) {
        const char *removed = removed_type_name(t->type);
        if (removed) {
            return nm_errorf(p->err, NM_ERR_UNSUPPORTED,
                             "type %" PRIu32 " (%s) was removed from ggml and is not supported",
                             t->type, removed);
        }
        return nm_errorf(p->err, NM_ERR_FORMAT, "type id %" PRIu32 " is not a ggml type", t->type);
    }
    size_t row_bytes;
    if (!nm_dtype_row_bytes(t->type, t->ne[0], &row_bytes)) {
        if (t->ne[0] % traits->block_size != 0) {
            return nm_errorf(p->err, NM_ERR_FORMAT,
                             "ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRIu32,
                             t->ne[0], traits->name, traits->block_size);
        }
        return nm_errorf(p->err, NM_ERR_FORMAT, "row of %" PRId64 " %s elements overflows",
                         t->ne[0], traits->name);
    }
    uint64_t n_rows = (uint64_t)(n_elements / t->ne[0]);
    if (row_bytes != 0 && n_rows > UINT64_MAX / row_bytes) {
        return nm_errorf(p->err, NM_ERR_FORMAT, "size in bytes overflows");
    }
    t->n_bytes = n_rows * row_bytes;

    st = read_uint(p, 8, "offset", &t->offset);
    if (st != NM_OK) return st;
    if (t->offset % p->g->alignment != 0) {
        return nm_errorf(p->err, NM_ERR_FORMAT,
                         "offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                         t->offset, p->g->alignment);
    }
    return NM_OK;
}

static nm_status parse_tensor_infos(parser *p) {
    nm_gguf *g = p->g;
    char shown[SHOW_CHARS + 8];
    g->tensors = nm_calloc((size_t)g->n_tensors, sizeof *g->tensors);
    g->tensor_sorted = nm_calloc((size_t)g->n_tensors, sizeof *g->tensor_sorted);
    if (!g->tensors || !g->tensor_sorted) {
        return nm_errorf(p->err, NM_ERR_NOMEM, "out of memory for %" PRIu64 " tensors",
                         g->n_tensors);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        nm_gguf_tensor *t = &g->tensors[i];
        nm_status st = read_str(p, "name", &t->name);
        if (st != NM_OK) return nm_error_prefix(p->err, "tensor %" PRIu64, i);
        if (t->name.len == 0) {
            return nm_errorf(p->err, NM_ERR_FORMAT, "tensor %" PRIu64 ": name is empty", i);
        }
        st = parse_tensor_shape(p, t);
        if (st != NM_OK) return nm_error_prefix(p->err, "tensor '%s'", show(t->name, shown));
        g->tensor_sorted[i] = t;
    }
    return NM_OK;
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const nm_gguf_tensor *x = *(const nm_gguf_tensor *const *)a;
    const nm_gguf_tensor *y = *(const nm_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int cmp_tensor_name(const void *a, const void *b) {
    const nm_gguf_tensor *x = *(const nm_gguf_tensor *const *)a;
    const nm_gguf_tensor *y = *(const nm_gguf_tensor *const *)b;
    int c = nm_gguf_str_cmp(x->name, y->name);
    return c ? c : (x < y ? -1 : x > y);
}

/* Places every tensor in the data section and checks that each lies inside
 * the file, that no two overlap, and that names are unique. */
static nm_status place_tensors(parser *p) {
    nm_gguf *g = p->g;
    char shown[SHOW_CHARS + 8], shown2[SHOW_CHARS + 8];
    uint64_t header_end = p->c.pos;
    /* header_end <= file size, so rounding up cannot overflow. */
    g->data_start = (header_end + g->alignment - 1) / g->alignment * g->alignment;

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        nm_gguf_tensor *t = &g->tensors[i];
        uint64_t room = g->data_start <= g->file_bytes ? g->file_bytes - g->data_start : 0;
        if (g->data_start > g->file_bytes || t->offset > room || t->n_bytes > room - t->offset) {
            return nm_errorf(p->err, NM_ERR_FORMAT,
                             "tensor '%s': data [offset %" PRIu64 ", %" PRIu64
                             " bytes] runs past the end of the file (%" PRIu64 " bytes)",
                             show(t->name, shown), t->offset, t->n_bytes, g->file_bytes);
        }
        t->data = g->base + g->data_start + t->offset;
    }
    if (g->n_tensors == 0) return NM_OK;

    size_t n = (size_t)g->n_tensors;
    qsort(g->tensor_sorted, n, sizeof *g->tensor_sorted, cmp_tensor_offset);
    for (size_t i = 1; i < n; i++) {
        const nm_gguf_tensor *a = g->tensor_sorted[i - 1], *b = g->tensor_sorted[i];
        if (a->offset + a->n_bytes > b->offset) {
            return nm_errorf(p->err, NM_ERR_FORMAT,
                             "tensors '%s' [offset %" PRIu64 ", %" PRIu64
                             " bytes] and '%s' [offset %" PRIu64 ", %" PRIu64 " bytes] overlap",
                             show(a->name, shown), a->offset, a->n_bytes, show(b->name, shown2),
                             b->offset, b->n_bytes);
        }
    }
    qsort(g->tensor_sorted, n, sizeof *g->tensor_sorted, cmp_tensor_name);
    for (size_t i = 1; i < n; i++) {
        const nm_gguf_tensor *a = g->tensor_sorted[i - 1], *b = g->tensor_sorted[i];
        if (nm_gguf_str_cmp(a->name, b->name) == 0) {
            return nm_errorf(
                p->err, NM_ERR_FORMAT,
                "duplicate tensor name '%s' (tensor %" PRIu64 " and tensor %" PRIu64 ")",
                show(a->name, shown), (uint64_t)(a - g->tensors), (uint64_t)(b - g->tensors));
        }
    }
    return NM_OK;
}

/* Takes ownership of base when mapped (close unmaps it, also on failure). */
static nm_status open_over(const uint8_t *base, uint64_t n_bytes, bool mapped, nm_gguf **out,
                           nm_error *err) {
    *out = NULL;
    nm_gguf *g = nm_calloc(1, sizeof *g);
    if (!g) {
        if (mapped) munmap((void *)base, (size_t)n_bytes);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the GGUF reader");
    }
    g->base = base;
    g->file_bytes = n_bytes;
    g->mapped = mapped;
    parser p = {.c = {.base = base, .size = n_bytes, .pos = 0}, .g = g, .err = err};
    nm_status st = parse_header(&p);
    if (st == NM_OK) st = parse_kvs(&p);
    if (st == NM_OK) st = parse_tensor_infos(&p);
    if (st == NM_OK) st = place_tensors(&p);
    if (st != NM_OK) {
        nm_gguf_close(g);
        return st;
    }
    *out = g;
    return NM_OK;
}

nm_status nm_gguf_open_memory(const void *data, size_t n_bytes, nm_gguf **out, nm_error *err) {
    NM_ASSERT(out != NULL);
    *out = NULL;
    static const uint8_t empty[1];
    if (!data) {
        if (n_bytes != 0)
            return nm_errorf(err, NM_ERR_INVALID_ARG, "NULL data of %zu bytes", n_bytes);
        data = empty;
    }
    return open_over(data, n_bytes, false, out, err);
}

nm_status nm_gguf_open(const char *path, nm_gguf **out, nm_error *err) {
    NM_ASSERT(path != NULL && out != NULL);
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; the type check
     * below refuses it (no effect on regular files) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return nm_errorf(err, NM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return nm_errorf(err, NM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return nm_errorf(err, NM_ERR_IO,
                         "%s: not a regular file (a GGUF model is read by mapping it)", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return nm_errorf(err, NM_ERR_IO, "%s: file of %lld bytes is too large to map", path,
                         (long long)sb.st_size);
    }
    nm_status st;
    if (sb.st_size == 0) {
        /* mmap refuses an empty length; the parser reports the short file. */
        close(fd);
        st = nm_gguf_open_memory(NULL, 0, out, err);
    } else {
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        int e = errno;
        close(fd);
        if (map == MAP_FAILED)
            return nm_errorf(err, NM_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        st = open_over(map, (uint64_t)sb.st_size, true, out, err);
    }
    if (st != NM_OK) nm_error_prefix(err, "%s", path);
    return st;
}

void nm_gguf_drop_pages(const nm_gguf *g, const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t base = (uintptr_t)g->base, end = base + (uintptr_t)g->file_bytes;
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    if (!g->mapped || lo < base || hi > end || page == 0) return;
    lo = (lo + page - 1) / page * page; /* whole pages inside the range only */
    hi = hi / page * page;
    /* advice: a failure changes nothing the caller sees */
    if (lo < hi) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void nm_gguf_close(nm_gguf *g) {
    if (!g) return;
    nm_gguf_block *b = g->blocks;
    while (b) {
        nm_gguf_block *next = b->next;
        nm_free(b);
        b = next;
    }
    nm_free(g->kvs);
    nm_free(g->kv_sorted);
    nm_free(g->tensors);
    nm_free(g->tensor_sorted);
    if (g->mapped) munmap((void *)g->base, (size_t)g->file_bytes);
    nm_free(g);
}
