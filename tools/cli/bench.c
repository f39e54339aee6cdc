/* npumoe bench: the paper's comparison on any device. For each prompt length,
 * every mode prefills the same tokens, repetitions alternate the order of
 * the modes, and the report gives median TTFT and host CPU time with their
 * spread, ratios against naive and dense, dispatches, padding waste and
 * drops: a Markdown table on stdout, and with -o PREFIX also PREFIX.md,
 * PREFIX.json and an SVG plot of TTFT against prompt length. */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LENGTHS = 16, MAX_REPS = 1000 };

typedef struct cell {
    double ttft_ms[MAX_REPS];
    double cpu_ms[MAX_REPS];
    double energy_j[MAX_REPS]; /* < 0: not available (energy_why) */
    char energy_why[256];
    nm_device_stats device;     /* the device's work in the layers (dense parts, experts) */
    nm_session_metrics metrics; /* of the last repetition (the same every time) */
    nm_moe_layer_metrics total;
    uint64_t graphs_compiled;
    double device_busy_ms;
} cell;

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double s[MAX_REPS];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static double minimum(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static double maximum(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

typedef struct bench {
    int n_modes, n_lengths, reps;
    nm_mode modes[NM_MODE_COUNT];
    int32_t lengths[MAX_LENGTHS];
    int32_t chunk;
    int32_t n_layer;
    const char *model; /* the file's name, for the plot's title */
    nm_plan *plan;     /* for its predicted overflow; NULL without one */
    cell *cells;       /* [n_lengths][n_modes] */
} bench;

/* The plan's predicted time of a layer's chunk, 0 without a plan. */
static double predicted_chunk_ms(const bench *b) {
    nm_plan_info pi = {0};
    if (b->plan) nm_plan_get_info(b->plan, &pi);
    return pi.predicted_chunk_ms;
}

/* Repetitions whose range passes this share of their median say the machine
 * was busy: a ratio of two such medians is not to be trusted. */
#define SPREAD_LIMIT 0.25

static double spread(const double *v, int n) {
    const double m = median(v, n);
    return m > 0 ? (maximum(v, n) - minimum(v, n)) / m : 0.0;
}

/* Measured wall time of the MoE steps of one chunk (all layers), ms. */
static double moe_ms_per_chunk(const bench *b, const cell *c) {
    const uint64_t chunks = c->total.chunks / (uint64_t)b->n_layer;
    return chunks ? (double)c->total.moe_ns * 1e-6 / (double)chunks : 0.0;
}

static cell *at(const bench *b, int li, int mi) { return &b->cells[li * b->n_modes + mi]; }

static int index_of(const bench *b, nm_mode m) {
    for (int i = 0; i < b->n_modes; i++)
        if (b->modes[i] == m) return i;
    return -1;
}

static void write_markdown(FILE *f, const bench *b, const char *device) {
    const int i_naive = index_of(b, NM_MODE_NAIVE), i_dense = index_of(b, NM_MODE_DENSE);
    fprintf(f,
            "| prompt | mode | TTFT ms (median) | min-max | host CPU ms | energy J | vs naive | "
            "vs dense | dispatches/layer/chunk | syncs/layer/chunk | padding waste | drop rate | "
            "spill rate | MoE ms/chunk |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const char *no_energy = NULL;
    for (int li = 0; li < b->n_lengths; li++)
        for (int mi = 0; mi < b->n_modes; mi++) {
            const cell *c = at(b, li, mi);
            const double t = median(c->ttft_ms, b->reps), cpu = median(c->cpu_ms, b->reps);
            char vs_naive[32] = "-", vs_dense[32] = "-";
            if (i_naive >= 0)
                snprintf(vs_naive, sizeof vs_naive, "%.2fx",
                         median(at(b, li, i_naive)->ttft_ms, b->reps) / t);
            if (i_dense >= 0)
                snprintf(vs_dense, sizeof vs_dense, "%.2fx",
                         median(at(b, li, i_dense)->ttft_ms, b->reps) / t);
            const nm_moe_layer_metrics *m = &c->total;
            char energy[32] = "n/a";
            if (minimum(c->energy_j, b->reps) >= 0)
                snprintf(energy, sizeof energy, "%.3f", median(c->energy_j, b->reps));
            else
                no_energy = c->energy_why;
            fprintf(f,
                    "| %d | %s | %.1f | %.1f-%.1f | %.1f | %s | %s | %s | %.2f | %.2f | %.1f%% | "
                    "%.3f%% | %.3f%% | %.3f |\n",
                    b->lengths[li], nm_mode_name(b->modes[mi]), t, minimum(c->ttft_ms, b->reps),
                    maximum(c->ttft_ms, b->reps), cpu, energy, vs_naive, vs_dense,
                    ratio(c->device.dispatches, m->chunks), ratio(c->device.syncs, m->chunks),
                    100.0 * ratio(m->reserved_rows - m->device_rows, m->reserved_rows),
                    100.0 * ratio(m->dropped, m->assignments),
                    100.0 * ratio(m->spilled, m->assignments), moe_ms_per_chunk(b, c));
        }
    if (no_energy) fprintf(f, "\nenergy: not available (%s).", no_energy);
    for (int li = 0; li < b->n_lengths; li++)
        for (int mi = 0; mi < b->n_modes; mi++) {
            const double sp = spread(at(b, li, mi)->ttft_ms, b->reps);
            if (sp > SPREAD_LIMIT)
                fprintf(f,
                        "\nwarning: %s at prompt %d: the repetitions spread over %.0f%% of their "
                        "median (more than %.0f%%): the machine was busy, and ratios with this "
                        "cell are not reliable; rerun on a quiet machine or with more -r.",
                        nm_mode_name(b->modes[mi]), b->lengths[li], 100.0 * sp,
                        100.0 * SPREAD_LIMIT);
        }
    const int i_npumoe = index_of(b, NM_MODE_NPUMOE);
    for (int li = 0; i_npumoe >= 0 && predicted_chunk_ms(b) > 0 && li < b->n_lengths; li++) {
        const double measured = moe_ms_per_chunk(b, at(b, li, i_npumoe));
        fprintf(f,
                "\nnpumoe, prompt %d: the plan predicts %.3f ms of MoE per chunk, measured %.3f ms "
                "(%+.1f%%).",
                b->lengths[li], predicted_chunk_ms(b), measured,
                100.0 * (measured / predicted_chunk_ms(b) - 1.0));
    }
    for (int li = 0; b->plan && li < b->n_lengths; li++)
        for (int mi = 0; mi < b->n_modes; mi++) {
            /* npumoe mode: the host groups keep everything, so the plan's
             * capacities, and what it predicts, apply only in tiers and grouped */
            if (b->modes[mi] != NM_MODE_TIERS && b->modes[mi] != NM_MODE_GROUPED) continue;
            fprintf(f, "\n%s, prompt %d:\n", nm_mode_name(b->modes[mi]), b->lengths[li]);
            print_overflow_prediction(f, b->plan, &at(b, li, mi)->total);
        }
    fprintf(f,
            "\nTTFT: prefill of the whole prompt plus sampling the first token; ratios are of "
            "median TTFT (higher = faster than that mode); host CPU: user+sys of the process "
            "(getrusage); energy: the CPU packages' (RAPL), whole machine; dispatches and syncs: "
            "the device's, dense parts included. Device: %s; chunk %d; %d "
            "repetitions per cell, modes alternated.\n",
            device, b->chunk, b->reps);
}

static int write_json(FILE *f, const bench *b, const char *device) {
    json_t *results = json_array();
    bool ok = results != NULL;
    for (int li = 0; ok && li < b->n_lengths; li++)
        for (int mi = 0; ok && mi < b->n_modes; mi++) {
            const cell *c = at(b, li, mi);
            const nm_moe_layer_metrics *m = &c->total;
            json_t *r = json_pack(
                "{s:i, s:s, s:o, s:o, s:o, s:o, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o}", "prompt",
                b->lengths[li], "mode", nm_mode_name(b->modes[mi]), "ttft_ms",
                json_fixed(median(c->ttft_ms, b->reps), 3), "ttft_min_ms",
                json_fixed(minimum(c->ttft_ms, b->reps), 3), "ttft_max_ms",
                json_fixed(maximum(c->ttft_ms, b->reps), 3), "host_cpu_ms",
                json_fixed(median(c->cpu_ms, b->reps), 3), "dispatches", (json_int_t)m->dispatches,
                "chunks", (json_int_t)m->chunks, "graphs_compiled", (json_int_t)c->graphs_compiled,
                "device_busy_ms", json_fixed(c->device_busy_ms, 3), "padding_waste",
                json_fixed(ratio(m->reserved_rows - m->device_rows, m->reserved_rows), 6),
                "drop_rate", json_fixed(ratio(m->dropped, m->assignments), 6), "spill_rate",
                json_fixed(ratio(m->spilled, m->assignments), 6), "moe_ms_per_chunk",
                json_fixed(moe_ms_per_chunk(b, c), 4));
            const bool energy = minimum(c->energy_j, b->reps) >= 0;
            if (r &&
                json_object_update_new(
                    r, json_pack("{s:o, s:s, s:I, s:I, s:I, s:o, s:o}", "energy_j",
                                 energy ? json_fixed(median(c->energy_j, b->reps), 6) : json_null(),
                                 "energy_note",
                                 energy ? "RAPL, the CPU packages, whole machine" : c->energy_why,
                                 "device_dispatches", (json_int_t)c->device.dispatches,
                                 "dense_dispatches", (json_int_t)c->device.dense_dispatches,
                                 "syncs", (json_int_t)c->device.syncs, "syncs_per_layer_chunk",
                                 json_fixed(ratio(c->device.syncs, m->chunks), 3),
                                 "dispatches_per_layer_chunk",
                                 json_fixed(ratio(c->device.dispatches, m->chunks), 3))) != 0) {
                json_decref(r);
                r = NULL;
            }
            ok = r && json_array_append_new(results, r) == 0;
        }
    if (!ok) {
        json_decref(results);
        results = NULL;
    }
    json_t *doc =
        json_pack("{s:s, s:i, s:i, s:o, s:o}", "device", device, "chunk", b->chunk, "reps", b->reps,
                  "results", results, "predicted_chunk_ms", json_fixed(predicted_chunk_ms(b), 4));
    return print_json(f, doc, JSON_COMPACT); /* one line, after the table on stdout */
}

/* A round step (1, 2 or 5 times a power of ten) that covers [0, max] in at
 * most 5 steps. */
static double round_step(double max) {
    if (!(max > 0)) return 1;
    const double p = pow(10, floor(log10(max / 5)));
    const double steps[4] = {1, 2, 5, 10};
    for (int i = 0; i < 4; i++)
        if (steps[i] * p * 5 >= max) return steps[i] * p;
    return 10 * p;
}

/* TTFT against prompt length: per mode a polyline through the medians, and
 * at each point a bar from the fastest to the slowest repetition. */
static void write_svg(FILE *f, const bench *b, const char *device) {
    const double W = 640, H = 400, L = 70, R = 150, T = 30, B = 50;
    double max_t = 0;
    for (int i = 0; i < b->n_lengths * b->n_modes; i++) {
        double t = maximum(b->cells[i].ttft_ms, b->reps);
        max_t = t > max_t ? t : max_t;
    }
    const double step = round_step(max_t);
    const int n_ticks = (int)ceil(max_t / step - 1e-9) > 0 ? (int)ceil(max_t / step - 1e-9) : 1;
    const double top = step * n_ticks; /* the axis ends on a tick */
    const double max_len = b->lengths[b->n_lengths - 1];
    static const char *const colors[] = {"#1f77b4", "#d62728", "#ff7f0e", "#9467bd", "#2ca02c"};
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n",
            W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f,
            "<text x=\"%.0f\" y=\"18\" text-anchor=\"middle\">TTFT by prompt length: %s on "
            "%s</text>\n",
            (W - R + L) / 2, b->model, device);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L,
            H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T,
            L, H - B);
    for (int i = 0; i <= n_ticks; i++) {
        const double y = H - B - (H - B - T) * i / n_ticks;
        fprintf(f, "<text class=\"tick\" x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%g</text>\n",
                L - 6, y + 4, step * i);
    }
    for (int li = 0; li < b->n_lengths; li++) {
        const double x = L + (W - R - L) * b->lengths[li] / max_len;
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%d</text>\n", x, H - B + 16,
                b->lengths[li]);
    }
    fprintf(f,
            "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">prompt tokens (points: median "
            "of %d; bars: fastest to slowest)</text>\n",
            (W - R + L) / 2, H - 12, b->reps);
    fprintf(f,
            "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" "
            "text-anchor=\"middle\">TTFT (ms)</text>\n",
            (H - B + T) / 2, (H - B + T) / 2);
    for (int mi = 0; mi < b->n_modes; mi++) {
        const char *color = colors[mi % 5];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color);
        for (int li = 0; li < b->n_lengths; li++) {
            const double x = L + (W - R - L) * b->lengths[li] / max_len;
            const double y = H - B - (H - B - T) * median(at(b, li, mi)->ttft_ms, b->reps) / top;
            fprintf(f, "%.1f,%.1f ", x, y);
        }
        fprintf(f, "\"/>\n");
        for (int li = 0; li < b->n_lengths; li++) {
            const cell *c = at(b, li, mi);
            const double x = L + (W - R - L) * b->lengths[li] / max_len, span = H - B - T;
            fprintf(f,
                    "<line class=\"range\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                    "stroke=\"%s\"/>\n<circle class=\"median\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" "
                    "fill=\"%s\"/>\n",
                    x, H - B - span * minimum(c->ttft_ms, b->reps) / top, x,
                    H - B - span * maximum(c->ttft_ms, b->reps) / top, color, x,
                    H - B - span * median(c->ttft_ms, b->reps) / top, color);
        }
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%s</text>\n", W - R + 10,
                T + 18.0 * mi + 10, color, nm_mode_name(b->modes[mi]));
    }
    fprintf(f, "</svg>\n");
}

