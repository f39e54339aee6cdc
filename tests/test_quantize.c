/* Quantisation: every type's round trip against closed-form bounds (Q8_0,
 * Q4_0) or its own stored scales plus a plain uniform quantiser of the same
 * grid (K-quants); exactly representable blocks, zero blocks, huge, tiny and
 * non-finite values; llama-quantize's own bytes in the golden vectors
 * reproduced from their dequantised rows; the Q4_K_M mix against llama.cpp's
 * choices; and whole files (keys, types, bytes, threads, every error path,
 * allocation failures). */
#include "harness.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "tensor/tensor.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const nm_dtype all_types[] = {NM_DTYPE_Q8_0, NM_DTYPE_Q4_0, NM_DTYPE_Q4_K, NM_DTYPE_Q5_K,
                                     NM_DTYPE_Q6_K};
enum { N_TYPES = sizeof all_types / sizeof all_types[0] };

static float half_round(float v) { return nm_f16_to_f32(nm_f32_to_f16(v)); }

static double gauss(nm_rng *r) {
    double u = nm_rng_unit(r), v = nm_rng_unit(r);
    return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

/* Distributions weights and activations have: Gaussian, uniform, heavy
 * tailed, all-positive, and blocks of very different amplitude. */
enum { N_SHAPES = 5 };
static void fill(int shape, float scale, float *x, int64_t n, nm_rng *r) {
    for (int64_t i = 0; i < n; i++) {
        double g = gauss(r), v;
        switch (shape) {
        case 0:
            v = g;
            break;
        case 1:
            v = 2.0 * nm_rng_unit(r) - 1.0;
            break;
        case 2:
            v = g * g * g;
            break;
        case 3:
            v = fabs(g) + 0.5;
            break;
        default:
            v = g * (double)(1 << ((i / 32) % 6));
            break;
        }
        x[i] = (float)(v * scale);
    }
}

static size_t row_bytes(nm_dtype t, int64_t n) {
    size_t b = 0;
    NM_ASSERT(nm_dtype_row_bytes(t, n, &b));
    return b;
}

/* ---- closed-form bounds ------------------------------------------------------ */

/* Q8_0: q = round(x / d) with d = amax / 127 (exact; the file holds d16, its
 * half-precision rounding), so |x - d16 q| <= d/2 + 127 |d - d16|, plus the
 * float roundings of x * (1/d) and d16 * q. */
static int check_q8_0(const float *x, const float *y, int64_t n) {
    int bad = 0;
    for (int64_t b = 0; b < n; b += 32) {
        double amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmax(amax, fabs(x[b + i]));
        const double d = amax / 127.0, d16 = half_round((float)(amax / 127.0));
        const double bound = 0.5 * d * (1 + 1e-4) + 127 * fabs(d - d16) + 1e-6 * amax;
        for (int i = 0; i < 32; i++) {
            if (fabs((double)x[b + i] - y[b + i]) > bound) {
                if (bad++ < 3)
                    fprintf(stderr, "  q8_0 element %lld: %.9g -> %.9g, bound %.3g\n",
                            (long long)(b + i), x[b + i], y[b + i], bound);
            }
        }
    }
    return bad;
}

/* Q4_0: d = m / -8 for the value m of largest magnitude; levels (q - 8) d,
 * q in [0, 15], so x / d in [-8, 8] rounds half up to a level, except that
 * x / d > 7.5 (the other sign than m) is clipped to 7: error <= |d|/2, or
 * <= |d| there; plus 8 |d - d16| for the stored scale, plus roundings. */
static int check_q4_0(const float *x, const float *y, int64_t n) {
    int bad = 0;
    for (int64_t b = 0; b < n; b += 32) {
        double amax = 0, m = 0;
        for (int i = 0; i < 32; i++)
            if (fabs(x[b + i]) > amax) amax = fabs(x[b + i]), m = x[b + i];
        const double d = m / -8.0, d16 = half_round((float)(m / -8.0));
        for (int i = 0; i < 32; i++) {
            const double v = d != 0 ? x[b + i] / d : 0;
            const double step = v > 7.5 - 1e-4 ? fabs(d) : 0.5 * fabs(d);
            const double bound = step * (1 + 1e-4) + 8 * fabs(d - d16) + 1e-6 * amax;
            if (fabs((double)x[b + i] - y[b + i]) > bound) {
                if (bad++ < 3)
                    fprintf(stderr, "  q4_0 element %lld: %.9g -> %.9g, bound %.3g\n",
                            (long long)(b + i), x[b + i], y[b + i], bound);
            }
        }
    }
    return bad;
}

/* K-quants, against the scales the block stores: each value must be the
 * nearest level of its group's grid (levels lo + k*step, k = 0..n_levels-1)
 * up to half a step, plus its distance outside the grid when it lies beyond
 * it. This checks the final pass and the bit packing; sse_vs_uniform checks
 * that the scales themselves are good. */
static int grid_violations(const float *x, const float *y, int n, double step, double lo,
                           int n_levels, double amax) {
    int bad = 0;
    const double hi = lo + step * (n_levels - 1);
    const double a = fmin(lo, hi), z = fmax(lo, hi);
    for (int i = 0; i < n; i++) {
        const double outside = fmax(0.0, fmax(a - x[i], x[i] - z));
        const double bound = 0.5 * fabs(step) * (1 + 1e-4) + outside + 1e-6 * amax + 1e-30;
        if (fabs((double)x[i] - y[i]) > bound) {
            if (bad++ < 3)
                fprintf(stderr, "  element %d: %.9g -> %.9g, step %.3g, grid [%.4g, %.4g]\n", i,
                        x[i], y[i], step, a, z);
        }
    }
    return bad;
}

static int check_k(nm_dtype t, const float *x, const float *y, const uint8_t *q, int64_t n) {
    int bad = 0;
    for (int64_t b = 0; b < n / NM_QK_K; b++) {
        const float *xb = x + b * NM_QK_K, *yb = y + b * NM_QK_K;
        double amax = 0;
        for (int i = 0; i < NM_QK_K; i++)
            amax = fmax(amax, fabs(xb[i]));
        if (t == NM_DTYPE_Q6_K) {
            const uint8_t *blk = q + b * NM_Q6_K_BYTES;
            uint16_t h;
            memcpy(&h, blk + 208, 2);
            const double d = nm_f16_to_f32(h);
            for (int j = 0; j < 16; j++) {
                const double s = d * (int8_t)blk[192 + j];
                bad += grid_violations(xb + 16 * j, yb + 16 * j, 16, s, -32 * s, 64, amax);
            }
        } else {
            const uint8_t *blk = q + b * (t == NM_DTYPE_Q4_K ? NM_Q4_K_BYTES : NM_Q5_K_BYTES);
            uint16_t hd, hm;
            memcpy(&hd, blk, 2);
            memcpy(&hm, blk + 2, 2);
            for (int j = 0; j < 8; j++) {
                uint8_t sc, mn;
                nm_k4_scale_min(j, blk + 4, &sc, &mn);
                const double s = (double)nm_f16_to_f32(hd) * sc, m = (double)nm_f16_to_f32(hm) * mn;
                bad += grid_violations(xb + 32 * j, yb + 32 * j, 32, s, -m,
                                       t == NM_DTYPE_Q4_K ? 16 : 32, amax);
            }
        }
    }
    return bad;
}

/* Squared error of a plain quantiser of the same grid (no search, exact
 * scales): K-quants min/max over groups of 32 with 16 or 32 levels, Q6_K
 * absmax over groups of 16 with levels -32..31. */
static double sse_uniform(nm_dtype t, const float *x, int64_t n) {
    const int group = t == NM_DTYPE_Q6_K ? 16 : 32;
    const int n_max = t == NM_DTYPE_Q4_K ? 15 : t == NM_DTYPE_Q5_K ? 31 : 32;
    double sse = 0;
    for (int64_t g = 0; g < n; g += group) {
        double lo = x[g], hi = x[g], amax = 0;
        for (int i = 0; i < group; i++) {
            lo = fmin(lo, x[g + i]);
            hi = fmax(hi, x[g + i]);
            amax = fmax(amax, fabs(x[g + i]));
        }
        lo = fmin(lo, 0.0);
        for (int i = 0; i < group; i++) {
            double v;
            if (t == NM_DTYPE_Q6_K) {
                const double d = amax / n_max;
                v = d ? fmin(fmax(round(x[g + i] / d), -32), 31) * d : 0;
            } else {
                const double d = (hi - lo) / n_max;
                v = d ? round((x[g + i] - lo) / d) * d + lo : lo;
            }
            sse += (x[g + i] - v) * (x[g + i] - v);
        }
    }
    return sse;
}

static void test_round_trip_bounds(void) {
    nm_rng r;
    nm_rng_seed(&r, 20261129);
    enum { N = 256 * 48 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *q = malloc(row_bytes(NM_DTYPE_Q8_0, N));
    /* 1e-5 puts Q8_0/Q4_0 scales among half-precision subnormals; 1e5 is
     * near the top of what Q4_0 holds */
    const float scales[] = {1.0f, 0.02f, 1e-5f, 300.0f};
    for (int ti = 0; ti < N_TYPES; ti++) {
        const nm_dtype t = all_types[ti];
        int bad = 0;
        double worst_ratio = 0;
        for (int shape = 0; shape < N_SHAPES; shape++) {
            for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
                /* at 1e-5 the K-quants' half-precision super-block scales
                 * are subnormal or zero: the grid bound still holds, the
                 * comparison with exact float scales does not apply */
                const bool tiny = scales[si] < 1e-3f;
                fill(shape, scales[si], x, N, &r);
                nm_error err = {0};
                CHECK_INT_EQ(nm_quantize_row(t, x, q, N, &err), NM_OK);
                nm_dequantize_row(t, q, y, N);
                if (t == NM_DTYPE_Q8_0)
                    bad += check_q8_0(x, y, N);
                else if (t == NM_DTYPE_Q4_0)
                    bad += check_q4_0(x, y, N);
                else {
                    bad += check_k(t, x, y, q, N);
                    double sse = 0;
                    for (int i = 0; i < N; i++)
                        sse += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
                    /* the search and the 6/8-bit scales must not lose to the
                     * plain quantiser (measured: 0.47..0.92 of it) */
                    const double ratio = sse / sse_uniform(t, x, N);
                    if (!tiny) {
                        worst_ratio = fmax(worst_ratio, ratio);
                        CHECK(ratio <= 1.0);
                    }
                }
            }
        }
        printf("  %-5s round trip within bounds: %s", nm_dtype_name(t), bad ? "NO" : "yes");
        if (worst_ratio > 0)
            printf(" (squared error <= %.2f x the plain quantiser's)", worst_ratio);
        printf("\n");
        CHECK_INT_EQ(bad, 0);
    }
    free(x);
    free(y);
    free(q);
}

/* ---- exact inputs, zero blocks, extremes ------------------------------------ */

static void test_exact_blocks(void) {
    nm_rng r;
    nm_rng_seed(&r, 7);
    float x[32], y[32];
    uint8_t q[34], want[34];
    int mismatches = 0;
    for (int trial = 0; trial < 2000; trial++) {
        /* a half-precision scale, normal or subnormal, of either sign for Q4_0 */
        const float d16 = half_round((float)(exp(-16 + 24 * nm_rng_unit(&r))));
        const bool q8 = trial % 2 == 0;
        const float d = q8 || trial % 4 == 1 ? d16 : -d16;
        const int peak = (int)(nm_rng_u64(&r) % 32);
        uint16_t h = nm_f32_to_f16(q8 ? d16 : d);
        memcpy(want, &h, 2);
        for (int i = 0; i < 32; i++) {
            int level;
            if (q8) {
                /* the largest magnitude is level +-127, as quantisation makes it */
                level = i == peak ? (nm_rng_u64(&r) & 1 ? 127 : -127)
                                  : (int)(nm_rng_u64(&r) % 255) - 127;
                ((int8_t *)(want + 2))[i] = (int8_t)level;
                x[i] = d16 * (float)level;
            } else {
                /* level 0 (-8 d) is the value of largest magnitude */
                level = i == peak ? 0 : (int)(nm_rng_u64(&r) % 15) + 1;
                x[i] = (float)(level - 8) * d;
                if (i < 16)
                    want[2 + i] = (uint8_t)level;
                else
                    want[2 + i - 16] |= (uint8_t)(level << 4);
            }
        }
        const nm_dtype t = q8 ? NM_DTYPE_Q8_0 : NM_DTYPE_Q4_0;
        CHECK_INT_EQ(nm_quantize_row(t, x, q, 32, NULL), NM_OK);
        nm_dequantize_row(t, q, y, 32);
        const size_t nb = q8 ? 34 : 18;
        if (memcmp(q, want, nb) != 0 || memcmp(x, y, sizeof x) != 0) {
            if (mismatches++ < 3)
                fprintf(stderr, "  exact %s block %d not reproduced (d %g)\n", nm_dtype_name(t),
                        trial, d);
        }
    }
    printf("  exactly representable q8_0/q4_0 blocks come back bit for bit: %s\n",
           mismatches ? "NO" : "yes");
    CHECK_INT_EQ(mismatches, 0);
}

static void test_zero_blocks(void) {
    float zero[NM_QK_K] = {0}, y[NM_QK_K];
    uint8_t q[NM_Q6_K_BYTES];
    for (int ti = 0; ti < N_TYPES; ti++) {
        const nm_dtype t = all_types[ti];
        const int64_t n = t == NM_DTYPE_Q8_0 || t == NM_DTYPE_Q4_0 ? 32 : NM_QK_K;
        memset(q, 0xAB, sizeof q);
        CHECK_INT_EQ(nm_quantize_row(t, zero, q, n, NULL), NM_OK);
        nm_dequantize_row(t, q, y, n);
        int nonzero = 0;
        for (int i = 0; i < n; i++)
            nonzero += y[i] != 0.0f;
        CHECK_INT_EQ(nonzero, 0);
        /* ggml's bytes: scales and levels zero, except Q4_0, whose scale is
         * 0 / -8 = -0 (0x8000) and whose zero is level 8 */
        size_t nb = row_bytes(t, n);
        int off = 0;
        for (size_t i = 0; i < nb; i++) {
            uint8_t want = t != NM_DTYPE_Q4_0 ? 0 : i == 0 ? 0x00 : i == 1 ? 0x80 : 0x88;
            off += q[i] != want;
        }
        CHECK_INT_EQ(off, 0);
    }
    printf("  all-zero blocks: zero scales, zero values\n");
}

/* room for 512 elements of any type (Q8_0 takes the most) */
enum { MAX_BYTES_512 = 512 / 32 * NM_Q8_0_BYTES };

static void expect_refused(nm_dtype t, const float *x, int64_t n, const char *needle) {
    NM_ASSERT(n <= 512);
    uint8_t q[MAX_BYTES_512];
    nm_error err = {0};
    nm_status st = nm_quantize_row(t, x, q, n, &err);
    CHECK_INT_EQ(st, NM_ERR_INVALID_ARG);
    if (!strstr(err.msg, needle)) {
        fprintf(stderr, "  %s: message '%s' lacks '%s'\n", nm_dtype_name(t), err.msg, needle);
        CHECK(strstr(err.msg, needle) != NULL);
    }
}

static void test_extremes(void) {
    float x[2 * NM_QK_K], y[2 * NM_QK_K];
    uint8_t q[MAX_BYTES_512];
    for (int ti = 0; ti < N_TYPES; ti++) {
        const nm_dtype t = all_types[ti];
        const int64_t n = 2 * NM_QK_K;
        /* NaN and infinities: refused, naming the element */
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < n; i++)
                x[i] = (float)((i % 13) - 6);
            x[300] = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
            expect_refused(t, x, n, k == 0 ? "element 300 is NaN" : "element 300 is");
        }
        /* beyond the largest magnitude of the type */
        for (int i = 0; i < n; i++)
            x[i] = 1.0f;
        x[17] = 1e10f;
        expect_refused(t, x, n, "element 17");
        /* tiny values: the scale underflows half precision; the block decodes
         * to (nearly) zero, never to anything larger than its input */
        for (int i = 0; i < n; i++)
            x[i] = (float)((i % 7) - 3) * 1e-30f;
        CHECK_INT_EQ(nm_quantize_row(t, x, q, n, NULL), NM_OK);
        nm_dequantize_row(t, q, y, n);
        int bad = 0;
        for (int i = 0; i < n; i++)
            bad += !(fabsf(y[i] - x[i]) <= 3e-30f);
        CHECK_INT_EQ(bad, 0);
        /* large but representable values keep their relative accuracy */
        for (int i = 0; i < n; i++)
            x[i] = (float)(((i * 37) % 101) - 50) * 1e3f;
        CHECK_INT_EQ(nm_quantize_row(t, x, q, n, NULL), NM_OK);
        nm_dequantize_row(t, q, y, n);
        CHECK_INT_EQ(t == NM_DTYPE_Q8_0   ? check_q8_0(x, y, n)
                     : t == NM_DTYPE_Q4_0 ? check_q4_0(x, y, n)
                                          : check_k(t, x, y, q, n),
                     0);
    }
    /* a Q4_K block whose offset (dmin) overflows half precision while every
     * value is in range: refused by the scale check */
    for (int i = 0; i < NM_QK_K; i++)
        x[i] = i < 32 ? 0.0f : 2e7f;
    x[0] = -6e7f;
    expect_refused(NM_DTYPE_Q4_K, x, NM_QK_K, "half precision");
    printf("  NaN, infinities and out-of-range values refused; tiny and large values fine\n");
}

