/* Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B) as llama.cpp's converter
 * writes it: "qwen2moe.*" keys, biases on q, k and v (none on the output
 * projection), NeoX RoPE, softmax routing over all experts and top-k
 * without renormalisation (norm_topk_prob is false in these configs and
 * llama.cpp's qwen2moe graph does not renormalise; the file has no key for
 * it), and a shared expert beside the routed ones: a SwiGLU FFN of width
 * expert_shared_feed_forward_length that every token takes, its output
 * scaled by sigmoid(ffn_gate_inp_shexp . x). Without that key the shared
 * width is feed_forward_length, as llama.cpp reads it. */
#include "model/model.h"

#include <stdio.h>

static nm_status load(nm_model *m, nm_error *err) {
    m->hp.norm = NM_NORM_RMS;
    m->hp.rope = NM_ROPE_NEOX;
    m->hp.qk_norm = NM_QK_NORM_NONE;
    m->route = nm_route_softmax_topk;
    nm_status st = nm_model_load_hparams(m, err);
    if (st == NM_OK) {
        char key[96];
        snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", m->arch->name);
        st = nm_model_hparam_i32(m,
                                 nm_gguf_find(m->gguf, key) ? "expert_shared_feed_forward_length"
                                                            : "feed_forward_length",
                                 true, &m->hp.n_ff_shexp, err);
    }
    if (st != NM_OK) return st;
    if (m->hp.n_ff_shexp < 1 || m->hp.n_ff_shexp > (1 << 20))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "qwen2moe.expert_shared_feed_forward_length = %d is not in [1, %d]",
                         m->hp.n_ff_shexp, 1 << 20);
    m->hp.n_expert_shared = 1;
    const nm_weight_spec spec = {.norm_bias = NM_ABSENT,
                                 .attn_bias = NM_ABSENT,
                                 .output_bias = NM_ABSENT,
                                 .rope_factors = NM_ABSENT,
                                 .qkv_bias = NM_REQUIRED,
                                 .shared_expert = NM_REQUIRED};
    return nm_model_load_weights(m, &spec, err);
}

const nm_arch nm_arch_qwen2moe = {.name = "qwen2moe", .load = load};
