/* Graph kind 2 on the vulkan device: the dense part of a layer over a chunk
 * (nm_dense_spec) as one command buffer recorded at compile: attention norm,
 * the q/k/v matmuls, biases + q/k norms + RoPE + the K/V store, attention,
 * the output matmul, residual + FFN norm, the router matmul, a barrier
 * between each; then, with a shared expert, its gate, up and gate-logit
 * matmuls, SwiGLU, the down matmul and the sigmoid gate. The layer's
 * weights and vectors are uploaded once into device memory
 * (F32/F16/BF16/Q8_0/Q4_K/MXFP4 read as they are, other types converted
 * to F32), the activations live in one host-visible buffer (the
 * launch's position in its first word), the K/V in device memory; FP32
 * accumulation throughout; with an F16 cache the K/V are rounded to IEEE
 * half (nearest, ties to even, as the host) as they are stored, and kept as
 * F32 holding those halves. Not implemented (dense_features says so):
 * llama.cpp's F16 rounding of matmul inputs. */
#include "vk-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <stdio.h>
#include <string.h>

enum { NONE = -1 }; /* an absent vector (0xffffffff in the shaders) */
/* the shared expert's (MAT_SG..MAT_SI) absent without one: 0 rows */
enum { MAT_Q, MAT_K, MAT_V, MAT_O, MAT_R, MAT_SG, MAT_SU, MAT_SD, MAT_SI, N_MATS };
/* dense_attn.comp's MAX_HEAD_DIM: its per-invocation accumulator */
enum { VK_MAX_HEAD_DIM = 256 };

typedef struct vk_mat {
    VkDeviceSize at; /* byte offset in the weights buffer */
    uint32_t row_bytes;
    int slot; /* nm_vk_type_slot of the type the shader reads */
    bool convert;
} vk_mat;

struct vk_dense {
    vk_device *d;
    int32_t layer, rows, n_pos, n_head, n_head_kv, head_dim, n_expert;
    int64_t d_model, q_dim, kv_dim;
    int64_t n_ff_shexp; /* 0: no shared expert */
    bool shexp_gated;
    bool kv_f16; /* the host's side of kv_read/kv_write is IEEE half (the graph's, F32
                    holding values rounded to half) */
    vk_mat mats[N_MATS];
    /* float indices in the weights buffer, or NONE */
    int64_t attn_norm, attn_norm_b, bq, bk, bv, bo, q_norm, k_norm, ffn_norm, ffn_norm_b, factors;
    /* float offsets in the activation buffer */
    uint32_t o_x, o_a, o_q, o_k, o_v, o_att, o_proj, o_xout, o_xn, o_logits;
    uint32_t o_sg, o_su, o_sh, o_sl; /* the shared expert's gate, up, output, gate logit */
    vk_buffer weights, act, kv;
    VkDescriptorPool desc_pool;
    VkDescriptorSet set;
    VkCommandBuffer cb;
    VkFence fence;
    VkQueryPool queries;
    int64_t submit_ns;
};

static VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint32_t opt(int64_t i) { return i == NONE ? 0xffffffffu : (uint32_t)i; }

void nm_vk_dense_free(vk_dense *g) {
    if (!g) return;
    vk_device *d = g->d;
    nm_vk_command_buffer_free(d, g->cb, g->fence, g->queries);
    if (g->desc_pool) d->fn.vkDestroyDescriptorPool(d->dev, g->desc_pool, NULL);
    nm_vk_buffer_free(d, &g->weights);
    nm_vk_buffer_free(d, &g->act);
    nm_vk_buffer_free(d, &g->kv);
    nm_free(g);
}

/* The spec's matrices by MAT_*, an absent one (no shared expert, or no
 * gate logit) with no rows. */
static void spec_mats(const nm_dense_spec *s, nm_mat *m) {
    const nm_mat none = {.type = NM_DTYPE_F32};
    const bool sh = s->n_ff_shexp > 0;
    m[MAT_Q] = s->wq;
    m[MAT_K] = s->wk;
    m[MAT_V] = s->wv;
    m[MAT_O] = s->wo;
    m[MAT_R] = s->router;
    m[MAT_SG] = sh ? s->shexp_gate : none;
    m[MAT_SU] = sh ? s->shexp_up : none;
    m[MAT_SD] = sh ? s->shexp_down : none;
    m[MAT_SI] = sh && s->shexp_gate_inp.data ? s->shexp_gate_inp : none;
}

