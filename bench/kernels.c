/* nm_bench_kernels: every matmul variant this CPU runs, validated against
 * the reference on the timed shapes (tolerance as tests/test_kernels_variants.c),
 * then timed on one thread: prefill GEMMs of expert shape (64 and 512 rows)
 * and decode GEMVs whose weights do not fit in the caches (one large matrix,
 * and 128 distinct expert-sized ones one after another). Reports GFLOP/s and weight GB/s
 * against this machine's measured peaks.
 * Usage: nm_bench_kernels [REPS [TYPE [VARIANT [MxNxK[xE]]]]] (TYPE, VARIANT:
 * only those, "all" for every one; MxNxK: that one shape instead, xE: over
 * E distinct matrices one after another, as a layer's experts), or
 * nm_bench_kernels REPS swiglu TYPE VARIANT MxNxK: gate and up as two
 * matmuls against the fused nm_matmul_swiglu_forward (bench_swiglu), or
 * nm_bench_kernels REPS attention T HEADS KV HD: the blocked attention's
 * 8- and 16-lane builds (bench_attention). */
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

/* CPU time of the calling thread: on a shared machine, time the thread
 * was not running does not count. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
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

/* An f16 scale of magnitude lo at p. */
static void put_scale(uint8_t *p, float lo) {
    uint16_t h = nm_f32_to_f16(lo * (1.5f + 0.5f * frand()));
    memcpy(p, &h, 2);
}

static uint8_t *make_weights(uint32_t type, int64_t n, int64_t k, size_t *row_bytes) {
    nm_dtype_row_bytes(type, k, row_bytes);
    uint8_t *w = malloc((size_t)n * *row_bytes);
    const nm_dtype_traits *tr = nm_dtype_traits_of(type);
    for (int64_t j = 0; j < n; j++) {
        uint8_t *row = w + (size_t)j * *row_bytes;
        if (tr->block_size > 1) {
            /* quantised: random codes, then scales of a sensible size */
            for (size_t i = 0; i < *row_bytes; i++) {
                frand();
                row[i] = (uint8_t)(rng >> 40);
            }
            for (int64_t b = 0; b < k / tr->block_size; b++) {
                uint8_t *blk = row + b * tr->block_bytes;
                if (type == NM_DTYPE_Q6_K) {
                    put_scale(blk + NM_Q6_K_BYTES - 2, 0.0005f);
                } else if (type == NM_DTYPE_MXFP4) { /* 2^-6 .. 2^-4 */
                    frand();
                    blk[0] = (uint8_t)(122 + (rng >> 40) % 3);
                } else {
                    put_scale(blk, type == NM_DTYPE_Q8_0 || type == NM_DTYPE_Q4_0 ? 0.01f : 0.001f);
                    if (type == NM_DTYPE_Q4_K || type == NM_DTYPE_Q5_K) put_scale(blk + 2, 0.01f);
                }
            }
            continue;
        }
        for (int64_t q = 0; q < k; q++) {
            const float v = frand();
            if (type == NM_DTYPE_F32) {
                memcpy(row + 4 * q, &v, 4);
            } else {
                uint16_t h = type == NM_DTYPE_F16 ? nm_f32_to_f16(v) : nm_f32_to_bf16(v);
                memcpy(row + 2 * q, &h, 2);
            }
        }
    }
    return w;
}

/* The tolerance terms of y[m][n] = x w^T, computed once per shape: mag =
 * sum |x w| (a float sum of K terms errs by K u mag, two of them 2 K u mag);
 * for variants that quantise activations to int8 blocks of 32 (scale d =
 * max|x| / 127), step = sum |w| d (1/2 + 2^-14) + (n_blocks + 2) u
 * sum |w| (|x| + d), as tests/test_kernels_variants.c derives. */
typedef struct tolerance {
    double *mag;  /* [m][n] */
    double *step; /* [m][n] */
} tolerance;

