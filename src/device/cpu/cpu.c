/* The `cpu` device: the static-graph contract carried out on threads of the
 * device's own with the host's kernels, whichever variant is in use, over
 * the weights where the host holds them (the file's mapping or the kernels'
 * prepared copies; nothing is copied), so the whole static path runs and is
 * tested on any machine and host work overlaps device work as it would with
 * an accelerator. Like any static-graph device it computes every capacity
 * row, padding included. Its dense-part graphs are dense.c's. */
#include "cpu-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"
#include "threads/threads.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

/* Output columns of one task are a multiple of this many: the quantised
 * matmul kernels compute 16 columns at once (a task starting inside such a
 * group computes all of it), and tiny layers are not cut into tasks cheaper
 * than taking them. */
enum { TILE_COLS = 16 };
/* Tasks per device thread a graph aims for, so uneven slots balance. */
enum { TASKS_PER_THREAD = 4 };

typedef struct cpu_device {
    nm_device base; /* base.ctx points back here */
    int n_threads;
    /* The device thread runs each graph on this pool as its thread 0, so the
     * device has n_threads threads in all and the host's own pool is free. */
    nm_pool *pool;
    pthread_t thread;
    pthread_mutex_t mutex; /* guards everything below */
    pthread_cond_t work;   /* the queue got a graph, or quit was set */
    pthread_cond_t done;   /* a graph finished */
    nm_graph *head;        /* FIFO of submitted graphs, linked through next */
    nm_graph *tail;
    bool quit;
    int64_t n_graphs; /* live graphs: the device must outlive them */
    nm_device_stats stats;
} cpu_device;

/* One expert of a graph: its matrices and its rows of the buffers. */
typedef struct slot {
    int32_t expert;
    nm_mat gate; /* [d_ff][d_model] */
    nm_mat up;   /* [d_ff][d_model] */
    nm_mat down; /* [d_model][d_ff] */
    int64_t row0;
    int64_t rows; /* capacity */
} slot;

struct nm_graph {
    cpu_device *dev;
    nm_cpu_dense *dense; /* a dense-part graph (dense.c); NULL: an FFN graph */
    int32_t layer;
    int32_t n_slots;
    slot *slots;         /* [n_slots] */
    nm_expert_weights w; /* the layer's experts (biases, activation) */
    int64_t d_model;
    int64_t d_ff;
    int64_t n_rows; /* sum of capacities */
    /* Each phase is n_slots * tiles tasks: task i is slot i / tiles, output
     * columns [t * cols, min((t + 1) * cols, width)) for t = i % tiles. */
    int tiles_ff, tiles_dm;
    int64_t cols_ff, cols_dm;
    float *in;  /* [n_rows][d_model] written by the host */
    float *out; /* [n_rows][d_model] */
    float *h;   /* [n_rows][d_ff] gate(x), then silu(gate(x)) * up(x) */
    float *u;   /* [n_rows][d_ff] up(x) */
    size_t bytes;
    /* Under dev->mutex. pending: submitted and not yet waited for (the host's
     * view); finished: the device has run it since the submit. */
    bool pending;
    bool finished;
    nm_graph *next;
};

/* ---- execution (device threads) ---- */

/* Phase 1: gate and up over the slot's rows for one tile of d_ff columns,
 * then SwiGLU on that tile. */
static void ffn_gate_up_task(void *p, int i, int thread) {
    const nm_graph *g = p;
    const slot *s = &g->slots[i / g->tiles_ff];
    const int64_t dm = g->d_model, ff = g->d_ff;
    const int64_t j0 = (int64_t)(i % g->tiles_ff) * g->cols_ff;
    const int64_t j1 = j0 + g->cols_ff < ff ? j0 + g->cols_ff : ff;
    const float *x = g->in + s->row0 * dm;
    float *h = g->h + s->row0 * ff;
    float *u = g->u + s->row0 * ff;
    if (nm_expert_weights_plain(&g->w)) {
        /* one pass over the activations for both, as the engine's path */
        nm_matmul_swiglu_forward(&s->gate, &s->up, x, dm, s->rows, h, ff, u, ff, j0, j1);
        return;
    }
    nm_matmul_forward(&s->gate, x, dm, s->rows, h, ff, j0, j1);
    nm_matmul_forward(&s->up, x, dm, s->rows, u, ff, j0, j1);
    nm_expert_glu_forward(&g->w, s->expert, h, u, ff, s->rows, j0, j1);
}

