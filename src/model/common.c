/* What the MoE architectures share when they load: the hyperparameter keys
 * every llama.cpp MoE file has, and the layer layout (attention, norms,
 * router, expert stacks) with the optional weights an adapter names.
 * Not here: anything one architecture alone does (arch/). */
#include "model.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>

nm_status nm_model_load_hparams(nm_model *m, nm_error *err) {
    nm_hparams *hp = &m->hp;
    const char *arch = m->arch->name;
    nm_status st;
    if ((st = nm_model_hparam_i32(m, "block_count", true, &hp->n_layer, err)) ||
        (st = nm_model_hparam_i32(m, "context_length", true, &hp->n_ctx_train, err)) ||
        (st = nm_model_hparam_i32(m, "embedding_length", true, &hp->n_embd, err)) ||
        (st = nm_model_hparam_i32(m, "attention.head_count", true, &hp->n_head, err)) ||
        (st = nm_model_hparam_i32(m, "attention.head_count_kv", true, &hp->n_head_kv, err)) ||
        (st = nm_model_hparam_f32(m, "attention.layer_norm_rms_epsilon", true, &hp->rms_eps, err)))
        return st;
    /* A llama file without experts is a dense model, not ours. */
    hp->n_expert = 0;
    if ((st = nm_model_hparam_i32(m, "expert_count", false, &hp->n_expert, err))) return st;
    if (hp->n_expert == 0)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s.expert_count is absent or 0: dense models are not supported", arch);
    if ((st = nm_model_hparam_i32(m, "expert_used_count", true, &hp->n_expert_used, err)))
        return st;
    /* qwen3moe writes the expert width apart; Mixtral, OLMoE and PhiMoE
     * have only experts, so feed_forward_length is theirs. */
    char key[128];
    snprintf(key, sizeof key, "%s.expert_feed_forward_length", arch);
    if ((st = nm_model_hparam_i32(
             m, nm_gguf_find(m->gguf, key) ? "expert_feed_forward_length" : "feed_forward_length",
             true, &hp->n_ff_exp, err)))
        return st;
    hp->rope_freq_base = 10000.0f;
    if ((st = nm_model_hparam_f32(m, "rope.freq_base", false, &hp->rope_freq_base, err))) return st;
    if (hp->n_head <= 0 || hp->n_embd <= 0) /* checked before the default head_dim divides */
        return nm_errorf(err, NM_ERR_FORMAT,
                         "head count %d and embedding length %d must be positive", hp->n_head,
                         hp->n_embd);
    hp->head_dim = hp->n_embd / hp->n_head;
    int32_t value_length = -1;
    if ((st = nm_model_hparam_i32(m, "attention.key_length", false, &hp->head_dim, err)) ||
        (st = nm_model_hparam_i32(m, "attention.value_length", false, &value_length, err)))
        return st;
    hp->n_v_head = value_length >= 0 ? value_length : hp->head_dim;
    if (value_length >= 0 && value_length != hp->head_dim && hp->n_lora_kv == 0)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "attention.key_length %d differs from attention.value_length %d",
                         hp->head_dim, value_length);
    hp->n_rot = hp->head_dim;
    if ((st = nm_model_hparam_i32(m, "rope.dimension_count", false, &hp->n_rot, err))) return st;
    if (hp->rope_attn_factor == 0.0f) hp->rope_attn_factor = 1.0f;
    hp->n_ctx_orig = hp->n_ctx_train;
    if ((st = nm_model_hparam_i32(m, "rope.scaling.original_context_length", false, &hp->n_ctx_orig,
                                  err)))
        return st;

    /* Reject what would make later arithmetic meaningless, naming the value. */
    struct {
        const char *what;
        int32_t v, lo, hi;
    } checks[] = {
        {"block_count", hp->n_layer, 1, 4096},
        {"embedding_length", hp->n_embd, 1, 1 << 20},
        {"attention.head_count", hp->n_head, 1, 4096},
        {"attention.head_count_kv", hp->n_head_kv, 1, hp->n_head},
        {"attention.key_length", hp->head_dim, 2, 8192},
        {"rope.dimension_count", hp->n_rot, 2, hp->head_dim},
        {"expert_count", hp->n_expert, 1, 1 << 16},
        {"expert_used_count", hp->n_expert_used, 1, hp->n_expert},
        {"expert_feed_forward_length", hp->n_ff_exp, 1, 1 << 20},
        {"context_length", hp->n_ctx_train, 1, 1 << 30},
        {"rope.scaling.original_context_length", hp->n_ctx_orig, 1, 1 << 30},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (checks[i].v < checks[i].lo || checks[i].v > checks[i].hi)
            return nm_errorf(err, NM_ERR_FORMAT, "%s.%s = %d is not in [%d, %d]", arch,
                             checks[i].what, checks[i].v, checks[i].lo, checks[i].hi);
    if (hp->n_head % hp->n_head_kv != 0)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "attention.head_count %d is not a multiple of head_count_kv %d",
                         hp->n_head, hp->n_head_kv);
    if (hp->n_rot % 2 != 0)
        return nm_errorf(err, NM_ERR_FORMAT, "rope.dimension_count %d is odd", hp->n_rot);
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return nm_errorf(err, NM_ERR_FORMAT, "layer_norm_rms_epsilon %g is not in (0, 1)",
                         (double)hp->rms_eps);
    if (!(hp->rope_freq_base > 0.0f && isfinite(hp->rope_freq_base)))
        return nm_errorf(err, NM_ERR_FORMAT, "rope.freq_base %g is not positive",
                         (double)hp->rope_freq_base);
    if (!(hp->rope_attn_factor > 0.0f && isfinite(hp->rope_attn_factor)))
        return nm_errorf(err, NM_ERR_FORMAT, "rope.scaling.attn_factor %g is not positive",
                         (double)hp->rope_attn_factor);
    if (hp->qk_norm == NM_QK_NORM_WHOLE && hp->n_head != hp->n_head_kv)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "%s norms q and k over the whole projection, which needs as many "
                         "key/value heads as query heads (have %d and %d)",
                         arch, hp->n_head_kv, hp->n_head);
    return NM_OK;
}