/* ---- golden vectors ------------------------------------------------------------ */

/* Quantising ggml's dequantised rows of llama-quantize's q8_0 and q4_0
 * tensors gives the file's bytes back (the rows are exactly representable:
 * the scale is recovered exactly from the extreme level); for K-quants,
 * whose refit may pick other scales, the values must stay within the grid
 * bound of what we produce. Rows: dequant.txt (ggml's to_float, printed
 * exactly) for every listed row, then every row of every q8_0/q4_0 tensor
 * via nm_dequantize_row. */
static void test_golden(void) {
    const char *models[] = {"tiny-qwen3moe-q-Q8_0", "tiny-qwen3moe-q-Q4_0",
                            "tiny-qwen3moe-q-Q4_K_M", "tiny-qwen3moe-q-Q6_K"};
    long n_exact = 0, n_exact_bad = 0, n_k = 0, n_k_bad = 0, n_k_same = 0, n_all = 0, n_all_bad = 0;
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s/model.gguf", NM_VECTORS_DIR, models[m]);
        nm_gguf *g = NULL;
        nm_error err = {0};
        if (nm_gguf_open(path, &g, &err) != NM_OK) {
            fprintf(stderr, "  cannot open %s: %s\n", path, err.msg);
            CHECK(0);
            continue;
        }
        snprintf(path, sizeof path, "%s/%s/dequant.txt", NM_VECTORS_DIR, models[m]);
        size_t n_text = 0;
        char *text = (char *)nm_test_read_file(path, &n_text);
        CHECK(text != NULL);
        for (char *line = text, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = '\0';
            char name[128], type[16];
            long row, ne0;
            int used = 0;
            if (sscanf(line, "%127s %15s %ld %ld%n", name, type, &row, &ne0, &used) != 4) continue;
            const nm_gguf_tensor *t = nm_gguf_find_tensor(g, name);
            CHECK(t != NULL && t->ne[0] == ne0 && ne0 <= 4096);
            if (!t || ne0 > 4096 || !nm_quantize_is_supported(t->type)) continue;
            float x[4096], y[4096];
            char *p = line + used;
            for (long i = 0; i < ne0; i++)
                x[i] = strtof(p, &p);
            uint8_t q[4096 * 2];
            const size_t rb = row_bytes((nm_dtype)t->type, ne0);
            const uint8_t *file_row = (const uint8_t *)t->data + (size_t)row * rb;
            CHECK_INT_EQ(nm_quantize_row((nm_dtype)t->type, x, q, ne0, NULL), NM_OK);
            nm_dequantize_row((nm_dtype)t->type, q, y, ne0);
            if (t->type == NM_DTYPE_Q8_0 || t->type == NM_DTYPE_Q4_0) {
                n_exact++;
                if (memcmp(q, file_row, rb) != 0 || memcmp(x, y, (size_t)ne0 * 4) != 0) {
                    if (n_exact_bad++ < 3)
                        fprintf(stderr, "  %s %s row %ld differs\n", models[m], name, row);
                }
            } else {
                n_k++;
                n_k_same += memcmp(q, file_row, rb) == 0;
                int bad = check_k((nm_dtype)t->type, x, y, q, ne0);
                if (bad && n_k_bad++ < 3)
                    fprintf(stderr, "  %s %s row %ld off its grid\n", models[m], name, row);
            }
        }
        free(text);
        /* every row of the q8_0 and q4_0 tensors */
        for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
            const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
            if (t->type != NM_DTYPE_Q8_0 && t->type != NM_DTYPE_Q4_0) continue;
            const size_t rb = row_bytes((nm_dtype)t->type, t->ne[0]);
            const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
            float *x = malloc((size_t)t->ne[0] * sizeof *x);
            uint8_t *q = malloc(rb);
            for (int64_t r = 0; r < rows; r++) {
                const uint8_t *file_row = (const uint8_t *)t->data + (size_t)r * rb;
                nm_dequantize_row((nm_dtype)t->type, file_row, x, t->ne[0]);
                n_all++;
                if (nm_quantize_row((nm_dtype)t->type, x, q, t->ne[0], NULL) != NM_OK ||
                    memcmp(q, file_row, rb) != 0)
                    n_all_bad++;
            }
            free(x);
            free(q);
        }
        nm_gguf_close(g);
    }
    printf("  golden q8_0/q4_0 rows of dequant.txt requantised to llama-quantize's bytes: %ld of "
           "%ld\n",
           n_exact - n_exact_bad, n_exact);
    printf("  every row of the vectors' q8_0/q4_0 tensors requantised to the file's bytes: %ld of "
           "%ld\n",
           n_all - n_all_bad, n_all);
    printf("  golden K-quant rows requantised within their grid bound: %ld of %ld (%ld with "
           "identical bytes)\n",
           n_k - n_k_bad, n_k, n_k_same);
    CHECK(n_exact > 50 && n_all > 10000 && n_k > 20); /* the files were read */
    CHECK_INT_EQ(n_exact_bad, 0);
    CHECK_INT_EQ(n_all_bad, 0);
    CHECK_INT_EQ(n_k_bad, 0);
}

