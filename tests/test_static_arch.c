/* The static-graph modes on every architecture (olmoe, llama/Mixtral, phimoe
 * in both semantics, qwen2moe with its shared expert, which stays dense work
 * beside the routed experts, deepseek2 with its shared experts, latent
 * attention and a leading dense layer, which has no plan entry and runs as
 * dense work in every mode, gpt-oss with expert biases, the clamped SwiGLU
 * and MXFP4 experts in the cpu device's graphs and its attention on the
 * host), with no architecture code in the executor: for each
 * tiny model, with capacities that hold every load, naive, tiers, grouped
 * and npumoe give dense's logits (prefill in padded chunks of 16, then
 * decode steps), capacity 1 with spill too, and the routed assignments
 * reported to calibration are n_tokens * k per layer; the model's MoE shape,
 * which plans record, has its shared experts. */
#include "harness.h"

#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { T = 16, MAX_IDS = 512 };

static int read_prompt(const char *dir, int line_no, int32_t *out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/prompts.txt", dir);
    return nm_test_read_ints(path, line_no, out, MAX_IDS);
}

static int64_t n_routed;
static void count_loads(void *ctx, int32_t layer, const int32_t *loads, int32_t n_expert,
                        const float *weights) {
    (void)weights;
    (void)ctx;
    (void)layer;
    for (int32_t e = 0; e < n_expert; e++)
        n_routed += loads[e];
}

/* n_shared, d_ff_shared: the shared experts the model's files were made
 * with (model.json), which its MoE shape, and so its plans, must record. */
static void check_model(const char *base, const char *name, nm_compat compat, nm_device *dev,
                        int32_t n_shared, int32_t d_ff_shared) {
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/%s", base, name);
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    nm_model_params mp = nm_model_default_params();
    mp.compat = compat;
    nm_model *m = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_model_load(path, &mp, &m, &err), NM_OK);
    if (!m) return;
    /* the plan's layers: those with experts (deepseek2's dense layer has none) */
    const int nv = m->hp.n_vocab, n_layer = nm_model_n_moe_layers(&m->hp),
              n_expert = m->hp.n_expert;
    CHECK(n_layer <= NM_TEST_MAX_LAYER && n_expert <= NM_TEST_MAX_EXPERT && n_expert % 2 == 0);
    nm_moe_shape sh;
    nm_model_moe_shape(m, &sh);
    CHECK_INT_EQ(sh.n_shared, n_shared);
    CHECK_INT_EQ(sh.d_ff_shared, d_ff_shared);
    int32_t ids[MAX_IDS];
    const int n = read_prompt(dir, 3, ids); /* 100 tokens: 6 chunks of 16 and a padded 4 */
    CHECK_INT_EQ(n, 100);
    const int n_decode = 5, rows = n + n_decode;
    float *dense = malloc((size_t)rows * nv * sizeof(float));
    float *got = malloc((size_t)rows * nv * sizeof(float));

    nm_session *s = nm_test_mode_session(m, T, NM_MODE_DENSE, NULL, NULL);
    if (s) nm_test_run_greedy(s, ids, n, n_decode, dense, nv, NULL, NULL);
    nm_session_free(s);

    static nm_test_plan full, spill;
    nm_test_parity_plan(&full, T, n_layer, n_expert, T, true, NM_OVERFLOW_DROP, NM_SALIENCE_ROUTER);
    nm_test_parity_plan(&spill, T, n_layer, n_expert, 1, true, NM_OVERFLOW_SPILL,
                        NM_SALIENCE_ROUTER);
    const nm_mode modes[5] = {NM_MODE_NAIVE, NM_MODE_TIERS, NM_MODE_GROUPED, NM_MODE_NPUMOE,
                              NM_MODE_GROUPED};
    for (int i = 0; i < 5; i++) {
        const bool spilling = i == 4;
        s = nm_test_mode_session(m, T, modes[i], spilling ? &spill.plan : &full.plan, dev);
        if (!s) continue;
        n_routed = 0;
        nm_session_set_load_fn(s, count_loads, NULL);
        nm_test_run_greedy(s, ids, n, n_decode, got, nv, NULL, NULL);
        const double e = nm_test_rows_rel_err(got, dense, (size_t)rows, nv);
        nm_session_metrics mt;
        nm_session_get_metrics(s, &mt);
        printf("%s%s: %-8s %s: max rel vs dense %.3g, %llu dropped, %llu spilled\n", name,
               compat == NM_COMPAT_LLAMA_CPP ? " (llama.cpp)" : "", nm_mode_name(modes[i]),
               spilling ? "capacity 1 spill" : "full capacity", e,
               (unsigned long long)mt.total.dropped, (unsigned long long)mt.total.spilled);
        CHECK(e < 1e-5);
        CHECK_INT_EQ(mt.total.dropped, 0);
        CHECK_INT_EQ(n_routed, (int64_t)n * m->hp.n_expert_used * n_layer);
        if (spilling) CHECK(mt.total.spilled > 0);
        nm_session_free(s);
    }
    free(dense);
    free(got);
    nm_model_free(m);
}

int main(void) {
    nm_device *dev = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "cpu", .n_threads = 1}, &dev, &err),
                 NM_OK);
    if (!dev) return nm_test_finish("test_static_arch");
    check_model(NM_VECTORS_DIR, "tiny-olmoe", NM_COMPAT_NONE, dev, 0, 0);
    check_model(NM_VECTORS_DIR, "tiny-mixtral", NM_COMPAT_LLAMA_CPP, dev, 0, 0);
    check_model(NM_VECTORS_DIR, "tiny-phimoe", NM_COMPAT_LLAMA_CPP, dev, 0, 0);
    check_model(NM_VECTORS_DIR, "tiny-phimoe", NM_COMPAT_NONE, dev, 0, 0);
    check_model(NM_SOURCE_DIR "/tests/vectors", "tiny-qwen2moe", NM_COMPAT_NONE, dev, 1, 32);
    check_model(NM_SOURCE_DIR "/tests/vectors", "tiny-deepseek2", NM_COMPAT_NONE, dev, 2, 16);
    check_model(NM_SOURCE_DIR "/tests/vectors", "tiny-deepseek2-qlora", NM_COMPAT_NONE, dev, 1, 16);
    check_model(NM_SOURCE_DIR "/tests/vectors", "tiny-gptoss", NM_COMPAT_NONE, dev, 0, 0);
    check_model(NM_SOURCE_DIR "/tests/vectors", "tiny-gptoss-mxfp4", NM_COMPAT_NONE, dev, 0, 0);
    nm_device_close(dev);
    return nm_test_finish("test_static_arch");
}