/* Lays out the weights buffer: the matrices, then the vectors. */
static VkDeviceSize layout_weights(vk_dense *g, const nm_dense_spec *s) {
    nm_mat m[N_MATS];
    spec_mats(s, m);
    VkDeviceSize at = 0;
    for (int i = 0; i < N_MATS; i++) {
        vk_mat *v = &g->mats[i];
        v->slot = nm_vk_type_slot(m[i].type);
        v->convert = v->slot < 0;
        if (v->convert) v->slot = nm_vk_type_slot(NM_DTYPE_F32);
        v->row_bytes = v->convert ? (uint32_t)(m[i].k * 4) : (uint32_t)m[i].row_bytes;
        v->at = at;
        at = round_up(at + (VkDeviceSize)m[i].n * v->row_bytes, 16);
    }
    const struct {
        const float *p;
        int64_t n;
        int64_t *index;
    } vec[] = {
        {s->attn_norm, g->d_model, &g->attn_norm},
        {s->attn_norm_b, g->d_model, &g->attn_norm_b},
        {s->bq, g->q_dim, &g->bq},
        {s->bk, g->kv_dim, &g->bk},
        {s->bv, g->kv_dim, &g->bv},
        {s->bo, g->d_model, &g->bo},
        {s->qk_norm == NM_DENSE_QK_NONE ? NULL : s->q_norm,
         s->qk_norm == NM_DENSE_QK_HEAD ? s->head_dim : g->q_dim, &g->q_norm},
        {s->qk_norm == NM_DENSE_QK_NONE ? NULL : s->k_norm,
         s->qk_norm == NM_DENSE_QK_HEAD ? s->head_dim : g->kv_dim, &g->k_norm},
        {s->ffn_norm, g->d_model, &g->ffn_norm},
        {s->ffn_norm_b, g->d_model, &g->ffn_norm_b},
        {s->rope_factors, s->n_rot / 2, &g->factors},
    };
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
        *vec[i].index = vec[i].p ? (int64_t)(at / 4) : NONE;
        if (vec[i].p) at = round_up(at + (VkDeviceSize)vec[i].n * 4, 16);
    }
    return at;
}

static nm_status upload_weights(vk_dense *g, const nm_dense_spec *s, nm_error *err) {
    vk_device *d = g->d;
    nm_mat m[N_MATS];
    spec_mats(s, m);
    vk_uploader u;
    nm_status st = nm_vk_uploader_begin(d, &g->weights, &u, err);
    if (st) return st;
    int64_t k_max = 1; /* the longest row converted */
    for (int i = 0; i < N_MATS; i++)
        if (m[i].k > k_max) k_max = m[i].k;
    float *row = nm_malloc((size_t)k_max * 4);
    if (!row) st = nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory converting weights", d->label);
    for (int i = 0; i < N_MATS && st == NM_OK; i++) {
        const vk_mat *v = &g->mats[i];
        if (m[i].n == 0) continue; /* absent */
        if (!v->convert) {
            st =
                nm_vk_upload(d, &u, v->at, m[i].data, (VkDeviceSize)(m[i].n * m[i].row_bytes), err);
            continue;
        }
        for (int64_t j = 0; j < m[i].n && st == NM_OK; j++) {
            nm_dequantize_row((nm_dtype)m[i].type, (const uint8_t *)m[i].data + j * m[i].row_bytes,
                              row, m[i].k);
            st =
                nm_vk_upload(d, &u, v->at + (VkDeviceSize)j * v->row_bytes, row, v->row_bytes, err);
        }
    }
    nm_free(row);
    const struct {
        const float *p;
        int64_t n, index;
    } vec[] = {
        {s->attn_norm, g->d_model, g->attn_norm},
        {s->attn_norm_b, g->d_model, g->attn_norm_b},
        {s->bq, g->q_dim, g->bq},
        {s->bk, g->kv_dim, g->bk},
        {s->bv, g->kv_dim, g->bv},
        {s->bo, g->d_model, g->bo},
        {s->q_norm, 0, g->q_norm},
        {s->k_norm, 0, g->k_norm},
        {s->ffn_norm, g->d_model, g->ffn_norm},
        {s->ffn_norm_b, g->d_model, g->ffn_norm_b},
        {s->rope_factors, s->n_rot / 2, g->factors},
    };
    for (size_t i = 0; i < sizeof vec / sizeof vec[0] && st == NM_OK; i++) {
        if (vec[i].index == NONE) continue;
        int64_t n = vec[i].n;
        if (i == 6) n = s->qk_norm == NM_DENSE_QK_HEAD ? s->head_dim : g->q_dim;
        if (i == 7) n = s->qk_norm == NM_DENSE_QK_HEAD ? s->head_dim : g->kv_dim;
        st =
            nm_vk_upload(d, &u, (VkDeviceSize)vec[i].index * 4, vec[i].p, (VkDeviceSize)n * 4, err);
    }
    const nm_status st2 = nm_vk_uploader_end(d, &u, st == NM_OK, err);
    return st ? st : st2;
}