/* ---- the mixes ------------------------------------------------------------------- */

/* llama-quantize Q4_K_M chose the types in the vectors' file (8 experts:
 * attn_k/attn_v q8_0, attn_output q5_K; 2 layers: ffn_down q6_K in layer 1). */
static void test_mix_vectors(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny-qwen3moe-q-Q4_K_M/model.gguf", NM_VECTORS_DIR);
    nm_gguf *g = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_open(path, &g, &err), NM_OK);
    if (!g) return;
    const uint64_t n = nm_gguf_n_tensors(g);
    nm_quant_choice *c = calloc(n, sizeof *c);
    CHECK_INT_EQ(nm_quant_choose(g, NM_QUANT_Q4_K_M, c, &err), NM_OK);
    int differ = 0;
    for (uint64_t i = 0; i < n; i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        if (c[i].type != t->type || c[i].convert) {
            differ++;
            fprintf(stderr, "  %.*s: llama.cpp %s, npumoe %s\n", (int)t->name.len, t->name.ptr,
                    nm_dtype_name(t->type), nm_dtype_name(c[i].type));
        }
    }
    printf(
        "  q4_k_m types of llama-quantize's tiny-qwen3moe-q-Q4_K_M (%llu tensors) reproduced: %s\n",
        (unsigned long long)n, differ ? "NO" : "yes");
    CHECK_INT_EQ(differ, 0);
    free(c);
    nm_gguf_close(g);
}