static tolerance tolerance_of(const nm_mat *w, const float *x, int64_t m) {
    const int64_t n = w->n, k = w->k;
    tolerance t = {malloc((size_t)(m * n) * sizeof(double)),
                   malloc((size_t)(m * n) * sizeof(double))};
    float *wf = malloc((size_t)k * sizeof(float));
    float *d = malloc((size_t)(m * (k / 32 + 1)) * sizeof(float)); /* [m][k / 32] */
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < k / 32; b++) {
            float amax = 0;
            for (int q = 0; q < 32; q++)
                amax = fmaxf(amax, fabsf(x[i * k + 32 * b + q]));
            d[i * (k / 32) + b] = amax / 127.0f;
        }
    for (int64_t j = 0; j < n; j++) {
        nm_dequantize_row((nm_dtype)w->type, (const uint8_t *)w->data + (size_t)j * w->row_bytes,
                          wf, k);
        for (int64_t i = 0; i < m; i++) {
            double mag = 0, step = 0, qmag = 0;
            const float *xi = x + i * k, *di = d + i * (k / 32);
            for (int64_t q = 0; q < k; q++) {
                const double aw = fabs((double)wf[q]), db = q / 32 < k / 32 ? di[q / 32] : 0;
                mag += aw * fabs((double)xi[q]);
                step += aw * db;
                qmag += aw * (fabs((double)xi[q]) + db);
            }
            t.mag[i * n + j] = mag;
            t.step[i * n + j] = step * (0.5 + 0x1.0p-14) + (double)(k / 32 + 2) * 0x1.0p-24 * qmag;
        }
    }
    free(wf);
    free(d);
    return t;
}

/* Outputs of the active variant outside the tolerance against yr. */
static int validate(const nm_mat *w, const float *x, int64_t m, float *y, const float *yr,
                    const tolerance *t, double extra_rel, int quantised) {
    nm_matmul_forward(w, x, w->k, m, y, w->n, 0, w->n);
    int bad = 0;
    for (int64_t i = 0; i < m * w->n; i++) {
        const double tol = (2.0 * (double)w->k * 0x1.0p-24 + extra_rel) * t->mag[i] +
                           (quantised ? t->step[i] : 0.0) + 1e-30;
        if (!(fabs((double)y[i] - yr[i]) <= tol)) bad++;
    }
    return bad;
}

typedef struct bench_test {
    const char *name;
    int64_t m, n, k, n_mat;
} bench_test;

static double fma_peak, read_peak; /* GFLOP/s and GB/s of one core, 0 if not measured */

/* Validates the active variant on w (n_mat matrices one after another from
 * w->data), times it and prints its row; 1 if invalid. */
static int run_test(const char *variant, const bench_test *bt, const nm_mat *w, const float *x,
                    float *y, const float *yr, const tolerance *tol, double extra, int quantised,
                    int reps) {
    const int64_t m = bt->m, n = bt->n, k = bt->k, n_mat = bt->n_mat;
    const int bad = validate(w, x, m, y, yr, tol, extra, quantised);
    double ms[1000], cpu_ms[1000];
    for (int r = 0; r < reps; r++) {
        const double t0 = now(), c0 = cpu_now();
        for (int64_t e = 0; e < n_mat; e++) {
            nm_mat we = *w;
            we.data = (const uint8_t *)w->data + (size_t)(e * n) * w->row_bytes;
            nm_matmul_forward(&we, x, k, m, y, n, 0, n);
        }
        ms[r] = (now() - t0) * 1e3;
        cpu_ms[r] = (cpu_now() - c0) * 1e3;
    }
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_double);
    qsort(cpu_ms, (size_t)reps, sizeof cpu_ms[0], cmp_double);
    const double med = ms[reps / 2];
    const double gflops = 2.0 * (double)(m * n * k * n_mat) / (med * 1e-3) * 1e-9;
    const double gbs = (double)(n * n_mat) * (double)w->row_bytes / (med * 1e-3) * 1e-9;
    char shape[64];
    snprintf(shape, sizeof shape, n_mat > 1 ? "%lld x %lld x %lld (x %lld)" : "%lld x %lld x %lld",
             (long long)m, (long long)n, (long long)k, (long long)n_mat);
    printf("| %s | %s | %s | %s | %s | %.3f | %.3f | %.1f | %.0f%% | %.1f | %.0f%% |\n", variant,
           nm_dtype_name(w->type), bt->name, shape, bad ? "FAIL" : "ok", med, cpu_ms[reps / 2],
           gflops, fma_peak > 0 ? 100.0 * gflops / fma_peak : 0.0, gbs,
           read_peak > 0 ? 100.0 * gbs / read_peak : 0.0);
    fflush(stdout);
    return bad != 0;
}

