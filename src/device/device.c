/* What every device shares: the row layout of a grouped FFN spec, and the
 * table of devices by name. Each device lives in a folder of its own
 * (cpu/, ...); this file only knows how to create them. */
#include "device.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int64_t nm_ffn_spec_rows(const nm_ffn_spec *spec) {
    int64_t rows = 0;
    for (int32_t i = 0; i < spec->n_experts; i++)
        rows += spec->capacity[i];
    return rows;
}

void nm_ffn_spec_row0(const nm_ffn_spec *spec, int64_t *row0) {
    int64_t row = 0;
    for (int32_t i = 0; i < spec->n_experts; i++) {
        row0[i] = row;
        row += spec->capacity[i];
    }
}

nm_status nm_ffn_spec_check_slots(const nm_ffn_spec *spec, nm_error *err) {
    const nm_expert_weights *w = spec->weights;
    const int32_t layer = spec->layer;
    if (layer < 0) return nm_errorf(err, NM_ERR_INVALID_ARG, "ffn graph: layer %d < 0", layer);
    if (spec->n_experts < 1)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "ffn graph of layer %d: n_experts %d, a graph needs at least one expert",
                         layer, spec->n_experts);
    for (int32_t i = 0; i < spec->n_experts; i++) {
        const int32_t e = spec->experts[i];
        if (e < 0 || e >= w->n_expert)
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "ffn graph of layer %d: expert %d (slot %d) is out of range: the "
                             "layer has %d experts",
                             layer, e, i, w->n_expert);
        for (int32_t j = 0; j < i; j++)
            if (spec->experts[j] == e)
                return nm_errorf(err, NM_ERR_INVALID_ARG,
                                 "ffn graph of layer %d: expert %d appears twice (slots %d and %d)",
                                 layer, e, j, i);
        if (spec->capacity[i] < 1)
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "ffn graph of layer %d: capacity %d of expert %d (slot %d) is not "
                             ">= 1",
                             layer, spec->capacity[i], e, i);
    }
    return NM_OK;
}

static nm_status new_cpu(const nm_device_params *p, nm_device **out, nm_error *err) {
    nm_cpu_device_params params = {.n_threads = p->n_threads};
    return nm_cpu_device_new(&params, out, err);
}

#ifndef NM_HAVE_VULKAN
nm_status nm_vulkan_device_new(const nm_vulkan_device_params *params, nm_device **out,
                               nm_error *err) {
    *out = NULL;
    return nm_errorf(err, NM_ERR_UNSUPPORTED,
                     "vulkan:%d: this build of npumoe has no vulkan device (configure with "
                     "-DNM_VULKAN=ON, with libvulkan-dev and glslc installed)",
                     params->index);
}
#else
/* vulkan/vulkan.c: the Vulkan devices of this machine, at most cap, into
 * out; why says why there are none usable ("" if there are). */
int nm_vulkan_list(nm_device_info *out, int cap, char *why, size_t why_bytes);
#endif

/* "vulkan" (device 0) or "vulkan:N"; the index is parsed here so a typo is
 * an error, never device 0. */
static nm_status new_vulkan(const char *name, uint64_t budget_bytes, nm_device **out,
                            nm_error *err) {
    nm_vulkan_device_params params = {.index = 0, .budget_bytes = budget_bytes};
    if (name[6] == ':') {
        const char *digits = name + 7;
        char *end = NULL;
        errno = 0;
        const long v = strtol(digits, &end, 10);
        if (*digits < '0' || *digits > '9' || *end || errno || v > 1024)
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "device '%s': after 'vulkan:' comes a device index (0, 1, ...; "
                             "npumoe devices lists them)",
                             name);
        params.index = (int)v;
    }
    return nm_vulkan_device_new(&params, out, err);
}

/* Every device this build has, in the order `--device` help lists them. */
static const struct {
    const char *name;
    nm_status (*create)(const nm_device_params *params, nm_device **out, nm_error *err);
} devices[] = {
    {"cpu", new_cpu},
};
enum { N_DEVICES = sizeof devices / sizeof devices[0] };

nm_device_params nm_device_default_params(void) {
    return (nm_device_params){.name = "cpu", .n_threads = 1, .memory_budget_bytes = 0};
}

