/* The reference kernels against closed forms and double-precision sums:
 * half/bfloat16 conversions, matmul for F32/F16/BF16 at awkward sizes,
 * RMSNorm, NeoX RoPE, softmax, SwiGLU, attention; and the thread pool. */
#include "harness.h"

#include "kernels/kernels.h"
#include "tensor/tensor.h"
#include "threads/threads.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

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

static void test_matmul_type(uint32_t type, int64_t m, int64_t n, int64_t k) {
    const size_t esz = type == NM_DTYPE_F32 ? 4 : 2;
    uint8_t *w = malloc((size_t)(n * k) * esz);
    float *wf = malloc((size_t)(n * k) * sizeof(float)); /* the weights as stored */
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
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < k; q++) {
                ref += (double)x[i * k + q] * wf[j * k + q];
                mag += fabs((double)x[i * k + q] * wf[j * k + q]);
            }
            /* float accumulation: error bounded by ~k * eps * sum|terms| */
            double e = fabs(y[i * n + j] - ref) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    if (!(worst < 1e-6 * (double)k + 1e-6))
        fprintf(stderr, "matmul %s m=%lld n=%lld k=%lld: rel err %.3g\n", nm_dtype_name(type),
                (long long)m, (long long)n, (long long)k, worst);
    CHECK(worst < 1e-6 * (double)k + 1e-6);
    free(w);
    free(wf);
    free(x);
    free(y);
}

static void test_matmul(void) {
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

static void test_attention(void) {
    /* 4 query heads share 2 kv heads of 2 dims; 3 cached positions */
    enum { NH = 4, NKV = 2, HD = 2, T = 3 };
    float q[NH * HD], k[T * NKV * HD], v[T * NKV * HD], out[NH * HD], scores[T];
    for (int i = 0; i < NH * HD; i++)
        q[i] = frand();
    for (int i = 0; i < T * NKV * HD; i++)
        k[i] = frand(), v[i] = frand();
    nm_attention_forward(q, k, v, NKV * HD, T, NH, NKV, HD, 0.5f, out, scores);
    for (int h = 0; h < NH; h++) {
        const int kvh = h / (NH / NKV);
        double w[T], sum = 0;
        for (int t = 0; t < T; t++) {
            double d = 0;
            for (int j = 0; j < HD; j++)
                d += (double)q[h * HD + j] * k[t * NKV * HD + kvh * HD + j];
            w[t] = exp(0.5 * d);
            sum += w[t];
        }
        for (int j = 0; j < HD; j++) {
            double ref = 0;
            for (int t = 0; t < T; t++)
                ref += w[t] / sum * v[t * NKV * HD + kvh * HD + j];
            CHECK_NEAR(out[h * HD + j], ref, 1e-6);
        }
    }
    /* one position: the output is its value row */
    nm_attention_forward(q, k, v, NKV * HD, 1, NH, NKV, HD, 0.5f, out, scores);
    CHECK(out[0] == v[0] && out[HD * 2 + 1] == v[HD + 1]);
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
    nm_pool_free(pool);
    CHECK_INT_EQ(nm_pool_new(0, &pool, &err), NM_ERR_INVALID_ARG);
}

int main(void) {
    test_conversions();
    test_matmul();
    test_elementwise();
    test_rope();
    test_attention();
    test_pool();
    return nm_test_finish("test_kernels");
}
