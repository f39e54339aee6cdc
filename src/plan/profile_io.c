/* The *.profile.json file: what a device measured about itself
 * (device/profile.c), saved for the planner, and the checks every profile
 * passes before the planner trusts it. Not here: measuring. */
#include "plan-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* No measured time is longer than this (11 days): a larger number is a unit
 * mistake or garbage, and keeps the planner's sums finite. */
static const double max_ms = 1e9;

static int by_shape(const void *pa, const void *pb) {
    const nm_profile_point *a = pa, *b = pb;
    if (a->n_experts != b->n_experts) return a->n_experts < b->n_experts ? -1 : 1;
    return (a->capacity > b->capacity) - (a->capacity < b->capacity);
}

static nm_status check_time(const char *what, double v, bool zero_ok, nm_error *err) {
    if (!isfinite(v) || v < 0 || (!zero_ok && v == 0) || v > max_ms)
        return nm_errorf(err, NM_ERR_FORMAT, "%s %g ms is not a %s time of at most %g ms", what, v,
                         zero_ok ? "non-negative" : "positive", max_ms);
    return NM_OK;
}

nm_status nm_profile_check(const nm_profile *p, nm_error *err) {
    NM_ASSERT(p);
    nm_status st;
    if (memchr(p->device, '\0', sizeof p->device) == NULL || p->device[0] == '\0')
        return nm_errorf(err, NM_ERR_FORMAT, "the profile names no device");
    if (p->d_model < 1 || p->d_ff < 1 || p->d_model > INT32_MAX || p->d_ff > INT32_MAX)
        return nm_errorf(err, NM_ERR_FORMAT, "d_model %lld and d_ff %lld must be in [1, 2^31)",
                         (long long)p->d_model, (long long)p->d_ff);
    if (!nm_dtype_traits_of(p->weight_type))
        return nm_errorf(err, NM_ERR_FORMAT, "weight type %u is unknown", p->weight_type);
    if ((st = check_time("dispatch_ms", p->dispatch_ms, true, err)) ||
        (st = check_time("host_row_ms", p->host_row_ms, false, err)) ||
        (st = check_time("host_expert_ms", p->host_expert_ms, true, err)) ||
        (st = check_time("host_overhead_ms", p->host_overhead_ms, true, err)) ||
        (st = check_time("dense_device_ms", p->dense_device_ms, true, err)) ||
        (st = check_time("dense_host_ms", p->dense_host_ms, true, err)))
        return st;
    if ((p->dense_device_ms > 0) != (p->dense_host_ms > 0))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "dense_device_ms %g and dense_host_ms %g: both measured or neither (0)",
                         p->dense_device_ms, p->dense_host_ms);
    if (p->chunk < 1 || p->chunk > NM_PLAN_MAX_CHUNK)
        return nm_errorf(err, NM_ERR_FORMAT, "chunk %d is not in [1, %d]", p->chunk,
                         NM_PLAN_MAX_CHUNK);
    if (p->granule < 0 || p->granule > NM_PLAN_MAX_CHUNK)
        return nm_errorf(err, NM_ERR_FORMAT, "granule %d is not in [1, %d] (or 0: not recorded)",
                         p->granule, NM_PLAN_MAX_CHUNK);
    if (p->n_points < 1 || !p->points)
        return nm_errorf(err, NM_ERR_FORMAT, "the profile has no points");
    for (int32_t i = 0; i < p->n_points; i++) {
        const nm_profile_point *pt = &p->points[i];
        char what[48];
        snprintf(what, sizeof what, "points[%d].graph_ms", i);
        if (pt->n_experts < 1 || pt->capacity < 1)
            return nm_errorf(err, NM_ERR_FORMAT,
                             "points[%d]: %d experts of capacity %d; both must be >= 1", i,
                             pt->n_experts, pt->capacity);
        if ((st = check_time(what, pt->graph_ms, false, err))) return st;
    }
    /* duplicates and the grid on a sorted copy: O(n log n) for any file */
    nm_profile_point *s = nm_malloc((size_t)p->n_points * sizeof *s);
    if (!s) return nm_errorf(err, NM_ERR_NOMEM, "out of memory checking %d points", p->n_points);
    memcpy(s, p->points, (size_t)p->n_points * sizeof *s);
    qsort(s, (size_t)p->n_points, sizeof *s, by_shape);
    int64_t n_counts = 1, n_caps = 0;
    st = NM_OK;
    for (int32_t i = 1; i < p->n_points && st == NM_OK; i++) {
        if (s[i].n_experts == s[i - 1].n_experts && s[i].capacity == s[i - 1].capacity)
            st = nm_errorf(err, NM_ERR_FORMAT,
                           "the shape %d experts x capacity %d is measured twice", s[i].n_experts,
                           s[i].capacity);
        if (s[i].n_experts != s[i - 1].n_experts) n_counts++;
    }
    /* capacities of the first expert count; a full grid repeats them for each */
    while (n_caps < p->n_points && s[n_caps].n_experts == s[0].n_experts)
        n_caps++;
    bool grid = n_counts * n_caps == p->n_points;
    for (int32_t i = 0; i < p->n_points && grid; i++)
        grid = s[i].capacity == s[i % n_caps].capacity;
    if (st == NM_OK && !grid)
        st = nm_errorf(err, NM_ERR_FORMAT,
                       "the %d points are not a full grid: %lld expert counts and %lld capacities "
                       "of %d experts, but not every count with every capacity",
                       p->n_points, (long long)n_counts, (long long)n_caps, s[0].n_experts);
    nm_free(s);
    return st;
}