/* rows F32 vectors of n that spec says are absent, optional or required. */
static nm_status get_rows_as(const nm_model *m, nm_presence p, const char *name, int64_t n,
                             int64_t rows, const float **out, nm_error *err) {
    *out = NULL;
    if (p == NM_ABSENT || (p == NM_OPTIONAL && !nm_gguf_find_tensor(m->gguf, name))) return NM_OK;
    return nm_model_get_rows(m, name, n, rows, out, err);
}

/* A vector that spec says is absent, optional or required. */
static nm_status get_vec_as(const nm_model *m, nm_presence p, const char *name, int64_t n,
                            const float **out, nm_error *err) {
    return get_rows_as(m, p, name, n, 1, out, err);
}

/* The shared expert's four matrices (spec->shared_expert). */
static nm_status load_shared_expert(const nm_model *m, const nm_weight_spec *spec, int il,
                                    nm_layer *l, nm_error *err) {
    const int64_t d = m->hp.n_embd, ff = m->hp.n_ff_shexp;
    const bool optional = spec->shared_expert != NM_REQUIRED, gated = !m->hp.shexp_ungated;
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
    nm_status st;
    if (!gated && nm_gguf_find_tensor(m->gguf, NAME("ffn_gate_inp_shexp.weight")))
        return nm_errorf(err, NM_ERR_FORMAT, "tensor '%s': %s's shared experts have no gate", name,
                         m->arch->name);
    if ((gated && (st = nm_model_get_mat(m, NAME("ffn_gate_inp_shexp.weight"), d, 1, optional,
                                         &l->shexp_gate_inp, err))) ||
        (st = nm_model_get_mat(m, NAME("ffn_gate_shexp.weight"), d, ff, optional, &l->shexp_gate,
                               err)) ||
        (st = nm_model_get_mat(m, NAME("ffn_up_shexp.weight"), d, ff, optional, &l->shexp_up,
                               err)) ||
        (st = nm_model_get_mat(m, NAME("ffn_down_shexp.weight"), ff, d, optional, &l->shexp_down,
                               err)))
        return st;
    const int have =
        !!l->shexp_gate_inp.data + !!l->shexp_gate.data + !!l->shexp_up.data + !!l->shexp_down.data;
    if (have != 0 && have != 3 + gated)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "layer %d has %d of the %d shared-expert tensors "
                         "(ffn_{%sgate,up,down}_shexp.weight)",
                         il, have, 3 + gated, gated ? "gate_inp," : "");
