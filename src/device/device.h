/* The static-graph device interface. A device compiles graphs of fixed shape
 * and runs them asynchronously: the host writes a graph's input rows,
 * submits, does other work, and waits on the graph's fence. The first graph
 * kind is the grouped expert FFN: several experts of one layer, each with a
 * fixed capacity of rows, in one dispatch; the second, the dense part of a
 * layer over a chunk (norms, projections, RoPE, attention over a K/V cache
 * the graph keeps, router logits, optionally the shared expert). A device
 * is a table of functions plus an opaque context (optional slots
 * documented); adding a device never touches the engine. The `cpu` device (cpu/) implements it with
 * the host kernels on worker threads of its own. */
#ifndef NM_DEVICE_H
#define NM_DEVICE_H

#include "npumoe.h"

#include "kernels/kernels.h"
#include "threads/threads.h"

#include <stdbool.h>
#include <stdint.h>

/* What a grouped expert FFN graph computes, fixed at compile time. Rows
 * [row0[i], row0[i] + capacity[i]) of the input belong to experts[i]:
 * out = down_e(silu(gate_e(x)) * up_e(x)) for each of those rows, or with
 * the weights' biases and activation (nm_expert_ffn_forward) on a device
 * whose ffn_features allow them. Rows the host leaves empty must be zero;
 * their output is ignored. */
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

/* Forms of the expert FFN beyond the plain SwiGLU (nm_device_ops.ffn_features). */
enum {
    NM_FFN_F_BIAS = 1u << 0,       /* gate_b, up_b or down_b */
    NM_FFN_F_SWIGLU_OAI = 1u << 1, /* glu == NM_GLU_SWIGLU_OAI */
};

/* The kinds of graph a device may compile (nm_device_ops.supports). */
typedef enum nm_graph_op {
    NM_GRAPH_FFN = 0,   /* the grouped expert FFN of an nm_ffn_spec */
    NM_GRAPH_DENSE = 1, /* the dense part of a layer of an nm_dense_spec */
    NM_GRAPH_OP_COUNT
} nm_graph_op;

/* ---- graph kind 2: the dense part of a layer over a chunk ---- */

/* The forms the blocks of a dense part take (the architectures' choices,
 * as plain data: the device knows no model). */
typedef enum nm_dense_norm {
    NM_DENSE_NORM_RMS = 0,  /* x / sqrt(mean(x^2) + eps) * w */
    NM_DENSE_NORM_LAYER = 1 /* (x - mean) / sqrt(var + eps) * w (biased variance) */
} nm_dense_norm;
typedef enum nm_dense_qk_norm {
    NM_DENSE_QK_NONE = 0,
    NM_DENSE_QK_HEAD = 1, /* RMSNorm of each head's head_dim values (qwen3moe) */
    NM_DENSE_QK_WHOLE = 2 /* RMSNorm of the whole projection (olmoe) */
} nm_dense_qk_norm;
typedef enum nm_dense_rope {
    NM_DENSE_ROPE_NEOX = 0, /* element i pairs with i + n_rot/2 */
    NM_DENSE_ROPE_NORM = 1  /* elements 2i and 2i+1 (llama) */
} nm_dense_rope;

/* The dense part of layer `layer` over a chunk of `rows` rows at positions
 * pos .. pos + rows - 1 (pos given per launch), fixed at compile time. The
 * input is the residual stream x [rows][d_model]; the graph computes
 *     a   = norm(x; attn_norm, attn_norm_b)
 *     q   = rope(qk_norm(Wq a + bq)), k = rope(qk_norm(Wk a + bk)), v = Wv a + bv
 *     K/V of positions pos + t := k, v (the graph's own cache, kv_type)
 *     o_t = causal GQA attention of q_t over positions 0 .. pos + t, scale attn_scale
 *     x'  = x + Wo o + bo                        output x     [rows][d_model]
 *     xn  = norm(x'; ffn_norm, ffn_norm_b)       output xn    [rows][d_model]
 *     r   = Wr xn                                output logits [rows][n_expert]
 * and, when n_ff_shexp > 0, the shared expert (dense work on every row):
 *     s   = sigmoid(g . xn) * Wd(silu(Wg xn) * Wu xn)  output shexp [rows][d_model]
 * with g = shexp_gate_inp (no sigmoid factor when its data is NULL),
 * Wg, Wu, Wd = shexp_gate, shexp_up, shexp_down: the host adds s to the
 * routed experts' sum before the residual. It is an optional block: a
 * device without NM_DENSE_F_SHARED_EXPERT still runs the rest of the layer
 * (nm_device_fit_dense takes it out of the spec and the host computes it).
 * NULL biases and norm biases are absent. With round_f16, the input of the
 * q/k/v projections (when wq is F16) and of the output projection (when wo
 * is F16) is rounded to IEEE half first, as llama.cpp's F16 matmuls do;
 * a spec with round_f16 has no shared expert (nm_dense_spec_check).
 * Every row is computed, padding included; a row never reads a later one.
 * The graph keeps the K/V of its positions between launches (the prompt's
 * cache, resident on the device) and hands them to the host on request
 * (kv_read), or takes the host's (kv_write). Query head h reads kv head
 * h / (n_head / n_head_kv). Weights are host memory the device may copy or
 * convert at compile; vectors are F32. */
