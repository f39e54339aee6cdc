/* The static-graph MoE executor: the modes naive, tiers, grouped and npumoe
 * of DESIGN.md. Per chunk and layer: route (done by the caller), apply each
 * expert's capacity choosing the overflow by salience, pack rows into the
 * graphs' input buffers, submit, compute host experts and spilled rows
 * meanwhile, wait, unpack, combine. Graph shapes never change after
 * nm_moe_exec_new; nothing here allocates per chunk. */
#include "moe-impl.h"

#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One expert's place in a compiled graph. */
typedef struct slot {
    int32_t graph;    /* index into the layer's graphs, -1 = host expert */
    int32_t capacity; /* rows reserved */
    int64_t row0;     /* first row in the graph's buffers */
    int32_t filled;   /* rows written in the last chunk (to re-zero) */
} slot;

typedef struct layer_exec {
    int32_t n_graphs;
    nm_graph **graphs; /* [n_graphs] */
    slot *slots;       /* [n_expert] */
} layer_exec;

struct nm_moe_exec {
    nm_mode mode;
    nm_overflow overflow;
    nm_salience salience;
    nm_device *device;
    int32_t chunk;
    int32_t n_layer;
    int32_t n_expert;
    int32_t k;
    int64_t d_model;
    const nm_expert_weights *const *weights; /* [n_layer] */
    nm_moe_scratch *s;
    layer_exec *layers;            /* [n_layer] */
    nm_moe_layer_metrics *metrics; /* [n_layer] */
    int32_t *dev_rows;             /* [chunk * k] assignments placed on the device, by expert */
    int32_t *dev_n;                /* [n_expert] how many of them each expert has         */
    int32_t *spill_rows;           /* [chunk * k] overflow assignments computed on the host */
    uint8_t *keep;                 /* [chunk * k] 0 = dropped                              */
    float *token_norm;             /* [chunk] salience by activation norm                   */
    struct ranked *ranked;         /* [chunk] scratch for ordering one expert's rows     */
    float *load_w;                 /* [chunk * k] weights by expert for load_fn           */
    nm_load_fn load_fn;
    void *load_ctx;
};

typedef struct ranked {
    float score;
    int32_t a; /* assignment */
} ranked;

static const char *const mode_names[] = {
    [NM_MODE_DENSE] = "dense",     [NM_MODE_NAIVE] = "naive",   [NM_MODE_TIERS] = "tiers",
    [NM_MODE_GROUPED] = "grouped", [NM_MODE_NPUMOE] = "npumoe",
};
_Static_assert(sizeof mode_names / sizeof mode_names[0] == NM_MODE_COUNT, "one name per mode");
static const char *const overflow_names[] = {
    [NM_OVERFLOW_DROP] = "drop",
    [NM_OVERFLOW_SPILL] = "spill",
};
_Static_assert(sizeof overflow_names / sizeof overflow_names[0] == NM_OVERFLOW_COUNT,
               "one name per overflow policy");
static const char *const salience_names[] = {
    [NM_SALIENCE_ROUTER] = "router",
    [NM_SALIENCE_RESIDUAL] = "residual-norm",
    [NM_SALIENCE_INPUT] = "input-norm",
};
_Static_assert(sizeof salience_names / sizeof salience_names[0] == NM_SALIENCE_COUNT,
               "one name per salience policy");

const char *nm_mode_name(nm_mode mode) {
    return (unsigned)mode < NM_MODE_COUNT ? mode_names[mode] : "unknown";
}
const char *nm_overflow_name(nm_overflow overflow) {
    return (unsigned)overflow < NM_OVERFLOW_COUNT ? overflow_names[overflow] : "unknown";
}
const char *nm_salience_name(nm_salience salience) {
    return (unsigned)salience < NM_SALIENCE_COUNT ? salience_names[salience] : "unknown";
}

static nm_status parse_name(const char *what, const char *const *names, int n, const char *name,
                            int *out, nm_error *err) {
    for (int i = 0; i < n; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = i;
            return NM_OK;
        }
    char choices[128] = "";
    for (int i = 0; i < n; i++) {
        strncat(choices, names[i], sizeof choices - strlen(choices) - 1);
        if (i + 1 < n) strncat(choices, ", ", sizeof choices - strlen(choices) - 1);
    }
    return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown %s '%s' (choose one of: %s)", what,
                     name ? name : "", choices);
}

