/* nm_bench_kernels: every matmul variant this CPU runs, validated against
 * the reference on the timed shapes (tolerance as tests/test_kernels_variants.c),
 * then timed on one thread: a prefill GEMM of expert shape and a decode GEMV
 * whose weights do not fit in the caches. Reports GFLOP/s and weight GB/s
 * against this machine's measured peaks.
 * Usage: nm_bench_kernels [REPS [TYPE [VARIANT]]] (TYPE, VARIANT: only those). */
#include "kernels/kernels-impl.h"
#include "peaks.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x853c49e6748fea9bull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint8_t *make_weights(uint32_t type, int64_t n, int64_t k, size_t *row_bytes) {
    nm_dtype_row_bytes(type, k, row_bytes);
    uint8_t *w = malloc((size_t)n * *row_bytes);
    for (int64_t j = 0; j < n; j++) {
        uint8_t *row = w + (size_t)j * *row_bytes;
        for (int64_t q = 0; q < k; q++) {
            const float v = frand();
            if (type == NM_DTYPE_F32) {
                memcpy(row + 4 * q, &v, 4);
            } else if (type == NM_DTYPE_F16 || type == NM_DTYPE_BF16) {
                uint16_t h = type == NM_DTYPE_F16 ? nm_f32_to_f16(v) : nm_f32_to_bf16(v);
                memcpy(row + 2 * q, &h, 2);
            } else if (q % 32 == 0) {
                uint8_t *blk = row + q / 32 * 34;
                uint16_t d = nm_f32_to_f16(0.01f);
                memcpy(blk, &d, 2);
                for (int i = 0; i < 32; i++)
                    blk[2 + i] = (uint8_t)(int8_t)(int)(frand() * 127.0f);
            }
        }
    }
    return w;
}

/* Largest |y - y_ref| over the tolerance 2 K u sum|x w| (approximated with
 * sum|x| max|w| * 2 K u, looser, as the bench does not keep float weights). */
