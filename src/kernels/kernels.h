/* CPU compute kernels: matrix multiplication per weight type, norms, RoPE,
 * softmax, activations, causal attention. This header is the whole
 * interface; src/kernels/ref/ holds the plain C versions that are kept
 * forever as the reference for faster per-ISA variants.
 * Shapes use fixed letters: M rows of activations, N outputs, K inputs. */
#ifndef NM_KERNELS_H
#define NM_KERNELS_H

#include "npumoe.h"

#include "threads/threads.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How the rows of a weight matrix lie in memory. */
typedef enum nm_layout {
    /* as in the model file: row j is K elements of `type` at data + j * row_bytes */
    NM_LAYOUT_ROWS = 0,
    /* avx512vnni's (nm_mat_repack): rows in groups of 16, each group's
     * blocks or super-blocks interleaved as its registers read them; rows
     * past the last whole group as in NM_LAYOUT_ROWS. The same n * row_bytes. */
    NM_LAYOUT_PANEL16 = 1
} nm_layout;

/* A weight matrix [N][K]. */
typedef struct nm_mat {
    const void *data;
    uint32_t type; /* nm_dtype: one nm_dtype_is_supported accepts */
    int64_t n;     /* N, output rows        */
    int64_t k;     /* K, elements per row   */
    size_t row_bytes;
    uint32_t layout; /* nm_layout; 0, the file's, unless nm_mat_repack made it */
} nm_mat;

/* Kernel variants. The reference (plain C, src/kernels/ref/) is always
 * present; the per-ISA variants (src/kernels/x86/) are compiled with their
 * own flags and usable when CPUID says so. The variant in use is chosen once,
 * at the first kernel call: NPUMOE_KERNELS=ref|avx2|avx512|avx512bf16|
 * avx512vnni|amx when set and supported (or exact: nm_kernels_exact()), else
 * the fastest the CPU supports, in the order amx, avx512vnni, avx512bf16,
 * avx512, avx2, ref. avx512bf16 rounds the activations of BF16 matmuls to
 * bfloat16 and avx512vnni also quantises those of quantised matmuls to int8
 * blocks, as llama.cpp does (the cost is measured in docs/PERFORMANCE.md);
 * avx2 quantises them too (for Q8_0, Q4_0 and the K-quants) and gives
 * avx512vnni's bits for them;
 * amx quantises as avx512vnni and gives its bits for quantised weights, and
 * sums BF16 products in the tiles' order. F32 and F16 weights keep FP32
 * activations in every variant, and NPUMOE_KERNELS=avx512 keeps them for
 * every type. Every variant computes an
 * output element with the same operations whatever the row count m and the
 * column range [j0, j1), so splitting work never changes results. */
typedef enum nm_kernels_isa {
    NM_KERNELS_REF = 0,
    NM_KERNELS_AVX2 = 1,       /* AVX2 + FMA + F16C */
    NM_KERNELS_AVX512 = 2,     /* AVX-512 F/BW/VL/DQ */
    NM_KERNELS_AVX512BF16 = 3, /* + AVX512-BF16 dot products for BF16 weights */
    NM_KERNELS_AVX512VNNI = 4, /* + AVX512-VNNI int8 dot products for quantised weights */
    /* + AMX tiles (TILE, BF16, INT8) with the tile state granted by the
     * kernel; in a -DNM_AMX_EMULATE=ON build the tiles are emulated in C and
     * it runs where avx512vnni does, but only when asked for */
    NM_KERNELS_AMX = 5,
    NM_KERNELS_COUNT = 6
} nm_kernels_isa;

/* "ref", "avx2", "avx512", "avx512bf16", "avx512vnni", "amx". */
const char *nm_kernels_isa_name(nm_kernels_isa isa);
/* Parses a variant name; false for an unknown name. */
bool nm_kernels_isa_parse(const char *name, nm_kernels_isa *out);
/* Whether this build and this CPU can run the variant. */
bool nm_kernels_isa_supported(nm_kernels_isa isa);
/* The fastest variant that keeps every activation in FP32 (avx512, else
 * ref: avx2 quantises those of quantised weights); NPUMOE_KERNELS=exact
 * selects it. */
