/* The plain C reference kernels: simple loops in the order the math is
 * written, float accumulation except where ggml accumulates in double
 * (norm and softmax sums), so results match llama.cpp's to float rounding. */
#include "kernels/kernels-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

/* Weight rows are converted to float in blocks of this many elements. */
enum { CONVERT_BLOCK = 256 };

static void convert_block(uint32_t type, const uint8_t *src, float *dst, int64_t n) {
    nm_dequantize_row((nm_dtype)type, src, dst, n);
}

static float dot_f32(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

void nm_matmul_ref_forward(const nm_mat *w, const float *x, int64_t ldx, int64_t m, float *y,
                           int64_t ldy, int64_t j0, int64_t j1) {
    NM_ASSERT(j0 >= 0 && j0 <= j1 && j1 <= w->n);
    const int64_t k = w->k;
    if (w->type == NM_DTYPE_F32) {
        for (int64_t j = j0; j < j1; j++) {
            const float *row = (const float *)((const uint8_t *)w->data + (size_t)j * w->row_bytes);
            for (int64_t i = 0; i < m; i++)
                y[i * ldy + j] = dot_f32(x + i * ldx, row, k);
        }
        return;
    }
    NM_ASSERT(nm_dtype_is_supported(w->type));
    /* CONVERT_BLOCK is a whole number of blocks of every supported type */
    const nm_dtype_traits *tr = nm_dtype_traits_of(w->type);
    NM_ASSERT(CONVERT_BLOCK % tr->block_size == 0 && k % tr->block_size == 0);
    const size_t block_bytes = (size_t)CONVERT_BLOCK / tr->block_size * tr->block_bytes;
    float buf[CONVERT_BLOCK]; /* [CONVERT_BLOCK] one block of one weight row */
    for (int64_t j = j0; j < j1; j++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)j * w->row_bytes;
        for (int64_t i = 0; i < m; i++)
            y[i * ldy + j] = 0.0f;
        for (int64_t k0 = 0; k0 < k; k0 += CONVERT_BLOCK) {
            int64_t nk = k - k0 < CONVERT_BLOCK ? k - k0 : CONVERT_BLOCK;
            convert_block(w->type, row + (size_t)(k0 / CONVERT_BLOCK) * block_bytes, buf, nk);
            for (int64_t i = 0; i < m; i++)
                y[i * ldy + j] += dot_f32(x + i * ldx + k0, buf, nk);
        }
    }
}

void nm_rmsnorm_forward(const float *x, const float *w, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)x[i] * (double)x[i];
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * scale;
        y[i] = w ? v * w[i] : v;
    }
}

void nm_rope_neox_forward(float *x, int n_head, int head_dim, int n_rot, int32_t pos,
                          float freq_base) {
    NM_ASSERT(n_rot % 2 == 0 && n_rot <= head_dim);
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    const int half = n_rot / 2;
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        const float c = cosf(theta), s = sinf(theta);
        for (int h = 0; h < n_head; h++) {
            float *v = x + (size_t)h * head_dim;
            const float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c - x1 * s;
            v[i + half] = x0 * s + x1 * c;
        }
        theta *= theta_scale;
    }
}

void nm_layernorm_forward(const float *x, const float *w, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += x[i];
    const float mean = (float)(sum / (double)n);
    double sum2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i] - mean;
        sum2 += (double)(v * v);
    }
    const float scale = 1.0f / sqrtf((float)(sum2 / (double)n) + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = (x[i] - mean) * scale * w[i];
}

void nm_qk_norm_forward(float *q, float *k, int n_head, int n_head_kv, int64_t head_dim,
                        const float *qw, const float *kw, bool per_head, float eps) {
    if (!per_head) {
        nm_rmsnorm_forward(q, qw, q, n_head * head_dim, eps);
        nm_rmsnorm_forward(k, kw, k, n_head_kv * head_dim, eps);
        return;
    }
    for (int h = 0; h < n_head; h++)
        nm_rmsnorm_forward(q + h * head_dim, qw, q + h * head_dim, head_dim, eps);
    for (int h = 0; h < n_head_kv; h++)
        nm_rmsnorm_forward(k + h * head_dim, kw, k + h * head_dim, head_dim, eps);
}

void nm_norm_bias_forward(bool layer, const float *x, const float *w, const float *b, float *y,
                          int64_t n, float eps) {
    if (layer)
        nm_layernorm_forward(x, w, y, n, eps);
    else
        nm_rmsnorm_forward(x, w, y, n, eps);
    if (b)
        for (int64_t i = 0; i < n; i++)
            y[i] += b[i];
}

void nm_rope_forward(float *x, int n_head, int head_dim, int n_rot, int32_t pos, float freq_base,
                     bool neox, const float *freq_factors, float attn_factor) {
    nm_rope_ext_forward(x, n_head, head_dim, n_rot, pos, freq_base, neox, freq_factors, attn_factor,
                        NULL);
}

static float yarn_corr_dim(int n_rot, int32_t n_ctx_orig, float rotations, float base) {
    return (float)n_rot * logf((float)n_ctx_orig / (rotations * 2 * (float)M_PI)) /
           (2 * logf(base));
}

nm_rope_yarn nm_rope_yarn_make(int n_rot, int32_t n_ctx_orig, float freq_base, float factor,
                               float beta_fast, float beta_slow) {
    const float start = floorf(yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, freq_base));
    const float end = ceilf(yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, freq_base));
    return (nm_rope_yarn){
        .freq_scale = 1.0f / factor,
        .ext_factor = 1.0f,
        .corr_dims = {start > 0 ? start : 0, end < (float)(n_rot - 1) ? end : (float)(n_rot - 1)}};
}

