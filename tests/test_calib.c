/* The plan part's inputs: the model fingerprint (stable, sensitive to
 * weight values, sensitive to types and shapes); calibration statistics
 * against a brute-force sort of the raw loads, and the overflow prediction
 * against its definition; calibration and profile files through save and
 * load. */
#include "plan_fixtures.h"

#include "engine/engine.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TMP(name) NM_BUILD_DIR "/test_calib_" name

/* ---- fingerprint ---- */

static void test_fingerprint(const nm_model *tiny) {
    nm_fingerprint a, b;
    nm_model_fingerprint(tiny, &a);
    CHECK_INT_EQ(strlen(a.hex), 16);
    CHECK_INT_EQ(strspn(a.hex, "0123456789abcdef"), 16);
    nm_model *again = load_model(TINY);
    if (!again) return;
    nm_model_fingerprint(again, &b);
    CHECK(strcmp(a.hex, b.hex) == 0);
    nm_model_free(again);

    /* weights' values are part of it: one value of an expert matrix, or
     * the router's rows in another order (same shapes, types and names) */
    CHECK(write_variant(TMP("data.gguf"), false, false));
    nm_model *data = load_model(TMP("data.gguf"));
    if (data) {
        CHECK(data->layers[0].experts.up.type == NM_DTYPE_F32);
        nm_model_fingerprint(data, &b);
        CHECK(strcmp(a.hex, b.hex) != 0);
        nm_model_free(data);
    }
    CHECK(write_variant(TMP("router.gguf"), false, true));
    nm_model *permuted = load_model(TMP("router.gguf"));
    if (permuted) {
        nm_model_fingerprint(permuted, &b);
        CHECK(strcmp(a.hex, b.hex) != 0);
        nm_model_free(permuted);
    }
    CHECK(write_variant(TMP("f16.gguf"), true, false));
    nm_model *f16 = load_model(TMP("f16.gguf"));
    if (f16) {
        CHECK(f16->layers[0].experts.up.type == NM_DTYPE_F16);
        nm_model_fingerprint(f16, &b);
        CHECK(strcmp(a.hex, b.hex) != 0);
        nm_model_free(f16);
    }
    /* other models of the same architecture */
    const char *others[] = {NM_BUILD_DIR "/models/default.gguf",
                            NM_BUILD_DIR "/models/fixture-f16-e32.gguf"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        FILE *f = fopen(others[i], "rb");
        if (!f) continue; /* built by the default target; absent in a partial build */
        fclose(f);
        nm_model *m = load_model(others[i]);
        if (!m) continue;
        nm_model_fingerprint(m, &b);
        CHECK(strcmp(a.hex, b.hex) != 0);
        nm_model_free(m);
    }
}

/* ---- calibration statistics ---- */

static int cmp_int(const void *a, const void *b) {
    return (*(const int32_t *)a > *(const int32_t *)b) -
           (*(const int32_t *)a < *(const int32_t *)b);
}

/* The smallest v with #(loads <= v) >= q * n, from a sorted copy. */
static int32_t brute_quantile(const int32_t *sorted, int n, double q) {
    if (q * n <= 0) return 0;
    for (int i = 0; i < n; i++)
        if ((double)(i + 1) >= q * (double)n) return sorted[i];
    return sorted[n - 1];
}

/* nm_calib_predict_overflow against its definition, term by term: each
 * chunk's load x stands for a Poisson(x) load y capped at T (pmf from
 * lgamma); the weight of rank r is the running minimum of the mean r-th
 * heaviest weight over the chunks with load >= r, held past the largest. */
