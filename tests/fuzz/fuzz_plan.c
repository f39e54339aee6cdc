/* libFuzzer target for the plan part's readers: any bytes go through its
 * JSON layer over jansson (refused with a positioned message, or a tree
 * every typed getter can walk and that prints and parses back equal), the
 * calibration, profile and plan loaders (the plan both against the tiny
 * model and without a model). Whatever loads must hold what the loader
 * promises (histograms summing to n_chunks, summaries within the data,
 * plans nm_moe_plan_check accepts, profiles nm_profile_check accepts), must
 * save and load back the same, and must plan: a loaded calibration of the
 * tiny model goes through the planner with a fixed profile, a loaded
 * profile of the tiny model's shape with a fixed calibration, and the plan
 * made must save and load back. The model is loaded once per process. */
#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan-impl.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NM_VECTORS_DIR
#define NM_VECTORS_DIR "../shared/vectors"
#endif

static nm_model *model;
static nm_moe_shape model_shape; /* the planner's view of model */
static nm_calib *fixed_calib;
static nm_profile fixed_profile;
static nm_profile_point fixed_points[4];
static FILE *devnull;

/* Planner parameters varied by the input's length, so budgets and both
 * overflow policies are planned too. */
static nm_plan_params params_for(size_t size) {
    nm_plan_params pp = nm_plan_default_params();
    pp.overflow = size % 2 ? NM_OVERFLOW_DROP : NM_OVERFLOW_SPILL;
    if (size % 3 == 0) pp.device_memory_bytes = 40000;
    if (size % 5 == 0) pp.objective = NM_PLAN_QUANTILE;
    return pp;
}

static void require(int cond, const char *what) {
    if (!cond) {
        fprintf(stderr, "fuzz_plan: %s\n", what);
        abort();
    }
}

/* The planner's view of m: the tiny model's shape, or none. */
static const nm_moe_shape *shape(const nm_model *m) { return m ? &model_shape : NULL; }

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    nm_error err = {0};
    nm_model_params mp = nm_model_default_params();
    if (nm_model_load(NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf", &mp, &model, &err) != NM_OK) {
        fprintf(stderr, "fuzz_plan: %s\n", err.msg);
        abort();
    }
    nm_model_moe_shape(model, &model_shape);
    require(nm_calib_new(shape(model), 16, &fixed_calib, &err) == NM_OK, err.msg);
    const int32_t n_expert = model->hp.n_expert;
    int32_t loads[64] = {0};
    float weights[32];
    for (int i = 0; i < 32; i++) /* two per token, any order */
        weights[i] = i % 2 ? 0.25f + 0.01f * (float)(i % 7) : 0.75f - 0.01f * (float)(i % 7);
    require(n_expert <= 64 && model->hp.n_expert_used == 2, "the tiny model is 8 experts top-2");
    for (int c = 0; c < 20; c++)
        for (int32_t l = 0; l < model->hp.n_layer; l++) {
            memset(loads, 0, sizeof loads);
            for (int t = 0; t < 16; t++) {
                loads[(t * t + c + l) % n_expert]++;
                loads[(t * t + c + l + 1 + t % 3) % n_expert]++;
            }
            nm_calib_record(fixed_calib, l, loads, n_expert, weights);
        }
    fixed_profile = (nm_profile){.d_model = model->hp.n_embd,
                                 .d_ff = model->hp.n_ff_exp,
                                 .weight_type = NM_DTYPE_F32,
                                 .dispatch_ms = 0.02,
                                 .host_row_ms = 0.002,
                                 .host_expert_ms = 0.01,
                                 .chunk = 16,
                                 .host_overhead_ms = 0.03,
                                 .n_points = 4,
                                 .points = fixed_points};
    snprintf(fixed_profile.device, sizeof fixed_profile.device, "fixed");
    const nm_profile_point pts[4] = {{1, 4, 0.025}, {1, 16, 0.04}, {4, 4, 0.04}, {4, 16, 0.09}};
    memcpy(fixed_points, pts, sizeof pts);
    devnull = fopen("/dev/null", "w");
    require(devnull != NULL, "cannot open /dev/null");
    return 0;
}

static void same_plan(const nm_plan *a, const nm_plan *b) {
    require(strcmp(a->fingerprint.hex, b->fingerprint.hex) == 0, "plan fingerprint");
    require(strcmp(a->device, b->device) == 0, "plan device");
    require(a->moe.chunk == b->moe.chunk && a->moe.n_layer == b->moe.n_layer &&
                a->moe.n_expert == b->moe.n_expert && a->moe.overflow == b->moe.overflow &&
                a->moe.salience == b->moe.salience,
            "plan shape");
    require(a->quantile == b->quantile && a->predicted_chunk_ms == b->predicted_chunk_ms &&
                a->device_bytes == b->device_bytes && a->n_tiers == b->n_tiers,
            "plan header");
    require(memcmp(a->tiers, b->tiers, (size_t)a->n_tiers * sizeof(int32_t)) == 0, "plan tiers");
    for (int32_t l = 0; l < a->moe.n_layer; l++) {
        const nm_plan_cost *ca = &a->layer_cost[l], *cb = &b->layer_cost[l];
        require(ca->device_ms == cb->device_ms && ca->host_ms == cb->host_ms &&
                    ca->chunk_ms == cb->chunk_ms,
                "plan cost");
        const nm_moe_layer_plan *la = &a->moe.layers[l], *lb = &b->moe.layers[l];
        require(la->n_groups == lb->n_groups, "plan groups");
        for (int32_t g = 0; g < la->n_groups; g++) {
            const nm_moe_group *ga = &la->groups[g], *gb = &lb->groups[g];
            require(ga->capacity == gb->capacity && ga->on_device == gb->on_device &&
                        ga->n_experts == gb->n_experts &&
                        memcmp(ga->experts, gb->experts, (size_t)ga->n_experts * 4) == 0,
                    "plan group");
        }
    }
}