/* A file of zero-filled F32 tensors with the given names and shapes. */
typedef struct spec {
    const char *name;
    int64_t ne0, ne1, ne2;
} spec;

static nm_gguf *open_synthetic(const char *arch, uint32_t n_layer, uint32_t n_expert,
                               const spec *specs, int n_specs, uint8_t **bytes) {
    nm_gguf_writer *w = nm_gguf_writer_new();
    char key[64];
    nm_gguf_writer_set_str(w, "general.architecture", arch);
    snprintf(key, sizeof key, "%s.block_count", arch);
    nm_gguf_writer_set_u32(w, key, n_layer);
    if (n_expert) {
        snprintf(key, sizeof key, "%s.expert_count", arch);
        nm_gguf_writer_set_u32(w, key, n_expert);
    }
    for (int i = 0; i < n_specs; i++) {
        int64_t ne[3] = {specs[i].ne0, specs[i].ne1, specs[i].ne2};
        uint32_t nd = specs[i].ne2 > 1 ? 3 : specs[i].ne1 > 1 ? 2 : 1;
        size_t nb = (size_t)(ne[0] * ne[1] * ne[2]) * 4;
        float *zeros = calloc(nb, 1);
        CHECK_INT_EQ(nm_gguf_writer_add_tensor(w, specs[i].name, NM_DTYPE_F32, nd, ne, zeros, nb),
                     NM_OK);
        free(zeros);
    }
    size_t n = 0;
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_writer_to_memory(w, bytes, &n, &err), NM_OK);
    nm_gguf_writer_free(w);
    nm_gguf *g = NULL;
    CHECK_INT_EQ(nm_gguf_open_memory(*bytes, n, &g, &err), NM_OK);
    return g;
}

/* 32 layers without experts: llama.cpp's Q4_K_M gives attn_v and ffn_down
 * q6_K in layers 0-3, 6, 9, ..., 27, 28-31 (the well-known pattern of 7B
 * Llama files), q4_K elsewhere; output q6_K (q8_0 for rows not a multiple
 * of 256); token_embd q4_K, or q6_K when it is also the output (tied). */