nm_status nm_profile_save_memory(const nm_profile *p, char **text, size_t *n_bytes, nm_error *err) {
    NM_ASSERT(p && text && n_bytes);
    *text = NULL;
    nm_status st = nm_profile_check(p, err);
    if (st != NM_OK) {
        nm_error_prefix(err, "not saving an invalid profile");
        return st;
    }
    /* each container is attached before it is filled, so that freeing
     * root frees everything whatever failed */
    json_t *root = json_object(), *points = json_array();
    bool ok = nm_json_put(root, "format", json_string(NM_PROFILE_FORMAT)) &&
              nm_json_put(root, "version", json_integer(NM_PROFILE_FILE_VERSION)) &&
              nm_json_put(root, "device", json_string(p->device)) &&
              nm_json_put(root, "d_model", json_integer(p->d_model)) &&
              nm_json_put(root, "d_ff", json_integer(p->d_ff)) &&
              nm_json_put(root, "weight_type", json_string(nm_dtype_name(p->weight_type))) &&
              nm_json_put(root, "dispatch_ms", nm_json_num(p->dispatch_ms)) &&
              nm_json_put(root, "host_row_ms", nm_json_num(p->host_row_ms)) &&
              nm_json_put(root, "host_expert_ms", nm_json_num(p->host_expert_ms)) &&
              nm_json_put(root, "chunk", json_integer(p->chunk)) &&
              nm_json_put(root, "host_overhead_ms", nm_json_num(p->host_overhead_ms));
    /* not measured: left out, as files made before the measurement are */
    if (p->dense_device_ms > 0)
        ok = ok && nm_json_put(root, "dense_device_ms", nm_json_num(p->dense_device_ms)) &&
             nm_json_put(root, "dense_host_ms", nm_json_num(p->dense_host_ms));
    /* absent from profiles made before it was measured: 0 in memory */
    if (ok && p->granule > 0) ok = nm_json_put(root, "granule", json_integer(p->granule));
    ok = nm_json_put(root, "points", points) && ok;
    for (int32_t i = 0; ok && i < p->n_points; i++) {
        json_t *pt = json_object();
        ok = nm_json_push(points, pt) &&
             nm_json_put(pt, "n_experts", json_integer(p->points[i].n_experts)) &&
             nm_json_put(pt, "capacity", json_integer(p->points[i].capacity)) &&
             nm_json_put(pt, "graph_ms", nm_json_num(p->points[i].graph_ms));
    }
    return nm_json_print(root, ok, "profile", text, n_bytes, err);
}

nm_status nm_profile_save(const nm_profile *p, const char *path, nm_error *err) {
    NM_ASSERT(path);
    char *text = NULL;
    size_t n_bytes = 0;
    nm_status st = nm_profile_save_memory(p, &text, &n_bytes, err);
    return nm_plan_save_text(path, st, text, n_bytes, err);
}

static nm_status read_weight_type(const json_t *root, uint32_t *out, nm_error *err) {
    const char *name;
    nm_status st = nm_json_get_str(root, "weight_type", &name, NULL, err);
    if (st != NM_OK) return st;
    for (uint32_t t = 0; t < NM_DTYPE_COUNT; t++) {
        const nm_dtype_traits *tr = nm_dtype_traits_of(t);
        if (tr && strcmp(tr->name, name) == 0) {
            *out = t;
            return NM_OK;
        }
    }
    return nm_errorf(err, NM_ERR_FORMAT,
                     "weight_type: \"%.40s\" is not a ggml type name (f32, f16, "
                     "bf16, q8_0, ...)",
                     name);
}

