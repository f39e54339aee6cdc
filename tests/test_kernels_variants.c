/* Every kernel variant this CPU supports against the reference kernels:
 * matmul for F32/F16/BF16/Q8_0 weights on awkward sizes (1 row, K not a
 * multiple of the vector width, very long rows), results independent of the
 * row count and of the column range, attention; and Q8_0 dequantisation
 * against its closed form and bit for bit against ggml's. Tolerance of a matmul output: |y - y_ref|
 * <= 2 * K * 2^-24 * sum_k |x_k w_k| + 1e-30 (two float sums of K terms in different orders each
 * err by at most K * u * sum|terms|); avx512bf16 with BF16 weights rounds activations to bfloat16
 * and adds 2^-8 * sum|x w|. */
#include "harness.h"

#include "gguf/gguf.h"
#include "kernels/kernels-impl.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* Random weights of a type as stored, and the same values as floats. */
static uint8_t *make_weights(uint32_t type, int64_t n, int64_t k, float *wf, size_t *row_bytes) {
    CHECK(nm_dtype_row_bytes(type, k, row_bytes));
    uint8_t *w = calloc((size_t)n, *row_bytes);
    for (int64_t j = 0; j < n; j++) {
        uint8_t *row = w + (size_t)j * *row_bytes;
        if (type == NM_DTYPE_Q8_0) {
            for (int64_t b = 0; b < k / 32; b++) {
                uint8_t *blk = row + b * 34;
                uint16_t d = nm_f32_to_f16(0.01f + 0.02f * (frand() + 1.0f));
                memcpy(blk, &d, 2);
                for (int i = 0; i < 32; i++)
                    blk[2 + i] = (uint8_t)(int8_t)(int)(frand() * 127.0f);
            }
        } else {
            for (int64_t q = 0; q < k; q++) {
                float v = frand();
                if (type == NM_DTYPE_F32) {
                    memcpy(row + 4 * q, &v, 4);
                } else {
                    uint16_t h = type == NM_DTYPE_F16 ? nm_f32_to_f16(v) : nm_f32_to_bf16(v);
                    memcpy(row + 2 * q, &h, 2);
                }
            }
        }
        nm_dequantize_row((nm_dtype)type, row, wf + j * k, k);
    }
    return w;
}

static void check_matmul(nm_kernels_isa isa, uint32_t type, int64_t m, int64_t n, int64_t k) {
    size_t rb = 0;
    float *wf = malloc((size_t)(n * k) * sizeof(float));
    uint8_t *w = make_weights(type, n, k, wf, &rb);
    float *x = malloc((size_t)(m * k) * sizeof(float));
    float *y = malloc((size_t)(m * n) * sizeof(float));
    float *yr = malloc((size_t)(m * n) * sizeof(float));
    float *y1 = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < m * k; i++)
        x[i] = frand();
    nm_mat mat = {.data = w, .type = type, .n = n, .k = k, .row_bytes = rb};
    nm_matmul_ref_forward(&mat, x, k, m, yr, n, 0, n);
    CHECK(nm_kernels_force(isa));
    nm_matmul_forward(&mat, x, k, m, y, n, 0, n);
    int bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double mag = 0;
            for (int64_t q = 0; q < k; q++)
                mag += fabs((double)x[i * k + q] * wf[j * k + q]);
            double e = fabs((double)y[i * n + j] - yr[i * n + j]);
            double tol = 2.0 * (double)k * 0x1.0p-24 * mag + 1e-30;
            /* activations rounded to bfloat16: up to 2^-9 each, both sides */
            if (isa == NM_KERNELS_AVX512BF16 && type == NM_DTYPE_BF16) tol += 0x1.0p-8 * mag;
            /* and Q8_0 weights too: 2^-9 more */
            if (isa == NM_KERNELS_AVX512BF16 && type == NM_DTYPE_Q8_0) tol += 0x1.8p-8 * mag;
            if (e > tol) bad++;
            if (e / (mag + 1e-30) > worst) worst = e / (mag + 1e-30);
        }
    if (bad)
        fprintf(stderr, "%s matmul %s m=%lld n=%lld k=%lld: %d outside, worst rel %.3g\n",
                nm_kernels_isa_name(isa), nm_dtype_name(type), (long long)m, (long long)n,
                (long long)k, bad, worst);
    CHECK_INT_EQ(bad, 0);
    /* the last row alone, over a column range split in two: the same bits */
    const int64_t split = n / 2 + (n > 2);
    nm_matmul_forward(&mat, x + (m - 1) * k, k, 1, y1, n, 0, split);
    nm_matmul_forward(&mat, x + (m - 1) * k, k, 1, y1, n, split, n);
    CHECK(memcmp(y1, y + (m - 1) * n, (size_t)n * sizeof(float)) == 0);
    free(w);
    free(wf);
    free(x);
    free(y);
    free(yr);
    free(y1);
}

