/* The runtime: sessions over a model (the public nm_session: KV cache,
 * scratch, the MoE executor of its mode, batched prefill, decode, the
 * tap), the sampler (nm_sampler), run metrics, and what joins a model to
 * the planner (its MoE shape, the host step timing). The public API of
 * include/npumoe.h is implemented here and in model/; this header adds what
 * the command needs beyond it. */
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

/* Negative log-likelihoods of scored tokens. */
typedef struct nm_nll_stats {
    double sum;    /* sum of -log p(target) */
    double sum_sq; /* sum of its squares    */
    uint64_t count;
} nm_nll_stats;

void nm_nll_stats_add(nm_nll_stats *s, double nll);
/* exp(mean nll). */
double nm_nll_stats_ppl(const nm_nll_stats *s);
/* llama.cpp's uncertainty of the perplexity: ppl * sqrt(var(nll) / (count - 1)). */
double nm_nll_stats_ppl_err(const nm_nll_stats *s);

/* -log softmax(logits)[target], computed in double. */
double nm_token_nll(const float *logits, int32_t n_vocab, int32_t target);
/* KL(P || Q) with P = softmax(p_logits), Q = softmax(q_logits), in nats. */
double nm_kl_divergence(const float *p_logits, const float *q_logits, int32_t n_vocab);
/* Index of the largest value, ties to the lowest index. */
int32_t nm_argmax(const float *x, int32_t n);

/* Result of scoring a text with a reference and, optionally, a candidate. */
typedef struct nm_accuracy {
    int32_t n_ctx; /* window length */
    int32_t n_windows;
    nm_nll_stats ref;  /* reference perplexity */
    nm_nll_stats cand; /* candidate perplexity (count 0 without one) */
    double kl_sum;     /* KL(ref || cand) summed over scored positions */
    double kl_max;
    uint64_t top1_same; /* scored positions whose argmax agrees */
} nm_accuracy;

/* Called once before the first window (done = 0), then after each window
 * with the totals so far. */
typedef void (*nm_progress_fn)(void *ctx, int32_t done, int32_t total, const nm_accuracy *acc);

/* Perplexity as llama.cpp's llama-perplexity computes it: the tokens are cut
 * into n / n_ctx non-overlapping windows (the rest is ignored); when bos >= 0
 * the first token of each window is replaced by it; each window is evaluated
 * from an empty cache, and only its second half is scored: the logits at
 * positions n_ctx/2 .. n_ctx-2 predict the next token. With a candidate
 * session (else NULL), the same windows also run through it, and KL and
 * top-1 agreement are measured at the scored positions. Both sessions are
 * reset. Needs at least 2 * n_ctx tokens. */
nm_status nm_score_text(nm_session *ref, nm_session *cand, const int32_t *ids, size_t n,
                        int32_t n_ctx, int32_t bos, nm_progress_fn progress, void *progress_ctx,
                        nm_accuracy *out, nm_error *err);

/* ---- metrics of the static path ---- */

typedef struct nm_session_metrics {
    nm_mode mode; /* the mode prompt batches ran in */
    int32_t n_layer;
    const nm_moe_layer_metrics *layers; /* [n_layer], owned by the session */
    nm_moe_layer_metrics total;         /* summed over layers */
    nm_device_stats device;             /* zero without a device */
} nm_session_metrics;

/* MoE metrics of the prompt batches since creation or the last reset. */
void nm_session_get_metrics(nm_session *session, nm_session_metrics *out);
void nm_session_reset_metrics(nm_session *session);

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

/* Peak resident memory of the process, in bytes (0 if unknown). */
uint64_t nm_peak_rss_bytes(void);

/* Bytes a session allocated (KV cache and work buffers). */
size_t nm_session_bytes(const nm_session *session);

#endif /* NM_ENGINE_H */
