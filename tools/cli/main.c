/* The npumoe command: parses options (options.c), calls the library, prints.
 * Every failure is one line on stderr and exit status 1. */
#include "options.h"

#include "engine/engine.h"
#include "npumoe.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "npumoe: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 1;
}

static int fail_err(const nm_error *err) { return fail("%s%s", err->msg, ""); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reads a whole file into a NUL-terminated buffer. */
static char *read_text_file(const char *path, size_t *n_bytes, nm_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err->msg, sizeof err->msg, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            buf = NULL;
        } else {
            buf = bigger;
            cap *= 2;
        }
    }
    bool bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        snprintf(err->msg, sizeof err->msg, "cannot read '%s'", path);
        return NULL;
    }
    buf[n] = 0;
    *n_bytes = n;
    return buf;
}

/* Parses "ID ID ..." into ids (caller frees); each id must be in [0, n_vocab). */
static int32_t *parse_token_list(const char *text, int32_t n_vocab, size_t *n_out, nm_error *err) {
    size_t cap = 64, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = text;
    while (ids) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ',')
            p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= n_vocab ||
            (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != ',')) {
            snprintf(err->msg, sizeof err->msg, "--tokens: '%.20s' is not a token id in 0..%d", p,
                     n_vocab - 1);
            free(ids);
            return NULL;
        }
        if (n == cap) {
            int32_t *bigger = realloc(ids, 2 * cap * sizeof *ids);
            if (!bigger) break;
            ids = bigger;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!ids || n == 0) {
        snprintf(err->msg, sizeof err->msg, "--tokens: no token ids given");
        free(ids);
        return NULL;
    }
    *n_out = n;
    return ids;
}

/* The prompt of -p, -f or --tokens as ids (caller frees). */
static int32_t *prompt_ids(const nm_model *model, const cli_options *o, size_t *n_out,
                           nm_error *err) {
    int given = (o->prompt != NULL) + (o->file != NULL) + (o->tokens != NULL);
    if (given != 1) {
        snprintf(err->msg, sizeof err->msg,
                 given ? "give only one of -p, -f and --tokens"
                       : "no prompt: give -p, -f or --tokens");
        return NULL;
    }
    nm_model_info info;
    nm_model_get_info(model, &info);
    if (o->tokens) return parse_token_list(o->tokens, info.n_vocab, n_out, err);
    size_t n_bytes = 0;
    char *owned = NULL;
    const char *text = o->prompt;
    if (o->file) {
        owned = read_text_file(o->file, &n_bytes, err);
        if (!owned) return NULL;
        text = owned;
    } else {
        n_bytes = strlen(text);
    }
    size_t n = 0;
    nm_status st =
        nm_tokenize(model, text, n_bytes, info.add_bos, !o->no_special, NULL, 0, &n, err);
    int32_t *ids = NULL;
    if (st == NM_ERR_CAPACITY || st == NM_OK) {
        ids = malloc((n ? n : 1) * sizeof *ids);
        st = ids ? nm_tokenize(model, text, n_bytes, info.add_bos, !o->no_special, ids, n, &n, err)
                 : NM_ERR_NOMEM;
        if (!ids) snprintf(err->msg, sizeof err->msg, "out of memory for %zu tokens", n);
    }
    free(owned);
    if (st != NM_OK) {
        free(ids);
        return NULL;
    }
    if (n == 0) {
        snprintf(err->msg, sizeof err->msg, "the prompt is empty");
        free(ids);
        return NULL;
    }
    *n_out = n;
    return ids;
}

static int cmd_info(nm_model *model, const cli_options *o) {
    (void)o;
    nm_model_describe(model, stdout);
    return 0;
}