static void test_mix_rules(void) {
    static const int more[] = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
    spec specs[2 * 32 + 6];
    char names[2 * 32][40];
    int n = 0;
    /* layers written in reverse: the rank comes from llama.cpp's order, not the file's */
    for (int l = 31; l >= 0; l--) {
        snprintf(names[2 * l], 40, "blk.%d.attn_v.weight", l);
        snprintf(names[2 * l + 1], 40, "blk.%d.ffn_down.weight", l);
        specs[n++] = (spec){names[2 * l], 256, 2, 1};
        specs[n++] = (spec){names[2 * l + 1], 512, 2, 1};
    }
    specs[n++] = (spec){"token_embd.weight", 256, 3, 1};
    specs[n++] = (spec){"output.weight", 256, 3, 1};
    specs[n++] = (spec){"blk.0.attn_norm.weight", 256, 1, 1};
    specs[n++] = (spec){"blk.0.ffn_gate_inp.weight", 256, 4, 1};
    specs[n++] = (spec){"blk.0.attn_q.weight", 96, 2, 1}; /* 96: q8_0 fallback */
    specs[n++] = (spec){"blk.0.attn_k.weight", 40, 2, 1}; /* 40: f16 fallback */
    for (int kind = NM_QUANT_Q4_K_M; kind <= NM_QUANT_Q5_K_M; kind++) {
        uint8_t *bytes = NULL;
        nm_gguf *g = open_synthetic("llama", 32, 0, specs, n, &bytes);
        nm_quant_choice c[2 * 32 + 6];
        nm_error err = {0};
        CHECK_INT_EQ(nm_quant_choose(g, (nm_quant_kind)kind, c, &err), NM_OK);
        const uint32_t base = kind == NM_QUANT_Q4_K_M ? NM_DTYPE_Q4_K : NM_DTYPE_Q5_K;
        int bad = 0;
        for (int i = 0; i < 64; i++) {
            const int layer = 31 - i / 2;
            bool is_more = false;
            for (size_t k = 0; k < sizeof more / sizeof more[0]; k++)
                is_more |= more[k] == layer;
            bad += c[i].type != (is_more ? NM_DTYPE_Q6_K : base) || !c[i].convert;
        }
        CHECK_INT_EQ(bad, 0);
        CHECK_INT_EQ(c[64].type, base);          /* token_embd, untied */
        CHECK_INT_EQ(c[65].type, NM_DTYPE_Q6_K); /* output */
        CHECK(!c[66].eligible && c[66].type == NM_DTYPE_F32 && !c[66].convert);
        CHECK(!c[67].eligible && c[67].type == NM_DTYPE_F32);
        CHECK(c[68].type == NM_DTYPE_Q8_0 && c[68].wanted == base);
        CHECK(c[69].type == NM_DTYPE_F16 && c[69].wanted == base && c[69].convert);
        nm_gguf_close(g);
        free(bytes);
    }
    /* the _S mixes: Q4_K_S gives q5_K to the first 4 attn_v and the ffn_down
     * of the first eighth of the layers; Q5_K_S only bumps the output */
    for (int kind = NM_QUANT_Q4_K_S; kind <= NM_QUANT_Q5_K_S; kind++) {
        uint8_t *bytes = NULL;
        nm_gguf *g = open_synthetic("llama", 32, 0, specs, n, &bytes);
        nm_quant_choice c[2 * 32 + 6];
        CHECK_INT_EQ(nm_quant_choose(g, (nm_quant_kind)kind, c, NULL), NM_OK);
        const bool q4 = kind == NM_QUANT_Q4_K_S;
        const uint32_t base = q4 ? NM_DTYPE_Q4_K : NM_DTYPE_Q5_K;
        int bad = 0;
        for (int i = 0; i < 64; i++) {
            const int layer = 31 - i / 2;
            bad += c[i].type != (q4 && layer < 4 ? NM_DTYPE_Q5_K : base) || !c[i].convert;
        }
        CHECK_INT_EQ(bad, 0);
        CHECK_INT_EQ(c[64].type, base);          /* token_embd, untied */
        CHECK_INT_EQ(c[65].type, NM_DTYPE_Q6_K); /* output */
        CHECK(c[68].type == NM_DTYPE_Q8_0 && c[68].wanted == base);
        nm_gguf_close(g);
        free(bytes);
    }
    /* tied output, and an output whose rows 256 does not divide */
    const spec tied[] = {{"token_embd.weight", 256, 3, 1}, {"blk.0.attn_v.weight", 256, 2, 1}};
    const spec narrow[] = {{"output.weight", 96, 3, 1}};
    uint8_t *b1 = NULL, *b2 = NULL;
    nm_gguf *g1 = open_synthetic("llama", 1, 0, tied, 2, &b1);
    nm_gguf *g2 = open_synthetic("llama", 1, 0, narrow, 1, &b2);
    nm_quant_choice c[2];
    CHECK_INT_EQ(nm_quant_choose(g1, NM_QUANT_Q4_K_M, c, NULL), NM_OK);
    CHECK_INT_EQ(c[0].type, NM_DTYPE_Q6_K);
    CHECK_INT_EQ(nm_quant_choose(g2, NM_QUANT_Q4_K_M, c, NULL), NM_OK);
    CHECK_INT_EQ(c[0].type, NM_DTYPE_Q8_0);
    /* single types ignore the mix rules (llama-quantize --pure) */
    CHECK_INT_EQ(nm_quant_choose(g1, NM_QUANT_Q4_0, c, NULL), NM_OK);
    CHECK(c[0].type == NM_DTYPE_Q4_0 && c[1].type == NM_DTYPE_Q4_0);
    nm_gguf_close(g1);
    nm_gguf_close(g2);
    free(b1);
    free(b2);
    /* a mix needs the layer count, and MoE ffn_down tensors need their layer */
    const spec moe[] = {{"ffn_down_exps.weight", 256, 2, 2}};
    uint8_t *b3 = NULL;
    nm_gguf *g3 = open_synthetic("qwen3moe", 2, 4, moe, 1, &b3);
    nm_error err = {0};
    CHECK_INT_EQ(nm_quant_choose(g3, NM_QUANT_Q4_K_M, c, &err), NM_ERR_FORMAT);
    CHECK(strstr(err.msg, "ffn_down_exps.weight") != NULL);
    CHECK_INT_EQ(nm_quant_choose(g3, NM_QUANT_Q8_0, c, &err), NM_OK);
    nm_gguf_close(g3);
    free(b3);

    nm_quant_kind k;
    CHECK_INT_EQ(nm_quant_kind_parse("Q4_K_M", &k, NULL), NM_OK);
    CHECK_INT_EQ(k, NM_QUANT_Q4_K_M);
    CHECK_INT_EQ(nm_quant_kind_parse("q3_k", &k, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "q3_k") && strstr(err.msg, "q5_k_m"));
    CHECK_INT_EQ(nm_quant_file_type(NM_QUANT_Q4_K_M), 15);
    CHECK_INT_EQ(nm_quant_file_type(NM_QUANT_Q8_0), 7);
    printf("  mix rules: use-more-bits layers, output, tied embeddings, fallbacks, kept tensors\n");
}