/* Phase 2: down over the slot's rows for one tile of d_model columns. */
static void ffn_down_task(void *p, int i, int thread) {
    const nm_graph *g = p;
    const slot *s = &g->slots[i / g->tiles_dm];
    const int64_t dm = g->d_model, ff = g->d_ff;
    const int64_t j0 = (int64_t)(i % g->tiles_dm) * g->cols_dm;
    const int64_t j1 = j0 + g->cols_dm < dm ? j0 + g->cols_dm : dm;
    nm_matmul_forward(&s->down, g->h + s->row0 * ff, ff, s->rows, g->out + s->row0 * dm, dm, j0,
                      j1);
    nm_expert_down_bias(&g->w, s->expert, g->out + s->row0 * dm, dm, s->rows, j0, j1);
}

static void run_graph(cpu_device *d, nm_graph *g) {
    if (g->dense) {
        nm_cpu_dense_run(g->dense, d->pool);
        return;
    }
    /* down needs every d_ff column of its slot: the two phases are two pool
     * runs, the barrier between them the pool's own. */
    nm_pool_run(d->pool, ffn_gate_up_task, g, g->n_slots * g->tiles_ff);
    nm_pool_run(d->pool, ffn_down_task, g, g->n_slots * g->tiles_dm);
}

/* The device thread: takes graphs in submission order, runs each to the end
 * on the pool, and signals its fence. */
static void *device_main(void *p) {
    cpu_device *d = p;
    pthread_mutex_lock(&d->mutex);
    for (;;) {
        while (!d->head && !d->quit)
            pthread_cond_wait(&d->work, &d->mutex);
        if (!d->head) break; /* quit, and nothing left to run */
        nm_graph *g = d->head;
        d->head = g->next;
        if (!d->head) d->tail = NULL;
        g->next = NULL;
        pthread_mutex_unlock(&d->mutex);

        const int64_t t0 = nm_time_ns();
        run_graph(d, g);
        const int64_t t1 = nm_time_ns();

        pthread_mutex_lock(&d->mutex);
        d->stats.busy_ns += t1 - t0;
        d->stats.rows_computed += (uint64_t)g->n_rows; /* 0 for dense graphs */
        g->finished = true;
        pthread_cond_broadcast(&d->done);
    }
    pthread_mutex_unlock(&d->mutex);
    return NULL;
}

/* ---- the table ---- */

static nm_status check_mat(const char *what, const nm_mat *m, int64_t n, int64_t k, int32_t layer,
                           nm_error *err) {
    if (!nm_dtype_is_supported(m->type))
        return nm_errorf(
            err, NM_ERR_UNSUPPORTED,
            "ffn graph of layer %d: the cpu device cannot compute %s weights of type %s", layer,
            what, nm_dtype_name(m->type));
    if (m->n != n || m->k != k)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "ffn graph of layer %d: %s weights are [%lld][%lld], the spec needs "
                         "[%lld][%lld]",
                         layer, what, (long long)m->n, (long long)m->k, (long long)n, (long long)k);
    return NM_OK;
}

/* Everything the device refuses, each with the value at fault. */
static nm_status check_spec(const nm_ffn_spec *spec, nm_error *err) {
    const nm_expert_weights *w = spec->weights;
    const int32_t layer = spec->layer;
    nm_status st = nm_ffn_spec_check_slots(spec, err);
    if (st) return st;
    if (spec->d_model != w->gate.k)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "ffn graph of layer %d: d_model %lld does not match the weights' %lld",
                         layer, (long long)spec->d_model, (long long)w->gate.k);
    if (spec->d_ff != w->gate.n)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "ffn graph of layer %d: d_ff %lld does not match the weights' %lld", layer,
                         (long long)spec->d_ff, (long long)w->gate.n);
    if ((st = check_mat("gate", &w->gate, spec->d_ff, spec->d_model, layer, err)) ||
        (st = check_mat("up", &w->up, spec->d_ff, spec->d_model, layer, err)) ||
        (st = check_mat("down", &w->down, spec->d_model, spec->d_ff, layer, err)))
        return st;
    return nm_ffn_spec_check_slots(spec, err);
}

