/* Loading a model: open and validate the GGUF, pick the adapter for
 * general.architecture, read the vocabulary, and the helpers adapters use to
 * fetch hyperparameters and weights with their shapes checked. */
#include "model.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const nm_arch *const arch_table[] = {&nm_arch_qwen3moe, &nm_arch_olmoe,    &nm_arch_llama,
                                            &nm_arch_phimoe,   &nm_arch_qwen2moe, &nm_arch_deepseek2,
                                            &nm_arch_gptoss};

nm_model_params nm_model_default_params(void) {
    nm_model_params p = {.verbose = false, .compat = NM_COMPAT_NONE, .no_repack = false};
    return p;
}

nm_status nm_compat_parse(const char *name, nm_compat *out, nm_error *err) {
    if (name && strcmp(name, "none") == 0)
        *out = NM_COMPAT_NONE;
    else if (name && strcmp(name, "llama.cpp") == 0)
        *out = NM_COMPAT_LLAMA_CPP;
    else
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown compat '%s' (known: none, llama.cpp)",
                         name ? name : "(null)");
    return NM_OK;
}

nm_status nm_model_hparam_i32(const nm_model *m, const char *suffix, bool required, int32_t *out,
                              nm_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    if (!required && !nm_gguf_find(m->gguf, key)) return NM_OK;
    int32_t v;
    nm_status st = nm_gguf_get_i32(m->gguf, key, &v, err);
    if (st != NM_OK) return st;
    *out = v;
    return NM_OK;
}

nm_status nm_model_hparam_f32(const nm_model *m, const char *suffix, bool required, float *out,
                              nm_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    if (!required && !nm_gguf_find(m->gguf, key)) return NM_OK;
    return nm_gguf_get_f32(m->gguf, key, out, err);
}

static void format_ne(const int64_t *ne, uint32_t n_dims, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "{");
    for (uint32_t i = 0; i < n_dims && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, i ? ", " : "", ne[i]);
    if (used < cap) snprintf(buf + used, cap - used, "}");
}

/* Looks a tensor up and checks its dims against want (ggml order). */
static nm_status find_shaped(const nm_model *m, const char *name, const int64_t *want,
                             uint32_t n_want, const nm_gguf_tensor **out, nm_error *err) {
    const nm_gguf_tensor *t = nm_gguf_find_tensor(m->gguf, name);
    *out = t;
    if (!t) return nm_errorf(err, NM_ERR_NOT_FOUND, "tensor '%s' is missing", name);
    bool ok = true; /* trailing dims of 1 may be written or not */
    for (uint32_t i = 0; i < 4 && ok; i++)
        ok = t->ne[i] == (i < n_want ? want[i] : 1);
    if (!ok) {
        char have[96], expect[96];
        format_ne(t->ne, t->n_dims, have, sizeof have);
        format_ne(want, n_want, expect, sizeof expect);
        return nm_errorf(err, NM_ERR_FORMAT, "tensor '%s' has shape %s, expected %s", name, have,
                         expect);
    }
    return NM_OK;
}

static nm_status check_computable(const nm_gguf_tensor *t, const char *name, nm_error *err) {
    if (!nm_dtype_is_supported(t->type))
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "tensor '%s' has type %s, which npumoe cannot compute with yet "
                         "(supported: f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K, mxfp4)",
                         name, nm_dtype_name(t->type));
    return NM_OK;
}

nm_status nm_model_get_mat(const nm_model *m, const char *name, int64_t k, int64_t n, bool optional,
                           nm_mat *out, nm_error *err) {
    memset(out, 0, sizeof *out);
    if (optional && !nm_gguf_find_tensor(m->gguf, name)) return NM_OK;
    const int64_t want[2] = {k, n};
    const nm_gguf_tensor *t;
    nm_status st = find_shaped(m, name, want, 2, &t, err);
    if (st == NM_OK) st = check_computable(t, name, err);
    if (st != NM_OK) return st;
    out->data = t->data;
    out->type = t->type;
    out->n = n;
    out->k = k;
    out->row_bytes = (size_t)(t->n_bytes / (uint64_t)n);
    return NM_OK;
}

nm_status nm_model_get_vec(const nm_model *m, const char *name, int64_t n, const float **out,
                           nm_error *err) {
    return nm_model_get_rows(m, name, n, 1, out, err);
}

