/* Small blocks of the forward pass whose form depends on the architecture:
 * the norm (RMS or Layer, with an optional bias), RoPE (NEOX or NORM
 * pairing, frequency factors, attention factor) and the routing functions
 * adapters choose from. The plain NEOX RoPE and RMSNorm are the kernels'. */
#include "model.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

void nm_model_norm(const nm_hparams *hp, const float *x, const float *w, const float *b, float *y,
                   int64_t n) {
    if (hp->norm == NM_NORM_RMS) {
        nm_rmsnorm_forward(x, w, y, n, hp->rms_eps);
    } else {
        /* torch.nn.LayerNorm: biased variance; sums in double as ggml's norm */
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            sum += x[i];
        const float mean = (float)(sum / (double)n);
        double sum2 = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i] - mean;
            sum2 += (double)(v * v);
        }
        const float scale = 1.0f / sqrtf((float)(sum2 / (double)n) + hp->rms_eps);
        for (int64_t i = 0; i < n; i++)
            y[i] = (x[i] - mean) * scale * w[i];
    }
    if (b)
        for (int64_t i = 0; i < n; i++)
            y[i] += b[i];
}

void nm_model_rope(const nm_hparams *hp, const float *freq_factors, float *x, int n_head,
                   int32_t pos) {
    const int head_dim = hp->head_dim, n_rot = hp->n_rot, half = n_rot / 2;
    if (hp->rope == NM_ROPE_NEOX && !freq_factors && hp->rope_attn_factor == 1.0f) {
        nm_rope_neox_forward(x, n_head, head_dim, n_rot, pos, hp->rope_freq_base);
        return;
    }
    /* ggml_rope_cache_init with ext_factor 0 and freq_scale 1: the angle of
     * pair i is pos * base^(-2i/n_rot) (accumulated in float) divided by
     * freq_factors[i], and cos, sin are scaled by the attention factor. */
    const float theta_scale = powf(hp->rope_freq_base, -2.0f / (float)n_rot);
    const float mscale = hp->rope_attn_factor;
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        const float t = freq_factors ? theta / freq_factors[i] : theta;
        const float c = cosf(t) * mscale, s = sinf(t) * mscale;
        /* NEOX pairs i with i + half; NORM pairs 2i with 2i + 1 */
        const int a = hp->rope == NM_ROPE_NEOX ? i : 2 * i;
        const int b = hp->rope == NM_ROPE_NEOX ? i + half : 2 * i + 1;
        for (int h = 0; h < n_head; h++) {
            float *v = x + (size_t)h * head_dim;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
        theta *= theta_scale;
    }
}

void nm_model_round_f16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = nm_f16_to_f32(nm_f32_to_f16(x[i]));
}

/* Softmax over all n_expert logits, the k largest probabilities (ties to
 * the lower id) in descending order, renormalised to sum 1 when renorm. */
static void softmax_topk(const nm_hparams *hp, const float *logits, bool renorm, int32_t *ids,
                         float *weights, float *probs) {
    const int32_t n_expert = hp->n_expert, k = hp->n_expert_used;
    NM_ASSERT(k >= 1 && k <= n_expert);
    memcpy(probs, logits, (size_t)n_expert * sizeof(float));
    nm_softmax_forward(probs, n_expert);
    for (int32_t s = 0; s < k; s++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int32_t j = 0; j < s; j++)
                taken |= ids[j] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        ids[s] = best;
        weights[s] = probs[best];
    }
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
