/* What joins a model to the planner: its MoE shape (nm_moe_shape, which
 * is all plan/ sees of a model) and the timing of the host's MoE step that
 * a device profile carries. */
#include "engine.h"

#include "base/base.h"
#include "model/model.h"

static const nm_expert_weights *layer_experts(const void *ctx, int32_t layer) {
    return nm_model_moe_experts(ctx, layer);
}

void nm_model_moe_shape(const nm_model *model, nm_moe_shape *out) {
    NM_ASSERT(model && out);
    const nm_hparams *hp = &model->hp;
    /* the layers with experts: a leading dense layer has no plan entry */
    *out = (nm_moe_shape){.n_layer = nm_model_n_moe_layers(hp),
                          .first_layer = hp->n_layer_dense_lead,
                          .n_expert = hp->n_expert,
                          .k = hp->n_expert_used,
                          .d_model = hp->n_embd,
                          .d_ff = hp->n_ff_exp,
                          .n_shared = hp->n_expert_shared,
                          .d_ff_shared = hp->n_ff_shexp,
                          .layer_experts = model->vocab_only ? NULL : layer_experts,
                          .ctx = model};
    nm_model_fingerprint(model, &out->fingerprint);
}

nm_status nm_model_time_host_step(const nm_model *m, nm_pool *pool, int32_t chunk, int reps,
                                  double *ms, int32_t *loads, nm_error *err) {
    NM_ASSERT(m && pool && chunk >= 1 && reps >= 1 && ms && loads);
    const nm_hparams *hp = &m->hp;
    const int32_t n_moe = nm_model_n_moe_layers(hp);
    const nm_expert_weights **layers = nm_malloc((size_t)n_moe * sizeof *layers);
    if (!layers) return nm_errorf(err, NM_ERR_NOMEM, "out of memory measuring the host MoE step");
    for (int32_t l = 0; l < n_moe; l++)
        layers[l] = nm_model_moe_experts(m, l);
    nm_status st = nm_moe_time_host_layer(pool, layers, n_moe, hp->n_embd, hp->n_ff_exp, chunk,
                                          hp->n_expert_used, reps, ms, loads, err);
    nm_free(layers);
    return st;
}
