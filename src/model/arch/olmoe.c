/* OLMoE (allenai/OLMoE-1B-7B) as llama.cpp's converter writes it: "olmoe.*"
 * keys, q and k RMS-normed over the whole projection (n_head * head_dim,
 * before the head split; so multi-head attention only), NeoX RoPE, softmax
 * routing over all experts and top-k without renormalisation
 * (norm_topk_prob is false in OLMoE's config, and llama.cpp agrees). */
#include "model/model.h"

static nm_status load(nm_model *m, nm_error *err) {
    m->hp.norm = NM_NORM_RMS;
    m->hp.rope = NM_ROPE_NEOX;
    m->hp.qk_norm = NM_QK_NORM_WHOLE;
    m->route = nm_route_softmax_topk;
    nm_status st = nm_model_load_hparams(m, err);
    if (st != NM_OK) return st;
    const nm_weight_spec spec = {.norm_bias = NM_ABSENT}; /* nothing optional */
    return nm_model_load_weights(m, &spec, err);
}

const nm_arch nm_arch_olmoe = {.name = "olmoe", .load = load};
