/* The *.plan.json file: saving a plan, loading one with every field checked
 * (and against the model it is for), and the human summary. Not here: how
 * a plan is made (planner.c). */
#include "plan-impl.h"

#include "base/base.h"

#include <math.h>
#include <string.h>

/* The most a plan's predicted time can be: a graph extrapolated from
 * profile times (each <= 1e9 ms) to 65536 rows is < 1e14 ms, summed over at
 * most 2^28 groups (layers x experts) < 1e23. Anything beyond is garbage. */
static const double max_cost_ms = 1e24;

/* dense: the plan places the dense parts (dense_ms is written only then, so
 * a plan made before the choice saves back as it was) */
static json_t *cost_object(const nm_plan_cost *c, bool dense) {
    json_t *o = json_object();
    bool ok = nm_json_put(o, "device_ms", nm_json_num(c->device_ms)) &&
              nm_json_put(o, "host_ms", nm_json_num(c->host_ms));
    if (dense) ok = ok && nm_json_put(o, "dense_ms", nm_json_num(c->dense_ms));
    ok = ok && nm_json_put(o, "chunk_ms", nm_json_num(c->chunk_ms));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* One layer's object: its budget, its groups, its cost; NULL when memory
 * ran out. */
static json_t *layer_object(const nm_plan *plan, int32_t l) {
    const nm_moe_layer_plan *lp = &plan->moe.layers[l];
    json_t *o = json_object(), *groups = json_array();
    bool ok = nm_json_put(o, "budget_rows", json_integer(plan->budget_rows[l]));
    ok = nm_json_put(o, "groups", groups) && ok;
    for (int32_t g = 0; ok && g < lp->n_groups; g++) {
        const nm_moe_group *grp = &lp->groups[g];
        json_t *go = json_object(), *experts = json_array();
        ok = nm_json_put(go, "tier", json_integer(grp->capacity));
        ok = nm_json_put(go, "experts", experts) && ok;
        ok = nm_json_push(groups, go) && ok;
        for (int32_t i = 0; ok && i < grp->n_experts; i++)
            ok = nm_json_push(experts, json_integer(grp->experts[i]));
        ok = ok && nm_json_put(go, "device", json_boolean(grp->on_device));
    }
    if (plan->dense_on_device)
        ok = ok &&
             nm_json_put(o, "dense", json_string(plan->dense_on_device[l] ? "device" : "host"));
    ok = ok &&
         nm_json_put(o, "cost", cost_object(&plan->layer_cost[l], plan->dense_on_device != NULL));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

nm_status nm_plan_save_memory(const nm_plan *plan, char **text, size_t *n_bytes, nm_error *err) {
    NM_ASSERT(plan && text && n_bytes);
    *text = NULL;
    const nm_moe_plan *moe = &plan->moe;
    /* each container is attached before it is filled, so that freeing
     * root frees everything whatever failed */
    json_t *root = json_object(), *tiers = json_array(), *layers = json_array();
    bool ok = nm_json_put(root, "format", json_string(NM_PLAN_FORMAT)) &&
              nm_json_put(root, "version", json_integer(NM_PLAN_FILE_VERSION)) &&
              nm_json_put(root, "fingerprint", json_string(plan->fingerprint.hex)) &&
              nm_json_put(root, "device", json_string(plan->device)) &&
              nm_json_put(root, "chunk", json_integer(moe->chunk)) &&
              nm_json_put(root, "n_layer", json_integer(moe->n_layer)) &&
              /* only where layers without experts come first: absent is 0 */
              (plan->first_layer == 0 ||
               nm_json_put(root, "first_moe_layer", json_integer(plan->first_layer))) &&
              nm_json_put(root, "n_expert", json_integer(moe->n_expert)) &&
              /* only for models with shared experts: absent is none */
              (plan->n_shared == 0 ||
               (nm_json_put(root, "shared_experts", json_integer(plan->n_shared)) &&
                nm_json_put(root, "shared_expert_ff", json_integer(plan->d_ff_shared))));
    ok = nm_json_put(root, "tiers", tiers) && ok;
    for (int32_t i = 0; ok && i < plan->n_tiers; i++)
        ok = nm_json_push(tiers, json_integer(plan->tiers[i]));
    ok = ok && nm_json_put(root, "overflow", json_string(nm_overflow_name(moe->overflow))) &&
         nm_json_put(root, "salience", json_string(nm_salience_name(moe->salience))) &&
         nm_json_put(root, "objective", json_string(nm_plan_objective_name(plan->objective))) &&
         nm_json_put(root, "granule", json_integer(plan->granule)) &&
         nm_json_put(root, "quantile", nm_json_num(plan->quantile)) &&
         nm_json_put(root, "predicted_drop_rate", nm_json_num(plan->predicted_drop_rate)) &&
         nm_json_put(root, "predicted_drop_weight", nm_json_num(plan->predicted_drop_weight)) &&
         nm_json_put(root, "predicted_chunk_ms", nm_json_num(plan->predicted_chunk_ms)) &&
         nm_json_put(root, "device_bytes", json_integer((json_int_t)plan->device_bytes));
    ok = nm_json_put(root, "layers", layers) && ok;
    for (int32_t l = 0; ok && l < moe->n_layer; l++)
        ok = nm_json_push(layers, layer_object(plan, l));
    return nm_json_print(root, ok, "plan", text, n_bytes, err);
}

nm_status nm_plan_save(const nm_plan *plan, const char *path, nm_error *err) {
    NM_ASSERT(path);
    char *text = NULL;
    size_t n_bytes = 0;
    nm_status st = nm_plan_save_memory(plan, &text, &n_bytes, err);
    return nm_plan_save_text(path, st, text, n_bytes, err);
}

/* ---- loading ---- */

typedef struct read_ctx {
    const nm_moe_shape *shape; /* NULL: no model to match */
    nm_plan *plan;             /* being filled; freed by the caller on failure */
} read_ctx;

static nm_status read_policy(const json_t *root, nm_plan *plan, nm_error *err) {
    const char *name;
    nm_status st = nm_json_get_str(root, "overflow", &name, NULL, err);
    if (st == NM_OK && (st = nm_overflow_parse(name, &plan->moe.overflow, err)) != NM_OK)
        return nm_errorf(err, NM_ERR_FORMAT, "overflow: unknown policy \"%.40s\" (drop, spill)",
                         name);
    if (st == NM_OK) st = nm_json_get_str(root, "salience", &name, NULL, err);
    if (st == NM_OK && (st = nm_salience_parse(name, &plan->moe.salience, err)) != NM_OK)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "salience: unknown policy \"%.40s\" (router, residual-norm, input-norm)",
                         name);
    return st;
}

static nm_status read_tiers(const json_t *root, nm_plan *plan, nm_error *err) {
    const json_t *tiers;
    nm_status st = nm_json_get_arr(root, "tiers", &tiers, NULL, err);
    if (st != NM_OK) return st;
    const size_t n = json_array_size(tiers);
    if (n < 1 || n > NM_PLAN_MAX_TIERS)
        return nm_errorf(err, NM_ERR_FORMAT, "tiers: %zu entries, expected 1 to %d", n,
                         NM_PLAN_MAX_TIERS);
    plan->tiers = nm_malloc(n * sizeof(int32_t));
    if (!plan->tiers) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    for (size_t i = 0; i < n; i++) {
        char where[24];
        snprintf(where, sizeof where, "tiers[%zu]", i);
        int64_t v;
        st = nm_json_as_int(json_array_get(tiers, i), 1, plan->moe.chunk, &v, where, err);
        if (st != NM_OK) return st;
        if (i > 0 && v <= plan->tiers[i - 1])
            return nm_errorf(err, NM_ERR_FORMAT, "%s: %lld after %d; tiers must be ascending",
                             where, (long long)v, plan->tiers[i - 1]);
        plan->tiers[i] = (int32_t)v;
        plan->n_tiers++;
    }
    return NM_OK;
}

/* The objective and its granule: a budgeted plan's tiers are the
 * multiples of the granule up to the chunk; a quantile plan has none. */
static nm_status read_objective(const json_t *root, nm_plan *plan, nm_error *err) {
    const char *name;
    int64_t granule;
    nm_status st = nm_json_get_str(root, "objective", &name, NULL, err);
    if (st != NM_OK) return st;
    int o = 0;
    while (o < NM_PLAN_OBJECTIVE_COUNT && strcmp(name, nm_plan_objective_name(o)) != 0)
        o++;
    if (o == NM_PLAN_OBJECTIVE_COUNT)
        return nm_errorf(err, NM_ERR_FORMAT, "objective: unknown \"%.40s\" (budget, quantile)",
                         name);
    plan->objective = (nm_plan_objective)o;
    if ((st = nm_json_get_int(root, "granule", 0, plan->moe.chunk, &granule, NULL, err))) return st;
    plan->granule = (int32_t)granule;
    if (plan->objective == NM_PLAN_QUANTILE) {
        if (granule != 0)
            return nm_errorf(err, NM_ERR_FORMAT, "granule: %lld, but a quantile plan has none",
                             (long long)granule);
        return NM_OK;
    }
    bool multiples = granule >= 1 && plan->n_tiers == plan->moe.chunk / granule &&
                     plan->moe.chunk % granule == 0;
    for (int32_t i = 0; multiples && i < plan->n_tiers; i++)
        multiples = plan->tiers[i] == (i + 1) * granule;
    if (!multiples)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "tiers: a budgeted plan's tiers are the multiples of its granule (%lld) "
                         "up to the chunk (%d)",
                         (long long)granule, plan->moe.chunk);
    return NM_OK;
}

