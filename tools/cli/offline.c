/* The offline half of the NPUMoE loop: npumoe calibrate (per-chunk expert
 * loads of a text), npumoe profile (what the device and the host cost) and
 * npumoe plan (tiers, groups, residency from both). */
#include "cli.h"

#include "model/model.h"
#include "plan/plan.h"

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
static double top_quarter_share(const nm_calib *c, int32_t layer) {
    double mean[1024], total = 0;
    const int32_t n = c->n_expert < 1024 ? c->n_expert : 1024;
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
    const size_t usable = n - n % (size_t)chunk;
    if (usable == 0) {
        free(ids);
        snprintf(err.msg, sizeof err.msg, "the text has %zu tokens, less than one chunk of %d", n,
                 chunk);
        return fail_err(&err);
    }
    cli_options so = *o;
    so.ctx = window;
    so.batch = chunk;
    so.chunk = 0;
    cli_session cs;
    nm_calib *calib = NULL;
    nm_status st = open_session(model, &so, false, &cs, &err);
    nm_moe_shape shape;
    nm_model_moe_shape(model, &shape);
    if (st == NM_OK) st = nm_calib_new(&shape, chunk, &calib, &err);
    int rc = 0;
    if (st == NM_OK) {
        /* whole chunks only: each window is a multiple of the chunk, so every
         * batch the session runs is a full chunk */
        nm_session_set_load_fn(cs.session, nm_calib_record, calib);
        const double t0 = now_s();
        cli_progress line;
        progress_start(&line);
        for (size_t done = 0; done < usable && st == NM_OK;) {
            const size_t len = usable - done < (size_t)window ? usable - done : (size_t)window;
            nm_session_reset(cs.session);
            st = nm_session_eval(cs.session, ids + done, (int32_t)len, NULL, false, &err);
            done += len;
            const double el = now_s() - t0;
            progress_update(&line, done == usable || st != NM_OK,
                            "calibrate: %zu/%zu tokens, %" PRId64 " chunks (%.1f s, ~%.0f s left)",
                            done, usable, calib->n_chunks, el,
                            el / (double)done * (double)(usable - done));
        }
    }
    if (st == NM_OK) st = nm_calib_save(calib, o->output, &err);
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        printf("calibration: %" PRId64
               " chunks of %d tokens, %d layers x %d experts, top-%d -> %s\n",
               calib->n_chunks, chunk, calib->n_layer, calib->n_expert, calib->k, o->output);
        printf("share of assignments taken by the most popular quarter of experts, per layer:\n");
        for (int32_t l = 0; l < calib->n_layer; l++)
            printf("  layer %2d: %5.1f%%\n", l, 100.0 * top_quarter_share(calib, l));
    }
    nm_calib_free(calib);
    close_session(&cs);
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
    const nm_hparams *hp = &model->hp;
    const int32_t chunk = o->chunk ? o->chunk : DEFAULT_CHUNK;
    int32_t experts[MAX_LIST], caps[MAX_LIST];
    int n_e = 0, n_c = 0;
    if (o->grid_experts) {
        n_e = parse_int_list(o->grid_experts, "--grid-experts", 1, hp->n_expert, experts, MAX_LIST,
                             &err);
        if (n_e < 0) return fail_err(&err);
    } else {
        for (int32_t e = 1; e <= hp->n_expert && n_e < MAX_LIST; e *= 2)
            experts[n_e++] = e;
    }
    if (o->grid_capacity) {
        n_c = parse_int_list(o->grid_capacity, "--grid-capacity", 1, 1 << 16, caps, MAX_LIST, &err);
        if (n_c < 0) return fail_err(&err);
    } else {
        for (int32_t c = 4; c <= chunk && n_c < MAX_LIST; c *= 2)
            caps[n_c++] = c;
        if (caps[n_c - 1] != chunk && n_c < MAX_LIST) caps[n_c++] = chunk;
    }
    nm_device *dev = NULL;
    nm_pool *pool = NULL;
    nm_profile prof;
    memset(&prof, 0, sizeof prof);
    const int reps = o->reps ? o->reps : 5;
    int32_t *loads = nm_malloc((size_t)hp->n_expert * sizeof *loads);
    double step_ms = 0;
    nm_status st = loads ? NM_OK : nm_errorf(&err, NM_ERR_NOMEM, "out of memory");
    if (st == NM_OK)
        st = nm_device_new(o->device ? o->device : "cpu", o->device_threads ? o->device_threads : 1,
                           &dev, &err);
    if (st == NM_OK) st = nm_pool_new(o->threads ? o->threads : nm_cpu_count(), &pool, &err);
    cli_progress line;
    progress_start(&line);
    if (st == NM_OK) {
        fprintf(stderr, "profile: the host MoE step over a chunk of %d tokens\n", chunk);
        st = nm_model_time_host_step(model, pool, chunk, 4 * reps, &step_ms, loads, &err);
    }
    if (st == NM_OK)
        st = nm_device_profile(dev, &model->layers[0].experts, hp->n_embd, hp->n_ff_exp, experts,
                               n_e, caps, n_c, reps, pool, profile_progress, &line, &prof, &err);
    if (st == NM_OK) nm_profile_set_overhead(&prof, chunk, step_ms, loads, hp->n_expert);
    nm_free(loads);
    if (st == NM_OK) st = nm_profile_save(&prof, o->output, &err);
    int rc = 0;
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        printf("device %s: dispatch+sync %.4f ms; host %.4f ms per expert + %.5f ms per row "
               "+ %.4f ms per layer and chunk of %d\n",
               prof.device, prof.dispatch_ms, prof.host_expert_ms, prof.host_row_ms,
               prof.host_overhead_ms, prof.chunk);
        printf("graph time (ms), experts per graph x rows per expert:\n%10s", "");
        for (int c = 0; c < n_c; c++)
            printf(" %9d", caps[c]);
        for (int32_t i = 0; i < prof.n_points; i++) {
            if (i % n_c == 0) printf("\n%10d", prof.points[i].n_experts);
            printf(" %9.4f", prof.points[i].graph_ms);
        }
        printf("\n-> %s\n", o->output);
    }
    nm_profile_free(&prof);
    nm_pool_free(pool);
    nm_device_free(dev);
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
    nm_calib *calib = NULL;
    nm_profile prof;
    memset(&prof, 0, sizeof prof);
    nm_plan *plan = NULL;
    if (st == NM_OK) st = nm_calib_load(o->calib, &calib, &err);
    if (st == NM_OK) st = nm_profile_load(o->profile, &prof, &err);
    nm_moe_shape shape;
    nm_model_moe_shape(model, &shape);
    if (st == NM_OK) st = nm_plan_make(&shape, calib, &prof, &pp, &plan, &err);
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
