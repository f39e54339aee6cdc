/* Files the new adapters must refuse, each with a message naming what is
 * wrong: copies of the tiny models with one key changed or one tensor
 * removed or added (a dense llama, GQA in olmoe, a missing phimoe bias, half
 * of the RoPE factors, fused q/k/v, the old per-expert Mixtral layout, a
 * bad attention factor, weights of a type npumoe cannot compute with,
 * qwen2moe without a shared-expert tensor or a v bias, or with a shared
 * width that is 0 or not the tensors'; gpt-oss without its window, sinks,
 * router or expert bias or FFN norm, with a window of 0, an unknown or
 * non-string RoPE scaling type, a NaN scaling factor, or F16 sinks). The
 * copies are written to the build folder. */
#include "harness.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "npumoe.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One change to a file: a key to replace (or drop when value is NULL), a
 * tensor to drop, a tensor to add (a copy of an existing one). */
typedef struct change {
    const char *key;
    const nm_gguf_value *value;
    const char *drop_tensor;
    const char *add_tensor; /* new name */
    const char *add_from;   /* copied from */
    const char *retype;     /* a tensor stored as retype_to instead (zero bytes) */
    uint32_t retype_to;
} change;

static void copy_cstr(nm_gguf_str s, char *buf, size_t cap) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = '\0';
}

static bool write_copy(const char *src, const change *c, const char *dst) {
    nm_gguf *g = NULL;
    nm_error err = {0};
    if (nm_gguf_open(src, &g, &err) != NM_OK) return false;
    nm_gguf_writer *w = nm_gguf_writer_new();
    bool ok = w != NULL;
    char name[256];
    for (uint64_t i = 0; ok && i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        copy_cstr(kv->key, name, sizeof name);
        if (c->key && strcmp(name, c->key) == 0) continue;
        ok = nm_gguf_writer_set_value(w, name, &kv->value) == NM_OK;
    }
    if (ok && c->key && c->value) ok = nm_gguf_writer_set_value(w, c->key, c->value) == NM_OK;
    for (uint64_t i = 0; ok && i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        copy_cstr(t->name, name, sizeof name);
        if (c->drop_tensor && strcmp(name, c->drop_tensor) == 0) continue;
        if (c->retype && strcmp(name, c->retype) == 0) {
            size_t row_bytes = 0;
            ok = nm_dtype_row_bytes(c->retype_to, t->ne[0], &row_bytes);
            const size_t n_bytes = row_bytes * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
            void *zeros = ok ? calloc(1, n_bytes) : NULL;
            ok = zeros && nm_gguf_writer_add_tensor(w, name, c->retype_to, t->n_dims, t->ne, zeros,
                                                    n_bytes) == NM_OK;
            free(zeros);
            continue;
        }
        ok = nm_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->n_bytes) ==
             NM_OK;
        if (ok && c->add_tensor && strcmp(name, c->add_from) == 0)
            ok = nm_gguf_writer_add_tensor(w, c->add_tensor, t->type, t->n_dims, t->ne, t->data,
                                           t->n_bytes) == NM_OK;
    }
    if (ok) ok = nm_gguf_writer_write_file(w, dst, &err) == NM_OK;
    if (!ok) fprintf(stderr, "copy of %s: %s\n", src, err.msg);
    nm_gguf_writer_free(w);
    nm_gguf_close(g);
    return ok;
}

static void expect_refused(const char *model, const change *c, nm_status want, const char *needle,
                           const char *what) {
    char src[1024], dst[1024];
    if (model[0] == '/') /* a folder of this repository's vectors */
        snprintf(src, sizeof src, "%s/model.gguf", model);
    else
        snprintf(src, sizeof src, "%s/%s/model.gguf", NM_VECTORS_DIR, model);
    snprintf(dst, sizeof dst, "%s/test_arch_files.gguf", NM_BUILD_DIR);
    CHECK(write_copy(src, c, dst));
    nm_model *m = NULL;
    nm_error err = {0};
    nm_status st = nm_model_load(dst, NULL, &m, &err);
    nm_test_checks++;
    if (st != want || !strstr(err.msg, needle)) {
        nm_test_failures++;
        fprintf(stderr, "%s: want %s with '%s', got %s: '%s'\n", what, nm_status_str(want), needle,
                nm_status_str(st), err.msg);
    } else {
        printf("%s: %s\n", what, err.msg);
    }
    nm_model_free(m);
    remove(dst);
}