static nm_status build_set(vk_dense *g, nm_error *err) {
    vk_device *d = g->d;
    const VkDescriptorPoolSize size = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       .descriptorCount = 3};
    const VkDescriptorPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                           .maxSets = 1,
                                           .poolSizeCount = 1,
                                           .pPoolSizes = &size};
    VkResult r = d->fn.vkCreateDescriptorPool(d->dev, &pi, NULL, &g->desc_pool);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkCreateDescriptorPool", err);
    const VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                            .descriptorPool = g->desc_pool,
                                            .descriptorSetCount = 1,
                                            .pSetLayouts = &d->set_layout};
    r = d->fn.vkAllocateDescriptorSets(d->dev, &ai, &g->set);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkAllocateDescriptorSets", err);
    const VkDescriptorBufferInfo infos[3] = {{g->weights.buf, 0, VK_WHOLE_SIZE},
                                             {g->act.buf, 0, VK_WHOLE_SIZE},
                                             {g->kv.buf, 0, VK_WHOLE_SIZE}};
    VkWriteDescriptorSet wr[3];
    for (uint32_t b = 0; b < 3; b++)
        wr[b] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                       .dstSet = g->set,
                                       .dstBinding = b,
                                       .descriptorCount = 1,
                                       .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       .pBufferInfo = &infos[b]};
    d->fn.vkUpdateDescriptorSets(d->dev, 3, wr, 0, NULL);
    return NM_OK;
}

static void step(vk_device *d, VkCommandBuffer cb, VkPipeline p, const uint32_t *pc, size_t n_pc,
                 uint32_t gx, uint32_t gy) {
    d->fn.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
    d->fn.vkCmdPushConstants(cb, d->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                             (uint32_t)(n_pc * sizeof(uint32_t)), pc);
    d->fn.vkCmdDispatch(cb, gx, gy, 1);
}

/* y = W_m x over the chunk's rows (dense_matmul.comp). */
static void matmul(vk_dense *g, VkCommandBuffer cb, VkPipeline p, int m, int64_t n, int64_t k,
                   uint32_t x0, uint32_t y0) {
    const vk_mat *v = &g->mats[m];
    const uint32_t pc[7] = {(uint32_t)v->at,  v->row_bytes, (uint32_t)n, (uint32_t)k, x0, y0,
                            (uint32_t)g->rows};
    step(g->d, cb, p, pc, 7, (uint32_t)((n + 63) / 64), (uint32_t)((g->rows + 3) / 4));
}

