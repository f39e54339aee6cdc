/* The host thread pool: persistent workers that run a parallel-for over task
 * indices taken from one atomic counter, so uneven tasks (experts with
 * different loads) balance themselves. The caller's thread works too. */
#ifndef NM_THREADS_H
#define NM_THREADS_H

#include "npumoe.h"

typedef struct nm_pool nm_pool;

/* Runs task(ctx, i, thread) for one i; thread is in [0, n_threads). */
typedef void (*nm_task_fn)(void *ctx, int i, int thread);

/* n_threads >= 1 counts the caller; n_threads - 1 workers are started. */
nm_status nm_pool_new(int n_threads, nm_pool **out, nm_error *err);
void nm_pool_free(nm_pool *pool);
int nm_pool_n_threads(const nm_pool *pool);

/* Calls fn for every i in [0, n_tasks) across the pool and returns when all
 * are done. Not reentrant: fn must not call nm_pool_run on the same pool. */
void nm_pool_run(nm_pool *pool, nm_task_fn fn, void *ctx, int n_tasks);

/* Runs fn(ctx, i0, i1) over ranges that cover [0, n) once, about one a
 * thread, none shorter than min_range (the caller's thread alone runs the
 * whole when n is under two of them): for loops over independent rows too
 * cheap for a task each (norms, residual adds). Not reentrant either. */
typedef void (*nm_range_fn)(void *ctx, int64_t i0, int64_t i1);
void nm_pool_for(nm_pool *pool, int64_t n, int64_t min_range, nm_range_fn fn, void *ctx);

/* nm_cpu_count (online CPUs) is public: npumoe.h. */

#endif /* NM_THREADS_H */
