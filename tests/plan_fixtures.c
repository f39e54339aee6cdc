/* The plan tests' shared fixtures (plan_fixtures.h). */
#include "plan_fixtures.h"

#include "engine/engine.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const nm_moe_shape *shape(const nm_model *m) {
    static nm_moe_shape slots[4];
    static int next;
    if (!m) return NULL;
    nm_moe_shape *s = &slots[next++ % 4];
    nm_model_moe_shape(m, s);
    return s;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

bool contains(const char *s, const char *part) { return strstr(s, part) != NULL; }

nm_model *load_model(const char *path) {
    nm_model *m = NULL;
    nm_error err = {0};
    nm_model_params mp = nm_model_default_params();
    nm_status st = nm_model_load(path, &mp, &m, &err);
    if (st != NM_OK) fprintf(stderr, "%s: %s\n", path, err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return m;
}

bool write_variant(const char *path, bool to_f16, bool swap_router) {
    nm_gguf *g = NULL;
    nm_error err = {0};
    if (nm_gguf_open(TINY, &g, &err) != NM_OK) return false;
    nm_gguf_writer *w = nm_gguf_writer_new();
    bool ok = w != NULL;
    for (uint64_t i = 0; ok && i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        ok = nm_gguf_writer_set_value(w, key, &kv->value) == NM_OK;
    }
    for (uint64_t i = 0; ok && i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const bool target = !swap_router && strcmp(name, "blk.0.ffn_up_exps.weight") == 0;
        if (swap_router && strcmp(name, "blk.0.ffn_gate_inp.weight") == 0) {
            CHECK_INT_EQ(t->type, NM_DTYPE_F32);
            const size_t row = (size_t)t->ne[0] * sizeof(float);
            unsigned char *r = malloc((size_t)t->n_bytes);
            memcpy(r, t->data, (size_t)t->n_bytes);
            memcpy(r, (const unsigned char *)t->data + row, row);
            memcpy(r + row, t->data, row);
            ok = nm_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, r, t->n_bytes) ==
                 NM_OK;
            free(r);
            continue;
        }
        if (!target) {
            ok = nm_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data,
                                           t->n_bytes) == NM_OK;
            continue;
        }
        CHECK_INT_EQ(t->type, NM_DTYPE_F32);
        const size_t n = (size_t)(t->n_bytes / 4);
        float *f = malloc(n * sizeof(float));
        uint16_t *h = malloc(n * sizeof(uint16_t));
        memcpy(f, t->data, n * sizeof(float));
        if (to_f16) {
            for (size_t j = 0; j < n; j++)
                h[j] = nm_f32_to_f16(f[j]);
            ok = nm_gguf_writer_add_tensor(w, name, NM_DTYPE_F16, t->n_dims, t->ne, h,
                                           n * sizeof(uint16_t)) == NM_OK;
        } else {
            f[0] = f[0] * 2 + 1;
            ok = nm_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, f, t->n_bytes) ==
                 NM_OK;
        }
        free(f);
        free(h);
    }
    if (ok) ok = nm_gguf_writer_write_file(w, path, &err) == NM_OK;
    nm_gguf_writer_free(w);
    nm_gguf_close(g);
    return ok;
}

void make_loads(raw_loads *raw) {
    memset(raw, 0, sizeof *raw);
    for (int c = 0; c < N_CHUNKS; c++) {
        const int n = c % 7 == 6 ? 1 + (int)(rng() % T) : T;
        raw->n_tokens += n;
        for (int l = 0; l < N_LAYER; l++)
            for (int t = 0; t < n; t++) {
                int chosen[K];
                for (int s = 0; s < K; s++) {
                    int e;
                    bool dup;
                    do {
                        const uint32_t r = rng() % 1000;
                        double w = 0, total = 0;
                        for (int x = 0; x < N_EXPERT; x++)
                            total += pow(2, -x / 2.0);
                        e = N_EXPERT - 1;
                        for (int x = 0; x < N_EXPERT; x++) {
                            w += pow(2, -x / 2.0) / total;
                            if (r < w * 1000) {
                                e = x;
                                break;
                            }
                        }
                        e = (e + 3 * l) % N_EXPERT;
                        dup = false;
                        for (int p = 0; p < s; p++)
                            dup |= chosen[p] == e;
                    } while (dup);
                    chosen[s] = e;
                    raw->w[c][l][e][raw->loads[c][l][e]++] = (float)(1 + rng() % 1000) / 1000.0f;
                }
            }
    }
}

