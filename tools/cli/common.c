/* Helpers shared by the command's subcommands: one-line failures, reading
 * prompts (text, files, token lists), opening sessions from options. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "npumoe: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 1;
}

int fail_err(const nm_error *err) { return fail("%s%s", err->msg, ""); }

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reads a whole file into a NUL-terminated buffer. */
double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

void print_metrics_text(FILE *f, const nm_session_metrics *m) {
    const nm_moe_layer_metrics *t = &m->total;
    fprintf(f, "MoE mode:        %s\n", nm_mode_name(m->mode));
    if (m->mode == NM_MODE_DENSE) return;
    fprintf(f, "dispatches:      %llu (%.1f per layer per chunk), %llu graphs compiled\n",
            (unsigned long long)t->dispatches, ratio(t->dispatches, t->chunks),
            (unsigned long long)m->device.graphs_compiled);
    fprintf(f, "padding waste:   %.2f%% of %llu reserved rows\n",
            100.0 * ratio(t->reserved_rows - t->device_rows, t->reserved_rows),
            (unsigned long long)t->reserved_rows);
    fprintf(f, "drop rate:       %.3f%% of %llu assignments\n",
            100.0 * ratio(t->dropped, t->assignments), (unsigned long long)t->assignments);
    fprintf(f, "spill rate:      %.3f%%\n", 100.0 * ratio(t->spilled, t->assignments));
    if (t->dropped)
        fprintf(f, "dropped weight:  %.3f%% of the routing weight\n",
                100.0 * (t->weight > 0 ? t->dropped_weight / t->weight : 0.0));
    fprintf(f, "device busy:     %.2f ms; host waited %.2f ms; host experts %.2f ms\n",
            (double)m->device.busy_ns * 1e-6, (double)t->wait_ns * 1e-6, (double)t->host_ns * 1e-6);
}

void print_overflow_prediction(FILE *f, const nm_plan *plan, const nm_moe_layer_metrics *t) {
    nm_plan_info pi;
    nm_plan_get_info(plan, &pi);
    const bool drop = pi.overflow == NM_OVERFLOW_DROP;
    fprintf(f,
            "%s rate:    predicted %.3f%% (the plan, on its calibration), measured %.3f%% of "
            "assignments\n",
            drop ? "drop " : "spill", 100.0 * pi.predicted_drop_rate,
            100.0 * ratio(t->dropped + t->spilled, t->assignments));
    if (drop)
        fprintf(f, "dropped weight:  predicted %.3f%%, measured %.3f%% of the routing weight\n",
                100.0 * pi.predicted_drop_weight,
                100.0 * (t->weight > 0 ? t->dropped_weight / t->weight : 0.0));
}

static void layer_json(FILE *f, const nm_moe_layer_metrics *l) {
    fprintf(f,
            "{\"chunks\":%llu,\"assignments\":%llu,\"dropped\":%llu,\"spilled\":%llu,"
            "\"host_rows\":%llu,\"device_rows\":%llu,\"reserved_rows\":%llu,\"dispatches\":%llu,"
            "\"padding_waste\":%.6f,\"drop_rate\":%.6f,\"spill_rate\":%.6f,"
            "\"dropped_weight\":%.6f,\"host_ms\":%.3f,\"wait_ms\":%.3f}",
            (unsigned long long)l->chunks, (unsigned long long)l->assignments,
            (unsigned long long)l->dropped, (unsigned long long)l->spilled,
            (unsigned long long)l->host_rows, (unsigned long long)l->device_rows,
            (unsigned long long)l->reserved_rows, (unsigned long long)l->dispatches,
            ratio(l->reserved_rows - l->device_rows, l->reserved_rows),
            ratio(l->dropped, l->assignments), ratio(l->spilled, l->assignments),
            l->weight > 0 ? l->dropped_weight / l->weight : 0.0, (double)l->host_ns * 1e-6,
            (double)l->wait_ns * 1e-6);
}

void print_metrics_json(FILE *f, const nm_session_metrics *m) {
    fprintf(f, "{\"mode\":\"%s\",\"device_busy_ms\":%.3f,\"graphs_compiled\":%llu,\"total\":",
            nm_mode_name(m->mode), (double)m->device.busy_ns * 1e-6,
            (unsigned long long)m->device.graphs_compiled);
    layer_json(f, &m->total);
    fprintf(f, ",\"layers\":[");
    for (int32_t l = 0; l < m->n_layer; l++) {
        if (l) fputc(',', f);
        layer_json(f, &m->layers[l]);
    }
    fprintf(f, "]}");
}

