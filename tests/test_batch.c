/* nm_batch_decode (continuous batching) against sessions decoding alone:
 * three sessions with prompts of different lengths (so different cached
 * positions), one of them with an F16 cache, decode greedy steps in one
 * batch, while three separate sessions with the same prompts decode the
 * same tokens one at a time with nm_session_eval; sessions leave and join
 * between steps. With the reference kernels (forced before the models
 * load) the logits are equal bit for bit; with this CPU's fastest kernels,
 * whose rounding may follow the number of rows, within 1e-4 of each row's
 * largest logit and with the same greedy token; also with 16 sessions on
 * the quantised models (where a kernel may change path with the rows).
 * Models: tiny-qwen3moe (F32), tiny-phimoe (LayerNorm, biases, F16 head),
 * tiny-qwen3moe Q4_K_M, the shipped model, tiny-qwen2moe (q/k/v biases,
 * a gated shared expert) and tiny-deepseek2 and -qlora (latent attention,
 * each row's latents written into its own session's cache, F16 ones
 * included; a dense layer). Then every refused argument,
 * which leaves the sessions as they were. */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SESS = 16, STEPS = 8, MAX_IDS = 256 };

static nm_model *load(const char *path) {
    nm_model *m = NULL;
    nm_error err = {0};
    nm_status st = nm_model_load(path, NULL, &m, &err);
    if (st != NM_OK) fprintf(stderr, "%s: %s\n", path, err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return m;
}

static nm_session *open_session(nm_model *m, int32_t n_ctx, nm_kv_type kv) {
    nm_session_params p = nm_session_default_params();
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    p.kv_type = kv;
    nm_session *s = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_session_new(m, &p, &s, &err), NM_OK);
    return s;
}

/* The largest |a - b| over n values, relative to the largest |b|. */
static double rel_diff(const float *a, const float *b, int32_t n) {
    double diff = 0, big = 1e-30;
    for (int32_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        big = fmax(big, fabs((double)b[i]));
    }
    return diff / big;
}

/* Batched against alone on one model; exact: bit for bit. */
static void compare(const char *label, const char *path, const int32_t *prompt, int n_prompt,
                    int n_sess, bool exact) {
    nm_model *m = load(path);
    if (!m) return;
    nm_model_info info;
    nm_model_get_info(m, &info);
    const int32_t n_vocab = info.n_vocab;
    const int32_t n_ctx = 64;
    nm_session *alone[MAX_SESS], *batched[MAX_SESS];
    int32_t next[MAX_SESS];
    float *want = malloc((size_t)n_vocab * sizeof(float));
    float *got = malloc((size_t)n_sess * n_vocab * sizeof(float));
    nm_error err = {0};
    for (int i = 0; i < n_sess; i++) {
        const nm_kv_type kv = i % 3 == 1 ? NM_KV_F16 : NM_KV_F32;
        alone[i] = open_session(m, n_ctx, kv);
        batched[i] = open_session(m, n_ctx, kv);
        /* 3, 10, 17, 5, ... positions, from prompt + i */
        const int n = 3 + (7 * i) % 23 < n_prompt - i ? 3 + (7 * i) % 23 : n_prompt - i;
        CHECK_INT_EQ(nm_session_eval(alone[i], prompt + i, n, want, false, &err), NM_OK);
        CHECK_INT_EQ(nm_session_eval(batched[i], prompt + i, n, NULL, false, &err), NM_OK);
        next[i] = nm_argmax(want, n_vocab);
    }
    nm_batch *b = NULL;
    CHECK_INT_EQ(nm_batch_new(m, n_sess, n_ctx, 2, &b, &err), NM_OK);
    int worst_step = -1;
    double worst = 0;
    int mismatches = 0, tokens_differ = 0;
    for (int step = 0; step < STEPS; step++) {
        /* step 2 runs sessions 0 and 2 only (1 waits), step 3 session 1 alone */
        nm_session *in[MAX_SESS];
        int32_t ids[MAX_SESS], who[MAX_SESS];
        int n = 0;
        for (int i = 0; i < n_sess; i++)
            if ((step != 2 || i != 1) && (step != 3 || i == 1)) {
                in[n] = batched[i];
                ids[n] = next[i];
                who[n++] = i;
            }
        CHECK_INT_EQ(nm_batch_decode(b, in, ids, n, got, &err), NM_OK);
        for (int r = 0; r < n; r++) {
            const int i = who[r];
            CHECK_INT_EQ(nm_session_eval(alone[i], &next[i], 1, want, false, &err), NM_OK);
            const float *row = got + (size_t)r * n_vocab;
            if (memcmp(row, want, (size_t)n_vocab * sizeof(float)) != 0) mismatches++;
            const double d = rel_diff(row, want, n_vocab);
            if (d > worst) worst = d, worst_step = step;
            const int32_t a = nm_argmax(want, n_vocab);
            if (nm_argmax(row, n_vocab) != a) tokens_differ++;
            next[i] = a;
            CHECK_INT_EQ(nm_session_n_past(batched[i]), nm_session_n_past(alone[i]));
        }
    }
    if (exact) CHECK_INT_EQ(mismatches, 0);
    CHECK_INT_EQ(tokens_differ, 0);
    CHECK(worst <= 1e-4);
    fprintf(stderr,
            "%s, %d sessions (%s kernels): %d rows differ bitwise, largest relative difference "
            "%.3g (step %d)\n",
            label, n_sess, exact ? "ref" : "fastest", mismatches, worst, worst_step);
    nm_batch_free(b);
    for (int i = 0; i < n_sess; i++) {
        nm_session_free(alone[i]);
        nm_session_free(batched[i]);
    }
    free(want);
    free(got);
    nm_model_free(m);
}