nm_kernels_isa nm_kernels_exact(void);
/* The variant in use (chooses it on the first call). */
nm_kernels_isa nm_kernels_active(void);
/* Uses isa from now on; false (and nothing changes) if it is not supported.
 * Call it before starting work on other threads. */
bool nm_kernels_force(nm_kernels_isa isa);
/* Why the variant in use was chosen, and whether the CPU and the kernel
 * allow amx (a sentence for `npumoe info`). */
const char *nm_kernels_why(void);
/* Whether this CPU has AMX-TILE/BF16/INT8 and the kernel granted this
 * process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA). */
bool nm_kernels_amx_hardware(void);
/* Whether this build emulates the tile instructions (-DNM_AMX_EMULATE=ON). */
bool nm_kernels_amx_emulated(void);
/* The row granule of the variant in use: the rows its matmuls compute at
 * once, so a product over a multiple of it wastes nothing (a static graph's
 * capacities are best rounded up to it). 16 under amx (a tile holds 16
 * activation rows; fewer cost the same, docs/PERFORMANCE.md), else 1 (the
 * vector variants' time per row measured no lower at any row count). */
int32_t nm_kernels_row_granule(void);
/* Whether avx512vnni computes BF16 weights with FP32 FMAs (the avx512
 * kernel: activations kept in FP32) rather than vdpbf16ps (avx512bf16:
 * activations rounded to bfloat16). On Intel CPUs: their vdpbf16ps issues
 * at half the rate of FP32 FMAs, so the FP32 kernel is the faster and the
 * exact one (docs/PERFORMANCE.md); elsewhere avx512bf16 (on the Zen 4
 * measured there vdpbf16ps has twice the arithmetic of FP32 FMAs). */
bool nm_kernels_bf16_in_fp32(void);
/* Checks NPUMOE_KERNELS: true when unset, a supported variant's name or
 * "exact" (which is then forced); false otherwise, with the value in *bad. */
bool nm_kernels_check_env(const char **bad);

/* Whether the variant in use computes w faster from a copy in a layout of
 * its own, NM_LAYOUT_PANEL16: avx512vnni or amx (which read the same
 * layout) with Q8_0, Q4_0, Q4_K, Q5_K, Q6_K or MXFP4 weights, avx2 with all
 * of those but MXFP4; at least 16 rows, in the file's layout. */
bool nm_mat_repack_wanted(const nm_mat *w);
/* Writes the n * row_bytes bytes of w (one nm_mat_repack_wanted accepts) to
 * dst, which must not overlap them, in that layout, and returns the matrix
 * at dst. Every matmul gives the same bits from the copy as avx512vnni from
 * w. The copy is computed by the variant in use where that one reads the
 * layout (amx, avx512vnni, avx2 for the types it repacks), else by
 * avx512vnni where the CPU runs it, else by avx2. Rows [16a, 16b) come out
 * the same whatever the other rows, so a matrix may be repacked in parts
 * that start at multiples of 16 rows. */
nm_mat nm_mat_repack(const nm_mat *w, void *dst);
/* Whether Linux backs anonymous memory advised MADV_HUGEPAGE with huge
 * pages (transparent huge pages "always" or "madvise", not "never"). */
bool nm_kernels_huge_pages(void);
/* Whether the variant in use, reading w in the file's layout, reads it
 * faster from a copy in anonymous memory backed by huge pages (a TLB miss
 * per 2 MiB of a weight stream instead of per 4 KiB; on the Zen 3 of
 * docs/PERFORMANCE.md prefill 1.07-1.12x on BF16, 1.10x on F32): avx2 with
 * F32, F16 or BF16 weights, in the file's layout, where the system gives
 * huge pages (nm_kernels_huge_pages). */
bool nm_mat_copy_wanted(const nm_mat *w);

/* ---- weights prepared for the kernels at load ---- */