static int cmd_tokenize(nm_model *model, const cli_options *o) {
    nm_error err = {0};
    if (o->tokens) return fail("tokenize takes -p or -f, not --tokens%s", "", "");
    size_t n = 0;
    int32_t *ids = prompt_ids(model, o, &n, &err);
    if (!ids && strcmp(err.msg, "the prompt is empty") != 0) return fail_err(&err);
    for (size_t i = 0; i < n; i++)
        printf("%s%" PRId32, i ? " " : "", ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

static nm_status open_session(nm_model *model, const cli_options *o, nm_session **s,
                              nm_error *err) {
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = o->ctx;
    sp.n_batch = o->batch;
    sp.n_threads = o->threads;
    return nm_session_new(model, &sp, s, err);
}

static int cmd_logits(nm_model *model, const cli_options *o) {
    nm_error err = {0};
    if (!o->output) return fail("logits needs -o FILE%s%s", "", "");
    size_t n = 0;
    int32_t *ids = prompt_ids(model, o, &n, &err);
    if (!ids) return fail_err(&err);
    nm_model_info info;
    nm_model_get_info(model, &info);
    cli_options oo = *o;
    if (oo.ctx == 0 && n > 4096) oo.ctx = (int32_t)n; /* a long prompt gets the room it needs */
    nm_session *s = NULL;
    nm_status st = open_session(model, &oo, &s, &err);
    size_t n_rows = o->all ? n : 1;
    float *logits = st == NM_OK ? malloc(n_rows * (size_t)info.n_vocab * sizeof(float)) : NULL;
    if (st == NM_OK && !logits)
        st = NM_ERR_NOMEM, snprintf(err.msg, sizeof err.msg, "out of memory for logits");
    if (st == NM_OK) st = nm_session_eval(s, ids, (int32_t)n, logits, o->all, &err);
    int rc = 0;
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        FILE *f = fopen(o->output, "wb");
        if (!f) {
            rc = fail("cannot create '%s': %s", o->output, strerror(errno));
        } else {
            size_t count = n_rows * (size_t)info.n_vocab;
            bool ok = fwrite(logits, sizeof(float), count, f) == count;
            ok &= fclose(f) == 0;
            if (!ok) rc = fail("cannot write '%s'%s", o->output, "");
        }
    }
    free(logits);
    free(ids);
    nm_session_free(s);
    return rc;
}

/* ---- run ---- */

/* Writes s as a JSON string; bytes that are not valid UTF-8 become U+FFFD. */
static void json_string(FILE *f, const unsigned char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c < 0x80) {
            if (c == '"' || c == '\\')
                fprintf(f, "\\%c", c);
            else if (c == '\n')
                fputs("\\n", f);
            else if (c == '\t')
                fputs("\\t", f);
            else if (c == '\r')
                fputs("\\r", f);
            else if (c < 0x20 || c == 0x7f)
                fprintf(f, "\\u%04x", c);
            else
                fputc((int)c, f);
            i++;
            continue;
        }
        size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
        uint32_t cp = len == 4 ? c & 7 : len == 3 ? c & 15 : c & 31;
        bool ok = len >= 2 && c <= 0xf4 && i + len <= n;
        for (size_t j = 1; ok && j < len; j++) {
            ok = (s[i + j] & 0xc0) == 0x80;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
        if (ok && cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff)) {
            fwrite(s + i, 1, len, f);
            i += len;
        } else {
            fputs("\xef\xbf\xbd", f);
            i++;
        }
    }
    fputc('"', f);
}

static void json_ids(FILE *f, const int32_t *ids, size_t n) {
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%" PRId32, i ? "," : "", ids[i]);
    fputc(']', f);
}

typedef struct run_result {
    int32_t *generated; /* [n_generated] */
    size_t n_generated;
    char *text; /* generated bytes */
    size_t text_len, text_cap;
    const char *stop; /* "eos", "length" or "context" */
    double ttft_s, prefill_s, decode_s;
} run_result;

static bool append_text(run_result *r, const char *bytes, size_t n) {
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = (r->text_cap + n + 1) * 2;
        char *bigger = realloc(r->text, cap);
        if (!bigger) return false;
        r->text = bigger;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, bytes, n);
    r->text_len += n;
    return true;
}

static nm_status generate(nm_model *model, nm_session *s, nm_sampler *sampler, const int32_t *ids,
                          size_t n_prompt, const cli_options *o, run_result *r, nm_error *err) {
    nm_model_info info;
    nm_model_get_info(model, &info);
    float *logits = malloc((size_t)info.n_vocab * sizeof(float));
    r->generated = malloc(((size_t)o->n_predict + 1) * sizeof(int32_t));
    if (!logits || !r->generated) {
        free(logits);
        return NM_ERR_NOMEM;
    }
    for (size_t i = 0; i < n_prompt; i++)
        nm_sampler_accept(sampler, ids[i]);
    r->stop = "length";
    const double t0 = now_s();
    nm_status st =
        nm_session_eval(s, ids, (int32_t)n_prompt, o->n_predict > 0 ? logits : NULL, false, err);
    r->prefill_s = now_s() - t0;
    const double t_decode = now_s();
    char piece[256];
    for (int32_t i = 0; st == NM_OK && i < o->n_predict; i++) {
        int32_t next = nm_sampler_sample(sampler, logits);
        if (i == 0) r->ttft_s = now_s() - t0;
        nm_sampler_accept(sampler, next);
        r->generated[r->n_generated++] = next;
        int32_t len = nm_token_to_piece(model, next, false, piece, sizeof piece);
        if (len > (int32_t)sizeof piece) len = 0; /* no token is that long in practice */
        if (len > 0) {
            if (!append_text(r, piece, (size_t)len)) {
                st = NM_ERR_NOMEM;
                break;
            }
            if (!o->json) {
                fwrite(piece, 1, (size_t)len, stdout);
                fflush(stdout);
            }
        }
        if (nm_token_is_eog(model, next)) {
            r->stop = "eos";
            break;
        }
        if (i + 1 == o->n_predict) break;
        st = nm_session_eval(s, &next, 1, logits, false, err);
        if (st == NM_ERR_CAPACITY) {
            r->stop = "context";
            st = NM_OK;
            break;
        }
    }
    r->decode_s = now_s() - t_decode;
    free(logits);
    return st;
}