char *read_text_file(const char *path, size_t *n_bytes, nm_error *err) {
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
int32_t *parse_token_list(const char *text, int32_t n_vocab, size_t *n_out, nm_error *err) {
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
int32_t *prompt_ids(const nm_model *model, const cli_options *o, size_t *n_out, nm_error *err) {
    int given = (o->prompt != NULL) + (o->file != NULL) + (o->tokens != NULL);
    if (given != 1) {
        snprintf(err->msg, sizeof err->msg,
                 given ? "give only one of -p, -f and --tokens"
                       : "no prompt: give -p, -f or --tokens");
        return NULL;
    }
    nm_model_info info;
    nm_model_get_info(model, &info);
    if (o->tokens && o->chat) {
        snprintf(err->msg, sizeof err->msg, "--chat needs a text prompt (-p or -f), not --tokens");
        return NULL;
    }
    if ((o->chat_template || o->system) && !o->chat) {
        snprintf(err->msg, sizeof err->msg, "--chat-template and --system need --chat");
        return NULL;
    }
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
    char *chat = NULL;
    if (o->chat) {
        /* the prompt becomes the user message of the model's chat format */
        nm_status cst = NM_OK;
        char *user = malloc(n_bytes + 1);
        if (user) {
            memcpy(user, text, n_bytes);
            user[n_bytes] = '\0';
            const nm_chat_message m[2] = {{"system", o->system}, {"user", user}};
            cst = nm_chat_apply_template(model, o->chat_template, m + !o->system, o->system ? 2 : 1,
                                         true, &chat, &n_bytes, err);
            free(user);
        } else {
            cst = nm_errorf(err, NM_ERR_NOMEM, "out of memory for the prompt");
        }
        if (cst != NM_OK) {
            free(owned);
            return NULL;
        }
        text = chat;
    }
    size_t n = 0;
    nm_status st = nm_tokenize(model, text, n_bytes, true, !o->no_special, NULL, 0, &n, err);
    int32_t *ids = NULL;
    if (st == NM_ERR_CAPACITY || st == NM_OK) {
        ids = malloc((n ? n : 1) * sizeof *ids);
        st = ids ? nm_tokenize(model, text, n_bytes, true, !o->no_special, ids, n, &n, err)
                 : NM_ERR_NOMEM;
        if (!ids) snprintf(err->msg, sizeof err->msg, "out of memory for %zu tokens", n);
    }
    free(owned);
    nm_free(chat);
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

void progress_start(cli_progress *p) {
    memset(p, 0, sizeof *p);
    p->tty = isatty(fileno(stderr)) == 1;
    p->start_s = p->last_s = now_s();
}

void progress_update(cli_progress *p, bool final, const char *fmt, ...) {
    const double t = now_s();
    /* a file or a pipe gets a line every PROGRESS_PERIOD_S at most, and the last */
    if (!p->tty && !final && t - p->last_s < PROGRESS_PERIOD_S) return;
    p->last_s = t;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (p->tty) /* one line rewritten in place; the final one stays */
        fprintf(stderr, "\r%s\033[K%s", line, final ? "\n" : "");
    else
        fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

void warn_context(const nm_model *model, int32_t n_ctx) {
    static int32_t warned; /* each value once: bench opens a session per mode */
    nm_model_info info;
    nm_model_get_info(model, &info);
    if (info.n_ctx_train > 0 && n_ctx > info.n_ctx_train && n_ctx != warned) {
        warned = n_ctx;
        fprintf(stderr,
                "warning: a context of %d tokens exceeds the %d the model was trained on: "
                "positions past %d are outside what it learned\n",
                n_ctx, info.n_ctx_train, info.n_ctx_train);
    }
}

nm_status name_ctx_option(nm_status st, nm_error *err) {
    if (st == NM_ERR_CAPACITY) {
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n, " (-c N gives a larger context)");
    }
    return st;
}

nm_status open_device(const cli_options *o, nm_device **out, nm_error *err) {
    nm_device_params dp = nm_device_default_params();
    if (o->device) dp.name = o->device;
    if (o->device_threads) dp.n_threads = o->device_threads;
    return nm_device_open(&dp, out, err);
}

nm_status open_session(nm_model *model, const cli_options *o, bool static_path, cli_session *cs,
                       nm_error *err) {
    memset(cs, 0, sizeof *cs);
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = o->ctx;
    if (o->ctx) warn_context(model, o->ctx);
    sp.n_batch = o->chunk ? o->chunk : o->batch;
    sp.n_threads = o->threads;
    nm_status st = parse_kv_type(o, &sp.kv_type, err);
    if (static_path && o->mode) st = nm_mode_parse(o->mode, &sp.mode, err);
    if (st == NM_OK && static_path && o->plan) {
        st = nm_plan_open(o->plan, model, &cs->plan, err);
        sp.plan = cs->plan;
        nm_plan_info pi = {0};
        if (st == NM_OK) nm_plan_get_info(cs->plan, &pi);
        if (st == NM_OK && o->chunk && o->chunk != pi.chunk)
            st = nm_errorf(err, NM_ERR_INVALID_ARG, "--chunk %d differs from the plan's chunk %d",
                           o->chunk, pi.chunk);
        if (st == NM_OK && !o->mode)
            sp.mode = NM_MODE_NPUMOE; /* a plan alone means the full system */
    }
    if (st == NM_OK && sp.mode != NM_MODE_DENSE) {
        st = open_device(o, &cs->device, err);
        sp.device = cs->device;
    }
    if (st == NM_OK) st = nm_session_new(model, &sp, &cs->session, err);
    if (st != NM_OK) close_session(cs);
    return st;
}

bool cli_no_repack(const cli_options *o) {
    /* a device other than the host's reads the weights in the file's layout */
    return o->no_repack || (o->device && strcmp(o->device, "cpu") != 0);
}

nm_status parse_kv_type(const cli_options *o, nm_kv_type *out, nm_error *err) {
    *out = NM_KV_F32;
    if (!o->kv_type || strcmp(o->kv_type, "f32") == 0) return NM_OK;
    if (strcmp(o->kv_type, "f16") == 0) {
        *out = NM_KV_F16;
        return NM_OK;
    }
    return nm_errorf(err, NM_ERR_INVALID_ARG, "--kv-type: '%s' is not f32 or f16", o->kv_type);
}

void close_session(cli_session *cs) {
    nm_session_free(cs->session);
    nm_device_close(cs->device);
    nm_plan_free(cs->plan);
    memset(cs, 0, sizeof *cs);
}
