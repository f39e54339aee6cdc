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
    return NM_OK;
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
    cpu->float16 = cpu->int8 = true; /* the host kernels read F16 and int8 blocks */
    int count = 1;
#ifdef NM_HAVE_VULKAN
    count += nm_vulkan_list(list + 1, MAX_VULKAN_LISTED, why_no_vulkan, why_bytes);
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
