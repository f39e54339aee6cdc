/* Plans as files and the whole path: plan files through save and load,
 * refused for another model; malformed calibration, profile and plan files,
 * each refused with a message naming what is wrong; allocation failures at
 * every step without leaks (LeakSanitizer in the sanitizer build); and the
 * tiny model end to end: calibrate a session, profile the cpu device,
 * plan, run the plan and compare with the dense logits. */
#include "plan_fixtures.h"

#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TMP(name) NM_BUILD_DIR "/test_plan_files_" name

/* ---- plan files ---- */

static void check_same_plan(const nm_plan *a, const nm_plan *b) {
    CHECK(strcmp(a->fingerprint.hex, b->fingerprint.hex) == 0);
    CHECK(strcmp(a->device, b->device) == 0);
    CHECK_INT_EQ(a->moe.chunk, b->moe.chunk);
    CHECK_INT_EQ(a->moe.n_layer, b->moe.n_layer);
    CHECK_INT_EQ(a->moe.n_expert, b->moe.n_expert);
    CHECK_INT_EQ(a->first_layer, b->first_layer);
    CHECK_INT_EQ(a->n_shared, b->n_shared);
    CHECK_INT_EQ(a->d_ff_shared, b->d_ff_shared);
    CHECK_INT_EQ(a->moe.overflow, b->moe.overflow);
    CHECK_INT_EQ(a->moe.salience, b->moe.salience);
    CHECK(a->quantile == b->quantile);
    CHECK_INT_EQ(a->objective, b->objective);
    CHECK_INT_EQ(a->granule, b->granule);
    CHECK(a->predicted_drop_rate == b->predicted_drop_rate);
    CHECK(a->predicted_drop_weight == b->predicted_drop_weight);
    for (int l = 0; l < a->moe.n_layer && l < b->moe.n_layer; l++)
        CHECK_INT_EQ(a->budget_rows[l], b->budget_rows[l]);
    CHECK(a->predicted_chunk_ms == b->predicted_chunk_ms);
    CHECK_INT_EQ(a->device_bytes, b->device_bytes);
    CHECK_INT_EQ(a->n_tiers, b->n_tiers);
    for (int i = 0; i < a->n_tiers && i < b->n_tiers; i++)
        CHECK_INT_EQ(a->tiers[i], b->tiers[i]);
    for (int l = 0; l < a->moe.n_layer && l < b->moe.n_layer; l++) {
        CHECK(a->layer_cost[l].device_ms == b->layer_cost[l].device_ms);
        CHECK(a->layer_cost[l].host_ms == b->layer_cost[l].host_ms);
        CHECK(a->layer_cost[l].chunk_ms == b->layer_cost[l].chunk_ms);
        const nm_moe_layer_plan *la = &a->moe.layers[l], *lb = &b->moe.layers[l];
        CHECK_INT_EQ(la->n_groups, lb->n_groups);
        for (int g = 0; g < la->n_groups && g < lb->n_groups; g++) {
            CHECK_INT_EQ(la->groups[g].capacity, lb->groups[g].capacity);
            CHECK_INT_EQ(la->groups[g].on_device, lb->groups[g].on_device);
            CHECK_INT_EQ(la->groups[g].n_experts, lb->groups[g].n_experts);
            for (int i = 0; i < la->groups[g].n_experts && i < lb->groups[g].n_experts; i++)
                CHECK_INT_EQ(la->groups[g].experts[i], lb->groups[g].experts[i]);
        }
    }
}

/* nm_plan_describe's text (free() it), or NULL. */
static char *describe(const nm_plan *p) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) return NULL;
    nm_plan_describe(p, f);
    fclose(f);
    return text;
}

/* A model with shared experts (its shape says so, as qwen2moe's and
 * deepseek2's do): the plan records them, reads them back, prints them, and
 * a model whose shared experts differ, or that has none, refuses it; the
 * plan of a model without them has no such keys. */
static void test_plan_shared(const nm_model *m, const nm_calib *c, const nm_profile *prof,
                             const nm_plan_params *pp) {
    nm_moe_shape sh = *shape(m);
    sh.n_shared = 2;
    sh.d_ff_shared = 64;
    nm_plan *p = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_plan_make(&sh, c, prof, pp, &p, &err), NM_OK);
    if (!p) return;
    CHECK_INT_EQ(p->n_shared, 2);
    CHECK_INT_EQ(p->d_ff_shared, 64);
    char *text = NULL;
    size_t n = 0;
    CHECK_INT_EQ(nm_plan_save_memory(p, &text, &n, &err), NM_OK);
    CHECK(text && contains(text, "\"shared_experts\": 2") &&
          contains(text, "\"shared_expert_ff\": 64"));
    nm_plan *r = NULL;
    CHECK_INT_EQ(nm_plan_load_memory(text, n, "s.plan.json", &sh, &r, &err), NM_OK);
    if (r) check_same_plan(p, r);
    nm_plan_free(r);
    r = NULL;
    CHECK_INT_EQ(nm_plan_load_memory(text, n, "s.plan.json", shape(m), &r, &err),
                 NM_ERR_INVALID_ARG);
    CHECK_MSG(err,
              "the plan is for 2 shared experts of width 64 in all, the model has 0 of width 0");
    CHECK(r == NULL);
    nm_moe_shape wider = sh;
    wider.d_ff_shared = 128;
    CHECK_INT_EQ(nm_plan_load_memory(text, n, "s.plan.json", &wider, &r, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "the model has 2 of width 128");
    CHECK(r == NULL);
    nm_free(text);
    char *desc = describe(p);
    CHECK(desc && contains(desc, "shared:     2 shared experts (d_ff 64 in all) on every token"));
    free(desc);
    nm_plan_free(p);
    p = make_plan(m, c, prof, pp);
    if (!p) return;
    CHECK_INT_EQ(nm_plan_save_memory(p, &text, &n, &err), NM_OK);
    CHECK(text && !contains(text, "shared"));
    nm_free(text);
    nm_plan_free(p);
}

