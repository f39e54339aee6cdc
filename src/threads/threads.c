/* A pthread pool with one job at a time: the caller publishes a job and
 * bumps a generation; workers pull task indices from an atomic counter, and
 * the last one to finish tells the caller. Between jobs a worker first
 * spins on the generation for a short while (SPIN_NS), then sleeps on a
 * condition variable; the caller likewise spins on the count of busy
 * workers before it sleeps. Decoding runs one short job per matmul and
 * attention step of every token, and a hand-off to a sleeping thread and
 * back (the cpu device's dispatch + sync in `npumoe profile`) measured
 * 30-50 us on the build machine. */
#include "threads.h"

#include "base/base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long a thread spins before it sleeps. */
enum { SPIN_NS = 50 * 1000 };

struct nm_pool {
    int n_threads;
    pthread_t *workers; /* [n_threads - 1] */
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    pthread_cond_t done;
    /* the current job: written before generation is bumped (release), read
     * after it is seen (acquire) */
    nm_task_fn fn;
    void *ctx;
    int n_tasks;
    atomic_int next_task;
    atomic_int n_busy;      /* workers still inside the current job */
    atomic_uint generation; /* bumped for each job, under mutex */
    atomic_int quit;
};

/* Spins until *v differs from old or SPIN_NS pass; true if it changed. */
static bool spin_until_changed(atomic_uint *v, unsigned old) {
    const int64_t t0 = nm_time_ns();
    for (int i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) != old) return true;
        CPU_RELAX();
        if ((i & 63) == 63 && nm_time_ns() - t0 > SPIN_NS) return false;
    }
}

/* Spins until *v is 0 or SPIN_NS pass; true if it reached 0. */
static bool spin_until_zero(atomic_int *v) {
    const int64_t t0 = nm_time_ns();
    for (int i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) == 0) return true;
        CPU_RELAX();
        if ((i & 63) == 63 && nm_time_ns() - t0 > SPIN_NS) return false;
    }
}

typedef struct worker_arg {
    nm_pool *pool;
    int thread;
} worker_arg;

static void run_tasks(nm_pool *pool, nm_task_fn fn, void *ctx, int n_tasks, int thread) {
    for (;;) {
        int i = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
        if (i >= n_tasks) break;
        fn(ctx, i, thread);
    }
}

static void *worker_main(void *p) {
    worker_arg *arg = p;
    nm_pool *pool = arg->pool;
    int thread = arg->thread;
    nm_free(arg);
    unsigned seen = 0;
    for (;;) {
        if (!spin_until_changed(&pool->generation, seen)) {
            pthread_mutex_lock(&pool->mutex);
            while (!atomic_load(&pool->quit) && atomic_load(&pool->generation) == seen)
                pthread_cond_wait(&pool->wake, &pool->mutex);
            pthread_mutex_unlock(&pool->mutex);
        }
        if (atomic_load(&pool->quit)) break;
        seen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        run_tasks(pool, pool->fn, pool->ctx, pool->n_tasks, thread);
        if (atomic_fetch_sub_explicit(&pool->n_busy, 1, memory_order_acq_rel) == 1) {
            /* under the mutex, so a caller about to sleep cannot miss it */
            pthread_mutex_lock(&pool->mutex);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mutex);
        }
    }
    return NULL;
}

int nm_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

nm_status nm_pool_new(int n_threads, nm_pool **out, nm_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "thread count %d is not in 1..1024", n_threads);
    nm_pool *pool = nm_calloc(1, sizeof *pool);
    if (!pool) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->workers = nm_calloc((size_t)n_threads, sizeof(pthread_t));
    if (!pool->workers) {
        pool->n_threads = 1;
        nm_pool_free(pool);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the thread pool");
    }
    for (int t = 1; t < n_threads; t++) {
        worker_arg *arg = nm_malloc(sizeof *arg);
        int rc = arg ? 0 : -1;
        if (arg) {
            arg->pool = pool;
            arg->thread = t;
            rc = pthread_create(&pool->workers[t - 1], NULL, worker_main, arg);
            if (rc != 0) nm_free(arg);
        }
        if (rc != 0) {
            pool->n_threads = t; /* only the started ones are joined */
            nm_pool_free(pool);
            return nm_errorf(err, NM_ERR_NOMEM, "could not start thread %d of %d", t, n_threads);
        }
    }
    *out = pool;
    return NM_OK;
}

void nm_pool_free(nm_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->quit, 1);
    atomic_fetch_add(&pool->generation, 1); /* wakes the spinning ones too */
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int t = 1; t < pool->n_threads; t++)
        pthread_join(pool->workers[t - 1], NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    nm_free(pool->workers);
    nm_free(pool);
}

int nm_pool_n_threads(const nm_pool *pool) { return pool->n_threads; }

void nm_pool_run(nm_pool *pool, nm_task_fn fn, void *ctx, int n_tasks) {
    if (n_tasks <= 0) return;
    if (pool->n_threads == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++)
            fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&pool->mutex);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    atomic_store(&pool->next_task, 0);
    atomic_store(&pool->n_busy, pool->n_threads - 1);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);

    run_tasks(pool, fn, ctx, n_tasks, 0);

    if (!spin_until_zero(&pool->n_busy)) {
        pthread_mutex_lock(&pool->mutex);
        while (atomic_load(&pool->n_busy) > 0)
            pthread_cond_wait(&pool->done, &pool->mutex);
        pthread_mutex_unlock(&pool->mutex);
    }
}

typedef struct range_ctx {
    nm_range_fn fn;
    void *ctx;
    int64_t n, per;
} range_ctx;

static void range_task(void *p, int i, int thread) {
    (void)thread;
    const range_ctx *r = p;
    const int64_t i0 = (int64_t)i * r->per;
    r->fn(r->ctx, i0, i0 + r->per < r->n ? i0 + r->per : r->n);
}

void nm_pool_for(nm_pool *pool, int64_t n, int64_t min_range, nm_range_fn fn, void *ctx) {
    NM_ASSERT(min_range >= 1);
    if (n <= 0) return;
    int64_t ranges = n / min_range;
    if (ranges > pool->n_threads) ranges = pool->n_threads;
    if (ranges < 2) {
        fn(ctx, 0, n);
        return;
    }
    range_ctx r = {.fn = fn, .ctx = ctx, .n = n, .per = (n + ranges - 1) / ranges};
    nm_pool_run(pool, range_task, &r, (int)((n + r.per - 1) / r.per));
}
