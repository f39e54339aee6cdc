/* The reference kernels against closed forms and double-precision sums:
 * half/bfloat16 conversions, matmul for F32/F16/BF16 at awkward sizes and
 * for Q4_0/Q4_K/Q5_K/Q6_K weights encoded here from known codes,
 * RMSNorm, NeoX RoPE, softmax, SwiGLU (its exp under every variant, bit
 * for bit, and against libm), attention (and the blocked attention
 * of every variant against the reference); and the thread pool. */
#include "harness.h"

#include "kernels/kernels-impl.h"
#include "tensor/tensor.h"
#include "threads/threads.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) { return nm_test_frand(&rng); }

static void test_conversions(void) {
    int mismatches = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = nm_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (nm_f32_to_f16(f) != h) mismatches++;
    }
    CHECK_INT_EQ(mismatches, 0);
    CHECK(nm_f16_to_f32(0x3c00) == 1.0f);
    CHECK(nm_f16_to_f32(0xc000) == -2.0f);
    CHECK(nm_f16_to_f32(0x0001) == 0x1.0p-24f);
    CHECK(nm_f16_to_f32(0x7bff) == 65504.0f);
    CHECK_INT_EQ(nm_f32_to_f16(65520.0f), 0x7c00);          /* rounds to infinity */
    CHECK_INT_EQ(nm_f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00); /* tie to even */
    CHECK_INT_EQ(nm_f32_to_f16(1.0f + 0x1.8p-11f), 0x3c01);
    CHECK(nm_bf16_to_f32(0x3f80) == 1.0f);
    CHECK_INT_EQ(nm_f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80); /* tie to even */
    CHECK_INT_EQ(nm_f32_to_bf16(1.0f + 0x1.8p-7f), 0x3f82); /* tie, up to even */
    CHECK(isnan(nm_bf16_to_f32(nm_f32_to_bf16(NAN))));
}

/* Checks y = x W^T ([m][n], x [m][k], W as floats [n][k]) against sums in
 * double: float accumulation errs by at most ~k eps sum|terms|. */
static void check_matmul_double(uint32_t type, const float *x, const double *wf, const float *y,
                                int64_t m, int64_t n, int64_t k) {
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < k; q++) {
                ref += (double)x[i * k + q] * wf[j * k + q];
                mag += fabs((double)x[i * k + q] * wf[j * k + q]);
            }
            const double e = fabs(y[i * n + j] - ref) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    if (!(worst < 1e-6 * (double)k + 1e-6))
        fprintf(stderr, "matmul %s m=%lld n=%lld k=%lld: rel err %.3g\n", nm_dtype_name(type),
                (long long)m, (long long)n, (long long)k, worst);
    CHECK(worst < 1e-6 * (double)k + 1e-6);
}

static void test_matmul_type(uint32_t type, int64_t m, int64_t n, int64_t k) {
    const size_t esz = type == NM_DTYPE_F32 ? 4 : 2;
    uint8_t *w = malloc((size_t)(n * k) * esz);
    double *wf = malloc((size_t)(n * k) * sizeof(double)); /* the weights' values */
    float *x = malloc((size_t)(m * k) * sizeof(float));
    float *y = malloc((size_t)(m * n) * sizeof(float));
    for (int64_t i = 0; i < n * k; i++) {
        float v = frand();
        if (type == NM_DTYPE_F32) memcpy(w + 4 * i, &v, 4);
        uint16_t h = type == NM_DTYPE_F16 ? nm_f32_to_f16(v) : nm_f32_to_bf16(v);
        if (type != NM_DTYPE_F32) memcpy(w + 2 * i, &h, 2);
        wf[i] = type == NM_DTYPE_F32   ? v
                : type == NM_DTYPE_F16 ? nm_f16_to_f32(h)
                                       : nm_bf16_to_f32(h);
    }
    for (int64_t i = 0; i < m * k; i++)
        x[i] = frand();
    nm_mat mat = {.data = w, .type = type, .n = n, .k = k, .row_bytes = (size_t)k * esz};
    nm_matmul_forward(&mat, x, k, m, y, n, 0, n);
    check_matmul_double(type, x, wf, y, m, n, k);
    free(w);
    free(wf);
    free(x);
    free(y);
}

/* The reference matmul over the float types (the variants are checked
 * against it by test_kernels_variants). */
static void test_matmul(void) {
    const nm_kernels_isa start = nm_kernels_active();
    CHECK(nm_kernels_force(NM_KERNELS_REF));
    const uint32_t types[3] = {NM_DTYPE_F32, NM_DTYPE_F16, NM_DTYPE_BF16};
    const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 3}, {3, 5, 257}, {17, 33, 300}, {2, 3, 4099}};
    for (int t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_matmul_type(types[t], shapes[s][0], shapes[s][1], shapes[s][2]);
    /* a column range writes only its columns */
    float w[6] = {1, 2, 3, 4, 5, 6}, x[2] = {1, 1}, y[3] = {-7, -7, -7};
    nm_mat mat = {.data = w, .type = NM_DTYPE_F32, .n = 3, .k = 2, .row_bytes = 8};
    nm_matmul_forward(&mat, x, 2, 1, y, 3, 1, 2);
    CHECK(y[0] == -7 && y[1] == 7 && y[2] == -7);
    CHECK(nm_kernels_force(start));
}

