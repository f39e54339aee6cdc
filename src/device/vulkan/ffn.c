/* Graph kind 1 on the vulkan device: the grouped expert FFN of an
 * nm_ffn_spec as one command buffer recorded at compile (per slot a
 * gate/up/activation dispatch, a barrier, per slot a down dispatch), the
 * group's weights (and the experts' biases, F32) uploaded once into device
 * memory, input and output in host-visible memory, a fence for completion
 * and two timestamps for the device's busy time. The activation is the
 * weights' (SwiGLU or gpt-oss's clamped SwiGLU). The shaders (shaders/)
 * read F32, F16, BF16, Q8_0, Q4_K and MXFP4 weights as they are; other
 * types are converted to F32 at upload. */
#include "vk-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <stdio.h>
#include <string.h>

/* No bias (the shaders' NONE). */
#define NO_BIAS UINT32_MAX

/* Where one slot's matrices and biases lie in the graph's weight buffer;
 * the bias offsets are relative to their binding, or NO_BIAS. */
typedef struct vk_slot {
    int64_t row0, rows;
    VkDeviceSize gate_up_at; /* gate, then up at up_rel, then the biases, as one binding */
    VkDeviceSize gate_up_bytes;
    uint32_t up_rel;
    uint32_t gate_b_rel, up_b_rel; /* F32 [d_ff] each */
    VkDeviceSize down_at;          /* down, then its bias at down_b_rel */
    VkDeviceSize down_bytes;
    uint32_t down_b_rel; /* F32 [d_model] */
} vk_slot;

/* How a phase's weights reach the device: the type the shader reads and
 * the bytes of one row in it. */
typedef struct vk_phase {
    uint32_t type;
    int slot_type; /* nm_vk_type_slot(type) */
    bool convert;  /* the file's type is not read by the shaders: F32 copies */
    size_t row_bytes;
} vk_phase;

struct nm_graph {
    vk_device *dev;
    vk_dense *dense; /* a dense-part graph (dense.c); NULL: an ffn graph */
    int32_t layer;
    int32_t n_slots;
    int64_t d_model, d_ff, n_rows;
    vk_slot *slots; /* [n_slots] */
    uint32_t glu;   /* the weights' nm_glu, and its alpha and limit */
    float glu_alpha, glu_limit;
    vk_buffer weights;
    vk_buffer in;  /* host visible [n_rows][d_model] */
    vk_buffer out; /* host visible [n_rows][d_model] */
    vk_buffer hid; /* device [n_rows][d_ff] silu(gate x) * up x */
    VkDescriptorPool desc_pool;
    VkDescriptorSet *sets; /* [2 * n_slots]: slot i's gate_up set, then its down set */
    VkCommandBuffer cb;
    VkFence fence;
    VkQueryPool queries; /* two timestamps, when the queue has them */
    int64_t submit_ns;   /* host time of the last submit, without timestamps */
    bool pending;        /* submitted and not yet waited for */
};

static VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

/* The phase of weights m as the shaders will read them; NM_OK or the reason
 * they cannot be. */
static nm_status phase_of(vk_device *d, const nm_mat *m, const nm_mat *m2, const char *what,
                          int32_t layer, vk_phase *out, nm_error *err) {
    for (const nm_mat *x = m; x; x = x == m ? m2 : NULL) {
        if (x->layout != NM_LAYOUT_ROWS)
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "%s: ffn graph of layer %d: the %s weights are in the host's repacked "
                             "layout; load the model with --no-repack (the CLI does so for any "
                             "device other than cpu)",
                             d->label, layer, what);
        if (!nm_dtype_is_supported(x->type))
            return nm_errorf(err, NM_ERR_UNSUPPORTED,
                             "%s: ffn graph of layer %d: %s weights of type %s are not supported",
                             d->label, layer, what, nm_dtype_name(x->type));
    }
    out->type = m->type;
    out->slot_type = nm_vk_type_slot(m->type);
    /* gate and up share one shader, so one type: else both become F32 */
    out->convert = out->slot_type < 0 || (m2 && m2->type != m->type);
    if (out->convert) {
        out->type = NM_DTYPE_F32;
        out->slot_type = nm_vk_type_slot(NM_DTYPE_F32);
        out->row_bytes = (size_t)m->k * sizeof(float);
    } else {
        out->row_bytes = m->row_bytes;
    }
    return NM_OK;
}