/* A plan must pass the executor's check, describe itself, and come back
 * the same through its text. */
static void check_plan(const nm_plan *p, const nm_model *m) {
    nm_error err = {0};
    require(nm_moe_plan_check(&p->moe, p->moe.n_layer, p->moe.n_expert, &err) == NM_OK, err.msg);
    double sum = 0;
    for (int32_t l = 0; l < p->moe.n_layer; l++)
        sum += p->layer_cost[l].chunk_ms;
    require(isfinite(sum) && isfinite(p->predicted_chunk_ms), "finite costs");
    nm_plan_describe(p, devnull);
    char *text = NULL;
    size_t n = 0;
    require(nm_plan_save_memory(p, &text, &n, &err) == NM_OK, err.msg);
    nm_plan *back = NULL;
    require(nm_plan_load_memory(text, n, "saved", shape(m), &back, &err) == NM_OK, err.msg);
    same_plan(p, back);
    nm_plan_free(back);
    nm_free(text);
}

static void fuzz_calib(const uint8_t *data, size_t size) {
    nm_calib *c = NULL;
    nm_error err = {0};
    if (nm_calib_load_memory((const char *)data, size, "input", &c, &err) != NM_OK) {
        require(c == NULL && err.msg[0] != '\0', "a refusal leaves nothing and says why");
        return;
    }
    int64_t n_assign = -1;
    for (int32_t l = 0; l < c->n_layer; l++) {
        int64_t layer_assign = 0;
        for (int32_t e = 0; e < c->n_expert; e++) {
            const int64_t *h =
                c->hist + ((size_t)l * (size_t)c->n_expert + (size_t)e) * (size_t)(c->chunk + 1);
            int64_t total = 0;
            for (int32_t x = 0; x <= c->chunk; x++) {
                total += h[x];
                layer_assign += (int64_t)x * h[x];
            }
            require(total == c->n_chunks, "histogram total");
            const int32_t q50 = nm_calib_quantile(c, l, e, 0.5);
            const int32_t q95 = nm_calib_quantile(c, l, e, 0.95), max = nm_calib_max(c, l, e);
            require(q50 <= q95 && q95 <= max && nm_calib_mean(c, l, e) <= max, "order of stats");
        }
        require(n_assign < 0 || layer_assign == n_assign, "same assignments in every layer");
        n_assign = layer_assign;
    }
    char *text = NULL;
    size_t n = 0;
    require(nm_calib_save_memory(c, &text, &n, &err) == NM_OK, err.msg);
    nm_calib *back = NULL;
    require(nm_calib_load_memory(text, n, "saved", &back, &err) == NM_OK, err.msg);
    const size_t cells = (size_t)c->n_layer * (size_t)c->n_expert * (size_t)(c->chunk + 1);
    require(strcmp(back->fingerprint.hex, c->fingerprint.hex) == 0 && back->chunk == c->chunk &&
                back->k == c->k && back->n_layer == c->n_layer && back->n_expert == c->n_expert &&
                back->n_chunks == c->n_chunks && back->n_tokens == c->n_tokens &&
                memcmp(back->hist, c->hist, cells * sizeof(int64_t)) == 0,
            "calibration round trip");
    nm_calib_free(back);
    nm_free(text);

    if (nm_calib_check_shape(c, shape(model), &err) == NM_OK && c->n_chunks > 0) {
        nm_plan *p = NULL;
        const nm_plan_params pp = params_for(size);
        require(nm_plan_make(shape(model), c, &fixed_profile, &pp, &p, &err) == NM_OK, err.msg);
        check_plan(p, model);
        nm_plan_free(p);
    }
    nm_calib_free(c);
}