nm_status nm_device_open(const nm_device_params *params, nm_device **out, nm_error *err) {
    *out = NULL;
    const char *name = params ? params->name : NULL;
    if (!name) return nm_errorf(err, NM_ERR_INVALID_ARG, "no device name given");
    for (int i = 0; i < N_DEVICES; i++)
        if (strcmp(devices[i].name, name) == 0) return devices[i].create(params, out, err);
    if (strncmp(name, "vulkan", 6) == 0 && (name[6] == '\0' || name[6] == ':'))
        return new_vulkan(name, params->memory_budget_bytes, out, err);
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < N_DEVICES && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                 devices[i].name);
    return nm_errorf(err, NM_ERR_UNSUPPORTED,
                     "unknown device '%s' (available: %s, vulkan, vulkan:N)", name, list);
}

bool nm_device_supports(const nm_device *dev, uint32_t weight_type, nm_graph_op op) {
    NM_ASSERT(dev && (unsigned)op < NM_GRAPH_OP_COUNT);
    return dev->ops->supports(dev, weight_type, op);
}

nm_status nm_device_check_ffn(const nm_device *dev, const nm_expert_weights *w, int32_t layer,
                              nm_error *err) {
    const struct {
        const char *name;
        uint32_t type;
    } mats[3] = {{"gate", w->gate.type}, {"up", w->up.type}, {"down", w->down.type}};
    for (int i = 0; i < 3; i++)
        if (!nm_device_supports(dev, mats[i].type, NM_GRAPH_FFN))
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "the %s device cannot run expert FFN graphs over %s weights (the "
                             "%s matrices of layer %d); those experts must stay on the host",
                             dev->ops->name, nm_dtype_name(mats[i].type), mats[i].name, layer);
    const uint32_t want = (w->gate_b || w->up_b || w->down_b ? NM_FFN_F_BIAS : 0) |
                          (w->glu == NM_GLU_SWIGLU_OAI ? NM_FFN_F_SWIGLU_OAI : 0);
    const uint32_t missing = want & ~dev->ops->ffn_features;
    if (missing)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "the %s device cannot run the experts of layer %d: it does not "
                         "implement %s; those experts must stay on the host",
                         dev->ops->name, layer,
                         missing & NM_FFN_F_BIAS ? "expert biases" : "the clamped SwiGLU");
    return NM_OK;
}

uint32_t nm_dense_spec_features(const nm_dense_spec *s) {
    uint32_t f = 0;
    if (s->norm == NM_DENSE_NORM_LAYER) f |= NM_DENSE_F_LAYERNORM;
    if (s->attn_norm_b || s->ffn_norm_b) f |= NM_DENSE_F_NORM_BIAS;
    if (s->bq || s->bk || s->bv || s->bo) f |= NM_DENSE_F_ATTN_BIAS;
    if (s->qk_norm == NM_DENSE_QK_HEAD) f |= NM_DENSE_F_QK_HEAD;
    if (s->qk_norm == NM_DENSE_QK_WHOLE) f |= NM_DENSE_F_QK_WHOLE;
    if (s->rope == NM_DENSE_ROPE_NORM) f |= NM_DENSE_F_ROPE_NORM;
    if (s->rope_factors) f |= NM_DENSE_F_ROPE_FACTORS;
    if (s->rope_attn_factor != 1.0f) f |= NM_DENSE_F_ROPE_ATTN;
    if (s->n_rot < s->head_dim) f |= NM_DENSE_F_PARTIAL_ROPE;
    if (s->kv_type == NM_KV_F16) f |= NM_DENSE_F_KV_F16;
    if (s->round_f16 && (s->wq.type == NM_DTYPE_F16 || s->wo.type == NM_DTYPE_F16))
        f |= NM_DENSE_F_ROUND_F16;
    if (s->n_ff_shexp > 0) f |= NM_DENSE_F_SHARED_EXPERT;
    return f;
}

const char *nm_dense_feature_name(uint32_t bit) {
    static const char *const names[NM_DENSE_F_COUNT] = {"layernorm",
                                                        "norm biases",
                                                        "attention biases",
                                                        "per-head q/k norm",
                                                        "whole q/k norm",
                                                        "llama (norm) rope",
                                                        "rope factors",
                                                        "rope attention factor",
                                                        "partial rope",
                                                        "f16 kv cache",
                                                        "f16 matmul inputs (--compat llama.cpp)",
                                                        "shared expert"};
    for (int i = 0; i < NM_DENSE_F_COUNT; i++)
        if (bit == 1u << i) return names[i];
    return "unknown feature";
}