typedef struct nm_dense_spec {
    int32_t layer;
    int32_t rows;  /* T, rows of every launch, >= 1 */
    int32_t n_pos; /* positions the graph's K/V holds: a launch needs pos + rows <= n_pos */
    int64_t d_model;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_expert; /* rows of the router */
    nm_dense_norm norm;
    float norm_eps; /* of every norm, q/k norms included */
    nm_dense_qk_norm qk_norm;
    nm_dense_rope rope;
    int32_t n_rot; /* rotated dims of each head, even, <= head_dim */
    float rope_freq_base;
    float rope_attn_factor;    /* cos and sin scaled by it; 1 = none */
    const float *rope_factors; /* [n_rot / 2] frequency divisors, or NULL */
    float attn_scale;          /* usually 1 / sqrt(head_dim) */
    nm_kv_type kv_type;        /* the elements of the graph's K/V and of kv_read/kv_write */
    bool round_f16;
    const float *attn_norm;   /* [d_model] */
    const float *attn_norm_b; /* [d_model] or NULL */
    nm_mat wq;                /* [n_head * head_dim][d_model] */
    nm_mat wk;                /* [n_head_kv * head_dim][d_model] */
    nm_mat wv;                /* [n_head_kv * head_dim][d_model] */
    nm_mat wo;                /* [d_model][n_head * head_dim] */
    const float *bq;          /* [n_head * head_dim] or NULL */
    const float *bk;          /* [n_head_kv * head_dim] or NULL */
    const float *bv;          /* [n_head_kv * head_dim] or NULL */
    const float *bo;          /* [d_model] or NULL */
    const float *q_norm;      /* [head_dim] (HEAD), [n_head * head_dim] (WHOLE) or NULL */
    const float *k_norm;      /* [head_dim] (HEAD), [n_head_kv * head_dim] (WHOLE) or NULL */
    const float *ffn_norm;    /* [d_model] */
    const float *ffn_norm_b;  /* [d_model] or NULL */
    nm_mat router;            /* [n_expert][d_model] */
    int64_t n_ff_shexp;       /* d_ff of the shared expert; 0: none (its mats unused) */
    nm_mat shexp_gate;        /* [n_ff_shexp][d_model] */
    nm_mat shexp_up;          /* [n_ff_shexp][d_model] */
    nm_mat shexp_down;        /* [d_model][n_ff_shexp] */
    nm_mat shexp_gate_inp;    /* [1][d_model], or data NULL: ungated */
} nm_dense_spec;

/* What a spec asks of a device beyond plain RMSNorm, NeoX RoPE over whole
 * heads, no biases and an F32 cache: one bit each, so a device states what
 * it implements (nm_device_ops.dense_features) and the host keeps on
 * itself every layer that asks for more (nm_device_check_dense). */
enum {
    NM_DENSE_F_LAYERNORM = 1u << 0,      /* norm == NM_DENSE_NORM_LAYER */
    NM_DENSE_F_NORM_BIAS = 1u << 1,      /* attn_norm_b or ffn_norm_b */
    NM_DENSE_F_ATTN_BIAS = 1u << 2,      /* bq, bk, bv or bo */
    NM_DENSE_F_QK_HEAD = 1u << 3,        /* qk_norm == NM_DENSE_QK_HEAD */
    NM_DENSE_F_QK_WHOLE = 1u << 4,       /* qk_norm == NM_DENSE_QK_WHOLE */
    NM_DENSE_F_ROPE_NORM = 1u << 5,      /* rope == NM_DENSE_ROPE_NORM */
    NM_DENSE_F_ROPE_FACTORS = 1u << 6,   /* rope_factors */
    NM_DENSE_F_ROPE_ATTN = 1u << 7,      /* rope_attn_factor != 1 */
    NM_DENSE_F_PARTIAL_ROPE = 1u << 8,   /* n_rot < head_dim */
    NM_DENSE_F_KV_F16 = 1u << 9,         /* kv_type == NM_KV_F16 */
    NM_DENSE_F_ROUND_F16 = 1u << 10,     /* round_f16 with an F16 wq or wo */
    NM_DENSE_F_SHARED_EXPERT = 1u << 11, /* n_ff_shexp > 0 (optional: nm_device_fit_dense) */
    NM_DENSE_F_COUNT = 12
};

/* The blocks of a spec a device may leave to the host (today the shared
 * expert): NM_DENSE_F_SHARED_EXPERT never keeps a layer's dense part off
 * a device. */
#define NM_DENSE_F_OPTIONAL ((uint32_t)NM_DENSE_F_SHARED_EXPERT)

/* The NM_DENSE_F_* bits spec asks for. */
uint32_t nm_dense_spec_features(const nm_dense_spec *spec);
/* The name of one feature bit ("layernorm", "norm bias", ...). */
const char *nm_dense_feature_name(uint32_t bit);