/* A weight matrix, or a stack of count matrices stride bytes apart (count
 * 1: a single matrix, stride unused), that nm_kernels_prepare may copy into
 * the active variant's own layout or as it is: *mat is then updated in
 * place. */
typedef struct nm_prepare_item {
    nm_mat *mat;
    size_t stride;
    int32_t count;
} nm_prepare_item;

/* What nm_kernels_prepare made: the copies, in one anonymous mapping,
 * read-only once made. Zero bytes (and data NULL) when none was made. */
typedef struct nm_prepared {
    void *data;
    size_t bytes;
    int32_t n_tensors;  /* items copied (a stack counts once) */
    int32_t n_as_is;    /* of them, copied in the file's layout (nm_mat_copy_wanted) */
    size_t unfit_bytes; /* copies wanted but not made: over the budget */
    nm_kernels_isa isa; /* the variant whose layout they are in */
} nm_prepared;

/* Called once for each range of source bytes after it has been copied and
 * will not be read again (a loader releases the file's pages of it); from
 * several threads at once. */
typedef void (*nm_release_fn)(void *ctx, const void *data, size_t n_bytes);

/* Prepares the model's weight matrices for the variant in use, which owns
 * its layouts: each item it computes faster from a copy in its own layout
 * (nm_mat_repack_wanted) or in the file's (nm_mat_copy_wanted) is copied, in
 * parts of a few MiB on one thread per online CPU, into one mapping, and its
 * nm_mat then points there; the others are left as they are. The copies
 * only speed up reads and, unlike the file's pages, cannot be dropped and
 * read again under memory pressure, so they are made only within budget
 * bytes (the memory the system can give): all of them if they fit, else
 * those in the variant's layout if they do, else none (the matrices are
 * then computed from the file's layout). release may be NULL. Every matmul gives the same bits
 * after as before. On failure (NM_ERR_NOMEM) nothing is changed and *out
 * is empty. Free with nm_prepared_free after the last use of the
 * matrices. */
nm_status nm_kernels_prepare(nm_prepare_item *items, size_t n_items, uint64_t budget,
                             nm_release_fn release, void *release_ctx, nm_prepared *out,
                             nm_error *err);
void nm_prepared_free(nm_prepared *prepared);

/* The gated activation of an expert FFN, h = act(g, u). */
typedef enum nm_glu {
    NM_GLU_SWIGLU = 0, /* silu(g) * u */
    /* gpt-oss's clamped SwiGLU: with g' = min(g, limit) and u' = clamp(u,
     * -limit, limit), h = g' * sigmoid(alpha * g') * (u' + 1) */
    NM_GLU_SWIGLU_OAI = 1
} nm_glu;

/* The experts of one layer, as three stacks of matrices in the file, and
 * optional per-expert biases (NULL when absent). */
typedef struct nm_expert_weights {
    nm_mat gate;        /* expert 0: [d_ff][d_model] */
    nm_mat up;          /* expert 0: [d_ff][d_model] */
    nm_mat down;        /* expert 0: [d_model][d_ff] */
    size_t gate_stride; /* bytes from one expert's gate matrix to the next */
    size_t up_stride;
    size_t down_stride;
    int32_t n_expert;
    const float *gate_b; /* [n_expert][d_ff] or NULL */
    const float *up_b;   /* [n_expert][d_ff] or NULL */
    const float *down_b; /* [n_expert][d_model] or NULL */
    uint32_t glu;        /* nm_glu; 0, SwiGLU, unless the architecture says */
    float glu_alpha;     /* NM_GLU_SWIGLU_OAI's alpha and limit */
    float glu_limit;
} nm_expert_weights;

/* Expert e's matrix out of a stack. */
nm_mat nm_expert_mat(const nm_mat *first, size_t stride, int32_t e);

/* One expert's gated FFN over m rows: out = down(act(gate x + gate_b, up x
 * + up_b)) + down_b, act by w->glu. x: [m][d_model] (row stride ldx);
 * gate, up: scratch [m][d_ff]; out: [m][d_model] (row stride ldo). Runs on
 * the calling thread. */