static void test_plan_files(const nm_model *m, const nm_model *other, const nm_calib *c) {
    nm_profile prof = make_profile(0.1, 0.001);
    nm_error err = {0};
    /* a budgeted plan */
    nm_plan_params bp = nm_plan_default_params();
    bp.overflow = NM_OVERFLOW_DROP;
    bp.granule = 4;
    bp.budget_rows = 44;
    nm_plan *p = make_plan(m, c, &prof, &bp);
    if (p) {
        CHECK_INT_EQ(nm_plan_save(p, TMP("budget.plan.json"), &err), NM_OK);
        nm_plan *r = NULL;
        CHECK_INT_EQ(nm_plan_load(TMP("budget.plan.json"), shape(m), &r, &err), NM_OK);
        if (r) check_same_plan(p, r);
        nm_plan_free(r);
        char *text = describe(p);
        CHECK(text != NULL);
        if (text) {
            CHECK(contains(text, "tiers:      4 8 12 16 (multiples of 4 rows: the least expected "
                                 "dropped routing weight"));
            CHECK(contains(text, "objective:  budget, 44 rows per layer and chunk"));
            CHECK(contains(text, "overflow predicted on the calibration: "));
        }
        free(text);
    }
    nm_plan_free(p);

    const nm_plan_params qp = qparams();
    p = make_plan(m, c, &prof, &qp);
    if (!p) return;
    CHECK_INT_EQ(nm_plan_save(p, TMP("a.plan.json"), &err), NM_OK);
    nm_plan *r = NULL;
    CHECK_INT_EQ(nm_plan_load(TMP("a.plan.json"), shape(m), &r, &err), NM_OK);
    if (r) check_same_plan(p, r);
    nm_plan_free(r);
    r = NULL;
    CHECK_INT_EQ(nm_plan_load(TMP("a.plan.json"), NULL, &r, &err), NM_OK); /* no model */
    if (r) check_same_plan(p, r);
    nm_plan_free(r);
    r = NULL;
    if (other) {
        nm_fingerprint fo;
        nm_model_fingerprint(other, &fo);
        CHECK_INT_EQ(nm_plan_load(TMP("a.plan.json"), shape(other), &r, &err), NM_ERR_INVALID_ARG);
        CHECK_MSG(err, "another model");
        CHECK_MSG(err, p->fingerprint.hex);
        CHECK_MSG(err, fo.hex);
        CHECK_MSG(err, "a.plan.json");
        CHECK(r == NULL);
    }
    /* the summary names the device, the tiers and every layer */
    char *text = describe(p);
    CHECK(text != NULL);
    if (text) {
        CHECK(contains(text, "synthetic"));
        CHECK(contains(text, "tiers:      1 2 4 8 16"));
        CHECK(contains(text, "layer 2:"));
        CHECK(contains(text, "device tier   16"));
        CHECK(contains(text, "host   tier    4"));
        CHECK(!contains(text, "shared"));
    }
    free(text);
    nm_plan_free(p);
    test_plan_shared(m, c, &prof, &qp);
}

/* ---- malformed files ---- */

/* A valid plan for the tiny model; layer 0 is written differently from the
 * others so a replacement can target it. */
static char plan_text[4096];

static void make_plan_text(const nm_model *m) {
    nm_fingerprint fp;
    nm_model_fingerprint(m, &fp);
    snprintf(plan_text, sizeof plan_text,
             "{\"format\": \"npumoe-plan\", \"version\": 2, \"fingerprint\": \"%s\",\n"
             " \"device\": \"cpu\", \"chunk\": 16, \"n_layer\": 3, \"n_expert\": 8,\n"
             " \"tiers\": [4, 16], \"overflow\": \"spill\", \"salience\": \"router\",\n"
             " \"objective\": \"quantile\", \"granule\": 0, \"quantile\": 0.95,\n"
             " \"predicted_drop_rate\": 0.01, \"predicted_drop_weight\": 0.002,\n"
             " \"predicted_chunk_ms\": 6, \"device_bytes\": 1000,\n"
             " \"layers\": [\n"
             "  {\"budget_rows\": 80,\n"
             "   \"groups\": [{\"tier\": 16, \"experts\": [3, 2, 1, 0], \"device\": true},\n"
             "              {\"tier\": 4, \"experts\": [7, 6, 5, 4], \"device\": false}],\n"
             "   \"cost\": {\"device_ms\": 1, \"host_ms\": 2, \"chunk_ms\": 2}},\n"
             "  {\"budget_rows\": 80, \"groups\": [{\"tier\": 16, \"experts\": [0, 1, 2, 3], "
             "\"device\": true},\n"
             "              {\"tier\": 4, \"experts\": [4, 5, 6, 7], \"device\": false}],\n"
             "   \"cost\": {\"device_ms\": 1, \"host_ms\": 2, \"chunk_ms\": 2}},\n"
             "  {\"budget_rows\": 80, \"groups\": [{\"tier\": 16, \"experts\": [0, 1, 2, 3], "
             "\"device\": true},\n"
             "              {\"tier\": 4, \"experts\": [4, 5, 6, 7], \"device\": false}],\n"
             "   \"cost\": {\"device_ms\": 1, \"host_ms\": 2, \"chunk_ms\": 2}}]}\n",
             fp.hex);
}

