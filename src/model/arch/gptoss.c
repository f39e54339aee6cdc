/* gpt-oss (gpt-oss-20b, gpt-oss-120b) as llama.cpp's converter writes it
 * ("gpt-oss.*" keys), with the semantics of ik_llama.cpp's graph for it:
 * RMSNorm, the FFN norm named post_attention_norm; biases on q/k/v/o; a
 * learned sink logit per head in the attention softmax's denominator;
 * attention over a sliding window of attention.sliding_window keys on the
 * even layers (0, 2, ...), over every key on the odd ones; NeoX RoPE with
 * rope.scaling (YaRN: factor, original_context_length, beta_fast 32,
 * beta_slow 1; attn_factor); a router with a bias whose k largest logits
 * are chosen and weighted by a softmax over those k alone; experts with
 * biases on gate, up and down and the clamped SwiGLU (alpha 1.702, limit
 * 7, the constants ggml's graph uses; the file has no key for them). */
#include "model/model.h"

#include <math.h>
#include <stdio.h>

/* ik_llama.cpp's build_openai_moe: LLM_FFN_SWIGLU_OAI's constants, and the
 * sliding layers are those with il % 2 == 0 */
static const float SWIGLU_ALPHA = 1.702f, SWIGLU_LIMIT = 7.0f;
enum { SWA_PATTERN = 2 };
/* ggml's YaRN defaults, which llama.cpp keeps for gpt-oss */
static const float YARN_BETA_FAST = 32.0f, YARN_BETA_SLOW = 1.0f;

/* rope.scaling.type and .factor: none, linear (angles / factor) or yarn. */
static nm_status load_rope_scaling(nm_model *m, nm_error *err) {
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
    if (!hp->rope_scaled) return NM_OK;
    hp->rope_yarn = nm_rope_yarn_make(hp->n_rot, hp->n_ctx_orig, hp->rope_freq_base, factor,
                                      YARN_BETA_FAST, YARN_BETA_SLOW);
    if (linear) hp->rope_yarn.ext_factor = 0.0f;
    return NM_OK;
}

static nm_status load(nm_model *m, nm_error *err) {
    nm_hparams *hp = &m->hp;
    hp->norm = NM_NORM_RMS;
    hp->rope = NM_ROPE_NEOX;
    hp->qk_norm = NM_QK_NORM_NONE;
    m->route = nm_route_topk_softmax;
    nm_status st =
        nm_model_hparam_f32(m, "rope.scaling.attn_factor", false, &hp->rope_attn_factor, err);
    if (st == NM_OK) st = nm_model_load_hparams(m, err);
    if (st == NM_OK) st = nm_model_hparam_i32(m, "attention.sliding_window", true, &hp->n_swa, err);
    if (st == NM_OK) st = load_rope_scaling(m, err);
    if (st != NM_OK) return st;
    if (hp->n_swa < 1 || hp->n_swa > (1 << 30))
        return nm_errorf(err, NM_ERR_FORMAT, "%s.attention.sliding_window = %d is not in [1, %d]",
                         m->arch->name, hp->n_swa, 1 << 30);
    const nm_weight_spec spec = {.attn_bias = NM_REQUIRED,
                                 .attn_sinks = NM_REQUIRED,
                                 .router_bias = NM_REQUIRED,
                                 .expert_bias = NM_REQUIRED,
                                 .ffn_norm_name = "post_attention_norm"};
    if ((st = nm_model_load_weights(m, &spec, err))) return st;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        nm_layer *l = &m->layers[il];
        l->window = il % SWA_PATTERN < SWA_PATTERN - 1 ? hp->n_swa : 0;
        l->experts.glu = NM_GLU_SWIGLU_OAI;
        l->experts.glu_alpha = SWIGLU_ALPHA;
        l->experts.glu_limit = SWIGLU_LIMIT;
    }
    return NM_OK;
}

const nm_arch nm_arch_gptoss = {.name = "gpt-oss", .load = load};