void nm_expert_ffn_forward(const nm_expert_weights *w, int32_t e, const float *x, int64_t ldx,
                           int64_t m, float *gate, float *up, float *out, int64_t ldo);
/* The middle of that FFN for columns [j0, j1) of m rows of gate and up
 * (row stride ld): gate := act(gate + gate_b, up + up_b); up is not
 * changed. */
void nm_expert_glu_forward(const nm_expert_weights *w, int32_t e, float *gate, const float *up,
                           int64_t ld, int64_t m, int64_t j0, int64_t j1);
/* Its end for columns [j0, j1) of m output rows (row stride ldo): out +=
 * down_b (nothing without one). */
void nm_expert_down_bias(const nm_expert_weights *w, int32_t e, float *out, int64_t ldo, int64_t m,
                         int64_t j0, int64_t j1);
/* Whether the experts use more than the plain SwiGLU FFN (biases, another
 * activation): a device states whether it runs those (NM_FFN_F_*). */
bool nm_expert_weights_plain(const nm_expert_weights *w);

/* y[i][j] = sum_k x[i][k] * W[j][k] for i < m and j in [j0, j1).
 * x: [m][K] with row stride ldx; y: [m][...] with row stride ldy. */
void nm_matmul_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                       int64_t ldy, int64_t j0, int64_t j1);

/* The first half of a SwiGLU FFN over m rows: h[i][j] = silu(g) * u with
 * g = x Wg^T and u = x Wu^T, for i < m and j in [j0, j1). The bits of
 * nm_matmul_forward of wg into h and of wu into u, then nm_swiglu_forward
 * of each row's [j0, j1); where the variant can (avx512vnni and amx, for
 * the types they quantise or tile, with gate and up of one type, shape
 * and layout), the activations are quantised or rounded once for both
 * and each group of columns gets its SwiGLU while it is in the cache.
 * x: [m][K] (row stride ldx); h: [m][...] (ldh); u: scratch [m][...]
 * (ldu), holding x Wu^T on return. */
void nm_matmul_swiglu_forward(const nm_mat *wg, const nm_mat *wu, const float *x, int64_t ldx,
                              int64_t m, float *h, int64_t ldh, float *u, int64_t ldu, int64_t j0,
                              int64_t j1);

/* nm_matmul_forward of every row and column over the pool: y[m][N] =
 * x[m][K] W^T, output columns split into tiles of a multiple of 16 (which
 * the quantised kernels compute at once). The same bits as one call. */
void nm_matmul_parallel(nm_pool *pool, const nm_mat *w, const float *x, int64_t ldx, int64_t m,
                        float *y, int64_t ldy);

/* nm_matmul_parallel of n_w (1..NM_MATMUL_MAX_N) matrices of one K over
 * the same x, as one job of the pool: y[i] = x W[i]^T (row stride ldy[i]).
 * The tiles are sized by the columns of all of them, so a matrix with few
 * columns (a K or V projection beside Q) is one or two tasks rather than
 * several a thread that each read, and the int8 kernels quantise, all of
 * x again. The same bits as one call per matrix. */
enum { NM_MATMUL_MAX_N = 4 };
void nm_matmul_parallel_n(nm_pool *pool, int n_w, const nm_mat *const *w, const float *x,
                          int64_t ldx, int64_t m, float *const *y, const int64_t *ldy);

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] for i < n; w may be NULL
 * (then no scaling). y may alias x. */
void nm_rmsnorm_forward(const float *x, const float *w, float *y, int64_t n, float eps);

/* torch.nn.LayerNorm without its bias: y[i] = (x[i] - mean) / sqrt(var +
 * eps) * w[i], the biased variance, sums in double as ggml's norm. y may
 * alias x. */
void nm_layernorm_forward(const float *x, const float *w, float *y, int64_t n, float eps);

/* The QK norm of one row, in place: nm_rmsnorm_forward of each head of q
 * ([n_head][head_dim]) and of k ([n_head_kv][head_dim]) with the weights
 * qw, kw [head_dim] (per_head), or of the whole of q and of k with qw
 * [n_head * head_dim], kw [n_head_kv * head_dim]. */
