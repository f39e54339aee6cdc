/* Token sampling: repetition penalty, top-k, top-p, min-p, temperature, then
 * a draw from a seeded xoshiro256** generator; temperature 0 is greedy with
 * ties to the lowest id. The filters run in llama.cpp's default order. */
#include "npumoe.h"

#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct candidate {
    int32_t id;
    float logit;
} candidate;

struct nm_sampler {
    nm_sampler_params p;
    int32_t n_vocab;
    candidate *cand; /* [n_vocab] */
    int32_t *recent; /* [repeat_last_n] ring of accepted tokens */
    int32_t n_recent;
    int32_t recent_head;
    nm_rng rng;
};

nm_sampler_params nm_sampler_default_params(void) {
    nm_sampler_params p = {
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .seed = 0,
    };
    return p;
}

nm_status nm_sampler_new(const nm_sampler_params *params, int32_t n_vocab, nm_sampler **out,
                         nm_error *err) {
    *out = NULL;
    nm_sampler_params p = params ? *params : nm_sampler_default_params();
    if (n_vocab < 1) return nm_errorf(err, NM_ERR_INVALID_ARG, "vocabulary size %d", n_vocab);
    if (!(p.temperature >= 0.0f) || !isfinite(p.temperature))
        return nm_errorf(err, NM_ERR_INVALID_ARG, "temperature %g must be >= 0",
                         (double)p.temperature);
    if (p.top_k < 0) return nm_errorf(err, NM_ERR_INVALID_ARG, "top-k %d must be >= 0", p.top_k);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        return nm_errorf(err, NM_ERR_INVALID_ARG, "top-p %g must be in (0, 1]", (double)p.top_p);
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
        return nm_errorf(err, NM_ERR_INVALID_ARG, "min-p %g must be in [0, 1]", (double)p.min_p);
    if (!(p.repeat_penalty > 0.0f) || !isfinite(p.repeat_penalty))
        return nm_errorf(err, NM_ERR_INVALID_ARG, "repeat penalty %g must be > 0",
                         (double)p.repeat_penalty);
    if (p.repeat_last_n < 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "repeat window %d must be >= 0", p.repeat_last_n);
    nm_sampler *s = nm_calloc(1, sizeof *s);
    if (s) {
        s->cand = nm_calloc((size_t)n_vocab, sizeof *s->cand);
        s->recent = nm_calloc((size_t)p.repeat_last_n + 1, sizeof *s->recent);
    }
    if (!s || !s->cand || !s->recent) {
        nm_sampler_free(s);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the sampler");
    }
    s->p = p;
    s->n_vocab = n_vocab;
    nm_rng_seed(&s->rng, p.seed);
    *out = s;
    return NM_OK;
}

void nm_sampler_free(nm_sampler *sampler) {
    if (!sampler) return;
    nm_free(sampler->cand);
    nm_free(sampler->recent);
    nm_free(sampler);
}

void nm_sampler_accept(nm_sampler *s, int32_t id) {
    if (s->p.repeat_last_n == 0) return;
    s->recent[s->recent_head] = id;
    s->recent_head = (s->recent_head + 1) % s->p.repeat_last_n;
    if (s->n_recent < s->p.repeat_last_n) s->n_recent++;
}

/* Descending logit, ties to the lower id. */
static int by_logit_desc(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Moves the k best candidates to the front (unsorted), Hoare quickselect. */
static void select_top(candidate *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        candidate pivot = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (by_logit_desc(&c[i], &pivot) < 0)
                i++;
            while (by_logit_desc(&c[j], &pivot) > 0)
                j--;
            if (i <= j) {
                candidate t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

int32_t nm_sampler_sample(nm_sampler *s, const float *logits) {
    const int32_t n_vocab = s->n_vocab;
    for (int32_t i = 0; i < n_vocab; i++)
        s->cand[i] = (candidate){i, logits[i]};
    if (s->p.repeat_penalty != 1.0f) {
        for (int32_t r = 0; r < s->n_recent; r++) {
            const int32_t id = s->recent[r];
            if (id < 0 || id >= n_vocab) continue;
            /* a token repeated in the window is penalised once, as llama.cpp does */
            bool seen = false;
            for (int32_t q = 0; q < r; q++)
                seen |= s->recent[q] == id;
            if (seen) continue;
            float *l = &s->cand[id].logit;
            *l = *l > 0.0f ? *l / s->p.repeat_penalty : *l * s->p.repeat_penalty;
        }
    }
    if (s->p.temperature == 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < n_vocab; i++)
            if (s->cand[i].logit > s->cand[best].logit) best = i;
        return s->cand[best].id;
    }
    int32_t n = n_vocab;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top(s->cand, n, s->p.top_k);
        n = s->p.top_k;
    }
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_logit_desc);
    /* probabilities at temperature 1 drive top-p and min-p, as in llama.cpp */
    const float max = s->cand[0].logit;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)s->cand[i].logit - max);
    if (s->p.top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)s->cand[i].logit - max) / sum;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) {
        /* keep tokens whose probability is at least min_p times the best's */
        const double floor_logit = max + log((double)s->p.min_p);
        int32_t keep = 1;
        while (keep < n && s->cand[keep].logit >= floor_logit)
            keep++;
        n = keep;
    }
    double total = 0.0;
    for (int32_t i = 0; i < n; i++)
        total += exp(((double)s->cand[i].logit - max) / s->p.temperature);
    double r = nm_rng_unit(&s->rng) * total, cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += exp(((double)s->cand[i].logit - max) / s->p.temperature);
        if (r < cum) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}
