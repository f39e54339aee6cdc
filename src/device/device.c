/* What every device shares: the row layout of a grouped FFN spec, and the
 * table of devices by name. Each device lives in a folder of its own
 * (cpu/, ...); this file only knows how to create them. */
#include "device.h"

#include "base/base.h"

#include <stdio.h>
#include <string.h>

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

static nm_status new_cpu(int n_threads, nm_device **out, nm_error *err) {
    nm_cpu_device_params params = {.n_threads = n_threads};
    return nm_cpu_device_new(&params, out, err);
}

/* Every device this build has, in the order `--device` help lists them. */
static const struct {
    const char *name;
    nm_status (*create)(int n_threads, nm_device **out, nm_error *err);
} devices[] = {
    {"cpu", new_cpu},
};
enum { N_DEVICES = sizeof devices / sizeof devices[0] };

nm_status nm_device_new(const char *name, int n_threads, nm_device **out, nm_error *err) {
    *out = NULL;
    if (!name) return nm_errorf(err, NM_ERR_INVALID_ARG, "no device name given");
    for (int i = 0; i < N_DEVICES; i++)
        if (strcmp(devices[i].name, name) == 0) return devices[i].create(n_threads, out, err);
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < N_DEVICES && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                 devices[i].name);
    return nm_errorf(err, NM_ERR_UNSUPPORTED, "unknown device '%s' (available: %s)", name, list);
}

void nm_device_free(nm_device *dev) {
    if (dev) dev->ops->free(dev);
}