/* norm of rows (dense_norm.comp), after src + add + bias into xout when add. */
static void norm(vk_dense *g, VkCommandBuffer cb, VkPipeline p, const nm_dense_spec *s,
                 uint32_t src, int64_t add, int64_t bias, int64_t xout, uint32_t dst, int64_t nw,
                 int64_t nb) {
    const uint32_t pc[11] = {src,
                             opt(add),
                             opt(bias),
                             opt(xout),
                             dst,
                             (uint32_t)nw,
                             opt(nb),
                             (uint32_t)g->d_model,
                             (uint32_t)g->rows,
                             s->norm == NM_DENSE_NORM_LAYER,
                             f32_bits(s->norm_eps)};
    step(g->d, cb, p, pc, 11, (uint32_t)((g->rows + 63) / 64), 1);
}

/* The shared expert's elementwise steps over n values (dense_shexp.comp):
 * mode 0 SwiGLU of x0 and y0 into x0, mode 1 x0 scaled by the sigmoid of
 * y0's logit of each row of k. */
static void elementwise(vk_dense *g, VkCommandBuffer cb, VkPipeline p, uint32_t x0, uint32_t y0,
                        int64_t n, int64_t k, uint32_t mode) {
    const uint32_t pc[5] = {x0, y0, (uint32_t)n, (uint32_t)k, mode};
    const int64_t groups = (n + 63) / 64;
    step(g->d, cb, p, pc, 5, (uint32_t)(groups < 65535 ? groups : 65535), 1);
}