/* Quantised weights written here from integer codes and scales chosen at
 * random (an encoder independent of the dequantiser), with their values in
 * double: x = (q - 8) d (Q4_0), d sc q - dmin mn (Q4_K, Q5_K), d sc (q - 32)
 * (Q6_K). d sc and dmin mn are exact in float, so each dequantised weight
 * is within one rounding of these values. */
static int rand_int(int n) { return (int)((frand() + 1.0) * 0.5 * n) % n; }

static double rand_half(float lo, uint8_t *dst) {
    const uint16_t h = nm_f32_to_f16((frand() < 0 ? -lo : lo) * (2.0f + frand()));
    memcpy(dst, &h, 2);
    return nm_f16_to_f32(h);
}

/* An E2M1 code's value by the OCP MX spec: sign bit 3, exponent bits 2-1
 * (bias 1), mantissa bit 0; exponent 0 is subnormal (0 or 0.5). */
static double e2m1_value(int code) {
    const int sign = code >> 3, exp = (code >> 1) & 3, mant = code & 1;
    const double mag = exp == 0 ? 0.5 * mant : (1.0 + 0.5 * mant) * ldexp(1.0, exp - 1);
    return sign ? -mag : mag;
}

static void encode_block(uint32_t type, uint8_t *blk, double *val) {
    int q[256], sc[16], mn[8];
    if (type == NM_DTYPE_MXFP4) { /* scale 2^(e - 127), the E8M0 byte e */
        const int e = 100 + rand_int(40);
        blk[0] = (uint8_t)e;
        for (int i = 0; i < 32; i++)
            q[i] = rand_int(16), val[i] = e2m1_value(q[i]) * ldexp(1.0, e - 127);
        for (int i = 0; i < 16; i++)
            blk[1 + i] = (uint8_t)(q[i] | q[i + 16] << 4);
        return;
    }
    if (type == NM_DTYPE_Q4_0) {
        const double d = rand_half(0.01f, blk);
        for (int i = 0; i < 32; i++)
            q[i] = rand_int(16), val[i] = (q[i] - 8) * d;
        for (int i = 0; i < 16; i++)
            blk[2 + i] = (uint8_t)(q[i] | q[i + 16] << 4);
        return;
    }
    if (type == NM_DTYPE_Q6_K) {
        const double d = rand_half(0.0005f, blk + 208);
        for (int s = 0; s < 16; s++)
            sc[s] = rand_int(256) - 128, blk[192 + s] = (uint8_t)(int8_t)sc[s];
        for (int i = 0; i < 256; i++) {
            q[i] = rand_int(64);
            val[i] = d * sc[i / 16] * (q[i] - 32);
        }
        memset(blk, 0, 192);
        for (int i = 0; i < 256; i++) {
            /* half h, group g of 32, lane l */
            const int h = i / 128, g = (i % 128) / 32, l = i % 32;
            blk[64 * h + l + 32 * (g & 1)] |= (uint8_t)((q[i] & 15) << (4 * (g >> 1)));
            blk[128 + 32 * h + l] |= (uint8_t)((q[i] >> 4) << (2 * g));
        }
        return;
    }
    /* Q4_K, Q5_K */
    const int bits = type == NM_DTYPE_Q5_K ? 5 : 4;
    const double d = rand_half(0.001f, blk), dmin = rand_half(0.01f, blk + 2);
    for (int s = 0; s < 8; s++)
        sc[s] = rand_int(64), mn[s] = rand_int(64);
    uint8_t *scales = blk + 4;
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    uint8_t *qh = blk + 16, *qs = bits == 5 ? qh + 32 : qh;
    memset(qh, 0, bits == 5 ? 160 : 128);
    for (int i = 0; i < 256; i++) {
        const int s = i / 32, l = i % 32;
        q[i] = rand_int(1 << bits);
        val[i] = d * sc[s] * q[i] - dmin * mn[s];
        qs[32 * (s / 2) + l] |= (uint8_t)((q[i] & 15) << (4 * (s & 1)));
        if (bits == 5) qh[l] |= (uint8_t)((q[i] >> 4) << s);
    }
}

static void test_matmul_quant(uint32_t type, int64_t m, int64_t n, int64_t k) {
    const nm_dtype_traits *tr = nm_dtype_traits_of(type);
    const int64_t bs = tr->block_size, nb = k / bs;
    const size_t rb = (size_t)nb * tr->block_bytes;
    uint8_t *w = calloc((size_t)n, rb);
    double *wv = malloc((size_t)(n * k) * sizeof(double)); /* [n][k] the weights' values */
    float *wf = malloc((size_t)k * sizeof(float));
    float *x = malloc((size_t)(m * k) * sizeof(float));
    float *y = malloc((size_t)(m * n) * sizeof(float));
    double worst_w = 0;
    for (int64_t j = 0; j < n; j++) {
        for (int64_t b = 0; b < nb; b++)
            encode_block(type, w + (size_t)j * rb + b * tr->block_bytes, wv + j * k + b * bs);
        nm_dequantize_row((nm_dtype)type, w + (size_t)j * rb, wf, k);
        for (int64_t q = 0; q < k; q++) {
            const double e = fabs(wf[q] - wv[j * k + q]) / (fabs(wv[j * k + q]) + 1e-30);
            if (e > worst_w) worst_w = e;
        }
    }
    CHECK(worst_w <= 0x1.0p-24); /* one rounding at most */
    for (int64_t i = 0; i < m * k; i++)
        x[i] = frand();
    nm_mat mat = {.data = w, .type = type, .n = n, .k = k, .row_bytes = rb};
    nm_matmul_forward(&mat, x, k, m, y, n, 0, n);
    check_matmul_double(type, x, wv, y, m, n, k);
    free(w);
    free(wv);
    free(wf);
    free(x);
    free(y);
}

