/* Accuracy statistics against known answers (uniform logits, closed-form KL,
 * llama.cpp's perplexity uncertainty on a hand-computed case) and windowed
 * scoring against llama.cpp's own perplexity golden: llama-perplexity on
 * tiny-qwen3moe over GPL-3 with -c 128, F32 KV cache, gives
 * 29855.3301 +/- 839.41 (vectors/README.md). */
#include "harness.h"

#include "engine/engine.h"
#include "npumoe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_statistics(void) {
    float uniform[1000];
    for (int i = 0; i < 1000; i++)
        uniform[i] = 0.25f;
    CHECK_NEAR(nm_token_nll(uniform, 1000, 17), log(1000.0), 1e-12);

    nm_nll_stats s = {0};
    CHECK(isnan(nm_nll_stats_ppl(&s)));
    nm_nll_stats_add(&s, 1.0);
    nm_nll_stats_add(&s, 2.0);
    nm_nll_stats_add(&s, 3.0);
    CHECK_NEAR(nm_nll_stats_ppl(&s), exp(2.0), 1e-12);
    /* var = 14/3 - 4 = 2/3; sqrt(var / (n - 1)) = sqrt(1/3) */
    CHECK_NEAR(nm_nll_stats_ppl_err(&s), exp(2.0) * sqrt(1.0 / 3.0), 1e-12);

    const float p[2] = {0.0f, 0.0f};
    const float q[2] = {0.0f, logf(3.0f)}; /* (1/4, 3/4) */
    CHECK_NEAR(nm_kl_divergence(p, q, 2), 0.5 * log(2.0) + 0.5 * log(2.0 / 3.0), 1e-7);
    CHECK_NEAR(nm_kl_divergence(q, p, 2), 0.25 * log(0.5) + 0.75 * log(1.5), 1e-7);
    CHECK(nm_kl_divergence(q, q, 2) == 0.0);
    const float big[3] = {1000.0f, -1000.0f, 999.0f}; /* no overflow */
    CHECK(isfinite(nm_kl_divergence(big, q, 2)));
    CHECK(isfinite(nm_token_nll(big, 3, 1)));
    const float ties[4] = {1, 5, 5, 2};
    CHECK_INT_EQ(nm_argmax(ties, 4), 1);
}

static void test_golden_perplexity(void) {
    nm_model *m = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_model_load(NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf", NULL, &m, &err), NM_OK);
    size_t n_bytes = 0;
    char *text = (char *)nm_test_read_file("/usr/share/common-licenses/GPL-3", &n_bytes);
    CHECK(m != NULL && text != NULL);
    if (!m || !text) {
        nm_model_free(m);
        free(text);
        return;
    }
    size_t n = 0;
    nm_tokenize(m, text, n_bytes, false, true, NULL, 0, &n, &err);
    int32_t *ids = malloc(n * sizeof *ids);
    CHECK_INT_EQ(nm_tokenize(m, text, n_bytes, false, true, ids, n, &n, &err), NM_OK);

    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 128;
    sp.n_threads = 1;
    nm_session *ref = NULL, *cand = NULL;
    CHECK_INT_EQ(nm_session_new(m, &sp, &ref, &err), NM_OK);
    sp.n_batch = 16;
    sp.n_threads = 2;
    CHECK_INT_EQ(nm_session_new(m, &sp, &cand, &err), NM_OK);

    nm_accuracy acc;
    CHECK_INT_EQ(nm_score_text(ref, cand, ids, n, 128, -1, NULL, NULL, &acc, &err), NM_OK);
    const double ppl = nm_nll_stats_ppl(&acc.ref);
    printf(
        "GPL-3, windows of 128: %d windows, ppl %.4f +/- %.4f (llama.cpp 29855.3301 +/- 839.41)\n",
        acc.n_windows, ppl, nm_nll_stats_ppl_err(&acc.ref));
    CHECK_INT_EQ(acc.n_windows, 82);
    CHECK_INT_EQ(acc.ref.count, 82 * 63);
    CHECK_NEAR(ppl / 29855.3301, 1.0, 1e-6);
    CHECK_NEAR(nm_nll_stats_ppl_err(&acc.ref), 839.41, 0.01);
    /* another thread count and batch size: the same distribution */
    printf("candidate: ppl %.4f, mean KL %.3g, max KL %.3g, top-1 %llu of %llu\n",
           nm_nll_stats_ppl(&acc.cand), acc.kl_sum / (double)acc.cand.count, acc.kl_max,
           (unsigned long long)acc.top1_same, (unsigned long long)acc.cand.count);
    CHECK_NEAR(nm_nll_stats_ppl(&acc.cand) / ppl, 1.0, 1e-6);
    CHECK(acc.kl_max < 1e-9);
    CHECK_INT_EQ(acc.top1_same, acc.cand.count);

    /* too little text and too short windows are refused */
    CHECK_INT_EQ(nm_score_text(ref, NULL, ids, 255, 128, -1, NULL, NULL, &acc, &err),
                 NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "at least 256") != NULL);
    CHECK_INT_EQ(nm_score_text(ref, NULL, ids, n, 2, -1, NULL, NULL, &acc, &err),
                 NM_ERR_INVALID_ARG);
    /* a window longer than the session's context is a capacity error */
    CHECK_INT_EQ(nm_score_text(ref, NULL, ids, n, 256, -1, NULL, NULL, &acc, &err),
                 NM_ERR_CAPACITY);

    nm_session_free(ref);
    nm_session_free(cand);
    free(ids);
    free(text);
    nm_model_free(m);
}

int main(void) {
    test_statistics();
    test_golden_perplexity();
    return nm_test_finish("test_accuracy");
}
