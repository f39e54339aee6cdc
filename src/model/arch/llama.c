/* "llama" files with experts: Mixtral-8x7B/8x22B as llama.cpp's converter
 * writes them (ffn_gate_inp and ffn_{gate,up,down}_exps stacks). RMSNorm,
 * NORM-style RoPE (adjacent pairs), softmax over all experts, top-k,
 * renormalised (Mixtral's router, and llama.cpp's); optional attention
 * biases as llama.cpp allows; no output.weight means a tied output. A llama
 * file without experts is a dense model and refused. */
#include "model/model.h"

static nm_status load(nm_model *m, nm_error *err) {
    m->hp.norm = NM_NORM_RMS;
    m->hp.rope = NM_ROPE_NORM;
    m->hp.qk_norm = NM_QK_NORM_NONE;
    m->route = nm_route_softmax_topk_renorm;
    nm_status st = nm_model_load_hparams(m, err);
    if (st != NM_OK) return st;
    const nm_weight_spec spec = {.attn_bias = NM_OPTIONAL};
    return nm_model_load_weights(m, &spec, err);
}

const nm_arch nm_arch_llama = {.name = "llama", .load = load};