static void check_prediction(const nm_calib *c, const raw_loads *raw, int l, int e) {
    double w_rank[T + 1] = {0}, w = INFINITY;
    for (int r = 1; r <= T; r++) {
        double sum = 0;
        int reach = 0;
        for (int i = 0; i < N_CHUNKS; i++) {
            const int32_t x = raw->loads[i][l][e];
            if (x < r) continue;
            float v[T];
            memcpy(v, raw->w[i][l][e], (size_t)x * sizeof(float));
            for (int a = 1; a < x; a++)
                for (int b = a; b > 0 && v[b] > v[b - 1]; b--) {
                    const float t = v[b];
                    v[b] = v[b - 1];
                    v[b - 1] = t;
                }
            sum += v[r - 1];
            reach++;
        }
        if (reach) w = fmin(w, sum / reach);
        w_rank[r] = isfinite(w) ? w : 0;
    }
    double by_count[T + 1], by_weight[T + 1];
    nm_calib_predict_overflow(c, l, e, false, by_count);
    nm_calib_predict_overflow(c, l, e, true, by_weight);
    for (int32_t cap = 0; cap <= T; cap++) {
        double want = 0, want_w = 0;
        for (int i = 0; i < N_CHUNKS; i++) {
            const double x = raw->loads[i][l][e];
            double tail = 1; /* P(y >= T) */
            for (int y = 0; y < T; y++) {
                const double p = x == 0 ? (y == 0) : exp(y * log(x) - x - lgamma(y + 1.0));
                tail -= p;
                for (int r = cap + 1; r <= y; r++) {
                    want += p;
                    want_w += p * w_rank[r];
                }
            }
            for (int r = cap + 1; r <= T; r++) {
                want += fmax(tail, 0);
                want_w += fmax(tail, 0) * w_rank[r];
            }
        }
        CHECK_NEAR(by_count[cap], want / N_CHUNKS, 1e-9);
        CHECK_NEAR(by_weight[cap], want_w / N_CHUNKS, 1e-9);
        /* convex and non-increasing */
        if (cap >= 1) CHECK(by_weight[cap] <= by_weight[cap - 1] + 1e-15);
        if (cap >= 2)
            CHECK(by_weight[cap - 1] - by_weight[cap] <=
                  by_weight[cap - 2] - by_weight[cap - 1] + 1e-12);
        if (cap >= 2)
            CHECK(by_count[cap - 1] - by_count[cap] <=
                  by_count[cap - 2] - by_count[cap - 1] + 1e-12);
    }
}

/* Long chunks: loads of 1,500 (exp(-1500) underflows a double) predict
 * about their own mean, and the prediction beyond the largest loads fades. */
static void test_predict_large(const nm_model *m) {
    enum { BIG = 2048 };
    nm_calib *c = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_calib_new(shape(m), BIG, &c, &err), NM_OK);
    if (!c) return;
    const int32_t loads[N_EXPERT] = {1500, 1500, 1000, 96, 0, 0, 0, 0};
    static float w[BIG * K];
    for (int i = 0; i < BIG * K; i++)
        w[i] = 0.5f;
    for (int l = 0; l < N_LAYER; l++)
        nm_calib_record(c, l, loads, N_EXPERT, w);
    static double pred[BIG + 1];
    nm_calib_predict_overflow(c, 1, 0, false, pred);
    CHECK_NEAR(pred[0], 1500, 1e-6);                /* E[min(Poisson(1500), 2048)] */
    CHECK(pred[1500] > 10 && pred[1500] < 20);      /* E[(Y - 1500)+] = sqrt(1500 / 2 pi) ~ 15.5 */
    CHECK(pred[1800] >= 0 && pred[1800] < 1e-9);    /* 7.7 standard deviations out */
    nm_calib_predict_overflow(c, 1, 0, true, pred); /* every weight 0.5 */
    CHECK_NEAR(pred[0], 750, 1e-6);
    nm_calib_predict_overflow(c, 1, 4, false, pred); /* never used */
    CHECK_NEAR(pred[0], 0, 0);
    nm_calib_free(c);
}

