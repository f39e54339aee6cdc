/* libFuzzer target for the GGUF reader: any input must either be refused with
 * a message or open into tables whose every pointer, size and lookup holds up
 * (ASan/UBSan see each byte read); what opens must also survive a copy
 * through the writer and read back the same. */
#include "base/base.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

#include <stdlib.h>
#include <string.h>

/* A broken invariant is a finding: abort so libFuzzer records the input. */
static void require(int cond) {
    if (!cond) abort();
}

static uint64_t walk_value(const nm_gguf_value *v) {
    uint64_t sum = (uint64_t)v->type;
    if (v->type == NM_GGUF_STRING) {
        for (uint64_t i = 0; i < v->v.str.len; i++)
            sum += (uint8_t)v->v.str.ptr[i];
        return sum;
    }
    if (v->type != NM_GGUF_ARRAY) return sum;
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        if (v->v.arr.type == NM_GGUF_STRING) {
            nm_gguf_value s = {.type = NM_GGUF_STRING, .v.str = nm_gguf_arr_str(v, i)};
            sum += walk_value(&s);
        } else if (v->v.arr.type == NM_GGUF_ARRAY) {
            const nm_gguf_value *item = &((const nm_gguf_value *)v->v.arr.data)[i];
            require(item->type == NM_GGUF_ARRAY);
            sum += walk_value(item);
        } else {
            sum += (uint64_t)nm_gguf_arr_i64(v, i) + (uint64_t)(nm_gguf_arr_f64(v, i) > 0);
        }
    }
    return sum;
}

/* The name as a C string, or false when it holds a NUL or is too long. */
static bool c_name(nm_gguf_str s, char *buf, size_t cap) {
    if (s.len >= cap || memchr(s.ptr, 0, (size_t)s.len)) return false;
    memcpy(buf, s.ptr, (size_t)s.len);
    buf[s.len] = '\0';
    return true;
}

static uint64_t walk(const nm_gguf *g, const uint8_t *data, size_t size) {
    uint64_t sum = 0, alignment = nm_gguf_alignment(g);
    char name[256];
    require(alignment != 0 && (alignment & (alignment - 1)) == 0);
    for (uint64_t i = 0; i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        require(kv->key.len > 0);
        sum += walk_value(&kv->value);
        if (!c_name(kv->key, name, sizeof name)) continue;
        require(nm_gguf_find(g, name) == &kv->value);
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        float f32;
        bool b;
        nm_gguf_str s;
        const nm_gguf_value *arr;
        nm_error err;
        sum += nm_gguf_get_u32(g, name, &u32, &err) + nm_gguf_get_i32(g, name, &i32, &err) +
               nm_gguf_get_u64(g, name, &u64, &err) + nm_gguf_get_f32(g, name, &f32, &err) +
               nm_gguf_get_bool(g, name, &b, &err) + nm_gguf_get_str(g, name, &s, &err) +
               nm_gguf_get_arr(g, name, NM_GGUF_TYPE_COUNT, &arr, &err);
    }
    for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        require(t->n_dims >= 1 && t->n_dims <= 4 && t->offset % alignment == 0);
        require(d >= data && t->n_bytes <= size && d - data <= (ptrdiff_t)(size - t->n_bytes));
        size_t row_bytes;
        require(nm_dtype_row_bytes(t->type, t->ne[0], &row_bytes));
        require(row_bytes * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]) == t->n_bytes);
        for (uint64_t k = 0; k < t->n_bytes; k++)
            sum += d[k];
        if (c_name(t->name, name, sizeof name)) require(nm_gguf_find_tensor(g, name) == t);
    }
    return sum;
}

/* Copies every kv and tensor through the writer; the copy must open with
 * the same counts. Files whose names hold NULs cannot be named through the
 * writer's C-string API and are skipped. */
static void copy_through_writer(const nm_gguf *g) {
    char name[256];
    nm_gguf_writer *w = nm_gguf_writer_new();
    if (!w) return;
    for (uint64_t i = 0; i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        if (!c_name(kv->key, name, sizeof name)) goto done;
        require(nm_gguf_writer_set_value(w, name, &kv->value) == NM_OK);
    }
    for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        if (!c_name(t->name, name, sizeof name)) goto done;
        require(nm_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data,
                                          t->n_bytes) == NM_OK);
    }
    uint8_t *bytes;
    size_t n_bytes;
    nm_error err;
    require(nm_gguf_writer_to_memory(w, &bytes, &n_bytes, &err) == NM_OK);
    nm_gguf *copy = NULL;
    require(nm_gguf_open_memory(bytes, n_bytes, &copy, &err) == NM_OK);
    require(nm_gguf_n_kv(copy) == nm_gguf_n_kv(g));
    require(nm_gguf_n_tensors(copy) == nm_gguf_n_tensors(g));
    require(nm_gguf_alignment(copy) == nm_gguf_alignment(g));
    nm_gguf_close(copy);
    nm_free(bytes);
done:
    nm_gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nm_gguf *g = NULL;
    nm_error err = {.status = NM_OK, .msg = ""};
    nm_status st = nm_gguf_open_memory(data, size, &g, &err);
    if (st != NM_OK) {
        require(g == NULL && err.status == st && err.msg[0] != '\0');
        return 0;
    }
    require(nm_gguf_file_bytes(g) == size);
    volatile uint64_t sum = walk(g, data, size);
    (void)sum;
    copy_through_writer(g);
    nm_gguf_close(g);
    return 0;
}