static nm_status record(vk_dense *g, const nm_dense_spec *s, nm_error *err) {
    vk_device *d = g->d;
    VkPipeline p_norm, p_qk, p_attn, p_mm[N_MATS];
    nm_status st = nm_vk_dense_pipeline(d, VK_DENSE_NORM, 0, &p_norm, err);
    if (st == NM_OK) st = nm_vk_dense_pipeline(d, VK_DENSE_QK, 0, &p_qk, err);
    if (st == NM_OK) st = nm_vk_dense_pipeline(d, VK_DENSE_ATTN, 0, &p_attn, err);
    VkPipeline p_shexp;
    if (st == NM_OK) st = nm_vk_dense_pipeline(d, VK_DENSE_SHEXP, 0, &p_shexp, err);
    for (int i = 0; i < N_MATS && st == NM_OK; i++)
        st = nm_vk_dense_pipeline(d, VK_DENSE_MATMUL, g->mats[i].slot, &p_mm[i], err);
    if (st) return st;
    VkResult r = nm_vk_timed_command_buffer(d, &g->cb, &g->fence, &g->queries);
    pthread_mutex_lock(&d->mutex);
    if (r == VK_SUCCESS) r = nm_vk_timed_begin(d, g->cb, g->queries);
    if (r == VK_SUCCESS) {
        VkCommandBuffer cb = g->cb;
        const VkAccessFlags rd = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
        const VkPipelineStageFlags cs = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
        d->fn.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, d->pipe_layout, 0, 1,
                                      &g->set, 0, NULL);
        norm(g, cb, p_norm, s, g->o_x, NONE, NONE, NONE, g->o_a, g->attn_norm, g->attn_norm_b);
        nm_vk_barrier(d, cb, cs, rd);
        matmul(g, cb, p_mm[MAT_Q], MAT_Q, g->q_dim, g->d_model, g->o_a, g->o_q);
        matmul(g, cb, p_mm[MAT_K], MAT_K, g->kv_dim, g->d_model, g->o_a, g->o_k);
        matmul(g, cb, p_mm[MAT_V], MAT_V, g->kv_dim, g->d_model, g->o_a, g->o_v);
        nm_vk_barrier(d, cb, cs, rd);
        const uint32_t mode = (s->rope == NM_DENSE_ROPE_NEOX ? 1u : 0u) |
                              ((uint32_t)s->qk_norm << 1) | (s->kv_type == NM_KV_F16 ? 8u : 0u);
        const uint32_t qk[20] = {g->o_q,
                                 g->o_k,
                                 g->o_v,
                                 opt(g->bq),
                                 opt(g->bk),
                                 opt(g->bv),
                                 opt(g->q_norm),
                                 opt(g->k_norm),
                                 (uint32_t)s->n_head,
                                 (uint32_t)s->n_head_kv,
                                 (uint32_t)s->head_dim,
                                 (uint32_t)s->n_rot,
                                 mode,
                                 f32_bits(s->rope_freq_base),
                                 f32_bits(s->rope_attn_factor),
                                 opt(g->factors),
                                 f32_bits(s->norm_eps),
                                 0, /* the position is the activation buffer's first word */
                                 (uint32_t)g->rows,
                                 (uint32_t)g->n_pos};
        step(d, cb, p_qk, qk, 20, (uint32_t)((g->rows + 63) / 64), 1);
        nm_vk_barrier(d, cb, cs, rd);
        const uint32_t at[9] = {g->o_q,
                                g->o_att,
                                (uint32_t)g->n_pos,
                                (uint32_t)s->n_head,
                                (uint32_t)s->n_head_kv,
                                (uint32_t)s->head_dim,
                                f32_bits(s->attn_scale),
                                0,
                                (uint32_t)g->rows};
        step(d, cb, p_attn, at, 9, (uint32_t)((g->rows + 63) / 64), (uint32_t)s->n_head);
        nm_vk_barrier(d, cb, cs, rd);
        matmul(g, cb, p_mm[MAT_O], MAT_O, g->d_model, g->q_dim, g->o_att, g->o_proj);
        nm_vk_barrier(d, cb, cs, rd);
        norm(g, cb, p_norm, s, g->o_x, g->o_proj, g->bo, g->o_xout, g->o_xn, g->ffn_norm,
             g->ffn_norm_b);
        nm_vk_barrier(d, cb, cs, rd);
        matmul(g, cb, p_mm[MAT_R], MAT_R, g->n_expert, g->d_model, g->o_xn, g->o_logits);
        if (g->n_ff_shexp > 0) {
            const int64_t ff = g->n_ff_shexp, dm = g->d_model;
            matmul(g, cb, p_mm[MAT_SG], MAT_SG, ff, dm, g->o_xn, g->o_sg);
            matmul(g, cb, p_mm[MAT_SU], MAT_SU, ff, dm, g->o_xn, g->o_su);
            if (g->shexp_gated) matmul(g, cb, p_mm[MAT_SI], MAT_SI, 1, dm, g->o_xn, g->o_sl);
            nm_vk_barrier(d, cb, cs, rd);
            elementwise(g, cb, p_shexp, g->o_sg, g->o_su, g->rows * ff, 1, 0);
            nm_vk_barrier(d, cb, cs, rd);
            matmul(g, cb, p_mm[MAT_SD], MAT_SD, dm, ff, g->o_sg, g->o_sh);
            if (g->shexp_gated) {
                nm_vk_barrier(d, cb, cs, rd);
                elementwise(g, cb, p_shexp, g->o_sh, g->o_sl, g->rows * dm, dm, 1);
            }
        }
        r = nm_vk_timed_end(d, cb, g->queries);
    }
    pthread_mutex_unlock(&d->mutex);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "recording a dense graph", err);
    return NM_OK;
}