#undef NAME
    return NM_OK;
}

/* Multi-head latent attention's tensors (hp.n_lora_kv > 0), as llama.cpp's
 * converter of Feb 2025 writes them: one attn_kv_b, not the split
 * attn_k_b/attn_v_b of later converters. */
static nm_status load_mla(const nm_model *m, int il, nm_layer *l, nm_error *err) {
    const nm_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim;
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
    if (nm_gguf_find_tensor(m->gguf, NAME("attn_k_b.weight")))
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "tensor '%s': the split attn_k_b/attn_v_b form of later converters is "
                         "not supported (npumoe reads attn_kv_b)",
                         name);
    nm_status st;
    if (hp->n_lora_q > 0) {
        if ((st = nm_model_get_mat(m, NAME("attn_q_a.weight"), d, hp->n_lora_q, false, &l->wq_a,
                                   err)) ||
            (st = nm_model_get_vec(m, NAME("attn_q_a_norm.weight"), hp->n_lora_q, &l->q_a_norm,
                                   err)) ||
            (st = nm_model_get_mat(m, NAME("attn_q_b.weight"), hp->n_lora_q, q_dim, false, &l->wq_b,
                                   err)))
            return st;
    } else if ((st = nm_model_get_mat(m, NAME("attn_q.weight"), d, q_dim, false, &l->wq, err)))
        return st;
    if ((st = nm_model_get_mat(m, NAME("attn_kv_a_mqa.weight"), d, hp->n_lora_kv + hp->n_rot, false,
                               &l->wkv_a, err)) ||
        (st = nm_model_get_vec(m, NAME("attn_kv_a_norm.weight"), hp->n_lora_kv, &l->kv_a_norm,
                               err)) ||
        (st = nm_model_get_mat(m, NAME("attn_kv_b.weight"), hp->n_lora_kv,
                               (int64_t)hp->n_head * (hp->n_nope + hp->n_v_head), false, &l->wkv_b,
                               err)) ||
        (st = nm_model_get_mat(m, NAME("attn_output.weight"), (int64_t)hp->n_head * hp->n_v_head, d,
                               false, &l->wo, err)))
        return st;
#undef NAME
    return NM_OK;
}