/* ---- whole files ------------------------------------------------------------------ */

static char tmp_dir[256];

static void tmp_path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", tmp_dir, name);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* No "*.tmp-*" left behind in the directory. */
static int leftovers(void) {
    DIR *d = opendir(tmp_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strstr(e->d_name, ".tmp-") != NULL;
    if (d) closedir(d);
    return n;
}

typedef enum { SRC_F32, SRC_F16, SRC_BF16 } src_type;

typedef struct src_tensor {
    const char *name;
    src_type type;
    int64_t ne[3];
    uint32_t n_dims;
} src_tensor;

static const src_tensor src_tensors[] = {
    {"token_embd.weight", SRC_F16, {256, 6, 1}, 2},
    {"blk.0.attn_norm.weight", SRC_F32, {256, 1, 1}, 1},
    {"blk.0.attn_q.weight", SRC_BF16, {256, 4, 1}, 2},
    {"blk.0.ffn_gate_inp.weight", SRC_F32, {256, 2, 1}, 2},
    {"blk.0.ffn_up_exps.weight", SRC_F32, {64, 3, 2}, 3},
    {"blk.0.ffn_down_exps.weight", SRC_BF16, {48, 4, 2}, 3},
    {"output.weight", SRC_F32, {256, 6, 1}, 2},
};
enum { N_SRC = sizeof src_tensors / sizeof src_tensors[0] };

/* A small model file with every input type, kept tensors and fallbacks;
 * poison puts bad_value at row 3, column 5 of tensor poison_tensor. */
static void write_source(const char *path, int poison_tensor, float bad_value, bool split) {
    nm_gguf_writer *w = nm_gguf_writer_new();
    nm_gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    nm_gguf_writer_set_u32(w, "general.file_type", 1);
    nm_gguf_writer_set_u32(w, "qwen3moe.block_count", 1);
    nm_gguf_writer_set_u32(w, "qwen3moe.expert_count", 2);
    nm_gguf_writer_set_f32(w, "qwen3moe.rope.freq_base", 1e6f);
    const char *tokens[] = {"a", "b", "<|im_end|>"};
    nm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 3);
    if (split) nm_gguf_writer_set_u32(w, "split.count", 2);
    nm_rng r;
    nm_rng_seed(&r, 99);
    for (int i = 0; i < N_SRC; i++) {
        const src_tensor *s = &src_tensors[i];
        const int64_t n = s->ne[0] * s->ne[1] * s->ne[2];
        float *x = malloc((size_t)n * sizeof *x);
        for (int64_t j = 0; j < n; j++)
            x[j] = (float)(0.05 * gauss(&r));
        if (i == poison_tensor) x[3 * s->ne[0] + 5] = bad_value;
        const size_t elem = s->type == SRC_F32 ? 4 : 2;
        uint8_t *data = malloc((size_t)n * elem);
        for (int64_t j = 0; j < n; j++) {
            if (s->type == SRC_F32) memcpy(data + 4 * j, &x[j], 4);
            uint16_t h = s->type == SRC_F16 ? nm_f32_to_f16(x[j]) : nm_f32_to_bf16(x[j]);
            if (s->type != SRC_F32) memcpy(data + 2 * j, &h, 2);
        }
        const uint32_t type = s->type == SRC_F32   ? NM_DTYPE_F32
                              : s->type == SRC_F16 ? NM_DTYPE_F16
                                                   : NM_DTYPE_BF16;
        CHECK_INT_EQ(
            nm_gguf_writer_add_tensor(w, s->name, type, s->n_dims, s->ne, data, (uint64_t)n * elem),
            NM_OK);
        free(x);
        free(data);
    }
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_writer_write_file(w, path, &err), NM_OK);
    nm_gguf_writer_free(w);
}

static int n_progress;
static void count_progress(void *ctx, const nm_quant_progress *p) {
    (void)ctx;
    CHECK_INT_EQ(p->index, n_progress);
    n_progress++;
}

static nm_status quantize(const char *in, const char *out, nm_quant_kind kind, int threads,
                          nm_error *err) {
    nm_quant_params p = nm_quant_default_params();
    p.kind = kind;
    p.n_threads = threads;
    p.progress = count_progress;
    n_progress = 0;
    return nm_quantize_file(in, out, &p, NULL, err);
}

/* The output against the input: keys, file type, and each tensor's type and
 * bytes from nm_quant_choose and nm_quantize_row (or f16 conversion, or the
 * input's bytes). */
static void check_output(const char *in_path, const char *out_path, nm_quant_kind kind) {
    nm_gguf *gi = NULL, *go = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_gguf_open(in_path, &gi, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_open(out_path, &go, &err), NM_OK);
    if (!gi || !go) return;
    CHECK_INT_EQ(nm_gguf_n_kv(go), nm_gguf_n_kv(gi) + 1); /* + quantization_version */
    uint32_t u = 0;
    nm_gguf_str s;
    float f = 0;
    CHECK(nm_gguf_get_u32(go, "general.file_type", &u, NULL) == NM_OK &&
          u == nm_quant_file_type(kind));
    CHECK(nm_gguf_get_u32(go, "general.quantization_version", &u, NULL) == NM_OK && u == 2);
    CHECK(nm_gguf_get_str(go, "general.architecture", &s, NULL) == NM_OK &&
          nm_gguf_str_eq(s, "qwen3moe"));
    CHECK(nm_gguf_get_f32(go, "qwen3moe.rope.freq_base", &f, NULL) == NM_OK && f == 1e6f);
    const nm_gguf_value *arr = NULL;
    CHECK(nm_gguf_get_arr(go, "tokenizer.ggml.tokens", NM_GGUF_STRING, &arr, NULL) == NM_OK &&
          arr->v.arr.n == 3 && nm_gguf_str_eq(nm_gguf_arr_str(arr, 2), "<|im_end|>"));
    /* key order kept: the first keys are the input's */
    CHECK(nm_gguf_str_eq(nm_gguf_kv_at(go, 0)->key, "general.architecture"));
    CHECK(nm_gguf_str_eq(nm_gguf_kv_at(go, 1)->key, "general.file_type"));

    nm_quant_choice c[N_SRC];
    CHECK_INT_EQ(nm_quant_choose(gi, kind, c, &err), NM_OK);
    CHECK_INT_EQ(nm_gguf_n_tensors(go), N_SRC);
    int bad = 0;
    for (int i = 0; i < N_SRC && nm_gguf_n_tensors(go) == N_SRC; i++) {
        const nm_gguf_tensor *ti = nm_gguf_tensor_at(gi, (uint64_t)i),
                             *to = nm_gguf_tensor_at(go, (uint64_t)i);
        bad += !nm_gguf_str_eq(to->name, src_tensors[i].name) || to->type != c[i].type ||
               to->n_dims != ti->n_dims || memcmp(to->ne, ti->ne, sizeof to->ne) != 0;
        const int64_t cols = ti->ne[0], rows = ti->ne[1] * ti->ne[2] * ti->ne[3];
        const size_t rb = row_bytes((nm_dtype)c[i].type, cols);
        uint8_t *want = malloc(rb * (size_t)rows);
        float *x = malloc((size_t)cols * sizeof *x);
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *src =
                (const uint8_t *)ti->data + (size_t)r * row_bytes((nm_dtype)ti->type, cols);
            uint8_t *dst = want + (size_t)r * rb;
            nm_dequantize_row((nm_dtype)ti->type, src, x, cols);
            if (!c[i].convert)
                memcpy(dst, src, rb);
            else if (c[i].type == NM_DTYPE_F16)
                for (int64_t j = 0; j < cols; j++) {
                    uint16_t h = nm_f32_to_f16(x[j]);
                    memcpy(dst + 2 * j, &h, 2);
                }
            else
                CHECK_INT_EQ(nm_quantize_row((nm_dtype)c[i].type, x, dst, cols, NULL), NM_OK);
        }
        if (to->n_bytes != rb * (size_t)rows || memcmp(to->data, want, rb * (size_t)rows) != 0) {
            bad++;
            fprintf(stderr, "  %s: tensor %s has other bytes\n", nm_quant_kind_name(kind),
                    src_tensors[i].name);
        }
        free(want);
        free(x);
    }
    CHECK_INT_EQ(bad, 0);
    nm_gguf_close(gi);
    nm_gguf_close(go);
}