/* Tiles per slot and columns per tile for an output of `width` columns. */
static void plan_tiles(int n_threads, int32_t n_slots, int64_t width, int *tiles, int64_t *cols) {
    int64_t want = 1;
    if (n_threads > 1)
        want = ((int64_t)TASKS_PER_THREAD * n_threads + n_slots - 1) / n_slots; /* ceil */
    const int64_t most = (width + TILE_COLS - 1) / TILE_COLS;
    if (want > most) want = most;
    if (want < 1) want = 1;
    *cols = ((width + want - 1) / want + TILE_COLS - 1) / TILE_COLS * TILE_COLS;
    *tiles = (int)((width + *cols - 1) / *cols); /* no empty tile at the end */
}

static void graph_release(nm_graph *g) {
    nm_cpu_dense_free(g->dense);
    nm_free(g->slots);
    nm_free(g->in);
    nm_free(g->out);
    nm_free(g->h);
    nm_free(g->u);
    nm_free(g);
}

/* Counts a compiled graph of `bytes` bytes in the device's stats. */
static void register_graph(cpu_device *d, size_t bytes) {
    pthread_mutex_lock(&d->mutex);
    d->n_graphs++;
    d->stats.graphs_compiled++;
    d->stats.device_bytes += bytes;
    pthread_mutex_unlock(&d->mutex);
}

static nm_status cpu_compile(nm_device *dev, const nm_ffn_spec *spec, nm_graph **out,
                             nm_error *err) {
    *out = NULL;
    NM_ASSERT(spec && spec->weights && (spec->n_experts < 1 || (spec->experts && spec->capacity)));
    cpu_device *d = dev->ctx;
    nm_status st = check_spec(spec, err);
    if (st) return st;

    const int64_t n_rows = nm_ffn_spec_rows(spec);
    size_t n_io, n_ff, io_bytes, ff_bytes, bytes;
    if (!nm_mul_size((size_t)n_rows, (size_t)spec->d_model, &n_io) ||
        !nm_mul_size((size_t)n_rows, (size_t)spec->d_ff, &n_ff) ||
        !nm_mul_size(n_io, 2 * sizeof(float), &io_bytes) ||
        !nm_mul_size(n_ff, 2 * sizeof(float), &ff_bytes) ||
        !nm_add_size(io_bytes, ff_bytes, &bytes))
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "ffn graph of layer %d: %lld rows of d_model %lld do not fit in memory",
                         spec->layer, (long long)n_rows, (long long)spec->d_model);

    nm_graph *g = nm_calloc(1, sizeof *g);
    if (!g) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for an ffn graph");
    g->dev = d;
    g->layer = spec->layer;
    g->n_slots = spec->n_experts;
    g->d_model = spec->d_model;
    g->d_ff = spec->d_ff;
    g->n_rows = n_rows;
    g->bytes = bytes;
    g->slots = nm_calloc((size_t)spec->n_experts, sizeof *g->slots);
    g->in = nm_calloc(n_io, sizeof(float));
    g->out = nm_calloc(n_io, sizeof(float));
    g->h = nm_calloc(n_ff, sizeof(float));
    g->u = nm_calloc(n_ff, sizeof(float));
    if (!g->slots || !g->in || !g->out || !g->h || !g->u) {
        graph_release(g);
        return nm_errorf(err, NM_ERR_NOMEM,
                         "out of memory for an ffn graph of layer %d (%lld rows, %zu bytes)",
                         spec->layer, (long long)n_rows, bytes);
    }
    const nm_expert_weights *w = spec->weights;
    g->w = *w;
    int64_t row = 0;
    for (int32_t i = 0; i < spec->n_experts; i++) {
        slot *s = &g->slots[i];
        s->expert = spec->experts[i];
        /* The device shares the host's mapped weights: nothing is copied. */
        s->gate = nm_expert_mat(&w->gate, w->gate_stride, s->expert);
        s->up = nm_expert_mat(&w->up, w->up_stride, s->expert);
        s->down = nm_expert_mat(&w->down, w->down_stride, s->expert);
        s->row0 = row;
        s->rows = spec->capacity[i];
        row += s->rows;
    }
    plan_tiles(d->n_threads, g->n_slots, g->d_ff, &g->tiles_ff, &g->cols_ff);
    plan_tiles(d->n_threads, g->n_slots, g->d_model, &g->tiles_dm, &g->cols_dm);
    NM_ASSERT((int64_t)g->n_slots * g->tiles_ff <= INT32_MAX &&
              (int64_t)g->n_slots * g->tiles_dm <= INT32_MAX);

    /* device_bytes is what live graphs hold now. The cpu device computes
     * straight from the host's (mapped) weights, so only its buffers count:
     * input, output and the two d_ff scratch buffers. */
    register_graph(d, g->bytes);
    *out = g;
    return NM_OK;
}

