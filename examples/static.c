/* The static path from a library user's side: calibrate a model on a text,
 * profile the cpu device, make a plan, then run a prompt greedily with the
 * plan on that device in npumoe mode, and once more dense (host only) to
 * compare. Spill (the default overflow) computes what exceeds a capacity on
 * the host, so the text must be dense's.
 *
 *   static MODEL.gguf TEXT.txt [PROMPT]
 *
 * Exit status 0 when the two texts agree. docs/API.md walks through it. */
#include "npumoe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CHUNK = 64, N_GEN = 24, MAX_IDS = 1 << 20 };

static int die(const nm_error *err) {
    fprintf(stderr, "static: %s\n", err->msg);
    return 1;
}

/* Greedy: the prompt, then N_GEN tokens (or up to an end-of-generation
 * token), their text into out[cap]; the session's metrics into m. */
static nm_status generate(const nm_model *model, const nm_session_params *sp, const int32_t *ids,
                          size_t n, char *out, size_t cap, nm_session_metrics *m, nm_error *err) {
    nm_model_info info;
    nm_model_get_info(model, &info);
    nm_session *s = NULL;
    nm_status st = nm_session_new(model, sp, &s, err);
    float *logits = malloc((size_t)info.n_vocab * sizeof *logits);
    if (st == NM_OK && !logits) st = nm_errorf(err, NM_ERR_NOMEM, "out of memory");
    if (st == NM_OK) st = nm_session_eval(s, ids, (int32_t)n, logits, false, err);
    size_t len = 0;
    for (int i = 0; st == NM_OK && i < N_GEN; i++) {
        int32_t next = nm_argmax(logits, info.n_vocab);
        if (nm_token_is_eog(model, next)) break;
        int32_t k = nm_token_to_piece(model, next, false, out + len, cap - len - 1);
        if (k > 0 && (size_t)k < cap - len - 1) len += (size_t)k;
        st = nm_session_eval(s, &next, 1, logits, false, err);
    }
    out[len] = '\0';
    if (st == NM_OK) nm_session_get_metrics(s, m);
    free(logits);
    nm_session_free(s); /* m->layers is not used after this */
    return st;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: static MODEL.gguf TEXT.txt [PROMPT]\n");
        return 2;
    }
    const char *prompt = argc > 3 ? argv[3] : "And God said unto Moses, Go in unto Pharaoh, and";
    nm_error err = {0};
    nm_model *model = NULL;
    nm_model_params mp = nm_model_default_params();
    if (nm_model_load(argv[1], &mp, &model, &err) != NM_OK) return die(&err);

    /* 1. calibration: the expert loads of the text's chunks */
    FILE *f = fopen(argv[2], "rb");
    char *text = malloc(MAX_IDS);
    size_t n_text = f && text ? fread(text, 1, MAX_IDS, f) : 0;
    if (f) fclose(f);
    int32_t *ids = malloc(MAX_IDS * sizeof *ids);
    size_t n_ids = 0;
    nm_calib *calib = NULL;
    nm_calib_params cp = nm_calib_default_params();
    cp.chunk = CHUNK;
    nm_status st = n_text && ids ? NM_OK : nm_errorf(&err, NM_ERR_IO, "cannot read %s", argv[2]);
    if (st == NM_OK) st = nm_tokenize(model, text, n_text, true, false, ids, MAX_IDS, &n_ids, &err);
    if (st == NM_OK) st = nm_calib_make(model, ids, n_ids, &cp, &calib, &err);
    free(text);

    /* 2. the device and what it costs; 3. the plan */
    nm_device *dev = NULL;
    nm_device_params dp = nm_device_default_params(); /* "cpu", one worker thread */
    nm_profile prof = {0};
    nm_profile_params pp = nm_profile_default_params();
    pp.chunk = CHUNK;
    nm_plan *plan = NULL;
    if (st == NM_OK) st = nm_device_open(&dp, &dev, &err);
    if (st == NM_OK) st = nm_profile_measure(model, dev, &pp, &prof, &err);
    if (st == NM_OK) st = nm_plan_create(model, calib, &prof, NULL, &plan, &err);

    /* 4. the prompt, dense and with the plan */
    char dense_text[1024], static_text[1024];
    nm_session_metrics dm, sm;
    size_t n_prompt = 0;
    if (st == NM_OK)
        st = nm_tokenize(model, prompt, strlen(prompt), true, false, ids, MAX_IDS, &n_prompt, &err);
    nm_session_params sp = nm_session_default_params();
    if (st == NM_OK)
        st = generate(model, &sp, ids, n_prompt, dense_text, sizeof dense_text, &dm, &err);
    sp.mode = NM_MODE_NPUMOE;
    sp.plan = plan;
    sp.device = dev; /* n_batch 0: the plan's chunk */
    if (st == NM_OK)
        st = generate(model, &sp, ids, n_prompt, static_text, sizeof static_text, &sm, &err);
    if (st == NM_OK) {
        nm_calib_info ci;
        nm_plan_info pi;
        nm_calib_get_info(calib, &ci);
        nm_plan_get_info(plan, &pi);
        const nm_moe_layer_metrics *t = &sm.total;
        printf("calibration: %lld chunks of %d tokens\n", (long long)ci.n_chunks, ci.chunk);
        printf("plan: device %s, predicted overflow %.2f%% of assignments (%s)\n", pi.device,
               100.0 * pi.predicted_drop_rate, nm_overflow_name(pi.overflow));
        printf("%s: %s%s\n", nm_mode_name(sm.mode), prompt, static_text);
        printf("dense: %s%s\n", prompt, dense_text);
        printf("static path: %llu chunks, %llu dispatches, %llu of %llu reserved rows filled, "
               "%llu of %llu assignments spilled, %llu dropped, %llu graphs compiled\n",
               (unsigned long long)t->chunks, (unsigned long long)t->dispatches,
               (unsigned long long)t->device_rows, (unsigned long long)t->reserved_rows,
               (unsigned long long)t->spilled, (unsigned long long)t->assignments,
               (unsigned long long)t->dropped, (unsigned long long)sm.device.graphs_compiled);
        printf("greedy text equals dense: %s\n", strcmp(dense_text, static_text) ? "no" : "yes");
    }
    nm_plan_free(plan);
    nm_profile_free(&prof);
    nm_device_close(dev); /* after the sessions that used it */
    nm_calib_free(calib);
    nm_model_free(model);
    free(ids);
    if (st != NM_OK) return die(&err);
    return strcmp(dense_text, static_text) != 0;
}