nm_status nm_mode_parse(const char *name, nm_mode *out, nm_error *err) {
    int v = 0;
    nm_status st = parse_name("mode", mode_names, NM_MODE_COUNT, name, &v, err);
    if (st == NM_OK) *out = (nm_mode)v;
    return st;
}
nm_status nm_overflow_parse(const char *name, nm_overflow *out, nm_error *err) {
    int v = 0;
    nm_status st = parse_name("overflow policy", overflow_names, NM_OVERFLOW_COUNT, name, &v, err);
    if (st == NM_OK) *out = (nm_overflow)v;
    return st;
}
nm_status nm_salience_parse(const char *name, nm_salience *out, nm_error *err) {
    int v = 0;
    nm_status st = parse_name("salience policy", salience_names, NM_SALIENCE_COUNT, name, &v, err);
    if (st == NM_OK) *out = (nm_salience)v;
    return st;
}

nm_status nm_moe_plan_check(const nm_moe_plan *plan, int32_t n_layer, int32_t n_expert,
                            nm_error *err) {
    if (plan->n_layer != n_layer || plan->n_expert != n_expert)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the plan is for %d layers of %d experts, the model has %d of %d",
                         plan->n_layer, plan->n_expert, n_layer, n_expert);
    if (plan->chunk < 1)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "the plan's chunk %d is not positive",
                         plan->chunk);
    if ((unsigned)plan->overflow >= NM_OVERFLOW_COUNT ||
        (unsigned)plan->salience >= NM_SALIENCE_COUNT)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the plan's overflow or salience policy is unknown");
    uint8_t *seen = nm_calloc((size_t)n_expert, 1);
    if (!seen) return nm_errorf(err, NM_ERR_NOMEM, "out of memory checking a plan");
    nm_status st = NM_OK;
    for (int32_t l = 0; l < n_layer && st == NM_OK; l++) {
        const nm_moe_layer_plan *lp = &plan->layers[l];
        memset(seen, 0, (size_t)n_expert);
        for (int32_t g = 0; g < lp->n_groups && st == NM_OK; g++) {
            const nm_moe_group *grp = &lp->groups[g];
            if (grp->capacity < 1 || grp->capacity > plan->chunk)
                st = nm_errorf(err, NM_ERR_INVALID_ARG,
                               "layer %d group %d: capacity %d is not in [1, chunk %d]", l, g,
                               grp->capacity, plan->chunk);
            if (grp->n_experts < 1 && st == NM_OK)
                st = nm_errorf(err, NM_ERR_INVALID_ARG, "layer %d group %d has no experts", l, g);
            for (int32_t i = 0; i < grp->n_experts && st == NM_OK; i++) {
                const int32_t e = grp->experts[i];
                if (e < 0 || e >= n_expert)
                    st = nm_errorf(err, NM_ERR_INVALID_ARG,
                                   "layer %d group %d: expert %d is not in 0..%d", l, g, e,
                                   n_expert - 1);
                else if (seen[e]++)
                    st = nm_errorf(err, NM_ERR_INVALID_ARG,
                                   "layer %d: expert %d is in more than one group", l, e);
            }
        }
        for (int32_t e = 0; e < n_expert && st == NM_OK; e++)
            if (!seen[e])
                st = nm_errorf(err, NM_ERR_INVALID_ARG, "layer %d: expert %d is in no group", l, e);
    }
    nm_free(seen);
    return st;
}

/* ---- building ---- */

static nm_status compile_graph(nm_moe_exec *ex, int32_t layer, const int32_t *experts,
                               const int32_t *capacity, int32_t n_experts, nm_error *err) {
    layer_exec *le = &ex->layers[layer];
    const nm_expert_weights *w = ex->weights[layer];
    nm_ffn_spec spec = {.layer = layer,
                        .n_experts = n_experts,
                        .experts = experts,
                        .capacity = capacity,
                        .d_model = w->down.n,
                        .d_ff = w->gate.n,
                        .weights = w};
    nm_graph *g = NULL;
    nm_status st = ex->device->ops->compile(ex->device, &spec, &g, err);
    if (st != NM_OK) return nm_error_prefix(err, "layer %d", layer);
    const int32_t gi = le->n_graphs++;
    le->graphs[gi] = g;
    int64_t row = 0;
    for (int32_t i = 0; i < n_experts; i++) {
        le->slots[experts[i]] = (slot){.graph = gi, .capacity = capacity[i], .row0 = row};
        row += capacity[i];
    }
    return NM_OK;
}

