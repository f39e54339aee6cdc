/* The static-graph device interface. A device compiles graphs of fixed shape
 * and runs them asynchronously: the host writes a graph's input rows,
 * submits, does other work, and waits on the graph's fence. The first graph
 * kind is the grouped expert FFN: several experts of one layer, each with a
 * fixed capacity of rows, in one dispatch. A device is a table of functions
 * plus an opaque context (optional slots documented); adding a device never
 * touches the engine. The `cpu` device (cpu/) implements it with the host
 * kernels on worker threads of its own. */
#ifndef NM_DEVICE_H
#define NM_DEVICE_H

#include "npumoe.h"

#include "kernels/kernels.h"
#include "threads/threads.h"

#include <stdbool.h>
#include <stdint.h>

/* What a grouped expert FFN graph computes, fixed at compile time. Rows
 * [row0[i], row0[i] + capacity[i]) of the input belong to experts[i]:
 * out = down_e(silu(gate_e(x)) * up_e(x)) for each of those rows. Rows the
 * host leaves empty must be zero; their output is ignored. */
typedef struct nm_ffn_spec {
    int32_t layer;
    int32_t n_experts;
    const int32_t *experts;  /* [n_experts] expert ids of the layer       */
    const int32_t *capacity; /* [n_experts] rows reserved for each, >= 1 */
    int64_t d_model;
    int64_t d_ff;
    const nm_expert_weights *weights; /* the layer's experts, in host memory */
} nm_ffn_spec;

typedef struct nm_graph nm_graph;

/* The kinds of graph a device may compile (nm_device_ops.supports). */
typedef enum nm_graph_op {
    NM_GRAPH_FFN = 0, /* the grouped expert FFN of an nm_ffn_spec */
    NM_GRAPH_OP_COUNT
} nm_graph_op;

typedef struct nm_device nm_device;

/* The table a device implements. */
typedef struct nm_device_ops {
    const char *name;
    /* Whether the device compiles graphs of kind op over weights of type
     * weight_type (an nm_dtype) as a model file holds them, natively or
     * converted at compile: the host asks before it makes a graph, so a
     * device is never handed one it cannot run (nm_device_supports). */
    bool (*supports)(const nm_device *dev, uint32_t weight_type, nm_graph_op op);
    /* Compiles a graph; the spec's arrays are copied. Weights may be copied
     * or converted to the device's format (count them in device_bytes). */
    nm_status (*compile)(nm_device *dev, const nm_ffn_spec *spec, nm_graph **out, nm_error *err);
    /* The host-visible input buffer, [total rows][d_model], zeroed at
     * compile time; and the output buffer of the same shape, valid after
     * wait until the next submit. */
    float *(*input)(nm_graph *g);
    const float *(*output)(const nm_graph *g);
    /* Starts the graph; returns at once. A graph is submitted at most once
     * before its wait. */
    void (*submit)(nm_graph *g);
    /* Blocks until the graph submitted last has finished. */
    void (*wait)(nm_graph *g);
    void (*graph_free)(nm_graph *g);
    void (*stats)(const nm_device *dev, nm_device_stats *out);
    void (*free)(nm_device *dev);
    /* Optional (NULL: the device cannot fail once a graph is compiled).
     * NM_OK while the device works; once it has failed (a lost GPU), the
     * failure, with its message, from then on. submit and wait cannot
     * return one: after a failure they return at once and outputs hold
     * zeros, so the host checks this after waiting (nm_device_check). */
    nm_status (*check)(nm_device *dev, nm_error *err);
} nm_device_ops;

struct nm_device {
    const nm_device_ops *ops;
    void *ctx;
};

/* ---- graph-level helpers shared by devices ---- */

/* Total rows of a spec (sum of capacities) and the first row of expert slot
 * i: row0 must have n_experts entries. */