static void test_calib_stats(const nm_model *m, const raw_loads *raw, const nm_calib *c) {
    CHECK_INT_EQ(c->n_chunks, N_CHUNKS);
    CHECK_INT_EQ(c->n_tokens, raw->n_tokens);
    CHECK_INT_EQ(c->chunk, T);
    CHECK_INT_EQ(c->k, K);
    const double qs[] = {0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0, 1.0 / 3, 0.123456};
    for (int l = 0; l < N_LAYER; l++)
        for (int e = 0; e < N_EXPERT; e++) {
            int32_t v[N_CHUNKS];
            double sum = 0;
            int active = 0;
            for (int i = 0; i < N_CHUNKS; i++) {
                v[i] = raw->loads[i][l][e];
                sum += v[i];
                active += v[i] > 0;
            }
            qsort(v, N_CHUNKS, sizeof v[0], cmp_int);
            CHECK_NEAR(nm_calib_mean(c, l, e), sum / N_CHUNKS, 1e-12);
            CHECK_INT_EQ(nm_calib_max(c, l, e), v[N_CHUNKS - 1]);
            CHECK_NEAR(nm_calib_p_active(c, l, e), (double)active / N_CHUNKS, 1e-12);
            for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++)
                CHECK_INT_EQ(nm_calib_quantile(c, l, e, qs[i]), brute_quantile(v, N_CHUNKS, qs[i]));
            /* the textbook index form for q = 0.5 and 0.9: ceil(q n) - 1 */
            CHECK_INT_EQ(nm_calib_quantile(c, l, e, 0.5), v[(int)ceil(0.5 * N_CHUNKS) - 1]);
            CHECK_INT_EQ(nm_calib_quantile(c, l, e, 0.9), v[(int)ceil(0.9 * N_CHUNKS) - 1]);
            /* overflow at every capacity: per chunk, the load beyond it and
             * the weights of the lightest assignments beyond it */
            for (int32_t cap = 0; cap <= T + 1; cap++) {
                double over = 0, over_w = 0;
                for (int i = 0; i < N_CHUNKS; i++) {
                    const int32_t x = raw->loads[i][l][e];
                    float w[T];
                    memcpy(w, raw->w[i][l][e], (size_t)x * sizeof(float));
                    for (int a = 1; a < x; a++) /* insertion sort, heaviest first */
                        for (int b = a; b > 0 && w[b] > w[b - 1]; b--) {
                            const float t = w[b];
                            w[b] = w[b - 1];
                            w[b - 1] = t;
                        }
                    for (int r = cap; r < x; r++) {
                        over += 1;
                        over_w += w[r];
                    }
                }
                CHECK_NEAR(nm_calib_overflow(c, l, e, cap), over / N_CHUNKS, 1e-12);
                CHECK_NEAR(nm_calib_overflow_weight(c, l, e, cap), over_w / N_CHUNKS, 1e-9);
            }
            check_prediction(c, raw, l, e);
        }
    /* an empty calibration answers 0 */
    nm_calib *empty = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_calib_new(shape(m), 4, &empty, &err), NM_OK);
    if (empty) {
        CHECK_INT_EQ(nm_calib_quantile(empty, 2, 7, 0.5), 0);
        CHECK_INT_EQ(nm_calib_max(empty, 2, 7), 0);
        CHECK_NEAR(nm_calib_mean(empty, 2, 7), 0, 0);
    }
    nm_calib_free(empty);
    CHECK_INT_EQ(nm_calib_new(shape(m), 0, &empty, &err), NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_calib_new(shape(m), NM_PLAN_MAX_CHUNK + 1, &empty, &err), NM_ERR_INVALID_ARG);
    CHECK(empty == NULL);
}

