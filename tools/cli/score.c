/* npumoe perplexity and npumoe compare: a text scored in windows by a
 * reference session and, for compare, a candidate configuration. */
#include "cli.h"

#include <inttypes.h>
#include <stdlib.h>

typedef struct progress_state {
    double t0;
    bool compare;
    cli_progress line;
} progress_state;

static void print_progress(void *p, int32_t done, int32_t total, const nm_accuracy *acc) {
    progress_state *ps = p;
    if (done == 0) {
        fprintf(stderr,
                "scoring %d windows of %d tokens; the second half of each window is scored, "
                "as llama.cpp's llama-perplexity does\n",
                total, acc->n_ctx);
        return;
    }
    const double elapsed = now_s() - ps->t0;
    char cand[160] = "";
    if (ps->compare)
        snprintf(cand, sizeof cand, ", candidate %.4f, mean KL %.6f, top-1 %.2f%%",
                 nm_nll_stats_ppl(&acc->cand), acc->kl_sum / (double)acc->cand.count,
                 100.0 * (double)acc->top1_same / (double)acc->cand.count);
    progress_update(&ps->line, done == total, "[%d/%d] ppl %.4f%s (%.1f s, ~%.0f s left)", done,
                    total, nm_nll_stats_ppl(&acc->ref), cand, elapsed,
                    elapsed / done * (total - done));
}

/* doc with more's members added after its own; NULL (both freed) when
 * either is NULL, which is how running out of memory shows. */
static json_t *with(json_t *doc, json_t *more) {
    if (json_object_update_new(doc, more) == 0) return doc;
    json_decref(doc);
    return NULL;
}

int cmd_score(nm_model *model, const cli_options *o, bool compare) {
    nm_error err = {0};
    size_t n = 0;
    int32_t *ids = prompt_ids(model, o, &n, &err);
    if (!ids) return fail_err(&err);
    nm_model_info info;
    nm_model_get_info(model, &info);
    /* windows of the trained context when it is shorter than 512: a model
     * scored past it is scored on positions it never learned */
    const int32_t n_ctx = o->ctx                                           ? o->ctx
                          : info.n_ctx_train > 0 && info.n_ctx_train < 512 ? info.n_ctx_train
                                                                           : 512;
    cli_options ro = *o;
    ro.ctx = n_ctx;
    nm_model *cand_model = NULL;
    cli_session ref_cs = {0}, cand_cs = {0};
    /* perplexity runs in the options' mode; compare's reference is dense and
     * its candidate gets the mode, plan and device */
    nm_status st = open_session(model, &ro, !compare, &ref_cs, &err);
    if (st == NM_OK && compare && (o->cand_model || o->cand_compat)) {
        /* the candidate: another file, or the same one under other semantics */
        nm_model_params mp = nm_model_default_params();
        mp.no_repack = cli_no_repack(o);
        const char *compat = o->cand_compat ? o->cand_compat : o->compat;
        if (compat) st = nm_compat_parse(compat, &mp.compat, &err);
        if (st == NM_OK)
            st = nm_model_load(o->cand_model ? o->cand_model : o->model, &mp, &cand_model, &err);
    }
    if (st == NM_OK && compare) {
        cli_options co = ro;
        if (o->cand_threads) co.threads = o->cand_threads;
        if (o->cand_batch) co.batch = o->cand_batch;
        st = open_session(cand_model ? cand_model : model, &co, true, &cand_cs, &err);
    }
    nm_accuracy acc;
    progress_state ps = {.t0 = now_s(), .compare = compare};
    progress_start(&ps.line);
    cli_cost cost; /* both sessions' whole scoring */
    cost_start(&cost);
    if (st == NM_OK) {
        st = nm_score_text(ref_cs.session, cand_cs.session, ids, n, n_ctx,
                           info.add_bos ? info.bos_id : -1, print_progress, &ps, &acc, &err);
    }
    cost_stop(&cost);
    int rc = 0;
    if (st != NM_OK) {
        rc = fail_err(&err);
    } else {
        const double seconds = now_s() - ps.t0;
        const double ppl = nm_nll_stats_ppl(&acc.ref), ppl_err = nm_nll_stats_ppl_err(&acc.ref);
        const double cppl = nm_nll_stats_ppl(&acc.cand), cppl_err = nm_nll_stats_ppl_err(&acc.cand);
        const double scored = (double)acc.ref.count;
        /* the static path's metrics: the candidate's in compare, else the session's */
        nm_session_metrics mt;
        nm_session_get_metrics(compare ? cand_cs.session : ref_cs.session, &mt);
        const nm_plan *used_plan = compare ? cand_cs.plan : ref_cs.plan;
        if (o->json) {
            json_t *doc = json_pack("{s:i, s:i, s:I, s:o, s:o}", "n_ctx", n_ctx, "windows",
                                    acc.n_windows, "tokens_scored", (json_int_t)acc.ref.count,
                                    "perplexity", json_fixed(ppl, 6), "perplexity_err",
                                    json_fixed(ppl_err, 6));
            if (compare)
                doc = with(doc, json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "candidate_perplexity",
                                          json_fixed(cppl, 6), "candidate_perplexity_err",
                                          json_fixed(cppl_err, 6), "ppl_change_percent",
                                          json_fixed(100.0 * (cppl / ppl - 1.0), 6), "kl_mean",
                                          json_fixed(acc.kl_sum / scored, 9), "kl_max",
                                          json_fixed(acc.kl_max, 9), "top1_agreement",
                                          json_fixed((double)acc.top1_same / scored, 6)));
            nm_plan_info pi;
            if (used_plan) nm_plan_get_info(used_plan, &pi);
            if (used_plan)
                doc = with(doc, json_pack("{s:o, s:o}", "predicted_drop_rate",
                                          json_fixed(pi.predicted_drop_rate, 6),
                                          "predicted_drop_weight",
                                          json_fixed(pi.predicted_drop_weight, 6)));
            doc = with(doc, json_pack("{s:o, s:o, s:o}", "seconds", json_fixed(seconds, 3), "moe",
                                      metrics_json(&mt), "cost", cost_json(&cost)));
            rc = print_json(stdout, doc, JSON_COMPACT);
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
        if (!o->json) print_cost_text(stderr, "scoring", &cost);
        if (!o->json) print_metrics_text(stderr, &mt);
        /* npumoe mode: the host groups keep everything, so the plan's
         * capacities, and what it predicts, apply only in tiers and grouped */
        if (!o->json && used_plan && (mt.mode == NM_MODE_TIERS || mt.mode == NM_MODE_GROUPED))
            print_overflow_prediction(stderr, used_plan, &mt.total);
    }
    free(ids);
    close_session(&ref_cs);
    close_session(&cand_cs);
    nm_model_free(cand_model);
    return rc;
}