/* The outputs of a dense graph, valid after wait until the next launch. */
typedef struct nm_dense_outputs {
    const float *x;      /* [rows][d_model] the residual stream after attention */
    const float *xn;     /* [rows][d_model] its ffn norm: the experts' input */
    const float *logits; /* [rows][n_expert] the router's logits */
    const float *shexp;  /* [rows][d_model] the gated shared expert, or NULL: the spec has none */
} nm_dense_outputs;

typedef struct nm_device nm_device;

/* The table a device implements. */
typedef struct nm_device_ops {
    const char *name;
    /* Whether the device compiles graphs of kind op over weights of type
     * weight_type (an nm_dtype) as a model file holds them, natively or
     * converted at compile: the host asks before it makes a graph, so a
     * device is never handed one it cannot run (nm_device_supports). */
    bool (*supports)(const nm_device *dev, uint32_t weight_type, nm_graph_op op);
    /* The NM_FFN_F_* forms of expert FFN a device runs beyond the plain
     * SwiGLU without biases (0: none; nm_device_check_ffn refuses the
     * others). */
    uint32_t ffn_features;
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
    /* Optional (NULL: 1). The rows the device computes at once: a graph's
     * capacity is best a multiple of it (the planner's default granule,
     * recorded in the profile). */
    int32_t (*row_granule)(const nm_device *dev);

    /* ---- graph kind 2, the dense part of a layer (optional as a whole:
     * a device without it has compile_dense NULL, dense_features 0 and
     * supports(.., NM_GRAPH_DENSE) false) ---- */
    /* The NM_DENSE_F_* a device implements. */
    uint32_t dense_features;
    /* Compiles a dense graph; the spec's pointers need not outlive the
     * call except the weights and vectors, which stay the host's. input()
     * is then its x [rows][d_model]; wait, graph_free as for FFN graphs.
     * The graph's K/V hold nothing until launches or kv_write fill them. */
    nm_status (*compile_dense)(nm_device *dev, const nm_dense_spec *spec, nm_graph **out,
                               nm_error *err);
    /* Starts the graph over the chunk at positions pos .. pos + rows - 1
     * (pos + rows <= n_pos); returns at once. It reads the K/V of positions
     * below pos that earlier launches (or kv_write) left. */
    void (*submit_dense)(nm_graph *g, int32_t pos);
    void (*dense_outputs)(const nm_graph *g, nm_dense_outputs *out);
    /* Copies the K and V of positions pos0 .. pos0 + n - 1 out of the graph
     * into k, v ([n][n_head_kv * head_dim] of kv_type), or into the graph
     * from them. Not while the graph is submitted and not waited for. */
    void (*kv_read)(nm_graph *g, int32_t pos0, int32_t n, void *k, void *v);
    void (*kv_write)(nm_graph *g, int32_t pos0, int32_t n, const void *k, const void *v);
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
/* What every device refuses in a dense spec: sizes out of range, heads
 * that do not divide, weights of the wrong shape, a missing norm, a
 * shared expert with round_f16;
 * NM_ERR_INVALID_ARG naming the value. */
nm_status nm_dense_spec_check(const nm_dense_spec *spec, nm_error *err);
/* NM_OK when dev compiles spec's dense graph: it has the graph kind, every
 * matrix's type (supports) and every feature spec asks for
 * (dense_features); else NM_ERR_UNSUPPORTED naming the device, the layer
 * and the first thing missing. Does not check the spec's shapes. */
nm_status nm_device_check_dense(const nm_device *dev, const nm_dense_spec *spec, nm_error *err);
/* Takes out of spec the optional blocks (NM_DENSE_F_OPTIONAL) dev does not
 * implement, which the host then computes itself: call it before
 * nm_device_check_dense, so a device without them still gets the rest. */
void nm_device_fit_dense(const nm_device *dev, nm_dense_spec *spec);
/* dev->ops->row_granule, or 1 for a device without one. */
int32_t nm_device_row_granule(const nm_device *dev);
/* dev->ops->check, or NM_OK for a device without one. */
nm_status nm_device_check(nm_device *dev, nm_error *err);

/* nm_device_info and nm_device_list are public: npumoe.h. */

/* ---- measurement (profile.c) ---- */

/* nm_profile (what a device measured about itself) is public: npumoe.h. */

/* Median of v[0..n), n >= 1; v is sorted in place. */
double nm_median(double *v, int n);

/* Measures dev on the layer's experts w: for every (n, c) of
 * grid_experts x grid_capacity (points in that order, experts outer), a graph
 * over experts 0..n-1 with capacity c each, run reps times (after one
 * untimed run), median submit + wait; the dispatch overhead; and the host's
 * cost of one expert over m rows on host_pool, fitted as
 * host_expert_ms + m * host_row_ms (measured again with twice the reps, up to
 * three times, while the fit gives a per-row cost <= 0, as a busy machine can;
 * then NM_ERR_INVALID_ARG). progress, when not NULL, is called after each step
 * of the first pass with done of total steps. out is filled on NM_OK and must be
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
