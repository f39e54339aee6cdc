/* Chooses the kernel variant once (NPUMOE_KERNELS, else the best one CPUID
 * allows) and routes the dispatched kernels to it. The choice is one atomic
 * value written before any work starts; it is not per-call state. */
#include "kernels-impl.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isa_names[NM_KERNELS_COUNT] = {
    [NM_KERNELS_REF] = "ref",
    [NM_KERNELS_AVX2] = "avx2",
    [NM_KERNELS_AVX512] = "avx512",
    [NM_KERNELS_AVX512BF16] = "avx512bf16",
    [NM_KERNELS_AVX512VNNI] = "avx512vnni",
    [NM_KERNELS_AMX] = "amx",
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

bool nm_kernels_amx_emulated(void) {
#if defined(NM_AMX_EMULATE)
    return true;
#else
    return false;
#endif
}

/* Whether the CPU has AMX and the kernel grants the tile state: -1 until
 * asked, then 0 or 1; amx_note says which, and why not. */
static atomic_int amx_state = -1;
static char amx_note[160];

#if defined(__x86_64__)
enum { ARCH_REQ_XCOMP_PERM_ = 0x1023, XFEATURE_XTILEDATA_ = 18 };

static int amx_probe(void) {
    unsigned a, b, c, d;
    /* CPUID.(7,0):EDX bit 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8 */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1u) || !((d >> 24) & 1u) ||
        !((d >> 25) & 1u)) {
        snprintf(amx_note, sizeof amx_note, "the CPU has no AMX-TILE/BF16/INT8");
        return 0;
    }
    /* Linux enables the 8 KiB tile state per process, on request */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) != 0) {
        snprintf(amx_note, sizeof amx_note,
                 "the CPU has AMX but the kernel refused the tile state (arch_prctl: %s)",
                 strerror(errno));
        return 0;
    }
    snprintf(amx_note, sizeof amx_note,
             "the CPU has AMX-TILE/BF16/INT8 and the kernel granted the tile state");
    return 1;
}
#endif

bool nm_kernels_amx_hardware(void) {
    int s = atomic_load(&amx_state);
    if (s >= 0) return s == 1;
#if defined(__x86_64__)
    static atomic_flag probing = ATOMIC_FLAG_INIT;
    /* one thread probes (amx_note is written once); others wait for it */
    if (!atomic_flag_test_and_set(&probing)) {
        atomic_store(&amx_state, amx_probe());
    } else {
        while (atomic_load(&amx_state) < 0) {
        }
    }
#else
    snprintf(amx_note, sizeof amx_note, "not an x86-64 CPU");
    atomic_store(&amx_state, 0);
#endif
    return atomic_load(&amx_state) == 1;
}

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
    case NM_KERNELS_AVX512VNNI: /* may delegate BF16 weights to avx512bf16 */
        return nm_kernels_isa_supported(NM_KERNELS_AVX512BF16) &&
               __builtin_cpu_supports("avx512vnni");
    case NM_KERNELS_AMX: /* the code around the tiles is avx512vnni's */
        return nm_kernels_isa_supported(NM_KERNELS_AVX512VNNI) &&
               (nm_kernels_amx_emulated() || nm_kernels_amx_hardware());
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
    for (int i = NM_KERNELS_COUNT - 1; i > 0; i--) {
        /* emulated tiles are for tests: only when asked for */
        if (i == NM_KERNELS_AMX && nm_kernels_amx_emulated()) continue;
        if (nm_kernels_isa_supported((nm_kernels_isa)i)) return (nm_kernels_isa)i;
    }
    return NM_KERNELS_REF;
}

