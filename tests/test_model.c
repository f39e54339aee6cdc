/* End-to-end logits of the qwen3moe engine against llama.cpp's goldens
 * (vectors/tiny-qwen3moe, F32 weights): one-shot prefill, batches of 16,
 * split prefill + one-token decodes, 1 and 2 threads, and the 24-token
 * greedy continuations. Tolerance: max|d| / max|golden| per row < 1e-5 (the
 * vectors README: llama.cpp's own variations stay near 3e-7). */
#include "harness.h"

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "npumoe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VEC NM_VECTORS_DIR "/tiny-qwen3moe/"
enum { N_PROMPTS = 6, MAX_IDS = 512, N_GREEDY = 24 };

int main(void) {
    if (!nm_test_kernels_from_env()) return 77;
    nm_model *m = NULL;
    nm_error err = {0};
    nm_status st = nm_model_load(VEC "model.gguf", NULL, &m, &err);
    if (st != NM_OK) fprintf(stderr, "load: %s\n", err.msg);
    CHECK_INT_EQ(st, NM_OK);
    if (!m) return nm_test_finish("test_model");
    nm_model_info info;
    nm_model_get_info(m, &info);
    CHECK_INT_EQ(info.n_vocab, 4099);
    CHECK_INT_EQ(info.n_layer, 3);
    const int nv = info.n_vocab;
    float *logits = malloc((size_t)MAX_IDS * nv * sizeof(float));
    float *split = malloc((size_t)MAX_IDS * nv * sizeof(float));

    for (int p = 0; p < N_PROMPTS; p++) {
        int32_t ids[MAX_IDS];
        int n = nm_test_read_ints(VEC "prompts.txt", p, ids, MAX_IDS);
        CHECK(n > 0);
        if (n <= 0) continue;
        /* one-shot, then batches of 16 on 2 threads */
        const int configs[2][2] = {{512, 1}, {16, 2}};
        for (int c = 0; c < 2; c++) {
            nm_session *s = nm_test_new_session(m, configs[c][0], configs[c][1]);
            if (!s) continue;
            st = nm_session_eval(s, ids, n, logits, true, &err);
            CHECK_INT_EQ(st, NM_OK);
            double e = nm_test_golden_worst(VEC, p, logits, n, nv);
            printf("prompt %d (%d tokens) batch %d threads %d: max rel %.3g\n", p, n, configs[c][0],
                   configs[c][1], e);
            CHECK(e < 1e-5);
            nm_session_free(s);
        }
        /* split: first half as one prefill, then one token per step */
        nm_session *s = nm_test_new_session(m, 512, 2);
        if (!s) continue;
        const int half = n / 2;
        if (half > 0) CHECK_INT_EQ(nm_session_eval(s, ids, half, split, true, &err), NM_OK);
        for (int t = half; t < n; t++)
            CHECK_INT_EQ(nm_session_eval(s, ids + t, 1, split + (size_t)t * nv, false, &err),
                         NM_OK);
        double e = nm_test_golden_worst(VEC, p, split, n, nv);
        printf("prompt %d split %d + %d x 1: max rel %.3g\n", p, half, n - half, e);
        CHECK(e < 1e-5);

        /* greedy: the argmax of the last row, then one token at a time */
        int32_t want[N_GREEDY];
        CHECK_INT_EQ(nm_test_read_ints(VEC "greedy.txt", p, want, N_GREEDY), N_GREEDY);
        int32_t next = nm_argmax(split + (size_t)(n - 1) * nv, nv);
        int same = 0;
        for (int g = 0; g < N_GREEDY; g++) {
            same += next == want[g];
            if (next != want[g])
                fprintf(stderr, "prompt %d greedy %d: %d != %d\n", p, g, next, want[g]);
            if (g + 1 < N_GREEDY) {
                CHECK_INT_EQ(nm_session_eval(s, &next, 1, logits, false, &err), NM_OK);
                next = nm_argmax(logits, nv);
            }
        }
        CHECK_INT_EQ(same, N_GREEDY);
        nm_session_free(s);
    }

    /* the context limit is an error, not a crash */
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 8;
    nm_session *s = NULL;
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
    int32_t many[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK_INT_EQ(nm_session_eval(s, many, 9, NULL, false, &err), NM_ERR_CAPACITY);
    int32_t bad = nv;
    CHECK_INT_EQ(nm_session_eval(s, &bad, 1, NULL, false, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "token id") != NULL);
    nm_session_free(s);

    free(logits);
    free(split);
    nm_model_free(m);
    return nm_test_finish("test_model");
}