/* The reference matmul over the quantised types. */
static void test_matmul_quants(void) {
    const nm_kernels_isa start = nm_kernels_active();
    CHECK(nm_kernels_force(NM_KERNELS_REF));
    const uint32_t types[5] = {NM_DTYPE_Q4_0, NM_DTYPE_Q4_K, NM_DTYPE_Q5_K, NM_DTYPE_Q6_K,
                               NM_DTYPE_MXFP4};
    const int64_t shapes[][3] = {{1, 1, 256}, {3, 5, 512}, {6, 9, 2048}, {2, 3, 4352}};
    for (int t = 0; t < 5; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_matmul_quant(types[t], shapes[s][0], shapes[s][1], shapes[s][2]);
    test_matmul_quant(NM_DTYPE_Q4_0, 2, 3, 96); /* not a whole number of 256 */
    test_matmul_quant(NM_DTYPE_MXFP4, 2, 3, 96);
    /* the smallest scales, E8M0 0 and 1: 2^-127 and 2^-126 times E2M1 */
    uint8_t blk[2][NM_MXFP4_BYTES] = {{0, 0x71}, {1, 0xf9}};
    float v[2][32];
    for (int b = 0; b < 2; b++)
        nm_dequantize_row(NM_DTYPE_MXFP4, blk[b], v[b], 32);
    CHECK(v[0][0] == (float)(0.5 * ldexp(1.0, -127)) && v[0][16] == (float)(6 * ldexp(1.0, -127)));
    CHECK(v[1][0] == (float)(-0.5 * ldexp(1.0, -126)) &&
          v[1][16] == (float)(-6 * ldexp(1.0, -126)));
    CHECK(v[0][1] == 0.0f && v[1][1] == 0.0f);
    /* quantising MXFP4 values gives them back (the scale may change when the
     * block's largest code is below 8, the values cannot) */
    for (int trial = 0; trial < 50; trial++) {
        uint8_t a[NM_MXFP4_BYTES], b[NM_MXFP4_BYTES];
        double val[32];
        float x[32], y[32];
        encode_block(NM_DTYPE_MXFP4, a, val);
        for (int i = 0; i < 32; i++)
            x[i] = (float)val[i];
        CHECK_INT_EQ(nm_quantize_row(NM_DTYPE_MXFP4, x, b, 32, NULL), NM_OK);
        nm_dequantize_row(NM_DTYPE_MXFP4, b, y, 32);
        int same = 0; /* == : code 8, -0, comes back as +0 */
        for (int i = 0; i < 32; i++)
            same += x[i] == y[i];
        CHECK_INT_EQ(same, 32);
    }
    CHECK(nm_kernels_force(start));
}

static void test_elementwise(void) {
    float x[8], y[8], w[8];
    for (int i = 0; i < 8; i++)
        x[i] = 3.0f, w[i] = (float)i;
    nm_rmsnorm_forward(x, w, y, 8, 1e-6f);
    for (int i = 0; i < 8; i++)
        CHECK_NEAR(y[i], 3.0 / sqrt(9.0 + 1e-6) * i, 1e-6);
    nm_rmsnorm_forward(x, NULL, x, 8, 0.0f); /* in place, no weight */
    CHECK_NEAR(x[5], 1.0, 1e-7);

    float s[3] = {0.0f, logf(2.0f), logf(3.0f)};
    nm_softmax_forward(s, 3);
    CHECK_NEAR(s[0], 1 / 6.0, 1e-7);
    CHECK_NEAR(s[1], 2 / 6.0, 1e-7);
    CHECK_NEAR(s[2], 3 / 6.0, 1e-7);
    float big[2] = {1000.0f, 1000.0f}; /* no overflow */
    nm_softmax_forward(big, 2);
    CHECK_NEAR(big[0], 0.5, 1e-7);

    float g[2] = {0.0f, 2.0f}, u[2] = {5.0f, 3.0f}, h[2];
    nm_swiglu_forward(g, u, h, 2);
    CHECK_NEAR(h[0], 0.0, 1e-7);
    CHECK_NEAR(h[1], 2.0 / (1.0 + exp(-2.0)) * 3.0, 1e-6);
}

static void test_rope(void) {
    /* 2 heads of 8: pairs (i, i+4); position 0 is the identity */
    float v[16], orig[16];
    for (int i = 0; i < 16; i++)
        orig[i] = v[i] = frand();
    nm_rope_neox_forward(v, 2, 8, 8, 0, 10000.0f);
    for (int i = 0; i < 16; i++)
        CHECK(v[i] == orig[i]);
    /* position p rotates pair i by p * base^(-2i/n_rot) */
    const int pos = 7;
    nm_rope_neox_forward(v, 2, 8, 8, pos, 10000.0f);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            double theta = pos * pow(10000.0, -2.0 * i / 8.0);
            double x0 = orig[h * 8 + i], x1 = orig[h * 8 + i + 4];
            CHECK_NEAR(v[h * 8 + i], x0 * cos(theta) - x1 * sin(theta), 1e-5);
            CHECK_NEAR(v[h * 8 + i + 4], x0 * sin(theta) + x1 * cos(theta), 1e-5);
        }
}