static nm_status read_profile(const json_t *root, void *ctx, nm_error *err) {
    nm_profile *p = ctx;
    nm_status st = nm_plan_json_header(root, NM_PROFILE_FORMAT, NM_PROFILE_FILE_VERSION,
                                       "measure the device again with `npumoe profile`", err);
    if (st != NM_OK) return st;
    const char *device;
    const json_t *points;
    int64_t d_model, d_ff, chunk;
    if ((st = nm_json_get_str(root, "device", &device, NULL, err))) return st;
    if (device[0] == '\0' || strlen(device) >= sizeof p->device)
        return nm_errorf(err, NM_ERR_FORMAT, "device: expected a name of 1 to %zu bytes",
                         sizeof p->device - 1);
    snprintf(p->device, sizeof p->device, "%s", device);
    if ((st = nm_json_get_int(root, "d_model", 1, INT32_MAX, &d_model, NULL, err)) ||
        (st = nm_json_get_int(root, "d_ff", 1, INT32_MAX, &d_ff, NULL, err)) ||
        (st = read_weight_type(root, &p->weight_type, err)) ||
        (st = nm_json_get_num(root, "dispatch_ms", 0, max_ms, &p->dispatch_ms, NULL, err)) ||
        (st = nm_json_get_num(root, "host_row_ms", 0, max_ms, &p->host_row_ms, NULL, err)) ||
        (st = nm_json_get_num(root, "host_expert_ms", 0, max_ms, &p->host_expert_ms, NULL, err)) ||
        (st = nm_json_get_int(root, "chunk", 1, NM_PLAN_MAX_CHUNK, &chunk, NULL, err)) ||
        (st = nm_json_get_num(root, "host_overhead_ms", 0, max_ms, &p->host_overhead_ms, NULL,
                              err)) ||
        (st = nm_json_get_arr(root, "points", &points, NULL, err)))
        return st;
    /* absent in profiles measured before the dense graph was: 0, not measured */
    if ((st = nm_json_get_num(root, "dense_device_ms", 0, max_ms, &p->dense_device_ms, NULL,
                              err)) == NM_ERR_NOT_FOUND)
        st = NM_OK;
    if (st != NM_OK) return st;
    if ((st = nm_json_get_num(root, "dense_host_ms", 0, max_ms, &p->dense_host_ms, NULL, err)) ==
        NM_ERR_NOT_FOUND)
        st = NM_OK;
    if (st != NM_OK) return st;
    /* optional: profiles written before it have none (0) */
    int64_t granule = 0;
    if (json_object_get(root, "granule") &&
        (st = nm_json_get_int(root, "granule", 1, NM_PLAN_MAX_CHUNK, &granule, NULL, err)))
        return st;
    p->granule = (int32_t)granule;
    p->d_model = d_model;
    p->d_ff = d_ff;
    p->chunk = (int32_t)chunk;
    const size_t n = json_array_size(points);
    if (n < 1 || n > INT32_MAX) return nm_errorf(err, NM_ERR_FORMAT, "points: expected 1 or more");
    p->points = nm_calloc(n, sizeof *p->points);
    if (!p->points) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for %zu points", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *pt = json_array_get(points, i);
        char where[32];
        snprintf(where, sizeof where, "points[%zu]", i);
        int64_t n_experts, capacity;
        if ((st = nm_json_get_int(pt, "n_experts", 1, NM_PLAN_MAX_EXPERTS, &n_experts, where,
                                  err)) ||
            (st = nm_json_get_int(pt, "capacity", 1, NM_PLAN_MAX_CHUNK, &capacity, where, err)) ||
            (st = nm_json_get_num(pt, "graph_ms", 0, max_ms, &p->points[i].graph_ms, where, err)))
            return st;
        p->points[i].n_experts = (int32_t)n_experts;
        p->points[i].capacity = (int32_t)capacity;
        p->n_points++;
    }
    return nm_profile_check(p, err);
}

static nm_status finish(nm_status st, nm_profile *out) {
    if (st != NM_OK) nm_profile_free(out);
    return st;
}

nm_status nm_profile_load(const char *path, nm_profile *out, nm_error *err) {
    NM_ASSERT(path && out);
    memset(out, 0, sizeof *out);
    return finish(nm_plan_read_file(path, read_profile, out, err), out);
}

nm_status nm_profile_load_memory(const char *text, size_t n_bytes, const char *name,
                                 nm_profile *out, nm_error *err) {
    NM_ASSERT(out);
    memset(out, 0, sizeof *out);
    return finish(nm_plan_read_memory(text, n_bytes, name, read_profile, out, err), out);
}