static nm_status check_dense_mat(const nm_dense_spec *s, const char *what, const nm_mat *m,
                                 int64_t n, int64_t k, nm_error *err) {
    if (!m->data)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "dense graph of layer %d: no %s weights",
                         s->layer, what);
    if (m->n != n || m->k != k)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "dense graph of layer %d: %s weights are [%lld][%lld], the spec needs "
                         "[%lld][%lld]",
                         s->layer, what, (long long)m->n, (long long)m->k, (long long)n,
                         (long long)k);
    return NM_OK;
}

nm_status nm_dense_spec_check(const nm_dense_spec *s, nm_error *err) {
    const int32_t layer = s->layer;
    if (layer < 0) return nm_errorf(err, NM_ERR_INVALID_ARG, "dense graph: layer %d < 0", layer);
    if (s->rows < 1 || s->n_pos < s->rows)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "dense graph of layer %d: %d rows over %d positions (need 1 <= rows <= "
                         "positions)",
                         layer, s->rows, s->n_pos);
    if (s->d_model < 1 || s->n_head < 1 || s->n_head_kv < 1 || s->head_dim < 1 || s->n_expert < 1 ||
        s->n_head % s->n_head_kv != 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "dense graph of layer %d: d_model %lld, %d heads of %d over %d kv heads, "
                         "%d experts (all >= 1, kv heads dividing heads)",
                         layer, (long long)s->d_model, s->n_head, s->head_dim, s->n_head_kv,
                         s->n_expert);
    if (s->n_rot < 2 || s->n_rot % 2 || s->n_rot > s->head_dim)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "dense graph of layer %d: rope over %d of %d dims (even, 2..head_dim)",
                         layer, s->n_rot, s->head_dim);
    if ((unsigned)s->norm > NM_DENSE_NORM_LAYER || (unsigned)s->qk_norm > NM_DENSE_QK_WHOLE ||
        (unsigned)s->rope > NM_DENSE_ROPE_NORM ||
        (s->kv_type != NM_KV_F32 && s->kv_type != NM_KV_F16))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "dense graph of layer %d: unknown norm %d, q/k norm %d, rope %d or kv "
                         "type %d",
                         layer, (int)s->norm, (int)s->qk_norm, (int)s->rope, (int)s->kv_type);
    if (!s->attn_norm || !s->ffn_norm ||
        (s->qk_norm != NM_DENSE_QK_NONE && (!s->q_norm || !s->k_norm)))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "dense graph of layer %d: a norm's weights are "
                         "missing",
                         layer);
    const int64_t d = s->d_model, q_dim = (int64_t)s->n_head * s->head_dim,
                  kv_dim = (int64_t)s->n_head_kv * s->head_dim;
    nm_status st;
    if ((st = check_dense_mat(s, "q", &s->wq, q_dim, d, err)) ||
        (st = check_dense_mat(s, "k", &s->wk, kv_dim, d, err)) ||
        (st = check_dense_mat(s, "v", &s->wv, kv_dim, d, err)) ||
        (st = check_dense_mat(s, "output", &s->wo, d, q_dim, err)) ||
        (st = check_dense_mat(s, "router", &s->router, s->n_expert, d, err)))
        return st;
    if (s->n_ff_shexp < 0 || (s->n_ff_shexp > 0 && s->round_f16))
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "dense graph of layer %d: shared expert of width %lld%s", layer,
                         (long long)s->n_ff_shexp,
                         s->round_f16 ? " with f16 matmul inputs (the host computes it)" : "");
    if (s->n_ff_shexp == 0) return NM_OK;
    const int64_t ff = s->n_ff_shexp;
    if ((st = check_dense_mat(s, "shared expert gate", &s->shexp_gate, ff, d, err)) ||
        (st = check_dense_mat(s, "shared expert up", &s->shexp_up, ff, d, err)) ||
        (st = check_dense_mat(s, "shared expert down", &s->shexp_down, d, ff, err)) ||
        (s->shexp_gate_inp.data &&
         (st = check_dense_mat(s, "shared expert gate input", &s->shexp_gate_inp, 1, d, err))))
        return st;
    return NM_OK;
}