static nm_status read_cost(const json_t *layer, int32_t l, nm_plan_cost *c, nm_error *err) {
    char at[24], where[32];
    snprintf(at, sizeof at, "layers[%d]", l);
    snprintf(where, sizeof where, "layers[%d].cost", l);
    const json_t *cost;
    nm_status st;
    if ((st = nm_json_get_obj(layer, "cost", &cost, at, err))) return st;
    if ((st = nm_json_get_num(cost, "device_ms", 0, max_cost_ms, &c->device_ms, where, err)) ||
        (st = nm_json_get_num(cost, "host_ms", 0, max_cost_ms, &c->host_ms, where, err)) ||
        (st = nm_json_get_num(cost, "chunk_ms", 0, max_cost_ms, &c->chunk_ms, where, err)))
        return st;
    /* dense_ms: absent in plans made before the dense part was weighed */
    st = nm_json_get_num(cost, "dense_ms", 0, max_cost_ms, &c->dense_ms, where, err);
    if (st != NM_OK && st != NM_ERR_NOT_FOUND) return st;
    if (!nm_plan_close(c->chunk_ms, fmax(c->device_ms, c->host_ms)))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "%s: chunk_ms %.17g is not max(device_ms %.17g, host_ms %.17g)", where,
                         c->chunk_ms, c->device_ms, c->host_ms);
    return NM_OK;
}