/* Whether layer l gets any graph in the executor's mode. */
static bool layer_has_graphs(nm_mode mode, const nm_moe_plan *plan, int32_t l) {
    if (mode == NM_MODE_DENSE) return false;
    if (mode != NM_MODE_NPUMOE) return true; /* every expert is in some graph */
    for (int32_t g = 0; g < plan->layers[l].n_groups; g++)
        if (plan->layers[l].groups[g].on_device) return true;
    return false;
}

/* The graphs of one layer for the executor's mode. */
static nm_status build_layer(nm_moe_exec *ex, const nm_moe_plan *plan, int32_t layer,
                             nm_error *err) {
    layer_exec *le = &ex->layers[layer];
    const int32_t n_expert = ex->n_expert;
    le->slots = nm_calloc((size_t)n_expert, sizeof(slot));
    le->graphs = nm_calloc((size_t)n_expert, sizeof(nm_graph *)); /* at most one per expert */
    if (!le->slots || !le->graphs) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for graphs");
    for (int32_t e = 0; e < n_expert; e++)
        le->slots[e].graph = -1;
    nm_status st = NM_OK;
    if (ex->mode == NM_MODE_NAIVE) {
        for (int32_t e = 0; e < n_expert && st == NM_OK; e++)
            st = compile_graph(ex, layer, &e, &ex->chunk, 1, err);
        return st;
    }
    const nm_moe_layer_plan *lp = &plan->layers[layer];
    for (int32_t g = 0; g < lp->n_groups && st == NM_OK; g++) {
        const nm_moe_group *grp = &lp->groups[g];
        if (ex->mode == NM_MODE_TIERS) {
            for (int32_t i = 0; i < grp->n_experts && st == NM_OK; i++)
                st = compile_graph(ex, layer, &grp->experts[i], &grp->capacity, 1, err);
        } else if (ex->mode == NM_MODE_GROUPED || grp->on_device) {
            int32_t *cap = nm_malloc((size_t)grp->n_experts * sizeof(int32_t));
            if (!cap) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for graphs");
            for (int32_t i = 0; i < grp->n_experts; i++)
                cap[i] = grp->capacity;
            st = compile_graph(ex, layer, grp->experts, cap, grp->n_experts, err);
            nm_free(cap);
        }
        /* npumoe, a host group: its experts keep slot.graph = -1 */
    }
    return st;
}

void nm_moe_exec_free(nm_moe_exec *ex) {
    if (!ex) return;
    for (int32_t l = 0; ex->layers && l < ex->n_layer; l++) {
        layer_exec *le = &ex->layers[l];
        for (int32_t g = 0; g < le->n_graphs; g++)
            ex->device->ops->graph_free(le->graphs[g]);
        nm_free(le->graphs);
        nm_free(le->slots);
    }
    nm_free(ex->layers);
    nm_free(ex->metrics);
    nm_free(ex->dev_rows);
    nm_free(ex->dev_n);
    nm_free(ex->spill_rows);
    nm_free(ex->keep);
    nm_free(ex->token_norm);
    nm_free(ex->ranked);
    nm_free(ex->load_w);
    nm_moe_scratch_free(ex->s);
    nm_free(ex);
}