static nm_status cpu_compile_dense(nm_device *dev, const nm_dense_spec *spec, nm_graph **out,
                                   nm_error *err) {
    *out = NULL;
    cpu_device *d = dev->ctx;
    nm_status st = nm_dense_spec_check(spec, err);
    if (st) return st;
    nm_graph *g = nm_calloc(1, sizeof *g);
    if (!g) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a dense graph");
    st = nm_cpu_dense_new(spec, d->n_threads, &g->dense, err);
    if (st) {
        nm_free(g);
        return st;
    }
    g->dev = d;
    g->layer = spec->layer;
    /* like FFN graphs, it computes from the host's weights: only its
     * buffers and K/V count */
    g->bytes = nm_cpu_dense_bytes(g->dense);
    register_graph(d, g->bytes);
    *out = g;
    return NM_OK;
}

static float *cpu_input(nm_graph *g) { return g->dense ? nm_cpu_dense_input(g->dense) : g->in; }

static const float *cpu_output(const nm_graph *g) {
    NM_ASSERT(!g->dense); /* dense graphs have dense_outputs */
    return g->out;
}

static void cpu_submit(nm_graph *g) {
    cpu_device *d = g->dev;
    pthread_mutex_lock(&d->mutex);
    if (g->dense) d->stats.dense_dispatches++;
    NM_ASSERT(!g->pending); /* submitted twice without a wait in between */
    g->pending = true;
    g->finished = false;
    g->next = NULL;
    if (d->tail)
        d->tail->next = g;
    else
        d->head = g;
    d->tail = g;
    d->stats.dispatches++;
    pthread_mutex_unlock(&d->mutex);
    /* after the unlock: the woken device thread need not block on the mutex
     * the host still holds */
    pthread_cond_signal(&d->work);
}

static void cpu_wait(nm_graph *g) {
    cpu_device *d = g->dev;
    pthread_mutex_lock(&d->mutex);
    if (g->pending) d->stats.syncs++;
    while (g->pending && !g->finished)
        pthread_cond_wait(&d->done, &d->mutex);
    g->pending = false;
    pthread_mutex_unlock(&d->mutex);
}

static void cpu_submit_dense(nm_graph *g, int32_t pos) {
    NM_ASSERT(g->dense && !g->pending);
    nm_cpu_dense_set_pos(g->dense, pos);
    cpu_submit(g);
}

static void cpu_dense_outputs(const nm_graph *g, nm_dense_outputs *out) {
    NM_ASSERT(g->dense);
    nm_cpu_dense_outputs(g->dense, out);
}

static void cpu_kv_read(nm_graph *g, int32_t pos0, int32_t n, void *k, void *v) {
    NM_ASSERT(g->dense && !g->pending);
    nm_cpu_dense_kv_copy(g->dense, pos0, n, k, v, false);
}

static void cpu_kv_write(nm_graph *g, int32_t pos0, int32_t n, const void *k, const void *v) {
    NM_ASSERT(g->dense && !g->pending);
    /* the copy only reads k and v in this direction */
    nm_cpu_dense_kv_copy(g->dense, pos0, n, (void *)k, (void *)v, true);
}

