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
/* The tap every later batch reports to (fn NULL: none). */
void nm_engine_state_set_tap(nm_engine_state *st, nm_tap_fn fn, void *ctx);
/* Layer il's part of the cache (its stage: the state's, NULL for F32). */
nm_kv_view nm_engine_state_kv(const nm_model *m, const nm_engine_state *st, int32_t il);
/* The RoPE factors the state's context size chose (NULL: none). */
const float *nm_engine_state_rope_factors(const nm_engine_state *st);

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

#endif /* NM_ENGINE_IMPL_H */
