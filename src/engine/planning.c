/* What joins a model to the planner: the timing of the host's MoE step
 * that a device profile carries (it needs every layer of the model and the
 * MoE executor, which model/ does not include). */
#include "engine.h"

#include "base/base.h"
#include "model/model.h"

nm_status nm_model_time_host_step(const nm_model *m, nm_pool *pool, int32_t chunk, int reps,
                                  double *ms, int32_t *loads, nm_error *err) {
    NM_ASSERT(m && pool && chunk >= 1 && reps >= 1 && ms && loads);
    const nm_hparams *hp = &m->hp;
    const nm_expert_weights **layers = nm_malloc((size_t)hp->n_layer * sizeof *layers);
    if (!layers) return nm_errorf(err, NM_ERR_NOMEM, "out of memory measuring the host MoE step");
    for (int32_t l = 0; l < hp->n_layer; l++)
        layers[l] = &m->layers[l].experts;
    nm_status st = nm_moe_time_host_layer(pool, layers, hp->n_layer, hp->n_embd, hp->n_ff_exp,
                                          chunk, hp->n_expert_used, reps, ms, loads, err);
    nm_free(layers);
    return st;
}
