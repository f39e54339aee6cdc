/* Internals shared by moe.c (routing, dispatch, host experts) and static.c
 * (the static-graph executor). Not part of the moe interface. */
#ifndef NM_MOE_IMPL_H
#define NM_MOE_IMPL_H

#include "moe.h"

struct nm_moe_scratch {
    int32_t max_tokens;
    int32_t k;
    int32_t n_expert;
    int64_t d_model;
    int64_t d_ff;
    int n_threads;
    nm_moe_dispatch dispatch;
    int32_t *fill;              /* [n_expert] cursor while building the dispatch */
    float *y;                   /* [max_tokens * k][d_model] expert output per assignment */
    float *xg;                  /* [n_threads][max_tokens][d_model] gathered rows / down output */
    float *gate;                /* [n_threads][max_tokens][d_ff] */
    float *up;                  /* [n_threads][max_tokens][d_ff] */
    struct nm_host_job *jobs;   /* [2 * n_expert] host work of one layer */
    struct nm_host_job *pieces; /* [2 * n_expert + 2 * n_threads] jobs cut to pool tasks */
};

/* Host work: one expert over a list of assignments (a = token * k + slot). */
typedef struct nm_host_job {
    int32_t expert;
    int32_t n_rows;
    const int32_t *rows; /* [n_rows] assignment indices */
} nm_host_job;

/* Runs the jobs on the pool, largest first, each writing y[a] for its rows.
 * A job larger than half a thread's share of all rows is cut into pieces of
 * rows, so one popular expert cannot leave the other threads idle; rows are
 * independent, so the results do not depend on the cut. */
void nm_moe_run_host_jobs(nm_pool *pool, const nm_expert_weights *w, const float *x,
                          nm_moe_scratch *s, nm_host_job *jobs, int32_t n_jobs);

/* out[t] = sum over slots with keep[a] (all when keep is NULL) of
 * weights[a] * y[a], in slot order; tokens split over the pool. */
void nm_moe_combine(nm_pool *pool, const nm_moe_scratch *s, int32_t n_tokens, const float *weights,
                    const uint8_t *keep, float *out);

/* Dense MoE over the dispatch already built in s (all experts on the host). */
void nm_moe_dense_dispatched(nm_pool *pool, const nm_expert_weights *w, const float *x,
                             int32_t n_tokens, const float *weights, float *out, nm_moe_scratch *s);

#endif /* NM_MOE_IMPL_H */