/* YaRN against a separately written double-precision form of the YaRN
 * paper's NTK-by-parts interpolation as ggml applies it: pair i keeps its
 * angle where it turns more than beta_fast times over the original context
 * (ramp 1), is divided by the factor where it turns fewer than beta_slow
 * times (ramp 0), mixes linearly between, and cos/sin grow by 1 + 0.1
 * ln(factor). Also linear scaling (ext_factor 0). */
static void test_rope_yarn(void) {
    enum { NH = 2, HD = 32, NR = 32 };
    const double base = 150000.0, factor = 32.0;
    const int n_orig = 4096;
    const nm_rope_yarn y = nm_rope_yarn_make(NR, n_orig, (float)base, (float)factor, 32.0f, 1.0f);
    /* the ramp's ends: pair d turns n_orig / (2 pi base^(2d/NR)) times */
    const double lo = floor(NR * log(n_orig / (32.0 * 2 * M_PI)) / (2 * log(base)));
    const double hi = ceil(NR * log(n_orig / (1.0 * 2 * M_PI)) / (2 * log(base)));
    CHECK_NEAR(y.corr_dims[0], lo, 0);
    CHECK_NEAR(y.corr_dims[1], hi, 0);
    CHECK(lo > 0 && hi < NR / 2 - 1); /* the ramp lies inside: all three regimes are tested */
    for (int linear = 0; linear < 2; linear++) {
        nm_rope_yarn yl = y;
        if (linear) yl.ext_factor = 0.0f;
        const int32_t positions[3] = {0, 5, 3000};
        for (int pi = 0; pi < 3; pi++) {
            const int32_t pos = positions[pi];
            float v[NH * HD], orig[NH * HD];
            for (int i = 0; i < NH * HD; i++)
                orig[i] = v[i] = frand();
            nm_rope_ext_forward(v, NH, HD, NR, pos, (float)base, true, NULL, 1.0f, &yl);
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < NR / 2; i++) {
                    const double extrap = pos * pow(base, -2.0 * i / NR), interp = extrap / factor;
                    double ramp = 1 - fmin(1, fmax(0, (i - lo) / fmax(0.001, hi - lo)));
                    double theta = linear ? interp : interp * (1 - ramp) + extrap * ramp;
                    double ms = linear ? 1.0 : 1.0 + 0.1 * log(factor);
                    double x0 = orig[h * HD + i], x1 = orig[h * HD + i + NR / 2];
                    /* float angles over 3000 positions: about 3000 * 2^-24 rad */
                    CHECK_NEAR(v[h * HD + i], ms * (x0 * cos(theta) - x1 * sin(theta)), 1e-3);
                    CHECK_NEAR(v[h * HD + i + NR / 2], ms * (x0 * sin(theta) + x1 * cos(theta)),
                               1e-3);
                }
        }
    }
    /* with no scaling it is nm_rope_forward, bit for bit */
    float a[HD], b[HD];
    for (int i = 0; i < HD; i++)
        a[i] = b[i] = frand();
    nm_rope_forward(a, 1, HD, NR, 77, 1e4f, true, NULL, 1.0f);
    nm_rope_ext_forward(b, 1, HD, NR, 77, 1e4f, true, NULL, 1.0f, NULL);
    CHECK(memcmp(a, b, sizeof a) == 0);
}

/* The clamped SwiGLU against its definition in double, around the limit;
 * the softmax with a sink against the closed form. */
static void test_glu_sink(void) {
    enum { N = 9 };
    const float g[N] = {-9, -7.5f, -1, 0, 0.5f, 6.9f, 7, 7.1f, 30};
    const float u[N] = {8, -8, -7.1f, 0.3f, 7.2f, -2, 1, 100, -100};
    float h[N];
    nm_swiglu_oai_forward(g, u, h, N, 1.702f, 7.0f);
    for (int i = 0; i < N; i++) {
        const double x = fmin(g[i], 7.0), yv = fmax(fmin(u[i], 7.0), -7.0);
        const double want = x / (1 + exp(-1.702 * x)) * (yv + 1);
        CHECK_NEAR(h[i], want, 1e-5 * (1 + fabs(want)));
    }
    float x[4] = {1, 2, -1, 0.5f};
    const float sink = 1.5f;
    double z = exp(sink);
    for (int i = 0; i < 4; i++)
        z += exp(x[i]);
    float y[4];
    memcpy(y, x, sizeof x);
    nm_softmax_sink_forward(y, 4, sink);
    for (int i = 0; i < 4; i++)
        CHECK_NEAR(y[i], exp(x[i]) / z, 1e-7);
    /* no sink (-inf) is the plain softmax, bit for bit */
    float p[4], q[4];
    memcpy(p, x, sizeof x);
    memcpy(q, x, sizeof x);
    nm_softmax_forward(p, 4);
    nm_softmax_sink_forward(q, 4, -INFINITY);
    CHECK(memcmp(p, q, sizeof p) == 0);
}

