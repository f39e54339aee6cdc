/* The sampler against closed forms: greedy ties, frequencies of seeded draws
 * against the probabilities each filter should leave, the repetition
 * penalty, determinism per seed, and rejection of bad parameters. */
#include "harness.h"

#include "npumoe.h"

#include <math.h>
#include <string.h>

enum { N_DRAWS = 200000 };

static nm_sampler *make(nm_sampler_params p, int n_vocab) {
    nm_sampler *s = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_sampler_new(&p, n_vocab, &s, &err), NM_OK);
    return s;
}

static nm_sampler_params plain(void) {
    nm_sampler_params p = nm_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.seed = 1234;
    return p;
}

/* Draws N_DRAWS tokens and compares frequencies with want[] (sum 1). */
static void check_freq(nm_sampler_params p, const float *logits, int n, const double *want,
                       const char *what) {
    nm_sampler *s = make(p, n);
    if (!s) return;
    int count[16] = {0};
    for (int i = 0; i < N_DRAWS; i++)
        count[nm_sampler_sample(s, logits)]++;
    for (int i = 0; i < n; i++) {
        double f = (double)count[i] / N_DRAWS;
        /* 5 standard deviations of a binomial proportion, at least 1e-3 */
        double tol = 5 * sqrt(want[i] * (1 - want[i]) / N_DRAWS) + 1e-3;
        if (fabs(f - want[i]) > tol)
            fprintf(stderr, "%s: token %d freq %.4f want %.4f\n", what, i, f, want[i]);
        CHECK_NEAR(f, want[i], tol);
    }
    nm_sampler_free(s);
}

int main(void) {
    const float probs[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    float logits[4];
    for (int i = 0; i < 4; i++)
        logits[i] = logf(probs[i]) + 3.0f; /* shift must not matter */

    /* greedy, ties to the lowest id */
    nm_sampler_params g = plain();
    g.temperature = 0.0f;
    nm_sampler *s = make(g, 5);
    const float tie[5] = {1, 3, 2, 3, 0};
    CHECK_INT_EQ(nm_sampler_sample(s, tie), 1);
    nm_sampler_free(s);

    double want[4] = {0.1, 0.2, 0.3, 0.4};
    check_freq(plain(), logits, 4, want, "temperature 1");

    nm_sampler_params t = plain();
    t.temperature = 0.5f; /* p^2 normalised: 1, 4, 9, 16 over 30 */
    double want_t[4] = {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0};
    check_freq(t, logits, 4, want_t, "temperature 0.5");

    nm_sampler_params k = plain();
    k.top_k = 2; /* 0.3 and 0.4 renormalised */
    double want_k[4] = {0, 0, 3 / 7.0, 4 / 7.0};
    check_freq(k, logits, 4, want_k, "top-k 2");

    nm_sampler_params tp = plain();
    tp.top_p = 0.65f; /* 0.4 + 0.3 = 0.7 is the smallest set reaching 0.65 */
    check_freq(tp, logits, 4, want_k, "top-p 0.65");

    nm_sampler_params mp = plain();
    mp.min_p = 0.6f; /* keep p >= 0.24: 0.3 and 0.4 */
    check_freq(mp, logits, 4, want_k, "min-p 0.6");

    nm_sampler_params k1 = plain();
    k1.top_k = 1;
    double want_1[4] = {0, 0, 0, 1};
    check_freq(k1, logits, 4, want_1, "top-k 1");

    /* repetition penalty: logit 2 of a recent token becomes 1, below 1.9 */
    nm_sampler_params r = plain();
    r.temperature = 0.0f;
    r.repeat_penalty = 2.0f;
    s = make(r, 2);
    const float rl[2] = {2.0f, 1.9f};
    CHECK_INT_EQ(nm_sampler_sample(s, rl), 0);
    nm_sampler_accept(s, 0);
    CHECK_INT_EQ(nm_sampler_sample(s, rl), 1);
    nm_sampler_free(s);
    /* a negative logit is multiplied: -1 becomes -2, below -1.5 */
    s = make(r, 2);
    const float rn[2] = {-1.0f, -1.5f};
    nm_sampler_accept(s, 0);
    CHECK_INT_EQ(nm_sampler_sample(s, rn), 1);
    nm_sampler_free(s);

    /* same seed, same draws; another seed, other draws */
    int32_t a[64], b[64], c[64];
    const int32_t *runs[3] = {a, b, c};
    const uint64_t seeds[3] = {7, 7, 8};
    for (int run = 0; run < 3; run++) {
        nm_sampler_params p = plain();
        p.seed = seeds[run];
        s = make(p, 4);
        for (int i = 0; i < 64; i++)
            ((int32_t *)runs[run])[i] = nm_sampler_sample(s, logits);
        nm_sampler_free(s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);

    /* bad parameters are refused with a message */
    nm_error err = {0};
    nm_sampler_params bad = plain();
    bad.top_p = 0.0f;
    CHECK_INT_EQ(nm_sampler_new(&bad, 4, &s, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "top-p") != NULL);
    bad = plain();
    bad.temperature = -1.0f;
    CHECK_INT_EQ(nm_sampler_new(&bad, 4, &s, &err), NM_ERR_INVALID_ARG);
    bad = plain();
    bad.temperature = NAN;
    CHECK_INT_EQ(nm_sampler_new(&bad, 4, &s, &err), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_sampler_new(NULL, 0, &s, &err), NM_ERR_INVALID_ARG);
    return nm_test_finish("test_sampler");
}