/* avx2 quantises the activations of quantised weights: not exact. */
nm_kernels_isa nm_kernels_exact(void) {
    return nm_kernels_isa_supported(NM_KERNELS_AVX512) ? NM_KERNELS_AVX512 : NM_KERNELS_REF;
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

const char *nm_kernels_why(void) {
    static char why[512]; /* for the command's info; not for concurrent callers */
    const nm_kernels_isa isa = nm_kernels_active();
    const char *env = getenv("NPUMOE_KERNELS");
    nm_kernels_isa want;
    const bool asked = env && *env && env_variant(env, &want) && want == isa;
    const bool hw = nm_kernels_amx_hardware(); /* fills amx_note */
    /* which variants keep FP32 activations for quantised weights */
    const bool int8 =
        isa == NM_KERNELS_AVX2 || isa == NM_KERNELS_AVX512VNNI || isa == NM_KERNELS_AMX;
    /* and which round those of BF16 weights to bfloat16 */
    const bool bf16 = isa == NM_KERNELS_AVX512BF16 || isa == NM_KERNELS_AMX ||
                      (isa == NM_KERNELS_AVX512VNNI && !nm_kernels_bf16_in_fp32());
    snprintf(why, sizeof why, "%s; %s; %s; amx: %s%s",
             asked ? "NPUMOE_KERNELS asked for it" : "the fastest this CPU runs",
             int8 ? "int8 activations for Q8_0/Q4_0/Q4_K/Q5_K/Q6_K weights"
                  : "FP32 activations for quantised weights",
             bf16 ? "bfloat16 activations for BF16 weights"
             : isa == NM_KERNELS_AVX512VNNI
                 ? "FP32 activations for BF16 weights (vdpbf16ps runs at half the FMA rate on "
                   "Intel CPUs)"
                 : "FP32 activations for BF16 weights",
             amx_note,
             nm_kernels_amx_emulated() ? " (this build emulates the tiles: amx only when asked for)"
             : hw ? " (tiles for BF16 matmuls and quantised ones of 12 rows or more)"
                  : "");
    return why;
}

bool nm_kernels_bf16_in_fp32(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_is("intel");
#else
    return false;
#endif
}

int32_t nm_kernels_row_granule(void) { return nm_kernels_active() == NM_KERNELS_AMX ? 16 : 1; }

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
    bool reads; /* whether the variant in use reads this type in the layout */
    switch (nm_kernels_active()) {
    case NM_KERNELS_AVX2:
        reads = nm_matmul_avx2_quantises(w->type);
        break;
    case NM_KERNELS_AVX512VNNI:
    case NM_KERNELS_AMX:
        reads = nm_kernels_is_panel16_type(w->type);
        break;
    default:
        reads = false;
    }
    return reads && w->layout == NM_LAYOUT_ROWS && w->n >= 16;
#else
    (void)w;
    return false;
#endif
}

bool nm_kernels_huge_pages(void) {
    /* read once (a load asks for every matrix): 0 not yet, 1 no, 2 yes */
    static atomic_int known;
    int v = atomic_load(&known);
    if (v == 0) {
        FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
        char line[128];
        v = f && fgets(line, sizeof line, f) && strstr(line, "[never]") == NULL ? 2 : 1;
        if (f) fclose(f);
        atomic_store(&known, v);
    }
    return v == 2;
}

bool nm_mat_copy_wanted(const nm_mat *w) {
    return nm_kernels_active() == NM_KERNELS_AVX2 && w->layout == NM_LAYOUT_ROWS &&
           (w->type == NM_DTYPE_F32 || w->type == NM_DTYPE_F16 || w->type == NM_DTYPE_BF16) &&
           nm_kernels_huge_pages();
}

nm_mat nm_mat_repack(const nm_mat *w, void *dst) {
    NM_ASSERT(nm_mat_repack_wanted(w));
    nm_mat out = *w;
#if defined(__x86_64__)
    if (nm_kernels_active() == NM_KERNELS_AVX2)
        nm_avx2_repack(w, dst);
    else
        nm_avx512vnni_repack(w, dst);
    out.data = dst;
    out.layout = NM_LAYOUT_PANEL16;
#endif
    return out;
}

/* The variant that computes a matrix of this type in NM_LAYOUT_PANEL16
 * while isa is active: isa itself where it reads the layout (amx;
 * avx512vnni; avx2 for the types it quantises), else avx512vnni where the
 * CPU runs it, else avx2 (which made the copy: the same bits either way). */
static nm_kernels_isa panel16_reader(nm_kernels_isa isa, uint32_t type) {
#if defined(__x86_64__)
    if (isa == NM_KERNELS_AMX || isa == NM_KERNELS_AVX512VNNI) return isa;
    if (isa == NM_KERNELS_AVX2 && nm_matmul_avx2_quantises(type)) return isa;
    return nm_kernels_isa_supported(NM_KERNELS_AVX512VNNI) ? NM_KERNELS_AVX512VNNI
                                                           : NM_KERNELS_AVX2;
#else
    (void)type;
    return isa;
#endif
}

