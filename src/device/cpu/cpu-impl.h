/* Inside the `cpu` device: its dense-part graphs (dense.c), which cpu.c
 * queues and fences like its FFN graphs. Internal to src/device/cpu/. */
#ifndef NM_CPU_IMPL_H
#define NM_CPU_IMPL_H

#include "device/device.h"

typedef struct nm_cpu_dense nm_cpu_dense;

/* A dense graph for spec (checked by the caller) with attention scratch for
 * n_threads threads; its K/V start as zeros. */
nm_status nm_cpu_dense_new(const nm_dense_spec *spec, int n_threads, nm_cpu_dense **out,
                           nm_error *err);
void nm_cpu_dense_free(nm_cpu_dense *g);
/* The next run's first position (pos + rows <= n_pos). */
void nm_cpu_dense_set_pos(nm_cpu_dense *g, int32_t pos);
/* Runs the graph at its position on pool, from the pool's calling thread. */
void nm_cpu_dense_run(nm_cpu_dense *g, nm_pool *pool);
float *nm_cpu_dense_input(nm_cpu_dense *g);
void nm_cpu_dense_outputs(const nm_cpu_dense *g, nm_dense_outputs *out);
int32_t nm_cpu_dense_rows(const nm_cpu_dense *g);
/* Bytes of its buffers and K/V. */
size_t nm_cpu_dense_bytes(const nm_cpu_dense *g);
/* Copies n positions from pos0 of its K/V into k, v (to_graph false) or
 * from them into the graph (to_graph true). */
void nm_cpu_dense_kv_copy(nm_cpu_dense *g, int32_t pos0, int32_t n, void *k, void *v,
                          bool to_graph);

#endif /* NM_CPU_IMPL_H */
