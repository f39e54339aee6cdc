/* Shared foundations of every part: error reporting into an nm_error, the
 * always-on assertion for programmer errors, and the one allocation hook
 * (so tests can inject failures). No part may exit() or print from here. */
#ifndef NM_BASE_H
#define NM_BASE_H

#include "npumoe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A model's fingerprint: 16 lowercase hex digits + NUL. Computed from the
 * model's file where its data is (nm_model_fingerprint, model/), stored and
 * compared by the calibration and plan files (plan/). */
typedef struct nm_fingerprint {
    char hex[17];
} nm_fingerprint;

/* Programmer errors: always checked, abort with file:line. */
#define NM_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) nm_assert_fail(#cond, __FILE__, __LINE__);                                    \
    } while (0)

_Noreturn void nm_assert_fail(const char *cond, const char *file, int line);

/* nm_errorf (a status and its message into an nm_error) is public: npumoe.h. */

/* Prefixes err->msg with "context: " (for adding the file or tensor name as
 * an error travels up). Returns err->status (NM_OK if err is NULL). */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
nm_status
nm_error_prefix(nm_error *err, const char *fmt, ...);

/* All heap memory of the library goes through these. nm_malloc returns NULL
 * on failure (and when a test's failure injection says so). */
void *nm_malloc(size_t n_bytes);
void *nm_calloc(size_t n, size_t size);
void *nm_realloc(void *ptr, size_t n_bytes);
/* nm_free is public (npumoe.h). */

/* Test hook: the n-th allocation from now (0 = the next) fails; -1 = never. */
void nm_alloc_fail_after(long n);

/* Overflow-checked size arithmetic: returns 0 and leaves *out alone when the
 * result does not fit. */
int nm_mul_size(size_t a, size_t b, size_t *out);
int nm_add_size(size_t a, size_t b, size_t *out);

/* xoshiro256**, seeded through splitmix64: the project's one random number
 * generator (sampling, fixtures), identical on every machine. */
typedef struct nm_rng {
    uint64_t s[4];
} nm_rng;

void nm_rng_seed(nm_rng *r, uint64_t seed);
uint64_t nm_rng_u64(nm_rng *r);
/* Uniform in [0, 1), 53 bits. */
double nm_rng_unit(nm_rng *r);

/* Monotonic wall clock in nanoseconds. */
int64_t nm_time_ns(void);

/* Bytes of memory the process can be given without swapping or meeting
 * its memory cgroup's limit: the least of Linux's MemAvailable (free
 * memory and reclaimable caches) and, where the process's cgroup (v1 or
 * v2) or one of its ancestors has a limit, that limit less what the cgroup
 * holds beyond file pages; UINT64_MAX where neither says.
 * nm_mem_available_under reads those files under the directory root
 * instead of / (tests). */
uint64_t nm_mem_available(void);
uint64_t nm_mem_available_under(const char *root);

/* nm_outfile (outfile.c) is public: npumoe.h. */

#endif /* NM_BASE_H */