void nm_matmul_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                       int64_t ldy, int64_t j0, int64_t j1) {
    nm_kernels_isa isa = nm_kernels_active();
    if (w->layout == NM_LAYOUT_PANEL16) isa = panel16_reader(isa, w->type);
    switch (isa) {
#if defined(__x86_64__)
    case NM_KERNELS_AMX:
#if defined(NM_AMX_EMULATE)
        nm_matmul_amx_emu_forward(w, x, ldx, m, y, ldy, j0, j1);
#else
        nm_matmul_amx_hw_forward(w, x, ldx, m, y, ldy, j0, j1);
#endif
        return;
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
        nm_matmul_avx2_int8_forward(w, x, ldx, m, y, ldy, j0, j1);
        return;
#endif
    default:
        nm_matmul_ref_forward(w, x, ldx, m, y, ldy, j0, j1);
    }
}

void nm_matmul_swiglu_forward(const nm_mat *wg, const nm_mat *wu, const float *x, int64_t ldx,
                              int64_t m, float *h, int64_t ldh, float *u, int64_t ldu, int64_t j0,
                              int64_t j1) {
    /* the fused versions where nm_matmul_forward would run their variant
     * for both matrices; otherwise two of its calls */
    nm_kernels_isa isa = nm_kernels_active();
    if (wg->layout == NM_LAYOUT_PANEL16) isa = panel16_reader(isa, wg->type);
    if (wg->layout == wu->layout) switch (isa) {
#if defined(__x86_64__)
        case NM_KERNELS_AMX:
#if defined(NM_AMX_EMULATE)
            nm_matmul_swiglu_amx_emu_forward(wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
#else
            nm_matmul_swiglu_amx_hw_forward(wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
#endif
            return;
        case NM_KERNELS_AVX512VNNI:
            nm_matmul_swiglu_avx512vnni_forward(wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
            return;
        case NM_KERNELS_AVX2:
            nm_matmul_swiglu_avx2_forward(wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
            return;
#endif
        default:
            break;
        }
    nm_matmul_swiglu_by(nm_matmul_forward, wg, wu, x, ldx, m, h, ldh, u, ldu, j0, j1);
}

void nm_swiglu_forward(const float *g, const float *u, float *h, int64_t n) {
#if defined(__x86_64__)
    if (nm_kernels_active() >= NM_KERNELS_AVX2) {
        nm_swiglu_avx2_forward(g, u, h, n);
        return;
    }
#endif
    nm_swiglu_ref_forward(g, u, h, n);
}

/* Whether the blocked attention (x86/attention.c) runs: under avx2 and
 * every AVX-512 variant, for the head sizes its stack scratch holds. */
static bool blocked_attention(int head_dim) {
#if defined(__x86_64__)
    return nm_kernels_active() >= NM_KERNELS_AVX2 && head_dim <= NM_ATTENTION_HEAD_DIM_MAX;
#else
    (void)head_dim;
    return false;
#endif
}

/* Whether the blocked attention takes 16-lane vectors (the same bits as 8):
 * under the AVX-512 variants on Intel CPUs, whose two 512-bit FMA pipes do
 * twice the work of 8-lane ones (docs/PERFORMANCE.md), for more than 8
 * queries per KV head (a decode step's 8 fill an 8-lane vector). Zen 4
 * splits a 512-bit FMA in two and keeps 8 lanes (the 16-lane build was not
 * measured there). */
static bool wide_attention(int32_t n_rows, int n_head, int n_head_kv) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return nm_kernels_active() >= NM_KERNELS_AVX512 && __builtin_cpu_is("intel") &&
           (int64_t)n_rows * (n_head / n_head_kv) > 8;
#else
    (void)n_rows, (void)n_head, (void)n_head_kv;
    return false;
#endif
}

/* The reference, a row at a time: the window is an offset into the cache,
 * where it sees positions kv0 .. n_kv - 1 as its 0 .. n_kv - kv0 - 1. */
static void rows_ref(const float *q, int64_t ldq, const void *k_cache, const void *v_cache,
                     bool half, int64_t kv_stride, const int32_t *kv0, const int32_t *n_kv,
                     int32_t n_rows, int n_head, int n_head_kv, int head_dim, float scale,
                     const float *sinks, float *out, int64_t ldo, float *scores) {
    for (int32_t r = 0; r < n_rows; r++) {
        NM_ASSERT(kv0[r] >= 0 && kv0[r] < n_kv[r]);
        const size_t off = (size_t)kv0[r] * (size_t)kv_stride;
        if (half)
            nm_attention_f16_ref_forward(q + r * ldq, (const uint16_t *)k_cache + off,
                                         (const uint16_t *)v_cache + off, kv_stride,
                                         n_kv[r] - kv0[r], n_head, n_head_kv, head_dim, scale,
                                         sinks, out + r * ldo, scores);
        else
            nm_attention_ref_forward(
                q + r * ldq, (const float *)k_cache + off, (const float *)v_cache + off, kv_stride,
                n_kv[r] - kv0[r], n_head, n_head_kv, head_dim, scale, sinks, out + r * ldo, scores);
    }
}

/* A float (half false) or F16 cache: the blocked kernel where it runs,
 * else the reference. */
static void attention_rows(const float *q, int64_t ldq, const void *k_cache, const void *v_cache,
                           bool half, int64_t kv_stride, const int32_t *kv0, const int32_t *n_kv,
                           int32_t n_rows, int n_head, int n_head_kv, int head_dim, float scale,
                           const float *sinks, float *out, int64_t ldo, float *scores) {
#if defined(__x86_64__)
    if (blocked_attention(head_dim)) {
        if (wide_attention(n_rows, n_head, n_head_kv))
            nm_attention_blocked16_forward(q, ldq, k_cache, v_cache, half, kv_stride, kv0, n_kv,
                                           n_rows, n_head, n_head_kv, head_dim, scale, sinks, out,
                                           ldo);
        else
            nm_attention_blocked_forward(q, ldq, k_cache, v_cache, half, kv_stride, kv0, n_kv,
                                         n_rows, n_head, n_head_kv, head_dim, scale, sinks, out,
                                         ldo);
        return;
    }
#endif
    rows_ref(q, ldq, k_cache, v_cache, half, kv_stride, kv0, n_kv, n_rows, n_head, n_head_kv,
             head_dim, scale, sinks, out, ldo, scores);
}

void nm_attention_rows_forward(const float *q, int64_t ldq, const float *k_cache,
                               const float *v_cache, int64_t kv_stride, const int32_t *kv0,
                               const int32_t *n_kv, int32_t n_rows, int n_head, int n_head_kv,
                               int head_dim, float scale, const float *sinks, float *out,
                               int64_t ldo, float *scores) {
    attention_rows(q, ldq, k_cache, v_cache, false, kv_stride, kv0, n_kv, n_rows, n_head, n_head_kv,
                   head_dim, scale, sinks, out, ldo, scores);
}

void nm_attention_rows_f16_forward(const float *q, int64_t ldq, const uint16_t *k_cache,
                                   const uint16_t *v_cache, int64_t kv_stride, const int32_t *kv0,
                                   const int32_t *n_kv, int32_t n_rows, int n_head, int n_head_kv,
                                   int head_dim, float scale, const float *sinks, float *out,
                                   int64_t ldo, float *scores) {
    attention_rows(q, ldq, k_cache, v_cache, true, kv_stride, kv0, n_kv, n_rows, n_head, n_head_kv,
                   head_dim, scale, sinks, out, ldo, scores);
}

int32_t nm_attention_rows_per_call(int n_head, int n_head_kv) {
    NM_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0);
    const int32_t rows = 32 / (n_head / n_head_kv);
    return rows < 1 ? 1 : rows > NM_ATTENTION_ROWS_MAX ? NM_ATTENTION_ROWS_MAX : rows;
}

void nm_attention_forward(const float *q, const float *k_cache, const float *v_cache,
                          int64_t kv_stride, int32_t kv0, int32_t n_kv, int n_head, int n_head_kv,
                          int head_dim, float scale, const float *sinks, float *out,
                          float *scores) {
    nm_attention_rows_forward(q, 0, k_cache, v_cache, kv_stride, &kv0, &n_kv, 1, n_head, n_head_kv,
                              head_dim, scale, sinks, out, 0, scores);
}

void nm_attention_f16_forward(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              int64_t kv_stride, int32_t kv0, int32_t n_kv, int n_head,
                              int n_head_kv, int head_dim, float scale, const float *sinks,
                              float *out, float *scores) {
    nm_attention_rows_f16_forward(q, 0, k_cache, v_cache, kv_stride, &kv0, &n_kv, 1, n_head,
                                  n_head_kv, head_dim, scale, sinks, out, 0, scores);
}