static int write_report(const char *prefix, const char *ext, const bench *b, const char *device,
                        int (*writer)(FILE *, const bench *, const char *)) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, ext);
    nm_error err = {0};
    nm_outfile out;
    nm_status st = nm_outfile_open(path, &out, &err);
    if (st == NM_OK && writer(out.f, b, device) != 0) { /* it said why */
        nm_outfile_abort(&out);
        return 1;
    }
    if (st == NM_OK) st = nm_outfile_commit(&out, &err);
    return st == NM_OK ? 0 : fail_err(&err);
}

static int md_writer(FILE *f, const bench *b, const char *device) {
    write_markdown(f, b, device);
    return 0;
}

static int svg_writer(FILE *f, const bench *b, const char *device) {
    write_svg(f, b, device);
    return 0;
}

/* Every mode prefills the first L tokens once per repetition. */
static nm_status run_length(nm_model *model, const cli_options *o, bench *b, int li,
                            const int32_t *ids, int32_t n_vocab, nm_error *err,
                            cli_progress *line) {
    const int32_t len = b->lengths[li];
    cli_session cs[NM_MODE_COUNT];
    memset(cs, 0, sizeof cs);
    float *logits = malloc((size_t)n_vocab * sizeof(float));
    nm_status st = logits ? NM_OK : NM_ERR_NOMEM;
    for (int mi = 0; mi < b->n_modes && st == NM_OK; mi++) {
        cli_options so = *o;
        so.mode = nm_mode_name(b->modes[mi]);
        so.ctx = len;
        so.chunk = b->chunk;
        if (b->modes[mi] == NM_MODE_DENSE || b->modes[mi] == NM_MODE_NAIVE) so.plan = NULL;
        st = open_session(model, &so, true, &cs[mi], err);
    }
    for (int r = 0; r < b->reps && st == NM_OK; r++)
        for (int step = 0; step < b->n_modes && st == NM_OK; step++) {
            const int mi = r % 2 ? b->n_modes - 1 - step : step; /* alternate the order */
            nm_session *s = cs[mi].session;
            nm_session_reset(s);
            nm_session_reset_metrics(s);
            cli_cost cost;
            cost_start(&cost);
            st = nm_session_eval(s, ids, len, logits, false, err);
            volatile int32_t first = nm_argmax(logits, n_vocab);
            (void)first;
            cost_stop(&cost);
            cell *c = at(b, li, mi);
            c->ttft_ms[r] = cost.wall_s * 1e3;
            c->cpu_ms[r] = cost.cpu_s * 1e3;
            c->energy_j[r] = cost.joules;
            snprintf(c->energy_why, sizeof c->energy_why, "%s", cost.energy_why);
            nm_session_get_metrics(s, &c->metrics);
            c->total = c->metrics.total;
            c->device = c->metrics.device_total;
            c->graphs_compiled = c->metrics.device.graphs_compiled;
            c->device_busy_ms = (double)c->device.busy_ns * 1e-6;
            const bool last = li + 1 == b->n_lengths && r + 1 == b->reps && step + 1 == b->n_modes;
            progress_update(line, last, "bench: prompt %d, %s, rep %d/%d: TTFT %.1f ms", len,
                            nm_mode_name(b->modes[mi]), r + 1, b->reps, c->ttft_ms[r]);
        }
    for (int mi = 0; mi < b->n_modes; mi++)
        close_session(&cs[mi]);
    free(logits);
    if (st == NM_ERR_NOMEM && !err->msg[0]) snprintf(err->msg, sizeof err->msg, "out of memory");
    return st;
}