static int cmd_run(nm_model *model, const cli_options *o) {
    nm_error err = {0};
    size_t n = 0;
    int32_t *ids = prompt_ids(model, o, &n, &err);
    if (!ids) return fail_err(&err);
    nm_model_info info;
    nm_model_get_info(model, &info);
    nm_sampler_params spp = nm_sampler_default_params();
    spp.temperature = o->temperature;
    spp.top_k = o->top_k;
    spp.top_p = o->top_p;
    spp.min_p = o->min_p;
    spp.repeat_penalty = o->repeat_penalty;
    spp.repeat_last_n = o->repeat_last_n;
    spp.seed = o->seed;
    nm_sampler *sampler = NULL;
    nm_session *s = NULL;
    run_result r = {0};
    nm_status st = nm_sampler_new(&spp, info.n_vocab, &sampler, &err);
    if (st == NM_OK) st = open_session(model, o, &s, &err);
    if (st == NM_OK) st = generate(model, s, sampler, ids, n, o, &r, &err);
    int rc = 0;
    if (st != NM_OK) {
        if (st == NM_ERR_NOMEM && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "out of memory");
        rc = fail_err(&err);
    } else {
        const double prefill_tps = r.prefill_s > 0 ? (double)n / r.prefill_s : 0;
        const size_t n_decoded = r.n_generated > 0 ? r.n_generated - 1 : 0;
        const double decode_tps = r.decode_s > 0 && n_decoded ? (double)n_decoded / r.decode_s : 0;
        const double peak_mib = (double)nm_peak_rss_bytes() / 1048576.0;
        if (o->json) {
            printf("{\"prompt_tokens\":%zu,\"generated_tokens\":%zu,\"ttft_ms\":%.3f,"
                   "\"prefill_tokens_per_s\":%.3f,\"decode_tokens_per_s\":%.3f,"
                   "\"peak_rss_mib\":%.1f,\"stop\":\"%s\",\"text\":",
                   n, r.n_generated, r.ttft_s * 1e3, prefill_tps, decode_tps, peak_mib, r.stop);
            json_string(stdout, (const unsigned char *)r.text, r.text_len);
            printf(",\"prompt_ids\":");
            json_ids(stdout, ids, n);
            printf(",\"generated_ids\":");
            json_ids(stdout, r.generated, r.n_generated);
            printf("}\n");
        } else {
            printf("\n");
            fflush(stdout);
            fprintf(stderr, "prompt tokens:   %zu\n", n);
            fprintf(stderr, "generated:       %zu tokens (stop: %s)\n", r.n_generated, r.stop);
            fprintf(stderr, "TTFT:            %.2f ms\n", r.ttft_s * 1e3);
            fprintf(stderr, "prefill:         %.2f tokens/s\n", prefill_tps);
            fprintf(stderr, "decode:          %.2f tokens/s\n", decode_tps);
            fprintf(stderr, "peak memory:     %.1f MiB\n", peak_mib);
        }
    }
    free(r.generated);
    free(r.text);
    free(ids);
    nm_session_free(s);
    nm_sampler_free(sampler);
    return rc;
}

/* ---- perplexity and compare ---- */

typedef struct progress_state {
    double t0;
    bool compare;
} progress_state;

static void print_progress(void *p, int32_t done, int32_t total, const nm_accuracy *acc) {
    const progress_state *ps = p;
    if (done == 0) {
        fprintf(stderr,
                "scoring %d windows of %d tokens; the second half of each window is scored, "
                "as llama.cpp's llama-perplexity does\n",
                total, acc->n_ctx);
        return;
    }
    const double elapsed = now_s() - ps->t0;
    fprintf(stderr, "[%d/%d] ppl %.4f", done, total, nm_nll_stats_ppl(&acc->ref));
    if (ps->compare)
        fprintf(stderr, ", candidate %.4f, mean KL %.6f, top-1 %.2f%%",
                nm_nll_stats_ppl(&acc->cand), acc->kl_sum / (double)acc->cand.count,
                100.0 * (double)acc->top1_same / (double)acc->cand.count);
    fprintf(stderr, " (%.1f s, ~%.0f s left)\n", elapsed, elapsed / done * (total - done));
}

