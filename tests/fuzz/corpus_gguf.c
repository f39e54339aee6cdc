/* Writes the seed corpus of fuzz_gguf into the folder given as argument:
 * a few small GGUF files that between them hold every value type, nested
 * arrays, string arrays, several tensor types and a custom alignment, so the
 * fuzzer starts from inputs that reach deep into the reader. */
#include "base/base.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

#include <stdio.h>
#include <string.h>

static int save(nm_gguf_writer *w, const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    nm_error err;
    int ok = w && nm_gguf_writer_write_file(w, path, &err) == NM_OK;
    if (w && !ok) fprintf(stderr, "corpus_gguf: %s\n", err.msg);
    nm_gguf_writer_free(w);
    return ok;
}

static size_t elem_bytes(nm_gguf_type t) {
    switch (t) {
    case NM_GGUF_UINT8:
    case NM_GGUF_INT8:
    case NM_GGUF_BOOL:
        return 1;
    case NM_GGUF_UINT16:
    case NM_GGUF_INT16:
        return 2;
    case NM_GGUF_UINT32:
    case NM_GGUF_INT32:
    case NM_GGUF_FLOAT32:
        return 4;
    default:
        return 8;
    }
}

/* Every scalar type, arrays of each, strings and arrays of arrays. */
static nm_gguf_writer *all_values(void) {
    nm_gguf_writer *w = nm_gguf_writer_new();
    if (!w) return NULL;
    const nm_gguf_value scalars[] = {
        {.type = NM_GGUF_UINT8, .v.u64 = 200},   {.type = NM_GGUF_INT8, .v.i64 = -5},
        {.type = NM_GGUF_UINT16, .v.u64 = 9},    {.type = NM_GGUF_INT16, .v.i64 = -9},
        {.type = NM_GGUF_UINT32, .v.u64 = 7},    {.type = NM_GGUF_INT32, .v.i64 = -7},
        {.type = NM_GGUF_FLOAT32, .v.f64 = 0.5}, {.type = NM_GGUF_BOOL, .v.b = true},
        {.type = NM_GGUF_UINT64, .v.u64 = 1},    {.type = NM_GGUF_INT64, .v.i64 = -1},
        {.type = NM_GGUF_FLOAT64, .v.f64 = 2.5},
    };
    char key[32];
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        snprintf(key, sizeof key, "s.%s", nm_gguf_type_name(scalars[i].type));
        nm_gguf_writer_set_value(w, key, &scalars[i]);
        const uint8_t raw[16] = {1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0};
        snprintf(key, sizeof key, "a.%s", nm_gguf_type_name(scalars[i].type));
        nm_gguf_writer_set_arr(w, key, scalars[i].type, raw, 16 / elem_bytes(scalars[i].type));
    }
    nm_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    const char *strs[] = {"a", "bc", "", "\xc4\xa0"};
    nm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, 4);
    const int32_t in0[] = {1, 2};
    const nm_gguf_str in1[] = {{"x", 1}};
    const nm_gguf_value inner[] = {
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_INT32, 2, in0}},
        {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_STRING, 1, in1}},
    };
    const nm_gguf_value nest = {.type = NM_GGUF_ARRAY, .v.arr = {NM_GGUF_ARRAY, 2, inner}};
    nm_gguf_writer_set_value(w, "n.nest", &nest);
    return w;
}

/* Tensors of several types; alignment 0 keeps the default. */
static nm_gguf_writer *tensors(uint32_t alignment) {
    nm_gguf_writer *w = nm_gguf_writer_new();
    if (!w) return NULL;
    if (alignment) nm_gguf_writer_set_u32(w, "general.alignment", alignment);
    static uint8_t data[1024]; /* zero; contents do not matter to the reader */
    const int64_t ne_f32[] = {4, 3}, ne_f16[] = {8}, ne_q8[] = {32, 2, 2}, ne_q4k[] = {256},
                  ne_bf16[] = {2, 1, 1, 2};
    nm_gguf_writer_add_tensor(w, "a.f32", NM_DTYPE_F32, 2, ne_f32, data, 48);
    nm_gguf_writer_add_tensor(w, "b.f16", NM_DTYPE_F16, 1, ne_f16, data, 16);
    nm_gguf_writer_add_tensor(w, "c.q8_0", NM_DTYPE_Q8_0, 3, ne_q8, data, 4 * 34);
    nm_gguf_writer_add_tensor(w, "d.q4_K", NM_DTYPE_Q4_K, 1, ne_q4k, data, 144);
    nm_gguf_writer_add_tensor(w, "e.bf16", NM_DTYPE_BF16, 4, ne_bf16, data, 8);
    return w;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 1;
    }
    int ok = save(all_values(), argv[1], "values.gguf");
    ok &= save(tensors(0), argv[1], "tensors.gguf");
    ok &= save(tensors(64), argv[1], "tensors-align64.gguf");
    ok &= save(nm_gguf_writer_new(), argv[1], "empty.gguf");
    return ok ? 0 : 1;
}