static int validate(const nm_mat *w, const float *x, int64_t m, float *y, float *yr,
                    double extra_rel) {
    nm_matmul_ref_forward(w, x, w->k, m, yr, w->n, 0, w->n);
    nm_matmul_forward(w, x, w->k, m, y, w->n, 0, w->n);
    float *wf = malloc((size_t)w->k * sizeof(float));
    int bad = 0;
    for (int64_t j = 0; j < w->n; j++) {
        nm_dequantize_row((nm_dtype)w->type, (const uint8_t *)w->data + (size_t)j * w->row_bytes,
                          wf, w->k);
        for (int64_t i = 0; i < m; i++) {
            double mag = 0;
            for (int64_t q = 0; q < w->k; q++)
                mag += fabs((double)x[i * w->k + q] * wf[q]);
            if (fabs((double)y[i * w->n + j] - yr[i * w->n + j]) >
                (2.0 * (double)w->k * 0x1.0p-24 + extra_rel) * mag + 1e-30)
                bad++;
        }
    }
    free(wf);
    return bad;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: nm_bench_kernels [REPS in 1..1000]\n");
        return 2;
    }
    printf("# nm_bench_kernels %d\n", reps);
    const int peaks = getenv("NM_BENCH_NO_PEAKS") == NULL; /* set: skip measuring the peaks */
    FILE *ci = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (ci && fgets(line, sizeof line, ci))
        if (strncmp(line, "model name", 10) == 0) {
            printf("# cpu: %s", strchr(line, ':') + 2);
            break;
        }
    if (ci) fclose(ci);
    double fma = 0, bf16 = 0, vnni = 0, bw1 = 0, bw2 = 0;
    if (peaks && nm_kernels_isa_supported(NM_KERNELS_AVX512)) {
        fma = nm_peak_fma_gflops();
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512bf16")) bf16 = nm_peak_bf16_dot_gflops();
        if (__builtin_cpu_supports("avx512vnni")) vnni = nm_peak_vnni_gops();
        bw1 = nm_peak_read_gbs(1);
        bw2 = nm_peak_read_gbs(2);
    }
    printf("# peaks (one core): FP32 FMA %.1f GFLOP/s, BF16 dot (vdpbf16ps) %.1f GFLOP/s, "
           "int8 VNNI (vpdpbusd) %.1f GOP/s; memory read %.1f GB/s (1 thread), %.1f GB/s (2)\n",
           fma, bf16, vnni, bw1, bw2);
    const char *only_type = argc > 2 ? argv[2] : NULL, *only_isa = argc > 3 ? argv[3] : NULL;
    printf("| variant | type | test | m x N x K | valid | ms (median) | GFLOP/s | %% FMA peak | "
           "weight GB/s | %% read peak |\n|---|---|---|---|---|---:|---:|---:|---:|---:|\n");
    const uint32_t types[4] = {NM_DTYPE_F32, NM_DTYPE_F16, NM_DTYPE_BF16, NM_DTYPE_Q8_0};
    const struct {
        const char *name;
        int64_t m, n, k;
    } tests[2] = {{"gemm (expert prefill)", 64, 768, 2048}, {"gemv (decode)", 1, 16384, 2048}};
    int failures = 0;
    for (int t = 0; t < 4; t++)
        for (int s = 0; s < 2; s++) {
            if (only_type && strcmp(only_type, nm_dtype_name(types[t])) != 0) continue;
            size_t rb;
            const int64_t m = tests[s].m, n = tests[s].n, k = tests[s].k;
            uint8_t *wd = make_weights(types[t], n, k, &rb);
            nm_mat w = {.data = wd, .type = types[t], .n = n, .k = k, .row_bytes = rb};
            float *x = malloc((size_t)(m * k) * sizeof(float));
            float *y = malloc((size_t)(m * n) * sizeof(float));
            float *yr = malloc((size_t)(m * n) * sizeof(float));
            for (int64_t i = 0; i < m * k; i++)
                x[i] = frand();
            for (int isa = 0; isa < NM_KERNELS_COUNT; isa++) {
                if (only_isa && strcmp(only_isa, nm_kernels_isa_name((nm_kernels_isa)isa)) != 0)
                    continue;
                if (!nm_kernels_force((nm_kernels_isa)isa)) continue;
                const double extra = isa != NM_KERNELS_AVX512BF16 ? 0.0
                                     : types[t] == NM_DTYPE_BF16  ? 0x1.0p-8
                                     : types[t] == NM_DTYPE_Q8_0  ? 0x1.8p-8
                                                                  : 0.0;
                const int bad = validate(&w, x, m, y, yr, extra);
                failures += bad != 0;
                double ms[1000];
                for (int r = 0; r < reps; r++) {
                    const double t0 = now();
                    nm_matmul_forward(&w, x, k, m, y, n, 0, n);
                    ms[r] = (now() - t0) * 1e3;
                }
                qsort(ms, (size_t)reps, sizeof ms[0], cmp_double);
                const double med = ms[reps / 2];
                const double gflops = 2.0 * (double)(m * n * k) / (med * 1e-3) * 1e-9;
                const double gbs = (double)n * (double)rb / (med * 1e-3) * 1e-9;
                printf("| %s | %s | %s | %lld x %lld x %lld | %s | %.3f | %.1f | %.0f%% | %.1f | "
                       "%.0f%% |\n",
                       nm_kernels_isa_name((nm_kernels_isa)isa), nm_dtype_name(types[t]),
                       tests[s].name, (long long)m, (long long)n, (long long)k, bad ? "FAIL" : "ok",
                       med, gflops, fma > 0 ? 100.0 * gflops / fma : 0.0, gbs,
                       bw1 > 0 ? 100.0 * gbs / bw1 : 0.0);
                fflush(stdout);
            }
            free(wd);
            free(x);
            free(y);
            free(yr);
        }
    return failures ? 1 : 0;
}