int cmd_bench(nm_model *model, const cli_options *o) {
    if (o->n_prompt >= 0 || o->n_gen >= 0) return cmd_bench_throughput(model, o);
    nm_error err = {0};
    bench b;
    memset(&b, 0, sizeof b);
    b.reps = o->reps ? o->reps : 5;
    b.model = strrchr(o->model, '/') ? strrchr(o->model, '/') + 1 : o->model;
    if (o->lengths) {
        b.n_lengths =
            parse_int_list(o->lengths, "--lengths", 1, 1 << 20, b.lengths, MAX_LENGTHS, &err);
        if (b.n_lengths < 0) return fail_err(&err);
        for (int i = 1; i < b.n_lengths; i++)
            if (b.lengths[i] <= b.lengths[i - 1])
                return fail("--lengths must be ascending%s%s", "", "");
    } else {
        const int32_t def[3] = {512, 1024, 2048};
        memcpy(b.lengths, def, sizeof def);
        b.n_lengths = 3;
    }
    const char *modes = o->modes ? o->modes : "dense,naive,tiers,grouped,npumoe";
    for (const char *p = modes; *p;) {
        char name[32];
        size_t len = strcspn(p, ",");
        if (len >= sizeof name || b.n_modes == NM_MODE_COUNT)
            return fail("--modes: '%s' is not a list of modes%s", modes, "");
        memcpy(name, p, len);
        name[len] = 0;
        nm_mode m;
        if (nm_mode_parse(name, &m, &err) != NM_OK) return fail_err(&err);
        if (index_of(&b, m) >= 0) return fail("--modes: '%s' is listed twice%s", name, "");
        if (m != NM_MODE_DENSE && m != NM_MODE_NAIVE && !o->plan)
            return fail("mode %s needs --plan (made by npumoe plan)%s", name, "");
        b.modes[b.n_modes++] = m;
        p += len + (p[len] == ',');
    }
    /* the reports can be written: checked before the work */
    const char *exts[3] = {"md", "json", "svg"};
    for (int i = 0; i < 3 && o->output; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%s", o->output, exts[i]);
        if (nm_outfile_check(path, &err) != NM_OK) return fail_err(&err);
    }
    size_t n = 0;
    int32_t *text = prompt_ids(model, o, &n, &err);
    if (!text) return fail_err(&err);
    nm_plan *plan = NULL;
    nm_status st = NM_OK;
    if (o->plan) st = nm_plan_open(o->plan, model, &plan, &err);
    nm_plan_info pi = {0};
    if (plan) nm_plan_get_info(plan, &pi);
    b.chunk = plan ? pi.chunk : o->chunk ? o->chunk : 256;
    b.plan = plan;
    nm_model_info mi;
    nm_model_get_info(model, &mi);
    b.n_layer = mi.n_layer;
    const int32_t max_len = b.lengths[b.n_lengths - 1];
    int32_t *ids = malloc((size_t)max_len * sizeof *ids);
    b.cells = calloc((size_t)b.n_lengths * b.n_modes, sizeof *b.cells);
    if (b.reps > MAX_REPS)
        st = nm_errorf(&err, NM_ERR_INVALID_ARG, "at most %d repetitions", MAX_REPS);
    if (st == NM_OK && (!ids || !b.cells)) st = nm_errorf(&err, NM_ERR_NOMEM, "out of memory");
    /* the text, repeated when it is shorter than the longest prompt */
    for (int32_t i = 0; st == NM_OK && i < max_len; i++)
        ids[i] = text[(size_t)i % n];
    nm_model_info info;
    nm_model_get_info(model, &info);
    cli_progress line;
    progress_start(&line);
    for (int li = 0; li < b.n_lengths && st == NM_OK; li++)
        st = run_length(model, o, &b, li, ids, info.n_vocab, &err, &line);
    int rc = 0;
    const char *device = o->device ? o->device : "cpu";
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        write_markdown(stdout, &b, device);
        if (o->json) rc = write_json(stdout, &b, device);
        if (o->output && rc == 0)
            rc = write_report(o->output, "md", &b, device, md_writer) ||
                 write_report(o->output, "json", &b, device, write_json) ||
                 write_report(o->output, "svg", &b, device, svg_writer);
    }
    free(b.cells);
    nm_plan_free(b.plan);
    free(ids);
    free(text);
    return rc;
}