static void check_attention(nm_kernels_isa isa, int nh, int nkv, int hd, int t) {
    const int64_t stride = (int64_t)nkv * hd;
    float *q = malloc((size_t)nh * hd * sizeof(float));
    float *k = malloc((size_t)t * stride * sizeof(float));
    float *v = malloc((size_t)t * stride * sizeof(float));
    float *o = malloc((size_t)nh * hd * sizeof(float));
    float *orf = malloc((size_t)nh * hd * sizeof(float));
    float *s = malloc((size_t)t * sizeof(float));
    for (int i = 0; i < nh * hd; i++)
        q[i] = frand();
    for (int64_t i = 0; i < t * stride; i++)
        k[i] = frand(), v[i] = frand();
    nm_attention_ref_forward(q, k, v, stride, t, nh, nkv, hd, 0.3f, orf, s);
    CHECK(nm_kernels_force(isa));
    nm_attention_forward(q, k, v, stride, t, nh, nkv, hd, 0.3f, o, s);
    /* outputs are averages of values in [-1, 1]; float sums of t terms */
    double worst = 0;
    for (int i = 0; i < nh * hd; i++)
        if (fabs(o[i] - orf[i]) > worst) worst = fabs(o[i] - orf[i]);
    if (!(worst < 1e-6 * (4 + hd + t)))
        fprintf(stderr, "%s attention %d/%d x %d, %d positions: max diff %.3g\n",
                nm_kernels_isa_name(isa), nh, nkv, hd, t, worst);
    CHECK(worst < 1e-6 * (4 + hd + t));
    free(q);
    free(k);
    free(v);
    free(o);
    free(orf);
    free(s);
}

/* The F16-cache attention against the reference over the same halves. */
static void check_attention_f16(nm_kernels_isa isa, int nh, int nkv, int hd, int t) {
    const int64_t stride = (int64_t)nkv * hd;
    float *q = malloc((size_t)nh * hd * sizeof(float));
    uint16_t *k = malloc((size_t)t * stride * 2), *v = malloc((size_t)t * stride * 2);
    float *o = malloc((size_t)nh * hd * sizeof(float)),
          *orf = malloc((size_t)nh * hd * sizeof(float));
    float *s = malloc((size_t)t * sizeof(float));
    for (int i = 0; i < nh * hd; i++)
        q[i] = frand();
    for (int64_t i = 0; i < t * stride; i++)
        k[i] = nm_f32_to_f16(frand()), v[i] = nm_f32_to_f16(frand());
    nm_attention_f16_ref_forward(q, k, v, stride, t, nh, nkv, hd, 0.3f, orf, s);
    CHECK(nm_kernels_force(isa));
    nm_attention_f16_forward(q, k, v, stride, t, nh, nkv, hd, 0.3f, o, s);
    double worst = 0;
    for (int i = 0; i < nh * hd; i++)
        if (fabs(o[i] - orf[i]) > worst) worst = fabs(o[i] - orf[i]);
    if (!(worst < 1e-6 * (4 + hd + t)))
        fprintf(stderr, "%s f16 attention %d/%d x %d, %d positions: max diff %.3g\n",
                nm_kernels_isa_name(isa), nh, nkv, hd, t, worst);
    CHECK(worst < 1e-6 * (4 + hd + t));
    free(q);
    free(k);
    free(v);
    free(o);
    free(orf);
    free(s);
}

static void test_q8_0_dequant(void) {
    uint8_t blk[2 * 34];
    for (int b = 0; b < 2; b++) {
        uint16_t d = nm_f32_to_f16(b ? -0.5f : 0.25f);
        memcpy(blk + b * 34, &d, 2);
        for (int i = 0; i < 32; i++)
            blk[b * 34 + 2 + i] = (uint8_t)(int8_t)(i - 16 + b * 100);
    }
    float out[64];
    nm_dequantize_row(NM_DTYPE_Q8_0, blk, out, 64);
    CHECK(out[0] == 0.25f * -16 && out[31] == 0.25f * 15);
    CHECK(out[32] == -0.5f * 84 && out[63] == -0.5f * 115);
    CHECK(nm_dtype_is_supported(NM_DTYPE_Q8_0));
    size_t rb = 0;
    CHECK(nm_dtype_row_bytes(NM_DTYPE_Q8_0, 2048, &rb) && rb == 2176);
}

