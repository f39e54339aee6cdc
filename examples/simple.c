/* The smallest complete use of the npumoe library: load a model, tokenize a
 * prompt, generate greedily and print the text (the prompt's, then the
 * generated tokens', as `npumoe run --temp 0` prints them).
 *
 *     simple MODEL.gguf PROMPT N_TOKENS
 *
 * Build against an installed npumoe:
 *     cc simple.c $(pkg-config --cflags --libs --static npumoe) -o simple */
#include <npumoe.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const nm_error *err) {
    fprintf(stderr, "simple: %s: %s\n", what, err->msg);
    return 1;
}

/* Writes the text of one token (control tokens have none). */
static void print_piece(const nm_model *model, int32_t id) {
    char piece[256];
    const int32_t len = nm_token_to_piece(model, id, false, piece, sizeof piece);
    if (len > 0 && len <= (int32_t)sizeof piece) fwrite(piece, 1, (size_t)len, stdout);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT N_TOKENS (npumoe %s)\n", argv[0],
                nm_version());
        return 2;
    }
    const char *path = argv[1], *prompt = argv[2];
    char *end = NULL;
    const long n_predict = strtol(argv[3], &end, 10);
    if (*end || n_predict < 1 || n_predict > 100000) {
        fprintf(stderr, "simple: N_TOKENS '%s' is not a count in 1..100000\n", argv[3]);
        return 2;
    }

    nm_error err = {0};
    nm_model_params mp = nm_model_default_params();
    nm_model *model = NULL;
    if (nm_model_load(path, &mp, &model, &err) != NM_OK) return fail("load", &err);
    nm_model_info info;
    nm_model_get_info(model, &info);

    /* the first call counts the ids (NM_ERR_CAPACITY), the second writes
     * them; add_special: a BOS where the model's vocabulary asks for one */
    const size_t n_bytes = strlen(prompt);
    size_t n_prompt = 0;
    nm_status st = nm_tokenize(model, prompt, n_bytes, true, true, NULL, 0, &n_prompt, &err);
    int32_t *ids = malloc((n_prompt + 1) * sizeof *ids);
    float *logits = malloc((size_t)info.n_vocab * sizeof *logits);
    if (!ids || !logits) {
        fprintf(stderr, "simple: out of memory\n");
        return 1;
    }
    if (st == NM_ERR_CAPACITY)
        st = nm_tokenize(model, prompt, n_bytes, true, true, ids, n_prompt, &n_prompt, &err);
    nm_session *session = NULL;
    nm_sampler *sampler = NULL;
    nm_session_params sp = nm_session_default_params();
    nm_sampler_params smp = nm_sampler_default_params();
    smp.temperature = 0; /* greedy */
    if (st == NM_OK) st = nm_session_new(model, &sp, &session, &err);
    if (st == NM_OK) st = nm_sampler_new(&smp, info.n_vocab, &sampler, &err);
    if (st == NM_OK) {
        for (size_t i = 0; i < n_prompt; i++) {
            nm_sampler_accept(sampler, ids[i]);
            print_piece(model, ids[i]);
        }
        st = nm_session_eval(session, ids, (int32_t)n_prompt, logits, false, &err);
    }
    /* one token at a time until N_TOKENS, the end of the text, or a full context */
    for (long i = 0; st == NM_OK && i < n_predict; i++) {
        const int32_t next = nm_sampler_sample(sampler, logits);
        nm_sampler_accept(sampler, next);
        print_piece(model, next);
        fflush(stdout);
        if (nm_token_is_eog(model, next) || i + 1 == n_predict) break;
        st = nm_session_eval(session, &next, 1, logits, false, &err);
        if (st == NM_ERR_CAPACITY) {
            st = NM_OK;
            break;
        }
    }
    printf("\n");

    int rc = st == NM_OK ? 0 : fail(path, &err);
    nm_sampler_free(sampler);
    nm_session_free(session);
    free(logits);
    free(ids);
    nm_model_free(model);
    return rc;
}