/* Pair i's angle t (before YaRN) into cos and sin with YaRN's mix. */
static void yarn_angle(const nm_rope_yarn *y, float t, int i, float attn_factor, float *c,
                       float *s) {
    float theta = t, mscale = attn_factor;
    if (y) {
        theta = y->freq_scale * t;
        if (y->ext_factor != 0.0f) {
            const float r =
                ((float)i - y->corr_dims[0]) / fmaxf(0.001f, y->corr_dims[1] - y->corr_dims[0]);
            const float ramp = (1 - fminf(1, fmaxf(0, r))) * y->ext_factor;
            theta = theta * (1 - ramp) + t * ramp;
            mscale *= 1.0f + 0.1f * logf(1.0f / y->freq_scale);
        }
    }
    *c = cosf(theta) * mscale;
    *s = sinf(theta) * mscale;
}

void nm_rope_ext_forward(float *x, int n_head, int head_dim, int n_rot, int32_t pos,
                         float freq_base, bool neox, const float *freq_factors, float attn_factor,
                         const nm_rope_yarn *yarn) {
    if (neox && !freq_factors && attn_factor == 1.0f && !yarn) {
        nm_rope_neox_forward(x, n_head, head_dim, n_rot, pos, freq_base);
        return;
    }
    NM_ASSERT(n_rot % 2 == 0 && n_rot <= head_dim);
    const int half = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        const float t = freq_factors ? theta / freq_factors[i] : theta;
        float c, s;
        yarn_angle(yarn, t, i, attn_factor, &c, &s);
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        for (int h = 0; h < n_head; h++) {
            float *v = x + (size_t)h * head_dim;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
        theta *= theta_scale;
    }
}

void nm_softmax_forward(float *x, int64_t n) { nm_softmax_sink_forward(x, n, -INFINITY); }

void nm_softmax_sink_forward(float *x, int64_t n, float sink) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > max) max = x[i];
    if (sink > max) max = sink;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    /* after the values, as ggml adds it; exp(-inf) adds nothing */
    sum += (double)expf(sink - max);
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

/* e^x as kernels-impl.h describes it; one operation per statement, so that
 * no compiler fuses a multiply and an add */
static float exp_ref(float x) {
    if (isnan(x)) return x;
    double xd = x;
    xd = xd < -NM_EXP_CLAMP ? -NM_EXP_CLAMP : xd > NM_EXP_CLAMP ? NM_EXP_CLAMP : xd;
    const double z = xd * NM_EXP_LOG2E;
    const double shifted = z + NM_EXP_SHIFT;
    const double kd = shifted - NM_EXP_SHIFT;
    const double f = z - kd;
    double p = nm_exp_poly[0];
    for (int i = 1; i < 11; i++) {
        p = p * f;
        p = p + nm_exp_poly[i];
    }
    uint64_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    bits = (bits + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return (float)(p * scale);
}

void nm_swiglu_ref_forward(const float *g, const float *u, float *h, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        h[i] = g[i] / (1.0f + exp_ref(-g[i])) * u[i];
}

void nm_swiglu_oai_forward(const float *g, const float *u, float *h, int64_t n, float alpha,
                           float limit) {
    for (int64_t i = 0; i < n; i++) {
        const float x = fminf(g[i], limit), y = fmaxf(fminf(u[i], limit), -limit);
        h[i] = x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
    }
}

void nm_attention_ref_forward(const float *q, const float *k_cache, const float *v_cache,
                              int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                              int head_dim, float scale, const float *sinks, float *out,
                              float *scores) {
    NM_ASSERT(n_head % n_head_kv == 0);
    const int group = n_head / n_head_kv;
    for (int h = 0; h < n_head; h++) {
        const float *qh = q + (size_t)h * head_dim;
        const int64_t kv_off = (int64_t)(h / group) * head_dim;
        for (int32_t t = 0; t < n_kv; t++)
            scores[t] = dot_f32(qh, k_cache + t * kv_stride + kv_off, head_dim) * scale;
        nm_softmax_sink_forward(scores, n_kv, sinks ? sinks[h] : -INFINITY);
        float *oh = out + (size_t)h * head_dim;
        memset(oh, 0, (size_t)head_dim * sizeof(float));
        for (int32_t t = 0; t < n_kv; t++) {
            const float *vt = v_cache + t * kv_stride + kv_off;
            const float p = scores[t];
            for (int d = 0; d < head_dim; d++)
                oh[d] += p * vt[d];
        }
    }
}

void nm_attention_f16_ref_forward(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                  int64_t kv_stride, int32_t n_kv, int n_head, int n_head_kv,
                                  int head_dim, float scale, const float *sinks, float *out,
                                  float *scores) {
    NM_ASSERT(n_head % n_head_kv == 0);
    const int group = n_head / n_head_kv;
    for (int h = 0; h < n_head; h++) {
        const float *qh = q + (size_t)h * head_dim;
        const int64_t kv_off = (int64_t)(h / group) * head_dim;
        for (int32_t t = 0; t < n_kv; t++) {
            const uint16_t *kt = k_cache + t * kv_stride + kv_off;
            float sum = 0.0f;
            for (int d = 0; d < head_dim; d++)
                sum += qh[d] * nm_f16_to_f32(kt[d]);
            scores[t] = sum * scale;
        }
        nm_softmax_sink_forward(scores, n_kv, sinks ? sinks[h] : -INFINITY);
        float *oh = out + (size_t)h * head_dim;
        memset(oh, 0, (size_t)head_dim * sizeof(float));
        for (int32_t t = 0; t < n_kv; t++) {
            const uint16_t *vt = v_cache + t * kv_stride + kv_off;
            const float p = scores[t];
            for (int d = 0; d < head_dim; d++)
                oh[d] += p * nm_f16_to_f32(vt[d]);
        }
    }
}