static nm_status read_group(const json_t *obj, int32_t l, int32_t g, nm_plan *plan,
                            nm_moe_group *grp, nm_error *err) {
    char where[48];
    snprintf(where, sizeof where, "layers[%d].groups[%d]", l, g);
    int64_t tier;
    const json_t *experts;
    nm_status st;
    if ((st = nm_json_get_int(obj, "tier", 1, plan->moe.chunk, &tier, where, err)) ||
        (st = nm_json_get_arr(obj, "experts", &experts, where, err)) ||
        (st = nm_json_get_bool(obj, "device", &grp->on_device, where, err)))
        return st;
    bool known = false;
    for (int32_t i = 0; i < plan->n_tiers; i++)
        known |= plan->tiers[i] == tier;
    if (!known)
        return nm_errorf(err, NM_ERR_FORMAT, "%s.tier: %lld is not one of the plan's tiers", where,
                         (long long)tier);
    grp->capacity = (int32_t)tier;
    const size_t n = json_array_size(experts);
    if (n < 1 || n > (size_t)plan->moe.n_expert)
        return nm_errorf(err, NM_ERR_FORMAT, "%s.experts: %zu entries, expected 1 to n_expert %d",
                         where, n, plan->moe.n_expert);
    grp->experts = nm_malloc(n * sizeof(int32_t));
    if (!grp->experts) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    for (size_t i = 0; i < n; i++) {
        char at[96];
        snprintf(at, sizeof at, "%s.experts[%zu]", where, i);
        int64_t e;
        st = nm_json_as_int(json_array_get(experts, i), 0, plan->moe.n_expert - 1, &e, at, err);
        if (st != NM_OK) return st;
        grp->experts[i] = (int32_t)e;
        grp->n_experts++;
    }
    return NM_OK;
}

