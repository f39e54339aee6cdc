/* Offline planning: calibration statistics (per layer and expert, the load
 * of every prefill chunk), device profiles, and the planner that turns both
 * into a static plan (tiers, groups, residency); the JSON files of all three
 * (DESIGN.md section 4) with full validation. The public nm_plan handle is
 * this part's struct nm_plan. Not here: running a plan (moe/static.c),
 * measuring a device (device/profile.c), or the model itself: the planner
 * takes the MoE's shapes (nm_moe_shape), which the engine fills. */
#ifndef NM_PLAN_H
#define NM_PLAN_H

#include "npumoe.h"

#include "base/base.h"
#include "device/device.h"
#include "moe/moe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Limits the files and the planner accept. A chunk of 64K tokens is far
 * beyond any prefill chunk a static graph is compiled for; the histogram
 * cap (cells of nm_calib.hist, 512 MiB of counts) holds 64 layers x 256
 * experts x T = 4096, and stops a short hostile file from asking for
 * gigabytes. */
#define NM_PLAN_MAX_CHUNK 65536
#define NM_PLAN_MAX_LAYERS 4096
#define NM_PLAN_MAX_EXPERTS 65536
#define NM_PLAN_MAX_TIERS 32
#define NM_PLAN_MAX_SHARED 64           /* shared experts per layer */
#define NM_PLAN_MAX_SHARED_FF (1 << 26) /* their width in all */
#define NM_CALIB_MAX_CELLS ((int64_t)1 << 26)
#define NM_CALIB_MAX_CHUNKS ((int64_t)1 << 31)

/* ---- what the planner knows of a model ---- */

/* The MoE's shapes and weights, which is all calibration, planning and
 * profiling need of a model; the engine fills it from one
 * (nm_model_moe_shape). */
typedef struct nm_moe_shape {
    nm_fingerprint fingerprint; /* the model's (base.h) */
    int32_t n_layer;            /* the layers with experts */
    int32_t first_layer;        /* the model's layer that is layer 0 here: those before it
                                   have no experts (deepseek2's leading dense layers) */
    int32_t n_expert;
    int32_t k; /* experts per token */
    int32_t d_model;
    int32_t d_ff; /* of one expert */
    /* shared experts: dense work on every token, with the layer's dense part
     * and never in a tier or group; 0 and 0 when the model has none */
    int32_t n_shared;
    int32_t d_ff_shared; /* of all of them together */
    /* layer l's experts as the model holds them (their types and bytes,
     * and the weights a device profile runs); ctx is passed back. NULL
     * when the model has no weights: then only calibrations and plans can
     * be checked against the shape, not made */
    const nm_expert_weights *(*layer_experts)(const void *ctx, int32_t layer);
    const void *ctx;
} nm_moe_shape;

/* Layer l's experts (shape->layer_experts). */
const nm_expert_weights *nm_moe_shape_experts(const nm_moe_shape *shape, int32_t layer);
/* Bytes of one expert of layer l: its gate, up and down matrices. */
uint64_t nm_moe_shape_expert_bytes(const nm_moe_shape *shape, int32_t layer);

/* ---- calibration (calib.c) ---- */

/* Per layer and expert, the histogram of per-chunk loads and the routing
 * weights of its assignments ranked by weight. Every layer sees the same
 * chunks: n_chunks records each, and the loads of one chunk of one layer
 * sum to k times its tokens. */
struct nm_calib {
    nm_fingerprint fingerprint;
    int32_t chunk; /* T */
    int32_t k;     /* experts per token */
    int32_t n_layer;
    int32_t n_expert;
    int64_t n_chunks; /* chunks recorded (per layer) */
    int64_t n_tokens; /* tokens in those chunks (per layer), padding included */
    /* [n_layer][n_expert][chunk + 1]: hist[l][e][c] = chunks in which expert
     * e of layer l received exactly c assignments */
    int64_t *hist;
    /* [n_layer][n_expert][chunk]: ranked[l][e][r] = the sum over chunks of
     * the routing weight of expert e's (r+1)-th heaviest assignment in the
     * chunk (chunks with fewer add nothing). What dropping all but the c
     * heaviest (router salience) loses per chunk is the sum from r = c on,
     * divided by n_chunks. */
    double *ranked;
    float *scratch; /* [chunk] for sorting one expert's weights */
};

/* An empty calibration of a model of this shape for chunks of T = chunk tokens
 * (1..NM_PLAN_MAX_CHUNK). NM_ERR_CAPACITY when the histogram would exceed
 * NM_CALIB_MAX_CELLS. */
nm_status nm_calib_new(const nm_moe_shape *shape, int32_t chunk, nm_calib **out, nm_error *err);
/* Records one chunk's loads of one layer (an nm_load_fn: ctx is the calib);
 * weights holds, expert after expert, the routing weights of each expert's
 * loads[e] assignments (in any order). Layer 0 counts the chunk and its
 * tokens (sum of loads / k). Programmer errors (NM_ASSERT): n_expert or
 * layer not the calibration's, a load outside [0, chunk], loads that do not
 * sum to a multiple of k, a weight negative or not finite. */
