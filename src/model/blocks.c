/* Small blocks of the forward pass whose form depends on the architecture:
 * the norm (RMS or Layer, with an optional bias), RoPE (NEOX or NORM
 * pairing, frequency factors, attention factor) and the routing functions
 * adapters choose from. The norms and RoPE themselves are the kernels'. */
#include "model.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

void nm_model_norm(const nm_hparams *hp, const float *x, const float *w, const float *b, float *y,
                   int64_t n) {
    nm_norm_bias_forward(hp->norm != NM_NORM_RMS, x, w, b, y, n, hp->rms_eps);
}

void nm_model_rope(const nm_hparams *hp, const float *freq_factors, float *x, int n_head,
                   int32_t pos) {
    nm_rope_ext_forward(x, n_head, hp->head_dim, hp->n_rot, pos, hp->rope_freq_base,
                        hp->rope == NM_ROPE_NEOX, freq_factors, hp->rope_attn_factor,
                        hp->rope_scaled ? &hp->rope_yarn : NULL);
}

void nm_model_round_f16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = nm_f16_to_f32(nm_f32_to_f16(x[i]));
}

/* The k largest of n scores (ties to the lower id) in descending order:
 * their ids and values. */
static void top_k(const float *scores, int32_t n, int32_t k, int32_t *ids, float *values) {
    for (int32_t s = 0; s < k; s++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n; e++) {
            bool taken = false;
            for (int32_t j = 0; j < s; j++)
                taken |= ids[j] == e;
            if (!taken && (best < 0 || scores[e] > scores[best])) best = e;
        }
        ids[s] = best;
        values[s] = scores[best];
    }
}

/* The k largest of probs [n_expert] in descending order into ids and
 * weights, renormalised to sum 1 when renorm. */
static void topk(const nm_hparams *hp, const float *probs, bool renorm, int32_t *ids,
                 float *weights) {
    const int32_t n_expert = hp->n_expert, k = hp->n_expert_used;
    NM_ASSERT(k >= 1 && k <= n_expert);
    top_k(probs, n_expert, k, ids, weights);
    if (renorm) {
        float sum = 0.0f;
        for (int32_t s = 0; s < k; s++)
            sum += weights[s];
        for (int32_t s = 0; s < k; s++)
            weights[s] /= sum;
    }
}

/* Softmax over all n_expert logits, then topk. */
static void softmax_topk(const nm_hparams *hp, const float *logits, bool renorm, int32_t *ids,
                         float *weights, float *probs) {
    memcpy(probs, logits, (size_t)hp->n_expert * sizeof(float));
    nm_softmax_forward(probs, hp->n_expert);
    topk(hp, probs, renorm, ids, weights);
}

void nm_route_softmax_topk_renorm(const nm_hparams *hp, const float *logits, int32_t *ids,
                                  float *weights, float *probs) {
    softmax_topk(hp, logits, true, ids, weights, probs);
}

void nm_route_softmax_topk(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                           float *probs) {
    softmax_topk(hp, logits, false, ids, weights, probs);
}

void nm_route_topk_softmax(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                           float *probs) {
    (void)probs;
    NM_ASSERT(hp->n_expert_used >= 1 && hp->n_expert_used <= hp->n_expert);
    top_k(logits, hp->n_expert, hp->n_expert_used, ids, weights);
    nm_softmax_forward(weights, hp->n_expert_used);
}

/* Hugging Face's sparsemixer (modeling_phimoe.py) with training off, for
 * slot s: the best remaining logit m; experts whose logit l has
 * (m - l) / max(|l|, m) > 2 * jitter are masked; the weight is the softmax
 * probability of the best among the rest, the chosen ones excluded. HF
 * hard-codes k = 2; the same step repeats for any k here. */