/* Every refusal, and that a refused call changes no session. */
static void refusals(const char *path, const int32_t *prompt) {
    nm_model *m = load(path), *other = load(path);
    if (!m || !other) return;
    nm_model_info info;
    nm_model_get_info(m, &info);
    nm_error err = {0};
    nm_batch *b = NULL;
    CHECK_INT_EQ(nm_batch_new(m, 0, 16, 1, &b, &err), NM_ERR_INVALID_ARG);
    CHECK(b == NULL);
    CHECK_INT_EQ(nm_batch_new(m, 2, 0, 1, &b, &err), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_batch_new(m, 2, 8, 1, &b, &err), NM_OK);
    nm_session *s0 = open_session(m, 16, NM_KV_F32), *s1 = open_session(m, 4, NM_KV_F32);
    nm_session *s2 = open_session(other, 16, NM_KV_F32), *s3 = open_session(m, 16, NM_KV_F32);
    float *logits = malloc(3 * (size_t)info.n_vocab * sizeof(float));
    CHECK_INT_EQ(nm_session_eval(s1, prompt, 4, NULL, false, &err), NM_OK); /* s1 is full */
    CHECK_INT_EQ(nm_session_eval(s3, prompt, 8, NULL, false, &err), NM_OK); /* past the batch */
    int32_t ids[3] = {prompt[0], prompt[1], prompt[2]};
    nm_session *two_same[2] = {s0, s0}, *full[2] = {s0, s1}, *foreign[2] = {s0, s2};
    nm_session *beyond[2] = {s0, s3}, *three[3] = {s0, s1, s2};
    CHECK_INT_EQ(nm_batch_decode(b, two_same, ids, 2, logits, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "same session") != NULL);
    CHECK_INT_EQ(nm_batch_decode(b, full, ids, 2, logits, &err), NM_ERR_CAPACITY);
    CHECK(strstr(err.msg, "session 1 has no free position") != NULL);
    CHECK_INT_EQ(nm_batch_decode(b, beyond, ids, 2, logits, &err), NM_ERR_CAPACITY);
    CHECK_INT_EQ(nm_batch_decode(b, foreign, ids, 2, logits, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "another model") != NULL);
    CHECK_INT_EQ(nm_batch_decode(b, three, ids, 3, logits, &err), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_batch_decode(b, three, ids, 0, logits, &err), NM_ERR_INVALID_ARG);
    int32_t bad[2] = {prompt[0], info.n_vocab};
    nm_session *ok[2] = {s0, open_session(m, 16, NM_KV_F32)};
    CHECK_INT_EQ(nm_batch_decode(b, ok, bad, 2, logits, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "token id") != NULL);
    CHECK_INT_EQ(nm_session_n_past(s0), 0);
    CHECK_INT_EQ(nm_session_n_past(ok[1]), 0);
    CHECK_INT_EQ(nm_session_n_past(s1), 4);
    CHECK_INT_EQ(nm_batch_decode(b, ok, ids, 2, logits, &err), NM_OK);
    CHECK_INT_EQ(nm_session_n_past(s0), 1);
    CHECK_INT_EQ(nm_session_n_past(ok[1]), 1);
    nm_session_free(ok[1]);
    nm_session_free(s0);
    nm_session_free(s1);
    nm_session_free(s2);
    nm_session_free(s3);
    nm_batch_free(b);
    nm_batch_free(NULL);
    free(logits);
    nm_model_free(m);
    nm_model_free(other);
}