void nm_qk_norm_forward(float *q, float *k, int n_head, int n_head_kv, int64_t head_dim,
                        const float *qw, const float *kw, bool per_head, float eps);

/* A block's norm: nm_layernorm_forward (layer) or nm_rmsnorm_forward, then
 * + b[i] when b is not NULL. */
void nm_norm_bias_forward(bool layer, const float *x, const float *w, const float *b, float *y,
                          int64_t n, float eps);

/* Rotary embedding, NeoX style (element i pairs with i + n_rot/2), on
 * x: [n_head][head_dim] in place at position pos. Angles are computed as
 * ggml does (theta_i = pos * base^(-2i/n_rot), accumulated in float). */
void nm_rope_neox_forward(float *x, int n_head, int head_dim, int n_rot, int32_t pos,
                          float freq_base);

/* Rotary embedding as ggml's rope_ext with ext_factor 0 and freq_scale 1,
 * on x: [n_head][head_dim] in place at position pos: pair i's angle is
 * pos * base^(-2i/n_rot) (accumulated in float) divided by freq_factors[i]
 * (freq_factors [n_rot / 2] or NULL), cos and sin are scaled by
 * attn_factor; neox pairs element i with i + n_rot/2, otherwise (llama's
 * NORM) 2i with 2i + 1. Plain NeoX (no factors, attn_factor 1) is
 * nm_rope_neox_forward. */
void nm_rope_forward(float *x, int n_head, int head_dim, int n_rot, int32_t pos, float freq_base,
                     bool neox, const float *freq_factors, float attn_factor);

/* YaRN context extension as ggml's rope_ext computes it: pair i's angle
 * theta (after the frequency factor) becomes theta_interp = freq_scale *
 * theta mixed with theta by ramp(i) * ext_factor, ramp(i) = 1 - clamp((i -
 * corr_dims[0]) / max(0.001, corr_dims[1] - corr_dims[0]), 0, 1), and, when
 * ext_factor is not 0, cos and sin are scaled by attn_factor * (1 + 0.1 *
 * ln(1 / freq_scale)). */
typedef struct nm_rope_yarn {
    float freq_scale;   /* 1 / rope.scaling.factor */
    float ext_factor;   /* 1 for YaRN; 0: angles scaled by freq_scale alone */
    float corr_dims[2]; /* the ramp's ends in pairs (nm_rope_yarn_init) */
} nm_rope_yarn;

/* YaRN of a model trained at n_ctx_orig positions, scaled by factor:
 * corr_dims from beta_fast and beta_slow (rotations over n_ctx_orig; ggml's
 * ggml_rope_yarn_corr_dims: floor and ceil of n_rot * ln(n_ctx_orig / (2 pi
 * beta)) / (2 ln freq_base), clamped to [0, n_rot - 1]), ext_factor 1. */
nm_rope_yarn nm_rope_yarn_make(int n_rot, int32_t n_ctx_orig, float freq_base, float factor,
                               float beta_fast, float beta_slow);

/* nm_rope_forward with YaRN (yarn NULL: none, nm_rope_forward itself). */
void nm_rope_ext_forward(float *x, int n_head, int head_dim, int n_rot, int32_t pos,
                         float freq_base, bool neox, const float *freq_factors, float attn_factor,
                         const nm_rope_yarn *yarn);

/* In place softmax over n values. */
void nm_softmax_forward(float *x, int64_t n);
/* In place softmax over n values and one more logit, sink, that is in the
 * maximum and the denominator but has no output (an attention sink, as
 * ggml's soft_max with sinks): x[i] = exp(x[i] - m) / (sum_j exp(x[j] - m)
 * + exp(sink - m)), m = max(max x, sink). sink = -INFINITY is
 * nm_softmax_forward, bit for bit. */
void nm_softmax_sink_forward(float *x, int64_t n, float sink);

/* h[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i] for i < n, with
 * e^x computed in double and rounded to float (kernels-impl.h): the same
 * bits under every kernel variant. h may alias g. */