void nm_calib_record(void *calib, int32_t layer, const int32_t *loads, int32_t n_expert,
                     const float *weights);
/* Load statistics of one expert over the chunks recorded (0 when none):
 * the quantile is the smallest c with P(load <= c) >= q, q in [0, 1]; the
 * mean is nm_calib_mean (npumoe.h). */
int32_t nm_calib_quantile(const nm_calib *calib, int32_t layer, int32_t expert, double q);
int32_t nm_calib_max(const nm_calib *calib, int32_t layer, int32_t expert);
/* Expected assignments per chunk beyond capacity (>= 0): the mean of
 * max(0, load - capacity). */
double nm_calib_overflow(const nm_calib *calib, int32_t layer, int32_t expert, int32_t capacity);
/* Expected routing weight per chunk of the assignments beyond capacity when
 * the heaviest capacity assignments are kept (router salience); capacity 0
 * gives the expert's whole expected weight per chunk. */
double nm_calib_overflow_weight(const nm_calib *calib, int32_t layer, int32_t expert,
                                int32_t capacity);
/* What the planner expects a new chunk to overflow, out[c] for every
 * capacity c = 0..chunk: the calibration's few chunks undersell the tail
 * (an expert never seen above 40 will be), so each recorded load x stands
 * for a Poisson(x) load (capped at chunk), the count of assignments from a
 * chunk whose rate for the expert is x. Expected per chunk: the assignments
 * beyond c, or by_weight their routing weight, rank r's weight being the
 * mean of the r-th heaviest over the chunks that reached rank r, made
 * non-increasing in r, the last for ranks beyond the largest load. Both are
 * convex and non-increasing in c (docs/NPUMOE.md). out[chunk + 1]. */
void nm_calib_predict_overflow(const nm_calib *calib, int32_t layer, int32_t expert, bool by_weight,
                               double *out);
/* Fraction of chunks in which the expert received at least one assignment. */
double nm_calib_p_active(const nm_calib *calib, int32_t layer, int32_t expert);

/* Whether calib was made on the model of shape: the fingerprint (the
 * message names both) and the shape (layers, experts, k).
 * NM_ERR_INVALID_ARG otherwise. */
nm_status nm_calib_check_shape(const nm_calib *calib, const nm_moe_shape *shape, nm_error *err);

/* The file: {"format": "npumoe-calib", "version": 2, "fingerprint", "chunk",
 * "k", "n_layer", "n_expert", "n_chunks", "n_tokens", "layers": [{"experts":
 * [{"mean", "max", "q50", "q90", "q95", "q99", "hist": [[load, count],
 * ...], "ranked": [w_1, ..., w_max]}]}]}. The sparse histogram (loads
 * ascending, counts >= 1) and the ranked weight sums (one per rank up to
 * max, >= 0, not growing with the rank) are the truth; version 1 files
 * (without "ranked") are refused with a message saying to recalibrate. The
 * summaries are for people and are checked against the histogram on load,
 * as are: every expert's counts sum to n_chunks, every layer's assignments
 * (sum of load * count) equal n_tokens * k, n_chunks <= n_tokens <=
 * n_chunks * chunk. Save refuses a calibration whose layers saw different
 * numbers of chunks (a recording stopped inside a forward pass).
 * nm_calib_save and nm_calib_load are public (npumoe.h); the same in memory: save hands out the
 * document (the caller nm_free()s *text; *n_bytes excludes its NUL); for load, name stands for the
 * file in messages. Files are written atomically (nm_outfile). */
nm_status nm_calib_save_memory(const nm_calib *calib, char **text, size_t *n_bytes, nm_error *err);
nm_status nm_calib_load_memory(const char *text, size_t n_bytes, const char *name, nm_calib **out,
                               nm_error *err);

/* ---- device profile (profile_io.c; nm_profile is public: npumoe.h) ---- */

/* Checks what the planner relies on: a device name, d_model and d_ff >= 1, a
 * known weight type, a chunk in [1, NM_PLAN_MAX_CHUNK], finite times
 * (dispatch_ms, host_expert_ms and host_overhead_ms >= 0, as a fit or a
 * difference may give 0; host_row_ms and every graph_ms > 0; all <= 1e9
 * ms), at least one point, points with n_experts >= 1 and capacity >= 1, no shape
 * twice, and the points forming a full grid (every measured expert count
 * with every measured capacity), which is what interpolation needs and what
 * nm_device_profile measures. */
nm_status nm_profile_check(const nm_profile *profile, nm_error *err);

/* The file: {"format": "npumoe-profile", "version": 1, "device", "d_model",
 * "d_ff", "weight_type" (a ggml type name, "f32"), "dispatch_ms",
 * "host_row_ms", "host_expert_ms", "chunk", "host_overhead_ms",
 * "points": [{"n_experts", "capacity", "graph_ms"}]}. Load applies nm_profile_check; release with
 * nm_profile_free. nm_profile_save and nm_profile_load are public (npumoe.h). */
nm_status nm_profile_save_memory(const nm_profile *profile, char **text, size_t *n_bytes,
                                 nm_error *err);
