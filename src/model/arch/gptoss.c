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
    if (st == NM_OK) st = nm_model_rope_scaling(m, NULL, err);
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