static void fuzz_profile(const uint8_t *data, size_t size) {
    nm_profile p;
    nm_error err = {0};
    if (nm_profile_load_memory((const char *)data, size, "input", &p, &err) != NM_OK) {
        require(p.points == NULL && err.msg[0] != '\0', "a refusal leaves nothing and says why");
        return;
    }
    require(nm_profile_check(&p, &err) == NM_OK, err.msg);
    char *text = NULL;
    size_t n = 0;
    require(nm_profile_save_memory(&p, &text, &n, &err) == NM_OK, err.msg);
    nm_profile back;
    require(nm_profile_load_memory(text, n, "saved", &back, &err) == NM_OK, err.msg);
    require(strcmp(back.device, p.device) == 0 && back.d_model == p.d_model &&
                back.d_ff == p.d_ff && back.weight_type == p.weight_type &&
                back.dispatch_ms == p.dispatch_ms && back.host_row_ms == p.host_row_ms &&
                back.host_expert_ms == p.host_expert_ms && back.chunk == p.chunk &&
                back.host_overhead_ms == p.host_overhead_ms && back.n_points == p.n_points &&
                memcmp(back.points, p.points, (size_t)p.n_points * sizeof *p.points) == 0,
            "profile round trip");
    nm_profile_free(&back);
    nm_free(text);
    if (p.d_model == model->hp.n_embd && p.d_ff == model->hp.n_ff_exp) {
        nm_plan *plan = NULL;
        const nm_plan_params pp = params_for(size);
        require(nm_plan_make(shape(model), fixed_calib, &p, &pp, &plan, &err) == NM_OK, err.msg);
        check_plan(plan, model);
        nm_plan_free(plan);
    }
    nm_profile_free(&p);
}

static void fuzz_plan(const uint8_t *data, size_t size, const nm_model *m) {
    nm_plan *p = NULL;
    nm_error err = {0};
    if (nm_plan_load_memory((const char *)data, size, "input", shape(m), &p, &err) != NM_OK) {
        require(p == NULL && err.msg[0] != '\0', "a refusal leaves nothing and says why");
        return;
    }
    if (m)
        require(p->moe.n_layer == m->hp.n_layer && p->moe.n_expert == m->hp.n_expert,
                "the model's shape");
    check_plan(p, m);
    nm_plan_free(p);
}

/* Visits every value and asks every getter of every member. */
static void walk(const json_t *v) {
    nm_error err;
    const bool is_obj = json_is_object(v);
    const size_t n = is_obj ? json_object_size(v) : json_array_size(v);
    void *it = is_obj ? json_object_iter((json_t *)v) : NULL;
    for (size_t i = 0; i < n; i++, it = is_obj ? json_object_iter_next((json_t *)v, it) : NULL) {
        const json_t *item = is_obj ? json_object_iter_value(it) : json_array_get(v, i);
        require(item != NULL, "every member and element is there");
        int64_t i64;
        double d;
        if (nm_json_as_int(item, -1000, 1000, &i64, "v", &err) == NM_OK)
            require(i64 >= -1000 && i64 <= 1000 && json_number_value(item) == (double)i64,
                    "an integer in range");
        if (nm_json_as_num(item, -1, 1, &d, "v", &err) == NM_OK)
            require(d >= -1 && d <= 1 && isfinite(d), "a number in range");
        if (json_is_string(item))
            require(strlen(json_string_value(item)) == json_string_length(item),
                    "strings hold no NUL");
        if (is_obj) {
            const char *key = json_object_iter_key(it);
            require(json_object_get(v, key) == item, "a key finds its own member");
            const char *s;
            bool b;
            const json_t *c;
            nm_status st[6] = {
                nm_json_get_int(v, key, INT64_MIN, INT64_MAX, &i64, "w", &err),
                nm_json_get_num(v, key, -INFINITY, INFINITY, &d, "w", &err),
                nm_json_get_str(v, key, &s, "w", &err),
                nm_json_get_bool(v, key, &b, "w", &err),
                nm_json_get_arr(v, key, &c, "w", &err),
                nm_json_get_obj(v, key, &c, "w", &err),
            };
            for (int k = 0; k < 6; k++)
                require(st[k] == NM_OK || st[k] == NM_ERR_FORMAT, "a getter's status");
        }
        walk(item);
    }
}

/* Any input parses or is refused with a position; what parses prints and
 * parses back to an equal tree, and prints the same again. */
static void fuzz_tree(const uint8_t *data, size_t size) {
    json_t *v = NULL;
    nm_error err;
    nm_status st = nm_json_parse((const char *)data, size, &v, &err);
    if (st != NM_OK) {
        require(v == NULL && st == NM_ERR_FORMAT && strncmp(err.msg, "line ", 5) == 0,
                "a positioned refusal");
        for (const char *c = err.msg; *c; c++)
            require((unsigned char)*c >= 0x20 && *c != 0x7F, "no control characters");
        return;
    }
    walk(v);
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    require(nm_json_print(json_incref(v), true, "tree", &t1, &n1, &err) == NM_OK, err.msg);
    json_t *back = NULL;
    require(nm_json_parse(t1, n1, &back, &err) == NM_OK, err.msg);
    require(json_equal(v, back), "printed and parsed back equal");
    require(nm_json_print(back, true, "tree", &t2, &n2, &err) == NM_OK, err.msg);
    require(n1 == n2 && memcmp(t1, t2, n1) == 0, "printed the same again");
    nm_free(t1);
    nm_free(t2);
    json_decref(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tree(data, size);
    fuzz_calib(data, size);
    fuzz_profile(data, size);
    fuzz_plan(data, size, model);
    fuzz_plan(data, size, NULL);
    return 0;
}