/* A valid calibration: 1 layer, 2 experts, top-1, chunks of 4. Chunk one:
 * 4 tokens, loads 3 and 1; chunk two: 2 tokens, loads 0 and 2. */
static const char calib_text[] =
    "{\"format\": \"npumoe-calib\", \"version\": 2, \"fingerprint\": \"0123456789abcdef\",\n"
    " \"chunk\": 4, \"k\": 1, \"n_layer\": 1, \"n_expert\": 2, \"n_chunks\": 2, \"n_tokens\": 6,\n"
    " \"layers\": [{\"experts\": [\n"
    "  {\"mean\": 1.5, \"max\": 3, \"q50\": 0, \"q90\": 3, \"q95\": 3, \"q99\": 3,\n"
    "   \"hist\": [[0, 1], [3, 1]], \"ranked\": [0.75, 0.5, 0.25]},\n"
    "  {\"mean\": 1.5, \"max\": 2, \"q50\": 1, \"q90\": 2, \"q95\": 2, \"q99\": 2,\n"
    "   \"hist\": [[1, 1], [2, 1]], \"ranked\": [1.5, 0.5]}]}]}\n";

static const char profile_text[] =
    "{\"format\": \"npumoe-profile\", \"version\": 1, \"device\": \"cpu\", \"d_model\": 64,\n"
    " \"d_ff\": 32, \"weight_type\": \"f32\", \"dispatch_ms\": 0.01, \"host_row_ms\": 0.002,\n"
    " \"host_expert_ms\": 0, \"chunk\": 8, \"host_overhead_ms\": 0.004, \"points\": [\n"
    "  {\"n_experts\": 1, \"capacity\": 4, \"graph_ms\": 0.02},\n"
    "  {\"n_experts\": 1, \"capacity\": 8, \"graph_ms\": 0.03},\n"
    "  {\"n_experts\": 2, \"capacity\": 4, \"graph_ms\": 0.03},\n"
    "  {\"n_experts\": 2, \"capacity\": 8, \"graph_ms\": 0.05}]}\n";

/* text with the first occurrence of from replaced by to (static buffer). */
static const char *edit(const char *text, const char *from, const char *to) {
    static char out[8192];
    const char *at = strstr(text, from);
    if (!at) {
        fprintf(stderr, "edit: \"%s\" not in the text\n", from);
        nm_test_failures++;
        return text;
    }
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return out;
}

typedef enum kind { PLAN, CALIB, PROFILE } kind;

/* Loads text as kind; expects status and a message containing part. */
static void expect_refused(kind k, const nm_model *m, const char *text, size_t n, nm_status status,
                           const char *part, int line) {
    nm_error err = {0};
    nm_status st;
    if (k == PLAN) {
        nm_plan *p = NULL;
        st = nm_plan_load_memory(text, n, "bad.plan.json", shape(m), &p, &err);
        CHECK(p == NULL);
        nm_plan_free(p);
    } else if (k == CALIB) {
        nm_calib *c = NULL;
        st = nm_calib_load_memory(text, n, "bad.calib.json", &c, &err);
        CHECK(c == NULL);
        nm_calib_free(c);
    } else {
        nm_profile pr;
        st = nm_profile_load_memory(text, n, "bad.profile.json", &pr, &err);
        CHECK(pr.points == NULL);
        if (st == NM_OK) nm_profile_free(&pr);
    }
    nm_test_checks++;
    if (st != status || !contains(err.msg, part) ||
        !contains(err.msg, k == PLAN    ? "bad.plan.json: "
                           : k == CALIB ? "bad.calib.json: "
                                        : "bad.profile.json: ")) {
        nm_test_failures++;
        fprintf(stderr, "%s:%d: status %s (want %s), message \"%s\" (want \"%s\")\n", __FILE__,
                line, nm_status_str(st), nm_status_str(status), err.msg, part);
    }
}

#define REFUSE(k, m, text, status, part)                                                           \
    expect_refused(k, m, text, strlen(text), status, part, __LINE__)