static nm_status load_layer(nm_model *m, const nm_weight_spec *spec, int il, nm_error *err) {
    const nm_hparams *hp = &m->hp;
    nm_layer *l = &m->layers[il];
    const int64_t d = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim,
                  kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const nm_presence qkv_bias =
        spec->qkv_bias > spec->attn_bias ? spec->qkv_bias : spec->attn_bias;
    const char *ffn_norm = spec->ffn_norm_name ? spec->ffn_norm_name : "ffn_norm";
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
#define NAME_S(s, suffix) (snprintf(name, sizeof name, "blk.%d.%s." suffix, il, s), name)
    nm_status st;
    if (nm_gguf_find_tensor(m->gguf, NAME("attn_qkv.weight")))
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "tensor '%s': fused q/k/v projections are not supported", name);
    if (nm_gguf_find_tensor(m->gguf, NAME("ffn_gate.0.weight")))
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "tensor '%s': experts stored one tensor each (an old Mixtral layout) "
                         "are not supported; reconvert with a current convert_hf_to_gguf.py",
                         name);
    if (hp->n_lora_kv > 0) {
        if ((st = nm_model_get_vec(m, NAME("attn_norm.weight"), d, &l->attn_norm, err)) ||
            (st = load_mla(m, il, l, err)))
            return st;
    } else if ((st = nm_model_get_vec(m, NAME("attn_norm.weight"), d, &l->attn_norm, err)) ||
               (st = get_vec_as(m, spec->norm_bias, NAME("attn_norm.bias"), d, &l->attn_norm_b,
                                err)) ||
               (st = nm_model_get_mat(m, NAME("attn_q.weight"), d, q_dim, false, &l->wq, err)) ||
               (st = nm_model_get_mat(m, NAME("attn_k.weight"), d, kv_dim, false, &l->wk, err)) ||
               (st = nm_model_get_mat(m, NAME("attn_v.weight"), d, kv_dim, false, &l->wv, err)) ||
               (st = nm_model_get_mat(m, NAME("attn_output.weight"), q_dim, d, false, &l->wo,
                                      err)) ||
               (st = get_vec_as(m, qkv_bias, NAME("attn_q.bias"), q_dim, &l->bq, err)) ||
               (st = get_vec_as(m, qkv_bias, NAME("attn_k.bias"), kv_dim, &l->bk, err)) ||
               (st = get_vec_as(m, qkv_bias, NAME("attn_v.bias"), kv_dim, &l->bv, err)) ||
               (st = get_vec_as(m, spec->attn_bias, NAME("attn_output.bias"), d, &l->bo, err)) ||
               (st = get_vec_as(m, spec->attn_sinks, NAME("attn_sinks.weight"), hp->n_head,
                                &l->sinks, err)))
        return st;
    if ((st = nm_model_get_vec(m, NAME_S(ffn_norm, "weight"), d, &l->ffn_norm, err)) ||
        (st = get_vec_as(m, spec->norm_bias, NAME_S(ffn_norm, "bias"), d, &l->ffn_norm_b, err)))
        return st;
    if (!nm_model_layer_is_moe(hp, il)) { /* a leading dense layer: its FFN, nothing else */
        if ((st = nm_model_get_mat(m, NAME("ffn_gate.weight"), d, hp->n_ff, false, &l->ffn_gate,
                                   err)) ||
            (st =
                 nm_model_get_mat(m, NAME("ffn_up.weight"), d, hp->n_ff, false, &l->ffn_up, err)) ||
            (st = nm_model_get_mat(m, NAME("ffn_down.weight"), hp->n_ff, d, false, &l->ffn_down,
                                   err)))
            return st;
        return NM_OK;
    }
    if ((st = nm_model_get_mat(m, NAME("ffn_gate_inp.weight"), d, hp->n_expert, false, &l->router,
                               err)) ||
        (st = get_vec_as(m, spec->router_bias, NAME("ffn_gate_inp.bias"), hp->n_expert,
                         &l->router_b, err)))
        return st;
    if (hp->qk_norm != NM_QK_NORM_NONE) {
        const bool whole = hp->qk_norm == NM_QK_NORM_WHOLE;
        if ((st = nm_model_get_vec(m, NAME("attn_q_norm.weight"), whole ? q_dim : hp->head_dim,
                                   &l->q_norm, err)) ||
            (st = nm_model_get_vec(m, NAME("attn_k_norm.weight"), whole ? kv_dim : hp->head_dim,
                                   &l->k_norm, err)))
            return st;
    }
    nm_expert_weights *x = &l->experts;
    x->n_expert = hp->n_expert;
    if ((st = nm_model_get_stack(m, NAME("ffn_gate_exps.weight"), d, hp->n_ff_exp, hp->n_expert,
                                 &x->gate, &x->gate_stride, err)) ||
        (st = nm_model_get_stack(m, NAME("ffn_up_exps.weight"), d, hp->n_ff_exp, hp->n_expert,
                                 &x->up, &x->up_stride, err)) ||
        (st = nm_model_get_stack(m, NAME("ffn_down_exps.weight"), hp->n_ff_exp, d, hp->n_expert,
                                 &x->down, &x->down_stride, err)))
        return st;
    const nm_presence eb = spec->expert_bias;
    const int64_t ne = hp->n_expert;
    if ((st = get_rows_as(m, eb, NAME("ffn_gate_exps.bias"), hp->n_ff_exp, ne, &x->gate_b, err)) ||
        (st = get_rows_as(m, eb, NAME("ffn_up_exps.bias"), hp->n_ff_exp, ne, &x->up_b, err)) ||
        (st = get_rows_as(m, eb, NAME("ffn_down_exps.bias"), d, ne, &x->down_b, err)))
        return st;
#undef NAME
#undef NAME_S
    if (spec->shared_expert != NM_ABSENT) return load_shared_expert(m, spec, il, l, err);
    return NM_OK;
}