void nm_swiglu_forward(const float *g, const float *u, float *h, int64_t n);
/* NM_GLU_SWIGLU_OAI of g and u into h as ggml's swiglu_oai. h may alias g. */
void nm_swiglu_oai_forward(const float *g, const float *u, float *h, int64_t n, float alpha,
                           float limit);

/* Causal grouped-query attention for one query row.
 * q: [n_head][head_dim]; k_cache, v_cache: [n_kv][kv_stride] rows of
 * [n_head_kv][head_dim] for positions 0..n_kv-1 (n_kv includes the query's
 * own position), of which the query attends to kv0 .. n_kv-1 (0 <= kv0 <
 * n_kv; a sliding window of w keys is kv0 = max(0, n_kv - w));
 * sinks: [n_head] a logit per head in the softmax's denominator that
 * attends to nothing (nm_softmax_sink_forward), or NULL for none;
 * out: [n_head][head_dim]; scores: scratch [n_kv - kv0].
 * Query head h reads kv head h / (n_head / n_head_kv). */
void nm_attention_forward(const float *q, const float *k_cache, const float *v_cache,
                          int64_t kv_stride, int32_t kv0, int32_t n_kv, int n_head, int n_head_kv,
                          int head_dim, float scale, const float *sinks, float *out, float *scores);

/* nm_attention_forward over an F16 cache: k_cache, v_cache hold IEEE half
 * values (kv_stride in elements); everything else as above. */
void nm_attention_f16_forward(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              int64_t kv_stride, int32_t kv0, int32_t n_kv, int n_head,
                              int n_head_kv, int head_dim, float scale, const float *sinks,
                              float *out, float *scores);

/* nm_attention_forward for n_rows query rows of one sequence at once, over
 * one cache: row r reads q + r * ldq, attends to positions kv0[r] ..
 * n_kv[r] - 1 (each row its own causal end and window; the cache holds
 * positions 0 .. max n_kv - 1) and writes out + r * ldo. scores: scratch
 * [max(n_kv - kv0)] for the reference. The AVX2 and AVX-512 variants
 * (head_dim <= NM_ATTENTION_HEAD_DIM_MAX; beyond it, the reference) stream
 * the keys and values in blocks with an online softmax, the queries of a
 * KV head side by side: a row's result is computed with the same
 * operations whatever the other rows of the call, so it has the same bits
 * as nm_attention_forward's for that row alone. */
void nm_attention_rows_forward(const float *q, int64_t ldq, const float *k_cache,
                               const float *v_cache, int64_t kv_stride, const int32_t *kv0,
                               const int32_t *n_kv, int32_t n_rows, int n_head, int n_head_kv,
                               int head_dim, float scale, const float *sinks, float *out,
                               int64_t ldo, float *scores);
/* nm_attention_rows_forward over an F16 cache. */
void nm_attention_rows_f16_forward(const float *q, int64_t ldq, const uint16_t *k_cache,
                                   const uint16_t *v_cache, int64_t kv_stride, const int32_t *kv0,
                                   const int32_t *n_kv, int32_t n_rows, int n_head, int n_head_kv,
                                   int head_dim, float scale, const float *sinks, float *out,
                                   int64_t ldo, float *scores);
/* The largest head_dim the blocked attention takes (its per-call scratch
 * lives on the stack): 576, the latent plus RoPE key of DeepSeek's
 * multi-head latent attention (512 + 64); and the most rows
 * nm_attention_rows_per_call gives. */
enum { NM_ATTENTION_HEAD_DIM_MAX = 576, NM_ATTENTION_ROWS_MAX = 16 };
/* How many rows of one sequence a caller best gives nm_attention_rows_forward
 * at once (its pool tasks): enough for 32 queries per KV head, two passes of
 * the blocked kernel, in 1 .. NM_ATTENTION_ROWS_MAX. Any count gives the
 * same bits. */
int32_t nm_attention_rows_per_call(int n_head, int n_head_kv);

#endif /* NM_KERNELS_H */