static void test_attention(void) {
    /* 4 query heads share 2 kv heads of 2 dims; 3 cached positions */
    enum { NH = 4, NKV = 2, HD = 2, T = 3 };
    float q[NH * HD], k[T * NKV * HD], v[T * NKV * HD], out[NH * HD], scores[T];
    for (int i = 0; i < NH * HD; i++)
        q[i] = frand();
    for (int i = 0; i < T * NKV * HD; i++)
        k[i] = frand(), v[i] = frand();
    /* every key, then a window of the last 2, each without and with sink
     * logits (one per head, in the denominator only) */
    const float sinks[NH] = {0.3f, -1.0f, 2.0f, 0.0f};
    for (int kv0 = 0; kv0 < 2; kv0++)
        for (int with_sinks = 0; with_sinks < 2; with_sinks++) {
            nm_attention_forward(q, k, v, NKV * HD, kv0, T, NH, NKV, HD, 0.5f,
                                 with_sinks ? sinks : NULL, out, scores);
            for (int h = 0; h < NH; h++) {
                const int kvh = h / (NH / NKV);
                double w[T], sum = with_sinks ? exp((double)sinks[h]) : 0;
                for (int t = kv0; t < T; t++) {
                    double d = 0;
                    for (int j = 0; j < HD; j++)
                        d += (double)q[h * HD + j] * k[t * NKV * HD + kvh * HD + j];
                    w[t] = exp(0.5 * d);
                    sum += w[t];
                }
                for (int j = 0; j < HD; j++) {
                    double ref = 0;
                    for (int t = kv0; t < T; t++)
                        ref += w[t] / sum * v[t * NKV * HD + kvh * HD + j];
                    CHECK_NEAR(out[h * HD + j], ref, 1e-6);
                }
            }
        }
    /* one position: the output is its value row */
    nm_attention_forward(q, k, v, NKV * HD, 0, 1, NH, NKV, HD, 0.5f, NULL, out, scores);
    CHECK(out[0] == v[0] && out[HD * 2 + 1] == v[HD + 1]);
    /* a window of one key: that key's value row, whatever came before */
    nm_attention_forward(q, k, v, NKV * HD, T - 1, T, NH, NKV, HD, 0.5f, NULL, out, scores);
    CHECK(out[0] == v[(T - 1) * NKV * HD] && out[HD * 2 + 1] == v[(T - 1) * NKV * HD + HD + 1]);
}

/* One random case of nm_attention_rows_forward (F32 or F16 cache) under the
 * variant in use against the reference a row at a time: n_rows rows after
 * n_past cached positions, each with its own causal end, an optional
 * sliding window and optional sinks. Each row must also have the bits of
 * nm_attention_forward for that row alone. */