nm_status nm_profile_load_memory(const char *text, size_t n_bytes, const char *name,
                                 nm_profile *out, nm_error *err);

/* ---- plan (planner.c, plan_io.c) ---- */

/* nm_plan_objective and nm_plan_params are public (npumoe.h). */

/* Predicted cost of one chunk of one layer under the plan. */
typedef struct nm_plan_cost {
    double device_ms; /* device groups: each graph's measured time (dispatch included) */
    double host_ms;   /* host experts' expected load + expected spills of device experts */
    double chunk_ms;  /* max(device_ms, host_ms): they overlap */
    /* the layer's dense part (attention, router) over a chunk where the plan
     * puts it (dense_on_device), from the profile, scaled to the plan's chunk;
     * 0 when the profile did not measure it. Not in chunk_ms (the MoE's). */
    double dense_ms;
} nm_plan_cost;

struct nm_plan {
    nm_fingerprint fingerprint;
    char device[32];
    nm_moe_plan moe;               /* chunk, groups (tier, experts, residency), policies */
    int32_t first_layer;           /* the model layer of moe's layer 0 (nm_moe_shape) */
    int32_t n_shared, d_ff_shared; /* the model's shared experts (nm_moe_shape) */
    int32_t n_tiers;
    int32_t *tiers; /* [n_tiers] the tier set the plan chose from, ascending */
    double quantile;
    nm_plan_objective objective;
    int32_t granule;      /* budget: the tiers' step; quantile: 0 */
    int64_t *budget_rows; /* [n_layer] rows per chunk each layer may reserve */
    /* as nm_calib_predict_overflow expects of a new chunk, over all layers:
     * the fraction of assignments over capacity (dropped or spilled) and of
     * routing weight over capacity (the lightest first) */
    double predicted_drop_rate;
    double predicted_drop_weight;
    nm_plan_cost *layer_cost; /* [n_layer] */
    /* [n_layer] whether npumoe mode runs the layer's dense part on the
     * device; NULL for a plan file made before the planner chose this:
     * then a layer's dense part goes where one of its groups is */
    bool *dense_on_device;
    double predicted_chunk_ms; /* sum over layers */
    uint64_t device_bytes;     /* predicted device memory of the resident groups */
};

/* Makes a plan for the model of shape from a calibration (same model, at
 * least one chunk) and a device profile (same d_model and d_ff as the
 * model). params NULL = defaults. How: DESIGN.md and the comment atop
 * planner.c. A layer whose experts' type (of their gate matrices) is not the
 * profile's weight_type, the one the device was measured with and supports,
 * keeps every group on the host. */
nm_status nm_plan_make(const nm_moe_shape *shape, const nm_calib *calib, const nm_profile *profile,
                       const nm_plan_params *params, nm_plan **out, nm_error *err);

/* The device's cost of one more row in a graph, from the profile: the
 * measured graph with the most rows, less one dispatch, per row (> 0, else
 * NM_ERR_INVALID_ARG). */
nm_status nm_plan_row_ms(const nm_profile *profile, double *row_ms, nm_error *err);

/* The budgeted allocation: n experts, each given j in [0, m] steps, where
 * loss[e * (m + 1) + j] is expert e's expected loss with j steps, which
 * must not grow with j and whose decrements must not grow either (convex).
 * Adds one step at a time to the expert whose next step saves the most
 * (ties: the lowest e), while steps remain in budget and a step saves
 * something; for such losses this minimises the total loss over all
 * allocations of at most budget steps (docs/NPUMOE.md). steps[n] out. */
void nm_plan_allocate(const double *loss, int32_t n, int32_t m, int64_t budget, int32_t *steps);

/* The file: {"format": "npumoe-plan", "version": 2, "fingerprint", "device",
 * "chunk", "n_layer", "n_expert", "tiers", "overflow", "salience",
 * "objective" ("budget" or "quantile"), "granule", "quantile",
 * "predicted_drop_rate", "predicted_drop_weight", "predicted_chunk_ms",
 * "device_bytes", "layers": [{"budget_rows", "groups": [{"tier", "experts":
 * [...], "device"}], "cost": {"device_ms", "host_ms", "chunk_ms"}}]}.
 * Version 1 plans are refused with a message saying to make a new one.
 * nm_plan_save, nm_plan_free and nm_plan_describe are public (npumoe.h). */
nm_status nm_plan_save_memory(const nm_plan *plan, char **text, size_t *n_bytes, nm_error *err);
/* Loads and validates a plan: every field, every group's tier one of the
 * tiers, a budgeted plan's tiers the multiples of its granule and each
 * layer's rows within its budget, nm_moe_plan_check, costs consistent (chunk_ms = max(device,
 * host), predicted_chunk_ms = their sum). Against a model's shape: another model's plan is refused
 * with a message naming both fingerprints, as is another shape. shape may be NULL: everything but
 * the match with a model is checked. */
nm_status nm_plan_load(const char *path, const nm_moe_shape *shape, nm_plan **out, nm_error *err);
nm_status nm_plan_load_memory(const char *text, size_t n_bytes, const char *name,
                              const nm_moe_shape *shape, nm_plan **out, nm_error *err);

#endif /* NM_PLAN_H */