static void expect_file_error(const char *what, nm_status st, const nm_error *err, nm_status want,
                              const char *needle, const char *out) {
    printf("  %-36s -> [%s] %s\n", what, nm_status_str(st), err->msg);
    CHECK_INT_EQ(st, want);
    if (!strstr(err->msg, needle)) {
        fprintf(stderr, "  %s: message lacks '%s'\n", what, needle);
        CHECK(strstr(err->msg, needle) != NULL);
    }
    CHECK(out == NULL || !exists(out));
    CHECK_INT_EQ(leftovers(), 0);
}

static void test_files(void) {
    char in[512], out[512], out2[512], bad[512];
    tmp_path(in, sizeof in, "in.gguf");
    tmp_path(out, sizeof out, "out.gguf");
    tmp_path(out2, sizeof out2, "out2.gguf");
    write_source(in, -1, 0, false);
    for (int kind = 0; kind < NM_QUANT_KIND_COUNT; kind++) {
        nm_error err = {0};
        nm_status st = quantize(in, out, (nm_quant_kind)kind, 3, &err);
        if (st != NM_OK)
            fprintf(stderr, "  %s: %s\n", nm_quant_kind_name((nm_quant_kind)kind), err.msg);
        CHECK_INT_EQ(st, NM_OK);
        CHECK_INT_EQ(n_progress, N_SRC);
        check_output(in, out, (nm_quant_kind)kind);
        /* the thread count does not change a byte */
        CHECK_INT_EQ(quantize(in, out2, (nm_quant_kind)kind, 1, &err), NM_OK);
        size_t n1 = 0, n2 = 0;
        unsigned char *b1 = nm_test_read_file(out, &n1), *b2 = nm_test_read_file(out2, &n2);
        CHECK(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
        free(b1);
        free(b2);
    }
    CHECK_INT_EQ(leftovers(), 0);
    printf("  files: every kind keeps keys and order, bytes as nm_quantize_row makes them, any "
           "thread count\n");

    /* a file already in the target types converts nothing; another type is refused */
    nm_error err = {0};
    CHECK_INT_EQ(quantize(in, out, NM_QUANT_Q8_0, 2, &err), NM_OK);
    CHECK_INT_EQ(quantize(out, out2, NM_QUANT_Q8_0, 2, &err), NM_OK);
    size_t n1 = 0, n2 = 0;
    unsigned char *b1 = nm_test_read_file(out, &n1), *b2 = nm_test_read_file(out2, &n2);
    CHECK(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);
    remove(out2);
    expect_file_error("requantising q8_0 to q4_k", quantize(out, out2, NM_QUANT_Q4_K, 2, &err),
                      &err, NM_ERR_UNSUPPORTED, "token_embd.weight is q8_0", out2);

    tmp_path(bad, sizeof bad, "missing.gguf");
    expect_file_error("missing input", quantize(bad, out2, NM_QUANT_Q8_0, 1, &err), &err, NM_ERR_IO,
                      "missing.gguf", out2);
    tmp_path(bad, sizeof bad, "junk.gguf");
    FILE *f = fopen(bad, "wb");
    fputs("this is not a GGUF file, only text that is long enough to be read", f);
    fclose(f);
    expect_file_error("not a GGUF file", quantize(bad, out2, NM_QUANT_Q8_0, 1, &err), &err,
                      NM_ERR_FORMAT, "junk.gguf", out2);
    tmp_path(bad, sizeof bad, "no/such/dir/out.gguf");
    expect_file_error("output directory missing", quantize(in, bad, NM_QUANT_Q8_0, 1, &err), &err,
                      NM_ERR_IO, "cannot create", NULL);
    expect_file_error("output is a directory", quantize(in, tmp_dir, NM_QUANT_Q8_0, 1, &err), &err,
                      NM_ERR_IO, "is a directory", NULL);
    expect_file_error("output is the input", quantize(in, in, NM_QUANT_Q8_0, 1, &err), &err,
                      NM_ERR_INVALID_ARG, "replace the input", NULL);
    CHECK(exists(in));

    tmp_path(bad, sizeof bad, "split.gguf");
    write_source(bad, -1, 0, true);
    expect_file_error("split file", quantize(bad, out2, NM_QUANT_Q8_0, 1, &err), &err,
                      NM_ERR_UNSUPPORTED, "split", out2);
    tmp_path(bad, sizeof bad, "nan.gguf");
    write_source(bad, 6, NAN, false);
    expect_file_error("NaN weight", quantize(bad, out2, NM_QUANT_Q4_K_M, 2, &err), &err,
                      NM_ERR_INVALID_ARG,
                      "output.weight: cannot make q6_K: row 3: element 5 is NaN", out2);
    write_source(bad, 4, INFINITY, false);
    expect_file_error("infinite weight in an expert", quantize(bad, out2, NM_QUANT_Q8_0, 2, &err),
                      &err, NM_ERR_INVALID_ARG,
                      "ffn_up_exps.weight: cannot make q8_0: row 0 of matrix 1: element 5", out2);
    write_source(bad, 5, 1e6f, false);
    expect_file_error("bf16 beyond f16 in a fallback", quantize(bad, out2, NM_QUANT_Q8_0, 2, &err),
                      &err, NM_ERR_INVALID_ARG, "beyond f16", out2);
    /* an existing output is replaced only by a whole new file */
    f = fopen(out2, "wb");
    fputs("old", f);
    fclose(f);
    CHECK(quantize(bad, out2, NM_QUANT_Q8_0, 2, &err) != NM_OK);
    size_t n_old = 0;
    unsigned char *old = nm_test_read_file(out2, &n_old);
    CHECK(old && n_old == 3 && memcmp(old, "old", 3) == 0);
    free(old);
    remove(out2);

    /* allocation failures anywhere: an error with a message, never a crash or a leftover */
    int n_fail = 0;
    for (long k = 0; k < 100000; k++) {
        nm_alloc_fail_after(k);
        nm_error e = {0};
        nm_status st = quantize(in, out2, NM_QUANT_Q4_K_M, 2, &e);
        nm_alloc_fail_after(-1);
        if (st == NM_OK) break;
        n_fail++;
        if (st != NM_ERR_NOMEM || !e.msg[0]) {
            fprintf(stderr, "  allocation %ld failed: [%s] %s\n", k, nm_status_str(st), e.msg);
            CHECK(0);
            break;
        }
        CHECK(!exists(out2));
    }
    CHECK_INT_EQ(leftovers(), 0);
    CHECK(n_fail > 10 && exists(out2));
    check_output(in, out2, NM_QUANT_Q4_K_M);
    printf("  %d allocation failures each reported as out of memory\n", n_fail);
}

/* ---- llama-quantize's bytes for the shipped model -------------------------------- */

static uint32_t crc32_ieee(const uint8_t *p, size_t n) {
    static uint32_t table[256];
    if (!table[1]) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* tests/quantize_golden.txt (tools/quantize_golden.py): CRC-32s of every
 * tensor llama-quantize quantises in single-type files of the shipped F16
 * model, and the types of its Q4_K_M / Q5_K_M files. npumoe quantize of the
 * same model must give the same types and the same bytes; a mix's q4_K or
 * q6_K tensor must equal the single type's. */
static void test_llama_quantize_golden(void) {
    char model[1024], golden[1024];
    snprintf(model, sizeof model, "%s/models/npumoe-tiny-moe.gguf", NM_SOURCE_DIR);
    snprintf(golden, sizeof golden, "%s/tests/quantize_golden.txt", NM_SOURCE_DIR);
    size_t n_text = 0;
    char *text = (char *)nm_test_read_file(golden, &n_text);
    CHECK(text != NULL);
    if (!text) return;
    long n_bytes_lines = 0, n_type_lines = 0, bad = 0;
    for (int kind = 0; kind < NM_QUANT_KIND_COUNT; kind++) {
        char out[512];
        tmp_path(out, sizeof out, "shipped.gguf");
        nm_quant_params p = nm_quant_default_params();
        p.kind = (nm_quant_kind)kind;
        p.n_threads = 2;
        nm_error err = {0};
        CHECK_INT_EQ(nm_quantize_file(model, out, &p, NULL, &err), NM_OK);
        nm_gguf *g = NULL;
        CHECK_INT_EQ(nm_gguf_open(out, &g, &err), NM_OK);
        if (!g) continue;
        const char *kname = nm_quant_kind_name((nm_quant_kind)kind);
        long n_quantised = 0, n_matched = 0;
        for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
            const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
            if (nm_quantize_is_supported(t->type)) n_quantised++;
        }
        char *copy = malloc(n_text + 1);
        memcpy(copy, text, n_text + 1);
        for (char *line = copy, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = '\0';
            char what[8], k[16], name[128], type[16];
            unsigned crc = 0;
            unsigned long size = 0;
            int n = sscanf(line, "%7s %15s %127s %15s %x %lu", what, k, name, type, &crc, &size);
            if (n < 4 || line[0] == '#') continue;
            const bool is_bytes = strcmp(what, "bytes") == 0 && n == 6;
            /* bytes lines of every single type apply to every kind whose
             * output has that tensor in that type */
            if (!is_bytes && strcmp(k, kname) != 0) continue;
            char tname[128];
            snprintf(tname, sizeof tname, "%s", name);
            const nm_gguf_tensor *t = nm_gguf_find_tensor(g, tname);
            if (!t) {
                bad++;
                fprintf(stderr, "  %s: no tensor %s\n", kname, name);
                continue;
            }
            if (!is_bytes) {
                n_type_lines++;
                if (strcmp(nm_dtype_name(t->type), type) != 0) {
                    bad++;
                    fprintf(stderr, "  %s %s: %s, llama-quantize %s\n", kname, name,
                            nm_dtype_name(t->type), type);
                }
            } else if (strcmp(nm_dtype_name(t->type), type) == 0) {
                /* each single type has its own ggml type: one line per tensor matches */
                n_bytes_lines += strcmp(k, kname) == 0;
                n_matched++;
                if (t->n_bytes != size || crc32_ieee(t->data, (size_t)t->n_bytes) != crc) {
                    bad++;
                    fprintf(stderr, "  %s %s (%s): bytes differ from llama-quantize's\n", kname,
                            name, type);
                }
            } else if (strcmp(k, kname) == 0) {
                bad++;
                fprintf(stderr, "  %s %s: %s, llama-quantize %s\n", kname, name,
                        nm_dtype_name(t->type), type);
            }
        }
        free(copy);
        /* every quantised tensor of the output was compared */
        CHECK_INT_EQ(n_matched, n_quantised);
        nm_gguf_close(g);
        remove(out);
    }
    free(text);
    printf("  the shipped model: %ld tensors' bytes and %ld mix types equal llama-quantize's: %s\n",
           n_bytes_lines, n_type_lines, bad ? "NO" : "yes");
    CHECK(n_bytes_lines > 100 && n_type_lines > 100);
    CHECK_INT_EQ(bad, 0);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/nm_test_quantize_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip_bounds();
    test_exact_blocks();
    test_zero_blocks();
    test_extremes();
    test_golden();
    test_mix_vectors();
    test_mix_rules();
    test_files();
    test_llama_quantize_golden();
    /* clean up the temporary directory */
    DIR *d = opendir(tmp_dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
        remove(p);
    }
    if (d) closedir(d);
    rmdir(tmp_dir);
    return nm_test_finish("test_quantize");
}