nm_status nm_model_get_rows(const nm_model *m, const char *name, int64_t n, int64_t rows,
                            const float **out, nm_error *err) {
    const int64_t want[2] = {n, rows};
    const nm_gguf_tensor *t;
    nm_status st = find_shaped(m, name, want, rows > 1 ? 2 : 1, &t, err);
    if (st != NM_OK) return st;
    if (t->type != NM_DTYPE_F32)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "tensor '%s' has type %s; vectors (norms, biases, sinks) must be f32",
                         name, nm_dtype_name(t->type));
    *out = t->data;
    return NM_OK;
}

nm_status nm_model_get_vec_opt(const nm_model *m, const char *name, int64_t n, const float **out,
                               nm_error *err) {
    *out = NULL;
    if (!nm_gguf_find_tensor(m->gguf, name)) return NM_OK;
    return nm_model_get_vec(m, name, n, out, err);
}

nm_status nm_model_get_stack(const nm_model *m, const char *name, int64_t k, int64_t n,
                             int64_t n_expert, nm_mat *first, size_t *stride, nm_error *err) {
    const int64_t want[3] = {k, n, n_expert};
    const nm_gguf_tensor *t;
    nm_status st = find_shaped(m, name, want, 3, &t, err);
    if (st == NM_OK) st = check_computable(t, name, err);
    if (st != NM_OK) return st;
    *stride = (size_t)(t->n_bytes / (uint64_t)n_expert);
    first->data = t->data;
    first->type = t->type;
    first->n = n;
    first->k = k;
    first->row_bytes = *stride / (size_t)n;
    return NM_OK;
}

/* ---- weights prepared for the kernels ---- */

static void release_pages(void *ctx, const void *data, size_t n_bytes) {
    nm_gguf_drop_pages(ctx, data, n_bytes);
}

/* Every matrix the forward pass multiplies with, handed to the kernels,
 * which copy those they want in a layout of their own or in anonymous
 * memory (huge pages); not token_embd,
 * which is also read by rows (an output tied to it stays as it is). */
static nm_status prepare_weights(nm_model *m, nm_error *err) {
    /* not wkv_b (MLA): mla.c reads its rows as the file lays them out */
    enum { PER_LAYER = 18 };
    const size_t cap = (size_t)m->hp.n_layer * PER_LAYER + 1;
    nm_prepare_item *items = nm_malloc(cap * sizeof *items);
    if (!items) return nm_errorf(err, NM_ERR_NOMEM, "out of memory listing the weights");
    size_t n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        nm_layer *l = &m->layers[il];
        nm_expert_weights *x = &l->experts;
        const nm_prepare_item layer[PER_LAYER] = {
            {&l->wq, 0, 1},
            {&l->wk, 0, 1},
            {&l->wv, 0, 1},
            {&l->wo, 0, 1},
            {&l->router, 0, 1},
            {&x->gate, x->gate_stride, x->n_expert},
            {&x->up, x->up_stride, x->n_expert},
            {&x->down, x->down_stride, x->n_expert},
            {&l->shexp_gate_inp, 0, 1},
            {&l->shexp_gate, 0, 1},
            {&l->shexp_up, 0, 1},
            {&l->shexp_down, 0, 1},
            {&l->wq_a, 0, 1},
            {&l->wq_b, 0, 1},
            {&l->wkv_a, 0, 1},
            {&l->ffn_gate, 0, 1},
            {&l->ffn_up, 0, 1},
            {&l->ffn_down, 0, 1},
        };
        for (int i = 0; i < PER_LAYER; i++)
            if (layer[i].mat->data && layer[i].mat->n > 0) /* absent ones: no */
                items[n++] = layer[i];
    }
    if (!m->tied_output) items[n++] = (nm_prepare_item){&m->output, 0, 1};
    nm_status st =
        nm_kernels_prepare(items, n, nm_mem_available(), release_pages, m->gguf, &m->prepared, err);
    nm_free(items);
    return st;
}

void nm_model_free(nm_model *model) {
    if (!model) return;
    nm_prepared_free(&model->prepared);
    nm_free(model->mla_k_t);
    nm_tokenizer_free(model->tok);
    nm_free(model->layers);
    nm_gguf_close(model->gguf);
    nm_free(model);
}

