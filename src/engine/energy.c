/* Energy as the system measures it: the RAPL package counters Linux
 * exposes under /sys/class/powercap (intel-rapl:N/energy_uj, which wrap at
 * max_energy_range_uj). Readings only: where no counter can be read the
 * sample says why, and nothing is ever estimated. */
#include "npumoe.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POWERCAP_ROOT "/sys/class/powercap"

/* Reads the first line of dir/file; false (why filled) when it cannot. */
static bool read_line(const char *dir, const char *file, char *out, size_t cap, char *why,
                      size_t why_bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    bool ok = f && fgets(out, (int)cap, f) != NULL;
    if (!ok)
        snprintf(why, why_bytes, "cannot read %.180s: %s", path,
                 !f || ferror(f) ? strerror(errno) : "empty");
    if (f) fclose(f);
    return ok;
}

/* Reads dir/file as a decimal counter; false (why filled) otherwise. */
static bool read_counter(const char *dir, const char *file, uint64_t *out, char *why,
                         size_t why_bytes) {
    char line[64];
    if (!read_line(dir, file, line, sizeof line, why, why_bytes)) return false;
    char *end = NULL;
    errno = 0;
    const unsigned long long v = strtoull(line, &end, 10);
    if (end == line || errno || (*end && *end != '\n') || line[0] == '-') {
        snprintf(why, why_bytes, "%.150s/%s: '%.20s' is not a counter", dir, file, line);
        return false;
    }
    *out = v;
    return true;
}

/* "intel-rapl:N": a top-level zone (its subzones, "intel-rapl:N:M", are
 * parts of it: core, uncore, dram). */
static bool top_level_zone(const char *name) {
    const char *p = name + strlen("intel-rapl:");
    if (strncmp(name, "intel-rapl:", strlen("intel-rapl:")) != 0 || !*p) return false;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return false;
    return true;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

void nm_energy_read(const char *root, nm_energy_sample *out) {
    memset(out, 0, sizeof *out);
    if (!root) root = POWERCAP_ROOT;
    struct dirent **list = NULL;
    const int n = scandir(root, &list, NULL, by_name);
    if (n < 0) {
        snprintf(out->why, sizeof out->why, "no RAPL energy counters (%.180s: %s)", root,
                 strerror(errno));
        return;
    }
    bool ok = true;
    for (int i = 0; i < n; i++) {
        const char *name = list[i]->d_name;
        if (ok && top_level_zone(name)) {
            char dir[768], zone[64];
            snprintf(dir, sizeof dir, "%s/%s", root, name);
            /* the packages only: a psys zone (the whole platform, on some
             * laptops) holds the packages' energy too */
            ok = read_line(dir, "name", zone, sizeof zone, out->why, sizeof out->why);
            if (ok && strncmp(zone, "package", strlen("package")) == 0) {
                if (out->n_zones == NM_ENERGY_MAX_ZONES) {
                    snprintf(out->why, sizeof out->why, "more than %d RAPL package zones in %.180s",
                             NM_ENERGY_MAX_ZONES, root);
                    ok = false;
                } else {
                    const int z = out->n_zones++;
                    ok = read_counter(dir, "energy_uj", &out->uj[z], out->why, sizeof out->why) &&
                         read_counter(dir, "max_energy_range_uj", &out->max_uj[z], out->why,
                                      sizeof out->why);
                    if (ok && (out->max_uj[z] == 0 || out->uj[z] > out->max_uj[z])) {
                        snprintf(out->why, sizeof out->why,
                                 "%.150s: energy_uj %llu beyond max_energy_range_uj %llu", dir,
                                 (unsigned long long)out->uj[z],
                                 (unsigned long long)out->max_uj[z]);
                        ok = false;
                    }
                }
            }
        }
        free(list[i]);
    }
    free(list);
    if (ok && out->n_zones == 0)
        snprintf(out->why, sizeof out->why, "no RAPL package zone in %.180s", root);
    out->available = ok && out->n_zones > 0;
    if (!out->available) out->n_zones = 0;
}

double nm_energy_joules(const nm_energy_sample *before, const nm_energy_sample *after) {
    if (!before->available || !after->available || before->n_zones != after->n_zones) return -1;
    double uj = 0;
    for (int z = 0; z < before->n_zones; z++) {
        if (before->max_uj[z] != after->max_uj[z]) return -1;
        const uint64_t a = before->uj[z], b = after->uj[z];
        /* the counter runs from 0 to max_energy_range_uj and starts again */
        uj += (double)(b >= a ? b - a : after->max_uj[z] - a + b);
    }
    return uj * 1e-6;
}