static void test_malformed(const nm_model *m, const nm_model *other) {
    make_plan_text(m);
    nm_error err = {0};
    /* the templates themselves load */
    nm_plan *p = NULL;
    CHECK_INT_EQ(nm_plan_load_memory(plan_text, strlen(plan_text), "ok", shape(m), &p, &err),
                 NM_OK);
    if (!p) fprintf(stderr, "template plan: %s\n", err.msg);
    nm_plan_free(p);
    nm_calib *c = NULL;
    CHECK_INT_EQ(nm_calib_load_memory(calib_text, strlen(calib_text), "ok", &c, &err), NM_OK);
    if (!c) fprintf(stderr, "template calib: %s\n", err.msg);
    if (c) CHECK_INT_EQ(nm_calib_quantile(c, 0, 0, 0.5), 0);
    nm_calib_free(c);
    nm_profile pr;
    CHECK_INT_EQ(nm_profile_load_memory(profile_text, strlen(profile_text), "ok", &pr, &err),
                 NM_OK);
    if (pr.points)
        nm_profile_free(&pr);
    else
        fprintf(stderr, "template profile: %s\n", err.msg);

    const char *pt = plan_text;
    /* plans */
    expect_refused(PLAN, m, pt, strlen(pt) / 2, NM_ERR_FORMAT, "line ", __LINE__); /* truncated */
    expect_refused(PLAN, m, "", 0, NM_ERR_FORMAT, "line 1", __LINE__);
    REFUSE(PLAN, m, "[1, 2]", NM_ERR_FORMAT, "expected a npumoe-plan object");
    REFUSE(PLAN, m, edit(pt, "npumoe-plan", "npumoe-calib"), NM_ERR_FORMAT,
           "not a npumoe-plan file");
    REFUSE(PLAN, m, calib_text, NM_ERR_FORMAT, "not a npumoe-plan file");
    REFUSE(PLAN, m, edit(pt, "\"version\": 2", "\"version\": 3"), NM_ERR_UNSUPPORTED, "version 3");
    REFUSE(PLAN, m, edit(pt, "\"version\": 2", "\"version\": 1"), NM_ERR_UNSUPPORTED,
           "npumoe-plan version 1 was written by an older npumoe (this one reads version 2): "
           "make the plan again with `npumoe plan`");
    REFUSE(PLAN, m, edit(pt, "\"version\": 2,", ""), NM_ERR_NOT_FOUND, "missing key 'version'");
    REFUSE(PLAN, m, edit(pt, "\"n_expert\": 8,", "\"n_expert\": 8, \"shared_experts\": 0,"),
           NM_ERR_FORMAT, "shared_experts");
    REFUSE(PLAN, m, edit(pt, "\"n_expert\": 8,", "\"n_expert\": 8, \"shared_experts\": 65,"),
           NM_ERR_FORMAT, "shared_experts");
    REFUSE(PLAN, m, edit(pt, "\"n_expert\": 8,", "\"n_expert\": 8, \"shared_experts\": 1,"),
           NM_ERR_NOT_FOUND, "missing key 'shared_expert_ff'");
    REFUSE(PLAN, m, edit(pt, "\"n_expert\": 8,", "\"n_expert\": 8, \"shared_expert_ff\": 64,"),
           NM_ERR_FORMAT, "shared_expert_ff without shared_experts");
    REFUSE(PLAN, m,
           edit(pt, "\"n_expert\": 8,",
                "\"n_expert\": 8, \"shared_experts\": 1, \"shared_expert_ff\": 64,"),
           NM_ERR_INVALID_ARG, "the plan is for 1 shared experts of width 64 in all");
    REFUSE(PLAN, m, edit(pt, "\"quantile\",", "\"greedy\","), NM_ERR_FORMAT,
           "objective: unknown \"greedy\"");
    REFUSE(PLAN, m, edit(pt, "\"granule\": 0", "\"granule\": 4"), NM_ERR_FORMAT,
           "granule: 4, but a quantile plan has none");
    REFUSE(PLAN, m, edit(pt, "\"quantile\",", "\"budget\","), NM_ERR_FORMAT,
           "tiers: a budgeted plan's tiers are the multiples of its granule (0)");
    static char budget_text[4096]; /* edit's result is overwritten by the next edit */
    snprintf(budget_text, sizeof budget_text, "%s", edit(pt, "\"quantile\",", "\"budget\","));
    REFUSE(PLAN, m, edit(budget_text, "\"granule\": 0", "\"granule\": 4"), NM_ERR_FORMAT,
           "multiples of its granule (4) up to the chunk (16)");
    REFUSE(PLAN, m, edit(pt, "\"budget_rows\": 80", "\"budget_rows\": 79"), NM_ERR_FORMAT,
           "layers[0]: the groups reserve 80 rows per chunk, over the budget_rows 79");
    REFUSE(PLAN, m, edit(pt, "\"budget_rows\": 80", "\"budget_rows\": -1"), NM_ERR_FORMAT,
           "layers[0].budget_rows");
    REFUSE(PLAN, m, edit(pt, "\"predicted_drop_rate\": 0.01", "\"predicted_drop_rate\": 2"),
           NM_ERR_FORMAT, "predicted_drop_rate");
    REFUSE(PLAN, m, edit(pt, "\"predicted_drop_weight\": 0.002,", ""), NM_ERR_NOT_FOUND,
           "predicted_drop_weight");
    if (other) {
        nm_fingerprint fo, fm;
        nm_model_fingerprint(other, &fo);
        nm_model_fingerprint(m, &fm);
        REFUSE(PLAN, other, pt, NM_ERR_INVALID_ARG, fo.hex);
        REFUSE(PLAN, other, pt, NM_ERR_INVALID_ARG, fm.hex);
        REFUSE(PLAN, m, edit(pt, fm.hex, fo.hex), NM_ERR_INVALID_ARG, "another model");
    }
    REFUSE(PLAN, m, edit(pt, "\"fingerprint\": \"", "\"fingerprint\": \"X"), NM_ERR_FORMAT,
           "16 lowercase hex digits");
    REFUSE(PLAN, m, edit(pt, "\"chunk\": 16", "\"chunk\": 8"), NM_ERR_FORMAT,
           "tiers[1]: expected an integer in [1, 8], got 16");
    REFUSE(PLAN, m, edit(pt, "\"chunk\": 16", "\"chunk\": 0"), NM_ERR_FORMAT, "chunk");
    REFUSE(PLAN, m, edit(pt, "\"n_layer\": 3", "\"n_layer\": 4"), NM_ERR_INVALID_ARG,
           "4 layers of 8 experts, the model has 3 of 8");
    REFUSE(PLAN, NULL, edit(pt, "\"n_layer\": 3", "\"n_layer\": 4"), NM_ERR_FORMAT,
           "layers: 3 entries, n_layer is 4");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1, 8]"), NM_ERR_FORMAT,
           "layers[0].groups[0].experts[3]: expected an integer in [0, 7], got 8");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1, -1]"), NM_ERR_FORMAT, "got -1");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1, 4]"), NM_ERR_FORMAT,
           "layer 0: expert 4 is in more than one group");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1]"), NM_ERR_FORMAT,
           "layer 0: expert 0 is in no group");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[]"), NM_ERR_FORMAT,
           "layers[0].groups[0].experts: 0");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "5"), NM_ERR_FORMAT, "expected an array, got 5");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1, 0.5]"), NM_ERR_FORMAT, "got 0.5");
    REFUSE(PLAN, m, edit(pt, "\"tier\": 16", "\"tier\": -4"), NM_ERR_FORMAT,
           "layers[0].groups[0].tier: expected an integer in [1, 16], got -4");
    REFUSE(PLAN, m, edit(pt, "\"tier\": 16", "\"tier\": 32"), NM_ERR_FORMAT, "got 32");
    REFUSE(PLAN, m, edit(pt, "\"tier\": 16", "\"tier\": 8"), NM_ERR_FORMAT,
           "layers[0].groups[0].tier: 8 is not one of the plan's tiers");
    REFUSE(PLAN, m, edit(pt, "\"tier\": 16", "\"tier\": \"16\""), NM_ERR_FORMAT, "got \"16\"");
    REFUSE(PLAN, m, edit(pt, "[4, 16]", "[16, 4]"), NM_ERR_FORMAT, "ascending");
    REFUSE(PLAN, m, edit(pt, "[4, 16]", "[]"), NM_ERR_FORMAT, "tiers: 0 entries");
    REFUSE(PLAN, m, edit(pt, "\"device\": true", "\"device\": \"yes\""), NM_ERR_FORMAT,
           "expected true or false");
    REFUSE(PLAN, m, edit(pt, "\"device\": \"cpu\"", "\"device\": \"\""), NM_ERR_FORMAT, "device");
    REFUSE(PLAN, m, edit(pt, "\"spill\"", "\"explode\""), NM_ERR_FORMAT,
           "unknown policy \"explode\"");
    REFUSE(PLAN, m, edit(pt, "\"router\"", "\"loud\""), NM_ERR_FORMAT, "salience");
    REFUSE(PLAN, m, edit(pt, "\"quantile\": 0.95", "\"quantile\": 0"), NM_ERR_FORMAT, "quantile");
    REFUSE(PLAN, m, edit(pt, "\"quantile\": 0.95", "\"quantile\": 1.5"), NM_ERR_FORMAT, "quantile");
    REFUSE(PLAN, m, edit(pt, "\"predicted_chunk_ms\": 6", "\"predicted_chunk_ms\": NaN"),
           NM_ERR_FORMAT, "line 6");
    REFUSE(PLAN, m, edit(pt, "\"predicted_chunk_ms\": 6", "\"predicted_chunk_ms\": 1e400"),
           NM_ERR_FORMAT, "line 6");
    REFUSE(PLAN, m, edit(pt, "\"predicted_chunk_ms\": 6", "\"predicted_chunk_ms\": 7"),
           NM_ERR_FORMAT, "not the sum");
    REFUSE(PLAN, m, edit(pt, "\"host_ms\": 2", "\"host_ms\": 1e300"), NM_ERR_FORMAT,
           "layers[0].cost.host_ms: expected a number in [0, 1e+24], got 1e+300");
    REFUSE(PLAN, m, edit(pt, "\"chunk_ms\": 2", "\"chunk_ms\": 1"), NM_ERR_FORMAT,
           "layers[0].cost: chunk_ms 1 is not max");
    REFUSE(PLAN, m, edit(pt, "\"device_ms\": 1", "\"device_ms\": -1"), NM_ERR_FORMAT, "got -1");
    REFUSE(PLAN, m, edit(pt, "\"device_bytes\": 1000", "\"device_bytes\": 1e20"), NM_ERR_FORMAT,
           "device_bytes");
    REFUSE(PLAN, m, edit(pt, "\"layers\": [", "\"players\": ["), NM_ERR_NOT_FOUND,
           "missing key 'layers'");
    REFUSE(PLAN, m, edit(pt, "\"device\": \"cpu\",", "\"device\": \"cpu\", \"device\": \"cpu\","),
           NM_ERR_FORMAT, "duplicate");

    /* calibrations */
    const char *ct = calib_text;
    expect_refused(CALIB, NULL, ct, strlen(ct) - 10, NM_ERR_FORMAT, "line ", __LINE__);
    REFUSE(CALIB, NULL, edit(ct, "npumoe-calib", "npumoe-profile"), NM_ERR_FORMAT,
           "not a npumoe-calib file");
    REFUSE(CALIB, NULL, edit(ct, "0123456789abcdef", "0123456789ABCDEF"), NM_ERR_FORMAT,
           "fingerprint");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[0, 1], [3, 2]]"), NM_ERR_FORMAT,
           "layer 0 expert 0: the histogram counts at least 3 chunks, n_chunks is 2");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[3, 1]]"), NM_ERR_FORMAT,
           "layer 0 expert 0: the histogram counts 1 chunks, n_chunks is 2");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[3, 1], [0, 1]]"), NM_ERR_FORMAT,
           "strictly ascending");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[0, 1], [5, 1]]"), NM_ERR_FORMAT,
           "layers[0].experts[0].hist[1]: expected an integer in [0, 4], got 5");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[0, 1], [3, 0], [4, 1]]"), NM_ERR_FORMAT,
           "got 0");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[0, 1], [3]]"), NM_ERR_FORMAT,
           "expected a pair [load, count]");
    REFUSE(CALIB, NULL, edit(ct, "\"mean\": 1.5", "\"mean\": 1.6"), NM_ERR_FORMAT,
           "layer 0 expert 0: mean 1.6");
    REFUSE(CALIB, NULL, edit(ct, "\"max\": 3", "\"max\": 2"), NM_ERR_FORMAT,
           "layer 0 expert 0: max 2 disagrees");
    REFUSE(CALIB, NULL, edit(ct, "\"q90\": 3", "\"q90\": 2"), NM_ERR_FORMAT,
           "layer 0 expert 0: q90 2 disagrees");
    REFUSE(CALIB, NULL, edit(ct, "\"n_tokens\": 6", "\"n_tokens\": 5"), NM_ERR_FORMAT,
           "layer 0: the experts received 6 assignments in all, but n_tokens 5 x k 1 = 5");
    REFUSE(CALIB, NULL, edit(ct, "\"n_tokens\": 6", "\"n_tokens\": 9"), NM_ERR_FORMAT,
           "n_tokens: expected an integer in [2, 8]");
    REFUSE(CALIB, NULL, edit(ct, "\"k\": 1", "\"k\": 3"), NM_ERR_FORMAT,
           "k: expected an integer in [1, 2]");
    REFUSE(CALIB, NULL, edit(ct, "\"n_expert\": 2", "\"n_expert\": 3"), NM_ERR_FORMAT,
           "layers[0].experts: 2 entries, n_expert is 3");
    REFUSE(CALIB, NULL, edit(ct, "\"chunk\": 4", "\"chunk\": 1e300"), NM_ERR_FORMAT,
           "chunk: expected an integer in [1, 65536]");
    REFUSE(CALIB, NULL, edit(ct, "\"n_chunks\": 2", "\"n_chunks\": -2"), NM_ERR_FORMAT, "n_chunks");
    REFUSE(CALIB, NULL, edit(ct, "\"mean\": 1.5", "\"mean\": null"), NM_ERR_FORMAT, "got null");
    REFUSE(CALIB, NULL, edit(ct, "\"version\": 2", "\"version\": 1"), NM_ERR_UNSUPPORTED,
           "npumoe-calib version 1 was written by an older npumoe (this one reads version 2): "
           "recalibrate with `npumoe calibrate`");
    REFUSE(CALIB, NULL, edit(ct, ", \"ranked\": [1.5, 0.5]", ""), NM_ERR_NOT_FOUND,
           "missing key 'ranked'");
    REFUSE(CALIB, NULL, edit(ct, "[1.5, 0.5]", "[1.5]"), NM_ERR_FORMAT,
           "layers[0].experts[1].ranked: 1 entries, expected one per rank up to the largest "
           "load, 2");
    REFUSE(CALIB, NULL, edit(ct, "[0.75, 0.5, 0.25]", "[0.75, 0.5, 0.6]"), NM_ERR_FORMAT,
           "layers[0].experts[0].ranked[2]: 0.59999999999999998 after 0.5; the weights ranked by "
           "weight cannot grow");
    REFUSE(CALIB, NULL, edit(ct, "[0.75, 0.5, 0.25]", "[0.75, -0.5, -0.6]"), NM_ERR_FORMAT,
           "layers[0].experts[0].ranked[1]");

    /* profiles */
    const char *pf = profile_text;
    REFUSE(PROFILE, NULL,
           edit(pf, "\"capacity\": 8, \"graph_ms\": 0.03}", "\"capacity\": 4, \"graph_ms\": 0.03}"),
           NM_ERR_FORMAT, "1 experts x capacity 4 is measured twice");
    REFUSE(PROFILE, NULL,
           edit(pf, "{\"n_experts\": 2, \"capacity\": 8, \"graph_ms\": 0.05}",
                "{\"n_experts\": 3, \"capacity\": 8, \"graph_ms\": 0.05}"),
           NM_ERR_FORMAT, "not a full grid");
    REFUSE(PROFILE, NULL, edit(pf, "\"n_experts\": 1", "\"n_experts\": 0"), NM_ERR_FORMAT,
           "points[0].n_experts");
    REFUSE(PROFILE, NULL, edit(pf, "\"graph_ms\": 0.02", "\"graph_ms\": 0"), NM_ERR_FORMAT,
           "points[0].graph_ms 0 ms is not a positive time");
    REFUSE(PROFILE, NULL, edit(pf, "\"dispatch_ms\": 0.01", "\"dispatch_ms\": -0.01"),
           NM_ERR_FORMAT, "dispatch_ms");
    REFUSE(PROFILE, NULL, edit(pf, "\"host_row_ms\": 0.002", "\"host_row_ms\": 0"), NM_ERR_FORMAT,
           "host_row_ms 0 ms is not a positive time");
    REFUSE(PROFILE, NULL, edit(pf, "\"f32\"", "\"f99\""), NM_ERR_FORMAT, "weight_type");
    REFUSE(PROFILE, NULL, edit(pf, "\"chunk\": 8", "\"chunk\": 0"), NM_ERR_FORMAT,
           "chunk: expected an integer in [1, 65536]");
    REFUSE(PROFILE, NULL, edit(pf, ", \"chunk\": 8", ""), NM_ERR_NOT_FOUND, "missing key 'chunk'");
    REFUSE(PROFILE, NULL, edit(pf, "\"host_overhead_ms\": 0.004", "\"host_overhead_ms\": -1"),
           NM_ERR_FORMAT, "host_overhead_ms");
    REFUSE(PROFILE, NULL, edit(pf, "\"d_model\": 64", "\"d_model\": 0"), NM_ERR_FORMAT, "d_model");
    REFUSE(PROFILE, NULL, edit(pf, "\"graph_ms\": 0.05", "\"graph_ms\": 1e12"), NM_ERR_FORMAT,
           "graph_ms");
    REFUSE(PROFILE, NULL,
           edit(pf, "\"device\": \"cpu\"",
                "\"device\": \"a device name much longer than thirty-one bytes\""),
           NM_ERR_FORMAT, "device");
    REFUSE(PROFILE, NULL, edit(pf, "\"points\": [", "\"points\": [], \"x\": ["), NM_ERR_FORMAT,
           "points");
}