nm_calib *calib_from(const nm_model *m, const raw_loads *raw) {
    nm_calib *c = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_calib_new(shape(m), T, &c, &err), NM_OK);
    if (!c) return NULL;
    for (int i = 0; i < N_CHUNKS; i++)
        for (int l = 0; l < N_LAYER; l++) {
            float w[N_EXPERT * T];
            int n = 0;
            for (int e = 0; e < N_EXPERT; e++)
                for (int r = 0; r < raw->loads[i][l][e]; r++)
                    w[n++] = raw->w[i][l][e][r];
            nm_calib_record(c, l, raw->loads[i][l], N_EXPERT, w);
        }
    return c;
}

nm_profile_point grid_points[20];

nm_profile make_profile(double dispatch, double per_row) {
    nm_profile p = {.d_model = 64,
                    .d_ff = 32,
                    .weight_type = NM_DTYPE_F32,
                    .dispatch_ms = dispatch,
                    .host_row_ms = 0.01,
                    .host_expert_ms = 0.05,
                    .chunk = 16,
                    .host_overhead_ms = 0,
                    .n_points = 20,
                    .points = grid_points};
    snprintf(p.device, sizeof p.device, "synthetic");
    const int32_t counts[4] = {1, 2, 4, 8}, caps[5] = {1, 2, 4, 8, 16};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            grid_points[i * 5 + j] =
                (nm_profile_point){counts[i], caps[j], dispatch + per_row * counts[i] * caps[j]};
    return p;
}

/* What every plan must satisfy, whatever the inputs. */
static void check_invariants(const nm_plan *p, const nm_calib *c, const nm_plan_params *pp) {
    nm_error err = {0};
    CHECK_INT_EQ(nm_moe_plan_check(&p->moe, c->n_layer, c->n_expert, &err), NM_OK);
    double sum = 0, over = 0;
    int32_t max_group = pp && pp->max_group_experts ? pp->max_group_experts : 8;
    const double q = pp ? pp->quantile : 0.95;
    CHECK_INT_EQ(p->objective, pp ? pp->objective : NM_PLAN_BUDGET);
    for (int l = 0; l < p->moe.n_layer; l++) {
        const nm_plan_cost *cost = &p->layer_cost[l];
        CHECK_NEAR(cost->chunk_ms, fmax(cost->device_ms, cost->host_ms), 1e-12);
        sum += cost->chunk_ms;
        int64_t rows = 0;
        for (int g = 0; g < p->moe.layers[l].n_groups; g++) {
            const nm_moe_group *grp = &p->moe.layers[l].groups[g];
            CHECK(grp->n_experts <= max_group);
            rows += (int64_t)grp->n_experts * grp->capacity;
            for (int i = 0; i < grp->n_experts; i++) {
                double pred[T + 1];
                nm_calib_predict_overflow(c, l, grp->experts[i], false, pred);
                over += pred[grp->capacity];
                if (p->objective == NM_PLAN_BUDGET) {
                    CHECK_INT_EQ(grp->capacity % p->granule, 0);
                    continue;
                }
                /* the smallest tier covering the quantile, else the largest */
                const int32_t need = nm_calib_quantile(c, l, grp->experts[i], q);
                int32_t want = p->tiers[p->n_tiers - 1];
                for (int t = p->n_tiers - 1; t >= 0; t--)
                    if (p->tiers[t] >= need) want = p->tiers[t];
                CHECK_INT_EQ(grp->capacity, want);
            }
        }
        /* within the budget; a quantile plan's budget is what it reserves */
        CHECK(rows <= p->budget_rows[l]);
        if (p->objective == NM_PLAN_QUANTILE) CHECK_INT_EQ(rows, p->budget_rows[l]);
    }
    CHECK_NEAR(p->predicted_chunk_ms, sum, 1e-9);
    /* the expected share of assignments over capacity on the calibration */
    const double per_chunk = (double)c->n_tokens * c->k / (double)c->n_chunks * c->n_layer;
    CHECK_NEAR(p->predicted_drop_rate, over / per_chunk, 1e-12);
}

nm_plan_params qparams(void) {
    nm_plan_params pp = nm_plan_default_params();
    pp.objective = NM_PLAN_QUANTILE;
    return pp;
}

nm_plan *make_plan(const nm_model *m, const nm_calib *c, const nm_profile *prof,
                   const nm_plan_params *pp) {
    nm_plan *p = NULL;
    nm_error err = {0};
    nm_status st = nm_plan_make(shape(m), c, prof, pp, &p, &err);
    if (st != NM_OK) fprintf(stderr, "nm_plan_make: %s\n", err.msg);
    CHECK_INT_EQ(st, NM_OK);
    if (p) check_invariants(p, c, pp);
    return p;
}
