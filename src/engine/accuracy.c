/* Accuracy measurement: negative log-likelihood statistics with llama.cpp's
 * perplexity uncertainty, KL divergence and top-1 agreement between two
 * token distributions, and the windowed scoring of a text by one or two
 * sessions (perplexity, compare). All sums are in double. */
#include "engine.h"

#include "base/base.h"

#include <math.h>
#include <string.h>

void nm_nll_stats_add(nm_nll_stats *s, double nll) {
    s->sum += nll;
    s->sum_sq += nll * nll;
    s->count++;
}

double nm_nll_stats_ppl(const nm_nll_stats *s) {
    return s->count ? exp(s->sum / (double)s->count) : NAN;
}

double nm_nll_stats_ppl_err(const nm_nll_stats *s) {
    if (s->count < 2) return NAN;
    const double mean = s->sum / (double)s->count;
    const double var = s->sum_sq / (double)s->count - mean * mean;
    if (var <= 0) return 0.0;
    return exp(mean) * sqrt(var / (double)(s->count - 1));
}

int32_t nm_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* log(sum(exp(x))) in double, stable. */
static double log_sum_exp(const float *x, int32_t n) {
    double max = x[nm_argmax(x, n)];
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - max);
    return max + log(sum);
}

double nm_token_nll(const float *logits, int32_t n_vocab, int32_t target) {
    NM_ASSERT(target >= 0 && target < n_vocab);
    return log_sum_exp(logits, n_vocab) - (double)logits[target];
}

double nm_kl_divergence(const float *p_logits, const float *q_logits, int32_t n_vocab) {
    const double lse_p = log_sum_exp(p_logits, n_vocab);
    const double lse_q = log_sum_exp(q_logits, n_vocab);
    double kl = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) {
        const double lp = (double)p_logits[i] - lse_p;
        const double lq = (double)q_logits[i] - lse_q;
        kl += exp(lp) * (lp - lq);
    }
    return kl > 0.0 ? kl : 0.0; /* rounding can leave -1e-17 for equal inputs */
}

nm_status nm_score_text(nm_session *ref, nm_session *cand, const int32_t *ids, size_t n,
                        int32_t n_ctx, int32_t bos, nm_progress_fn progress, void *progress_ctx,
                        nm_accuracy *out, nm_error *err) {
    memset(out, 0, sizeof *out);
    if (n_ctx < 4)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "window length %d is too short (at least 4)",
                         n_ctx);
    if (n < 2 * (size_t)n_ctx)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the text has %zu tokens; scoring windows of %d needs at least %d", n,
                         n_ctx, 2 * n_ctx);
    const int32_t n_vocab = nm_session_n_vocab(ref);
    if (cand && nm_session_n_vocab(cand) != n_vocab)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the reference has %d tokens in its vocabulary, the candidate %d", n_vocab,
                         nm_session_n_vocab(cand));
    const size_t n_logits = (size_t)n_ctx * (size_t)n_vocab;
    float *ref_logits = nm_malloc(n_logits * sizeof(float)); /* [n_ctx][n_vocab] */
    float *cand_logits = cand ? nm_malloc(n_logits * sizeof(float)) : NULL;
    int32_t *window = nm_malloc((size_t)n_ctx * sizeof(int32_t)); /* [n_ctx] */
    nm_status st = NM_OK;
    if (!ref_logits || !window || (cand && !cand_logits))
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for %d x %d logits", n_ctx, n_vocab);
    out->n_ctx = n_ctx;
    out->n_windows = (int32_t)(n / (size_t)n_ctx);
    const int32_t first = n_ctx / 2;
    if (st == NM_OK && progress) progress(progress_ctx, 0, out->n_windows, out);
    for (int32_t w = 0; st == NM_OK && w < out->n_windows; w++) {
        memcpy(window, ids + (size_t)w * n_ctx, (size_t)n_ctx * sizeof(int32_t));
        if (bos >= 0) window[0] = bos;
        nm_session_reset(ref);
        st = nm_session_eval(ref, window, n_ctx, ref_logits, true, err);
        if (st == NM_OK && cand) {
            nm_session_reset(cand);
            st = nm_session_eval(cand, window, n_ctx, cand_logits, true, err);
        }
        if (st != NM_OK) break;
        for (int32_t t = first; t < n_ctx - 1; t++) {
            const float *rl = ref_logits + (size_t)t * n_vocab;
            nm_nll_stats_add(&out->ref, nm_token_nll(rl, n_vocab, window[t + 1]));
            if (!cand) continue;
            const float *cl = cand_logits + (size_t)t * n_vocab;
            nm_nll_stats_add(&out->cand, nm_token_nll(cl, n_vocab, window[t + 1]));
            const double kl = nm_kl_divergence(rl, cl, n_vocab);
            out->kl_sum += kl;
            if (kl > out->kl_max) out->kl_max = kl;
            out->top1_same += nm_argmax(rl, n_vocab) == nm_argmax(cl, n_vocab);
        }
        if (progress) progress(progress_ctx, w + 1, out->n_windows, out);
    }
    nm_session_reset(ref);
    if (cand) nm_session_reset(cand);
    nm_free(ref_logits);
    nm_free(cand_logits);
    nm_free(window);
    return st;
}