/* Everything the device refuses before touching memory. */
static nm_status check_spec(vk_device *d, const nm_ffn_spec *spec, nm_error *err) {
    const nm_expert_weights *w = spec->weights;
    const int32_t layer = spec->layer;
    nm_status st = nm_ffn_spec_check_slots(spec, err);
    if (st) return st;
    if (spec->d_model != w->gate.k || spec->d_ff != w->gate.n || w->up.n != spec->d_ff ||
        w->up.k != spec->d_model || w->down.n != spec->d_model || w->down.k != spec->d_ff)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "ffn graph of layer %d: d_model %lld, d_ff %lld do not match the "
                         "weights (gate [%lld][%lld], up [%lld][%lld], down [%lld][%lld])",
                         layer, (long long)spec->d_model, (long long)spec->d_ff,
                         (long long)w->gate.n, (long long)w->gate.k, (long long)w->up.n,
                         (long long)w->up.k, (long long)w->down.n, (long long)w->down.k);
    /* ffn_gate_up.comp's GLU_* values */
    _Static_assert(NM_GLU_SWIGLU == 0 && NM_GLU_SWIGLU_OAI == 1, "the shader's activations");
    if (w->glu != NM_GLU_SWIGLU && w->glu != NM_GLU_SWIGLU_OAI)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s: ffn graph of layer %d: unknown activation %u", d->label, layer,
                         w->glu);
    int64_t rows = 0;
    for (int32_t i = 0; i < spec->n_experts; i++) {
        if ((uint32_t)spec->capacity[i] > d->limits.maxComputeWorkGroupCount[1])
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "%s: ffn graph of layer %d: capacity %d of slot %d exceeds the "
                             "device's %u rows per dispatch",
                             d->label, layer, spec->capacity[i], i,
                             d->limits.maxComputeWorkGroupCount[1]);
        rows += spec->capacity[i];
    }
    /* the shaders index floats with 32-bit integers */
    const int64_t width = spec->d_model > spec->d_ff ? spec->d_model : spec->d_ff;
    if (rows * width >= (int64_t)1 << 31 ||
        (uint64_t)rows * (uint64_t)width * sizeof(float) > d->limits.maxStorageBufferRange)
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "%s: ffn graph of layer %d: %lld rows of %lld floats exceed the "
                         "device's largest storage buffer (%u bytes)",
                         d->label, layer, (long long)rows, (long long)width,
                         d->limits.maxStorageBufferRange);
    return NM_OK;
}

/* Appends matrix m (expert e's, as phase p says) to the upload at `at`. */
static nm_status upload_mat(vk_device *d, vk_uploader *u, VkDeviceSize at, const nm_mat *m,
                            const vk_phase *p, nm_error *err) {
    if (!p->convert)
        return nm_vk_upload(d, u, at, m->data, (VkDeviceSize)(m->n * m->row_bytes), err);
    float *row = nm_malloc((size_t)m->k * sizeof(float));
    if (!row) return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory converting weights", d->label);
    nm_status st = NM_OK;
    for (int64_t j = 0; j < m->n && st == NM_OK; j++) {
        nm_dequantize_row((nm_dtype)m->type, (const uint8_t *)m->data + j * m->row_bytes, row,
                          m->k);
        st = nm_vk_upload(d, u, at + (VkDeviceSize)j * p->row_bytes, row, p->row_bytes, err);
    }
    nm_free(row);
    return st;
}

static void graph_release(nm_graph *g) {
    vk_device *d = g->dev;
    nm_vk_dense_free(g->dense);
    nm_vk_command_buffer_free(d, g->cb, g->fence, g->queries);
    if (g->desc_pool) d->fn.vkDestroyDescriptorPool(d->dev, g->desc_pool, NULL);
    nm_vk_buffer_free(d, &g->weights);
    nm_vk_buffer_free(d, &g->in);
    nm_vk_buffer_free(d, &g->out);
    nm_vk_buffer_free(d, &g->hid);
    nm_free(g->sets);
    nm_free(g->slots);
    nm_free(g);
}

