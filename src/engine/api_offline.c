/* The public functions of the offline half (npumoe.h): calibrate a model on
 * a text, measure a device, make and open plans. Thin wrappers over plan/,
 * device/profile.c and the model's host-step timing, so that a caller
 * needs none of their headers. */
#include "engine-impl.h"

#include "base/base.h"
#include "model/model.h"
#include "plan/plan.h"

#include <string.h>

enum { DEFAULT_CHUNK = 256, DEFAULT_WINDOW = 2048, MAX_GRID = 64 };

/* ---- calibration ---- */

nm_calib_params nm_calib_default_params(void) {
    return (nm_calib_params){.chunk = 0, .n_ctx = 0, .n_threads = 0, .kv_type = NM_KV_F32};
}

nm_status nm_calib_make(const nm_model *model, const int32_t *ids, size_t n_ids,
                        const nm_calib_params *params, nm_calib **out, nm_error *err) {
    *out = NULL;
    const nm_calib_params p = params ? *params : nm_calib_default_params();
    const int32_t chunk = p.chunk ? p.chunk : DEFAULT_CHUNK;
    nm_model_info info;
    nm_model_get_info(model, &info);
    int32_t window = p.n_ctx                             ? p.n_ctx
                     : info.n_ctx_train < DEFAULT_WINDOW ? info.n_ctx_train
                                                         : DEFAULT_WINDOW;
    if (chunk < 1 || window < chunk)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "calibration: a window of %d tokens does not hold a chunk of %d", window,
                         chunk);
    window -= window % chunk;
    /* whole chunks only: each window is a multiple of the chunk, so every
     * batch the session runs is a full chunk */
    const size_t usable = n_ids - n_ids % (size_t)chunk;
    if (usable == 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the text has %zu tokens, less than one chunk of %d", n_ids, chunk);
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = window;
    sp.n_batch = chunk;
    sp.n_threads = p.n_threads;
    sp.kv_type = p.kv_type;
    nm_session *s = NULL;
    nm_calib *calib = NULL;
    nm_moe_shape shape;
    nm_model_moe_shape(model, &shape);
    nm_status st = nm_session_new(model, &sp, &s, err);
    if (st == NM_OK) st = nm_calib_new(&shape, chunk, &calib, err);
    if (st == NM_OK) nm_session_set_load_fn(s, nm_calib_record, calib);
    for (size_t done = 0; st == NM_OK && done < usable;) {
        const size_t len = usable - done < (size_t)window ? usable - done : (size_t)window;
        nm_session_reset(s);
        st = nm_session_eval(s, ids + done, (int32_t)len, NULL, false, err);
        done += len;
        if (p.progress) p.progress(p.progress_ctx, done, usable, calib->n_chunks);
    }
    nm_session_free(s);
    if (st != NM_OK) {
        nm_calib_free(calib);
        return st;
    }
    *out = calib;
    return NM_OK;
}

void nm_calib_get_info(const nm_calib *calib, nm_calib_info *out) {
    *out = (nm_calib_info){.chunk = calib->chunk,
                           .k = calib->k,
                           .n_layer = calib->n_layer,
                           .n_expert = calib->n_expert,
                           .n_chunks = calib->n_chunks,
                           .n_tokens = calib->n_tokens};
}

/* ---- device profile ---- */

nm_profile_params nm_profile_default_params(void) {
    return (nm_profile_params){.chunk = 0, .reps = 0, .n_threads = 0};
}

