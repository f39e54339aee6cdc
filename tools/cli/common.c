/* Helpers shared by the command's subcommands: one-line failures, reading
 * prompts (text, files, token lists), opening sessions from options. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

double cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

void cost_start(cli_cost *u) {
    memset(u, 0, sizeof *u);
    nm_energy_read(NULL, &u->energy0);
    u->cpu_s = cpu_s();
    u->wall_s = now_s();
}

void cost_stop(cli_cost *u) {
    u->wall_s = now_s() - u->wall_s;
    u->cpu_s = cpu_s() - u->cpu_s;
    nm_energy_sample e1;
    nm_energy_read(NULL, &e1);
    u->joules = nm_energy_joules(&u->energy0, &e1);
    snprintf(u->energy_why, sizeof u->energy_why, "%s",
             !u->energy0.available ? u->energy0.why
             : !e1.available       ? e1.why
             : u->joules < 0       ? "the RAPL zones changed during the run"
                                   : "");
}

void print_cost_text(FILE *f, const char *what, const cli_cost *u) {
    char label[64];
    snprintf(label, sizeof label, "%s CPU:", what);
    fprintf(f, "%-17s%.2f ms (user+sys of the process, getrusage) in %.2f ms wall\n", label,
            u->cpu_s * 1e3, u->wall_s * 1e3);
    if (u->joules >= 0)
        fprintf(f, "energy:          %.3f J (RAPL, the CPU packages, whole machine)\n", u->joules);
    else
        fprintf(f, "energy:          not available (%s)\n", u->energy_why);
}

json_t *cost_json(const cli_cost *u) {
    return json_pack("{s:o, s:o, s:o, s:s}", "wall_ms", json_fixed(u->wall_s * 1e3, 3), "cpu_ms",
                     json_fixed(u->cpu_s * 1e3, 3), "energy_j",
                     u->joules >= 0 ? json_fixed(u->joules, 6) : json_null(), "energy_note",
                     u->joules >= 0 ? "RAPL, the CPU packages, whole machine" : u->energy_why);
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
    if (!m->device_layers) return;
    const nm_device_stats *d = &m->device_total;
    fprintf(f,
            "device work:     %llu dispatches (%llu dense parts), %llu syncs: %.2f and %.2f per "
            "layer and chunk; busy %.2f ms (as the device times it)\n",
            (unsigned long long)d->dispatches, (unsigned long long)d->dense_dispatches,
            (unsigned long long)d->syncs, ratio(d->dispatches, t->chunks),
            ratio(d->syncs, t->chunks), (double)d->busy_ns * 1e-6);
    fprintf(f,
            "device memory:   %llu bytes held by the graphs; %.3f MiB uploaded (weights at "
            "compile, K/V)\n",
            (unsigned long long)m->device.device_bytes, (double)m->device.upload_bytes / 1048576.0);
    for (int32_t l = 0; l < m->n_layer; l++) {
        const nm_device_stats *dl = &m->device_layers[l];
        const uint64_t chunks = m->layers[l].chunks;
        fprintf(f, "  layer %2d:      %.2f dispatches, %.2f syncs, %.3f ms busy per chunk\n", l,
                ratio(dl->dispatches, chunks), ratio(dl->syncs, chunks),
                chunks ? (double)dl->busy_ns * 1e-6 / (double)chunks : 0.0);
    }
}

static json_t *device_json(const nm_device_stats *d, uint64_t chunks) {
    return json_pack(
        "{s:I, s:I, s:I, s:o, s:o, s:o, s:I}", "dispatches", (json_int_t)d->dispatches,
        "dense_dispatches", (json_int_t)d->dense_dispatches, "syncs", (json_int_t)d->syncs,
        "dispatches_per_chunk", json_fixed(ratio(d->dispatches, chunks), 3), "syncs_per_chunk",
        json_fixed(ratio(d->syncs, chunks), 3), "busy_ms", json_fixed((double)d->busy_ns * 1e-6, 3),
        "upload_bytes", (json_int_t)d->upload_bytes);
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

static json_t *layer_json(const nm_moe_layer_metrics *l) {
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o}",
                     "chunks", (json_int_t)l->chunks, "assignments", (json_int_t)l->assignments,
                     "dropped", (json_int_t)l->dropped, "spilled", (json_int_t)l->spilled,
                     "host_rows", (json_int_t)l->host_rows, "device_rows",
                     (json_int_t)l->device_rows, "reserved_rows", (json_int_t)l->reserved_rows,
                     "dispatches", (json_int_t)l->dispatches, "padding_waste",
                     json_fixed(ratio(l->reserved_rows - l->device_rows, l->reserved_rows), 6),
                     "drop_rate", json_fixed(ratio(l->dropped, l->assignments), 6), "spill_rate",
                     json_fixed(ratio(l->spilled, l->assignments), 6), "dropped_weight",
                     json_fixed(l->weight > 0 ? l->dropped_weight / l->weight : 0.0, 6),
                     "host_ms", json_fixed((double)l->host_ns * 1e-6, 3), "wait_ms",
                     json_fixed((double)l->wait_ns * 1e-6, 3));
}

json_t *metrics_json(const nm_session_metrics *m) {
    json_t *layers = json_array();
    bool ok = layers != NULL;
    for (int32_t l = 0; ok && l < m->n_layer; l++) {
        json_t *lj = layer_json(&m->layers[l]);
        /* per chunk of this layer: its dispatches, syncs and busy time */
        if (lj && m->device_layers)
            ok = json_object_set_new(lj, "device",
                                     device_json(&m->device_layers[l], m->layers[l].chunks)) == 0;
        ok = ok && json_array_append_new(layers, lj) == 0;
    }
    if (!ok) {
        json_decref(layers);
        return NULL;
    }
    json_t *dev = m->device_layers ? device_json(&m->device_total, m->total.chunks) : json_null();
    if (dev && m->device_layers)
        json_object_set_new(dev, "upload_bytes", json_integer((json_int_t)m->device.upload_bytes));
    return json_pack("{s:s, s:o, s:I, s:o, s:o, s:o}", "mode", nm_mode_name(m->mode),
                     "device_busy_ms", json_fixed((double)m->device.busy_ns * 1e-6, 3),
                     "graphs_compiled", (json_int_t)m->device.graphs_compiled, "device", dev,
                     "total", layer_json(&m->total), "layers", layers);
}

