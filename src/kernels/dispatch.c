/* Chooses the kernel variant once (NPUMOE_KERNELS, else the best one CPUID
 * allows) and routes the dispatched kernels to it. The choice is one atomic
 * value written before any work starts; it is not per-call state. */
#include "kernels-impl.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char *const isa_names[NM_KERNELS_COUNT] = {
    [NM_KERNELS_REF] = "ref",
    [NM_KERNELS_AVX2] = "avx2",
    [NM_KERNELS_AVX512] = "avx512",
    [NM_KERNELS_AVX512BF16] = "avx512bf16",
    [NM_KERNELS_AVX512VNNI] = "avx512vnni",
};
_Static_assert(sizeof isa_names / sizeof isa_names[0] == NM_KERNELS_COUNT, "one name per isa");

/* -1 until chosen */
static atomic_int active_isa = -1;

const char *nm_kernels_isa_name(nm_kernels_isa isa) {
    return (unsigned)isa < NM_KERNELS_COUNT ? isa_names[isa] : "unknown";
}

bool nm_kernels_isa_parse(const char *name, nm_kernels_isa *out) {
    for (int i = 0; i < NM_KERNELS_COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0) {
            *out = (nm_kernels_isa)i;
            return true;
        }
    return false;
}

#if defined(__x86_64__)
/* CPUID.1:ECX bit 29 (clang's __builtin_cpu_supports has no "f16c"). */
static bool has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
}
#endif

bool nm_kernels_isa_supported(nm_kernels_isa isa) {
    switch (isa) {
    case NM_KERNELS_REF:
        return true;
#if defined(__x86_64__)
    case NM_KERNELS_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case NM_KERNELS_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case NM_KERNELS_AVX512BF16:
        return nm_kernels_isa_supported(NM_KERNELS_AVX512) && __builtin_cpu_supports("avx512bf16");
    case NM_KERNELS_AVX512VNNI: /* delegates BF16 weights to avx512bf16 */
        return nm_kernels_isa_supported(NM_KERNELS_AVX512BF16) &&
               __builtin_cpu_supports("avx512vnni");
#endif
    default:
        return false;
    }
}

/* The fastest variant the CPU runs. avx512bf16 and avx512vnni round the
 * activations of BF16 and quantised matmuls to bfloat16 and int8 blocks, as
 * llama.cpp does; measured on the shipped model (docs/PERFORMANCE.md) that
 * costs 0.000-0.015% perplexity, while prompt processing runs 1.5-2.2x and
 * decoding of quantised files 1.3-3x faster. NPUMOE_KERNELS=avx512 keeps
 * every activation in FP32. */
static nm_kernels_isa best_isa(void) {
    for (int i = NM_KERNELS_COUNT - 1; i > 0; i--)
        if (nm_kernels_isa_supported((nm_kernels_isa)i)) return (nm_kernels_isa)i;
    return NM_KERNELS_REF;
}

nm_kernels_isa nm_kernels_exact(void) {
    for (int i = NM_KERNELS_AVX512; i > 0; i--)
        if (nm_kernels_isa_supported((nm_kernels_isa)i)) return (nm_kernels_isa)i;
    return NM_KERNELS_REF;
}

/* A variant's name, or "exact" for nm_kernels_exact(). */
static bool env_variant(const char *env, nm_kernels_isa *out) {
    if (strcmp(env, "exact") == 0) {
        *out = nm_kernels_exact();
        return true;
    }
    return nm_kernels_isa_parse(env, out);
}

nm_kernels_isa nm_kernels_active(void) {
    int isa = atomic_load_explicit(&active_isa, memory_order_relaxed);
    if (isa >= 0) return (nm_kernels_isa)isa;
    nm_kernels_isa chosen = best_isa();
    const char *env = getenv("NPUMOE_KERNELS");
    nm_kernels_isa want;
    /* a bad value is reported by nm_kernels_check_env (the CLI calls it);
     * here it leaves the automatic choice */
    if (env && env_variant(env, &want) && nm_kernels_isa_supported(want)) chosen = want;
    int expected = -1;
    atomic_compare_exchange_strong(&active_isa, &expected, (int)chosen);
    return (nm_kernels_isa)atomic_load(&active_isa);
}

