/* npumoe bench -p N -n N: llama-bench's throughput tests. pp N evaluates N
 * random tokens into an empty cache in batches of -b (default 512); tg N
 * evaluates N tokens one at a time into an empty cache. Each test runs once
 * to warm up, then -r times (default 5); the report gives the median, min and
 * max tokens/s, as a table or, with --json, one JSON array. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

enum { MAX_REPS = 1000 };

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct tp_test {
    char name[32];       /* "pp512", "tg128" */
    int32_t n_prompt;    /* tokens of the pp test, 0 for tg */
    int32_t n_gen;       /* tokens of the tg test, 0 for pp */
    double ts[MAX_REPS]; /* tokens/s of each repetition, sorted at the end */
} tp_test;

/* One repetition: tokens/s. Like llama-bench, every eval computes the last
 * token's logits (the output matrix is part of the cost). */
static nm_status run_once(nm_session *s, const tp_test *t, const int32_t *ids, int32_t n_batch,
                          float *logits, double *ts, nm_error *err) {
    nm_session_reset(s);
    nm_status st = NM_OK;
    const double t0 = now_s();
    if (t->n_prompt) {
        for (int32_t i = 0; i < t->n_prompt && st == NM_OK; i += n_batch) {
            const int32_t n = t->n_prompt - i < n_batch ? t->n_prompt - i : n_batch;
            st = nm_session_eval(s, ids + i, n, logits, false, err);
        }
    } else {
        for (int32_t i = 0; i < t->n_gen && st == NM_OK; i++)
            st = nm_session_eval(s, ids + i, 1, logits, false, err);
    }
    const double dt = now_s() - t0;
    const int32_t n = t->n_prompt ? t->n_prompt : t->n_gen;
    *ts = dt > 0 ? (double)n / dt : 0.0;
    return st;
}

int cmd_bench_throughput(nm_model *model, const cli_options *o) {
    nm_error err = {0};
    const int reps = o->reps ? o->reps : 5;
    if (reps > MAX_REPS) return fail("at most %s repetitions%s", "1000", "");
    if (o->mode || o->plan || o->lengths || o->modes)
        return fail("-p/-n measure the dense engine: they take no --mode, --plan, --lengths or "
                    "--modes%s%s",
                    "", "");
    if (o->n_prompt <= 0 && o->n_gen <= 0)
        return fail("nothing to measure: -p and -n are both 0 or absent%s%s", "", "");
    tp_test tests[2];
    int n_tests = 0;
    if (o->n_prompt > 0) {
        memset(&tests[n_tests], 0, sizeof tests[0]);
        snprintf(tests[n_tests].name, sizeof tests[0].name, "pp%d", o->n_prompt);
        tests[n_tests++].n_prompt = o->n_prompt;
    }
    if (o->n_gen > 0) {
        memset(&tests[n_tests], 0, sizeof tests[0]);
        snprintf(tests[n_tests].name, sizeof tests[0].name, "tg%d", o->n_gen);
        tests[n_tests++].n_gen = o->n_gen;
    }
    nm_model_info info;
    nm_model_get_info(model, &info);
    const int32_t n_max = o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen;
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = o->ctx ? o->ctx : n_max;
    sp.n_batch = o->batch ? o->batch : 512;
    sp.n_threads = o->threads;
    if (parse_kv_type(o, &sp.kv_type, &err) != NM_OK) return fail_err(&err);
    if (sp.n_ctx < n_max) return fail("--ctx is smaller than the longest test%s%s", "", "");
    /* random tokens, as llama-bench uses */
    int32_t *ids = malloc((size_t)n_max * sizeof *ids);
    float *logits = malloc((size_t)info.n_vocab * sizeof *logits); /* [n_vocab] */
    if (!ids || !logits) {
        free(ids);
        free(logits);
        return fail("out of memory%s%s", "", "");
    }
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (int32_t i = 0; i < n_max; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        ids[i] = (int32_t)(r % (uint64_t)info.n_vocab);
    }
    nm_session *s = NULL;
    nm_status st = nm_session_new(model, &sp, &s, &err);
    const int n_threads = o->threads ? o->threads : nm_cpu_count();
    const int32_t n_batch = sp.n_batch < sp.n_ctx ? sp.n_batch : sp.n_ctx;
    for (int ti = 0; ti < n_tests && st == NM_OK; ti++) {
        double warm;
        st = run_once(s, &tests[ti], ids, n_batch, logits, &warm, &err);
        for (int rep = 0; rep < reps && st == NM_OK; rep++)
            st = run_once(s, &tests[ti], ids, n_batch, logits, &tests[ti].ts[rep], &err);
        qsort(tests[ti].ts, (size_t)reps, sizeof(double), cmp_double);
    }
    const double state_mib = s ? (double)nm_session_bytes(s) / 1048576.0 : 0.0;
    nm_session_free(s);
    free(ids);
    free(logits);
    if (st != NM_OK) return fail_err(&err);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double peak_mib = (double)ru.ru_maxrss / 1024.0;
    const char *kernels = nm_kernels_variant();
    if (o->json) {
        json_t *doc = json_array();
        for (int ti = 0; doc && ti < n_tests; ti++) {
            const tp_test *t = &tests[ti];
            const double med =
                reps % 2 ? t->ts[reps / 2] : 0.5 * (t->ts[reps / 2 - 1] + t->ts[reps / 2]);
            json_t *samples = json_array();
            for (int i = 0; samples && i < reps; i++)
                if (json_array_append_new(samples, json_fixed(t->ts[i], 3)) != 0) {
                    json_decref(samples);
                    samples = NULL;
                }
            json_t *one = json_pack(
                "{s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o}", "test",
                t->name, "n_prompt", t->n_prompt, "n_gen", t->n_gen, "threads", n_threads,
                "n_batch", n_batch, "reps", reps, "kernels", kernels, "kv_type",
                sp.kv_type == NM_KV_F16 ? "f16" : "f32", "tokens_per_s", json_fixed(med, 3),
                "tokens_per_s_min", json_fixed(t->ts[0], 3), "tokens_per_s_max",
                json_fixed(t->ts[reps - 1], 3), "samples_ts", samples, "peak_rss_mib",
                json_fixed(peak_mib, 1), "state_mib", json_fixed(state_mib, 1));
            if (json_array_append_new(doc, one) != 0) {
                json_decref(doc);
                doc = NULL;
            }
        }
        return print_json(stdout, doc, JSON_INDENT(2));
    }
    printf("| model | kernels | threads | test | t/s (median) | min - max |\n");
    printf("|---|---|---:|---|---:|---:|\n");
    for (int ti = 0; ti < n_tests; ti++) {
        const tp_test *t = &tests[ti];
        const double med =
            reps % 2 ? t->ts[reps / 2] : 0.5 * (t->ts[reps / 2 - 1] + t->ts[reps / 2]);
        printf("| %s | %s | %d | %s | %.2f | %.2f - %.2f |\n", o->model, kernels, n_threads,
               t->name, med, t->ts[0], t->ts[reps - 1]);
    }
    printf("\n%d repetitions after one warm-up; peak RSS %.1f MiB (session state with the KV "
           "cache %.1f MiB)\n",
           reps, peak_mib, state_mib);
    return 0;
}