static nm_status load_into(nm_model *m, const char *path, bool repack, bool vocab_only,
                           nm_error *err) {
    nm_status st = nm_gguf_open(path, &m->gguf, err);
    if (st != NM_OK) return st;
    nm_gguf_str arch;
    st = nm_gguf_get_str(m->gguf, "general.architecture", &arch, err);
    if (st != NM_OK) return st;
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (nm_gguf_str_eq(arch, arch_table[i]->name)) m->arch = arch_table[i];
    if (!m->arch)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "architecture '%.*s' is not supported (supported: qwen3moe, qwen2moe, "
                         "olmoe, llama with experts (Mixtral), phimoe, deepseek2)",
                         (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    st = nm_tokenizer_load(m->gguf, &m->tok, err);
    if (st != NM_OK) return st;
    if (vocab_only) {
        m->vocab_only = true;
        m->hp.n_vocab = nm_tokenizer_n_vocab(m->tok);
        /* the trained context when the file says it, else 0 (unknown) */
        return nm_model_hparam_i32(m, "context_length", false, &m->hp.n_ctx_train, err);
    }
    if (nm_gguf_n_tensors(m->gguf) == 0)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "the file has no tensors (token_embd.weight and the rest): a "
                         "vocabulary-only file, which only tokenize and info read");
    st = m->arch->load(m, err);
    if (st != NM_OK) return st;
    if (repack && (st = prepare_weights(m, err)) != NM_OK) return st;
    NM_ASSERT(m->route != NULL);
    if (nm_tokenizer_n_vocab(m->tok) != m->hp.n_vocab)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "the vocabulary has %d tokens but token_embd.weight has %d rows",
                         nm_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
    return NM_OK;
}

nm_status nm_model_load(const char *path, const nm_model_params *params, nm_model **out,
                        nm_error *err) {
    *out = NULL;
    if (!path) return nm_errorf(err, NM_ERR_INVALID_ARG, "no model path given");
    nm_model *m = nm_calloc(1, sizeof *m);
    if (!m) return nm_errorf(err, NM_ERR_NOMEM, "out of memory loading '%s'", path);
    m->compat = params ? params->compat : NM_COMPAT_NONE;
    if (m->compat != NM_COMPAT_NONE && m->compat != NM_COMPAT_LLAMA_CPP) {
        nm_free(m);
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown compat value %d", (int)m->compat);
    }
    nm_status st =
        load_into(m, path, !(params && params->no_repack), params && params->vocab_only, err);
    if (st != NM_OK) {
        /* the reader already names the path; everything else gets it here */
        if (m->gguf) nm_error_prefix(err, "%s", path);
        nm_model_free(m);
        return st;
    }
    *out = m;
    return NM_OK;
}

void nm_model_get_info(const nm_model *model, nm_model_info *out) {
    const nm_hparams *hp = &model->hp;
    memset(out, 0, sizeof *out);
    out->arch = model->arch->name;
    out->n_vocab = hp->n_vocab;
    out->n_ctx_train = hp->n_ctx_train;
    out->n_layer = hp->n_layer;
    out->n_embd = hp->n_embd;
    out->n_expert = hp->n_expert;
    out->n_expert_used = hp->n_expert_used;
    out->bos_id = nm_tokenizer_bos(model->tok);
    out->eos_id = nm_tokenizer_eos(model->tok);
    out->add_bos = nm_tokenizer_add_bos(model->tok);
    for (uint64_t i = 0; i < nm_gguf_n_tensors(model->gguf); i++)
        out->weight_bytes += nm_gguf_tensor_at(model->gguf, i)->n_bytes;
    out->repacked_bytes = model->prepared.bytes;
    out->vocab_only = model->vocab_only;
}