/* A layer's budget, and its groups' rows within it; a budgeted plan's
 * tiers are the multiples of its granule. */
static nm_status read_budget(const json_t *layer, int32_t l, nm_plan *plan, nm_error *err) {
    char where[24];
    snprintf(where, sizeof where, "layers[%d]", l);
    const nm_moe_layer_plan *lp = &plan->moe.layers[l];
    int64_t rows = 0, budget;
    for (int32_t g = 0; g < lp->n_groups; g++)
        rows += (int64_t)lp->groups[g].n_experts * lp->groups[g].capacity;
    nm_status st =
        nm_json_get_int(layer, "budget_rows", 0, (int64_t)plan->moe.n_expert * plan->moe.chunk,
                        &budget, where, err);
    if (st != NM_OK) return st;
    plan->budget_rows[l] = budget;
    if (rows > budget)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "%s: the groups reserve %lld rows per chunk, over the budget_rows %lld",
                         where, (long long)rows, (long long)budget);
    return NM_OK;
}

/* layers[l].dense, "device" or "host": in every layer or in none (a plan
 * made before the planner chose it, dense_on_device stays NULL). */
static nm_status read_dense(const json_t *layer, int32_t l, nm_plan *plan, nm_error *err) {
    char where[24];
    snprintf(where, sizeof where, "layers[%d]", l);
    const char *name = NULL;
    nm_status st = nm_json_get_str(layer, "dense", &name, where, err);
    if (st == NM_ERR_NOT_FOUND && !plan->dense_on_device) return NM_OK; /* nor layers[0] */
    if (st == NM_OK && l > 0 && !plan->dense_on_device)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "%s.dense: given here but not in layers[0] (every layer or none)", where);
    if (st != NM_OK) {
        if (st == NM_ERR_NOT_FOUND) { /* layers[0] has one */
            st = NM_ERR_FORMAT;
            if (err) err->status = st;
        }
        return st;
    }
    if (strcmp(name, "device") != 0 && strcmp(name, "host") != 0)
        return nm_errorf(err, NM_ERR_FORMAT, "%s.dense: \"%.40s\" is not \"device\" or \"host\"",
                         where, name);
    if (!plan->dense_on_device) {
        plan->dense_on_device = nm_calloc((size_t)plan->moe.n_layer, sizeof(bool));
        if (!plan->dense_on_device) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    }
    plan->dense_on_device[l] = strcmp(name, "device") == 0;
    return NM_OK;
}

static nm_status read_layers(const json_t *layers, nm_plan *plan, nm_error *err) {
    nm_status st = NM_OK;
    double sum = 0;
    for (int32_t l = 0; l < plan->moe.n_layer; l++) {
        char where[24];
        snprintf(where, sizeof where, "layers[%d]", l);
        const json_t *layer = json_array_get(layers, (size_t)l), *groups;
        if ((st = nm_json_get_arr(layer, "groups", &groups, where, err))) return st;
        const size_t n = json_array_size(groups);
        if (n < 1 || n > (size_t)plan->moe.n_expert)
            return nm_errorf(err, NM_ERR_FORMAT,
                             "%s.groups: %zu groups, expected 1 to n_expert %d (a group has at "
                             "least one expert)",
                             where, n, plan->moe.n_expert);
        nm_moe_layer_plan *lp = &plan->moe.layers[l];
        lp->groups = nm_calloc(n, sizeof *lp->groups);
        if (!lp->groups) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
        for (size_t g = 0; g < n; g++) {
            /* counted first so nm_plan_free releases a half-read group */
            lp->n_groups++;
            st = read_group(json_array_get(groups, g), l, (int32_t)g, plan, &lp->groups[g], err);
            if (st != NM_OK) return st;
        }
        if ((st = read_cost(layer, l, &plan->layer_cost[l], err)) ||
            (st = read_budget(layer, l, plan, err)) || (st = read_dense(layer, l, plan, err)))
            return st;
        sum += plan->layer_cost[l].chunk_ms;
    }
    if (!nm_plan_close(sum, plan->predicted_chunk_ms))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "predicted_chunk_ms %.17g is not the sum of the layers' chunk_ms, %.17g",
                         plan->predicted_chunk_ms, sum);
    st = nm_moe_plan_check(&plan->moe, plan->moe.n_layer, plan->moe.n_expert, err);
    if (st == NM_ERR_INVALID_ARG) { /* a bad file, not a bad argument */
        st = NM_ERR_FORMAT;
        if (err) err->status = st;
    }
    return st;
}

