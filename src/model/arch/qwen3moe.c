/* Qwen3-MoE (Qwen3-30B-A3B and its family) as llama.cpp's converter writes
 * it: key names "qwen3moe.*", per-head q/k RMSNorm before NeoX RoPE, softmax
 * routing over all experts, top-k, weights renormalised to sum 1 (Qwen3-MoE
 * sets norm_topk_prob; llama.cpp hard-wires it and the file has no key). */
#include "model/model.h"

static nm_status load(nm_model *m, nm_error *err) {
    m->hp.norm = NM_NORM_RMS;
    m->hp.rope = NM_ROPE_NEOX;
    m->hp.qk_norm = NM_QK_NORM_HEAD;
    m->route = nm_route_softmax_topk_renorm;
    nm_status st = nm_model_load_hparams(m, err);
    if (st != NM_OK) return st;
    const nm_weight_spec spec = {.norm_bias = NM_ABSENT}; /* nothing optional */
    return nm_model_load_weights(m, &spec, err);
}

const nm_arch nm_arch_qwen3moe = {.name = "qwen3moe", .load = load};
