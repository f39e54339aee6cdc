/* The per-variant entry points behind nm_matmul_forward and
 * nm_attention_forward (same contracts as in kernels.h). Only the
 * dispatcher, the variants and the kernel tests include this. */
#ifndef NM_KERNELS_IMPL_H
#define NM_KERNELS_IMPL_H

#include "kernels.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <float.h>
#include <math.h>

/* Q4_0, MXFP4 and the K-quants: the float-path variants widen such rows
 * NM_QUANT_CHUNK elements at a time (one K-quant super-block, eight Q4_0
 * or MXFP4 blocks). */
enum { NM_QUANT_CHUNK = 256 };

static inline bool nm_kernels_is_block_quant(uint32_t type) {
    return type == NM_DTYPE_Q4_0 || type == NM_DTYPE_Q4_K || type == NM_DTYPE_Q5_K ||
           type == NM_DTYPE_Q6_K || type == NM_DTYPE_MXFP4;
}

/* The types avx512vnni and amx compute in int8 and lay out in
 * NM_LAYOUT_PANEL16: Q8_0 and the block-quantised types. */
static inline bool nm_kernels_is_panel16_type(uint32_t type) {
    return type == NM_DTYPE_Q8_0 || nm_kernels_is_block_quant(type);
}

/* The int8 activation block scale of the contract at the top of
 * x86/avx512vnni.c from a block's largest magnitude amax: d = amax / 127
 * and *id = 1 / d; d and *id 0 when d is below FLT_MIN; d NaN (*id 0) when
 * amax is not finite. */
static inline float nm_int8_block_scale(float amax, float *id) {
    float d = amax / 127.0f;
    *id = 0.0f;
    if (!(amax <= FLT_MAX)) /* NaN or infinity */
        return NAN;
    if (d >= FLT_MIN)
        *id = 1.0f / d;
    else
        d = 0.0f;
    return d;
}

/* Per activation block of 32 values quantised to int8 (avx512vnni, amx,
 * and avx2's quantised matmuls): the scale d; c (and c2 for Q6_K's second
 * half) -o * sum q, which takes out the offset o of the weight codes as
 * the products read them; for the K-quant mins f = -(d * sum q). */
typedef struct nm_xblock {
    float d;
    int32_t c;
    int32_t c2;
    float f;
} nm_xblock;

/* Bytes of NM_QUANT_CHUNK elements of a block-quantised type. */
static inline size_t nm_quant_chunk_bytes(uint32_t type) {
    switch (type) {
    case NM_DTYPE_Q4_0:
        return NM_QUANT_CHUNK / NM_Q4_0_BLOCK * NM_Q4_0_BYTES;
    case NM_DTYPE_MXFP4:
        return NM_QUANT_CHUNK / NM_MXFP4_BLOCK * NM_MXFP4_BYTES;
    case NM_DTYPE_Q4_K:
        return NM_Q4_K_BYTES;
    case NM_DTYPE_Q5_K:
        return NM_Q5_K_BYTES;
    default:
        return NM_Q6_K_BYTES;
    }
}

/* The switch over every weight type a float-path variant computes with:
 * MATMUL(T), an always-inline kernel call, is expanded once per type with T
 * a constant, so the compiler specialises the kernel for each type. Rows
 * must be whole blocks. */
#define NM_KERNELS_FOR_EACH_TYPE(w, MATMUL)                                                        \
    do {                                                                                           \
        const nm_dtype_traits *traits_ = nm_dtype_traits_of((w)->type);                            \
        NM_ASSERT(traits_ && (w)->k % traits_->block_size == 0);                                   \
        switch ((w)->type) {                                                                       \
        case NM_DTYPE_F32:                                                                         \
            MATMUL(NM_DTYPE_F32);                                                                  \
            break;                                                                                 \
        case NM_DTYPE_F16:                                                                         \
            MATMUL(NM_DTYPE_F16);                                                                  \
            break;                                                                                 \
        case NM_DTYPE_BF16:                                                                        \
            MATMUL(NM_DTYPE_BF16);                                                                 \
            break;                                                                                 \
        case NM_DTYPE_Q8_0:                                                                        \
            MATMUL(NM_DTYPE_Q8_0);                                                                 \
            break;                                                                                 \
        case NM_DTYPE_Q4_0:                                                                        \
            MATMUL(NM_DTYPE_Q4_0);                                                                 \
            break;                                                                                 \
        case NM_DTYPE_MXFP4:                                                                       \
            MATMUL(NM_DTYPE_MXFP4);                                                                \
            break;                                                                                 \
        case NM_DTYPE_Q4_K:                                                                        \
            MATMUL(NM_DTYPE_Q4_K);                                                                 \
            break;                                                                                 \
        case NM_DTYPE_Q5_K:                                                                        \
            MATMUL(NM_DTYPE_Q5_K);                                                                 \
            break;                                                                                 \
        case NM_DTYPE_Q6_K:                                                                        \
            MATMUL(NM_DTYPE_Q6_K);                                                                 \
            break;                                                                                 \
        default:                                                                                   \
            NM_ASSERT(!"matmul: unsupported weight type");                                         \
        }                                                                                          \
    } while (0)

