/* The offline half of the NPUMoE loop: npumoe calibrate (per-chunk expert
 * loads of a text), npumoe profile (what the device and the host cost) and
 * npumoe plan (tiers, groups, residency from both). */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum { DEFAULT_CHUNK = 256, DEFAULT_WINDOW = 2048, MAX_LIST = 64 };

int parse_int_list(const char *text, const char *what, int32_t lo, int32_t hi, int32_t *out,
                   int cap, nm_error *err) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < lo || v > hi || (*end && *end != ',')) {
            snprintf(err->msg, sizeof err->msg, "%s: '%s' is not a list of integers in [%d, %d]",
                     what, text, lo, hi);
            return -1;
        }
        if (n == cap) {
            snprintf(err->msg, sizeof err->msg, "%s: more than %d values", what, cap);
            return -1;
        }
        out[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) snprintf(err->msg, sizeof err->msg, "%s: no values given", what);
    return n ? n : -1;
}

/* ---- calibrate ---- */

/* Share of a layer's assignments taken by its most popular quarter of
 * experts, from the calibration's means. */
static double top_quarter_share(const nm_calib *c, int32_t n_expert, int32_t layer) {
    double mean[1024], total = 0;
    const int32_t n = n_expert < 1024 ? n_expert : 1024;
    for (int32_t e = 0; e < n; e++)
        total += mean[e] = nm_calib_mean(c, layer, e);
    for (int32_t i = 1; i < n; i++) /* descending insertion sort: n is small */
        for (int32_t j = i; j > 0 && mean[j] > mean[j - 1]; j--) {
            double t = mean[j];
            mean[j] = mean[j - 1];
            mean[j - 1] = t;
        }
    double top = 0;
    for (int32_t e = 0; e < (n + 3) / 4; e++)
        top += mean[e];
    return total > 0 ? top / total : 0;
}

static void calib_progress(void *ctx, size_t done, size_t total, int64_t n_chunks) {
    cli_progress *line = ctx;
    const double el = now_s() - line->start_s;
    progress_update(line, done == total,
                    "calibrate: %zu/%zu tokens, %" PRId64 " chunks (%.1f s, ~%.0f s left)", done,
                    total, n_chunks, el, el / (double)done * (double)(total - done));
}

int cmd_calibrate(nm_model *model, const cli_options *o) {
    nm_error err = {0};
    if (!o->output) return fail("calibrate needs -o CALIB.json%s%s", "", "");
    if (nm_outfile_check(o->output, &err) != NM_OK) return fail_err(&err);
    size_t n = 0;
    int32_t *ids = prompt_ids(model, o, &n, &err);
    if (!ids) return fail_err(&err);
    const int32_t chunk = o->chunk ? o->chunk : DEFAULT_CHUNK;
    /* windows no longer than the trained context: a model routes positions
     * it never saw differently */
    nm_model_info info;
    nm_model_get_info(model, &info);
    int32_t window = o->ctx                              ? o->ctx
                     : info.n_ctx_train < DEFAULT_WINDOW ? info.n_ctx_train
                                                         : DEFAULT_WINDOW;
    window -= window % chunk;
    if (window < chunk) {
        free(ids);
        return fail("--ctx must hold at least one chunk of %s tokens%s",
                    o->chunk ? "the --chunk" : "256", "");
    }
    warn_context(model, window);
    nm_calib_params cp = nm_calib_default_params();
    cp.chunk = chunk;
    cp.n_ctx = window;
    cp.n_threads = o->threads;
    cli_progress line;
    progress_start(&line);
    cp.progress = calib_progress;
    cp.progress_ctx = &line;
    nm_calib *calib = NULL;
    nm_status st = parse_kv_type(o, &cp.kv_type, &err);
    if (st == NM_OK) st = nm_calib_make(model, ids, n, &cp, &calib, &err);
    if (st == NM_OK) st = nm_calib_save(calib, o->output, &err);
    int rc = 0;
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        nm_calib_info ci;
        nm_calib_get_info(calib, &ci);
        printf("calibration: %" PRId64
               " chunks of %d tokens, %d layers x %d experts, top-%d -> %s\n",
               ci.n_chunks, chunk, ci.n_layer, ci.n_expert, ci.k, o->output);
        printf("share of assignments taken by the most popular quarter of experts, per layer:\n");
        for (int32_t l = 0; l < ci.n_layer; l++)
            printf("  layer %2d: %5.1f%%\n", l, 100.0 * top_quarter_share(calib, ci.n_expert, l));
    }
    nm_calib_free(calib);
    free(ids);
    return rc;
}

/* ---- profile ---- */

static void profile_progress(void *ctx, int done, int total) {
    progress_update(ctx, done == total, "profile: %d/%d measurements", done, total);
}