nm_status nm_profile_measure(const nm_model *model, nm_device *device,
                             const nm_profile_params *params, nm_profile *out, nm_error *err) {
    memset(out, 0, sizeof *out);
    const nm_profile_params p = params ? *params : nm_profile_default_params();
    const nm_hparams *hp = &model->hp;
    if (model->vocab_only || hp->n_expert < 1)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "profile: the model has no experts loaded");
    const int32_t chunk = p.chunk ? p.chunk : DEFAULT_CHUNK;
    const int reps = p.reps ? p.reps : 5;
    int32_t experts[MAX_GRID], caps[MAX_GRID];
    int n_e = 0, n_c = 0;
    if (p.n_grid_experts > MAX_GRID || p.n_grid_capacity > MAX_GRID)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "profile: more than %d grid values", MAX_GRID);
    if (p.grid_experts) {
        memcpy(experts, p.grid_experts, (size_t)p.n_grid_experts * sizeof *experts);
        n_e = p.n_grid_experts;
    } else {
        for (int32_t e = 1; e <= hp->n_expert && n_e < MAX_GRID; e *= 2)
            experts[n_e++] = e;
    }
    if (p.grid_capacity) {
        memcpy(caps, p.grid_capacity, (size_t)p.n_grid_capacity * sizeof *caps);
        n_c = p.n_grid_capacity;
    } else {
        for (int32_t c = 4; c <= chunk && n_c < MAX_GRID; c *= 2)
            caps[n_c++] = c;
        if ((n_c == 0 || caps[n_c - 1] != chunk) && n_c < MAX_GRID) caps[n_c++] = chunk;
    }
    nm_pool *pool = NULL;
    int32_t *loads = nm_malloc((size_t)hp->n_expert * sizeof *loads);
    double step_ms = 0;
    nm_status st = loads ? NM_OK : nm_errorf(err, NM_ERR_NOMEM, "out of memory");
    if (st == NM_OK) st = nm_pool_new(p.n_threads ? p.n_threads : nm_cpu_count(), &pool, err);
    /* the host first: right after a device profile the host measures slower */
    if (st == NM_OK)
        st = nm_model_time_host_step(model, pool, chunk, 4 * reps, &step_ms, loads, err);
    /* the dense part of a layer, host and device, before the graphs of
     * experts fill the device */
    double dense_host_ms = 0, dense_device_ms = 0;
    if (st == NM_OK)
        st = nm_engine_time_dense(model, device, chunk, nm_pool_n_threads(pool), reps,
                                  &dense_host_ms, &dense_device_ms, err);
    if (st != NM_OK) nm_error_prefix(err, "profile");
    if (st == NM_OK)
        st = nm_device_profile(device, nm_model_moe_experts(model, 0), hp->n_embd, hp->n_ff_exp,
                               experts, n_e, caps, n_c, reps, pool, p.progress, p.progress_ctx, out,
                               err);
    if (st == NM_OK) {
        nm_profile_set_overhead(out, chunk, step_ms, loads, hp->n_expert);
        /* measured on both sides or not at all */
        out->dense_device_ms = dense_device_ms;
        out->dense_host_ms = dense_device_ms > 0 ? dense_host_ms : 0.0;
    }
    nm_free(loads);
    nm_pool_free(pool);
    return st;
}

/* ---- plan ---- */

nm_status nm_plan_create(const nm_model *model, const nm_calib *calib, const nm_profile *profile,
                         const nm_plan_params *params, nm_plan **out, nm_error *err) {
    nm_moe_shape shape;
    nm_model_moe_shape(model, &shape);
    return nm_plan_make(&shape, calib, profile, params, out, err);
}

nm_status nm_plan_open(const char *path, const nm_model *model, nm_plan **out, nm_error *err) {
    nm_moe_shape shape;
    nm_model_moe_shape(model, &shape);
    return nm_plan_load(path, &shape, out, err);
}

void nm_plan_get_info(const nm_plan *plan, nm_plan_info *out) {
    memset(out, 0, sizeof *out);
    memcpy(out->device, plan->device, sizeof out->device);
    out->chunk = plan->moe.chunk;
    out->n_layer = plan->moe.n_layer;
    out->objective = plan->objective;
    out->overflow = plan->moe.overflow;
    out->salience = plan->moe.salience;
    out->predicted_drop_rate = plan->predicted_drop_rate;
    out->predicted_drop_weight = plan->predicted_drop_weight;
    out->predicted_chunk_ms = plan->predicted_chunk_ms;
    out->device_bytes = plan->device_bytes;
    out->dense_device_layers = plan->dense_on_device ? 0 : -1;
    for (int32_t l = 0; l < plan->moe.n_layer; l++) {
        if (plan->dense_on_device) out->dense_device_layers += plan->dense_on_device[l];
        out->predicted_dense_ms += plan->layer_cost[l].dense_ms;
    }
}