/* Lays out, allocates and uploads the weights of every slot. */
static nm_status build_weights(nm_graph *g, const nm_ffn_spec *spec, const vk_phase *ph1,
                               const vk_phase *ph2, nm_error *err) {
    vk_device *d = g->dev;
    const nm_expert_weights *w = spec->weights;
    const VkDeviceSize align = round_up(d->limits.minStorageBufferOffsetAlignment, 16);
    const VkDeviceSize mat_ff = (VkDeviceSize)spec->d_ff * ph1->row_bytes;    /* gate, up */
    const VkDeviceSize mat_dm = (VkDeviceSize)spec->d_model * ph2->row_bytes; /* down */
    const VkDeviceSize up_rel = round_up(mat_ff, 16);
    /* the biases after the matrices, F32 (4-byte aligned) */
    VkDeviceSize gate_up = round_up(up_rel + mat_ff, 4), down = round_up(mat_dm, 4);
    const VkDeviceSize ff_bytes = (VkDeviceSize)spec->d_ff * sizeof(float);
    const VkDeviceSize gate_b_rel = w->gate_b ? gate_up : NO_BIAS;
    gate_up += w->gate_b ? ff_bytes : 0;
    const VkDeviceSize up_b_rel = w->up_b ? gate_up : NO_BIAS;
    gate_up += w->up_b ? ff_bytes : 0;
    const VkDeviceSize down_b_rel = w->down_b ? down : NO_BIAS;
    down += w->down_b ? (VkDeviceSize)spec->d_model * sizeof(float) : 0;
    if (gate_up > d->limits.maxStorageBufferRange || gate_up > UINT32_MAX ||
        down > d->limits.maxStorageBufferRange)
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "%s: ffn graph of layer %d: one expert's gate and up weights (%llu bytes) "
                         "or down weights (%llu bytes) exceed the device's largest storage "
                         "buffer (%u bytes)",
                         d->label, g->layer, (unsigned long long)gate_up, (unsigned long long)down,
                         d->limits.maxStorageBufferRange);
    VkDeviceSize at = 0;
    for (int32_t i = 0; i < g->n_slots; i++) {
        vk_slot *s = &g->slots[i];
        s->gate_up_at = at;
        s->gate_up_bytes = gate_up;
        s->up_rel = (uint32_t)up_rel;
        s->gate_b_rel = (uint32_t)gate_b_rel;
        s->up_b_rel = (uint32_t)up_b_rel;
        at = round_up(at + gate_up, align);
        s->down_at = at;
        s->down_bytes = down;
        s->down_b_rel = (uint32_t)down_b_rel;
        at = round_up(at + down, align);
    }
    char what[96];
    snprintf(what, sizeof what, "the weights of the ffn graph of layer %d (%d experts)", g->layer,
             g->n_slots);
    nm_status st = nm_vk_buffer_new(
        d, at, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, false, what,
        &g->weights, err);
    if (st) return st;
    vk_uploader u;
    st = nm_vk_uploader_begin(d, &g->weights, &u, err);
    if (st) return st;
    for (int32_t i = 0; i < g->n_slots && st == NM_OK; i++) {
        const vk_slot *s = &g->slots[i];
        const int32_t e = spec->experts[i];
        const nm_mat gm = nm_expert_mat(&w->gate, w->gate_stride, e);
        const nm_mat um = nm_expert_mat(&w->up, w->up_stride, e);
        const nm_mat dm = nm_expert_mat(&w->down, w->down_stride, e);
        st = upload_mat(d, &u, s->gate_up_at, &gm, ph1, err);
        if (st == NM_OK) st = upload_mat(d, &u, s->gate_up_at + s->up_rel, &um, ph1, err);
        if (st == NM_OK) st = upload_mat(d, &u, s->down_at, &dm, ph2, err);
        const size_t ff = (size_t)spec->d_ff, dmod = (size_t)spec->d_model;
        if (st == NM_OK && w->gate_b)
            st = nm_vk_upload(d, &u, s->gate_up_at + s->gate_b_rel, w->gate_b + (size_t)e * ff,
                              ff * sizeof(float), err);
        if (st == NM_OK && w->up_b)
            st = nm_vk_upload(d, &u, s->gate_up_at + s->up_b_rel, w->up_b + (size_t)e * ff,
                              ff * sizeof(float), err);
        if (st == NM_OK && w->down_b)
            st = nm_vk_upload(d, &u, s->down_at + s->down_b_rel, w->down_b + (size_t)e * dmod,
                              dmod * sizeof(float), err);
    }
    const nm_status st2 = nm_vk_uploader_end(d, &u, st == NM_OK, err);
    return st ? st : st2;
}