nm_status nm_vk_dense_new(vk_device *d, const nm_dense_spec *s, vk_dense **out, nm_error *err) {
    *out = NULL;
    nm_mat m[N_MATS];
    spec_mats(s, m);
    for (int i = 0; i < N_MATS; i++)
        if (m[i].layout != NM_LAYOUT_ROWS || !nm_dtype_is_supported(m[i].type))
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "%s: dense graph of layer %d: %s weights of type %s (load the model "
                             "with --no-repack)",
                             d->label, s->layer,
                             m[i].layout != NM_LAYOUT_ROWS ? "repacked" : "unsupported",
                             nm_dtype_name(m[i].type));
    const uint32_t missing = nm_dense_spec_features(s) & ~d->base.ops->dense_features;
    if (missing)
        return nm_errorf(err, NM_ERR_UNSUPPORTED, "%s: dense graph of layer %d needs %s", d->label,
                         s->layer, nm_dense_feature_name(missing & -missing));
    if (s->head_dim > VK_MAX_HEAD_DIM)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s: dense graph of layer %d: head_dim %d exceeds the attention "
                         "shader's %d",
                         d->label, s->layer, s->head_dim, VK_MAX_HEAD_DIM);
    vk_dense *g = nm_calloc(1, sizeof *g);
    if (!g) return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory for a dense graph", d->label);
    g->d = d;
    g->layer = s->layer;
    g->rows = s->rows;
    g->n_pos = s->n_pos;
    g->n_head = s->n_head;
    g->n_head_kv = s->n_head_kv;
    g->head_dim = s->head_dim;
    g->n_expert = s->n_expert;
    g->d_model = s->d_model;
    g->q_dim = (int64_t)s->n_head * s->head_dim;
    g->kv_dim = (int64_t)s->n_head_kv * s->head_dim;
    g->kv_f16 = s->kv_type == NM_KV_F16;
    g->n_ff_shexp = s->n_ff_shexp;
    g->shexp_gated = s->n_ff_shexp > 0 && s->shexp_gate_inp.data;
    const VkDeviceSize w_bytes = layout_weights(g, s);
    /* the activation buffer, in floats: position, then the chunk's tensors */
    const int64_t rows = s->rows, dm = g->d_model, qd = g->q_dim, kvd = g->kv_dim;
    int64_t at = 4;
    const int64_t ff = s->n_ff_shexp;
    uint32_t *offs[] = {&g->o_x,   &g->o_a,    &g->o_q,    &g->o_k,  &g->o_v,
                        &g->o_att, &g->o_proj, &g->o_xout, &g->o_xn, &g->o_logits,
                        &g->o_sg,  &g->o_su,   &g->o_sh,   &g->o_sl};
    const int64_t sizes[] = {rows * dm,          rows * dm,          rows * qd, rows * kvd,
                             rows * kvd,         rows * qd,          rows * dm, rows * dm,
                             rows * dm,          rows * s->n_expert, rows * ff, rows * ff,
                             ff ? rows * dm : 0, ff ? rows : 0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *offs[i] = (uint32_t)at;
        at += (sizes[i] + 3) / 4 * 4;
    }
    const VkDeviceSize a_bytes = (VkDeviceSize)at * 4;
    const VkDeviceSize kv_bytes = (VkDeviceSize)2 * (VkDeviceSize)s->n_pos * (VkDeviceSize)kvd * 4;
    const VkDeviceSize range = d->limits.maxStorageBufferRange;
    if (w_bytes > range || w_bytes > UINT32_MAX || a_bytes > range || at >= (int64_t)1 << 31 ||
        kv_bytes > range || kv_bytes / 4 >= (VkDeviceSize)1 << 31) {
        nm_free(g);
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "%s: dense graph of layer %d: weights (%llu bytes), activations (%llu "
                         "bytes) or K/V (%llu bytes) exceed the device's largest storage buffer "
                         "(%u bytes)",
                         d->label, s->layer, (unsigned long long)w_bytes,
                         (unsigned long long)a_bytes, (unsigned long long)kv_bytes,
                         d->limits.maxStorageBufferRange);
    }
    char what[96];
    snprintf(what, sizeof what, "the dense graph of layer %d", s->layer);
    nm_status st = nm_vk_buffer_new(
        d, w_bytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, false,
        what, &g->weights, err);
    if (st == NM_OK) st = upload_weights(g, s, err);
    if (st == NM_OK)
        st = nm_vk_buffer_new(d, a_bytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, true, what, &g->act,
                              err);
    if (st == NM_OK)
        st =
            nm_vk_buffer_new(d, kv_bytes,
                             VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                 VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                             false, what, &g->kv, err);
    if (st == NM_OK) st = build_set(g, err);
    if (st == NM_OK) st = record(g, s, err);
    if (st) {
        nm_vk_dense_free(g);
        return st;
    }
    memset(g->act.map, 0, (size_t)a_bytes);
    *out = g;
    return NM_OK;
}

float *nm_vk_dense_input(vk_dense *g) { return (float *)g->act.map + g->o_x; }

void nm_vk_dense_get_outputs(const vk_dense *g, nm_dense_outputs *out) {
    const float *a = g->act.map;
    *out = (nm_dense_outputs){.x = a + g->o_xout,
                              .xn = a + g->o_xn,
                              .logits = a + g->o_logits,
                              .shexp = g->n_ff_shexp > 0 ? a + g->o_sh : NULL};
}