nm_status nm_moe_exec_new(const nm_moe_exec_params *p, nm_moe_exec **out, nm_error *err) {
    *out = NULL;
    NM_ASSERT(p->n_layer > 0 && p->chunk > 0 && p->k > 0);
    const nm_expert_weights *w0 = p->weights[0];
    const bool needs_plan =
        p->mode == NM_MODE_TIERS || p->mode == NM_MODE_GROUPED || p->mode == NM_MODE_NPUMOE;
    if ((unsigned)p->mode >= NM_MODE_COUNT)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "unknown mode %d", (int)p->mode);
    if (needs_plan && !p->plan)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "mode %s needs a plan (--plan)",
                         nm_mode_name(p->mode));
    if (p->mode != NM_MODE_DENSE && !p->device)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "mode %s needs a device", nm_mode_name(p->mode));
    if (needs_plan) {
        nm_status st = nm_moe_plan_check(p->plan, p->n_layer, w0->n_expert, err);
        if (st != NM_OK) return st;
        if (p->plan->chunk != p->chunk)
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "the plan was made for chunks of %d tokens, the session uses %d",
                             p->plan->chunk, p->chunk);
    }
    /* before anything is compiled: a device is never handed a graph it
     * cannot run */
    for (int32_t l = 0; l < p->n_layer; l++)
        if (layer_has_graphs(p->mode, p->plan, l) &&
            nm_device_check_ffn(p->device, p->weights[l], l, err) != NM_OK)
            return nm_error_prefix(err, "mode %s", nm_mode_name(p->mode));
    nm_moe_exec *ex = nm_calloc(1, sizeof *ex);
    if (!ex) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the MoE executor");
    ex->mode = p->mode;
    ex->overflow = needs_plan ? p->plan->overflow : NM_OVERFLOW_SPILL;
    ex->salience = needs_plan ? p->plan->salience : NM_SALIENCE_ROUTER;
    ex->device = p->device;
    ex->chunk = p->chunk;
    ex->n_layer = p->n_layer;
    ex->n_expert = w0->n_expert;
    ex->k = p->k;
    ex->d_model = w0->down.n;
    ex->weights = p->weights;
    const size_t n_assign = (size_t)p->chunk * (size_t)p->k;
    nm_status st = nm_moe_scratch_new(p->chunk, p->k, ex->n_expert, ex->d_model, w0->gate.n,
                                      p->n_threads, &ex->s, err);
    ex->metrics = nm_calloc((size_t)p->n_layer, sizeof *ex->metrics);
    ex->layers = nm_calloc((size_t)p->n_layer, sizeof *ex->layers);
    ex->dev_rows = nm_calloc(n_assign, sizeof(int32_t));
    ex->dev_n = nm_calloc((size_t)ex->n_expert, sizeof(int32_t));
    ex->spill_rows = nm_calloc(n_assign, sizeof(int32_t));
    ex->keep = nm_calloc(n_assign, 1);
    ex->token_norm = nm_calloc((size_t)p->chunk, sizeof(float));
    ex->ranked = nm_calloc((size_t)p->chunk, sizeof(ranked));
    ex->load_w = nm_calloc(n_assign, sizeof(float));
    if (st == NM_OK &&
        (!ex->metrics || !ex->layers || !ex->dev_rows || !ex->dev_n || !ex->spill_rows ||
         !ex->keep || !ex->token_norm || !ex->ranked || !ex->load_w))
        st = nm_errorf(err, NM_ERR_NOMEM, "out of memory for the MoE executor");
    for (int32_t l = 0; st == NM_OK && p->mode != NM_MODE_DENSE && l < p->n_layer; l++)
        st = build_layer(ex, p->plan, l, err);
    if (st != NM_OK) {
        nm_moe_exec_free(ex);
        return st;
    }
    *out = ex;
    return NM_OK;
}

const nm_moe_layer_metrics *nm_moe_exec_metrics(const nm_moe_exec *ex) { return ex->metrics; }

void nm_moe_exec_reset_metrics(nm_moe_exec *ex) {
    memset(ex->metrics, 0, (size_t)ex->n_layer * sizeof *ex->metrics);
}

void nm_moe_exec_set_load_fn(nm_moe_exec *ex, nm_load_fn fn, void *ctx) {
    ex->load_fn = fn;
    ex->load_ctx = ctx;
}

/* ---- running ---- */

/* Higher score first; among equals the earlier assignment (earlier token). */
static int by_salience(const void *pa, const void *pb) {
    const ranked *a = pa, *b = pb;
    if (a->score != b->score) return a->score < b->score ? 1 : -1;
    return (a->a > b->a) - (a->a < b->a);
}

static float l2_norm(const float *v, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)v[i] * v[i];
    return (float)sqrt(sum);
}

/* Orders expert e's rows (d->rows[r0 .. r0+m)) by salience, in place. */
static void rank_rows(nm_moe_exec *ex, int32_t *rows, int32_t m, const float *x, const float *xn,
                      int32_t n, const float *weights, bool *norms_ready) {
    if (ex->salience != NM_SALIENCE_ROUTER && !*norms_ready) {
        const float *act = ex->salience == NM_SALIENCE_RESIDUAL ? x : xn;
        for (int32_t t = 0; t < n; t++)
            ex->token_norm[t] = l2_norm(act + (size_t)t * ex->d_model, ex->d_model);
        *norms_ready = true;
    }
    for (int32_t r = 0; r < m; r++) {
        const int32_t a = rows[r];
        ex->ranked[r].a = a;
        ex->ranked[r].score =
            ex->salience == NM_SALIENCE_ROUTER ? weights[a] : ex->token_norm[a / ex->k];
    }
    qsort(ex->ranked, (size_t)m, sizeof(ranked), by_salience);
    for (int32_t r = 0; r < m; r++)
        rows[r] = ex->ranked[r].a;
}

