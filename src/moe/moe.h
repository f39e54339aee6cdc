/* The MoE block after the router: the dispatch table that groups a batch's
 * assignments by expert, the exact grouped expert execution of `dense`
 * mode, and the static executor of the other modes (static.c: capacities,
 * overflow, devices). Not here: routing (each architecture's, in model/). */
#ifndef NM_MOE_H
#define NM_MOE_H

#include "npumoe.h"

#include "device/device.h"
#include "kernels/kernels.h"
#include "threads/threads.h"

#include <stdbool.h>
#include <stdint.h>

/* Assignments of a batch grouped by expert. Assignment a = token * k + slot.
 * rows[offset[e] .. offset[e+1]) are expert e's assignments, in token
 * order. */
typedef struct nm_moe_dispatch {
    int32_t n_expert;
    int32_t n_tokens;
    int32_t k;
    int32_t *offset; /* [n_expert + 1] */
    int32_t *rows;   /* [n_tokens * k]  */
} nm_moe_dispatch;

/* Work buffers of dense execution, sized once for at most max_tokens tokens. */
typedef struct nm_moe_scratch nm_moe_scratch;

nm_status nm_moe_scratch_new(int32_t max_tokens, int32_t k, int32_t n_expert, int64_t d_model,
                             int64_t d_ff, int n_threads, nm_moe_scratch **out, nm_error *err);
void nm_moe_scratch_free(nm_moe_scratch *s);

/* Groups ids ([n_tokens][k] expert ids) by expert into the scratch's
 * dispatch table and returns it. */
const nm_moe_dispatch *nm_moe_dispatch_build(nm_moe_scratch *s, const int32_t *ids,
                                             int32_t n_tokens);

/* Exact dense MoE: out[t] = sum_slot weights[t][slot] * FFN_{ids[t][slot]}(x[t]),
 * each expert run once over all its rows (gate and up, SwiGLU, down).
 * x, out: [n_tokens][d_model]; ids, weights: [n_tokens][k]. */
void nm_moe_forward_dense(nm_pool *pool, const nm_expert_weights *w, const float *x,
                          int32_t n_tokens, const int32_t *ids, const float *weights, float *out,
                          nm_moe_scratch *s);

/* Times the host's MoE step of one layer as dense mode runs it (dispatch
 * table, gathering rows, expert FFNs, scattering, combine) over n_tokens
 * tokens of seeded random activations, each routed to k distinct experts
 * drawn uniformly: once untimed, then three rounds of reps runs going round
 * the n_layer layers' weights, so the caches hold what they hold in a
 * prefill (other layers' weights in between). *ms: the smallest of the
 * rounds' median times of one layer; loads
 * ([n_expert]): the rows each expert received. */
nm_status nm_moe_time_host_layer(nm_pool *pool, const nm_expert_weights *const *layers,
                                 int32_t n_layer, int64_t d_model, int64_t d_ff, int32_t n_tokens,
                                 int32_t k, int reps, double *ms, int32_t *loads, nm_error *err);

/* ---- static execution (static.c) ---- */

/* A group of experts of one layer that share a tier and one graph. */
typedef struct nm_moe_group {
    int32_t capacity; /* the tier: rows reserved for each expert */
    int32_t n_experts;
    int32_t *experts; /* [n_experts] */
    bool on_device;   /* false: the host computes these experts (npumoe mode) */
} nm_moe_group;

typedef struct nm_moe_layer_plan {
    int32_t n_groups;
    nm_moe_group *groups; /* [n_groups]; each expert is in exactly one group */
} nm_moe_layer_plan;

/* The static layout a plan gives the executor. */
typedef struct nm_moe_plan {
    int32_t chunk; /* T: tokens per prefill chunk */
    int32_t n_layer;
    int32_t n_expert;
    nm_overflow overflow;
    nm_salience salience;
    nm_moe_layer_plan *layers; /* [n_layer] */
} nm_moe_plan;

/* Checks a plan against a model's shape: every expert of every layer in
 * exactly one group, capacities in [1, chunk], policies known. Errors name
 * the layer, group and expert. */
nm_status nm_moe_plan_check(const nm_moe_plan *plan, int32_t n_layer, int32_t n_expert,
                            nm_error *err);

/* What one layer's MoE did, summed over the chunks run: nm_moe_layer_metrics
 * (npumoe.h). */

/* Called with each chunk's load per expert (calibration) and, expert after
 * expert, the routing weights of each expert's loads[e] assignments. */
typedef void (*nm_load_fn)(void *ctx, int32_t layer, const int32_t *loads, int32_t n_expert,
                           const float *weights);

typedef struct nm_moe_exec_params {
    nm_mode mode;
    const nm_moe_plan *plan; /* tiers, grouped, npumoe                    */
    nm_device *device;       /* every mode but dense                       */
    int32_t chunk;           /* T; the most tokens one call may bring      */
    int32_t n_layer;
    const nm_expert_weights *const *weights; /* [n_layer] */
    int32_t k;
    int n_threads; /* host threads (for scratch)                 */
} nm_moe_exec_params;

typedef struct nm_moe_exec nm_moe_exec;

/* Builds the executor of a mode: compiles every graph the mode needs on the
 * device, sizes every buffer once. A mode or plan that would give the
 * device a graph over weights it does not support (nm_device_supports) is
 * refused with NM_ERR_UNSUPPORTED before anything is compiled. */
nm_status nm_moe_exec_new(const nm_moe_exec_params *params, nm_moe_exec **out, nm_error *err);
void nm_moe_exec_free(nm_moe_exec *ex);

/* One layer's MoE over n (<= chunk) tokens: out[t] = sum over the kept
 * assignments of weight * FFN_e(xn[t]). x is the residual stream before the
 * FFN norm (for salience), xn the FFN input; both [n][d_model]; ids,
 * weights [n][k]; out [n][d_model]. */
void nm_moe_exec_layer(nm_moe_exec *ex, nm_pool *pool, int32_t layer, const float *x,
                       const float *xn, int32_t n, const int32_t *ids, const float *weights,
                       float *out);

/* Whether the executor runs any of layer's experts on its device: some
 * graph in naive, tiers and grouped; some group placed on the device in
 * npumoe. */
bool nm_moe_exec_uses_device(const nm_moe_exec *ex, int32_t layer);
/* Per-layer metrics since creation or the last reset. */
const nm_moe_layer_metrics *nm_moe_exec_metrics(const nm_moe_exec *ex);
/* NM_OK, or the failure of the executor's device (nm_device_check): the
 * layers run since it failed computed nothing on it. */
nm_status nm_moe_exec_check(const nm_moe_exec *ex, nm_error *err);
void nm_moe_exec_reset_metrics(nm_moe_exec *ex);
void nm_moe_exec_set_load_fn(nm_moe_exec *ex, nm_load_fn fn, void *ctx);

#endif /* NM_MOE_H */
