/* This machine's peaks that need no AVX-512, measured (compiled with the
 * AVX2 flags; called only where CPUID reports AVX2 and FMA): one core's
 * FP32 FMA rate on 8-lane vectors (12 independent accumulators, enough for
 * two FMA units of latency 4 or 5), its rate of exact int8 products without
 * VNNI, and the memory read bandwidth with 1 and n threads (8-lane loads:
 * the rate memory delivers, on every CPU). */
#include "peaks.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { CHAINS = 12, ITERS = 20000000 };

double nm_peak_fma_avx2_gflops(void) {
    __m256 acc[CHAINS];
    const __m256 a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(0.9999999f);
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm256_set1_ps((float)c);
    const double t0 = now();
    for (int i = 0; i < ITERS; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    const double dt = now() - t0;
    float sink = 0, lanes[8];
    for (int c = 0; c < CHAINS; c++) {
        _mm256_storeu_ps(lanes, acc[c]);
        sink += lanes[0];
    }
    if (sink == 12345.0f) return 0; /* keeps the loop alive */
    return (double)ITERS * CHAINS * 8 * 2 / dt * 1e-9;
}

/* int8 products as the avx2 variant's Q8_0 matmul makes them, with no
 * VNNI: per 32 signed products the activation codes take the weight's sign
 * (flip 0: vpsignb, as its tiles of one to four rows do; flip 1: vpxor with
 * the mask of the weight's negative codes, as its tiles over a panel do,
 * see avx2-int8.c), then a vpmaddubsw (|w| times them, pairs summed into
 * int16), a vpmaddwd (pairs of those into int32) and a vpaddd; 6
 * independent accumulators. The empty asm makes the weights new to the
 * compiler each iteration, so nothing is hoisted out of the loop. 2 ops
 * per product. */
static inline __attribute__((always_inline)) double int8_rate(int flip) {
    enum { ACC = 6 };
    __m256i acc[ACC], x[ACC]; /* a code vector per accumulator: nothing to share */
    __m256i w = _mm256_set1_epi8(-3), aw = _mm256_abs_epi8(w);
    __m256i neg = _mm256_cmpgt_epi8(_mm256_setzero_si256(), w);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = 0; c < ACC; c++)
        acc[c] = _mm256_setzero_si256();
    for (int c = 0; c < ACC; c++)
        x[c] = _mm256_set1_epi8((char)(5 + c));
    const double t0 = now();
    for (int i = 0; i < ITERS; i++) {
        __asm__("" : "+x"(w), "+x"(neg), "+x"(aw));
        for (int c = 0; c < ACC; c++) {
            const __m256i xs = flip ? _mm256_xor_si256(x[c], neg) : _mm256_sign_epi8(x[c], w);
            const __m256i p = _mm256_maddubs_epi16(aw, xs);
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, ones));
        }
    }
    const double dt = now() - t0;
    int32_t sink = 0, lanes[8];
    for (int c = 0; c < ACC; c++) {
        _mm256_storeu_si256((__m256i *)lanes, acc[c]);
        sink += lanes[0];
    }
    if (sink == 12345) return 0; /* keeps the loop alive */
    return (double)ITERS * ACC * 32 * 2 / dt * 1e-9;
}

/* flip a constant in each call: no branch in the measured loop */
double nm_peak_int8_avx2_gops(int flip) { return flip ? int8_rate(1) : int8_rate(0); }

typedef struct bw_arg {
    const float *p;
    size_t n;
    float sum;
} bw_arg;

static void *bw_read(void *q) {
    bw_arg *a = q;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= a->n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a->p + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a->p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a->p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a->p + i + 24));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    a->sum = lanes[0];
    return NULL;
}

double nm_peak_read_gbs(int n_threads) {
    const size_t n = (size_t)1 << 28; /* 1 GiB of floats, far past the caches */
    float *p = malloc(n * sizeof(float));
    if (!p) return 0;
    /* distinct non-zero values: pages of zeros may be shared or never
     * backed by memory (a hypervisor can map them all to one page) */
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(i & 1023);
    bw_arg args[64];
    pthread_t th[64];
    if (n_threads > 64) n_threads = 64;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = now();
        for (int t = 0; t < n_threads; t++) {
            args[t] =
                (bw_arg){.p = p + n / (size_t)n_threads * (size_t)t, .n = n / (size_t)n_threads};
            pthread_create(&th[t], NULL, bw_read, &args[t]);
        }
        for (int t = 0; t < n_threads; t++)
            pthread_join(th[t], NULL);
        const double gbs = (double)n * sizeof(float) / (now() - t0) * 1e-9;
        if (gbs > best) best = gbs;
    }
    free(p);
    return best;
}
#else
double nm_peak_fma_avx2_gflops(void) { return 0; }
double nm_peak_int8_avx2_gops(int flip) {
    (void)flip;
    return 0;
}
double nm_peak_read_gbs(int n_threads) {
    (void)n_threads;
    return 0;
}
#endif
