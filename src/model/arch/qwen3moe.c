/* Qwen3-MoE (Qwen3-30B-A3B and its family) as llama.cpp's converter writes
 * it: key names "qwen3moe.*", per-head q/k RMSNorm before NeoX RoPE, softmax
 * routing over all experts, top-k, weights renormalised to sum 1 (Qwen3-MoE
 * sets norm_topk_prob; llama.cpp hard-wires it and the file has no key). */
#include "model/model.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>

static void route(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                  float *probs) {
    nm_moe_route_softmax_topk(logits, hp->n_expert, hp->n_expert_used, true, ids, weights, probs);
}

static nm_status load_hparams(nm_model *m, nm_error *err) {
    nm_hparams *hp = &m->hp;
    nm_status st;
    if ((st = nm_model_hparam_i32(m, "block_count", true, &hp->n_layer, err)) ||
        (st = nm_model_hparam_i32(m, "context_length", true, &hp->n_ctx_train, err)) ||
        (st = nm_model_hparam_i32(m, "embedding_length", true, &hp->n_embd, err)) ||
        (st = nm_model_hparam_i32(m, "attention.head_count", true, &hp->n_head, err)) ||
        (st = nm_model_hparam_i32(m, "attention.head_count_kv", true, &hp->n_head_kv, err)) ||
        (st = nm_model_hparam_i32(m, "expert_count", true, &hp->n_expert, err)) ||
        (st = nm_model_hparam_i32(m, "expert_used_count", true, &hp->n_expert_used, err)) ||
        (st = nm_model_hparam_i32(m, "expert_feed_forward_length", true, &hp->n_ff_exp, err)) ||
        (st = nm_model_hparam_f32(m, "attention.layer_norm_rms_epsilon", true, &hp->rms_eps, err)))
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
    if (value_length >= 0 && value_length != hp->head_dim)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "attention.key_length %d differs from attention.value_length %d",
                         hp->head_dim, value_length);
    hp->n_rot = hp->head_dim;
    if ((st = nm_model_hparam_i32(m, "rope.dimension_count", false, &hp->n_rot, err))) return st;

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
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (checks[i].v < checks[i].lo || checks[i].v > checks[i].hi)
            return nm_errorf(err, NM_ERR_FORMAT, "qwen3moe.%s = %d is not in [%d, %d]",
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
    return NM_OK;
}

static nm_status load_layer(nm_model *m, int il, nm_error *err) {
    const nm_hparams *hp = &m->hp;
    nm_layer *l = &m->layers[il];
    const int64_t d = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim,
                  kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
    nm_status st;
    if ((st = nm_model_get_vec(m, NAME("attn_norm.weight"), d, &l->attn_norm, err)) ||
        (st = nm_model_get_mat(m, NAME("attn_q.weight"), d, q_dim, false, &l->wq, err)) ||
        (st = nm_model_get_mat(m, NAME("attn_k.weight"), d, kv_dim, false, &l->wk, err)) ||
        (st = nm_model_get_mat(m, NAME("attn_v.weight"), d, kv_dim, false, &l->wv, err)) ||
        (st = nm_model_get_mat(m, NAME("attn_output.weight"), q_dim, d, false, &l->wo, err)) ||
        (st = nm_model_get_vec(m, NAME("attn_q_norm.weight"), hp->head_dim, &l->q_norm, err)) ||
        (st = nm_model_get_vec(m, NAME("attn_k_norm.weight"), hp->head_dim, &l->k_norm, err)) ||
        (st = nm_model_get_vec(m, NAME("ffn_norm.weight"), d, &l->ffn_norm, err)) ||
        (st = nm_model_get_mat(m, NAME("ffn_gate_inp.weight"), d, hp->n_expert, false, &l->router,
                               err)))
        return st;
    nm_expert_weights *x = &l->experts;
    x->n_expert = hp->n_expert;
    if ((st = nm_model_get_stack(m, NAME("ffn_gate_exps.weight"), d, hp->n_ff_exp, hp->n_expert,
                                 &x->gate, &x->gate_stride, err)) ||
        (st = nm_model_get_stack(m, NAME("ffn_up_exps.weight"), d, hp->n_ff_exp, hp->n_expert,
                                 &x->up, &x->up_stride, err)) ||
        (st = nm_model_get_stack(m, NAME("ffn_down_exps.weight"), hp->n_ff_exp, d, hp->n_expert,
                                 &x->down, &x->down_stride, err)))
        return st;
#undef NAME
    return NM_OK;
}

static nm_status load(nm_model *m, nm_error *err) {
    nm_status st = load_hparams(m, err);
    if (st != NM_OK) return st;
    nm_hparams *hp = &m->hp;
    const nm_gguf_tensor *embd = nm_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!embd) return nm_errorf(err, NM_ERR_NOT_FOUND, "tensor 'token_embd.weight' is missing");
    if (embd->ne[1] < 1 || embd->ne[1] > INT32_MAX)
        return nm_errorf(err, NM_ERR_FORMAT, "tensor 'token_embd.weight' has %lld rows",
                         (long long)embd->ne[1]);
    hp->n_vocab = (int32_t)embd->ne[1];
    if ((st = nm_model_get_mat(m, "token_embd.weight", hp->n_embd, hp->n_vocab, false, &m->tok_embd,
                               err)) ||
        (st = nm_model_get_vec(m, "output_norm.weight", hp->n_embd, &m->output_norm, err)) ||
        (st = nm_model_get_mat(m, "output.weight", hp->n_embd, hp->n_vocab, true, &m->output, err)))
        return st;
    m->tied_output = m->output.data == NULL;
    if (m->tied_output) m->output = m->tok_embd;
    m->layers = nm_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++)
        if ((st = load_layer(m, il, err))) return st;
    return NM_OK;
}

const nm_arch nm_arch_qwen3moe = {
    .name = "qwen3moe",
    .load = load,
    .route = route,
};
