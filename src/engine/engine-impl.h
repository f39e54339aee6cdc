/* The runtime under a session (forward.c): KV cache, work buffers, the
 * thread pool, the MoE executors and the batch loop over the layers.
 * Internal to src/engine/. */
#ifndef NM_ENGINE_IMPL_H
#define NM_ENGINE_IMPL_H

#include "engine.h"

#include "model/model.h"

/* KV cache and work buffers of one session, sized once. */
typedef struct nm_engine_state nm_engine_state;

typedef struct nm_state_params {
    int32_t n_ctx;   /* positions */
    int32_t n_batch; /* tokens per forward call; the chunk T in static modes */
    int n_threads;
    nm_mode mode;
    const nm_moe_plan *plan; /* tiers, grouped, npumoe */
    nm_device *device;       /* every mode but dense */
    nm_kv_type kv_type;      /* KV cache elements: F32 (default) or F16 */
    /* npumoe: [n_layer] the plan's choice of where each layer's dense part
     * runs; NULL (a plan made before it chose, or another mode): on the
     * device in every layer whose experts the mode runs there in part */
    const bool *dense_on_device;
} nm_state_params;

nm_status nm_engine_state_new(const nm_model *m, const nm_state_params *params,
                              nm_engine_state **out, nm_error *err);
void nm_engine_state_free(nm_engine_state *st);
int32_t nm_engine_state_n_ctx(const nm_engine_state *st);
int32_t nm_engine_state_n_batch(const nm_engine_state *st);
/* Bytes the state allocated (KV cache and buffers). */
size_t nm_engine_state_bytes(const nm_engine_state *st);
/* The MoE executors: the static mode's (NULL in dense mode), used for prompt
 * batches of more than one token, and the dense one used otherwise. */
nm_moe_exec *nm_engine_state_prefill_exec(nm_engine_state *st);
nm_moe_exec *nm_engine_state_dense_exec(nm_engine_state *st);
/* Layers whose dense part of static chunks the session's device runs. */
int32_t nm_engine_state_dense_layers(const nm_engine_state *st);
/* [n_layer] what the device did inside each layer's step of static chunks
 * (the dense part and the experts), since creation or the last reset;
 * NULL without a device. */
const nm_device_stats *nm_engine_state_device_layers(const nm_engine_state *st);
void nm_engine_state_reset_device_layers(nm_engine_state *st, int32_t n_layer);
/* The tap every later batch reports to (fn NULL: none). */
void nm_engine_state_set_tap(nm_engine_state *st, nm_tap_fn fn, void *ctx);
/* Layer il's part of the cache (its stage: the state's, NULL for F32). */
nm_kv_view nm_engine_state_kv(const nm_model *m, const nm_engine_state *st, int32_t il);
/* The RoPE factors the state's context size chose (NULL: none). */
const float *nm_engine_state_rope_factors(const nm_engine_state *st);
/* For a row computed on the host outside nm_engine_forward (nm_batch_decode)
 * at position n_past: before it, the host's cache brought up to n_past from
 * the device's dense graphs that hold the prompt's K/V (nothing to do
 * without them; a device that failed, before or in the copy, is its error:
 * the cache is then not the prompt's); after it, the host's cache valid to
 * n_past + 1 and the graphs' copy no further than n_past. */
nm_status nm_engine_state_kv_to_host(const nm_model *m, nm_engine_state *st, int32_t n_past,
                                     nm_error *err);
void nm_engine_state_host_wrote(nm_engine_state *st, int32_t n_past);

/* A session (session.c): the model, its runtime, the positions cached. */
struct nm_session {
    const nm_model *model;
    nm_engine_state *state;
    nm_mode mode;
    nm_device *device;
    int32_t n_past;
};

/* Runs n (1..n_batch) tokens (padded to a whole chunk in static modes) at positions
 * n_past..n_past+n-1 through every layer, writing their K/V into the cache. logits: NULL,
 * [n][n_vocab] when all_logits, else [n_vocab] of the last token. */
nm_status nm_engine_forward(const nm_model *m, nm_engine_state *st, const int32_t *ids, int32_t n,
                            int32_t n_past, float *logits, bool all_logits, nm_error *err);

/* ---- the dense part of layers on the device (device_dense.c) ---- */

typedef struct nm_engine_dense nm_engine_dense;

/* Layer il of m as plain data for a device: the graph of `rows` rows over
 * n_pos positions, K/V of kv_type, RoPE with rope_factors ([n_rot / 2] or
 * NULL), F16 matmul inputs rounded under --compat llama.cpp; the layer's
 * shared expert, if any, except under --compat llama.cpp (whose rounding
 * of the experts' input the spec has no form for: the host computes it). */
nm_dense_spec nm_engine_dense_spec(const nm_model *m, int32_t il, int32_t rows, int32_t n_pos,
                                   nm_kv_type kv_type, const float *rope_factors);

/* Whether a dense graph can express layer il of m (a MoE layer of
 * multi-head attention whose every form nm_dense_spec has a field for). */
bool nm_engine_dense_expresses(const nm_model *m, int32_t il);

/* One dense graph (NM_GRAPH_DENSE) of `rows` rows over n_pos positions for
 * every layer il of m with want[il] that it expresses and dev supports
 * (nm_device_check_dense, after nm_device_fit_dense: the shared expert
 * goes in the graph when dev implements it); the others keep their dense
 * part on the host, which may be all of them. Fails only when a graph
 * fails to compile (memory, a lost device). */
nm_status nm_engine_dense_new(const nm_model *m, nm_device *dev, const bool *want, int32_t rows,
                              int32_t n_pos, nm_kv_type kv_type, const float *rope_factors,
                              nm_engine_dense **out, nm_error *err);
void nm_engine_dense_free(nm_engine_dense *d);
/* Layers whose dense part the device runs (0 for d NULL). */
int32_t nm_engine_dense_count(const nm_engine_dense *d);
bool nm_engine_dense_has(const nm_engine_dense *d, int32_t il);
/* Layer il's dense part of a static chunk (b->n_rows == rows) on the
 * device at positions b->n_past..: b->x in; b->x (after attention), b->xn
 * (ffn norm) and b->router (of the real rows) out; the chunk's K/V stay in
 * the graph. Returns the shared expert's output [rows][d_model] for
 * nm_model_ffn_residual when the graph computed it (valid until the
 * layer's graph runs again), else NULL. */
const float *nm_engine_dense_layer(nm_engine_dense *d, int32_t il, const nm_model_batch *b);
/* Copies the K/V of positions pos0..pos0+n-1 of layer il between the
 * host's cache (kv) and the layer's graph. */
void nm_engine_dense_kv(nm_engine_dense *d, int32_t il, const nm_kv_view *kv, int32_t pos0,
                        int32_t n, bool to_device);

/* The dense part of m's layer 0 over a chunk of `chunk` tokens (the
 * embeddings of fixed token ids) at position 0, routing, the shared expert
 * and the residual included (wherever each runs), median
 * of reps after one untimed run: on the host (*host_ms, n_threads
 * threads) and, when dev has the layer's form (nm_device_check_dense), as
 * one launch of a dense graph with its copies (*device_ms; else 0). A
 * device that fails meanwhile is its error. */
nm_status nm_engine_time_dense(const nm_model *m, nm_device *dev, int32_t chunk, int n_threads,
                               int reps, double *host_ms, double *device_ms, nm_error *err);

#endif /* NM_ENGINE_IMPL_H */