/* Q8_0 rows of llama.cpp's quantised tiny model, dequantised by ggml's own
 * to_float (dequant.txt: "name type row ne0 v0 ..."), bit for bit. */
static void test_q8_0_golden(void) {
    const char *dir = NM_VECTORS_DIR "/tiny-qwen3moe-q-Q8_0";
    char path[512];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    nm_gguf *g = NULL;
    nm_error err = {0};
    if (nm_gguf_open(path, &g, &err) != NM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        CHECK(!"the Q8_0 golden model opens");
        return;
    }
    snprintf(path, sizeof path, "%s/dequant.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    static char line[1 << 16];
    int rows = 0, mismatches = 0;
    float *out = malloc(4096 * sizeof(float));
    while (f && fgets(line, sizeof line, f)) {
        char name[128], type[16];
        long row, ne0;
        int used = 0;
        if (sscanf(line, "%127s %15s %ld %ld%n", name, type, &row, &ne0, &used) != 4) continue;
        if (strcmp(type, "q8_0") != 0 || ne0 > 4096) continue;
        const nm_gguf_tensor *t = nm_gguf_find_tensor(g, name);
        CHECK(t != NULL && t->type == NM_DTYPE_Q8_0 && t->ne[0] == ne0);
        if (!t) continue;
        size_t rb = 0;
        nm_dtype_row_bytes(NM_DTYPE_Q8_0, ne0, &rb);
        nm_dequantize_row(NM_DTYPE_Q8_0, (const uint8_t *)t->data + (size_t)row * rb, out, ne0);
        char *p = line + used;
        for (long i = 0; i < ne0; i++) {
            float v = strtof(p, &p);
            if (memcmp(&v, &out[i], sizeof v) != 0) mismatches++;
        }
        rows++;
    }
    if (f) fclose(f);
    free(out);
    nm_gguf_close(g);
    printf("q8_0 dequantisation: %d golden rows, %d values differ\n", rows, mismatches);
    CHECK(rows >= 20);
    CHECK_INT_EQ(mismatches, 0);
}

static void test_names(void) {
    nm_kernels_isa isa;
    CHECK(nm_kernels_isa_parse("avx512", &isa) && isa == NM_KERNELS_AVX512);
    CHECK(!nm_kernels_isa_parse("sse", &isa));
    CHECK(nm_kernels_isa_supported(NM_KERNELS_REF));
    CHECK(strcmp(nm_kernels_isa_name(NM_KERNELS_AVX2), "avx2") == 0);
}

int main(void) {
    test_q8_0_dequant();
    test_q8_0_golden();
    test_names();
    const nm_kernels_isa start = nm_kernels_active();
    const uint32_t types[4] = {NM_DTYPE_F32, NM_DTYPE_F16, NM_DTYPE_BF16, NM_DTYPE_Q8_0};
    const int64_t shapes[][3] = {{1, 1, 1},     {1, 7, 3},      {3, 5, 257},  {17, 33, 300},
                                 {2, 3, 4099},  {5, 9, 16},     {4, 4, 64},   {9, 6, 33},
                                 {1, 5, 70001}, {70, 13, 2048}, {130, 3, 20}, {6, 70, 96}};
    for (int isa = 0; isa < NM_KERNELS_COUNT; isa++) {
        if (!nm_kernels_isa_supported((nm_kernels_isa)isa)) {
            printf("variant %s: not supported here, skipped\n",
                   nm_kernels_isa_name((nm_kernels_isa)isa));
            continue;
        }
        for (int t = 0; t < 4; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                int64_t k = shapes[s][2];
                if (types[t] == NM_DTYPE_Q8_0) k = (k + 31) / 32 * 32;
                check_matmul((nm_kernels_isa)isa, types[t], shapes[s][0], shapes[s][1], k);
            }
        check_attention((nm_kernels_isa)isa, 4, 2, 2, 3);
        check_attention((nm_kernels_isa)isa, 8, 2, 20, 1);
        check_attention((nm_kernels_isa)isa, 32, 4, 128, 300);
        check_attention((nm_kernels_isa)isa, 6, 3, 17, 41);
        check_attention((nm_kernels_isa)isa, 8, 2, 64, 37);
        check_attention((nm_kernels_isa)isa, 4, 1, 256, 9);
        check_attention_f16((nm_kernels_isa)isa, 32, 4, 128, 200);
        check_attention_f16((nm_kernels_isa)isa, 6, 3, 17, 5);
        printf("variant %s: checked\n", nm_kernels_isa_name((nm_kernels_isa)isa));
    }
    nm_kernels_force(start);
    return nm_test_finish("test_kernels_variants");
}
