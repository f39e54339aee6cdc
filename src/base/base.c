/* Error text, assertions, the allocation hook and small helpers shared by all
 * parts. The only mutable global is the test-only allocation-failure
 * counter. */
#include "base.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const status_text[NM_STATUS_COUNT] = {
    [NM_OK] = "ok",
    [NM_ERR_INVALID_ARG] = "invalid argument",
    [NM_ERR_IO] = "i/o error",
    [NM_ERR_FORMAT] = "malformed input",
    [NM_ERR_UNSUPPORTED] = "unsupported",
    [NM_ERR_NOT_FOUND] = "not found",
    [NM_ERR_NOMEM] = "out of memory",
    [NM_ERR_CAPACITY] = "capacity exceeded",
};
_Static_assert(sizeof(status_text) / sizeof(status_text[0]) == NM_STATUS_COUNT,
               "one text per status");

const char *nm_version(void) { return NPUMOE_VERSION_STRING; }

const char *nm_status_str(nm_status status) {
    if ((int)status < 0 || status >= NM_STATUS_COUNT) return "unknown status";
    return status_text[status];
}

void nm_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "npumoe: assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}

nm_status nm_errorf(nm_error *err, nm_status status, const char *fmt, ...) {
    if (err) {
        err->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

nm_status nm_error_prefix(nm_error *err, const char *fmt, ...) {
    if (!err) return NM_OK;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Truncation of an over-long message is fine; it stays terminated. */
    char joined[sizeof err->msg];
    size_t n = strlen(prefix);
    if (n > sizeof joined - 3) n = sizeof joined - 3;
    memcpy(joined, prefix, n);
    joined[n] = ':';
    joined[n + 1] = ' ';
    size_t rest = sizeof joined - (n + 2) - 1;
    size_t m = strnlen(err->msg, sizeof err->msg);
    if (m > rest) m = rest;
    memcpy(joined + n + 2, err->msg, m);
    joined[n + 2 + m] = '\0';
    memcpy(err->msg, joined, sizeof joined);
    return err->status;
}

static long alloc_fail_countdown = -1;

void nm_alloc_fail_after(long n) { alloc_fail_countdown = n; }

static int alloc_should_fail(void) {
    if (alloc_fail_countdown < 0) return 0;
    return alloc_fail_countdown-- == 0;
}

void *nm_malloc(size_t n_bytes) {
    if (alloc_should_fail()) return NULL;
    return malloc(n_bytes ? n_bytes : 1);
}

void *nm_calloc(size_t n, size_t size) {
    if (alloc_should_fail()) return NULL;
    if (n == 0 || size == 0) return calloc(1, 1);
    return calloc(n, size);
}

void *nm_realloc(void *ptr, size_t n_bytes) {
    if (alloc_should_fail()) return NULL;
    return realloc(ptr, n_bytes ? n_bytes : 1);
}

void nm_free(void *ptr) { free(ptr); }

int nm_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

int nm_add_size(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}

int64_t nm_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* out = a followed by b; false where it does not fit. */
static bool join_path(char *out, size_t size, const char *a, const char *b) {
    const int n = snprintf(out, size, "%s%s", a, b);
    return n >= 0 && (size_t)n < size;
}

/* The number on the first line of root + path that starts with key, where
 * the line is key, spaces, the number's digits, then only suffix; false if
 * there is no such line or its number does not fit 64 bits. */
static bool read_number_after(const char *root, const char *path, const char *key,
                              const char *suffix, unsigned long long *out) {
    char name[PATH_MAX];
    if (!join_path(name, sizeof name, root, path)) return false;
    FILE *f = fopen(name, "r");
    if (!f) return false;
    char line[512];
    bool found = false;
    const size_t n = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, n) != 0) continue;
        const char *p = line + n;
        while (*p == ' ')
            p++;
        char *end;
        errno = 0;
        const unsigned long long v = *p >= '0' && *p <= '9' ? strtoull(p, &end, 10) : 0;
        if (*p >= '0' && *p <= '9' && errno == 0) {
            end[strcspn(end, "\n")] = '\0';
            found = strcmp(end, suffix) == 0;
            if (found) *out = v;
        }
        break;
    }
    fclose(f);
    return found;
}

/* Linux's MemAvailable under root, or UINT64_MAX. */
static uint64_t meminfo_available(const char *root) {
    unsigned long long kib;
    if (!read_number_after(root, "/proc/meminfo", "MemAvailable:", " kB", &kib)) return UINT64_MAX;
    return kib < UINT64_MAX / 1024 ? (uint64_t)kib * 1024 : UINT64_MAX;
}

/* What the memory cgroup whose files lie in dir can still be given under
 * limit: the limit less what it holds that cannot be dropped (its usage
 * less its file pages, which Linux reclaims at the limit as it counts them
 * in MemAvailable); UINT64_MAX where its usage is not known. */
