/* npumoe devices: every static-graph device this machine can open, as
 * --device names them, and why Vulkan cannot be used when it cannot. */
#include "cli.h"

#include <stdio.h>

int cmd_devices(const cli_options *o) {
    (void)o;
    nm_device_info *list = NULL;
    int n = 0;
    char why[512];
    nm_error err = {0};
    if (nm_device_list(&list, &n, why, sizeof why, &err) != NM_OK) return fail_err(&err);
    printf("%-10s %-10s %-6s %-5s %-7s %s\n", "device", "memory", "f16", "int8", "granule",
           "description; driver");
    for (int i = 0; i < n; i++) {
        const nm_device_info *d = &list[i];
        printf("%-10s %6.1f GiB %-6s %-5s %-7d %s%s%s\n", d->name,
               (double)d->memory_bytes / (1024.0 * 1024.0 * 1024.0), d->float16 ? "yes" : "no",
               d->int8 ? "yes" : "no", (int)d->row_granule, d->description,
               d->driver[0] ? "; " : "", d->driver);
    }
    if (why[0]) printf("vulkan: not available: %s\n", why);
    nm_free(list);
    return 0;
}