int cmd_profile(nm_model *model, const cli_options *o) {
    nm_error err = {0};
    if (!o->output) return fail("profile needs -o PROFILE.json%s%s", "", "");
    if (nm_outfile_check(o->output, &err) != NM_OK) return fail_err(&err);
    nm_model_info info;
    nm_model_get_info(model, &info);
    nm_profile_params pp = nm_profile_default_params();
    pp.chunk = o->chunk ? o->chunk : DEFAULT_CHUNK;
    int32_t experts[MAX_LIST], caps[MAX_LIST];
    if (o->grid_experts) {
        pp.n_grid_experts = parse_int_list(o->grid_experts, "--grid-experts", 1, info.n_expert,
                                           experts, MAX_LIST, &err);
        if (pp.n_grid_experts < 0) return fail_err(&err);
        pp.grid_experts = experts;
    }
    if (o->grid_capacity) {
        pp.n_grid_capacity =
            parse_int_list(o->grid_capacity, "--grid-capacity", 1, 1 << 16, caps, MAX_LIST, &err);
        if (pp.n_grid_capacity < 0) return fail_err(&err);
        pp.grid_capacity = caps;
    }
    pp.reps = o->reps ? o->reps : 5;
    pp.n_threads = o->threads;
    nm_device *dev = NULL;
    nm_profile prof;
    memset(&prof, 0, sizeof prof);
    nm_status st = open_device(o, &dev, &err);
    cli_progress line;
    progress_start(&line);
    pp.progress = profile_progress;
    pp.progress_ctx = &line;
    if (st == NM_OK) {
        fprintf(stderr, "profile: the host MoE step over a chunk of %d tokens\n", pp.chunk);
        st = nm_profile_measure(model, dev, &pp, &prof, &err);
    }
    if (st == NM_OK) st = nm_profile_save(&prof, o->output, &err);
    int rc = 0;
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        printf("device %s: dispatch+sync %.4f ms; host %.4f ms per expert + %.5f ms per row "
               "+ %.4f ms per layer and chunk of %d; row granule %d\n",
               prof.device, prof.dispatch_ms, prof.host_expert_ms, prof.host_row_ms,
               prof.host_overhead_ms, prof.chunk, (int)prof.granule);
        if (prof.dense_device_ms > 0)
            printf("dense part of a layer over a chunk of %d: device %.4f ms, host %.4f ms\n",
                   prof.chunk, prof.dense_device_ms, prof.dense_host_ms);
        else
            printf("dense part of a layer: not measured (the device has no dense graph of this "
                   "model's form)\n");
        /* the points are experts outer, capacities inner */
        int n_c = 0;
        while (n_c < prof.n_points && prof.points[n_c].n_experts == prof.points[0].n_experts)
            n_c++;
        printf("graph time (ms), experts per graph x rows per expert:\n%10s", "");
        for (int c = 0; c < n_c; c++)
            printf(" %9d", prof.points[c].capacity);
        for (int32_t i = 0; i < prof.n_points; i++) {
            if (i % n_c == 0) printf("\n%10d", prof.points[i].n_experts);
            printf(" %9.4f", prof.points[i].graph_ms);
        }
        printf("\n-> %s\n", o->output);
    }
    nm_profile_free(&prof);
    nm_device_close(dev);
    return rc;
}

/* ---- plan ---- */

int cmd_plan(nm_model *model, const cli_options *o) {
    nm_error err = {0};
    if (!o->output) return fail("plan needs -o PLAN.json%s%s", "", "");
    if (!o->calib || !o->profile)
        return fail("plan needs --calib FILE and --profile FILE%s%s", "", "");
    if (nm_outfile_check(o->output, &err) != NM_OK) return fail_err(&err);
    nm_plan_params pp = nm_plan_default_params();
    int32_t tiers[MAX_LIST];
    nm_status st = NM_OK;
    if (o->tiers) {
        int n = parse_int_list(o->tiers, "--tiers", 1, 1 << 16, tiers, MAX_LIST, &err);
        if (n < 0) return fail_err(&err);
        for (int i = 1; i < n; i++)
            if (tiers[i] <= tiers[i - 1])
                return fail("--tiers must be ascending: '%s'%s", o->tiers, "");
        pp.tiers = tiers;
        pp.n_tiers = n;
    }
    if (o->quantile > 0) pp.quantile = o->quantile;
    /* --tiers alone means the quantile objective, whose option it is */
    if (o->objective ? strcmp(o->objective, "quantile") == 0 : o->tiers != NULL)
        pp.objective = NM_PLAN_QUANTILE;
    else if (o->objective && strcmp(o->objective, "budget") != 0)
        return fail("--objective: '%s' is not budget or quantile%s", o->objective, "");
    if (o->rows && o->budget_ms > 0)
        return fail("give --rows or --budget-ms, not both%s%s", "", "");
    pp.budget_rows = o->rows;
    pp.budget_ms = o->budget_ms;
    pp.granule = o->granule;
    if (o->overflow) st = nm_overflow_parse(o->overflow, &pp.overflow, &err);
    if (st == NM_OK && o->salience) st = nm_salience_parse(o->salience, &pp.salience, &err);
    pp.device_memory_bytes = o->device_memory;
    if (st == NM_OK && o->dense) st = nm_dense_placement_parse(o->dense, &pp.dense, &err);
    nm_calib *calib = NULL;
    nm_profile prof;
    memset(&prof, 0, sizeof prof);
    nm_plan *plan = NULL;
    if (st == NM_OK) st = nm_calib_load(o->calib, &calib, &err);
    if (st == NM_OK) st = nm_profile_load(o->profile, &prof, &err);
    if (st == NM_OK) st = nm_plan_create(model, calib, &prof, &pp, &plan, &err);
    if (st == NM_OK) st = nm_plan_save(plan, o->output, &err);
    int rc = 0;
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        nm_plan_describe(plan, stdout);
        printf("-> %s\n", o->output);
    }
    nm_plan_free(plan);
    nm_profile_free(&prof);
    nm_calib_free(calib);
    return rc;
}
