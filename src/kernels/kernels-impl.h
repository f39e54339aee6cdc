/* The per-variant entry points behind nm_matmul_forward and
 * nm_attention_forward (same contracts as in kernels.h). Only the
 * dispatcher, the variants and the kernel tests include this. */
#ifndef NM_KERNELS_IMPL_H
#define NM_KERNELS_IMPL_H

#include "kernels.h"

void nm_matmul_ref_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                           int64_t ldy, int64_t j0, int64_t j1);
void nm_attention_ref_forward(const float *q, const float *k_cache, const float *v_cache,
                              int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                              int head_dim, float scale, float *out, float *scores);

void nm_attention_f16_ref_forward(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                  int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                                  int head_dim, float scale, float *out, float *scores);

#if defined(__x86_64__)
void nm_matmul_avx2_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                            int64_t ldy, int64_t j0, int64_t j1);
void nm_matmul_avx512_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                              int64_t ldy, int64_t j0, int64_t j1);
void nm_matmul_avx512bf16_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                                  int64_t ldy, int64_t j0, int64_t j1);
void nm_attention_avx512_forward(const float *q, const float *k_cache, const float *v_cache,
                                 int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                                 int head_dim, float scale, float *out, float *scores);
void nm_attention_f16_avx512_forward(const float *q, const uint16_t *k_cache,
                                     const uint16_t *v_cache, int64_t kv_stride, int32_t n_kv,
                                     int n_head, int n_head_kv, int head_dim, float scale,
                                     float *out, float *scores);
#endif

#endif /* NM_KERNELS_IMPL_H */