static nm_status read_plan(const json_t *root, void *vctx, nm_error *err) {
    read_ctx *ctx = vctx;
    nm_status st = nm_plan_json_header(root, NM_PLAN_FORMAT, NM_PLAN_FILE_VERSION,
                                       "make the plan again with `npumoe plan`", err);
    if (st != NM_OK) return st;
    nm_fingerprint fp;
    if ((st = nm_plan_json_fingerprint(root, &fp, err))) return st;
    if (ctx->shape && strcmp(fp.hex, ctx->shape->fingerprint.hex) != 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the plan was made for another model (fingerprint %s; this model is "
                         "%s): make a plan for this model with `npumoe plan`",
                         fp.hex, ctx->shape->fingerprint.hex);
    const char *device;
    int64_t chunk, n_layer, n_expert, device_bytes;
    const json_t *layers;
    if ((st = nm_json_get_str(root, "device", &device, NULL, err))) return st;
    if (device[0] == '\0' || strlen(device) >= sizeof ctx->plan->device)
        return nm_errorf(err, NM_ERR_FORMAT, "device: expected a name of 1 to %zu bytes",
                         sizeof ctx->plan->device - 1);
    if ((st = nm_json_get_int(root, "chunk", 1, NM_PLAN_MAX_CHUNK, &chunk, NULL, err)) ||
        (st = nm_json_get_int(root, "n_layer", 1, NM_PLAN_MAX_LAYERS, &n_layer, NULL, err)) ||
        (st = nm_json_get_int(root, "n_expert", 1, NM_PLAN_MAX_EXPERTS, &n_expert, NULL, err)))
        return st;
    if (ctx->shape && (n_layer != ctx->shape->n_layer || n_expert != ctx->shape->n_expert))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the plan is for %lld layers of %lld experts, the model has %d of %d",
                         (long long)n_layer, (long long)n_expert, ctx->shape->n_layer,
                         ctx->shape->n_expert);
    /* which model layers the plan's are: absent in plans of models whose
     * every layer has experts */
    int64_t first_layer = 0;
    if (json_object_get(root, "first_moe_layer") &&
        (st = nm_json_get_int(root, "first_moe_layer", 0, NM_PLAN_MAX_LAYERS, &first_layer, NULL,
                              err)))
        return st;
    if (ctx->shape && first_layer != ctx->shape->first_layer)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the plan's layers start at the model's layer %lld, the model's MoE "
                         "layers at %d",
                         (long long)first_layer, ctx->shape->first_layer);
    /* the shared experts: absent in plans of models without them */
    int64_t n_shared = 0, d_ff_shared = 0;
    if (json_object_get(root, "shared_experts") &&
        ((st = nm_json_get_int(root, "shared_experts", 1, NM_PLAN_MAX_SHARED, &n_shared, NULL,
                               err)) ||
         (st = nm_json_get_int(root, "shared_expert_ff", 1, NM_PLAN_MAX_SHARED_FF, &d_ff_shared,
                               NULL, err))))
        return st;
    if (!json_object_get(root, "shared_experts") && json_object_get(root, "shared_expert_ff"))
        return nm_errorf(err, NM_ERR_FORMAT, "shared_expert_ff without shared_experts");
    if (ctx->shape && (n_shared != ctx->shape->n_shared || d_ff_shared != ctx->shape->d_ff_shared))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the plan is for %lld shared experts of width %lld in all, the model has "
                         "%d of width %d",
                         (long long)n_shared, (long long)d_ff_shared, ctx->shape->n_shared,
                         ctx->shape->d_ff_shared);
    nm_plan *plan = ctx->plan;
    plan->first_layer = (int32_t)first_layer;
    plan->n_shared = (int32_t)n_shared;
    plan->d_ff_shared = (int32_t)d_ff_shared;
    snprintf(plan->device, sizeof plan->device, "%s", device);
    plan->fingerprint = fp;
    plan->moe.chunk = (int32_t)chunk;
    plan->moe.n_expert = (int32_t)n_expert;
    if ((st = read_tiers(root, plan, err)) || (st = read_policy(root, plan, err)) ||
        (st = read_objective(root, plan, err)) ||
        (st = nm_json_get_num(root, "quantile", 0, 1, &plan->quantile, NULL, err)) ||
        (st = nm_json_get_num(root, "predicted_drop_rate", 0, 1, &plan->predicted_drop_rate, NULL,
                              err)) ||
        (st = nm_json_get_num(root, "predicted_drop_weight", 0, 1, &plan->predicted_drop_weight,
                              NULL, err)) ||
        (st = nm_json_get_num(root, "predicted_chunk_ms", 0, max_cost_ms, &plan->predicted_chunk_ms,
                              NULL, err)) ||
        (st = nm_json_get_int(root, "device_bytes", 0, INT64_MAX, &device_bytes, NULL, err)) ||
        (st = nm_json_get_arr(root, "layers", &layers, NULL, err)))
        return st;
    if (plan->quantile <= 0)
        return nm_errorf(err, NM_ERR_FORMAT, "quantile: expected a number in (0, 1], got 0");
    plan->device_bytes = (uint64_t)device_bytes;
    if (json_array_size(layers) != (size_t)n_layer)
        return nm_errorf(err, NM_ERR_FORMAT, "layers: %zu entries, n_layer is %lld",
                         json_array_size(layers), (long long)n_layer);
    plan->moe.layers = nm_calloc((size_t)n_layer, sizeof *plan->moe.layers);
    plan->layer_cost = nm_calloc((size_t)n_layer, sizeof *plan->layer_cost);
    plan->budget_rows = nm_calloc((size_t)n_layer, sizeof *plan->budget_rows);
    if (!plan->moe.layers || !plan->layer_cost || !plan->budget_rows)
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    plan->moe.n_layer = (int32_t)n_layer;
    return read_layers(layers, plan, err);
}