static void test_calib_files(const nm_model *m, const nm_calib *c) {
    nm_error err = {0};
    CHECK_INT_EQ(nm_calib_save(c, TMP("a.calib.json"), &err), NM_OK);
    nm_calib *r = NULL;
    CHECK_INT_EQ(nm_calib_load(TMP("a.calib.json"), &r, &err), NM_OK);
    if (r) {
        CHECK(strcmp(r->fingerprint.hex, c->fingerprint.hex) == 0);
        CHECK_INT_EQ(r->chunk, c->chunk);
        CHECK_INT_EQ(r->k, c->k);
        CHECK_INT_EQ(r->n_layer, c->n_layer);
        CHECK_INT_EQ(r->n_expert, c->n_expert);
        CHECK_INT_EQ(r->n_chunks, c->n_chunks);
        CHECK_INT_EQ(r->n_tokens, c->n_tokens);
        const size_t cells = (size_t)N_LAYER * N_EXPERT * (T + 1);
        CHECK(memcmp(r->hist, c->hist, cells * sizeof(int64_t)) == 0);
        /* the ranked weight sums come back exactly (zero past each max) */
        CHECK(memcmp(r->ranked, c->ranked, (size_t)N_LAYER * N_EXPERT * T * sizeof(double)) == 0);
        CHECK_INT_EQ(nm_calib_check_shape(r, shape(m), &err), NM_OK);
    }
    nm_calib_free(r);

    /* an empty calibration saves and loads */
    nm_calib *empty = NULL;
    CHECK_INT_EQ(nm_calib_new(shape(m), 8, &empty, &err), NM_OK);
    CHECK_INT_EQ(nm_calib_save(empty, TMP("empty.calib.json"), &err), NM_OK);
    CHECK_INT_EQ(nm_calib_load(TMP("empty.calib.json"), &r, &err), NM_OK);
    if (r) CHECK_INT_EQ(r->n_chunks, 0);
    nm_calib_free(r);

    /* a recording stopped inside a forward pass is not saved */
    const int32_t loads[N_EXPERT] = {2, 0, 0, 0, 0, 0, 0, 0};
    const float w[2] = {0.5f, 0.5f};
    nm_calib_record(empty, 0, loads, N_EXPERT, w);
    nm_calib_record(empty, 1, loads, N_EXPERT, w);
    CHECK_INT_EQ(nm_calib_save(empty, TMP("partial.calib.json"), &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "layer 2 expert 0 recorded 0 chunks");
    nm_calib_free(empty);

    CHECK_INT_EQ(nm_calib_load(TMP("no-such.calib.json"), &r, &err), NM_ERR_IO);
    CHECK_MSG(err, "no-such.calib.json");
}

/* ---- profiles ---- */

/* The overhead is the step's time beyond the per-expert fit, never < 0. */
static void test_profile_overhead(void) {
    nm_profile p = make_profile(0.01, 0.001); /* host: 0.05 per expert + 0.01 per row */
    const int32_t loads[4] = {3, 0, 5, 1};    /* fit: 3 x 0.05 + 9 x 0.01 = 0.24 */
    nm_profile_set_overhead(&p, 32, 0.5, loads, 4);
    CHECK_INT_EQ(p.chunk, 32);
    CHECK_NEAR(p.host_overhead_ms, 0.26, 1e-12);
    nm_profile_set_overhead(&p, 16, 0.2, loads, 4);
    CHECK_INT_EQ(p.chunk, 16);
    CHECK_NEAR(p.host_overhead_ms, 0, 0);
}

static void test_profile_files(void) {
    nm_profile p = make_profile(0.0123456789, 0.000987654321);
    p.chunk = 48;
    p.host_overhead_ms = 0.125;
    grid_points[7].graph_ms = 1.0 / 3; /* any double must come back exactly */
    nm_error err = {0};
    CHECK_INT_EQ(nm_profile_check(&p, &err), NM_OK);
    CHECK_INT_EQ(nm_profile_save(&p, TMP("a.profile.json"), &err), NM_OK);
    nm_profile r;
    CHECK_INT_EQ(nm_profile_load(TMP("a.profile.json"), &r, &err), NM_OK);
    CHECK(strcmp(r.device, "synthetic") == 0);
    CHECK_INT_EQ(r.d_model, 64);
    CHECK_INT_EQ(r.d_ff, 32);
    CHECK_INT_EQ(r.weight_type, NM_DTYPE_F32);
    CHECK(r.dispatch_ms == p.dispatch_ms && r.host_row_ms == p.host_row_ms &&
          r.host_expert_ms == p.host_expert_ms && r.chunk == p.chunk &&
          r.host_overhead_ms == p.host_overhead_ms);
    CHECK_INT_EQ(r.n_points, p.n_points);
    for (int i = 0; i < r.n_points && i < p.n_points; i++) {
        CHECK_INT_EQ(r.points[i].n_experts, p.points[i].n_experts);
        CHECK_INT_EQ(r.points[i].capacity, p.points[i].capacity);
        CHECK(r.points[i].graph_ms == p.points[i].graph_ms);
    }
    CHECK_INT_EQ(r.granule, 0); /* not recorded: not written, 0 when read */
    nm_profile_free(&r);
    /* the device's row granule comes back; a file without one reads as 0 */
    p.granule = 16;
    CHECK_INT_EQ(nm_profile_save(&p, TMP("g.profile.json"), &err), NM_OK);
    CHECK_INT_EQ(nm_profile_load(TMP("g.profile.json"), &r, &err), NM_OK);
    CHECK_INT_EQ(r.granule, 16);
    nm_profile_free(&r);
    p.granule = -1;
    CHECK_INT_EQ(nm_profile_save(&p, TMP("bad.profile.json"), &err), NM_ERR_FORMAT);
    CHECK_MSG(err, "granule -1 is not in [1,");
    p.granule = 0;
    /* an invalid profile is not saved */
    grid_points[3] = grid_points[2];
    CHECK_INT_EQ(nm_profile_save(&p, TMP("bad.profile.json"), &err), NM_ERR_FORMAT);
    CHECK_MSG(err, "measured twice");
}

int main(void) {
    nm_model *tiny = load_model(TINY);
    if (!tiny) return nm_test_finish("test_calib");
    test_fingerprint(tiny);
    static raw_loads raw;
    make_loads(&raw);
    nm_calib *c = calib_from(tiny, &raw);
    if (c) {
        test_calib_stats(tiny, &raw, c);
        test_calib_files(tiny, c);
    }
    nm_calib_free(c);
    test_predict_large(tiny);
    test_profile_overhead();
    test_profile_files();
    nm_model_free(tiny);
    return nm_test_finish("test_calib");
}
