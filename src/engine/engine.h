/* The runtime: sessions over a model (the public nm_session: KV cache,
 * scratch, the MoE executor of its mode, batched prefill, decode, the
 * tap), the sampler (nm_sampler), run metrics, and what joins a model to
 * the planner (its MoE shape, the host step timing). The public API of
 * include/npumoe.h is implemented here and in model/ (the wrappers of the
 * offline tools in api_*.c); this header adds what the library's other
 * parts and the tests need beyond it. */
#ifndef NM_ENGINE_H
#define NM_ENGINE_H

#include "npumoe.h"

#include "device/device.h"
#include "moe/moe.h"
#include "plan/plan.h"
#include "threads/threads.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- accuracy statistics (accuracy.c) ---- */

/* nm_nll_stats, nm_accuracy, nm_score_text and the metrics are public
 * (npumoe.h); here is what only the library and its tests use. */

void nm_nll_stats_add(nm_nll_stats *s, double nll);

/* -log softmax(logits)[target], computed in double. */
double nm_token_nll(const float *logits, int32_t n_vocab, int32_t target);
/* KL(P || Q) with P = softmax(p_logits), Q = softmax(q_logits), in nats. */
double nm_kl_divergence(const float *p_logits, const float *q_logits, int32_t n_vocab);

/* ---- calibration hook ---- */

/* Calls fn with every chunk's per-expert loads (calibration). */
void nm_session_set_load_fn(nm_session *session, nm_load_fn fn, void *ctx);

/* ---- a model for the planner (planning.c) ---- */

/* The MoE shape of a loaded model, with its fingerprint (which reads the
 * routers and a sample of every tensor: milliseconds); out->ctx is the
 * model, which must outlive the shape's use. A vocab_only model has no
 * experts to give (layer_experts NULL). */
void nm_model_moe_shape(const nm_model *model, nm_moe_shape *out);

/* The host's MoE step of one layer over a chunk of `chunk` tokens, timed by
 * nm_moe_time_host_layer going round the model's layers (rounds of reps
 * runs): *ms, and the rows each expert received (loads [n_expert]), for
 * nm_profile_set_overhead. Run it before nm_device_profile: right after a
 * device profile the host measured slower for a while. */
nm_status nm_model_time_host_step(const nm_model *m, nm_pool *pool, int32_t chunk, int reps,
                                  double *ms, int32_t *loads, nm_error *err);

#endif /* NM_ENGINE_H */
