/* Writes the seed corpus of fuzz_plan into the folder given as argument:
 * a calibration, a profile and plans of the tiny model as npumoe writes
 * them (so the fuzzer starts past the fingerprint check and deep in every
 * reader), plus small hand-written files of other shapes. */
#include "base/base.h"
#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

#include <stdio.h>
#include <string.h>

static const char *dir;

static int write_text(const char *name, const char *text, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(text, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "corpus_plan: cannot write %s\n", path);
    return ok;
}

static int save(const char *name, nm_status st, char *text, size_t n, const nm_error *err) {
    int ok = st == NM_OK && write_text(name, text, n);
    if (st != NM_OK) fprintf(stderr, "corpus_plan: %s: %s\n", name, err->msg);
    nm_free(text);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: corpus_plan <folder>\n");
        return 2;
    }
    dir = argv[1];
    nm_model *m = NULL;
    nm_error err = {0};
    if (nm_model_load(NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf", NULL, &m, &err) != NM_OK) {
        fprintf(stderr, "corpus_plan: %s\n", err.msg);
        return 1;
    }
    int ok = 1;
    nm_calib *c = NULL;
    const int32_t T = 8;
    nm_moe_shape shape;
    nm_model_moe_shape(m, &shape);
    if (nm_calib_new(&shape, T, &c, &err) != NM_OK) return 1;
    for (int chunk = 0; chunk < 6; chunk++)
        for (int32_t l = 0; l < m->hp.n_layer; l++) {
            int32_t loads[8] = {0};
            const int n = chunk == 5 ? 3 : T; /* a short last chunk */
            for (int t = 0; t < n; t++) {
                loads[(t + l) % 4]++;
                loads[4 + (t * chunk + l) % 4]++;
            }
            const float weights[16] = {0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.3f, 0.2f,
                                       0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
            nm_calib_record(c, l, loads, 8, weights);
        }
    char *text = NULL;
    size_t n = 0;
    nm_status st = nm_calib_save_memory(c, &text, &n, &err);
    ok &= save("tiny.calib.json", st, text, n, &err);

    nm_profile_point pts[6] = {{1, 1, 0.02}, {1, 4, 0.03}, {1, 8, 0.05},
                               {2, 1, 0.03}, {2, 4, 0.05}, {2, 8, 0.09}};
    nm_profile prof = {.d_model = m->hp.n_embd,
                       .d_ff = m->hp.n_ff_exp,
                       .weight_type = NM_DTYPE_F32,
                       .dispatch_ms = 0.015,
                       .host_row_ms = 0.004,
                       .host_expert_ms = 0.002,
                       .chunk = 16,
                       .host_overhead_ms = 0.02,
                       .n_points = 6,
                       .points = pts};
    snprintf(prof.device, sizeof prof.device, "cpu");
    st = nm_profile_save_memory(&prof, &text, &n, &err);
    ok &= save("tiny.profile.json", st, text, n, &err);

    const nm_overflow overflow[2] = {NM_OVERFLOW_SPILL, NM_OVERFLOW_DROP};
    const uint64_t budget[2] = {UINT64_MAX, 20000};
    for (int i = 0; i < 2; i++) {
        nm_plan_params pp = nm_plan_default_params();
        pp.overflow = overflow[i];
        pp.device_memory_bytes = budget[i];
        nm_plan *p = NULL;
        st = nm_plan_make(&shape, c, &prof, &pp, &p, &err);
        text = NULL;
        if (st == NM_OK) st = nm_plan_save_memory(p, &text, &n, &err);
        ok &= save(i ? "tiny-drop.plan.json" : "tiny.plan.json", st, text, n, &err);
        nm_plan_free(p);
    }

    static const char small_calib[] =
        "{\"format\": \"npumoe-calib\", \"version\": 2, \"fingerprint\": \"0123456789abcdef\",\n"
        " \"chunk\": 4, \"k\": 1, \"n_layer\": 1, \"n_expert\": 2, \"n_chunks\": 2, \"n_tokens\": "
        "6,\n"
        " \"layers\": [{\"experts\": [\n"
        "  {\"mean\": 1.5, \"max\": 3, \"q50\": 0, \"q90\": 3, \"q95\": 3, \"q99\": 3,\n"
        "   \"hist\": [[0, 1], [3, 1]], \"ranked\": [1, 1, 1]},\n"
        "  {\"mean\": 1.5, \"max\": 2, \"q50\": 1, \"q90\": 2, \"q95\": 2, \"q99\": 2,\n"
        "   \"hist\": [[1, 1], [2, 1]], \"ranked\": [2, 1]}]}]}\n";
    static const char small_plan[] =
        "{\"format\": \"npumoe-plan\", \"version\": 2, \"fingerprint\": \"0123456789abcdef\",\n"
        " \"device\": \"cpu\", \"chunk\": 4, \"n_layer\": 1, \"n_expert\": 3, \"tiers\": [1, 4],\n"
        " \"overflow\": \"drop\", \"salience\": \"input-norm\", \"objective\": \"quantile\",\n"
        " \"granule\": 0, \"quantile\": 0.5, \"predicted_drop_rate\": 0.125,\n"
        " \"predicted_drop_weight\": 0.1, \"predicted_chunk_ms\": 0.5, \"device_bytes\": 0,\n"
        " \"layers\": [{\"budget_rows\": 9, \"groups\": [\n"
        "  {\"tier\": 4, \"experts\": [2, 0], \"device\": true},\n"
        "  {\"tier\": 1, \"experts\": [1], \"device\": false}],\n"
        "  \"cost\": {\"device_ms\": 0.5, \"host_ms\": 0.25, \"chunk_ms\": 0.5}}]}\n";
    ok &= write_text("small.calib.json", small_calib, sizeof small_calib - 1);
    ok &= write_text("small.plan.json", small_plan, sizeof small_plan - 1);
    nm_calib_free(c);
    nm_model_free(m);
    return ok ? 0 : 1;
}