void nm_vk_dense_launch(vk_dense *g, int32_t pos) {
    vk_device *d = g->d;
    NM_ASSERT(pos >= 0 && pos <= g->n_pos - g->rows);
    const uint32_t p = (uint32_t)pos;
    memcpy(g->act.map, &p, sizeof p);
    nm_vk_sync_mapped(d, &g->act, true);
    const VkSubmitInfo si = {
        .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &g->cb};
    pthread_mutex_lock(&d->mutex);
    if (!d->lost) {
        g->submit_ns = nm_time_ns();
        const VkResult r = d->fn.vkQueueSubmit(d->queue, 1, &si, g->fence);
        if (r != VK_SUCCESS) nm_vk_set_lost(d, r, "submitting a dense graph");
    }
    d->stats.dispatches++;
    d->stats.dense_dispatches++;
    pthread_mutex_unlock(&d->mutex);
}

void nm_vk_dense_wait(vk_dense *g) {
    vk_device *d = g->d;
    pthread_mutex_lock(&d->mutex);
    bool lost = d->lost != NM_OK;
    pthread_mutex_unlock(&d->mutex);
    if (!lost) nm_vk_wait_fence(d, g->fence, g->queries, g->submit_ns, "waiting for a dense graph");
    pthread_mutex_lock(&d->mutex);
    lost = d->lost != NM_OK;
    pthread_mutex_unlock(&d->mutex);
    const size_t io = (size_t)g->rows * (size_t)g->d_model;
    float *a = g->act.map;
    if (lost) {
        /* defined outputs for a host that checks the device afterwards */
        memset(a + g->o_xout, 0, io * 4);
        memset(a + g->o_xn, 0, io * 4);
        memset(a + g->o_logits, 0, (size_t)g->rows * (size_t)g->n_expert * 4);
        if (g->n_ff_shexp > 0) memset(a + g->o_sh, 0, io * 4);
        return;
    }
    nm_vk_sync_mapped(d, &g->act, false);
}

/* Copies K and V of positions pos0..pos0+n-1 from the graph into a
 * host-visible staging buffer, then out. */
static void kv_download(vk_dense *g, int32_t pos0, int32_t n, void *k, void *v) {
    vk_device *d = g->d;
    const VkDeviceSize bytes = (VkDeviceSize)n * (VkDeviceSize)g->kv_dim * 4;
    vk_buffer staging = {0};
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    nm_error err = {0};
    VkResult r = VK_SUCCESS;
    bool ok = nm_vk_buffer_new(d, 2 * bytes, VK_BUFFER_USAGE_TRANSFER_DST_BIT, true,
                               "reading a dense graph's K/V", &staging, &err) == NM_OK;
    if (ok) r = nm_vk_command_buffer(d, &cb, &fence);
    ok = ok && r == VK_SUCCESS;
    if (ok) {
        const VkDeviceSize at = (VkDeviceSize)pos0 * (VkDeviceSize)g->kv_dim * 4;
        const VkDeviceSize v_at = (VkDeviceSize)g->n_pos * (VkDeviceSize)g->kv_dim * 4;
        const VkBufferCopy regions[2] = {{at, 0, bytes}, {v_at + at, bytes, bytes}};
        const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                             .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                 .commandBufferCount = 1,
                                 .pCommandBuffers = &cb};
        const VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                    .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                                    .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
        pthread_mutex_lock(&d->mutex);
        r = d->fn.vkBeginCommandBuffer(cb, &bi);
        if (r == VK_SUCCESS) {
            d->fn.vkCmdCopyBuffer(cb, g->kv.buf, staging.buf, 2, regions);
            d->fn.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT,
                                       VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
            r = d->fn.vkEndCommandBuffer(cb);
        }
        if (r == VK_SUCCESS && !d->lost) r = d->fn.vkQueueSubmit(d->queue, 1, &si, fence);
        if (r == VK_SUCCESS) d->stats.syncs++; /* the wait below */
        pthread_mutex_unlock(&d->mutex);
        if (r == VK_SUCCESS) r = d->fn.vkWaitForFences(d->dev, 1, &fence, VK_TRUE, UINT64_MAX);
        ok = r == VK_SUCCESS;
    }
    if (ok) nm_vk_sync_mapped(d, &staging, false);
    pthread_mutex_lock(&d->mutex);
    if (!ok) {
        if (r != VK_SUCCESS)
            nm_vk_set_lost(d, r, "reading a dense graph's K/V");
        else if (!d->lost) {
            d->lost = NM_ERR_NOMEM;
            snprintf(d->lost_msg, sizeof d->lost_msg, "%s", err.msg);
        }
    }
    pthread_mutex_unlock(&d->mutex);
    nm_vk_command_buffer_free(d, cb, fence, VK_NULL_HANDLE);
    if (ok) {
        const float *sk = staging.map, *sv = (const float *)staging.map + bytes / 4;
        if (g->kv_f16) /* exact: the shader stored halves */
            for (size_t i = 0; i < (size_t)bytes / 4; i++) {
                ((uint16_t *)k)[i] = nm_f32_to_f16(sk[i]);
                ((uint16_t *)v)[i] = nm_f32_to_f16(sv[i]);
            }
        else {
            memcpy(k, sk, (size_t)bytes);
            memcpy(v, sv, (size_t)bytes);
        }
    } else {
        memset(k, 0, (size_t)bytes / (g->kv_f16 ? 2 : 1));
        memset(v, 0, (size_t)bytes / (g->kv_f16 ? 2 : 1));
    }
    nm_vk_buffer_free(d, &staging);
}