static nm_status load(const char *path, const char *text, size_t n_bytes, const nm_moe_shape *shape,
                      nm_plan **out, nm_error *err) {
    *out = NULL;
    read_ctx ctx = {.shape = shape, .plan = nm_calloc(1, sizeof(nm_plan))};
    if (!ctx.plan) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a plan");
    nm_status st = text ? nm_plan_read_memory(text, n_bytes, path, read_plan, &ctx, err)
                        : nm_plan_read_file(path, read_plan, &ctx, err);
    if (st != NM_OK) {
        nm_plan_free(ctx.plan);
        return st;
    }
    *out = ctx.plan;
    return NM_OK;
}

nm_status nm_plan_load(const char *path, const nm_moe_shape *shape, nm_plan **out, nm_error *err) {
    NM_ASSERT(path && out);
    return load(path, NULL, 0, shape, out, err);
}

nm_status nm_plan_load_memory(const char *text, size_t n_bytes, const char *name,
                              const nm_moe_shape *shape, nm_plan **out, nm_error *err) {
    NM_ASSERT(text && out);
    return load(name, text, n_bytes, shape, out, err);
}

/* ---- the summary ---- */

static void print_experts(const nm_moe_group *grp, FILE *f) {
    for (int32_t i = 0; i < grp->n_experts; i++)
        fprintf(f, "%s%d", i ? " " : "", grp->experts[i]);
}

