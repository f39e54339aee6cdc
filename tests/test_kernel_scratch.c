/* The per-thread kernel scratch of the int8 variants (avx512vnni, amx:
 * nm_kernel_scratch, kernels/mat.c) on threads of their own: a thread whose
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
    bool fail_alloc;    /* every allocation on the thread fails */
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

static void test_scratch_threads(void) {
    const nm_kernels_isa start = nm_kernels_active();
    const nm_kernels_isa isas[] = {NM_KERNELS_AVX512VNNI, NM_KERNELS_AMX};
    enum { M = 300, N = 16, K = 4096 };
    const size_t rb = (size_t)K / 256 * NM_Q4_K_BYTES;
    uint8_t *w = malloc(N * rb);
    float *row = malloc(K * sizeof(float));
    float *x = malloc((size_t)M * K * sizeof(float));
    float *y[3];
    for (int i = 0; i < 3; i++)
        y[i] = malloc((size_t)M * N * sizeof(float));
    for (int64_t j = 0; j < N; j++) {
        for (int64_t i = 0; i < K; i++)
            row[i] = frand();
        CHECK_INT_EQ(nm_quantize_row(NM_DTYPE_Q4_K, row, w + j * rb, K, NULL), NM_OK);
    }
    for (int64_t i = 0; i < (int64_t)M * K; i++)
        x[i] = frand();
    const nm_mat mat = {.data = w, .type = NM_DTYPE_Q4_K, .n = N, .k = K, .row_bytes = rb};
    int ran = 0;
    for (size_t v = 0; v < sizeof isas / sizeof isas[0]; v++) {
        if (!nm_kernels_isa_supported(isas[v])) {
            printf("variant %s: not supported here, skipped\n", nm_kernels_isa_name(isas[v]));
            continue;
        }
        ran++;
        CHECK(nm_kernels_force(isas[v]));
        nm_matmul_forward(&mat, x, K, M, y[0], N, 0, N); /* this thread's scratch */
        /* one thread without a scratch */
        thread_call lone = {.mat = &mat, .x = x, .m = M, .y = y[1], .fail_alloc = true};
        pthread_t t[2];
        CHECK_INT_EQ(pthread_create(&t[0], NULL, call_main, &lone), 0);
        CHECK_INT_EQ(pthread_join(t[0], NULL), 0);
        CHECK(!lone.scratch_taken);
        CHECK(memcmp(y[0], y[1], (size_t)M * N * sizeof(float)) == 0);
        /* two at once, each with its own */
        thread_call both[2] = {{.mat = &mat, .x = x, .m = M, .y = y[1]},
                               {.mat = &mat, .x = x, .m = M, .y = y[2]}};
        for (int i = 0; i < 2; i++)
            CHECK_INT_EQ(pthread_create(&t[i], NULL, call_main, &both[i]), 0);
        for (int i = 0; i < 2; i++) {
            CHECK_INT_EQ(pthread_join(t[i], NULL), 0);
            CHECK(both[i].scratch_taken);
            CHECK(memcmp(y[0], y[1 + i], (size_t)M * N * sizeof(float)) == 0);
        }
    }
    printf("kernel scratch: %d int8 variants run on threads of their own\n", ran);
    nm_kernels_force(start);
    free(w);
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
