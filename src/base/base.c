/* Error text, assertions, the allocation hook and small helpers shared by all
 * parts. The only mutable global is the test-only allocation-failure
 * counter. */
#include "base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

uint64_t nm_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return UINT64_MAX;
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    fclose(f);
    return found && kib < UINT64_MAX / 1024 ? (uint64_t)kib * 1024 : UINT64_MAX;
}

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
