/* The per-thread kernel scratch of the int8 variants (avx512vnni, amx:
 * nm_kernel_scratch, kernels/mat.c), and of amx's BF16 products of many
 * rows, on threads of their own: a thread whose
 * scratch cannot be had (its first allocation fails) works in its stack
 * buffer, many blocks of rows, and gives the bits of the scratch's few
 * blocks; two threads running the same product at once, each in a scratch
 * of its own freed when it exits, give those bits too. A program apart
 * from test_kernels_variants so that the ThreadSanitizer build (tools/
 * test.sh) runs these threads without that program's single-threaded
 * sweep of every variant. Variants this CPU lacks are skipped. */
#include "harness.h"

#include "base/base.h"
#include "kernels/kernels-impl.h"
#include "tensor/tensor.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { return nm_test_frand(&rng); }

/* A product of more rows than the stack's block of quantised rows holds
 * at this K (so the scratch is asked for), on a thread of its own. */
typedef struct thread_call {
    const nm_mat *mat;
    const float *x;
    int64_t m;
    float *y;
    bool fail_alloc;    /* the thread's first allocation fails */
    bool scratch_taken; /* whether the thread had a scratch afterwards */
} thread_call;

static void *call_main(void *p) {
    thread_call *c = p;
    if (c->fail_alloc) nm_alloc_fail_after(0);
    nm_matmul_forward(c->mat, c->x, c->mat->k, c->m, c->y, c->mat->n, 0, c->mat->n);
    if (c->fail_alloc) nm_alloc_fail_after(-1);
    c->scratch_taken = nm_kernel_scratch(0) != NULL; /* NULL: nothing was ever allocated */
    return NULL;
}

/* mat (m rows of x) on this thread (in its scratch), on a thread whose
 * first allocation fails (in its stack buffer), and on two threads at once with
 * their own scratch: the same bits each time. */
static void check_threads(const nm_mat *mat, const float *x, int64_t m, float *y[3]) {
    const size_t bytes = (size_t)m * (size_t)mat->n * sizeof(float);
    nm_matmul_forward(mat, x, mat->k, m, y[0], mat->n, 0, mat->n); /* this thread's scratch */
    /* one thread without a scratch */
    thread_call lone = {.mat = mat, .x = x, .m = m, .y = y[1], .fail_alloc = true};
    pthread_t t[2];
    CHECK_INT_EQ(pthread_create(&t[0], NULL, call_main, &lone), 0);
    CHECK_INT_EQ(pthread_join(t[0], NULL), 0);
    CHECK(!lone.scratch_taken);
    CHECK(memcmp(y[0], y[1], bytes) == 0);
    /* two at once, each with its own */
    thread_call both[2] = {{.mat = mat, .x = x, .m = m, .y = y[1]},
                           {.mat = mat, .x = x, .m = m, .y = y[2]}};
    for (int i = 0; i < 2; i++)
        CHECK_INT_EQ(pthread_create(&t[i], NULL, call_main, &both[i]), 0);
    for (int i = 0; i < 2; i++) {
        CHECK_INT_EQ(pthread_join(t[i], NULL), 0);
        CHECK(both[i].scratch_taken);
        CHECK(memcmp(y[0], y[1 + i], bytes) == 0);
    }
}

/* Q4_K under both int8 variants; BF16 under amx too, whose products of
 * more than four row tiles round their activations into the scratch (one
 * slice of K, so one request a call, which fails on the lone thread). */
static void test_scratch_threads(void) {
    const nm_kernels_isa start = nm_kernels_active();
    const nm_kernels_isa isas[] = {NM_KERNELS_AVX512VNNI, NM_KERNELS_AMX};
    enum { M = 300, N = 16, K = 4096, K16 = 2048 };
    const size_t rb = (size_t)K / 256 * NM_Q4_K_BYTES, rb16 = (size_t)K16 * 2;
    uint8_t *w = malloc(N * rb), *w16 = malloc(N * rb16);
    float *row = malloc(K * sizeof(float));
    float *x = malloc((size_t)M * K * sizeof(float));
    float *y[3];
    for (int i = 0; i < 3; i++)
        y[i] = malloc((size_t)M * N * sizeof(float));
    for (int64_t j = 0; j < N; j++) {
        for (int64_t i = 0; i < K; i++)
            row[i] = frand();
        CHECK_INT_EQ(nm_quantize_row(NM_DTYPE_Q4_K, row, w + j * rb, K, NULL), NM_OK);
        CHECK_INT_EQ(nm_quantize_row(NM_DTYPE_BF16, row, w16 + j * rb16, K16, NULL), NM_OK);
    }
    for (int64_t i = 0; i < (int64_t)M * K; i++)
        x[i] = frand();
    const nm_mat mat = {.data = w, .type = NM_DTYPE_Q4_K, .n = N, .k = K, .row_bytes = rb};
    const nm_mat mat16 = {.data = w16, .type = NM_DTYPE_BF16, .n = N, .k = K16, .row_bytes = rb16};
    int ran = 0;
    for (size_t v = 0; v < sizeof isas / sizeof isas[0]; v++) {
        if (!nm_kernels_isa_supported(isas[v])) {
            printf("variant %s: not supported here, skipped\n", nm_kernels_isa_name(isas[v]));
            continue;
        }
        ran++;
        CHECK(nm_kernels_force(isas[v]));
        check_threads(&mat, x, M, y);
        if (isas[v] == NM_KERNELS_AMX) check_threads(&mat16, x, M, y);
    }
    printf("kernel scratch: %d int8 variants run on threads of their own\n", ran);
    nm_kernels_force(start);
    free(w);
    free(w16);
    free(row);
    free(x);
    for (int i = 0; i < 3; i++)
        free(y[i]);
}
#endif

int main(void) {
#if defined(__x86_64__)
    test_scratch_threads();
#else
    printf("no int8 x86 variants on this CPU: nothing to run\n");
#endif
    return nm_test_finish("test_kernel_scratch");
}