/* ---- allocation failures ---- */

typedef enum op {
    OP_CALIB_NEW,
    OP_CALIB_SAVE,
    OP_CALIB_LOAD,
    OP_PROFILE_LOAD,
    OP_PLAN_MAKE,
    OP_PLAN_SAVE,
    OP_PLAN_LOAD,
    OP_COUNT
} op;

static nm_status run_op(op o, const nm_model *m, const nm_calib *c, const nm_profile *prof,
                        const nm_plan *plan, nm_error *err) {
    nm_status st = NM_OK;
    switch (o) {
    case OP_CALIB_NEW: {
        nm_calib *r = NULL;
        st = nm_calib_new(shape(m), T, &r, err);
        nm_calib_free(r);
        break;
    }
    case OP_CALIB_SAVE:
        st = nm_calib_save(c, TMP("nomem.calib.json"), err);
        break;
    case OP_CALIB_LOAD: {
        nm_calib *r = NULL;
        st = nm_calib_load(TMP("a.calib.json"), &r, err);
        nm_calib_free(r);
        break;
    }
    case OP_PROFILE_LOAD: {
        nm_profile r;
        st = nm_profile_load(TMP("a.profile.json"), &r, err);
        if (st == NM_OK) nm_profile_free(&r);
        break;
    }
    case OP_PLAN_MAKE: {
        nm_plan *r = NULL;
        nm_plan_params pp = nm_plan_default_params();
        pp.device_memory_bytes = 100000; /* the budget's path too */
        st = nm_plan_make(shape(m), c, prof, &pp, &r, err);
        nm_plan_free(r);
        break;
    }
    case OP_PLAN_SAVE:
        st = nm_plan_save(plan, TMP("nomem.plan.json"), err);
        break;
    case OP_PLAN_LOAD: {
        nm_plan *r = NULL;
        st = nm_plan_load(TMP("a.plan.json"), shape(m), &r, err);
        nm_plan_free(r);
        break;
    }
    case OP_COUNT:
        break;
    }
    return st;
}

