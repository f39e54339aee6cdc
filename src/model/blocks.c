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

/* Softmax over all n_expert logits, the k largest probabilities (ties to
 * the lower id) in descending order, renormalised to sum 1 when renorm. */
static void softmax_topk(const nm_hparams *hp, const float *logits, bool renorm, int32_t *ids,
                         float *weights, float *probs) {
    const int32_t n_expert = hp->n_expert, k = hp->n_expert_used;
    NM_ASSERT(k >= 1 && k <= n_expert);
    memcpy(probs, logits, (size_t)n_expert * sizeof(float));
    nm_softmax_forward(probs, n_expert);
    top_k(probs, n_expert, k, ids, weights);
    if (renorm) {
        float sum = 0.0f;
        for (int32_t s = 0; s < k; s++)
            sum += weights[s];
        for (int32_t s = 0; s < k; s++)
            weights[s] /= sum;
    }
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