static void check_attention_rows(int n_head_kv, int group, int hd, int n_rows, int n_past,
                                 int window, bool sinks_on, bool half, float scale) {
    const int n_head = n_head_kv * group, n_pos = n_past + n_rows;
    const int64_t stride = (int64_t)n_head_kv * hd, q_dim = (int64_t)n_head * hd;
    float *q = malloc((size_t)n_rows * (size_t)q_dim * sizeof(float));
    float *k = malloc((size_t)n_pos * (size_t)stride * sizeof(float));
    float *v = malloc((size_t)n_pos * (size_t)stride * sizeof(float));
    uint16_t *kh = malloc((size_t)n_pos * (size_t)stride * sizeof(uint16_t));
    uint16_t *vh = malloc((size_t)n_pos * (size_t)stride * sizeof(uint16_t));
    float *out = malloc((size_t)n_rows * (size_t)q_dim * sizeof(float));
    float *one = malloc((size_t)q_dim * sizeof(float));
    float *ref = malloc((size_t)q_dim * sizeof(float));
    float *scores = malloc((size_t)n_pos * sizeof(float));
    float sinks[64];
    int32_t kv0[64], n_kv[64];
    for (int64_t i = 0; i < (int64_t)n_rows * q_dim; i++)
        q[i] = frand();
    for (int64_t i = 0; i < (int64_t)n_pos * stride; i++) {
        k[i] = frand(), v[i] = frand();
        kh[i] = nm_f32_to_f16(k[i]), vh[i] = nm_f32_to_f16(v[i]);
    }
    for (int h = 0; h < n_head; h++)
        sinks[h] = 2 * frand();
    for (int r = 0; r < n_rows; r++) {
        n_kv[r] = n_past + r + 1;
        kv0[r] = window > 0 && n_kv[r] > window ? n_kv[r] - window : 0;
    }
    const float *sk = sinks_on ? sinks : NULL;
    if (half)
        nm_attention_rows_f16_forward(q, q_dim, kh, vh, stride, kv0, n_kv, n_rows, n_head,
                                      n_head_kv, hd, scale, sk, out, q_dim, scores);
    else
        nm_attention_rows_forward(q, q_dim, k, v, stride, kv0, n_kv, n_rows, n_head, n_head_kv, hd,
                                  scale, sk, out, q_dim, scores);
    int same = 1, close = 1;
    for (int r = 0; r < n_rows; r++) {
        const float *qr = q + r * q_dim, *o = out + r * q_dim;
        const size_t off = (size_t)kv0[r] * (size_t)stride;
        const int32_t t = n_kv[r] - kv0[r];
        if (half) {
            nm_attention_f16_ref_forward(qr, kh + off, vh + off, stride, t, n_head, n_head_kv, hd,
                                         scale, sk, ref, scores);
            nm_attention_f16_forward(qr, kh, vh, stride, kv0[r], n_kv[r], n_head, n_head_kv, hd,
                                     scale, sk, one, scores);
        } else {
            nm_attention_ref_forward(qr, k + off, v + off, stride, t, n_head, n_head_kv, hd, scale,
                                     sk, ref, scores);
            nm_attention_forward(qr, k, v, stride, kv0[r], n_kv[r], n_head, n_head_kv, hd, scale,
                                 sk, one, scores);
        }
        same &= memcmp(o, one, (size_t)q_dim * sizeof(float)) == 0;
        /* outputs are averages of values in [-1, 1]: float sums of hd and
         * t terms, and exp within a few ulp */
        const double tol = 1e-6 * (4 + hd + t);
        double worst = 0;
        for (int64_t i = 0; i < q_dim; i++)
            if (!(fabs(o[i] - ref[i]) <= worst)) worst = fabs(o[i] - ref[i]);
        if (!(worst <= tol)) {
            close = 0;
            fprintf(stderr,
                    "%s attention rows: %d/%d heads x %d, row %d of %d after %d, window %d, "
                    "sinks %d, %s: max diff %.3g > %.3g\n",
                    nm_kernels_isa_name(nm_kernels_active()), n_head, n_head_kv, hd, r, n_rows,
                    n_past, window, sinks_on, half ? "f16" : "f32", worst, tol);
            break;
        }
    }
    CHECK(close);
    CHECK(same);
    free(q), free(k), free(v), free(kh), free(vh), free(out), free(one), free(ref), free(scores);
}

/* nm_swiglu_forward under every variant this CPU runs gives the plain C
 * one's bits, over every 251st float bit pattern (all signs and exponents:
 * zeros, subnormals, where e^-g overflows or underflows, infinities, NaNs)
 * in runs of lengths that leave every tail; and against libm's expf
 * (g / (1 + expf(-g)), nearly always correctly rounded): the same float but
 * for the rare ties, and never more than 4 ulp away (where e^-g >= 2^24, one
 * ulp of it can move 1 + e^-g by two; all 2^32 floats measured: 73784
 * differ, at most 4 ulp). */
static void test_swiglu_bits(void) {
    enum { RUN = 1000 };
    static float g[RUN], u[RUN], want[RUN], got[RUN];
    const nm_kernels_isa was = nm_kernels_active();
    int64_t n = 0, differ = 0, far = 0, mismatched = 0;
    for (uint64_t at = 0; at < (1ull << 32);) {
        const int len = 1 + (int)(n % RUN); /* run lengths 1 .. RUN */
        int m = 0;
        for (; m < len && at < (1ull << 32); m++, at += 251) {
            const uint32_t v = (uint32_t)at;
            memcpy(&g[m], &v, 4);
            u[m] = m % 3 == 0 ? 1.0f : 0.75f;
        }
        nm_swiglu_ref_forward(g, u, want, m);
        for (int isa = 0; isa < NM_KERNELS_COUNT; isa++) {
            if (!nm_kernels_force((nm_kernels_isa)isa)) continue;
            nm_swiglu_forward(g, u, got, m);
            for (int i = 0; i < m; i++)
                mismatched += isnan(want[i]) ? !isnan(got[i]) : memcmp(&got[i], &want[i], 4) != 0;
        }
        for (int i = 0; i < m; i++, n++) {
            const float libm = g[i] / (1.0f + expf(-g[i])) * u[i];
            if (isnan(libm) || isnan(want[i])) {
                far += isnan(libm) != isnan(want[i]);
                continue;
            }
            int32_t a, b;
            memcpy(&a, &libm, 4);
            memcpy(&b, &want[i], 4);
            differ += a != b;
            far += (a < 0) != (b < 0) ? a != b : (a > b ? a - b : b - a) > 4;
        }
    }
    CHECK(nm_kernels_force(was));
    CHECK_INT_EQ(mismatched, 0);
    CHECK_INT_EQ(far, 0);
    CHECK(n > 17000000 && differ < n / 10000); /* measured: 0.002% */
}