bool nm_kernels_force(nm_kernels_isa isa) {
    if (!nm_kernels_isa_supported(isa)) return false;
    atomic_store(&active_isa, (int)isa);
    return true;
}

bool nm_kernels_check_env(const char **bad) {
    const char *env = getenv("NPUMOE_KERNELS");
    if (!env || !*env) return true;
    nm_kernels_isa want;
    if (!env_variant(env, &want) || !nm_kernels_force(want)) {
        *bad = env;
        return false;
    }
    return true;
}

bool nm_mat_repack_wanted(const nm_mat *w) {
#if defined(__x86_64__)
    return nm_kernels_active() == NM_KERNELS_AVX512VNNI && w->layout == NM_LAYOUT_ROWS &&
           w->n >= 16 && nm_kernels_is_block_quant(w->type);
#else
    (void)w;
    return false;
#endif
}

nm_mat nm_mat_repack(const nm_mat *w, void *dst) {
    NM_ASSERT(nm_mat_repack_wanted(w));
    nm_mat out = *w;
#if defined(__x86_64__)
    nm_avx512vnni_repack(w, dst);
    out.data = dst;
    out.layout = NM_LAYOUT_PANEL16;
#endif
    return out;
}

void nm_matmul_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                       int64_t ldy, int64_t j0, int64_t j1) {
    /* a repacked matrix is in avx512vnni's own layout */
    const nm_kernels_isa isa =
        w->layout == NM_LAYOUT_PANEL16 ? NM_KERNELS_AVX512VNNI : nm_kernels_active();
    switch (isa) {
#if defined(__x86_64__)
    case NM_KERNELS_AVX512VNNI:
        nm_matmul_avx512vnni_forward(w, x, ldx, m, y, ldy, j0, j1);
        return;
    case NM_KERNELS_AVX512BF16:
        nm_matmul_avx512bf16_forward(w, x, ldx, m, y, ldy, j0, j1);
        return;
    case NM_KERNELS_AVX512:
        nm_matmul_avx512_forward(w, x, ldx, m, y, ldy, j0, j1);
        return;
    case NM_KERNELS_AVX2:
        nm_matmul_avx2_forward(w, x, ldx, m, y, ldy, j0, j1);
        return;
#endif
    default:
        nm_matmul_ref_forward(w, x, ldx, m, y, ldy, j0, j1);
    }
}

void nm_attention_forward(const float *q, const float *k_cache, const float *v_cache,
                          int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv, int head_dim,
                          float scale, float *out, float *scores) {
#if defined(__x86_64__)
    if (nm_kernels_active() >= NM_KERNELS_AVX512) { /* the AVX-512 variants share it */
        nm_attention_avx512_forward(q, k_cache, v_cache, kv_stride, n_kv, n_head, n_head_kv,
                                    head_dim, scale, out, scores);
        return;
    }
#endif
    nm_attention_ref_forward(q, k_cache, v_cache, kv_stride, n_kv, n_head, n_head_kv, head_dim,
                             scale, out, scores);
}

void nm_attention_f16_forward(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                              int head_dim, float scale, float *out, float *scores) {
#if defined(__x86_64__)
    if (nm_kernels_active() >= NM_KERNELS_AVX512) { /* the AVX-512 variants share it */
        nm_attention_f16_avx512_forward(q, k_cache, v_cache, kv_stride, n_kv, n_head, n_head_kv,
                                        head_dim, scale, out, scores);
        return;
    }
#endif
    nm_attention_f16_ref_forward(q, k_cache, v_cache, kv_stride, n_kv, n_head, n_head_kv, head_dim,
                                 scale, out, scores);
}