static void test_alloc_failures(const nm_model *m, const nm_calib *c) {
    nm_profile prof = make_profile(0.05, 0.001);
    nm_error err = {0};
    nm_plan *plan = make_plan(m, c, &prof, NULL);
    if (!plan) return;
    /* the files the loads read */
    CHECK_INT_EQ(nm_calib_save(c, TMP("a.calib.json"), &err), NM_OK);
    CHECK_INT_EQ(nm_profile_save(&prof, TMP("a.profile.json"), &err), NM_OK);
    CHECK_INT_EQ(nm_plan_save(plan, TMP("a.plan.json"), &err), NM_OK);
    const char *names[OP_COUNT] = {"calib_new", "calib_save", "calib_load", "profile_load",
                                   "plan_make", "plan_save",  "plan_load"};
    for (int o = 0; o < OP_COUNT; o++) {
        int n_failed = 0;
        for (long n = 0; n < 100000; n++) {
            nm_alloc_fail_after(n);
            nm_status st = run_op((op)o, m, c, &prof, plan, &err);
            nm_alloc_fail_after(-1);
            if (st == NM_OK) break;
            if (st != NM_ERR_NOMEM)
                fprintf(stderr, "%s, allocation %ld failing: %s (%s)\n", names[o], n,
                        nm_status_str(st), err.msg);
            CHECK_INT_EQ(st, NM_ERR_NOMEM);
            n_failed++;
        }
        CHECK(n_failed >= 1);
        CHECK_INT_EQ(run_op((op)o, m, c, &prof, plan, &err), NM_OK);
    }
    nm_plan_free(plan);
}

