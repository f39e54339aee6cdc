/* The model fingerprint (model.h): a digest of the file's architecture,
 * MoE shape, tensor table and a sample of its weights, which the
 * calibration and plan files carry to refuse another model's. */
#include "model.h"

#include "base/base.h"

#include <stdio.h>
#include <string.h>

typedef struct fnv {
    uint64_t h;
} fnv;

static void fnv_bytes(fnv *f, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        f->h ^= p[i];
        f->h *= 0x100000001b3ull;
    }
}

/* Little-endian whatever the host, so a fingerprint means the same
 * everywhere. */
static void fnv_u64(fnv *f, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    fnv_bytes(f, b, sizeof b);
}

/* Length first, so ("ab", "c") and ("a", "bc") differ. */
static void fnv_str(fnv *f, const char *s, size_t n) {
    fnv_u64(f, n);
    fnv_bytes(f, s, n);
}

/* Bytes of a tensor's data in the digest: all of a router (a plan's loads
 * follow its every row, and it is small: n_expert x d_model per layer),
 * else SAMPLES pieces of SAMPLE_BYTES spread from the first byte to the last
 * (the whole tensor when it is smaller), so two trainings or two files of
 * the same shape differ while the cost stays a few pages per tensor. */
enum { SAMPLES = 16, SAMPLE_BYTES = 64 };

static bool is_router(const nm_gguf_str *name) {
    static const char key[] = "ffn_gate_inp.";
    const size_t n = sizeof key - 1;
    for (size_t i = 0; i + n <= (size_t)name->len; i++)
        if (memcmp(name->ptr + i, key, n) == 0) return true;
    return false;
}

static void fnv_tensor_data(fnv *f, const nm_gguf_tensor *t) {
    const unsigned char *p = t->data;
    if (is_router(&t->name) || t->n_bytes <= (uint64_t)SAMPLES * SAMPLE_BYTES) {
        fnv_bytes(f, p, (size_t)t->n_bytes);
        return;
    }
    const uint64_t span = t->n_bytes - SAMPLE_BYTES;
    for (uint64_t i = 0; i < SAMPLES; i++)
        fnv_bytes(f, p + span * i / (SAMPLES - 1), SAMPLE_BYTES);
}

void nm_model_fingerprint(const nm_model *model, nm_fingerprint *out) {
    NM_ASSERT(model && out);
    fnv f = {0xcbf29ce484222325ull};
    static const char tag[] = "npumoe-fingerprint-2";
    fnv_str(&f, tag, sizeof tag - 1);
    fnv_str(&f, model->arch->name, strlen(model->arch->name));
    const nm_hparams *hp = &model->hp;
    const int32_t shape[] = {hp->n_layer, hp->n_embd, hp->n_expert, hp->n_expert_used,
                             hp->n_ff_exp};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        fnv_u64(&f, (uint64_t)shape[i]);
    const uint64_t n_tensors = nm_gguf_n_tensors(model->gguf);
    fnv_u64(&f, n_tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(model->gguf, i);
        fnv_str(&f, t->name.ptr, (size_t)t->name.len);
        fnv_u64(&f, t->type);
        fnv_u64(&f, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            fnv_u64(&f, (uint64_t)t->ne[d]);
        fnv_tensor_data(&f, t);
    }
    snprintf(out->hex, sizeof out->hex, "%016llx", (unsigned long long)f.h);
}