static int cmd_score(nm_model *model, const cli_options *o, bool compare) {
    nm_error err = {0};
    size_t n = 0;
    int32_t *ids = prompt_ids(model, o, &n, &err);
    if (!ids) return fail_err(&err);
    nm_model_info info;
    nm_model_get_info(model, &info);
    const int32_t n_ctx = o->ctx ? o->ctx : 512;
    cli_options ro = *o;
    ro.ctx = n_ctx;
    nm_model *cand_model = NULL;
    nm_session *ref = NULL, *cand = NULL;
    nm_status st = open_session(model, &ro, &ref, &err);
    if (st == NM_OK && compare && o->cand_model) {
        nm_model_params mp = nm_model_default_params();
        st = nm_model_load(o->cand_model, &mp, &cand_model, &err);
    }
    if (st == NM_OK && compare) {
        cli_options co = ro;
        if (o->cand_threads) co.threads = o->cand_threads;
        if (o->cand_batch) co.batch = o->cand_batch;
        st = open_session(cand_model ? cand_model : model, &co, &cand, &err);
    }
    nm_accuracy acc;
    progress_state ps = {.t0 = now_s(), .compare = compare};
    if (st == NM_OK) {
        st = nm_score_text(ref, cand, ids, n, n_ctx, info.add_bos ? info.bos_id : -1,
                           print_progress, &ps, &acc, &err);
    }
    int rc = 0;
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        const double seconds = now_s() - ps.t0;
        const double ppl = nm_nll_stats_ppl(&acc.ref), ppl_err = nm_nll_stats_ppl_err(&acc.ref);
        const double cppl = nm_nll_stats_ppl(&acc.cand), cppl_err = nm_nll_stats_ppl_err(&acc.cand);
        const double scored = (double)acc.ref.count;
        if (o->json) {
            printf("{\"n_ctx\":%d,\"windows\":%d,\"tokens_scored\":%" PRIu64
                   ",\"perplexity\":%.6f,\"perplexity_err\":%.6f",
                   n_ctx, acc.n_windows, acc.ref.count, ppl, ppl_err);
            if (compare)
                printf(",\"candidate_perplexity\":%.6f,\"candidate_perplexity_err\":%.6f,"
                       "\"ppl_change_percent\":%.6f,\"kl_mean\":%.9f,\"kl_max\":%.9f,"
                       "\"top1_agreement\":%.6f",
                       cppl, cppl_err, 100.0 * (cppl / ppl - 1.0), acc.kl_sum / scored, acc.kl_max,
                       (double)acc.top1_same / scored);
            printf(",\"seconds\":%.3f}\n", seconds);
        } else if (compare) {
            printf("reference perplexity: %.4f +/- %.5f\n", ppl, ppl_err);
            printf("candidate perplexity: %.4f +/- %.5f\n", cppl, cppl_err);
            printf("perplexity change:    %+.4f%%\n", 100.0 * (cppl / ppl - 1.0));
            printf("KL divergence:        mean %.6f, max %.6f (nats, candidate from reference)\n",
                   acc.kl_sum / scored, acc.kl_max);
            printf("top-1 agreement:      %.4f%% of %" PRIu64 " scored positions\n",
                   100.0 * (double)acc.top1_same / scored, acc.ref.count);
        } else {
            printf("perplexity: %.4f +/- %.5f\n", ppl, ppl_err);
        }
    }
    free(ids);
    nm_session_free(ref);
    nm_session_free(cand);
    nm_model_free(cand_model);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        cli_print_help(argc < 2 ? stderr : stdout, 0);
        return argc < 2 ? 1 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("npumoe 0.1.0\n");
        return 0;
    }
    const int cmd = cli_command_from_name(argv[1]);
    if (!cmd) return fail("unknown command '%s' (see npumoe --help)%s", argv[1], "");
    cli_options o;
    char msg[256];
    if (!cli_parse(cmd, argc, argv, 2, &o, msg, sizeof msg)) return fail("%s%s", msg, "");
    if (o.help) {
        cli_print_help(stdout, cmd);
        return 0;
    }
    if (!o.model) return fail("no model: give -m FILE%s%s", "", "");
    nm_model *model = NULL;
    nm_error err = {0};
    nm_model_params mp = nm_model_default_params();
    if (nm_model_load(o.model, &mp, &model, &err) != NM_OK) return fail_err(&err);
    int rc = 1;
    switch (cmd) {
    case CMD_INFO:
        rc = cmd_info(model, &o);
        break;
    case CMD_TOKENIZE:
        rc = cmd_tokenize(model, &o);
        break;
    case CMD_RUN:
        rc = cmd_run(model, &o);
        break;
    case CMD_LOGITS:
        rc = cmd_logits(model, &o);
        break;
    case CMD_PERPLEXITY:
        rc = cmd_score(model, &o, false);
        break;
    case CMD_COMPARE:
        rc = cmd_score(model, &o, true);
        break;
    }
    nm_model_free(model);
    return rc;
}