/* ---- the whole path on the tiny model ---- */

static void test_end_to_end(nm_model *m) {
    enum { N_IDS = 100 };
    int32_t ids[N_IDS];
    for (int i = 0; i < N_IDS; i++)
        ids[i] = (int32_t)((i * 37 + 11) % 4000);
    const int n_vocab = m->hp.n_vocab;
    float *dense = malloc((size_t)N_IDS * n_vocab * sizeof(float));
    float *fast = malloc((size_t)N_IDS * n_vocab * sizeof(float));
    nm_error err = {0};
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 256;
    sp.n_batch = T;
    sp.n_threads = 2;
    nm_session *s = NULL;
    nm_calib *c = NULL;
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
    CHECK_INT_EQ(nm_calib_new(shape(m), T, &c, &err), NM_OK);
    if (!s || !c || !dense || !fast) goto out;
    nm_session_set_load_fn(s, nm_calib_record, c);
    CHECK_INT_EQ(nm_session_eval(s, ids, N_IDS, dense, true, &err), NM_OK);
    nm_session_set_load_fn(s, NULL, NULL);
    CHECK_INT_EQ(c->n_chunks, (N_IDS + T - 1) / T);
    CHECK_INT_EQ(c->n_tokens, N_IDS);
    CHECK_INT_EQ(nm_calib_save(c, TMP("tiny.calib.json"), &err), NM_OK);

    nm_device *dev = NULL;
    nm_pool *pool = NULL;
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "cpu", .n_threads = 1}, &dev, &err),
                 NM_OK);
    CHECK_INT_EQ(nm_pool_new(2, &pool, &err), NM_OK);
    nm_profile prof = {0};
    const int32_t counts[] = {1, 2, 4}, caps[] = {1, 4, 16};
    if (dev && pool) {
        nm_status st = nm_device_profile(dev, &m->layers[0].experts, m->hp.n_embd, m->hp.n_ff_exp,
                                         counts, 3, caps, 3, 3, pool, NULL, NULL, &prof, &err);
        double step_ms = 0;
        int32_t loads[64];
        CHECK(m->hp.n_expert <= 64);
        if (st == NM_OK) st = nm_model_time_host_step(m, pool, T, 3, &step_ms, loads, &err);
        if (st == NM_OK) {
            CHECK(step_ms > 0 && step_ms < 1e3);
            int64_t rows = 0;
            for (int32_t e = 0; e < m->hp.n_expert; e++)
                rows += loads[e];
            CHECK_INT_EQ(rows, (int64_t)T * m->hp.n_expert_used);
            nm_profile_set_overhead(&prof, T, step_ms, loads, m->hp.n_expert);
        }
        if (st) fprintf(stderr, "profile: %s\n", err.msg);
        CHECK_INT_EQ(st, NM_OK);
        CHECK_INT_EQ(prof.chunk, T);
        CHECK(prof.host_overhead_ms >= 0 && prof.host_overhead_ms < 1e3);
    }
    if (prof.points) {
        CHECK_INT_EQ(nm_profile_save(&prof, TMP("cpu.profile.json"), &err), NM_OK);
        nm_profile loaded = {0};
        nm_calib *lc = NULL;
        CHECK_INT_EQ(nm_profile_load(TMP("cpu.profile.json"), &loaded, &err), NM_OK);
        CHECK_INT_EQ(nm_calib_load(TMP("tiny.calib.json"), &lc, &err), NM_OK);
        nm_plan *plan = NULL, *back = NULL;
        if (loaded.points && lc) plan = make_plan(m, lc, &loaded, NULL);
        if (plan) {
            CHECK(strcmp(plan->device, "cpu") == 0);
            CHECK_INT_EQ(nm_plan_save(plan, TMP("tiny.plan.json"), &err), NM_OK);
            CHECK_INT_EQ(nm_plan_load(TMP("tiny.plan.json"), shape(m), &back, &err), NM_OK);
        }
        /* the plan runs, and with spill it computes dense's logits */
        const nm_mode modes[] = {NM_MODE_NPUMOE, NM_MODE_GROUPED};
        for (int i = 0; back && i < 2; i++) {
            nm_session_params fp = sp;
            fp.mode = modes[i];
            fp.plan = back;
            fp.device = dev;
            nm_session *fs = NULL;
            CHECK_INT_EQ(nm_session_new(m, &fp, &fs, &err), NM_OK);
            if (!fs) {
                fprintf(stderr, "session: %s\n", err.msg);
                continue;
            }
            CHECK_INT_EQ(nm_session_eval(fs, ids, N_IDS, fast, true, &err), NM_OK);
            double worst = 0, scale = 0;
            for (size_t j = 0; j < (size_t)N_IDS * n_vocab; j++) {
                worst = fmax(worst, fabs((double)fast[j] - dense[j]));
                scale = fmax(scale, fabs((double)dense[j]));
            }
            CHECK(worst <= 1e-4 * scale);
            if (!(worst <= 1e-4 * scale))
                fprintf(stderr, "%s: max |diff| %g of %g\n", nm_mode_name(modes[i]), worst, scale);
            nm_session_free(fs);
        }
        /* a plan made for another device is refused, naming both */
        if (back) {
            snprintf(back->device, sizeof back->device, "vulkan");
            nm_session_params fp = sp;
            fp.mode = NM_MODE_NPUMOE;
            fp.plan = back;
            fp.device = dev;
            nm_session *fs = NULL;
            CHECK_INT_EQ(nm_session_new(m, &fp, &fs, &err), NM_ERR_INVALID_ARG);
            CHECK(fs == NULL && strstr(err.msg, "device 'vulkan', not for device 'cpu'") != NULL);
            fp.mode = NM_MODE_DENSE; /* dense uses no plan */
            CHECK_INT_EQ(nm_session_new(m, &fp, &fs, &err), NM_OK);
            nm_session_free(fs);
        }
        nm_plan_free(plan);
        nm_plan_free(back);
        nm_calib_free(lc);
        nm_profile_free(&loaded);
        nm_profile_free(&prof);
    }
    nm_pool_free(pool);
    nm_device_close(dev);
out:
    nm_calib_free(c);
    nm_session_free(s);
    free(dense);
    free(fast);
}

int main(void) {
    nm_model *tiny = load_model(TINY);
    if (!tiny) return nm_test_finish("test_plan_files");
    /* a model of the same architecture with another fingerprint */
    CHECK(write_variant(TMP("f16.gguf"), true, false));
    nm_model *other = load_model(TMP("f16.gguf"));
    static raw_loads raw;
    make_loads(&raw);
    nm_calib *c = calib_from(tiny, &raw);
    if (c) {
        test_plan_files(tiny, other, c);
        test_malformed(tiny, other);
        test_alloc_failures(tiny, c);
    }
    nm_calib_free(c);
    test_end_to_end(tiny);
    nm_model_free(other);
    nm_model_free(tiny);
    return nm_test_finish("test_plan_files");
}