int main(void) {
    int32_t prompt[MAX_IDS];
    const int n =
        nm_test_read_ints(NM_VECTORS_DIR "/tiny-qwen3moe/prompts.txt", 3, prompt, MAX_IDS);
    CHECK(n >= 20);
    if (n < 20) return nm_test_finish("test_batch");
    static const struct {
        const char *label, *path;
    } models[] = {
        {"tiny-qwen3moe", NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf"},
        {"tiny-phimoe", NM_VECTORS_DIR "/tiny-phimoe/model.gguf"},
        {"tiny-qwen3moe Q4_K_M", NM_VECTORS_DIR "/tiny-qwen3moe-q-Q4_K_M/model.gguf"},
        {"shipped", NM_SOURCE_DIR "/models/npumoe-tiny-moe.gguf"},
        {"tiny-qwen2moe", NM_SOURCE_DIR "/tests/vectors/tiny-qwen2moe/model.gguf"},
        {"tiny-deepseek2", NM_SOURCE_DIR "/tests/vectors/tiny-deepseek2/model.gguf"},
        {"tiny-deepseek2-qlora", NM_SOURCE_DIR "/tests/vectors/tiny-deepseek2-qlora/model.gguf"},
    };
    const int n_models = (int)(sizeof models / sizeof models[0]);
    /* the reference kernels first: a model's matrices are laid out for the
     * kernels active when it loads */
    CHECK(nm_kernels_force(NM_KERNELS_REF));
    for (int i = 0; i < n_models; i++)
        compare(models[i].label, models[i].path, prompt, n, 3, true);
    nm_kernels_isa fastest = NM_KERNELS_REF;
    for (int isa = NM_KERNELS_COUNT - 1; isa > NM_KERNELS_REF; isa--)
        if (nm_kernels_isa_supported((nm_kernels_isa)isa)) {
            fastest = (nm_kernels_isa)isa;
            break;
        }
    CHECK(nm_kernels_force(fastest));
    for (int i = 0; i < n_models; i++)
        compare(models[i].label, models[i].path, prompt, n, 3, false);
    /* 16 rows: the quantised kernels may take another path (AMX tiles from
     * 12 rows), whose rounding differs: the tolerance, the same tokens */
    compare(models[2].label, models[2].path, prompt, n, 16, false);
    compare(models[3].label, models[3].path, prompt, n, 16, false);
    refusals(NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf", prompt);
    return nm_test_finish("test_batch");
}