/* The blocked attention (and the reference where it does not run) over
 * random shapes under every variant this CPU runs: GQA groups of 1 to 16,
 * head sizes that are and are not multiples of 8 or 16 (the largest,
 * MLA's 576, and one past NM_ATTENTION_HEAD_DIM_MAX), rows of different lengths crossing the key
 * blocks, windows, sinks, F32 and F16 caches, and sharp softmaxes whose
 * maximum moves from block to block. */
static void test_attention_rows(void) {
    const nm_kernels_isa was = nm_kernels_active();
    static const int hds[] = {16, 64, 128, 256, 8, 40, 72, 100, 7, 1, 576, 580};
    static const int groups[] = {1, 2, 3, 8, 16};
    for (int isa = 0; isa < NM_KERNELS_COUNT; isa++) {
        if (!nm_kernels_force((nm_kernels_isa)isa)) continue;
        for (int c = 0; c < 40; c++) {
            const int hd = hds[c % 12], group = groups[(c / 3) % 5];
            const int n_head_kv = 1 + c % 3, n_rows = 1 + (c * 7) % 20;
            const int n_past = (c * 37) % 90, window = c % 4 == 1 ? 1 + (c * 13) % 40 : 0;
            const bool sinks_on = c % 5 == 2, half = c % 2 == 1;
            /* every fourth case sharp: scores up to about 4 * sqrt(hd) */
            const float scale = (c % 4 == 3 ? 12.0f : 1.0f) / sqrtf((float)hd);
            check_attention_rows(n_head_kv, group, hd, n_rows, n_past, window, sinks_on, half,
                                 scale);
        }
    }
    CHECK(nm_kernels_force(was));
    /* rows per call: 32 queries per KV head, within 1 .. NM_ATTENTION_ROWS_MAX */
    CHECK_INT_EQ(nm_attention_rows_per_call(32, 4), 4);
    CHECK_INT_EQ(nm_attention_rows_per_call(16, 16), NM_ATTENTION_ROWS_MAX);
    CHECK_INT_EQ(nm_attention_rows_per_call(128, 1), 1);
    CHECK_INT_EQ(nm_attention_rows_per_call(12, 4), 10);
}

/* The blocked attention's two builds, 8 and 16 lanes, give the same bits
 * whichever the dispatcher picks on this CPU: called directly over the
 * same rows (GQA groups whose queries fill one, two or more vectors of
 * either width, F32 and F16 caches, windows and sinks). */
static void test_attention_widths(void) {
#if defined(__x86_64__)
    if (!nm_kernels_isa_supported(NM_KERNELS_AVX512)) {
        printf("16-lane attention: no AVX-512 here, skipped\n");
        return;
    }
    enum { KV = 2, HD = 72, ROWS = 9, PAST = 23, POS = PAST + ROWS };
    static const int groups[] = {1, 3, 8, 16};
    static float q[ROWS * KV * 16 * HD], k[POS * KV * HD], v[POS * KV * HD], sinks[KV * 16];
    static float o8[ROWS * KV * 16 * HD], o16[ROWS * KV * 16 * HD];
    static uint16_t kh[POS * KV * HD], vh[POS * KV * HD];
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = frand();
    for (int i = 0; i < POS * KV * HD; i++) {
        k[i] = frand(), v[i] = frand();
        kh[i] = nm_f32_to_f16(k[i]), vh[i] = nm_f32_to_f16(v[i]);
    }
    for (int h = 0; h < KV * 16; h++)
        sinks[h] = frand();
    for (int c = 0; c < 16; c++) {
        const int group = groups[c % 4], n_head = KV * group, n_rows = 1 + (c * 5) % ROWS;
        const bool half = c % 2, windowed = c % 3 == 1;
        int32_t kv0[ROWS], n_kv[ROWS];
        for (int r = 0; r < n_rows; r++) {
            n_kv[r] = PAST + r + 1;
            kv0[r] = windowed ? n_kv[r] - 7 : 0;
        }
        const void *kc = half ? (const void *)kh : (const void *)k;
        const void *vc = half ? (const void *)vh : (const void *)v;
        const float *sk = c % 5 == 3 ? sinks : NULL;
        const int64_t ld = (int64_t)n_head * HD;
        nm_attention_blocked_forward(q, ld, kc, vc, half, KV * HD, kv0, n_kv, n_rows, n_head, KV,
                                     HD, 0.2f, sk, o8, ld);
        nm_attention_blocked16_forward(q, ld, kc, vc, half, KV * HD, kv0, n_kv, n_rows, n_head, KV,
                                       HD, 0.2f, sk, o16, ld);
        CHECK(memcmp(o8, o16, (size_t)(n_rows * ld) * sizeof(float)) == 0);
    }
#endif
}

typedef struct pool_ctx {
    atomic_int hits[1000];
    atomic_int threads_seen;
    double work[1000];
} pool_ctx;

static void pool_task(void *p, int i, int thread) {
    pool_ctx *c = p;
    atomic_fetch_add(&c->hits[i], 1);
    atomic_fetch_or(&c->threads_seen, 1 << thread);
    double sink = 0; /* uneven work */
    for (int j = 0; j < (i % 7) * 1000; j++)
        sink += j;
    c->work[i] = sink;
}