void nm_plan_describe(const nm_plan *plan, FILE *f) {
    const nm_moe_plan *moe = &plan->moe;
    fprintf(f, "plan for model %s on device %s\n", plan->fingerprint.hex, plan->device);
    fprintf(f, "chunk:      %d tokens, %d layers of %d experts\n", moe->chunk, moe->n_layer,
            moe->n_expert);
    if (plan->first_layer > 0)
        fprintf(f,
                "layers:     the model's %d..%d (those before have no experts; below, "
                "layer l is the model's l + %d)\n",
                plan->first_layer, plan->first_layer + moe->n_layer - 1, plan->first_layer);
    if (plan->n_shared > 0)
        fprintf(f,
                "shared:     %d shared expert%s (d_ff %d in all) on every token, with each "
                "layer's dense part, in no tier or group\n",
                plan->n_shared, plan->n_shared == 1 ? "" : "s", plan->d_ff_shared);
    fprintf(f, "tiers:     ");
    for (int32_t i = 0; i < plan->n_tiers; i++)
        fprintf(f, " %d", plan->tiers[i]);
    if (plan->objective == NM_PLAN_BUDGET)
        fprintf(f, " (multiples of %d rows: the least expected %s within each layer's budget)\n",
                plan->granule,
                moe->overflow == NM_OVERFLOW_DROP && moe->salience == NM_SALIENCE_ROUTER
                    ? "dropped routing weight"
                    : "overflow");
    else
        fprintf(f, " (each expert: the smallest >= its q%g load)\n", plan->quantile * 100);
    int64_t min_budget = INT64_MAX, max_budget = 0;
    for (int32_t l = 0; l < moe->n_layer; l++) {
        min_budget = plan->budget_rows[l] < min_budget ? plan->budget_rows[l] : min_budget;
        max_budget = plan->budget_rows[l] > max_budget ? plan->budget_rows[l] : max_budget;
    }
    fprintf(f, "objective:  %s, %lld", nm_plan_objective_name(plan->objective),
            (long long)min_budget);
    if (max_budget != min_budget) fprintf(f, " to %lld", (long long)max_budget);
    fprintf(f, " rows per layer and chunk\n");
    fprintf(f,
            "overflow predicted on the calibration: %.3f%% of assignments, %.3f%% of routing "
            "weight\n",
            100 * plan->predicted_drop_rate, 100 * plan->predicted_drop_weight);
    fprintf(f, "overflow:   %s, salience %s\n", nm_overflow_name(moe->overflow),
            nm_salience_name(moe->salience));
    int64_t n_graphs = 0, n_dev_experts = 0, n_rows = 0;
    for (int32_t l = 0; l < moe->n_layer; l++)
        for (int32_t g = 0; g < moe->layers[l].n_groups; g++) {
            const nm_moe_group *grp = &moe->layers[l].groups[g];
            if (!grp->on_device) continue;
            n_graphs++;
            n_dev_experts += grp->n_experts;
            n_rows += (int64_t)grp->n_experts * grp->capacity;
        }
    fprintf(f, "device:     %lld graphs, %lld of %lld experts, %lld rows per chunk, %.1f MiB\n",
            (long long)n_graphs, (long long)n_dev_experts, (long long)moe->n_layer * moe->n_expert,
            (long long)n_rows, (double)plan->device_bytes / (1024.0 * 1024.0));
    fprintf(f, "predicted:  %.4f ms per chunk (all layers)\n", plan->predicted_chunk_ms);
    if (plan->dense_on_device) {
        int32_t n_dense = 0;
        double dense_ms = 0;
        for (int32_t l = 0; l < moe->n_layer; l++) {
            n_dense += plan->dense_on_device[l];
            dense_ms += plan->layer_cost[l].dense_ms;
        }
        fprintf(f, "dense part: on the device in %d of %d layers, %.4f ms per chunk%s\n", n_dense,
                moe->n_layer, dense_ms, dense_ms > 0 ? "" : " (not measured by the profile)");
    } else {
        fprintf(f, "dense part: where each layer's groups are (a plan made before the planner "
                   "chose it)\n");
    }
    for (int32_t l = 0; l < moe->n_layer; l++) {
        const nm_plan_cost *c = &plan->layer_cost[l];
        fprintf(f, "layer %d: device %.4f ms, host %.4f ms, chunk %.4f ms", l, c->device_ms,
                c->host_ms, c->chunk_ms);
        if (plan->dense_on_device)
            fprintf(f, "; dense part on the %s, %.4f ms",
                    plan->dense_on_device[l] ? "device" : "host", c->dense_ms);
        fputc('\n', f);
        for (int32_t g = 0; g < moe->layers[l].n_groups; g++) {
            const nm_moe_group *grp = &moe->layers[l].groups[g];
            fprintf(f, "  %-6s tier %4d  experts ", grp->on_device ? "device" : "host",
                    grp->capacity);
            print_experts(grp, f);
            fputc('\n', f);
        }
    }
}