nm_status nm_model_load_weights(nm_model *m, const nm_weight_spec *spec, nm_error *err) {
    nm_hparams *hp = &m->hp;
    nm_status st;
    const nm_gguf_tensor *embd = nm_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!embd) return nm_errorf(err, NM_ERR_NOT_FOUND, "tensor 'token_embd.weight' is missing");
    if (embd->ne[1] < 1 || embd->ne[1] > INT32_MAX)
        return nm_errorf(err, NM_ERR_FORMAT, "tensor 'token_embd.weight' has %lld rows",
                         (long long)embd->ne[1]);
    hp->n_vocab = (int32_t)embd->ne[1];
    if ((st = nm_model_get_mat(m, "token_embd.weight", hp->n_embd, hp->n_vocab, false, &m->tok_embd,
                               err)) ||
        (st = nm_model_get_vec(m, "output_norm.weight", hp->n_embd, &m->output_norm, err)) ||
        (st = get_vec_as(m, spec->norm_bias, "output_norm.bias", hp->n_embd, &m->output_norm_b,
                         err)) ||
        (st = nm_model_get_mat(m, "output.weight", hp->n_embd, hp->n_vocab, true, &m->output,
                               err)) ||
        (st = get_vec_as(m, spec->output_bias, "output.bias", hp->n_vocab, &m->output_b, err)))
        return st;
    m->tied_output = m->output.data == NULL;
    if (m->tied_output) m->output = m->tok_embd;
    if (spec->rope_factors != NM_ABSENT) {
        const nm_presence p = spec->rope_factors;
        if ((st = get_vec_as(m, p, "rope_factors_short.weight", hp->n_rot / 2,
                             &m->rope_factors_short, err)) ||
            (st = get_vec_as(m, p, "rope_factors_long.weight", hp->n_rot / 2, &m->rope_factors_long,
                             err)))
            return st;
        if (!m->rope_factors_short != !m->rope_factors_long)
            return nm_errorf(err, NM_ERR_FORMAT,
                             "rope_factors_short.weight and rope_factors_long.weight must come "
                             "together");
    }
    m->layers = nm_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++)
        if ((st = load_layer(m, spec, il, err))) return st;
    return NM_OK;
}

/* ggml's YaRN defaults, which llama.cpp keeps (the files have no keys) */
static const float YARN_BETA_FAST = 32.0f, YARN_BETA_SLOW = 1.0f;

nm_status nm_model_rope_scaling(nm_model *m, float *factor_out, nm_error *err) {
    nm_hparams *hp = &m->hp;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch->name);
    nm_gguf_str type = {"none", 4};
    nm_status st;
    if (nm_gguf_find(m->gguf, key) && (st = nm_gguf_get_str(m->gguf, key, &type, err))) return st;
    const bool yarn = nm_gguf_str_eq(type, "yarn"), linear = nm_gguf_str_eq(type, "linear");
    if (!yarn && !linear && !nm_gguf_str_eq(type, "none"))
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s = '%.*s': only none, linear and yarn are "
                         "supported",
                         key, (int)(type.len < 64 ? type.len : 64), type.ptr);
    float factor = 0.0f;
    if ((st = nm_model_hparam_f32(m, "rope.scaling.factor", false, &factor, err))) return st;
    if (factor == 0.0f) factor = 1.0f; /* absent or 0: no scaling, as llama.cpp reads it */
    if (!(factor >= 1.0f && factor <= 1e6f))
        return nm_errorf(err, NM_ERR_FORMAT, "%s.rope.scaling.factor %g is not in [1, 1e6]",
                         m->arch->name, (double)factor);
    hp->rope_scaled = (yarn || linear) && factor != 1.0f;
    if (factor_out) *factor_out = hp->rope_scaled ? factor : 1.0f;
    if (!hp->rope_scaled) return NM_OK;
    hp->rope_yarn = nm_rope_yarn_make(hp->n_rot, hp->n_ctx_orig, hp->rope_freq_base, factor,
                                      YARN_BETA_FAST, YARN_BETA_SLOW);
    if (linear) hp->rope_yarn.ext_factor = 0.0f;
    return NM_OK;
}