typedef struct range_seen {
    pool_ctx *c;
    atomic_int n_ranges;
    atomic_llong shortest; /* 0 until a range is seen */
} range_seen;

static void range_fn(void *p, int64_t i0, int64_t i1) {
    range_seen *r = p;
    atomic_fetch_add(&r->n_ranges, 1);
    long long s = atomic_load(&r->shortest);
    while ((s == 0 || i1 - i0 < s) && !atomic_compare_exchange_weak(&r->shortest, &s, i1 - i0)) {
    }
    for (int64_t i = i0; i < i1; i++)
        atomic_fetch_add(&r->c->hits[i], 1);
}

static void test_pool(void) {
    nm_pool *pool = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_pool_new(3, &pool, &err), NM_OK);
    static pool_ctx c;
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 1000; i++)
            atomic_store(&c.hits[i], 0);
        nm_pool_run(pool, pool_task, &c, 1000);
        int bad = 0;
        for (int i = 0; i < 1000; i++)
            bad += atomic_load(&c.hits[i]) != 1;
        CHECK_INT_EQ(bad, 0);
    }
    CHECK(c.work[6] == 5999.0 * 6000.0 / 2.0);
    CHECK(atomic_load(&c.threads_seen) & 1); /* the caller works too */
    /* nm_pool_for: every index once, in the ranges expected on 3 threads
     * (n / min_range of them, at most 3, one when under 2), none shorter
     * than min_range unless it is the whole: {n, min_range, ranges} */
    const int64_t sizes[][3] = {{0, 16, 0},    {1, 16, 1},  {31, 16, 1}, {32, 16, 2}, {47, 16, 2},
                                {1000, 16, 3}, {999, 1, 3}, {2, 1, 2},   {50, 100, 1}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (int i = 0; i < 1000; i++)
            atomic_store(&c.hits[i], 0);
        range_seen r = {.c = &c};
        nm_pool_for(pool, sizes[s][0], sizes[s][1], range_fn, &r);
        int bad = 0;
        for (int64_t i = 0; i < 1000; i++)
            bad += atomic_load(&c.hits[i]) != (i < sizes[s][0]);
        CHECK_INT_EQ(bad, 0);
        const int n_ranges = atomic_load(&r.n_ranges);
        CHECK_INT_EQ(n_ranges, sizes[s][2]);
        if (n_ranges == 1) CHECK_INT_EQ(atomic_load(&r.shortest), sizes[s][0]);
        if (n_ranges > 1) CHECK(atomic_load(&r.shortest) >= sizes[s][1]);
    }
    nm_pool_free(pool);
    CHECK_INT_EQ(nm_pool_new(0, &pool, &err), NM_ERR_INVALID_ARG);
}

/* nm_matmul_parallel_n: each matrix's outputs (rows of ldy wider than its
 * columns, whose padding stays untouched) bit for bit those of one
 * nm_matmul_forward call, on pools of 1 to 3 threads, for matrices of
 * uneven widths (200, 24, 40 columns: tiles cross no matrix). */
static void test_matmul_parallel_n(void) {
    enum { M = 5, K = 64, PAD = 3 };
    const int64_t ns[3] = {200, 24, 40};
    static float wdata[3][200 * K], x[M * K], want[3][M * (200 + PAD)], got[3][M * (200 + PAD)];
    for (int i = 0; i < M * K; i++)
        x[i] = frand();
    nm_mat mats[3];
    const nm_mat *w[3];
    float *y[3];
    int64_t ldy[3];
    for (int a = 0; a < 3; a++) {
        for (int64_t i = 0; i < ns[a] * K; i++)
            wdata[a][i] = frand();
        mats[a] = (nm_mat){.data = wdata[a],
                           .type = NM_DTYPE_F32,
                           .n = ns[a],
                           .k = K,
                           .row_bytes = K * sizeof(float)};
        w[a] = &mats[a];
        y[a] = got[a];
        ldy[a] = ns[a] + PAD;
        memset(want[a], 0, sizeof want[a]);
        nm_matmul_forward(&mats[a], x, K, M, want[a], ldy[a], 0, ns[a]);
    }
    for (int threads = 1; threads <= 3; threads++) {
        nm_pool *pool = NULL;
        nm_error err = {0};
        CHECK_INT_EQ(nm_pool_new(threads, &pool, &err), NM_OK);
        for (int n_w = 1; n_w <= 3; n_w++) {
            for (int a = 0; a < 3; a++)
                memset(got[a], 0, sizeof got[a]);
            nm_matmul_parallel_n(pool, n_w, w, x, K, M, y, ldy);
            for (int a = 0; a < 3; a++)
                CHECK(memcmp(got[a], a < n_w ? want[a] : (float[M * (200 + PAD)]){0},
                             sizeof got[a]) == 0);
        }
        nm_pool_free(pool);
    }
}

int main(void) {
    test_conversions();
    test_matmul();
    test_matmul_quants();
    test_elementwise();
    test_rope();
    test_rope_yarn();
    test_glu_sink();
    test_swiglu_bits();
    test_attention();
    test_attention_rows();
    test_attention_widths();
    test_pool();
    test_matmul_parallel_n();
    return nm_test_finish("test_kernels");
}