/* A graph still on the device is waited for first, so error paths of the
 * host may free what they submitted. */
static void cpu_graph_free(nm_graph *g) {
    if (!g) return;
    cpu_wait(g);
    cpu_device *d = g->dev;
    pthread_mutex_lock(&d->mutex);
    d->n_graphs--;
    d->stats.device_bytes -= g->bytes;
    pthread_mutex_unlock(&d->mutex);
    graph_release(g);
}

static void cpu_stats(const nm_device *dev, nm_device_stats *out) {
    cpu_device *d = dev->ctx;
    pthread_mutex_lock(&d->mutex);
    *out = d->stats;
    pthread_mutex_unlock(&d->mutex);
}

static void cpu_free(nm_device *dev) {
    if (!dev) return;
    cpu_device *d = dev->ctx;
    pthread_mutex_lock(&d->mutex);
    NM_ASSERT(d->n_graphs == 0); /* graphs point at their device: free them first */
    d->quit = true;
    pthread_cond_signal(&d->work);
    pthread_mutex_unlock(&d->mutex);
    pthread_join(d->thread, NULL);
    nm_pool_free(d->pool);
    pthread_cond_destroy(&d->done);
    pthread_cond_destroy(&d->work);
    pthread_mutex_destroy(&d->mutex);
    nm_free(d);
}

/* Every type the host kernels compute with, read where the model maps it,
 * in both kinds of graph. */
static bool cpu_supports(const nm_device *dev, uint32_t weight_type, nm_graph_op op) {
    (void)dev;
    return (op == NM_GRAPH_FFN || op == NM_GRAPH_DENSE) && nm_dtype_is_supported(weight_type);
}

/* The host kernels' own: 16 under amx, whose tiles hold 16 rows. */
static int32_t cpu_row_granule(const nm_device *dev) {
    (void)dev;
    return nm_kernels_row_granule();
}

static const nm_device_ops cpu_ops = {
    .name = "cpu",
    .supports = cpu_supports,
    .compile = cpu_compile,
    .input = cpu_input,
    .output = cpu_output,
    .submit = cpu_submit,
    .wait = cpu_wait,
    .graph_free = cpu_graph_free,
    .stats = cpu_stats,
    .free = cpu_free,
    .row_granule = cpu_row_granule,
    /* every form the host's own layer computes */
    .ffn_features = NM_FFN_F_BIAS | NM_FFN_F_SWIGLU_OAI,
    .dense_features = (1u << NM_DENSE_F_COUNT) - 1,
    .compile_dense = cpu_compile_dense,
    .submit_dense = cpu_submit_dense,
    .dense_outputs = cpu_dense_outputs,
    .kv_read = cpu_kv_read,
    .kv_write = cpu_kv_write,
};

nm_status nm_cpu_device_new(const nm_cpu_device_params *params, nm_device **out, nm_error *err) {
    *out = NULL;
    const int n_threads = params->n_threads;
    if (n_threads < 1 || n_threads > 1024)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "cpu device: thread count %d is not in 1..1024",
                         n_threads);
    cpu_device *d = nm_calloc(1, sizeof *d);
    if (!d) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the cpu device");
    d->base.ops = &cpu_ops;
    d->base.ctx = d;
    d->n_threads = n_threads;
    nm_status st = nm_pool_new(n_threads, &d->pool, err);
    if (st) {
        nm_free(d);
        nm_error_prefix(err, "cpu device");
        return st;
    }
    pthread_mutex_init(&d->mutex, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->done, NULL);
    if (pthread_create(&d->thread, NULL, device_main, d) != 0) {
        pthread_cond_destroy(&d->done);
        pthread_cond_destroy(&d->work);
        pthread_mutex_destroy(&d->mutex);
        nm_pool_free(d->pool);
        nm_free(d);
        return nm_errorf(err, NM_ERR_NOMEM, "cpu device: could not start the device thread");
    }
    *out = &d->base;
    return NM_OK;
}
