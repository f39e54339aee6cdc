/* DeepSeek-V2 (DeepSeek-V2, -V2-Lite, -V2.5) as llama.cpp's converter
 * writes it: "deepseek2.*" keys, multi-head latent attention (mla.c) with q
 * through wq (attention.q_lora_rank absent or 0, as V2-Lite) or the q_a /
 * q_b bottleneck, llama (NORM) RoPE on the decoupled part with YaRN, the
 * attention scale corrected by YaRN's mscale as llama.cpp c392 computes it
 * (mscale = attn_factor (1 + yarn_log_multiplier ln(factor)), scale =
 * mscale^2 / sqrt(key_length)), leading_dense_block_count plain SwiGLU
 * layers, shared experts (expert_shared_count x expert width, ungated)
 * beside the routed ones, softmax routing with expert_weights_norm and
 * expert_weights_scale, and group-limited routing when the file has
 * expert_group_count > 1 (llama.cpp c392 ignores it). DeepSeek-V3's sigmoid
 * gating and expert bias are refused. */
#include "model/model.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* RoPE scaling (nm_model_rope_scaling) and the q.k scale with its YaRN
 * correction. */
static nm_status rope_scaling(nm_model *m, nm_error *err) {
    nm_hparams *hp = &m->hp;
    float factor = 1.0f;
    nm_status st = nm_model_rope_scaling(m, &factor, err);
    if (st) return st;
    const float fs = 1.0f / factor;
    /* llama.cpp's deepseek2 graph: the file's attn_factor and the log
     * multiplier make the q.k scale; RoPE's own magnitude is
     * 1 / (1 + 0.1 ln(1 / freq_scale)), which YaRN's rope multiplies back */
    float attn_factor = 1.0f, log_mul = 0.0f;
    if ((st = nm_model_hparam_f32(m, "rope.scaling.attn_factor", false, &attn_factor, err)) ||
        (st = nm_model_hparam_f32(m, "rope.scaling.yarn_log_multiplier", false, &log_mul, err)))
        return st;
    if (!(attn_factor > 0.0f && attn_factor < 100.0f) || !(fabsf(log_mul) < 100.0f))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "deepseek2 rope.scaling.attn_factor %g or yarn_log_multiplier %g is out "
                         "of range",
                         (double)attn_factor, (double)log_mul);
    const float mscale = attn_factor * (1.0f + log_mul * logf(1.0f / fs));
    hp->attn_scale = 1.0f * mscale * mscale / sqrtf((float)hp->head_dim);
    hp->rope_attn_factor = 1.0f / (1.0f + 0.1f * logf(1.0f / fs));
    return NM_OK;
}

static nm_status routing(nm_model *m, nm_error *err) {
    nm_hparams *hp = &m->hp;
    nm_status st;
    int32_t gating = 1; /* 1 softmax, 2 sigmoid (V3); absent in V2 files: softmax */
    if ((st = nm_model_hparam_i32(m, "expert_gating_func", false, &gating, err))) return st;
    if (gating != 1)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "deepseek2.expert_gating_func = %d: only softmax gating (1, DeepSeek-V2) "
                         "is supported",
                         gating);
    hp->expert_weights_scale = 1.0f;
    if ((st = nm_model_hparam_f32(m, "expert_weights_scale", true, &hp->expert_weights_scale, err)))
        return st;
    if (!(hp->expert_weights_scale > 0.0f && hp->expert_weights_scale < 1e4f))
        return nm_errorf(err, NM_ERR_FORMAT, "deepseek2.expert_weights_scale %g is not in (0, 1e4)",
                         (double)hp->expert_weights_scale);
    hp->expert_weights_norm = false;
    if (nm_gguf_find(m->gguf, "deepseek2.expert_weights_norm") &&
        (st = nm_gguf_get_bool(m->gguf, "deepseek2.expert_weights_norm", &hp->expert_weights_norm,
                               err)))
        return st;
    hp->n_group = 1;
    hp->n_group_used = 1;
    if ((st = nm_model_hparam_i32(m, "expert_group_count", false, &hp->n_group, err))) return st;
    hp->n_group_used = hp->n_group;
    if ((st = nm_model_hparam_i32(m, "expert_group_used_count", false, &hp->n_group_used, err)))
        return st;
    if (hp->n_group < 1 || hp->n_group > 256 || hp->n_expert % hp->n_group != 0)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "deepseek2.expert_group_count %d is not in [1, 256] or does not divide "
                         "expert_count %d",
                         hp->n_group, hp->n_expert);
    if (hp->n_group_used < 1 || hp->n_group_used > hp->n_group ||
        (int64_t)hp->n_group_used * (hp->n_expert / hp->n_group) < hp->n_expert_used)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "deepseek2.expert_group_used_count %d is not in [1, %d] or its groups "
                         "hold fewer than expert_used_count %d experts",
                         hp->n_group_used, hp->n_group, hp->n_expert_used);
    return NM_OK;
}