/* The descriptor sets: weights of the slot, and the buffers of its phase. */
static nm_status build_sets(nm_graph *g, nm_error *err) {
    vk_device *d = g->dev;
    const uint32_t n_sets = 2 * (uint32_t)g->n_slots;
    const VkDescriptorPoolSize size = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       .descriptorCount = 3 * n_sets};
    const VkDescriptorPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                           .maxSets = n_sets,
                                           .poolSizeCount = 1,
                                           .pPoolSizes = &size};
    VkResult r = d->fn.vkCreateDescriptorPool(d->dev, &pi, NULL, &g->desc_pool);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkCreateDescriptorPool", err);
    VkDescriptorSetLayout *layouts = nm_calloc(n_sets, sizeof *layouts);
    g->sets = nm_calloc(n_sets, sizeof *g->sets);
    if (!layouts || !g->sets) {
        nm_free(layouts);
        return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory for descriptor sets", d->label);
    }
    for (uint32_t i = 0; i < n_sets; i++)
        layouts[i] = d->set_layout;
    const VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                            .descriptorPool = g->desc_pool,
                                            .descriptorSetCount = n_sets,
                                            .pSetLayouts = layouts};
    r = d->fn.vkAllocateDescriptorSets(d->dev, &ai, g->sets);
    nm_free(layouts);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkAllocateDescriptorSets", err);
    for (int32_t i = 0; i < g->n_slots; i++) {
        const vk_slot *s = &g->slots[i];
        const VkDescriptorBufferInfo infos[6] = {
            {g->weights.buf, s->gate_up_at, s->gate_up_bytes},
            {g->in.buf, 0, VK_WHOLE_SIZE},
            {g->hid.buf, 0, VK_WHOLE_SIZE},
            {g->weights.buf, s->down_at, s->down_bytes},
            {g->hid.buf, 0, VK_WHOLE_SIZE},
            {g->out.buf, 0, VK_WHOLE_SIZE},
        };
        VkWriteDescriptorSet wr[6];
        for (int b = 0; b < 6; b++)
            wr[b] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                           .dstSet = g->sets[2 * i + b / 3],
                                           .dstBinding = (uint32_t)(b % 3),
                                           .descriptorCount = 1,
                                           .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           .pBufferInfo = &infos[b]};
        d->fn.vkUpdateDescriptorSets(d->dev, 6, wr, 0, NULL);
    }
    return NM_OK;
}

/* The graph's one command buffer, its fence and its timestamps. */
static nm_status record(nm_graph *g, const vk_phase *ph1, const vk_phase *ph2, nm_error *err) {
    vk_device *d = g->dev;
    VkPipeline pipe[2];
    nm_status st = nm_vk_pipeline(d, ph1->slot_type, 0, &pipe[0], err);
    if (st == NM_OK) st = nm_vk_pipeline(d, ph2->slot_type, 1, &pipe[1], err);
    if (st) return st;
    VkResult r = nm_vk_timed_command_buffer(d, &g->cb, &g->fence, &g->queries);
    /* the pool's command buffers are recorded under the device's mutex */
    pthread_mutex_lock(&d->mutex);
    if (r == VK_SUCCESS) r = nm_vk_timed_begin(d, g->cb, g->queries);
    if (r == VK_SUCCESS) {
        VkCommandBuffer cb = g->cb;
        for (int phase = 0; phase < 2; phase++) {
            d->fn.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe[phase]);
            const int64_t n_out = phase == 0 ? g->d_ff : g->d_model;
            const int64_t k = phase == 0 ? g->d_model : g->d_ff;
            const vk_phase *ph = phase == 0 ? ph1 : ph2;
            for (int32_t i = 0; i < g->n_slots; i++) {
                const vk_slot *s = &g->slots[i];
                /* the shaders' push constants (ffn_gate_up.comp, ffn_down.comp) */
                uint32_t pc[13] = {
                    0,
                    phase == 0 ? s->up_rel : s->down_b_rel,
                    (uint32_t)ph->row_bytes,
                    (uint32_t)n_out,
                    (uint32_t)k,
                    (uint32_t)(s->row0 * k),     /* first input row (x or h) */
                    (uint32_t)(s->row0 * n_out), /* first output row (h or y) */
                    (uint32_t)s->rows,
                    s->gate_b_rel,
                    s->up_b_rel,
                    g->glu,
                };
                memcpy(&pc[11], &g->glu_alpha, sizeof(float));
                memcpy(&pc[12], &g->glu_limit, sizeof(float));
                d->fn.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, d->pipe_layout, 0,
                                              1, &g->sets[2 * i + phase], 0, NULL);
                d->fn.vkCmdPushConstants(cb, d->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                         sizeof pc, pc);
                d->fn.vkCmdDispatch(cb, (uint32_t)((n_out + 63) / 64),
                                    (uint32_t)((s->rows + 3) / 4), 1);
            }
            if (phase == 0)
                nm_vk_barrier(d, cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                              VK_ACCESS_SHADER_READ_BIT);
        }
        r = nm_vk_timed_end(d, cb, g->queries);
    }
    pthread_mutex_unlock(&d->mutex);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "recording an ffn graph", err);
    return NM_OK;
}