nm_status nm_device_check_dense(const nm_device *dev, const nm_dense_spec *spec, nm_error *err) {
    const nm_device_ops *ops = dev->ops;
    if (!ops->compile_dense)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "the %s device has no dense-part graphs: layer %d's dense part stays on "
                         "the host",
                         ops->name, spec->layer);
    const struct {
        const char *name;
        uint32_t type;
    } mats[9] = {{"q", spec->wq.type},
                 {"k", spec->wk.type},
                 {"v", spec->wv.type},
                 {"output", spec->wo.type},
                 {"router", spec->router.type},
                 {"shared expert gate", spec->shexp_gate.type},
                 {"shared expert up", spec->shexp_up.type},
                 {"shared expert down", spec->shexp_down.type},
                 {"shared expert gate input", spec->shexp_gate_inp.type}};
    const int n_mats = spec->n_ff_shexp == 0 ? 5 : spec->shexp_gate_inp.data ? 9 : 8;
    for (int i = 0; i < n_mats; i++)
        if (!nm_device_supports(dev, mats[i].type, NM_GRAPH_DENSE))
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "the %s device cannot run dense-part graphs over %s weights (the %s "
                             "projection of layer %d)",
                             ops->name, nm_dtype_name(mats[i].type), mats[i].name, spec->layer);
    const uint32_t missing = nm_dense_spec_features(spec) & ~ops->dense_features;
    for (int i = 0; i < NM_DENSE_F_COUNT; i++)
        if (missing & (1u << i))
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "the %s device does not implement %s in dense-part graphs (layer %d)",
                             ops->name, nm_dense_feature_name(1u << i), spec->layer);
    return NM_OK;
}

void nm_device_fit_dense(const nm_device *dev, nm_dense_spec *spec) {
    const uint32_t lacking = NM_DENSE_F_OPTIONAL & ~dev->ops->dense_features;
    if (lacking & NM_DENSE_F_SHARED_EXPERT) {
        spec->n_ff_shexp = 0;
        spec->shexp_gate = spec->shexp_up = spec->shexp_down = spec->shexp_gate_inp = (nm_mat){0};
    }
}

int32_t nm_device_row_granule(const nm_device *dev) {
    return dev->ops->row_granule ? dev->ops->row_granule(dev) : 1;
}

nm_status nm_device_check(nm_device *dev, nm_error *err) {
    return dev && dev->ops->check ? dev->ops->check(dev, err) : NM_OK;
}

enum { MAX_VULKAN_LISTED = 16 };

nm_status nm_device_list(nm_device_info **out, int *n, char *why_no_vulkan, size_t why_bytes,
                         nm_error *err) {
    *out = NULL;
    *n = 0;
    nm_device_info *list = nm_calloc(1 + MAX_VULKAN_LISTED, sizeof *list);
    if (!list) return nm_errorf(err, NM_ERR_NOMEM, "out of memory listing devices");
    nm_device_info *cpu = &list[0];
    snprintf(cpu->name, sizeof cpu->name, "cpu");
    snprintf(cpu->description, sizeof cpu->description,
             "the host's kernels on %d worker thread(s) of its own (--device-threads)", 1);
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    cpu->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    cpu->float16 = cpu->int8 = true;             /* the host kernels read F16 and int8 blocks */
    cpu->row_granule = nm_kernels_row_granule(); /* as its row_granule slot */
    int count = 1;
#ifdef NM_HAVE_VULKAN
    count += nm_vulkan_list(list + 1, MAX_VULKAN_LISTED, why_no_vulkan, why_bytes);
    for (int i = 1; i < count; i++) /* no row_granule slot: none preferred */
        list[i].row_granule = 1;
#else
    if (why_no_vulkan)
        snprintf(why_no_vulkan, why_bytes,
                 "this build of npumoe has no vulkan device (configure with -DNM_VULKAN=ON)");
#endif
    *out = list;
    *n = count;
    return NM_OK;
}

void nm_device_close(nm_device *dev) {
    if (dev) dev->ops->free(dev);
}