int64_t nm_ffn_spec_rows(const nm_ffn_spec *spec);
void nm_ffn_spec_row0(const nm_ffn_spec *spec, int64_t *row0);
/* What every device refuses in a spec's layer and slots: a negative layer,
 * no expert, an expert out of range or twice, a capacity below 1;
 * NM_ERR_INVALID_ARG naming the slot. Reads only weights->n_expert. */
nm_status nm_ffn_spec_check_slots(const nm_ffn_spec *spec, nm_error *err);

/* ---- devices ---- */

typedef struct nm_cpu_device_params {
    int n_threads; /* worker threads of the device (>= 1) */
} nm_cpu_device_params;

nm_status nm_cpu_device_new(const nm_cpu_device_params *params, nm_device **out, nm_error *err);

typedef struct nm_vulkan_device_params {
    int index; /* physical device, in the loader's order (npumoe devices) */
    /* Most device memory the device's graphs may hold (weights and
     * buffers); 0 = all of its largest device-local heap. A graph that
     * does not fit is refused with NM_ERR_CAPACITY. */
    uint64_t budget_bytes;
} nm_vulkan_device_params;

/* The vulkan device (vulkan/): graphs are compute pipelines, recorded once
 * per graph; weights are uploaded at compile. Fails with a message (never
 * another device instead) when this build has no Vulkan, the loader or a
 * driver is missing, or the index does not exist. */
nm_status nm_vulkan_device_new(const nm_vulkan_device_params *params, nm_device **out,
                               nm_error *err);

/* Devices are opened by name with nm_device_open and closed with
 * nm_device_close (npumoe.h: "cpu" with n_threads, "vulkan" or "vulkan:N"
 * with the memory budget). */
/* dev->ops->supports. */
bool nm_device_supports(const nm_device *dev, uint32_t weight_type, nm_graph_op op);
/* NM_OK when dev supports FFN graphs over each of w's three matrices, else
 * NM_ERR_UNSUPPORTED naming the device, the layer, the matrix and its type. */
nm_status nm_device_check_ffn(const nm_device *dev, const nm_expert_weights *w, int32_t layer,
                              nm_error *err);
/* dev->ops->check, or NM_OK for a device without one. */
nm_status nm_device_check(nm_device *dev, nm_error *err);

/* nm_device_info and nm_device_list are public: npumoe.h. */

/* ---- measurement (profile.c) ---- */

/* nm_profile (what a device measured about itself) is public: npumoe.h. */

/* Measures dev on the layer's experts w: for every (n, c) of
 * grid_experts x grid_capacity (points in that order, experts outer), a graph
 * over experts 0..n-1 with capacity c each, run reps times (after one
 * untimed run), median submit + wait; the dispatch overhead; and the host's
 * cost of one expert over m rows on host_pool, fitted as
 * host_expert_ms + m * host_row_ms. progress, when not NULL, is called after
 * each step with done of total steps. out is filled on NM_OK and must be
 * released with nm_profile_free. Weights of a type dev does not support
 * are NM_ERR_UNSUPPORTED before anything is measured. */
nm_status nm_device_profile(nm_device *dev, const nm_expert_weights *w, int64_t d_model,
                            int64_t d_ff, const int32_t *grid_experts, int n_grid_experts,
                            const int32_t *grid_capacity, int n_grid_capacity, int reps,
                            nm_pool *host_pool, void (*progress)(void *ctx, int done, int total),
                            void *progress_ctx, nm_profile *out, nm_error *err);

/* Sets p->chunk and p->host_overhead_ms from the host's MoE step of one
 * layer over a chunk of `chunk` tokens, timed whole (step_ms) with the rows
 * each of the n_expert experts received (loads): the part of step_ms that
 * p's per-expert fit (host_expert_ms + host_row_ms per row of each active
 * expert) does not predict, at least 0. */
void nm_profile_set_overhead(nm_profile *p, int32_t chunk, double step_ms, const int32_t *loads,
                             int32_t n_expert);

#endif /* NM_DEVICE_H */