nm_status nm_vk_ffn_compile(nm_device *dev, const nm_ffn_spec *spec, nm_graph **out,
                            nm_error *err) {
    *out = NULL;
    NM_ASSERT(spec && spec->weights && (spec->n_experts < 1 || (spec->experts && spec->capacity)));
    vk_device *d = dev->ctx;
    nm_status st = check_spec(d, spec, err);
    vk_phase ph1, ph2;
    const nm_expert_weights *w = spec->weights;
    if (st == NM_OK) st = phase_of(d, &w->gate, &w->up, "gate/up", spec->layer, &ph1, err);
    if (st == NM_OK) st = phase_of(d, &w->down, NULL, "down", spec->layer, &ph2, err);
    if (st) return st;
    nm_graph *g = nm_calloc(1, sizeof *g);
    if (!g) return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory for an ffn graph", d->label);
    g->dev = d;
    g->layer = spec->layer;
    g->n_slots = spec->n_experts;
    g->d_model = spec->d_model;
    g->d_ff = spec->d_ff;
    g->n_rows = nm_ffn_spec_rows(spec);
    g->glu = spec->weights->glu;
    g->glu_alpha = spec->weights->glu_alpha;
    g->glu_limit = spec->weights->glu_limit;
    g->slots = nm_calloc((size_t)g->n_slots, sizeof *g->slots);
    if (!g->slots) {
        nm_free(g);
        return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory for an ffn graph", d->label);
    }
    for (int32_t i = 0, row = 0; i < g->n_slots; i++) {
        g->slots[i].row0 = row;
        g->slots[i].rows = spec->capacity[i];
        row += spec->capacity[i];
    }
    const VkDeviceSize io = (VkDeviceSize)g->n_rows * (VkDeviceSize)g->d_model * sizeof(float);
    const VkDeviceSize hid = (VkDeviceSize)g->n_rows * (VkDeviceSize)g->d_ff * sizeof(float);
    char what[96];
    snprintf(what, sizeof what, "the buffers of the ffn graph of layer %d", g->layer);
    st = build_weights(g, spec, &ph1, &ph2, err);
    if (st == NM_OK)
        st = nm_vk_buffer_new(d, io, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, true, what, &g->in, err);
    if (st == NM_OK)
        st = nm_vk_buffer_new(d, io, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, true, what, &g->out, err);
    if (st == NM_OK)
        st =
            nm_vk_buffer_new(d, hid, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, false, what, &g->hid, err);
    if (st == NM_OK) st = build_sets(g, err);
    if (st == NM_OK) st = record(g, &ph1, &ph2, err);
    if (st) {
        graph_release(g);
        return st;
    }
    memset(g->in.map, 0, (size_t)io);
    memset(g->out.map, 0, (size_t)io);
    pthread_mutex_lock(&d->mutex);
    d->n_graphs++;
    d->stats.graphs_compiled++;
    pthread_mutex_unlock(&d->mutex);
    *out = g;
    return NM_OK;
}

float *nm_vk_ffn_input(nm_graph *g) { return g->dense ? nm_vk_dense_input(g->dense) : g->in.map; }

const float *nm_vk_ffn_output(const nm_graph *g) {
    NM_ASSERT(!g->dense); /* dense graphs have dense_outputs */
    return g->out.map;
}

nm_status nm_vk_dense_compile(nm_device *dev, const nm_dense_spec *spec, nm_graph **out,
                              nm_error *err) {
    *out = NULL;
    vk_device *d = dev->ctx;
    nm_status st = nm_dense_spec_check(spec, err);
    if (st) return st;
    nm_graph *g = nm_calloc(1, sizeof *g);
    if (!g) return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory for a dense graph", d->label);
    g->dev = d;
    g->layer = spec->layer;
    st = nm_vk_dense_new(d, spec, &g->dense, err);
    if (st) {
        nm_free(g);
        return st;
    }
    pthread_mutex_lock(&d->mutex);
    d->n_graphs++;
    d->stats.graphs_compiled++;
    pthread_mutex_unlock(&d->mutex);
    *out = g;
    return NM_OK;
}