/* Memory for weights in a variant's layout, on a cache line as
 * nm_kernels_prepare places them (malloc's large blocks start 16 bytes
 * into a page, which splits many of the kernels' vector loads). */
static uint8_t *copy_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* nm_bench_kernels REPS swiglu TYPE VARIANT MxNxK: gate and up (N x K
 * each, in the variant's own layout where it has one) over m rows, then
 * SwiGLU, as two matmuls (nm_matmul_swiglu_by) and as the fused
 * nm_matmul_swiglu_forward, alternated rep by rep; checks the same bits;
 * prints the medians of the thread's CPU ms and their ratio. */
static int bench_swiglu(int reps, const char *type_name, const char *isa_name, const char *shape) {
    long long m, n, k;
    nm_kernels_isa isa;
    uint32_t type = NM_DTYPE_COUNT;
    for (uint32_t t = 0; t < NM_DTYPE_COUNT; t++)
        if (nm_dtype_is_supported(t) && strcmp(nm_dtype_name(t), type_name) == 0) type = t;
    if (type == NM_DTYPE_COUNT || !nm_kernels_isa_parse(isa_name, &isa) || !nm_kernels_force(isa) ||
        sscanf(shape, "%lldx%lldx%lld", &m, &n, &k) != 3 || m < 1 || n < 1 || k < 32 ||
        k % nm_dtype_traits_of(type)->block_size != 0 || reps < 1) {
        fprintf(stderr, "usage: nm_bench_kernels REPS swiglu TYPE VARIANT MxNxK (K a multiple "
                        "of the type's block)\n");
        return 2;
    }
    size_t rb;
    uint8_t *wd = make_weights(type, 2 * n, k, &rb);
    nm_mat wg = {.data = wd, .type = type, .n = n, .k = k, .row_bytes = rb}, wu = wg;
    wu.data = wd + (size_t)n * rb;
    uint8_t *pd = NULL;
    if (nm_mat_repack_wanted(&wg)) {
        pd = copy_alloc(2 * (size_t)n * rb);
        wg = nm_mat_repack(&wg, pd);
        wu = nm_mat_repack(&wu, pd + (size_t)n * rb);
    }
    float *x = malloc((size_t)(m * k) * sizeof(float));
    float *h1 = malloc((size_t)(m * n) * sizeof(float)),
          *h2 = malloc((size_t)(m * n) * sizeof(float));
    float *u = malloc((size_t)(m * n) * sizeof(float));
    double *t1 = malloc((size_t)reps * sizeof(double)), *t2 = malloc((size_t)reps * sizeof(double));
    for (long long i = 0; i < m * k; i++)
        x[i] = frand();
    for (int r = -1; r < reps; r++) { /* one untimed round first */
        double t0 = cpu_now();
        nm_matmul_swiglu_by(nm_matmul_forward, &wg, &wu, x, k, m, h1, n, u, n, 0, n);
        const double a = cpu_now() - t0;
        t0 = cpu_now();
        nm_matmul_swiglu_forward(&wg, &wu, x, k, m, h2, n, u, n, 0, n);
        const double b = cpu_now() - t0;
        if (r >= 0) t1[r] = a * 1e3, t2[r] = b * 1e3;
    }
    const int same = memcmp(h1, h2, (size_t)(m * n) * sizeof(float)) == 0;
    qsort(t1, (size_t)reps, sizeof *t1, cmp_double);
    qsort(t2, (size_t)reps, sizeof *t2, cmp_double);
    printf(
        "| %s | %s%s | %lld x %lld x %lld | two matmuls %.3f ms | fused %.3f ms | %.2fx | %s |\n",
        isa_name, type_name, pd ? " (repacked)" : "", m, n, k, t1[reps / 2], t2[reps / 2],
        t1[reps / 2] / t2[reps / 2], same ? "same bits" : "BITS DIFFER");
    free(wd);
    free(pd);
    free(x);
    free(h1);
    free(h2);
    free(u);
    free(t1);
    free(t2);
    return same ? 0 : 1;
}

/* nm_bench_kernels REPS attention T HEADS KV HD: the causal attention of
 * a prefill of T positions (F32 cache, HEADS query and KV key-value heads
 * of HD) in calls of nm_attention_rows_per_call rows as the engine makes
 * them, by the blocked kernel's 8-lane and 16-lane builds alternated rep by
 * rep on one thread; checks the same bits; prints the medians of the
 * thread's CPU ms and their ratio. */
static int bench_attention(int reps, int argc, char **argv) {
#if !defined(__x86_64__)
    (void)reps, (void)argc, (void)argv;
    fprintf(stderr, "nm_bench_kernels attention: the blocked attention is x86-64's\n");
    return 2;
#else
    int t = 0, nh = 0, nkv = 0, hd = 0;
    if (argc != 7 || (t = atoi(argv[3])) < 1 || t > 65536 || (nh = atoi(argv[4])) < 1 ||
        (nkv = atoi(argv[5])) < 1 || nh % nkv != 0 || (hd = atoi(argv[6])) < 1 ||
        hd > NM_ATTENTION_HEAD_DIM_MAX || reps < 1 ||
        !nm_kernels_isa_supported(NM_KERNELS_AVX512)) {
        fprintf(stderr,
                "usage: nm_bench_kernels REPS attention T HEADS KV HD (HEADS a multiple "
                "of KV, HD <= %d; needs AVX-512)\n",
                NM_ATTENTION_HEAD_DIM_MAX);
        return 2;
    }
    const int64_t qd = (int64_t)nh * hd, kd = (int64_t)nkv * hd;
    float *q = malloc((size_t)(t * qd) * sizeof(float)),
          *kv = malloc((size_t)(t * kd) * sizeof(float));
    float *o8 = malloc((size_t)(t * qd) * sizeof(float)),
          *o16 = malloc((size_t)(t * qd) * sizeof(float));
    int32_t *kv0 = calloc((size_t)t, sizeof(int32_t)), *n_kv = malloc((size_t)t * sizeof(int32_t));
    double *t1 = malloc((size_t)reps * sizeof(double)), *t2 = malloc((size_t)reps * sizeof(double));
    for (int64_t i = 0; i < t * qd; i++)
        q[i] = frand();
    for (int64_t i = 0; i < t * kd; i++)
        kv[i] = frand();
    for (int i = 0; i < t; i++)
        n_kv[i] = i + 1;
    const int32_t per = nm_attention_rows_per_call(nh, nkv);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int r = -1; r < reps; r++) { /* one untimed round first */
        double t0 = cpu_now();
        for (int32_t i = 0; i < t; i += per)
            nm_attention_blocked_forward(q + i * qd, qd, kv, kv, false, kd, kv0 + i, n_kv + i,
                                         t - i < per ? t - i : per, nh, nkv, hd, scale, NULL,
                                         o8 + i * qd, qd);
        const double a = cpu_now() - t0;
        t0 = cpu_now();
        for (int32_t i = 0; i < t; i += per)
            nm_attention_blocked16_forward(q + i * qd, qd, kv, kv, false, kd, kv0 + i, n_kv + i,
                                           t - i < per ? t - i : per, nh, nkv, hd, scale, NULL,
                                           o16 + i * qd, qd);
        const double b = cpu_now() - t0;
        if (r >= 0) t1[r] = a * 1e3, t2[r] = b * 1e3;
    }
    const int same = memcmp(o8, o16, (size_t)(t * qd) * sizeof(float)) == 0;
    qsort(t1, (size_t)reps, sizeof *t1, cmp_double);
    qsort(t2, (size_t)reps, sizeof *t2, cmp_double);
    printf("| attention | T %d, %d/%d heads x %d, %d rows a call | 8 lanes %.3f ms | 16 lanes %.3f "
           "ms | %.2fx | %s |\n",
           t, nh, nkv, hd, per, t1[reps / 2], t2[reps / 2], t1[reps / 2] / t2[reps / 2],
           same ? "same bits" : "BITS DIFFER");
    free(q), free(kv), free(o8), free(o16), free(kv0), free(n_kv), free(t1), free(t2);
    return same ? 0 : 1;
#endif
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (argc > 2 && strcmp(argv[2], "attention") == 0) return bench_attention(reps, argc, argv);
    if (argc > 2 && strcmp(argv[2], "swiglu") == 0)
        return bench_swiglu(reps, argc > 3 ? argv[3] : "", argc > 4 ? argv[4] : "",
                            argc > 5 ? argv[5] : "");
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: nm_bench_kernels [REPS in 1..1000 [TYPE [VARIANT [MxNxK[xE]]]]]\n");
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
    double fma = 0, bf16 = 0, vnni = 0, i8avx2 = 0, i8flip = 0, bw1 = 0, bw2 = 0, tbf16 = 0,
           tint8 = 0;
    const char *fma_isa = ""; /* " (AVX2)" where the FMA peak is the 8-lane one */
    if (peaks && nm_kernels_isa_supported(NM_KERNELS_AVX512)) {
        fma = nm_peak_fma_gflops();
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512bf16")) bf16 = nm_peak_bf16_dot_gflops();
        if (__builtin_cpu_supports("avx512vnni")) vnni = nm_peak_vnni_gops();
        if (nm_kernels_amx_hardware()) {
            tbf16 = nm_peak_amx_bf16_gflops();
            tint8 = nm_peak_amx_int8_gops();
        }
        bw1 = nm_peak_read_gbs(1);
        bw2 = nm_peak_read_gbs(2);
    } else if (peaks && nm_kernels_isa_supported(NM_KERNELS_AVX2)) {
        fma_isa = " (AVX2)";
        fma = nm_peak_fma_avx2_gflops();
        bw1 = nm_peak_read_gbs(1);
        bw2 = nm_peak_read_gbs(2);
    }
    /* the avx2 variant's Q8_0 products, with vpsignb and with vpxor (every
     * x86 variant's CPU runs them) */
    if (peaks && nm_kernels_isa_supported(NM_KERNELS_AVX2)) {
        i8avx2 = nm_peak_int8_avx2_gops(0);
        i8flip = nm_peak_int8_avx2_gops(1);
    }
    printf("# peaks (one core): FP32 FMA%s %.1f GFLOP/s, BF16 dot (vdpbf16ps) %.1f GFLOP/s, "
           "int8 VNNI (vpdpbusd) %.1f GOP/s, int8 AVX2 (vpsignb or vpxor, vpmaddubsw, vpmaddwd, "
           "vpaddd) %.1f or %.1f GOP/s; memory read %.1f GB/s (1 thread), %.1f GB/s (2)\n",
           fma_isa, fma, bf16, vnni, i8avx2, i8flip, bw1, bw2);
    printf("# AMX tile peaks (one core): tdpbf16ps %.1f GFLOP/s, tdpbssd %.1f GOP/s%s\n", tbf16,
           tint8, nm_kernels_amx_hardware() ? "" : " (no AMX here)");
    fma_peak = fma;
    read_peak = bw1;
    const char *only_type = argc > 2 && strcmp(argv[2], "all") != 0 ? argv[2] : NULL;
    const char *only_isa = argc > 3 && strcmp(argv[3], "all") != 0 ? argv[3] : NULL;
    printf(
        "| variant | type | test | m x N x K | valid | ms (median) | cpu ms (median) | GFLOP/s | "
        "%% FMA peak | weight GB/s | %% read peak |\n"
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|\n");
    const uint32_t types[] = {NM_DTYPE_F32,  NM_DTYPE_F16,  NM_DTYPE_BF16,
                              NM_DTYPE_Q8_0, NM_DTYPE_Q4_0, NM_DTYPE_Q4_K,
                              NM_DTYPE_Q5_K, NM_DTYPE_Q6_K, NM_DTYPE_MXFP4};
    const int n_types = (int)(sizeof types / sizeof types[0]);
    /* n_mat > 1: that many distinct matrices, timed one after another (the
     * decode of a layer's expert down projections: their weights come from
     * memory, not the caches); validated on the first */
    bench_test tests[5] = {{"gemm (expert prefill)", 64, 768, 2048, 1},
                           {"gemm (expert prefill)", 512, 768, 2048, 1},
                           {"gemv (decode)", 1, 16384, 2048, 1},
                           {"gemv (decode, 128 experts)", 1, 768, 2048, 128},
                           {"gemv (decode, 128 experts)", 1, 2048, 768, 128}};
    int n_tests = 5;
    if (argc > 4) {
        long long m, n, k, e = 1; /* MxNxK, or MxNxKxE: E distinct matrices */
        const int got = sscanf(argv[4], "%lldx%lldx%lldx%lld", &m, &n, &k, &e);
        if ((got != 3 && got != 4) || m < 1 || n < 1 || k < 32 || k % 32 != 0 || e < 1 ||
            e > 1024 || m * k > (1ll << 28) || n * e * k > (1ll << 32)) {
            fprintf(stderr,
                    "shape %s: want MxNxK or MxNxKxE (E distinct matrices, at most 1024), K "
                    "a multiple of 32 (types of larger blocks are left out where it is not "
                    "one of theirs)\n",
                    argv[4]);
            return 2;
        }
        tests[0].name = m == 1 ? "gemv" : "gemm";
        tests[0].m = m;
        tests[0].n = n;
        tests[0].k = k;
        tests[0].n_mat = e;
        n_tests = 1;
    }
    int failures = 0;
    for (int t = 0; t < n_types; t++)
        for (int s = 0; s < n_tests; s++) {
            if (only_type && strcmp(only_type, nm_dtype_name(types[t])) != 0) continue;
            if (tests[s].k % nm_dtype_traits_of(types[t])->block_size != 0) continue;
            size_t rb;
            const int64_t m = tests[s].m, n = tests[s].n, k = tests[s].k, n_mat = tests[s].n_mat;
            uint8_t *wd = make_weights(types[t], n * n_mat, k, &rb);
            nm_mat w = {.data = wd, .type = types[t], .n = n, .k = k, .row_bytes = rb};
            float *x = malloc((size_t)(m * k) * sizeof(float));
            float *y = malloc((size_t)(m * n) * sizeof(float));
            float *yr = malloc((size_t)(m * n) * sizeof(float));
            for (int64_t i = 0; i < m * k; i++)
                x[i] = frand();
            nm_matmul_ref_forward(&w, x, k, m, yr, n, 0, n);
            tolerance tol = tolerance_of(&w, x, m);
            for (int isa = 0; isa < NM_KERNELS_COUNT; isa++) {
                if (only_isa && strcmp(only_isa, nm_kernels_isa_name((nm_kernels_isa)isa)) != 0)
                    continue;
                if (!nm_kernels_force((nm_kernels_isa)isa)) continue;
                const int bf16_acts = (isa == NM_KERNELS_AVX512BF16 ||
                                       isa == NM_KERNELS_AVX512VNNI || isa == NM_KERNELS_AMX) &&
                                      types[t] == NM_DTYPE_BF16;
                const double extra = bf16_acts ? 0x1.0p-8
                                     : isa == NM_KERNELS_AVX512BF16 && types[t] == NM_DTYPE_Q8_0
                                         ? 0x1.8p-8
                                         : 0.0;
                const int quantised =
                    ((isa == NM_KERNELS_AVX512VNNI || isa == NM_KERNELS_AMX) &&
                     nm_matmul_avx512vnni_quantises(types[t])) ||
                    (isa == NM_KERNELS_AVX2 && nm_matmul_avx2_quantises(types[t]));
                const char *name = nm_kernels_isa_name((nm_kernels_isa)isa);
                failures += run_test(name, &tests[s], &w, x, y, yr, &tol, extra, quantised, reps);
                if (nm_mat_repack_wanted(&w)) {
                    /* the same weights in the variant's own layout */
                    uint8_t *pd = copy_alloc((size_t)(n * n_mat) * rb);
                    nm_mat pw = w;
                    for (int64_t e = 0; e < n_mat; e++) {
                        nm_mat we = w;
                        we.data = wd + (size_t)(e * n) * rb;
                        pw = nm_mat_repack(&we, pd + (size_t)(e * n) * rb);
                    }
                    pw.data = pd;
                    char label[64];
                    snprintf(label, sizeof label, "%s repacked", name);
                    failures +=
                        run_test(label, &tests[s], &pw, x, y, yr, &tol, extra, quantised, reps);
                    free(pd);
                }
            }
            free(tol.mag);
            free(tol.step);
            free(wd);
            free(x);
            free(y);
            free(yr);
        }
    return failures ? 1 : 0;
}