json_t *json_fixed(double v, int decimals) {
    if (!isfinite(v)) return json_null();
    const double scale = pow(10, decimals), r = round(v * scale) / scale;
    return json_real(isfinite(r) ? r : v);
}

json_t *json_text(const char *text, size_t n) {
    /* at most 3 bytes (U+FFFD) for each byte */
    char *out = n <= (SIZE_MAX - 1) / 3 ? malloc(3 * n + 1) : NULL;
    if (!out) return NULL;
    const unsigned char *s = (const unsigned char *)text;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const unsigned c = s[i];
        /* a sequence's length from its lead byte; 0 for a byte no sequence
         * starts with (a continuation, C0, C1, F5 to FF) */
        const size_t len = c < 0x80 ? 1 : c < 0xc2 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf5 ? 4 : 0;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        bool ok = len >= 1 && i + len <= n;
        for (size_t j = 1; ok && j < len; j++) {
            ok = (s[i + j] & 0xc0) == 0x80;
            cp = (cp << 6) | (s[i + j] & 0x3fu);
        }
        /* no overlong forms, surrogates or code points past U+10FFFF */
        ok = ok && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
             !(cp >= 0xd800 && cp <= 0xdfff);
        const size_t take = ok ? len : 1;
        memcpy(out + o, ok ? (const char *)s + i : "\xef\xbf\xbd", ok ? len : 3);
        o += ok ? len : 3;
        i += take;
    }
    json_t *v = json_stringn(out, o);
    free(out);
    return v;
}

json_t *json_ids(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

int print_json(FILE *f, json_t *doc, size_t flags) {
    /* measurements: 15 digits print a rounded value as written ("12.346") */
    const int bad = !doc || json_dumpf(doc, f, flags | JSON_REAL_PRECISION(15)) != 0;
    json_decref(doc);
    if (bad) return fail("out of memory writing a JSON report%s%s", "", "");
    fputc('\n', f);
    return 0;
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
    dp.memory_budget_bytes = o->device_budget;
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