void nm_vk_dense_submit(nm_graph *g, int32_t pos) {
    NM_ASSERT(g->dense && !g->pending);
    nm_vk_dense_launch(g->dense, pos);
    g->pending = true;
}

void nm_vk_dense_outputs(const nm_graph *g, nm_dense_outputs *out) {
    NM_ASSERT(g->dense);
    nm_vk_dense_get_outputs(g->dense, out);
}

void nm_vk_kv_read(nm_graph *g, int32_t pos0, int32_t n, void *k, void *v) {
    NM_ASSERT(g->dense && !g->pending);
    nm_vk_dense_kv(g->dense, pos0, n, k, v, false);
}

void nm_vk_kv_write(nm_graph *g, int32_t pos0, int32_t n, const void *k, const void *v) {
    NM_ASSERT(g->dense && !g->pending);
    /* only read in this direction */
    nm_vk_dense_kv(g->dense, pos0, n, (void *)k, (void *)v, true);
}

void nm_vk_set_lost(vk_device *d, VkResult r, const char *what) {
    if (d->lost) return;
    nm_error e = {0};
    d->lost = nm_vk_fail(d, r, what, &e);
    snprintf(d->lost_msg, sizeof d->lost_msg, "%s", e.msg);
}

void nm_vk_ffn_submit(nm_graph *g) {
    vk_device *d = g->dev;
    NM_ASSERT(!g->pending); /* submitted twice without a wait in between */
    nm_vk_sync_mapped(d, &g->in, true);
    const VkSubmitInfo si = {
        .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &g->cb};
    pthread_mutex_lock(&d->mutex);
    if (!d->lost) {
        g->submit_ns = nm_time_ns();
        const VkResult r = d->fn.vkQueueSubmit(d->queue, 1, &si, g->fence);
        if (r == VK_SUCCESS)
            g->pending = true;
        else
            nm_vk_set_lost(d, r, "submitting an ffn graph");
    }
    d->stats.dispatches++;
    pthread_mutex_unlock(&d->mutex);
}

void nm_vk_wait_fence(vk_device *d, VkFence fence, VkQueryPool queries, int64_t submit_ns,
                      const char *what) {
    VkResult r = d->fn.vkWaitForFences(d->dev, 1, &fence, VK_TRUE, UINT64_MAX);
    const int64_t t_done = nm_time_ns();
    uint64_t ts[2] = {0, 0};
    if (r == VK_SUCCESS) r = d->fn.vkResetFences(d->dev, 1, &fence);
    if (r == VK_SUCCESS && queries)
        r = d->fn.vkGetQueryPoolResults(d->dev, queries, 0, 2, sizeof ts, ts, sizeof ts[0],
                                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    pthread_mutex_lock(&d->mutex);
    d->stats.syncs++;
    if (r == VK_SUCCESS) /* without timestamps, submit to the fence seen signalled */
        d->stats.busy_ns +=
            queries ? (int64_t)((double)(ts[1] - ts[0]) * d->timestamp_period) : t_done - submit_ns;
    else
        nm_vk_set_lost(d, r, what);
    pthread_mutex_unlock(&d->mutex);
}

void nm_vk_ffn_wait(nm_graph *g) {
    vk_device *d = g->dev;
    if (g->dense) {
        if (g->pending) nm_vk_dense_wait(g->dense);
        g->pending = false;
        return;
    }
    if (g->pending) {
        nm_vk_wait_fence(d, g->fence, g->queries, g->submit_ns, "waiting for an ffn graph");
        g->pending = false;
        pthread_mutex_lock(&d->mutex);
        d->stats.rows_computed += (uint64_t)g->n_rows;
        pthread_mutex_unlock(&d->mutex);
    }
    pthread_mutex_lock(&d->mutex);
    const bool lost = d->lost != NM_OK;
    pthread_mutex_unlock(&d->mutex);
    if (lost) {
        /* defined output for a host that checks the device afterwards */
        memset(g->out.map, 0, (size_t)g->n_rows * (size_t)g->d_model * sizeof(float));
        return;
    }
    nm_vk_sync_mapped(d, &g->out, false);
}

void nm_vk_ffn_free(nm_graph *g) {
    if (!g) return;
    vk_device *d = g->dev;
    nm_vk_ffn_wait(g);
    graph_release(g);
    pthread_mutex_lock(&d->mutex);
    d->n_graphs--;
    pthread_mutex_unlock(&d->mutex);
}
