/* The model fingerprint, and the plumbing all three plan files share: the
 * header check, atomic saving, and reading a file or memory into a tree
 * with the file named in every message. */
#include "plan-impl.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- fingerprint ---- */

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

bool nm_fingerprint_parse(const char *text, nm_fingerprint *out) {
    if (strlen(text) != 16) return false;
    for (int i = 0; i < 16; i++)
        if (!((text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f')))
            return false;
    memcpy(out->hex, text, 17);
    return true;
}

nm_status nm_plan_json_fingerprint(const nm_json *obj, nm_fingerprint *out, nm_error *err) {
    const char *s;
    nm_status st = nm_json_get_str(obj, "fingerprint", &s, NULL, err);
    if (st != NM_OK) return st;
    if (!nm_fingerprint_parse(s, out))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "fingerprint: expected 16 lowercase hex digits, got \"%.40s\"", s);
    return NM_OK;
}

/* ---- files ---- */

nm_status nm_plan_json_header(const nm_json *root, const char *format, int32_t version,
                              const char *older, nm_error *err) {
    if (nm_json_type_of(root) != NM_JSON_OBJECT)
        return nm_errorf(err, NM_ERR_FORMAT, "expected a %s object, got %s", format,
                         nm_json_type_name(nm_json_type_of(root)));
    const char *got;
    nm_status st = nm_json_get_str(root, "format", &got, NULL, err);
    if (st != NM_OK) return st;
    if (strcmp(got, format) != 0)
        return nm_errorf(err, NM_ERR_FORMAT, "format is \"%.40s\": this is not a %s file", got,
                         format);
    int64_t v;
    st = nm_json_get_int(root, "version", 0, INT32_MAX, &v, NULL, err);
    if (st != NM_OK) return st;
    if (v < version)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s version %lld was written by an older npumoe (this one reads version "
                         "%d): %s",
                         format, (long long)v, version, older);
    if (v != version)
        return nm_errorf(err, NM_ERR_UNSUPPORTED, "%s version %lld is not supported (only %d)",
                         format, (long long)v, version);
    return NM_OK;
}

nm_status nm_plan_save_text(const char *path, nm_status st, char *text, size_t n_bytes,
                            nm_error *err) {
    if (st == NM_OK) {
        st = nm_json_write_file(path, text, n_bytes, err); /* names the path itself */
    } else {
        nm_error_prefix(err, "%s", path);
    }
    nm_free(text);
    return st;
}

static nm_status run_reader(nm_json *root, nm_plan_reader read, void *ctx, const char *name,
                            nm_error *err) {
    nm_status st = read(root, ctx, err);
    nm_json_free(root);
    if (st != NM_OK) nm_error_prefix(err, "%s", name);
    return st;
}

nm_status nm_plan_read_file(const char *path, nm_plan_reader read, void *ctx, nm_error *err) {
    nm_json *root = NULL;
    nm_status st = nm_json_parse_file(path, &root, err); /* names the path itself */
    if (st != NM_OK) return st;
    return run_reader(root, read, ctx, path, err);
}

nm_status nm_plan_read_memory(const char *text, size_t n_bytes, const char *name,
                              nm_plan_reader read, void *ctx, nm_error *err) {
    const char *label = name && *name ? name : "<memory>";
    nm_json *root = NULL;
    nm_status st = nm_json_parse(text, n_bytes, &root, err);
    if (st != NM_OK) {
        nm_error_prefix(err, "%s", label);
        return st;
    }
    return run_reader(root, read, ctx, label, err);
}

bool nm_plan_close(double a, double b) {
    const double scale = fmax(1.0, fmax(fabs(a), fabs(b)));
    return fabs(a - b) <= 1e-6 * scale;
}
