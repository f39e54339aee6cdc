/* A two-turn chat from a library user's side: the model's chat template
 * (chatml when the file has none), and one session whose KV cache keeps
 * the first turn, so the second turn evaluates only its new tokens.
 *
 *   chat MODEL.gguf [FIRST [SECOND]]   (turns not given are read from stdin,
 *                                       one line each)
 *
 * docs/API.md walks through it. */
#include "npumoe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_ANSWER = 32, MAX_TEXT = 4096, MAX_IDS = 1024 };

static int die(const nm_error *err) {
    fprintf(stderr, "chat: %s\n", err->msg);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: chat MODEL.gguf [FIRST [SECOND]]\n");
        return 2;
    }
    nm_error err = {0};
    nm_model *model = NULL;
    nm_model_params mp = nm_model_default_params();
    if (nm_model_load(argv[1], &mp, &model, &err) != NM_OK) return die(&err);
    nm_model_info info;
    nm_model_get_info(model, &info);
    nm_session *s = NULL;
    nm_session_params sp = nm_session_default_params(); /* dense, F32 cache */
    nm_status st = nm_session_new(model, &sp, &s, &err);
    /* the model's template, or chatml when it has none */
    const char *tmpl = NULL;
    char *text = NULL;
    size_t n_text = 0;
    const nm_chat_message probe = {"user", "?"};
    if (st == NM_OK &&
        nm_chat_apply_template(model, NULL, &probe, 1, true, &text, &n_text, &err) != NM_OK) {
        fprintf(stderr, "chat: %s: using chatml\n", err.msg);
        tmpl = "chatml";
    }
    nm_free(text);

    char turns[2][MAX_TEXT], answers[2][MAX_TEXT];
    nm_chat_message msgs[4];
    size_t n_msgs = 0, cached_len = 0; /* bytes of the conversation in the cache */
    char cached[4 * MAX_TEXT] = "";
    float *logits = malloc((size_t)info.n_vocab * sizeof *logits);
    int32_t ids[MAX_IDS];
    for (int t = 0; st == NM_OK && t < 2; t++) {
        if (argc > 2 + t) {
            snprintf(turns[t], MAX_TEXT, "%s", argv[2 + t]);
        } else if (!fgets(turns[t], MAX_TEXT, stdin)) {
            st = nm_errorf(&err, NM_ERR_INVALID_ARG, "turn %d: no line on standard input", t + 1);
            break;
        }
        turns[t][strcspn(turns[t], "\n")] = '\0';
        msgs[n_msgs++] = (nm_chat_message){"user", turns[t]};
        /* the whole conversation with the generation prompt; what the cache
         * holds is a prefix of it, and only the rest is evaluated */
        st = nm_chat_apply_template(model, tmpl, msgs, n_msgs, true, &text, &n_text, &err);
        if (st != NM_OK) break;
        if (n_text < cached_len || memcmp(text, cached, cached_len) != 0) {
            nm_session_reset(s); /* the template rewrote history: start over */
            cached_len = 0;
        }
        const int32_t kept = nm_session_n_past(s);
        size_t n_ids = 0;
        st = nm_tokenize(model, text + cached_len, n_text - cached_len, cached_len == 0, true, ids,
                         MAX_IDS, &n_ids, &err);
        if (st == NM_OK) st = nm_session_eval(s, ids, (int32_t)n_ids, logits, false, &err);
        if (st == NM_OK && n_text < sizeof cached) memcpy(cached, text, n_text);
        cached_len = n_text;
        nm_free(text);
        /* greedy answer; each token goes into the cache as it is chosen */
        size_t len = 0;
        for (int i = 0; st == NM_OK && i < N_ANSWER; i++) {
            int32_t next = nm_argmax(logits, info.n_vocab);
            if (nm_token_is_eog(model, next)) break;
            int32_t k = nm_token_to_piece(model, next, false, answers[t] + len, MAX_TEXT - len - 1);
            if (k > 0 && (size_t)k < MAX_TEXT - len - 1) len += (size_t)k;
            st = nm_session_eval(s, &next, 1, logits, false, &err);
        }
        answers[t][len] = '\0';
        if (st != NM_OK) break;
        if (cached_len + len < sizeof cached) memcpy(cached + cached_len, answers[t], len);
        cached_len += len;
        msgs[n_msgs++] = (nm_chat_message){"assistant", answers[t]};
        printf("turn %d: kept %d cached positions, evaluated %zu new tokens\n", t + 1, kept, n_ids);
        printf("user: %s\nassistant: %s\n", turns[t], answers[t]);
    }
    free(logits);
    nm_session_free(s);
    nm_model_free(model);
    return st == NM_OK ? 0 : die(&err);
}