int main(void) {
    nm_gguf_value u32 = {.type = NM_GGUF_UINT32};
    nm_gguf_value f32 = {.type = NM_GGUF_FLOAT32};

    u32.v.u64 = 0;
    expect_refused("tiny-mixtral", &(change){.key = "llama.expert_count", .value = &u32},
                   NM_ERR_UNSUPPORTED, "dense models", "llama without experts");
    u32.v.u64 = 2;
    expect_refused("tiny-olmoe", &(change){.key = "olmoe.attention.head_count_kv", .value = &u32},
                   NM_ERR_FORMAT, "key/value heads", "olmoe with GQA");
    expect_refused("tiny-phimoe", &(change){.drop_tensor = "blk.1.attn_q.bias"}, NM_ERR_NOT_FOUND,
                   "blk.1.attn_q.bias", "phimoe without a q bias");
    expect_refused("tiny-phimoe", &(change){.drop_tensor = "rope_factors_long.weight"},
                   NM_ERR_FORMAT, "rope_factors_long", "phimoe with short RoPE factors only");
    f32.v.f64 = -1.0;
    expect_refused("tiny-phimoe",
                   &(change){.key = "phimoe.rope.scaling.attn_factor", .value = &f32},
                   NM_ERR_FORMAT, "attn_factor", "phimoe with a negative attention factor");
    expect_refused(
        "tiny-mixtral",
        &(change){.add_tensor = "blk.0.attn_qkv.weight", .add_from = "blk.0.attn_q.weight"},
        NM_ERR_UNSUPPORTED, "fused", "llama with fused q/k/v");
    expect_refused(
        "tiny-mixtral",
        &(change){.add_tensor = "blk.0.ffn_gate.0.weight", .add_from = "blk.0.attn_q.weight"},
        NM_ERR_UNSUPPORTED, "reconvert", "Mixtral's old per-expert layout");
    expect_refused("tiny-olmoe", &(change){.drop_tensor = "blk.0.attn_k_norm.weight"},
                   NM_ERR_NOT_FOUND, "attn_k_norm", "olmoe without its k norm");
    /* weight types npumoe does not compute with: refused at load, naming
     * the tensor and the type */
    expect_refused("tiny-qwen3moe-q-Q4_K_M",
                   &(change){.retype = "blk.1.ffn_up_exps.weight", .retype_to = NM_DTYPE_Q2_K},
                   NM_ERR_UNSUPPORTED, "'blk.1.ffn_up_exps.weight' has type q2_K",
                   "q2_K expert weights");
    expect_refused("tiny-qwen3moe-q-Q4_K_M",
                   &(change){.retype = "blk.0.attn_q.weight", .retype_to = NM_DTYPE_IQ2_XXS},
                   NM_ERR_UNSUPPORTED, "'blk.0.attn_q.weight' has type iq2_xxs",
                   "iq2_xxs attention weights");
    const char *q2 = NM_SOURCE_DIR "/tests/vectors/tiny-qwen2moe";
    expect_refused(q2, &(change){.drop_tensor = "blk.1.ffn_up_shexp.weight"}, NM_ERR_NOT_FOUND,
                   "blk.1.ffn_up_shexp.weight", "qwen2moe without a shared expert's up matrix");
    expect_refused(q2, &(change){.drop_tensor = "blk.2.ffn_gate_inp_shexp.weight"},
                   NM_ERR_NOT_FOUND, "ffn_gate_inp_shexp", "qwen2moe without the shared gate");
    expect_refused(q2, &(change){.drop_tensor = "blk.0.attn_v.bias"}, NM_ERR_NOT_FOUND,
                   "blk.0.attn_v.bias", "qwen2moe without a v bias");
    u32.v.u64 = 0;
    expect_refused(q2,
                   &(change){.key = "qwen2moe.expert_shared_feed_forward_length", .value = &u32},
                   NM_ERR_FORMAT, "expert_shared_feed_forward_length", "qwen2moe shared width 0");
    u32.v.u64 = 40;
    expect_refused(q2,
                   &(change){.key = "qwen2moe.expert_shared_feed_forward_length", .value = &u32},
                   NM_ERR_FORMAT, "ffn_gate_shexp.weight' has shape",
                   "qwen2moe shared width unlike its tensors");
    /* without the key, the shared width is feed_forward_length (48 here) */
    expect_refused(q2, &(change){.key = "qwen2moe.expert_shared_feed_forward_length"},
                   NM_ERR_FORMAT, "expected {16, 48}", "qwen2moe without the shared width key");
    const char *go = NM_SOURCE_DIR "/tests/vectors/tiny-gptoss";
    expect_refused(go, &(change){.key = "gpt-oss.attention.sliding_window"}, NM_ERR_NOT_FOUND,
                   "sliding_window", "gpt-oss without its window");
    u32.v.u64 = 0;
    expect_refused(go, &(change){.key = "gpt-oss.attention.sliding_window", .value = &u32},
                   NM_ERR_FORMAT, "sliding_window = 0", "gpt-oss with a window of 0");
    expect_refused(go, &(change){.drop_tensor = "blk.2.attn_sinks.weight"}, NM_ERR_NOT_FOUND,
                   "blk.2.attn_sinks.weight", "gpt-oss without sinks");
    expect_refused(go, &(change){.drop_tensor = "blk.1.ffn_gate_inp.bias"}, NM_ERR_NOT_FOUND,
                   "blk.1.ffn_gate_inp.bias", "gpt-oss without a router bias");
    expect_refused(go, &(change){.drop_tensor = "blk.0.ffn_down_exps.bias"}, NM_ERR_NOT_FOUND,
                   "blk.0.ffn_down_exps.bias", "gpt-oss without a down bias");
    expect_refused(go, &(change){.drop_tensor = "blk.0.post_attention_norm.weight"},
                   NM_ERR_NOT_FOUND, "post_attention_norm", "gpt-oss without its ffn norm");
    const nm_gguf_value rope_type = {.type = NM_GGUF_STRING, .v.str = {"ntk", 3}};
    expect_refused(go, &(change){.key = "gpt-oss.rope.scaling.type", .value = &rope_type},
                   NM_ERR_UNSUPPORTED, "'ntk'", "gpt-oss with an unknown rope scaling");
    expect_refused(go, &(change){.key = "gpt-oss.rope.scaling.type", .value = &u32}, NM_ERR_FORMAT,
                   "rope.scaling.type", "gpt-oss with a numeric rope scaling type");
    f32.v.f64 = NAN;
    expect_refused(go, &(change){.key = "gpt-oss.rope.scaling.factor", .value = &f32},
                   NM_ERR_FORMAT, "rope.scaling.factor", "gpt-oss with a NaN scaling factor");
    expect_refused(go, &(change){.retype = "blk.0.attn_sinks.weight", .retype_to = NM_DTYPE_F16},
                   NM_ERR_UNSUPPORTED, "attn_sinks.weight' has type f16", "gpt-oss with F16 sinks");
    return nm_test_finish("test_arch_files");
}
