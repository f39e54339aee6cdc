/* PhiMoE (Phi-3.5-MoE, Phi-tiny-MoE) as llama.cpp's converter writes it:
 * "phimoe.*" keys, biases on q/k/v/o, the norms and the LM head, NeoX RoPE
 * with LongRoPE frequency factors (short up to original_context_length,
 * long past it) and cos/sin scaled by rope.scaling.attn_factor.
 *
 * Two semantics. As trained (the default; Hugging Face's modeling_phimoe.py):
 * LayerNorm with bias, and "sparsemixer" routing with router_jitter_noise
 * 0.01 (Phi-3.5-MoE's config; the GGUF has no key for it). llama.cpp
 * (NM_COMPAT_LLAMA_CPP): RMSNorm plus bias, softmax over all experts, top-k,
 * renormalised. Everything else is the same in both, including the RoPE
 * attention factor: HF uses config.json's short/long_mscale (1.2432 for
 * Phi-3.5-MoE), which the converter replaces by sqrt(1 + ln 32 / ln 4096) =
 * 1.1902 in rope.scaling.attn_factor; the file's value is all there is. */
#include "model/model.h"

/* Phi-3.5-MoE-instruct and Phi-tiny-MoE config.json: router_jitter_noise */
static const float ROUTER_JITTER = 0.01f;

static nm_status load(nm_model *m, nm_error *err) {
    const bool llama_cpp = m->compat == NM_COMPAT_LLAMA_CPP;
    m->hp.norm = llama_cpp ? NM_NORM_RMS : NM_NORM_LAYER;
    m->hp.rope = NM_ROPE_NEOX;
    m->hp.qk_norm = NM_QK_NORM_NONE;
    m->hp.router_jitter = ROUTER_JITTER;
    m->route = llama_cpp ? nm_route_softmax_topk_renorm : nm_route_sparsemixer;
    nm_status st =
        nm_model_hparam_f32(m, "rope.scaling.attn_factor", false, &m->hp.rope_attn_factor, err);
    if (st == NM_OK) st = nm_model_load_hparams(m, err);
    if (st != NM_OK) return st;
    const nm_weight_spec spec = {.norm_bias = NM_REQUIRED,
                                 .attn_bias = NM_REQUIRED,
                                 .output_bias = NM_REQUIRED,
                                 .rope_factors = NM_OPTIONAL};
    return nm_model_load_weights(m, &spec, err);
}

const nm_arch nm_arch_phimoe = {.name = "phimoe", .load = load};
