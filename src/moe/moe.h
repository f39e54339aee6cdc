/* The MoE block after the router: routing functions (softmax, top-k,
 * renormalisation), the dispatch table that groups a batch's assignments by
 * expert, and the exact grouped expert execution of `dense` mode.
 * Not here: which routing an architecture uses (model/arch), static
 * capacities and devices (later modes). */
#ifndef NM_MOE_H
#define NM_MOE_H

#include "npumoe.h"

#include "kernels/kernels.h"
#include "threads/threads.h"

#include <stdbool.h>
#include <stdint.h>

/* The experts of one layer, as three stacks of matrices in the file. */
typedef struct nm_expert_weights {
    nm_mat gate;        /* expert 0: [d_ff][d_model] */
    nm_mat up;          /* expert 0: [d_ff][d_model] */
    nm_mat down;        /* expert 0: [d_model][d_ff] */
    size_t gate_stride; /* bytes from one expert's gate matrix to the next */
    size_t up_stride;
    size_t down_stride;
    int32_t n_expert;
} nm_expert_weights;

/* Expert e's matrix out of a stack. */
nm_mat nm_expert_mat(const nm_mat *first, size_t stride, int32_t e);

/* Softmax over all n_expert logits, the k largest probabilities (ties to the
 * lower id) in descending order, renormalised to sum 1 when renorm.
 * ids, weights: [k]; probs: scratch [n_expert]. */
void nm_moe_route_softmax_topk(const float *logits, int32_t n_expert, int32_t k, bool renorm,
                               int32_t *ids, float *weights, float *probs);

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

#endif /* NM_MOE_H */