void nm_route_sparsemixer(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                          float *probs) {
    const int32_t n = hp->n_expert, k = hp->n_expert_used;
    const float gap = 2.0f * hp->router_jitter;
    for (int32_t s = 0; s < k; s++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n; e++) {
            bool taken = false;
            for (int32_t j = 0; j < s; j++)
                taken |= ids[j] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        const float m = logits[best];
        double sum = 0.0;
        for (int32_t e = 0; e < n; e++) {
            bool taken = false;
            for (int32_t j = 0; j < s; j++)
                taken |= ids[j] == e;
            const float factor = fmaxf(fabsf(logits[e]), m);
            const bool masked = taken || (m - logits[e]) / factor > gap;
            probs[e] = masked ? 0.0f : expf(logits[e] - m);
            sum += probs[e];
        }
        ids[s] = best;
        weights[s] = (float)(1.0 / sum); /* probs[best] = exp(0) */
    }
}

/* DeepSeek-V2's group_limited_greedy: a group's score is its best
 * probability; the experts of all but the n_group_used best groups (ties
 * to the lower group) are out of the contest. probs[e] = -1 marks them. */
static void limit_groups(const nm_hparams *hp, float *probs) {
    const int32_t n_group = hp->n_group, per = hp->n_expert / n_group;
    bool keep[256] = {false}; /* n_group <= 256, checked at load */
    for (int32_t s = 0; s < hp->n_group_used; s++) {
        int32_t best = -1;
        float best_score = 0.0f;
        for (int32_t g = 0; g < n_group; g++) {
            if (keep[g]) continue;
            float score = probs[g * per];
            for (int32_t j = 1; j < per; j++)
                score = fmaxf(score, probs[g * per + j]);
            if (best < 0 || score > best_score) {
                best = g;
                best_score = score;
            }
        }
        keep[best] = true;
    }
    for (int32_t e = 0; e < hp->n_expert; e++)
        if (!keep[e / per]) probs[e] = -1.0f;
}

void nm_route_deepseek(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                       float *probs) {
    memcpy(probs, logits, (size_t)hp->n_expert * sizeof(float));
    nm_softmax_forward(probs, hp->n_expert);
    if (hp->n_group > 1) limit_groups(hp, probs);
    topk(hp, probs, hp->expert_weights_norm, ids, weights);
    for (int32_t s = 0; s < hp->n_expert_used; s++)
        weights[s] *= hp->expert_weights_scale;
}

/* ---- layer kinds and the cache's shape ---- */

bool nm_model_layer_is_moe(const nm_hparams *hp, int32_t il) {
    return il >= hp->n_layer_dense_lead;
}

int32_t nm_model_moe_index(const nm_hparams *hp, int32_t il) {
    return nm_model_layer_is_moe(hp, il) ? il - hp->n_layer_dense_lead : -1;
}

int32_t nm_model_n_moe_layers(const nm_hparams *hp) { return hp->n_layer - hp->n_layer_dense_lead; }

int64_t nm_model_kv_k_dim(const nm_hparams *hp) {
    return hp->n_lora_kv > 0 ? (int64_t)hp->n_lora_kv + hp->n_rot
                             : (int64_t)hp->n_head_kv * hp->head_dim;
}

int64_t nm_model_kv_v_dim(const nm_hparams *hp) {
    return hp->n_lora_kv > 0 ? 0 : (int64_t)hp->n_head_kv * hp->head_dim;
}

int64_t nm_model_q_width(const nm_hparams *hp) {
    if (hp->n_lora_kv == 0) return (int64_t)hp->n_head * hp->head_dim;
    /* MLA (mla.c) keeps in these rows, one at a time: q_a's output
     * [n_lora_q], q as projected [n_head][head_dim], q absorbed into the
     * latent and the attention's output [n_head][n_lora_kv + n_rot], the
     * heads' values [n_head][n_v_head] */
    int64_t w = (int64_t)hp->n_head * (hp->n_lora_kv + hp->n_rot);
    if (w < (int64_t)hp->n_head * hp->head_dim) w = (int64_t)hp->n_head * hp->head_dim;
    if (w < (int64_t)hp->n_head * hp->n_v_head) w = (int64_t)hp->n_head * hp->n_v_head;
    return w > hp->n_lora_q ? w : hp->n_lora_q;
}