void nm_model_describe(const nm_model *model, void *file) {
    FILE *f = file;
    const nm_hparams *hp = &model->hp;
    nm_gguf_str name = {"", 0};
    if (nm_gguf_get_str(model->gguf, "general.name", &name, NULL) != NM_OK) name.len = 0;
    fprintf(f, "architecture:        %s\n", model->arch->name);
    fprintf(f, "name:                %.*s\n", (int)(name.len > 200 ? 200 : name.len), name.ptr);
    fprintf(f, "gguf version:        %u\n", nm_gguf_version(model->gguf));
    fprintf(f, "vocabulary:          %d tokens (bos %d, eos %d, add_bos %s)\n", hp->n_vocab,
            nm_tokenizer_bos(model->tok), nm_tokenizer_eos(model->tok),
            nm_tokenizer_add_bos(model->tok) ? "yes" : "no");
    fprintf(f, "context (trained):   %d\n", hp->n_ctx_train);
    if (model->vocab_only) {
        fprintf(f,
                "weights:             none read (vocabulary only; the file has %" PRIu64
                " tensors)\n",
                nm_gguf_n_tensors(model->gguf));
        return;
    }
    fprintf(f, "layers:              %d\n", hp->n_layer);
    fprintf(f, "d_model:             %d\n", hp->n_embd);
    fprintf(f, "attention heads:     %d query, %d key/value, head_dim %d\n", hp->n_head,
            hp->n_head_kv, hp->head_dim);
    fprintf(f, "experts:             %d, %d active per token, expert d_ff %d\n", hp->n_expert,
            hp->n_expert_used, hp->n_ff_exp);
    if (hp->n_ff_shexp > 0)
        fprintf(f, "shared expert:       d_ff %d, %s, on every token\n", hp->n_ff_shexp,
                hp->shexp_ungated ? "ungated" : "sigmoid-gated");
    if (hp->n_lora_kv > 0)
        fprintf(f,
                "latent attention:    kv_lora_rank %d, q_lora_rank %d, nope %d + rope %d, v %d; "
                "cache %lld floats per position\n",
                hp->n_lora_kv, hp->n_lora_q, hp->n_nope, hp->n_rot, hp->n_v_head,
                (long long)nm_model_kv_k_dim(hp));
    if (hp->n_layer_dense_lead > 0)
        fprintf(f, "dense layers:        0..%d, SwiGLU d_ff %d (no experts)\n",
                hp->n_layer_dense_lead - 1, hp->n_ff);
    if (hp->n_group > 1)
        fprintf(f, "routing:             group-limited, %d of %d groups\n", hp->n_group_used,
                hp->n_group);
    if (hp->attn_scale != 0.0f)
        fprintf(f, "q.k scale:           %g\n", (double)hp->attn_scale);
    fprintf(f, "rope:                %s, base %g, %d dims%s, attn factor %g\n",
            hp->rope == NM_ROPE_NEOX ? "neox" : "norm", hp->rope_freq_base, hp->n_rot,
            model->rope_factors_short ? ", long/short factors" : "", hp->rope_attn_factor);
    if (hp->rope_scaled)
        fprintf(f, "rope scaling:        %s, factor %g over %d positions\n",
                hp->rope_yarn.ext_factor != 0.0f ? "yarn" : "linear",
                1.0 / (double)hp->rope_yarn.freq_scale, hp->n_ctx_orig);
    if (hp->n_swa > 0)
        fprintf(f, "attention:           sinks, a window of %d keys on even layers\n", hp->n_swa);
    fprintf(f, "norm:                %s, eps %g\n", hp->norm == NM_NORM_RMS ? "rms" : "layer",
            hp->rms_eps);
    fprintf(f, "semantics:           %s\n",
            model->compat == NM_COMPAT_LLAMA_CPP ? "llama.cpp compat" : "as trained");
    fprintf(f, "output:              %s\n",
            model->tied_output ? "tied to token_embd" : "own tensor");
    const nm_prepared *prep = &model->prepared;
    if (prep->n_tensors) {
        fprintf(f, "repacked:            %d tensors, %.2f MiB, for the %s kernels", prep->n_tensors,
                (double)prep->bytes / 1048576.0, nm_kernels_isa_name(prep->isa));
        if (prep->n_as_is)
            fprintf(f, " (%d of them in the file's layout, for the huge pages)", prep->n_as_is);
    } else {
        fprintf(f, "repacked:            none");
    }
    if (prep->unfit_bytes)
        fprintf(f, "; %.2f MiB more wanted, over the memory available: read from the file",
                (double)prep->unfit_bytes / 1048576.0);
    fputc('\n', f);

    uint64_t bytes_by_type[NM_DTYPE_COUNT] = {0}, count_by_type[NM_DTYPE_COUNT] = {0}, total = 0;
    const uint64_t n_tensors = nm_gguf_n_tensors(model->gguf);
    for (uint64_t i = 0; i < n_tensors; i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(model->gguf, i);
        bytes_by_type[t->type] += t->n_bytes;
        count_by_type[t->type]++;
        total += t->n_bytes;
    }
    fprintf(f, "tensors:             %" PRIu64 ", %.2f MiB\n", n_tensors,
            (double)total / 1048576.0);
    for (int ty = 0; ty < NM_DTYPE_COUNT; ty++)
        if (count_by_type[ty])
            fprintf(f, "  %-6s %5" PRIu64 " tensors, %10.2f MiB\n", nm_dtype_name((uint32_t)ty),
                    count_by_type[ty], (double)bytes_by_type[ty] / 1048576.0);
    for (uint64_t i = 0; i < n_tensors; i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(model->gguf, i);
        char shape[96];
        format_ne(t->ne, t->n_dims, shape, sizeof shape);
        fprintf(f, "  %-40.*s %-6s %-24s %12" PRIu64 " bytes\n",
                (int)(t->name.len > 64 ? 64 : t->name.len), t->name.ptr, nm_dtype_name(t->type),
                shape, t->n_bytes);
    }
}