/* Writes expert e's device rows into its slot and zeroes rows that held
 * data in the previous chunk but not in this one. */
static void pack_slot(nm_moe_exec *ex, layer_exec *le, int32_t e, const int32_t *rows, int32_t m,
                      const float *xn) {
    slot *sl = &le->slots[e];
    float *in = ex->device->ops->input(le->graphs[sl->graph]) + sl->row0 * ex->d_model;
    const size_t row_bytes = (size_t)ex->d_model * sizeof(float);
    for (int32_t r = 0; r < m; r++)
        memcpy(in + (size_t)r * ex->d_model, xn + (size_t)(rows[r] / ex->k) * ex->d_model,
               row_bytes);
    if (sl->filled > m)
        memset(in + (size_t)m * ex->d_model, 0, (size_t)(sl->filled - m) * row_bytes);
    sl->filled = m;
}

static void unpack_slot(nm_moe_exec *ex, layer_exec *le, int32_t e, const int32_t *rows,
                        int32_t m) {
    const slot *sl = &le->slots[e];
    const float *o = ex->device->ops->output(le->graphs[sl->graph]) + sl->row0 * ex->d_model;
    for (int32_t r = 0; r < m; r++)
        memcpy(ex->s->y + (size_t)rows[r] * ex->d_model, o + (size_t)r * ex->d_model,
               (size_t)ex->d_model * sizeof(float));
}

/* Device experts of graph g: their rows, in slot order. */
static void dispatch_graph(nm_moe_exec *ex, layer_exec *le, int32_t g, int32_t layer) {
    nm_graph *graph = le->graphs[g];
    nm_moe_layer_metrics *mt = &ex->metrics[layer];
    for (int32_t e = 0; e < ex->n_expert; e++)
        if (le->slots[e].graph == g) mt->reserved_rows += (uint64_t)le->slots[e].capacity;
    mt->dispatches++;
    ex->device->ops->submit(graph);
}