void nm_vk_dense_kv(vk_dense *g, int32_t pos0, int32_t n, void *k, void *v, bool to_graph) {
    NM_ASSERT(pos0 >= 0 && n >= 0 && pos0 <= g->n_pos - n);
    if (n == 0) return;
    if (!to_graph) {
        kv_download(g, pos0, n, k, v);
        return;
    }
    vk_device *d = g->d;
    const VkDeviceSize bytes = (VkDeviceSize)n * (VkDeviceSize)g->kv_dim * 4;
    const VkDeviceSize at = (VkDeviceSize)pos0 * (VkDeviceSize)g->kv_dim * 4;
    const VkDeviceSize v_at = (VkDeviceSize)g->n_pos * (VkDeviceSize)g->kv_dim * 4;
    nm_error err = {0};
    /* an F16 cache's halves widened to the graph's F32 (exactly) */
    float *wide = g->kv_f16 ? nm_malloc(2 * (size_t)bytes) : NULL;
    nm_status st = g->kv_f16 && !wide
                       ? nm_errorf(&err, NM_ERR_NOMEM, "%s: out of memory widening K/V", d->label)
                       : NM_OK;
    const void *src_k = k, *src_v = v;
    if (wide) {
        for (size_t i = 0; i < (size_t)bytes / 4; i++) {
            wide[i] = nm_f16_to_f32(((const uint16_t *)k)[i]);
            wide[(size_t)bytes / 4 + i] = nm_f16_to_f32(((const uint16_t *)v)[i]);
        }
        src_k = wide;
        src_v = wide + (size_t)bytes / 4;
    }
    vk_uploader u;
    if (st == NM_OK) st = nm_vk_uploader_begin(d, &g->kv, &u, &err);
    if (st == NM_OK) {
        st = nm_vk_upload(d, &u, at, src_k, bytes, &err);
        if (st == NM_OK) st = nm_vk_upload(d, &u, v_at + at, src_v, bytes, &err);
        const nm_status st2 = nm_vk_uploader_end(d, &u, st == NM_OK, &err);
        if (st == NM_OK) st = st2;
    }
    nm_free(wide);
    if (st) {
        pthread_mutex_lock(&d->mutex);
        if (!d->lost) {
            d->lost = st;
            snprintf(d->lost_msg, sizeof d->lost_msg, "%s", err.msg);
        }
        pthread_mutex_unlock(&d->mutex);
    }
}
