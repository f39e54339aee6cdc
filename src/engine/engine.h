/* Sessions over a model (the public nm_session: KV cache, batched prefill,
 * decode), the sampler (nm_sampler) and run metrics. The public API of
 * include/npumoe.h is implemented here and in model/ (the wrappers of the
 * offline tools in api_*.c); this header adds what the library's other
 * parts and the tests need beyond it. */
#ifndef NM_ENGINE_H
#define NM_ENGINE_H

#include "npumoe.h"

#include "device/device.h"
#include "moe/moe.h"

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

#endif /* NM_ENGINE_H */