void nm_moe_exec_layer(nm_moe_exec *ex, nm_pool *pool, int32_t layer, const float *x,
                       const float *xn, int32_t n, const int32_t *ids, const float *weights,
                       float *out) {
    NM_ASSERT(layer >= 0 && layer < ex->n_layer && n >= 1 && n <= ex->chunk);
    const int64_t t_start = nm_time_ns();
    nm_moe_scratch *s = ex->s;
    nm_moe_layer_metrics *mt = &ex->metrics[layer];
    const nm_expert_weights *w = ex->weights[layer];
    const nm_moe_dispatch *d = nm_moe_dispatch_build(s, ids, n);
    mt->chunks++;
    mt->assignments += (uint64_t)n * (uint64_t)ex->k;
    for (int32_t a = 0; a < n * ex->k; a++)
        mt->weight += weights[a];
    if (ex->load_fn) {
        int32_t *loads = s->fill; /* free after the dispatch is built */
        for (int32_t e = 0; e < ex->n_expert; e++)
            loads[e] = d->offset[e + 1] - d->offset[e];
        for (int32_t r = 0; r < n * ex->k; r++) /* rows are grouped by expert */
            ex->load_w[r] = weights[d->rows[r]];
        ex->load_fn(ex->load_ctx, layer, loads, ex->n_expert, ex->load_w);
    }
    if (ex->mode == NM_MODE_DENSE) {
        const int64_t t0 = nm_time_ns();
        nm_moe_dense_dispatched(pool, w, xn, n, weights, out, s);
        mt->host_rows += (uint64_t)n * (uint64_t)ex->k;
        mt->host_ns += nm_time_ns() - t0;
        mt->moe_ns += nm_time_ns() - t_start;
        return;
    }

    /* capacities: which rows go to the device, which overflow */
    layer_exec *le = &ex->layers[layer];
    memset(ex->keep, 1, (size_t)n * (size_t)ex->k);
    int32_t n_jobs = 0, n_dev_rows = 0, n_spill = 0;
    bool norms_ready = false;
    int32_t *dev_start = s->fill; /* [n_expert] start of each expert in dev_rows */
    for (int32_t e = 0; e < ex->n_expert; e++) {
        const int32_t r0 = d->offset[e], m = d->offset[e + 1] - r0;
        const slot *sl = &le->slots[e];
        ex->dev_n[e] = 0;
        dev_start[e] = n_dev_rows;
        if (m == 0) continue;
        if (sl->graph < 0) { /* a host expert computes all its rows */
            s->jobs[n_jobs++] = (nm_host_job){.expert = e, .n_rows = m, .rows = d->rows + r0};
            continue;
        }
        int32_t *rows = ex->dev_rows + n_dev_rows;
        memcpy(rows, d->rows + r0, (size_t)m * sizeof(int32_t));
        int32_t kept = m;
        if (m > sl->capacity) {
            rank_rows(ex, rows, m, x, xn, n, weights, &norms_ready);
            kept = sl->capacity;
            const int32_t over = m - kept;
            if (ex->overflow == NM_OVERFLOW_SPILL) {
                int32_t *spill = ex->spill_rows + n_spill;
                memcpy(spill, rows + kept, (size_t)over * sizeof(int32_t));
                s->jobs[n_jobs++] = (nm_host_job){.expert = e, .n_rows = over, .rows = spill};
                n_spill += over;
                mt->spilled += (uint64_t)over;
            } else {
                for (int32_t r = kept; r < m; r++) {
                    ex->keep[rows[r]] = 0;
                    mt->dropped_weight += weights[rows[r]];
                }
                mt->dropped += (uint64_t)over;
            }
        }
        ex->dev_n[e] = kept;
        n_dev_rows += kept;
        mt->device_rows += (uint64_t)kept;
    }
    for (int32_t j = 0; j < n_jobs; j++)
        mt->host_rows += (uint64_t)s->jobs[j].n_rows;

    if (ex->mode == NM_MODE_NAIVE || ex->mode == NM_MODE_TIERS) {
        /* one graph per expert: one dispatch and one synchronisation each */
        for (int32_t e = 0; e < ex->n_expert; e++) {
            if (ex->dev_n[e] == 0) continue;
            const slot *sl = &le->slots[e];
            const int32_t *rows = ex->dev_rows + dev_start[e];
            pack_slot(ex, le, e, rows, ex->dev_n[e], xn);
            dispatch_graph(ex, le, sl->graph, layer);
            const int64_t t0 = nm_time_ns();
            ex->device->ops->wait(le->graphs[sl->graph]);
            mt->wait_ns += nm_time_ns() - t0;
            unpack_slot(ex, le, e, rows, ex->dev_n[e]);
        }
        const int64_t t0 = nm_time_ns();
        nm_moe_run_host_jobs(pool, w, xn, s, s->jobs, n_jobs);
        mt->host_ns += nm_time_ns() - t0;
    } else {
        /* grouped graphs: pack and submit every device group, compute the
         * host's share meanwhile, then wait and unpack */
        for (int32_t e = 0; e < ex->n_expert; e++)
            if (le->slots[e].graph >= 0)
                pack_slot(ex, le, e, ex->dev_rows + dev_start[e], ex->dev_n[e], xn);
        for (int32_t g = 0; g < le->n_graphs; g++)
            dispatch_graph(ex, le, g, layer);
        int64_t t0 = nm_time_ns();
        nm_moe_run_host_jobs(pool, w, xn, s, s->jobs, n_jobs);
        mt->host_ns += nm_time_ns() - t0;
        t0 = nm_time_ns();
        for (int32_t g = 0; g < le->n_graphs; g++)
            ex->device->ops->wait(le->graphs[g]);
        mt->wait_ns += nm_time_ns() - t0;
        for (int32_t e = 0; e < ex->n_expert; e++)
            if (ex->dev_n[e] > 0) unpack_slot(ex, le, e, ex->dev_rows + dev_start[e], ex->dev_n[e]);
    }
    nm_moe_combine(pool, s, n, weights, ex->keep, out);
    mt->moe_ns += nm_time_ns() - t_start;
}

bool nm_moe_exec_uses_device(const nm_moe_exec *ex, int32_t layer) {
    NM_ASSERT(layer >= 0 && layer < ex->n_layer);
    return ex->layers && ex->layers[layer].n_graphs > 0;
}

nm_status nm_moe_exec_check(const nm_moe_exec *ex, nm_error *err) {
    return ex->device ? nm_device_check(ex->device, err) : NM_OK;
}