static nm_status load(nm_model *m, nm_error *err) {
    nm_hparams *hp = &m->hp;
    hp->norm = NM_NORM_RMS;
    hp->rope = NM_ROPE_NORM;
    hp->qk_norm = NM_QK_NORM_NONE;
    hp->shexp_ungated = true;
    m->route = nm_route_deepseek;
    nm_status st;
    /* MLA before the shared keys: value_length may differ from key_length */
    if ((st = nm_model_hparam_i32(m, "attention.kv_lora_rank", true, &hp->n_lora_kv, err)) ||
        (st = nm_model_hparam_i32(m, "attention.q_lora_rank", false, &hp->n_lora_q, err)))
        return st;
    if (hp->n_lora_kv < 1 || hp->n_lora_kv > 65536 || hp->n_lora_q < 0 || hp->n_lora_q > 65536)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "deepseek2.attention.kv_lora_rank %d is not in [1, 65536] or q_lora_rank "
                         "%d not in [0, 65536]",
                         hp->n_lora_kv, hp->n_lora_q);
    if ((st = nm_model_load_hparams(m, err))) return st;
    hp->n_nope = hp->head_dim - hp->n_rot;
    if (hp->n_v_head < 1 || hp->n_v_head > 8192)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "deepseek2.attention.value_length %d is not in [1, 8192]", hp->n_v_head);
    int32_t n_shared = 0;
    if ((st = nm_model_hparam_i32(m, "leading_dense_block_count", false, &hp->n_layer_dense_lead,
                                  err)) ||
        (st = nm_model_hparam_i32(m, "feed_forward_length", true, &hp->n_ff, err)) ||
        (st = nm_model_hparam_i32(m, "expert_shared_count", true, &n_shared, err)))
        return st;
    if (hp->n_layer_dense_lead < 0 || hp->n_layer_dense_lead >= hp->n_layer)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "deepseek2.leading_dense_block_count %d is not in [0, %d): a MoE model "
                         "needs a MoE layer",
                         hp->n_layer_dense_lead, hp->n_layer);
    if (hp->n_ff < 1 || hp->n_ff > (1 << 20) || n_shared < 0 || n_shared > 64)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "deepseek2.feed_forward_length %d is not in [1, %d] or "
                         "expert_shared_count %d not in [0, 64]",
                         hp->n_ff, 1 << 20, n_shared);
    hp->n_ff_shexp = n_shared * hp->n_ff_exp;
    hp->n_expert_shared = n_shared;
    if ((st = rope_scaling(m, err)) || (st = routing(m, err))) return st;
    const nm_weight_spec spec = {.norm_bias = NM_ABSENT,
                                 .attn_bias = NM_ABSENT,
                                 .output_bias = NM_ABSENT,
                                 .rope_factors = NM_ABSENT,
                                 .qkv_bias = NM_ABSENT,
                                 .shared_expert = n_shared > 0 ? NM_REQUIRED : NM_ABSENT};
    for (int il = 0; il < hp->n_layer; il++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", il);
        if (nm_gguf_find_tensor(m->gguf, name))
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "tensor '%s': DeepSeek-V3's expert bias is not supported", name);
    }
    if ((st = nm_model_load_weights(m, &spec, err))) return st;
    return nm_model_mla_prepare(m, err);
}

const nm_arch nm_arch_deepseek2 = {.name = "deepseek2", .load = load};