static uint64_t cgroup_room_limit(const char *dir, unsigned long long limit, const char *usage_file,
                                  const char *stat_active, const char *stat_inactive) {
    unsigned long long usage, active = 0, inactive = 0;
    if (!read_number_after(dir, usage_file, "", "", &usage)) return UINT64_MAX;
    read_number_after(dir, "/memory.stat", stat_active, "", &active);
    read_number_after(dir, "/memory.stat", stat_inactive, "", &inactive);
    const unsigned long long file = active + inactive < active ? ULLONG_MAX : active + inactive;
    const unsigned long long held = usage > file ? usage - file : 0;
    return held < limit ? (uint64_t)(limit - held) : 0;
}

/* The same for a v2 cgroup under its own memory.max; UINT64_MAX where it
 * has none ("max") or its files do not say. */
static uint64_t cgroup2_room(const char *dir) {
    unsigned long long limit;
    if (!read_number_after(dir, "/memory.max", "", "", &limit)) return UINT64_MAX;
    return cgroup_room_limit(dir, limit, "/memory.current", "active_file ", "inactive_file ");
}

/* The room of the memory cgroup the process runs in, its ancestors'
 * limits included, under root: cgroup v2 (the "0::" line of
 * /proc/self/cgroup), else v1 (the line naming the memory controller;
 * memory.stat's hierarchical_memory_limit is the least limit on the way
 * up). UINT64_MAX where there is no limit. */
static uint64_t cgroup_available(const char *root) {
    char name[PATH_MAX], line[PATH_MAX], path[PATH_MAX] = "";
    if (!join_path(name, sizeof name, root, "/proc/self/cgroup")) return UINT64_MAX;
    FILE *f = fopen(name, "r");
    if (!f) return UINT64_MAX;
    int version = 0;
    bool whole = true; /* whether this line starts a line of the file */
    while (fgets(line, sizeof line, f)) {
        const bool starts = whole;
        whole = strchr(line, '\n') != NULL || feof(f);
        if (!starts || !whole) continue; /* longer than any path: not believed */
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/' || strlen(c2 + 1) >= sizeof path) continue;
        *c1 = *c2 = '\0'; /* line: the hierarchy's number */
        const char *controllers = c1 + 1;
        if (strcmp(line, "0") == 0 && *controllers == '\0' && version != 1) {
            version = 2;
            strcpy(path, c2 + 1);
        } else {
            /* v1: the memory controller in a comma-separated list */
            for (const char *p = controllers; *p;) {
                const size_t n = strcspn(p, ",");
                if (n == 6 && strncmp(p, "memory", 6) == 0) {
                    version = 1;
                    strcpy(path, c2 + 1);
                }
                p += n + (p[n] == ',');
            }
        }
    }
    fclose(f);
    char dir[PATH_MAX], base[PATH_MAX];
    uint64_t room = UINT64_MAX;
    if (version == 1) {
        /* inside a container the memory hierarchy may be mounted at the
         * process's own cgroup: the path is then not there */
        if (!join_path(base, sizeof base, root, "/sys/fs/cgroup/memory")) return UINT64_MAX;
        if (!join_path(dir, sizeof dir, base, path) ||
            !join_path(name, sizeof name, dir, "/memory.stat") || access(name, R_OK) != 0)
            strcpy(dir, base);
        /* the least of its own limit and an ancestor's (memory.stat's
         * hierarchical_memory_limit, the least on the way up: what the
         * ancestor holds is not known here, so that limit less what this
         * cgroup holds, the most the ancestor can leave it); v1 writes a
         * number near 2^63 for "no limit" */
        unsigned long long own = ULLONG_MAX, hier = ULLONG_MAX;
        read_number_after(dir, "/memory.limit_in_bytes", "", "", &own);
        read_number_after(dir, "/memory.stat", "hierarchical_memory_limit ", "", &hier);
        const unsigned long long limit = own < hier ? own : hier;
        if (limit < (1ull << 60))
            room = cgroup_room_limit(dir, limit, "/memory.usage_in_bytes", "total_active_file ",
                                     "total_inactive_file ");
    } else if (version == 2) {
        /* the cgroup and each ancestor below the mount */
        if (!join_path(base, sizeof base, root, "/sys/fs/cgroup")) return UINT64_MAX;
        size_t n = strlen(path);
        for (;;) {
            path[n] = '\0';
            if (join_path(dir, sizeof dir, base, path)) {
                const uint64_t r = cgroup2_room(dir);
                if (r < room) room = r;
            }
            /* up one level: drop the last name and the slashes before it */
            while (n > 0 && path[n - 1] == '/')
                n--;
            if (n == 0) break;
            while (n > 0 && path[n - 1] != '/')
                n--;
            while (n > 1 && path[n - 1] == '/')
                n--;
        }
    }
    return room;
}

uint64_t nm_mem_available_under(const char *root) {
    const uint64_t sys = meminfo_available(root), cg = cgroup_available(root);
    return cg < sys ? cg : sys;
}

uint64_t nm_mem_available(void) { return nm_mem_available_under(""); }

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void nm_rng_seed(nm_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

uint64_t nm_rng_u64(nm_rng *r) {
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double nm_rng_unit(nm_rng *r) { return (double)(nm_rng_u64(r) >> 11) * 0x1.0p-53; }