/* A variant's matmul (nm_matmul_forward's contract). */
typedef void (*nm_matmul_fn)(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                             int64_t ldy, int64_t j0, int64_t j1);

/* nm_matmul_swiglu_forward as two calls of fn and nm_swiglu_forward: the
 * bits every fused version must give (mat.c). */
void nm_matmul_swiglu_by(nm_matmul_fn fn, const nm_mat *wg, const nm_mat *wu, const float *x,
                         int64_t ldx, int64_t m, float *h, int64_t ldh, float *u, int64_t ldu,
                         int64_t j0, int64_t j1);

/* A fused gate and up's last step over a block of outputs: h = silu(h) * u
 * (nm_swiglu_forward) in rows [i0, i1), columns [j, je). */
static inline void nm_swiglu_block(float *h, int64_t ldh, const float *u, int64_t ldu, int64_t i0,
                                   int64_t i1, int64_t j, int64_t je) {
    for (int64_t i = i0; i < i1; i++)
        nm_swiglu_forward(h + i * ldh + j, u + i * ldu + j, h + i * ldh + j, je - j);
}

/* A buffer of at least n_bytes, 64-byte aligned, of the calling thread's
 * own, for a kernel whose working set outgrows its stack buffers: kept for
 * the thread's next calls (grown when asked for more), freed when the
 * thread exits. NULL when the memory cannot be had; the kernel then works
 * within its stack buffers. One kernel holds it at a time: one that holds it
 * calls no other kernel that takes it (mat.c). */
void *nm_kernel_scratch(size_t n_bytes);

/* Whether gate and up can share one pass: the same type, shape and layout. */
static inline bool nm_matmul_fusable(const nm_mat *wg, const nm_mat *wu) {
    return wg->type == wu->type && wg->n == wu->n && wg->k == wu->k &&
           wg->row_bytes == wu->row_bytes && wg->layout == wu->layout;
}

void nm_matmul_ref_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                           int64_t ldy, int64_t j0, int64_t j1);

/* e^x of nm_swiglu_forward, rounded to float from double arithmetic with
 * no fused multiply-adds, so that the scalar code (ref/ref.c) and the
 * vectors (x86/swiglu.c) give the same bits: x clamped to [-NM_EXP_CLAMP,
 * NM_EXP_CLAMP] (beyond it the float result is 0 or infinity anyway);
 * z = x log2(e); n = z rounded to the nearest integer, ties to even (adding
 * and subtracting NM_EXP_SHIFT); 2^(z - n) by its Taylor polynomial of degree
 * 10 in Horner's form, a multiply then an add per step (truncation below
 * 2^-42 relative); times 2^n, whose exponent field is the low bits of
 * z + NM_EXP_SHIFT plus 1023; then rounded to float (so correctly rounded
 * but where e^x lies within about 2^-20 ulp of a tie). NaN gives NaN. */
#define NM_EXP_CLAMP 200.0
#define NM_EXP_SHIFT 0x1.8p52
#define NM_EXP_LOG2E 0x1.71547652b82fep+0
/* (ln 2)^i / i!, i = 10 down to 0 */
static const double nm_exp_poly[11] = {
    0x1.e4cf5158b8ecap-28, 0x1.b5253d395e7c4p-24, 0x1.62c0223a5c824p-20, 0x1.ffcbfc588b0c7p-17,
    0x1.430912f86c787p-13, 0x1.5d87fe78a6731p-10, 0x1.3b2ab6fba4e77p-7,  0x1.c6b08d704a0c0p-5,
    0x1.ebfbdff82c58fp-3,  0x1.62e42fefa39efp-1,  0x1.0000000000000p+0};
/* nm_swiglu_forward: the plain C one, and x86/swiglu.c's (AVX2, the same
 * bits), which it runs under avx2 and every AVX-512 variant */
void nm_swiglu_ref_forward(const float *g, const float *u, float *h, int64_t n);
void nm_swiglu_avx2_forward(const float *g, const float *u, float *h, int64_t n);

void nm_attention_ref_forward(const float *q, const float *k_cache, const float *v_cache,
                              int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                              int head_dim, float scale, const float *sinks, float *out,
                              float *scores);

void nm_attention_f16_ref_forward(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                  int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                                  int head_dim, float scale, const float *sinks, float *out,
                                  float *scores);

#if defined(__x86_64__)
/* The avx2 variant's float path (x86/avx2.c): every weight widened to
 * float; the variant itself runs its F32, F16, BF16 and MXFP4 weights here. */
void nm_matmul_avx2_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                            int64_t ldy, int64_t j0, int64_t j1);
/* The avx2 variant (x86/avx2-int8.c): activations quantised to int8 blocks
 * for Q8_0, Q4_0, Q4_K, Q5_K and Q6_K weights in the file's layout or
 * NM_LAYOUT_PANEL16, with avx512vnni's bits; other types to
 * nm_matmul_avx2_forward. */
void nm_matmul_avx2_int8_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                                 int64_t ldy, int64_t j0, int64_t j1);
/* nm_matmul_swiglu_forward under avx2: quantised gate and up that
 * nm_matmul_fusable accepts in one pass over the quantised activations. */
void nm_matmul_swiglu_avx2_forward(const nm_mat *wg, const nm_mat *wu, const float *x, int64_t ldx,
                                   int64_t m, float *h, int64_t ldh, float *u, int64_t ldu,
                                   int64_t j0, int64_t j1);
/* Whether avx2 quantises the activations for weights of this type. */
bool nm_matmul_avx2_quantises(uint32_t type);
/* nm_mat_repack's work under avx2: w's rows into dst in NM_LAYOUT_PANEL16,
 * the bytes nm_avx512vnni_repack writes. */
void nm_avx2_repack(const nm_mat *w, void *dst);
void nm_matmul_avx512_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                              int64_t ldy, int64_t j0, int64_t j1);
/* Row dequantisation with AVX-512 for Q4_0, Q4_K, Q5_K and Q6_K (other
 * types go to nm_dequantize_row): the values nm_dequantize_row gives, bit
 * for bit; the avx512 matmul widens weights with the same code. */
void nm_dequantize_avx512_row(uint32_t type, const void *src, float *dst, int64_t n);
void nm_matmul_avx512bf16_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                                  int64_t ldy, int64_t j0, int64_t j1);
/* Activations quantised to int8 blocks for Q8_0, Q4_0, Q4_K, Q5_K, Q6_K
 * and MXFP4 weights (x86/avx512vnni.c); BF16 as avx512bf16, others as avx512. */
void nm_matmul_avx512vnni_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                                  int64_t ldy, int64_t j0, int64_t j1);
/* nm_matmul_swiglu_forward under avx512vnni: quantised gate and up that
 * nm_matmul_fusable accepts in one pass over the quantised activations. */
void nm_matmul_swiglu_avx512vnni_forward(const nm_mat *wg, const nm_mat *wu, const float *x,
                                         int64_t ldx, int64_t m, float *h, int64_t ldh, float *u,
                                         int64_t ldu, int64_t j0, int64_t j1);
/* Whether avx512vnni quantises the activations for weights of this type. */
bool nm_matmul_avx512vnni_quantises(uint32_t type);
/* nm_mat_repack's work: w's rows into dst in NM_LAYOUT_PANEL16. */
void nm_avx512vnni_repack(const nm_mat *w, void *dst);
/* The amx variant (x86/amx.c): the tile instructions (_hw: only where
 * nm_kernels_amx_hardware()) or the same source over emulated tiles (_emu:
 * where avx512vnni runs). */
void nm_matmul_amx_hw_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                              int64_t ldy, int64_t j0, int64_t j1);
void nm_matmul_amx_emu_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                               int64_t ldy, int64_t j0, int64_t j1);
/* nm_matmul_swiglu_forward under amx: BF16 and quantised gate and up in
 * one pass over the activations' tiles (_hw, _emu as above). */
void nm_matmul_swiglu_amx_hw_forward(const nm_mat *wg, const nm_mat *wu, const float *x,
                                     int64_t ldx, int64_t m, float *h, int64_t ldh, float *u,
                                     int64_t ldu, int64_t j0, int64_t j1);
void nm_matmul_swiglu_amx_emu_forward(const nm_mat *wg, const nm_mat *wu, const float *x,
                                      int64_t ldx, int64_t m, float *h, int64_t ldh, float *u,
                                      int64_t ldu, int64_t j0, int64_t j1);
/* x86/attention.c, for avx2 and every AVX-512 variant: the blocked
 * attention behind nm_attention_rows_forward over a float or (half) F16
 * cache; head_dim <= NM_ATTENTION_HEAD_DIM_MAX. */
void nm_attention_blocked_forward(const float *q, int64_t ldq, const void *k_cache,
                                  const void *v_cache, bool half, int64_t kv_stride,
                                  const int32_t *kv0, const int32_t *n_kv, int32_t n_rows,
                                  int n_head, int n_head_kv, int head_dim, float scale,
                                  const float *sinks, float *out, int64_t ldo);
/* The same with 16-lane vectors (x86/attention-avx512.c, the same bits),
 * for the AVX-512 variants. */
void nm_attention_blocked16_forward(const float *q, int64_t ldq, const void *k_cache,
                                    const void *v_cache, bool half, int64_t kv_stride,
                                    const int32_t *kv0, const int32_t *n_kv, int32_t n_rows,
                                    int n_head, int n_head_kv, int head_dim, float scale,
                                    const float *sinks, float *out, int64_t ldo);
#endif

#endif /* NM_KERNELS_IMPL_H */
