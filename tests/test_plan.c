/* The plan part: the model fingerprint (stable, sensitive to weight values,
 * sensitive to types and shapes); calibration statistics against a
 * brute-force sort of the raw loads; calibration, profile and plan files
 * through save and load; the planner on synthetic calibrations and profiles
 * whose answers are worked out by hand in the comments; malformed files,
 * each refused with a message naming what is wrong; allocation failures at
 * every step without leaks (LeakSanitizer in the sanitizer build); and the
 * whole path on the tiny model: calibrate a session, profile the cpu
 * device, plan, run the plan and compare with the dense logits. */
#include "harness.h"

#include "base/base.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The planner's view of m (nm_model_moe_shape), or none for NULL; each
 * call fills the next of a few slots, so a pointer stays valid for the
 * statement that asked. */
static const nm_moe_shape *shape(const nm_model *m) {
    static nm_moe_shape slots[4];
    static int next;
    if (!m) return NULL;
    nm_moe_shape *s = &slots[next++ % 4];
    nm_model_moe_shape(m, s);
    return s;
}

#define TINY NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf"
#define TMP(name) NM_BUILD_DIR "/test_plan_" name

enum { T = 16, N_LAYER = 3, N_EXPERT = 8, K = 2 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static bool contains(const char *s, const char *part) { return strstr(s, part) != NULL; }

#define CHECK_MSG(err, part)                                                                       \
    do {                                                                                           \
        nm_test_checks++;                                                                          \
        if (!contains((err).msg, part)) {                                                          \
            nm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (err).msg, \
                    part);                                                                         \
        }                                                                                          \
    } while (0)

static nm_model *load_model(const char *path) {
    nm_model *m = NULL;
    nm_error err = {0};
    nm_model_params mp = nm_model_default_params();
    nm_status st = nm_model_load(path, &mp, &m, &err);
    if (st != NM_OK) fprintf(stderr, "%s: %s\n", path, err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return m;
}

/* ---- fingerprint ---- */

/* A copy of the tiny model's file with one change: the first weight of
 * blk.0.ffn_up_exps scaled (data only), or that tensor stored as F16 (a
 * type, as re-quantising changes), or (swap_router) the first two rows of
 * blk.0's router exchanged (the same weights routing to other experts). */
static bool write_variant(const char *path, bool to_f16, bool swap_router) {
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

enum { N_CHUNKS = 57 };

/* Raw per-chunk loads, kept for the brute-force statistics. */
typedef struct raw_loads {
    int32_t loads[N_CHUNKS][N_LAYER][N_EXPERT];
    float w[N_CHUNKS][N_LAYER][N_EXPERT][T]; /* each assignment's weight, in token order */
    int64_t n_tokens;
} raw_loads;

/* Skewed routing: token t of a chunk picks K distinct experts, expert e
 * with weight 2^-(e/2) rotated by layer; chunks hold 1..T tokens, mostly T. */
static void make_loads(raw_loads *raw) {
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

static nm_calib *calib_from(const nm_model *m, const raw_loads *raw) {
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

/* graph_ms = dispatch + per_row * n * c over counts {1, 2, 4, 8} x
 * capacities {1, 2, 4, 8, 16}. */
static nm_profile_point grid_points[20];

static nm_profile make_profile(double dispatch, double per_row) {
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

/* ---- the planner on known answers ---- */

/* Every chunk of layer l: expert (i + 3l) % 8 receives base[i] of the
 * T * K = 32 assignments. */
static const int32_t base_loads[N_EXPERT] = {12, 8, 6, 4, 2, 0, 0, 0};

static nm_calib *constant_calib(const nm_model *m) {
    nm_calib *c = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_calib_new(shape(m), T, &c, &err), NM_OK);
    if (!c) return NULL;
    for (int chunk = 0; chunk < 10; chunk++)
        for (int l = 0; l < N_LAYER; l++) {
            int32_t loads[N_EXPERT];
            float w[T * K];
            for (int i = 0; i < N_EXPERT; i++)
                loads[(i + 3 * l) % N_EXPERT] = base_loads[i];
            for (int a = 0, e = 0; e < N_EXPERT; e++) /* 1, 1/2, 1/3, ... within each expert */
                for (int r = 0; r < loads[e]; r++)
                    w[a++] = 1.0f / (float)(r + 1);
            nm_calib_record(c, l, loads, N_EXPERT, w);
        }
    return c;
}

/* The group of expert id (by base rank i) in layer l, or NULL. */
static const nm_moe_group *group_of(const nm_plan *p, int l, int rank) {
    const int32_t e = (rank + 3 * l) % N_EXPERT;
    const nm_moe_layer_plan *lp = &p->moe.layers[l];
    for (int g = 0; g < lp->n_groups; g++)
        for (int i = 0; i < lp->groups[g].n_experts; i++)
            if (lp->groups[g].experts[i] == e) return &lp->groups[g];
    return NULL;
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

/* The defaults with the quantile objective. */
static nm_plan_params qparams(void) {
    nm_plan_params pp = nm_plan_default_params();
    pp.objective = NM_PLAN_QUANTILE;
    return pp;
}

static nm_plan *make_plan(const nm_model *m, const nm_calib *c, const nm_profile *prof,
                          const nm_plan_params *pp) {
    nm_plan *p = NULL;
    nm_error err = {0};
    nm_status st = nm_plan_make(shape(m), c, prof, pp, &p, &err);
    if (st != NM_OK) fprintf(stderr, "nm_plan_make: %s\n", err.msg);
    CHECK_INT_EQ(st, NM_OK);
    if (p) check_invariants(p, c, pp);
    return p;
}

static int count_device_groups(const nm_plan *p) {
    int n = 0;
    for (int l = 0; l < p->moe.n_layer; l++)
        for (int g = 0; g < p->moe.layers[l].n_groups; g++)
            n += p->moe.layers[l].groups[g].on_device;
    return n;
}

static void test_planner_known(const nm_model *m) {
    nm_calib *c = constant_calib(m);
    if (!c) return;
    const nm_plan_params qp = qparams();
    /* Host cost of an expert with load x in every chunk: 0.05 + 0.01 x when
     * x > 0, else 0; per layer 5 * 0.05 + 0.01 * 32 = 0.57. Default tiers
     * for T = 16: 1 2 4 8 16; needs 12 8 6 4 2 0 0 0 -> tiers 16 8 8 4 2 1 1 1. */
    const double all_host_ms = 0.57;

    /* A: dispatch of a second: everything on the host. */
    nm_profile prof = make_profile(1000, 0.001);
    nm_plan *p = make_plan(m, c, &prof, &qp);
    if (p) {
        CHECK_INT_EQ(p->n_tiers, 5);
        CHECK_INT_EQ(p->tiers[0], 1);
        CHECK_INT_EQ(p->tiers[4], 16);
        CHECK_INT_EQ(count_device_groups(p), 0);
        CHECK_INT_EQ(p->device_bytes, 0);
        for (int l = 0; l < N_LAYER; l++) {
            CHECK_NEAR(p->layer_cost[l].device_ms, 0, 0);
            CHECK_NEAR(p->layer_cost[l].host_ms, all_host_ms, 1e-12);
        }
        CHECK_NEAR(p->predicted_chunk_ms, 3 * all_host_ms, 1e-12);
        nm_plan_free(p);
        /* the host's per-chunk overhead, measured over chunks of 64 tokens,
         * scales to the plan's 16: a quarter of it is added to every layer */
        prof.chunk = 64;
        prof.host_overhead_ms = 0.2;
        p = make_plan(m, c, &prof, &qp);
        for (int l = 0; p && l < N_LAYER; l++)
            CHECK_NEAR(p->layer_cost[l].host_ms, all_host_ms + 0.05, 1e-12);
        if (p) CHECK_NEAR(p->predicted_chunk_ms, 3 * (all_host_ms + 0.05), 1e-12);
        prof.host_overhead_ms = 0;
    }
    if (p) {
        const int32_t tier_of_rank[N_EXPERT] = {16, 8, 8, 4, 2, 1, 1, 1};
        for (int l = 0; l < N_LAYER; l++)
            for (int r = 0; r < N_EXPERT; r++) {
                const nm_moe_group *g = group_of(p, l, r);
                CHECK(g && g->capacity == tier_of_rank[r]);
            }
        CHECK(strcmp(p->device, "synthetic") == 0);
    }
    nm_plan_free(p);

    /* B: no dispatch cost, graph 0.001 ms per row: every expert with load
     * goes to the device (0.001 * rows < its host cost); the three never
     * seen cost nothing on the host and stay there. Tier 8 holds ranks 1 and
     * 2: one graph of 2 costs 0.016 like two of 1, and ties go to fewer
     * graphs. device_ms = 0.016 + 0.016 + 0.004 + 0.002. */
    prof = make_profile(0, 0.001);
    p = make_plan(m, c, &prof, &qp);
    if (p) {
        for (int l = 0; l < N_LAYER; l++) {
            for (int r = 0; r < 5; r++)
                CHECK(group_of(p, l, r) && group_of(p, l, r)->on_device);
            for (int r = 5; r < 8; r++)
                CHECK(group_of(p, l, r) && !group_of(p, l, r)->on_device);
            CHECK(group_of(p, l, 1) == group_of(p, l, 2));
            CHECK(group_of(p, l, 5) == group_of(p, l, 7));
            CHECK_INT_EQ(p->moe.layers[l].n_groups, 5);
            CHECK_NEAR(p->layer_cost[l].device_ms, 0.038, 1e-12);
            CHECK_NEAR(p->layer_cost[l].host_ms, 0, 1e-12);
        }
        CHECK_NEAR(p->predicted_chunk_ms, 3 * 0.038, 1e-12);
        /* f32 experts: 3 matrices of 64 x 32; buffers: 2 x (64 + 32) f32 per row */
        const uint64_t expert = 3 * 64 * 32 * 4, row = 2 * (64 + 32) * 4;
        CHECK_INT_EQ(p->device_bytes, 3 * (5 * expert + (16 + 8 + 8 + 4 + 2) * row));
    }
    nm_plan_free(p);

    /* B': the same profile measured with F16 weights, not the model's F32:
     * the device is not known to run these experts, all stay on the host */
    prof.weight_type = NM_DTYPE_F16;
    p = make_plan(m, c, &prof, &qp);
    if (p) {
        CHECK_INT_EQ(count_device_groups(p), 0);
        CHECK_INT_EQ(p->device_bytes, 0);
        CHECK_NEAR(p->predicted_chunk_ms, 3 * all_host_ms, 1e-12);
    }
    nm_plan_free(p);
    prof.weight_type = NM_DTYPE_F32;

    /* C: the same with a budget of 0 bytes: all on the host. */
    nm_plan_params pp = qparams();
    pp.device_memory_bytes = 0;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        CHECK_INT_EQ(count_device_groups(p), 0);
        CHECK_NEAR(p->predicted_chunk_ms, 3 * all_host_ms, 1e-12);
    }
    nm_plan_free(p);

    /* D: a budget of one tier-16 single-expert group (24576 + 16 * 768 =
     * 36864 bytes). By saving: tier 8's pair saves 0.24 - 0.016 but needs
     * 61440 bytes; next, layer 0's rank 0 (0.17 - 0.016) fits; nothing else
     * fits in what is left. */
    pp.device_memory_bytes = 36864;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        CHECK_INT_EQ(count_device_groups(p), 1);
        CHECK(group_of(p, 0, 0)->on_device && group_of(p, 0, 0)->capacity == 16);
        CHECK_INT_EQ(p->device_bytes, 36864);
        CHECK_NEAR(p->layer_cost[0].device_ms, 0.016, 1e-12);
        CHECK_NEAR(p->layer_cost[0].host_ms, all_host_ms - 0.17, 1e-12);
        CHECK_NEAR(p->layer_cost[1].host_ms, all_host_ms, 1e-12);
    }
    nm_plan_free(p);

    /* E: dispatch 0.1 ms. rank 0: 0.116 < 0.17, device. Tier 8 as one
     * graph: 0.116 < 0.13 + 0.11, device (as two graphs 0.216: worse).
     * rank 3: 0.104 > 0.09 and rank 4: 0.102 > 0.07, host. */
    prof = make_profile(0.1, 0.001);
    p = make_plan(m, c, &prof, &qp);
    if (p) {
        for (int l = 0; l < N_LAYER; l++) {
            CHECK(group_of(p, l, 0)->on_device);
            CHECK(group_of(p, l, 1)->on_device && group_of(p, l, 1) == group_of(p, l, 2));
            CHECK(!group_of(p, l, 3)->on_device && !group_of(p, l, 4)->on_device);
            CHECK_NEAR(p->layer_cost[l].device_ms, 0.232, 1e-12);
            CHECK_NEAR(p->layer_cost[l].host_ms, 0.16, 1e-12);
            CHECK_NEAR(p->layer_cost[l].chunk_ms, 0.232, 1e-12);
        }
    }
    nm_plan_free(p);

    /* F: one tier of 2 rows: ranks 0-3 overflow every chunk. Spilled, each
     * costs 0.05 + 0.01 * (load - 2) on the host: 0.15 0.11 0.09 0.07.
     * Groups of 5 (ranks 0-4, 0.010 + 0.42 < 0.57) and the three idle on
     * the host: 0.43 per layer, as groups of 1; ties go to the larger. */
    prof = make_profile(0, 0.001);
    const int32_t two[] = {2};
    pp = qparams();
    pp.tiers = two;
    pp.n_tiers = 1;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        for (int l = 0; l < N_LAYER; l++) {
            CHECK_INT_EQ(group_of(p, l, 0)->n_experts, 5);
            CHECK(group_of(p, l, 0)->on_device && group_of(p, l, 4) == group_of(p, l, 0));
            CHECK(!group_of(p, l, 5)->on_device);
            CHECK_NEAR(p->layer_cost[l].device_ms, 0.010, 1e-12);
            CHECK_NEAR(p->layer_cost[l].host_ms, 0.42, 1e-12);
        }
    }
    nm_plan_free(p);
    /* ... dropped instead, the overflow costs nothing: 0.010 per layer. */
    pp.overflow = NM_OVERFLOW_DROP;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        CHECK_INT_EQ(p->moe.overflow, NM_OVERFLOW_DROP);
        for (int l = 0; l < N_LAYER; l++) {
            CHECK_NEAR(p->layer_cost[l].device_ms, 0.010, 1e-12);
            CHECK_NEAR(p->layer_cost[l].host_ms, 0, 1e-12);
        }
    }
    nm_plan_free(p);

    /* G: at most one expert per graph. */
    pp = qparams();
    pp.max_group_experts = 1;
    p = make_plan(m, c, &prof, &pp);
    if (p)
        for (int l = 0; l < N_LAYER; l++)
            CHECK_INT_EQ(p->moe.layers[l].n_groups, N_EXPERT);
    nm_plan_free(p);

    /* H: a quantile of 0.5 on constant loads changes nothing; custom tiers
     * that do not reach the load give the largest. */
    const int32_t small[] = {3, 5};
    pp = qparams();
    pp.tiers = small;
    pp.n_tiers = 2;
    pp.quantile = 0.5;
    p = make_plan(m, c, &prof, &pp);
    if (p) {
        CHECK_INT_EQ(group_of(p, 1, 0)->capacity, 5);
        CHECK_INT_EQ(group_of(p, 1, 3)->capacity, 5);
        CHECK_INT_EQ(group_of(p, 1, 4)->capacity, 3);
        CHECK_INT_EQ(group_of(p, 1, 7)->capacity, 3);
    }
    nm_plan_free(p);
    nm_calib_free(c);
}

static void test_planner_refusals(const nm_model *m, const nm_model *other, const nm_calib *c) {
    nm_profile prof = make_profile(0.1, 0.001);
    nm_plan *p = NULL;
    nm_error err = {0};
    nm_plan_params pp = qparams();
    if (other) {
        nm_fingerprint fo, fm;
        nm_model_fingerprint(other, &fo);
        nm_model_fingerprint(m, &fm);
        CHECK_INT_EQ(nm_plan_make(shape(other), c, &prof, NULL, &p, &err), NM_ERR_INVALID_ARG);
        CHECK_MSG(err, "another model");
        CHECK_MSG(err, fo.hex);
        CHECK_MSG(err, fm.hex);
    }
    prof.d_model = 128;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, NULL, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "d_model 128");
    prof = make_profile(0.1, 0.001);
    prof.d_ff = 31;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, NULL, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "d_ff 31");
    prof = make_profile(0.1, 0.001);
    prof.host_row_ms = NAN;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, NULL, &p, &err), NM_ERR_FORMAT);
    CHECK_MSG(err, "host_row_ms");
    prof = make_profile(0.1, 0.001);
    const double bad_q[] = {0, -0.5, 1.5, NAN};
    for (int i = 0; i < 4; i++) {
        pp.quantile = bad_q[i];
        CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
        CHECK_MSG(err, "quantile");
    }
    pp = qparams();
    const int32_t unsorted[] = {4, 2}, too_big[] = {4, 17};
    pp.tiers = unsorted;
    pp.n_tiers = 2;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "ascending");
    pp.tiers = too_big;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "tier 17");
    /* the budget objective's own */
    pp = nm_plan_default_params();
    pp.tiers = too_big;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "tiers are for the quantile objective");
    pp = nm_plan_default_params();
    pp.granule = 3;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "granule 3: expected a divisor of the chunk (16)");
    pp.granule = 2;
    pp.budget_rows = 15;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "layer 0: a budget of 15 rows per chunk is less than the smallest tier, 2 rows");
    pp.budget_rows = -1;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "budget of -1 rows");
    pp = qparams();
    pp.budget_rows = 64;
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &prof, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "for the budget objective");
    pp = nm_plan_default_params();
    pp.budget_ms = 1;
    nm_profile flat = make_profile(0.1, 0); /* every graph costs one dispatch */
    CHECK_INT_EQ(nm_plan_make(shape(m), c, &flat, &pp, &p, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "no per-row cost");
    nm_calib *empty = NULL;
    CHECK_INT_EQ(nm_calib_new(shape(m), T, &empty, &err), NM_OK);
    if (empty) {
        CHECK_INT_EQ(nm_plan_make(shape(m), empty, &prof, NULL, &p, &err), NM_ERR_INVALID_ARG);
        CHECK_MSG(err, "no chunks");
    }
    nm_calib_free(empty);
    CHECK(p == NULL);
}

/* A realistic case: skewed random loads, a profile with a dispatch cost
 * and a sublinear graph time, every default. Checks the invariants and
 * that each group sits where its own costs say. */
static void test_planner_random(const nm_model *m, const nm_calib *c) {
    nm_profile prof = make_profile(0.06, 0.0004);
    for (int i = 0; i < prof.n_points; i++)
        grid_points[i].graph_ms =
            0.06 + 0.002 * sqrt(grid_points[i].n_experts * grid_points[i].capacity);
    nm_plan *p = make_plan(m, c, &prof, NULL);
    if (!p) return;
    CHECK(count_device_groups(p) > 0);
    int n_host = 0;
    for (int l = 0; l < N_LAYER; l++)
        for (int g = 0; g < p->moe.layers[l].n_groups; g++)
            n_host += !p->moe.layers[l].groups[g].on_device;
    CHECK(n_host > 0);
    nm_plan_free(p);
}

/* ---- the budgeted allocation ---- */

/* The least total loss over every allocation of at most budget steps,
 * enumerated: (m + 1)^n of them. */
static double exhaustive_min(const double *loss, int n, int m, int64_t budget) {
    int32_t steps[8] = {0};
    double best = INFINITY;
    for (;;) {
        int64_t used = 0;
        double total = 0;
        for (int e = 0; e < n; e++) {
            used += steps[e];
            total += loss[e * (m + 1) + steps[e]];
        }
        if (used <= budget && total < best) best = total;
        int e = 0;
        while (e < n && steps[e] == m)
            steps[e++] = 0;
        if (e == n) return best;
        steps[e]++;
    }
}

static double allocation_loss(const double *loss, int n, int m, const int32_t *steps) {
    double total = 0;
    for (int e = 0; e < n; e++)
        total += loss[e * (m + 1) + steps[e]];
    return total;
}

/* nm_plan_allocate against exhaustive search: random convex decreasing
 * losses (with ties and flat stretches, on a grid of eighths) and the
 * overflow of calibrated experts, every budget from none to more than all
 * steps. */
static void test_allocate_exhaustive(const nm_calib *c) {
    double loss[6 * 6];
    int32_t steps[6];
    int n_cases = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int n = 2 + trial % 4, m = 1 + (trial / 4) % 5;
        for (int e = 0; e < n; e++) {
            double d[6];
            for (int j = 0; j < m; j++)
                d[j] = (double)(rng() % 9) / 8; /* 0, 1/8, ..., 1: ties are common */
            for (int j = 1; j < m; j++)         /* sorted descending: convex */
                for (int i = j; i > 0 && d[i] > d[i - 1]; i--) {
                    const double t = d[i];
                    d[i] = d[i - 1];
                    d[i - 1] = t;
                }
            loss[e * (m + 1)] = 4 + (double)(rng() % 8);
            for (int j = 1; j <= m; j++)
                loss[e * (m + 1) + j] = loss[e * (m + 1) + j - 1] - d[j - 1];
        }
        for (int64_t budget = 0; budget <= (int64_t)n * m + 1; budget++) {
            nm_plan_allocate(loss, n, m, budget, steps);
            int64_t used = 0;
            for (int e = 0; e < n; e++) {
                CHECK(steps[e] >= 0 && steps[e] <= m);
                used += steps[e];
            }
            CHECK(used <= budget);
            CHECK_NEAR(allocation_loss(loss, n, m, steps), exhaustive_min(loss, n, m, budget),
                       1e-12);
            n_cases++;
        }
    }
    /* calibrated experts: 4 of a layer at capacities 2, 4, ..., 16 (7 steps
     * past the first), by weight and by count */
    for (int l = 0; l < N_LAYER; l++)
        for (int by_weight = 0; by_weight < 2; by_weight++) {
            const int n = 4, m = 7;
            double cl[4 * 8];
            for (int e = 0; e < n; e++)
                for (int j = 0; j <= m; j++) {
                    const int32_t cap = 2 * (j + 1), id = (2 * e + l) % N_EXPERT;
                    double pred[T + 1];
                    nm_calib_predict_overflow(c, l, id, by_weight, pred);
                    cl[e * (m + 1) + j] = pred[cap];
                }
            for (int64_t budget = 0; budget <= n * m; budget++) {
                nm_plan_allocate(cl, n, m, budget, steps);
                CHECK_NEAR(allocation_loss(cl, n, m, steps), exhaustive_min(cl, n, m, budget),
                           1e-12);
                n_cases++;
            }
        }
    CHECK(n_cases > 1000);
}

/* Expected overflow per chunk of a layer's plan, by weight or count. */
static double plan_loss(const nm_plan *p, const nm_calib *c, int l, bool by_weight) {
    double total = 0;
    for (int g = 0; g < p->moe.layers[l].n_groups; g++) {
        const nm_moe_group *grp = &p->moe.layers[l].groups[g];
        for (int i = 0; i < grp->n_experts; i++) {
            double pred[T + 1];
            nm_calib_predict_overflow(c, l, grp->experts[i], by_weight, pred);
            total += pred[grp->capacity];
        }
    }
    return total;
}

/* The device's row granule (the profile's) as the planner's default: the
 * budget's granule a multiple of it dividing the chunk, the quantile
 * objective's default tiers rounded up to it; without one (0, 1, or one
 * no multiple of which divides the chunk), today's default. */
static void test_planner_granule(const nm_model *m, const nm_calib *c) {
    nm_profile prof = make_profile(0.06, 0.0004);
    const struct {
        int32_t device, budget_g, n_quantile_tiers;
        int32_t quantile_tiers[5];
    } cases[] = {
        {16, 16, 1, {16}},           /* the cpu device under amx */
        {4, 4, 3, {4, 8, 16}},       /* 1 2 4 8 16 rounded up to 4 */
        {8, 8, 2, {8, 16}},          /* 1 2 4 8 16 rounded up to 8 */
        {0, 1, 5, {1, 2, 4, 8, 16}}, /* a profile without it */
        {1, 1, 5, {1, 2, 4, 8, 16}}, /* no preference */
        {3, 1, 4, {3, 6, 9, 16}},    /* 3 divides no multiple of 16 below it */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prof.granule = cases[i].device;
        nm_plan *p = make_plan(m, c, &prof, NULL);
        if (p) {
            CHECK_INT_EQ(p->granule, cases[i].budget_g);
            CHECK_INT_EQ(p->n_tiers, T / cases[i].budget_g);
            for (int l = 0; l < N_LAYER; l++)
                for (int g = 0; g < p->moe.layers[l].n_groups; g++) {
                    const int32_t cap = p->moe.layers[l].groups[g].capacity;
                    CHECK_INT_EQ(cap % cases[i].budget_g, 0);
                    if (cases[i].device > 1 && T % cases[i].device == 0)
                        CHECK_INT_EQ(cap % cases[i].device, 0);
                }
        }
        nm_plan_free(p);
        /* an explicit granule wins */
        nm_plan_params bp = nm_plan_default_params();
        bp.granule = 2;
        bp.budget_rows = N_EXPERT * 16;
        p = make_plan(m, c, &prof, &bp);
        if (p) CHECK_INT_EQ(p->granule, 2);
        nm_plan_free(p);
        nm_plan_params qp = qparams();
        p = make_plan(m, c, &prof, &qp);
        if (p) {
            CHECK_INT_EQ(p->n_tiers, cases[i].n_quantile_tiers);
            for (int t = 0; t < p->n_tiers && t < cases[i].n_quantile_tiers; t++)
                CHECK_INT_EQ(p->tiers[t], cases[i].quantile_tiers[t]);
        }
        nm_plan_free(p);
    }
}

/* The planner's budget objective on skewed random loads: exactly the
 * exhaustive optimum per layer (granule 4: 4^8 allocations), never worse
 * than one flat capacity with the same rows, the default budget the
 * quantile rule's rows, a budget in ms turned into rows, the predicted
 * weight share. */
static void test_planner_budget(const nm_model *m, const nm_calib *c) {
    nm_profile prof = make_profile(0.06, 0.0004);
    for (int by_weight = 0; by_weight < 2; by_weight++) {
        nm_plan_params pp = nm_plan_default_params();
        pp.overflow = by_weight ? NM_OVERFLOW_DROP : NM_OVERFLOW_SPILL;
        pp.salience = NM_SALIENCE_ROUTER;
        pp.granule = 4;
        for (int64_t budget = 32; budget <= 80; budget += 12) {
            pp.budget_rows = budget;
            nm_plan *p = make_plan(m, c, &prof, &pp);
            if (!p) continue;
            CHECK_INT_EQ(p->n_tiers, 4);
            CHECK_INT_EQ(p->granule, 4);
            for (int l = 0; l < N_LAYER; l++) {
                CHECK_INT_EQ(p->budget_rows[l], budget);
                double loss[N_EXPERT * 4];
                for (int e = 0; e < N_EXPERT; e++) {
                    double pred[T + 1];
                    nm_calib_predict_overflow(c, l, e, by_weight, pred);
                    for (int j = 0; j < 4; j++)
                        loss[e * 4 + j] = pred[4 * (j + 1)];
                }
                const double best = exhaustive_min(loss, N_EXPERT, 3, (budget - 32) / 4);
                CHECK_NEAR(plan_loss(p, c, l, by_weight), best, 1e-9);
            }
            nm_plan_free(p);
        }
        /* granule 1 against one flat capacity f for every expert */
        pp.granule = 1;
        for (int32_t f = 1; f <= T; f++) {
            pp.budget_rows = (int64_t)N_EXPERT * f;
            nm_plan *p = make_plan(m, c, &prof, &pp);
            for (int l = 0; p && l < N_LAYER; l++) {
                double flat = 0;
                for (int e = 0; e < N_EXPERT; e++) {
                    double pred[T + 1];
                    nm_calib_predict_overflow(c, l, e, by_weight, pred);
                    flat += pred[f];
                }
                CHECK(plan_loss(p, c, l, by_weight) <= flat + 1e-12);
            }
            nm_plan_free(p);
        }
    }
    /* the default budget: the rows of the quantile rule's plan */
    nm_plan_params qp = qparams();
    nm_plan *q = make_plan(m, c, &prof, &qp);
    nm_plan *p = make_plan(m, c, &prof, NULL);
    if (p && q) {
        CHECK_INT_EQ(p->granule, 1); /* the smallest divisor of 16 >= 16/16 */
        CHECK_INT_EQ(p->n_tiers, 16);
        for (int l = 0; l < N_LAYER; l++)
            CHECK_INT_EQ(p->budget_rows[l], q->budget_rows[l]);
        /* the share of routing weight over capacity */
        double w = 0, total = 0;
        for (int l = 0; l < N_LAYER; l++) {
            w += plan_loss(p, c, l, true);
            for (int e = 0; e < N_EXPERT; e++) {
                double pred[T + 1];
                nm_calib_predict_overflow(c, l, e, true, pred);
                total += pred[0];
            }
        }
        CHECK_NEAR(p->predicted_drop_weight, w / total, 1e-12);
    }
    nm_plan_free(p);
    nm_plan_free(q);
    /* a budget beyond every expert holding a whole chunk is that */
    nm_plan_params big = nm_plan_default_params();
    big.budget_rows = (int64_t)1 << 40;
    p = make_plan(m, c, &prof, &big);
    for (int l = 0; p && l < N_LAYER; l++) {
        CHECK_INT_EQ(p->budget_rows[l], N_EXPERT * T);
        CHECK_NEAR(plan_loss(p, c, l, false), 0, 0);
    }
    if (p) {
        nm_error e2 = {0};
        nm_plan *r = NULL;
        CHECK_INT_EQ(nm_plan_save(p, TMP("big.plan.json"), &e2), NM_OK);
        CHECK_INT_EQ(nm_plan_load(TMP("big.plan.json"), shape(m), &r, &e2), NM_OK);
        nm_plan_free(r);
    }
    nm_plan_free(p);
    /* 0.0004 ms per row: 0.01602 ms is 40 rows */
    double row_ms = 0;
    nm_error err = {0};
    CHECK_INT_EQ(nm_plan_row_ms(&prof, &row_ms, &err), NM_OK);
    CHECK_NEAR(row_ms, 0.0004, 1e-15);
    nm_plan_params pp = nm_plan_default_params();
    pp.budget_ms = 0.01602;
    pp.granule = 1;
    p = make_plan(m, c, &prof, &pp);
    for (int l = 0; p && l < N_LAYER; l++)
        CHECK_INT_EQ(p->budget_rows[l], 40);
    nm_plan_free(p);
}

/* ---- plan files ---- */

static void check_same_plan(const nm_plan *a, const nm_plan *b) {
    CHECK(strcmp(a->fingerprint.hex, b->fingerprint.hex) == 0);
    CHECK(strcmp(a->device, b->device) == 0);
    CHECK_INT_EQ(a->moe.chunk, b->moe.chunk);
    CHECK_INT_EQ(a->moe.n_layer, b->moe.n_layer);
    CHECK_INT_EQ(a->moe.n_expert, b->moe.n_expert);
    CHECK_INT_EQ(a->first_layer, b->first_layer);
    CHECK_INT_EQ(a->n_shared, b->n_shared);
    CHECK_INT_EQ(a->d_ff_shared, b->d_ff_shared);
    CHECK_INT_EQ(a->moe.overflow, b->moe.overflow);
    CHECK_INT_EQ(a->moe.salience, b->moe.salience);
    CHECK(a->quantile == b->quantile);
    CHECK_INT_EQ(a->objective, b->objective);
    CHECK_INT_EQ(a->granule, b->granule);
    CHECK(a->predicted_drop_rate == b->predicted_drop_rate);
    CHECK(a->predicted_drop_weight == b->predicted_drop_weight);
    for (int l = 0; l < a->moe.n_layer && l < b->moe.n_layer; l++)
        CHECK_INT_EQ(a->budget_rows[l], b->budget_rows[l]);
    CHECK(a->predicted_chunk_ms == b->predicted_chunk_ms);
    CHECK_INT_EQ(a->device_bytes, b->device_bytes);
    CHECK_INT_EQ(a->n_tiers, b->n_tiers);
    for (int i = 0; i < a->n_tiers && i < b->n_tiers; i++)
        CHECK_INT_EQ(a->tiers[i], b->tiers[i]);
    for (int l = 0; l < a->moe.n_layer && l < b->moe.n_layer; l++) {
        CHECK(a->layer_cost[l].device_ms == b->layer_cost[l].device_ms);
        CHECK(a->layer_cost[l].host_ms == b->layer_cost[l].host_ms);
        CHECK(a->layer_cost[l].chunk_ms == b->layer_cost[l].chunk_ms);
        const nm_moe_layer_plan *la = &a->moe.layers[l], *lb = &b->moe.layers[l];
        CHECK_INT_EQ(la->n_groups, lb->n_groups);
        for (int g = 0; g < la->n_groups && g < lb->n_groups; g++) {
            CHECK_INT_EQ(la->groups[g].capacity, lb->groups[g].capacity);
            CHECK_INT_EQ(la->groups[g].on_device, lb->groups[g].on_device);
            CHECK_INT_EQ(la->groups[g].n_experts, lb->groups[g].n_experts);
            for (int i = 0; i < la->groups[g].n_experts && i < lb->groups[g].n_experts; i++)
                CHECK_INT_EQ(la->groups[g].experts[i], lb->groups[g].experts[i]);
        }
    }
}

/* nm_plan_describe's text (free() it), or NULL. */
static char *describe(const nm_plan *p) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) return NULL;
    nm_plan_describe(p, f);
    fclose(f);
    return text;
}

/* A model with shared experts (its shape says so, as qwen2moe's and
 * deepseek2's do): the plan records them, reads them back, prints them, and
 * a model whose shared experts differ, or that has none, refuses it; the
 * plan of a model without them has no such keys. */
static void test_plan_shared(const nm_model *m, const nm_calib *c, const nm_profile *prof,
                             const nm_plan_params *pp) {
    nm_moe_shape sh = *shape(m);
    sh.n_shared = 2;
    sh.d_ff_shared = 64;
    nm_plan *p = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_plan_make(&sh, c, prof, pp, &p, &err), NM_OK);
    if (!p) return;
    CHECK_INT_EQ(p->n_shared, 2);
    CHECK_INT_EQ(p->d_ff_shared, 64);
    char *text = NULL;
    size_t n = 0;
    CHECK_INT_EQ(nm_plan_save_memory(p, &text, &n, &err), NM_OK);
    CHECK(text && contains(text, "\"shared_experts\": 2") &&
          contains(text, "\"shared_expert_ff\": 64"));
    nm_plan *r = NULL;
    CHECK_INT_EQ(nm_plan_load_memory(text, n, "s.plan.json", &sh, &r, &err), NM_OK);
    if (r) check_same_plan(p, r);
    nm_plan_free(r);
    r = NULL;
    CHECK_INT_EQ(nm_plan_load_memory(text, n, "s.plan.json", shape(m), &r, &err),
                 NM_ERR_INVALID_ARG);
    CHECK_MSG(err,
              "the plan is for 2 shared experts of width 64 in all, the model has 0 of width 0");
    CHECK(r == NULL);
    nm_moe_shape wider = sh;
    wider.d_ff_shared = 128;
    CHECK_INT_EQ(nm_plan_load_memory(text, n, "s.plan.json", &wider, &r, &err), NM_ERR_INVALID_ARG);
    CHECK_MSG(err, "the model has 2 of width 128");
    CHECK(r == NULL);
    nm_free(text);
    char *desc = describe(p);
    CHECK(desc && contains(desc, "shared:     2 shared experts (d_ff 64 in all) on every token"));
    free(desc);
    nm_plan_free(p);
    p = make_plan(m, c, prof, pp);
    if (!p) return;
    CHECK_INT_EQ(nm_plan_save_memory(p, &text, &n, &err), NM_OK);
    CHECK(text && !contains(text, "shared"));
    nm_free(text);
    nm_plan_free(p);
}

static void test_plan_files(const nm_model *m, const nm_model *other, const nm_calib *c) {
    nm_profile prof = make_profile(0.1, 0.001);
    nm_error err = {0};
    /* a budgeted plan */
    nm_plan_params bp = nm_plan_default_params();
    bp.overflow = NM_OVERFLOW_DROP;
    bp.granule = 4;
    bp.budget_rows = 44;
    nm_plan *p = make_plan(m, c, &prof, &bp);
    if (p) {
        CHECK_INT_EQ(nm_plan_save(p, TMP("budget.plan.json"), &err), NM_OK);
        nm_plan *r = NULL;
        CHECK_INT_EQ(nm_plan_load(TMP("budget.plan.json"), shape(m), &r, &err), NM_OK);
        if (r) check_same_plan(p, r);
        nm_plan_free(r);
        char *text = describe(p);
        CHECK(text != NULL);
        if (text) {
            CHECK(contains(text, "tiers:      4 8 12 16 (multiples of 4 rows: the least expected "
                                 "dropped routing weight"));
            CHECK(contains(text, "objective:  budget, 44 rows per layer and chunk"));
            CHECK(contains(text, "overflow predicted on the calibration: "));
        }
        free(text);
    }
    nm_plan_free(p);

    const nm_plan_params qp = qparams();
    p = make_plan(m, c, &prof, &qp);
    if (!p) return;
    CHECK_INT_EQ(nm_plan_save(p, TMP("a.plan.json"), &err), NM_OK);
    nm_plan *r = NULL;
    CHECK_INT_EQ(nm_plan_load(TMP("a.plan.json"), shape(m), &r, &err), NM_OK);
    if (r) check_same_plan(p, r);
    nm_plan_free(r);
    r = NULL;
    CHECK_INT_EQ(nm_plan_load(TMP("a.plan.json"), NULL, &r, &err), NM_OK); /* no model */
    if (r) check_same_plan(p, r);
    nm_plan_free(r);
    r = NULL;
    if (other) {
        nm_fingerprint fo;
        nm_model_fingerprint(other, &fo);
        CHECK_INT_EQ(nm_plan_load(TMP("a.plan.json"), shape(other), &r, &err), NM_ERR_INVALID_ARG);
        CHECK_MSG(err, "another model");
        CHECK_MSG(err, p->fingerprint.hex);
        CHECK_MSG(err, fo.hex);
        CHECK_MSG(err, "a.plan.json");
        CHECK(r == NULL);
    }
    /* the summary names the device, the tiers and every layer */
    char *text = describe(p);
    CHECK(text != NULL);
    if (text) {
        CHECK(contains(text, "synthetic"));
        CHECK(contains(text, "tiers:      1 2 4 8 16"));
        CHECK(contains(text, "layer 2:"));
        CHECK(contains(text, "device tier   16"));
        CHECK(contains(text, "host   tier    4"));
        CHECK(!contains(text, "shared"));
    }
    free(text);
    nm_plan_free(p);
    test_plan_shared(m, c, &prof, &qp);
}

/* ---- malformed files ---- */

/* A valid plan for the tiny model; layer 0 is written differently from the
 * others so a replacement can target it. */
static char plan_text[4096];

static void make_plan_text(const nm_model *m) {
    nm_fingerprint fp;
    nm_model_fingerprint(m, &fp);
    snprintf(plan_text, sizeof plan_text,
             "{\"format\": \"npumoe-plan\", \"version\": 2, \"fingerprint\": \"%s\",\n"
             " \"device\": \"cpu\", \"chunk\": 16, \"n_layer\": 3, \"n_expert\": 8,\n"
             " \"tiers\": [4, 16], \"overflow\": \"spill\", \"salience\": \"router\",\n"
             " \"objective\": \"quantile\", \"granule\": 0, \"quantile\": 0.95,\n"
             " \"predicted_drop_rate\": 0.01, \"predicted_drop_weight\": 0.002,\n"
             " \"predicted_chunk_ms\": 6, \"device_bytes\": 1000,\n"
             " \"layers\": [\n"
             "  {\"budget_rows\": 80,\n"
             "   \"groups\": [{\"tier\": 16, \"experts\": [3, 2, 1, 0], \"device\": true},\n"
             "              {\"tier\": 4, \"experts\": [7, 6, 5, 4], \"device\": false}],\n"
             "   \"cost\": {\"device_ms\": 1, \"host_ms\": 2, \"chunk_ms\": 2}},\n"
             "  {\"budget_rows\": 80, \"groups\": [{\"tier\": 16, \"experts\": [0, 1, 2, 3], "
             "\"device\": true},\n"
             "              {\"tier\": 4, \"experts\": [4, 5, 6, 7], \"device\": false}],\n"
             "   \"cost\": {\"device_ms\": 1, \"host_ms\": 2, \"chunk_ms\": 2}},\n"
             "  {\"budget_rows\": 80, \"groups\": [{\"tier\": 16, \"experts\": [0, 1, 2, 3], "
             "\"device\": true},\n"
             "              {\"tier\": 4, \"experts\": [4, 5, 6, 7], \"device\": false}],\n"
             "   \"cost\": {\"device_ms\": 1, \"host_ms\": 2, \"chunk_ms\": 2}}]}\n",
             fp.hex);
}

/* A valid calibration: 1 layer, 2 experts, top-1, chunks of 4. Chunk one:
 * 4 tokens, loads 3 and 1; chunk two: 2 tokens, loads 0 and 2. */
static const char calib_text[] =
    "{\"format\": \"npumoe-calib\", \"version\": 2, \"fingerprint\": \"0123456789abcdef\",\n"
    " \"chunk\": 4, \"k\": 1, \"n_layer\": 1, \"n_expert\": 2, \"n_chunks\": 2, \"n_tokens\": 6,\n"
    " \"layers\": [{\"experts\": [\n"
    "  {\"mean\": 1.5, \"max\": 3, \"q50\": 0, \"q90\": 3, \"q95\": 3, \"q99\": 3,\n"
    "   \"hist\": [[0, 1], [3, 1]], \"ranked\": [0.75, 0.5, 0.25]},\n"
    "  {\"mean\": 1.5, \"max\": 2, \"q50\": 1, \"q90\": 2, \"q95\": 2, \"q99\": 2,\n"
    "   \"hist\": [[1, 1], [2, 1]], \"ranked\": [1.5, 0.5]}]}]}\n";

static const char profile_text[] =
    "{\"format\": \"npumoe-profile\", \"version\": 1, \"device\": \"cpu\", \"d_model\": 64,\n"
    " \"d_ff\": 32, \"weight_type\": \"f32\", \"dispatch_ms\": 0.01, \"host_row_ms\": 0.002,\n"
    " \"host_expert_ms\": 0, \"chunk\": 8, \"host_overhead_ms\": 0.004, \"points\": [\n"
    "  {\"n_experts\": 1, \"capacity\": 4, \"graph_ms\": 0.02},\n"
    "  {\"n_experts\": 1, \"capacity\": 8, \"graph_ms\": 0.03},\n"
    "  {\"n_experts\": 2, \"capacity\": 4, \"graph_ms\": 0.03},\n"
    "  {\"n_experts\": 2, \"capacity\": 8, \"graph_ms\": 0.05}]}\n";

/* text with the first occurrence of from replaced by to (static buffer). */
static const char *edit(const char *text, const char *from, const char *to) {
    static char out[8192];
    const char *at = strstr(text, from);
    if (!at) {
        fprintf(stderr, "edit: \"%s\" not in the text\n", from);
        nm_test_failures++;
        return text;
    }
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return out;
}

typedef enum kind { PLAN, CALIB, PROFILE } kind;

/* Loads text as kind; expects status and a message containing part. */
static void expect_refused(kind k, const nm_model *m, const char *text, size_t n, nm_status status,
                           const char *part, int line) {
    nm_error err = {0};
    nm_status st;
    if (k == PLAN) {
        nm_plan *p = NULL;
        st = nm_plan_load_memory(text, n, "bad.plan.json", shape(m), &p, &err);
        CHECK(p == NULL);
        nm_plan_free(p);
    } else if (k == CALIB) {
        nm_calib *c = NULL;
        st = nm_calib_load_memory(text, n, "bad.calib.json", &c, &err);
        CHECK(c == NULL);
        nm_calib_free(c);
    } else {
        nm_profile pr;
        st = nm_profile_load_memory(text, n, "bad.profile.json", &pr, &err);
        CHECK(pr.points == NULL);
        if (st == NM_OK) nm_profile_free(&pr);
    }
    nm_test_checks++;
    if (st != status || !contains(err.msg, part) ||
        !contains(err.msg, k == PLAN    ? "bad.plan.json: "
                           : k == CALIB ? "bad.calib.json: "
                                        : "bad.profile.json: ")) {
        nm_test_failures++;
        fprintf(stderr, "%s:%d: status %s (want %s), message \"%s\" (want \"%s\")\n", __FILE__,
                line, nm_status_str(st), nm_status_str(status), err.msg, part);
    }
}

#define REFUSE(k, m, text, status, part)                                                           \
    expect_refused(k, m, text, strlen(text), status, part, __LINE__)

static void test_malformed(const nm_model *m, const nm_model *other) {
    make_plan_text(m);
    nm_error err = {0};
    /* the templates themselves load */
    nm_plan *p = NULL;
    CHECK_INT_EQ(nm_plan_load_memory(plan_text, strlen(plan_text), "ok", shape(m), &p, &err),
                 NM_OK);
    if (!p) fprintf(stderr, "template plan: %s\n", err.msg);
    nm_plan_free(p);
    nm_calib *c = NULL;
    CHECK_INT_EQ(nm_calib_load_memory(calib_text, strlen(calib_text), "ok", &c, &err), NM_OK);
    if (!c) fprintf(stderr, "template calib: %s\n", err.msg);
    if (c) CHECK_INT_EQ(nm_calib_quantile(c, 0, 0, 0.5), 0);
    nm_calib_free(c);
    nm_profile pr;
    CHECK_INT_EQ(nm_profile_load_memory(profile_text, strlen(profile_text), "ok", &pr, &err),
                 NM_OK);
    if (pr.points)
        nm_profile_free(&pr);
    else
        fprintf(stderr, "template profile: %s\n", err.msg);

    const char *pt = plan_text;
    /* plans */
    expect_refused(PLAN, m, pt, strlen(pt) / 2, NM_ERR_FORMAT, "line ", __LINE__); /* truncated */
    expect_refused(PLAN, m, "", 0, NM_ERR_FORMAT, "line 1", __LINE__);
    REFUSE(PLAN, m, "[1, 2]", NM_ERR_FORMAT, "expected a npumoe-plan object");
    REFUSE(PLAN, m, edit(pt, "npumoe-plan", "npumoe-calib"), NM_ERR_FORMAT,
           "not a npumoe-plan file");
    REFUSE(PLAN, m, calib_text, NM_ERR_FORMAT, "not a npumoe-plan file");
    REFUSE(PLAN, m, edit(pt, "\"version\": 2", "\"version\": 3"), NM_ERR_UNSUPPORTED, "version 3");
    REFUSE(PLAN, m, edit(pt, "\"version\": 2", "\"version\": 1"), NM_ERR_UNSUPPORTED,
           "npumoe-plan version 1 was written by an older npumoe (this one reads version 2): "
           "make the plan again with `npumoe plan`");
    REFUSE(PLAN, m, edit(pt, "\"version\": 2,", ""), NM_ERR_NOT_FOUND, "missing key 'version'");
    REFUSE(PLAN, m, edit(pt, "\"n_expert\": 8,", "\"n_expert\": 8, \"shared_experts\": 0,"),
           NM_ERR_FORMAT, "shared_experts");
    REFUSE(PLAN, m, edit(pt, "\"n_expert\": 8,", "\"n_expert\": 8, \"shared_experts\": 65,"),
           NM_ERR_FORMAT, "shared_experts");
    REFUSE(PLAN, m, edit(pt, "\"n_expert\": 8,", "\"n_expert\": 8, \"shared_experts\": 1,"),
           NM_ERR_NOT_FOUND, "missing key 'shared_expert_ff'");
    REFUSE(PLAN, m, edit(pt, "\"n_expert\": 8,", "\"n_expert\": 8, \"shared_expert_ff\": 64,"),
           NM_ERR_FORMAT, "shared_expert_ff without shared_experts");
    REFUSE(PLAN, m,
           edit(pt, "\"n_expert\": 8,",
                "\"n_expert\": 8, \"shared_experts\": 1, \"shared_expert_ff\": 64,"),
           NM_ERR_INVALID_ARG, "the plan is for 1 shared experts of width 64 in all");
    REFUSE(PLAN, m, edit(pt, "\"quantile\",", "\"greedy\","), NM_ERR_FORMAT,
           "objective: unknown \"greedy\"");
    REFUSE(PLAN, m, edit(pt, "\"granule\": 0", "\"granule\": 4"), NM_ERR_FORMAT,
           "granule: 4, but a quantile plan has none");
    REFUSE(PLAN, m, edit(pt, "\"quantile\",", "\"budget\","), NM_ERR_FORMAT,
           "tiers: a budgeted plan's tiers are the multiples of its granule (0)");
    static char budget_text[4096]; /* edit's result is overwritten by the next edit */
    snprintf(budget_text, sizeof budget_text, "%s", edit(pt, "\"quantile\",", "\"budget\","));
    REFUSE(PLAN, m, edit(budget_text, "\"granule\": 0", "\"granule\": 4"), NM_ERR_FORMAT,
           "multiples of its granule (4) up to the chunk (16)");
    REFUSE(PLAN, m, edit(pt, "\"budget_rows\": 80", "\"budget_rows\": 79"), NM_ERR_FORMAT,
           "layers[0]: the groups reserve 80 rows per chunk, over the budget_rows 79");
    REFUSE(PLAN, m, edit(pt, "\"budget_rows\": 80", "\"budget_rows\": -1"), NM_ERR_FORMAT,
           "layers[0].budget_rows");
    REFUSE(PLAN, m, edit(pt, "\"predicted_drop_rate\": 0.01", "\"predicted_drop_rate\": 2"),
           NM_ERR_FORMAT, "predicted_drop_rate");
    REFUSE(PLAN, m, edit(pt, "\"predicted_drop_weight\": 0.002,", ""), NM_ERR_NOT_FOUND,
           "predicted_drop_weight");
    if (other) {
        nm_fingerprint fo, fm;
        nm_model_fingerprint(other, &fo);
        nm_model_fingerprint(m, &fm);
        REFUSE(PLAN, other, pt, NM_ERR_INVALID_ARG, fo.hex);
        REFUSE(PLAN, other, pt, NM_ERR_INVALID_ARG, fm.hex);
        REFUSE(PLAN, m, edit(pt, fm.hex, fo.hex), NM_ERR_INVALID_ARG, "another model");
    }
    REFUSE(PLAN, m, edit(pt, "\"fingerprint\": \"", "\"fingerprint\": \"X"), NM_ERR_FORMAT,
           "16 lowercase hex digits");
    REFUSE(PLAN, m, edit(pt, "\"chunk\": 16", "\"chunk\": 8"), NM_ERR_FORMAT,
           "tiers[1]: expected an integer in [1, 8], got 16");
    REFUSE(PLAN, m, edit(pt, "\"chunk\": 16", "\"chunk\": 0"), NM_ERR_FORMAT, "chunk");
    REFUSE(PLAN, m, edit(pt, "\"n_layer\": 3", "\"n_layer\": 4"), NM_ERR_INVALID_ARG,
           "4 layers of 8 experts, the model has 3 of 8");
    REFUSE(PLAN, NULL, edit(pt, "\"n_layer\": 3", "\"n_layer\": 4"), NM_ERR_FORMAT,
           "layers: 3 entries, n_layer is 4");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1, 8]"), NM_ERR_FORMAT,
           "layers[0].groups[0].experts[3]: expected an integer in [0, 7], got 8");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1, -1]"), NM_ERR_FORMAT, "got -1");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1, 4]"), NM_ERR_FORMAT,
           "layer 0: expert 4 is in more than one group");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1]"), NM_ERR_FORMAT,
           "layer 0: expert 0 is in no group");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[]"), NM_ERR_FORMAT,
           "layers[0].groups[0].experts: 0");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "5"), NM_ERR_FORMAT, "expected an array, got 5");
    REFUSE(PLAN, m, edit(pt, "[3, 2, 1, 0]", "[3, 2, 1, 0.5]"), NM_ERR_FORMAT, "got 0.5");
    REFUSE(PLAN, m, edit(pt, "\"tier\": 16", "\"tier\": -4"), NM_ERR_FORMAT,
           "layers[0].groups[0].tier: expected an integer in [1, 16], got -4");
    REFUSE(PLAN, m, edit(pt, "\"tier\": 16", "\"tier\": 32"), NM_ERR_FORMAT, "got 32");
    REFUSE(PLAN, m, edit(pt, "\"tier\": 16", "\"tier\": 8"), NM_ERR_FORMAT,
           "layers[0].groups[0].tier: 8 is not one of the plan's tiers");
    REFUSE(PLAN, m, edit(pt, "\"tier\": 16", "\"tier\": \"16\""), NM_ERR_FORMAT, "got \"16\"");
    REFUSE(PLAN, m, edit(pt, "[4, 16]", "[16, 4]"), NM_ERR_FORMAT, "ascending");
    REFUSE(PLAN, m, edit(pt, "[4, 16]", "[]"), NM_ERR_FORMAT, "tiers: 0 entries");
    REFUSE(PLAN, m, edit(pt, "\"device\": true", "\"device\": \"yes\""), NM_ERR_FORMAT,
           "expected true or false");
    REFUSE(PLAN, m, edit(pt, "\"device\": \"cpu\"", "\"device\": \"\""), NM_ERR_FORMAT, "device");
    REFUSE(PLAN, m, edit(pt, "\"spill\"", "\"explode\""), NM_ERR_FORMAT,
           "unknown policy \"explode\"");
    REFUSE(PLAN, m, edit(pt, "\"router\"", "\"loud\""), NM_ERR_FORMAT, "salience");
    REFUSE(PLAN, m, edit(pt, "\"quantile\": 0.95", "\"quantile\": 0"), NM_ERR_FORMAT, "quantile");
    REFUSE(PLAN, m, edit(pt, "\"quantile\": 0.95", "\"quantile\": 1.5"), NM_ERR_FORMAT, "quantile");
    REFUSE(PLAN, m, edit(pt, "\"predicted_chunk_ms\": 6", "\"predicted_chunk_ms\": NaN"),
           NM_ERR_FORMAT, "line 6");
    REFUSE(PLAN, m, edit(pt, "\"predicted_chunk_ms\": 6", "\"predicted_chunk_ms\": 1e400"),
           NM_ERR_FORMAT, "line 6");
    REFUSE(PLAN, m, edit(pt, "\"predicted_chunk_ms\": 6", "\"predicted_chunk_ms\": 7"),
           NM_ERR_FORMAT, "not the sum");
    REFUSE(PLAN, m, edit(pt, "\"host_ms\": 2", "\"host_ms\": 1e300"), NM_ERR_FORMAT,
           "layers[0].cost.host_ms: expected a number in [0, 1e+24], got 1e+300");
    REFUSE(PLAN, m, edit(pt, "\"chunk_ms\": 2", "\"chunk_ms\": 1"), NM_ERR_FORMAT,
           "layers[0].cost: chunk_ms 1 is not max");
    REFUSE(PLAN, m, edit(pt, "\"device_ms\": 1", "\"device_ms\": -1"), NM_ERR_FORMAT, "got -1");
    REFUSE(PLAN, m, edit(pt, "\"device_bytes\": 1000", "\"device_bytes\": 1e20"), NM_ERR_FORMAT,
           "device_bytes");
    REFUSE(PLAN, m, edit(pt, "\"layers\": [", "\"players\": ["), NM_ERR_NOT_FOUND,
           "missing key 'layers'");
    REFUSE(PLAN, m, edit(pt, "\"device\": \"cpu\",", "\"device\": \"cpu\", \"device\": \"cpu\","),
           NM_ERR_FORMAT, "duplicate");

    /* calibrations */
    const char *ct = calib_text;
    expect_refused(CALIB, NULL, ct, strlen(ct) - 10, NM_ERR_FORMAT, "line ", __LINE__);
    REFUSE(CALIB, NULL, edit(ct, "npumoe-calib", "npumoe-profile"), NM_ERR_FORMAT,
           "not a npumoe-calib file");
    REFUSE(CALIB, NULL, edit(ct, "0123456789abcdef", "0123456789ABCDEF"), NM_ERR_FORMAT,
           "fingerprint");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[0, 1], [3, 2]]"), NM_ERR_FORMAT,
           "layer 0 expert 0: the histogram counts at least 3 chunks, n_chunks is 2");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[3, 1]]"), NM_ERR_FORMAT,
           "layer 0 expert 0: the histogram counts 1 chunks, n_chunks is 2");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[3, 1], [0, 1]]"), NM_ERR_FORMAT,
           "strictly ascending");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[0, 1], [5, 1]]"), NM_ERR_FORMAT,
           "layers[0].experts[0].hist[1]: expected an integer in [0, 4], got 5");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[0, 1], [3, 0], [4, 1]]"), NM_ERR_FORMAT,
           "got 0");
    REFUSE(CALIB, NULL, edit(ct, "[[0, 1], [3, 1]]", "[[0, 1], [3]]"), NM_ERR_FORMAT,
           "expected a pair [load, count]");
    REFUSE(CALIB, NULL, edit(ct, "\"mean\": 1.5", "\"mean\": 1.6"), NM_ERR_FORMAT,
           "layer 0 expert 0: mean 1.6");
    REFUSE(CALIB, NULL, edit(ct, "\"max\": 3", "\"max\": 2"), NM_ERR_FORMAT,
           "layer 0 expert 0: max 2 disagrees");
    REFUSE(CALIB, NULL, edit(ct, "\"q90\": 3", "\"q90\": 2"), NM_ERR_FORMAT,
           "layer 0 expert 0: q90 2 disagrees");
    REFUSE(CALIB, NULL, edit(ct, "\"n_tokens\": 6", "\"n_tokens\": 5"), NM_ERR_FORMAT,
           "layer 0: the experts received 6 assignments in all, but n_tokens 5 x k 1 = 5");
    REFUSE(CALIB, NULL, edit(ct, "\"n_tokens\": 6", "\"n_tokens\": 9"), NM_ERR_FORMAT,
           "n_tokens: expected an integer in [2, 8]");
    REFUSE(CALIB, NULL, edit(ct, "\"k\": 1", "\"k\": 3"), NM_ERR_FORMAT,
           "k: expected an integer in [1, 2]");
    REFUSE(CALIB, NULL, edit(ct, "\"n_expert\": 2", "\"n_expert\": 3"), NM_ERR_FORMAT,
           "layers[0].experts: 2 entries, n_expert is 3");
    REFUSE(CALIB, NULL, edit(ct, "\"chunk\": 4", "\"chunk\": 1e300"), NM_ERR_FORMAT,
           "chunk: expected an integer in [1, 65536]");
    REFUSE(CALIB, NULL, edit(ct, "\"n_chunks\": 2", "\"n_chunks\": -2"), NM_ERR_FORMAT, "n_chunks");
    REFUSE(CALIB, NULL, edit(ct, "\"mean\": 1.5", "\"mean\": null"), NM_ERR_FORMAT, "got null");
    REFUSE(CALIB, NULL, edit(ct, "\"version\": 2", "\"version\": 1"), NM_ERR_UNSUPPORTED,
           "npumoe-calib version 1 was written by an older npumoe (this one reads version 2): "
           "recalibrate with `npumoe calibrate`");
    REFUSE(CALIB, NULL, edit(ct, ", \"ranked\": [1.5, 0.5]", ""), NM_ERR_NOT_FOUND,
           "missing key 'ranked'");
    REFUSE(CALIB, NULL, edit(ct, "[1.5, 0.5]", "[1.5]"), NM_ERR_FORMAT,
           "layers[0].experts[1].ranked: 1 entries, expected one per rank up to the largest "
           "load, 2");
    REFUSE(CALIB, NULL, edit(ct, "[0.75, 0.5, 0.25]", "[0.75, 0.5, 0.6]"), NM_ERR_FORMAT,
           "layers[0].experts[0].ranked[2]: 0.59999999999999998 after 0.5; the weights ranked by "
           "weight cannot grow");
    REFUSE(CALIB, NULL, edit(ct, "[0.75, 0.5, 0.25]", "[0.75, -0.5, -0.6]"), NM_ERR_FORMAT,
           "layers[0].experts[0].ranked[1]");

    /* profiles */
    const char *pf = profile_text;
    REFUSE(PROFILE, NULL,
           edit(pf, "\"capacity\": 8, \"graph_ms\": 0.03}", "\"capacity\": 4, \"graph_ms\": 0.03}"),
           NM_ERR_FORMAT, "1 experts x capacity 4 is measured twice");
    REFUSE(PROFILE, NULL,
           edit(pf, "{\"n_experts\": 2, \"capacity\": 8, \"graph_ms\": 0.05}",
                "{\"n_experts\": 3, \"capacity\": 8, \"graph_ms\": 0.05}"),
           NM_ERR_FORMAT, "not a full grid");
    REFUSE(PROFILE, NULL, edit(pf, "\"n_experts\": 1", "\"n_experts\": 0"), NM_ERR_FORMAT,
           "points[0].n_experts");
    REFUSE(PROFILE, NULL, edit(pf, "\"graph_ms\": 0.02", "\"graph_ms\": 0"), NM_ERR_FORMAT,
           "points[0].graph_ms 0 ms is not a positive time");
    REFUSE(PROFILE, NULL, edit(pf, "\"dispatch_ms\": 0.01", "\"dispatch_ms\": -0.01"),
           NM_ERR_FORMAT, "dispatch_ms");
    REFUSE(PROFILE, NULL, edit(pf, "\"host_row_ms\": 0.002", "\"host_row_ms\": 0"), NM_ERR_FORMAT,
           "host_row_ms 0 ms is not a positive time");
    REFUSE(PROFILE, NULL, edit(pf, "\"f32\"", "\"f99\""), NM_ERR_FORMAT, "weight_type");
    REFUSE(PROFILE, NULL, edit(pf, "\"chunk\": 8", "\"chunk\": 0"), NM_ERR_FORMAT,
           "chunk: expected an integer in [1, 65536]");
    REFUSE(PROFILE, NULL, edit(pf, ", \"chunk\": 8", ""), NM_ERR_NOT_FOUND, "missing key 'chunk'");
    REFUSE(PROFILE, NULL, edit(pf, "\"host_overhead_ms\": 0.004", "\"host_overhead_ms\": -1"),
           NM_ERR_FORMAT, "host_overhead_ms");
    REFUSE(PROFILE, NULL, edit(pf, "\"d_model\": 64", "\"d_model\": 0"), NM_ERR_FORMAT, "d_model");
    REFUSE(PROFILE, NULL, edit(pf, "\"graph_ms\": 0.05", "\"graph_ms\": 1e12"), NM_ERR_FORMAT,
           "graph_ms");
    REFUSE(PROFILE, NULL,
           edit(pf, "\"device\": \"cpu\"",
                "\"device\": \"a device name much longer than thirty-one bytes\""),
           NM_ERR_FORMAT, "device");
    REFUSE(PROFILE, NULL, edit(pf, "\"points\": [", "\"points\": [], \"x\": ["), NM_ERR_FORMAT,
           "points");
}

/* ---- allocation failures ---- */

typedef enum op {
    OP_CALIB_NEW,
    OP_CALIB_SAVE,
    OP_CALIB_LOAD,
    OP_PROFILE_LOAD,
    OP_PLAN_MAKE,
    OP_PLAN_SAVE,
    OP_PLAN_LOAD,
    OP_COUNT
} op;

static nm_status run_op(op o, const nm_model *m, const nm_calib *c, const nm_profile *prof,
                        const nm_plan *plan, nm_error *err) {
    nm_status st = NM_OK;
    switch (o) {
    case OP_CALIB_NEW: {
        nm_calib *r = NULL;
        st = nm_calib_new(shape(m), T, &r, err);
        nm_calib_free(r);
        break;
    }
    case OP_CALIB_SAVE:
        st = nm_calib_save(c, TMP("nomem.calib.json"), err);
        break;
    case OP_CALIB_LOAD: {
        nm_calib *r = NULL;
        st = nm_calib_load(TMP("a.calib.json"), &r, err);
        nm_calib_free(r);
        break;
    }
    case OP_PROFILE_LOAD: {
        nm_profile r;
        st = nm_profile_load(TMP("a.profile.json"), &r, err);
        if (st == NM_OK) nm_profile_free(&r);
        break;
    }
    case OP_PLAN_MAKE: {
        nm_plan *r = NULL;
        nm_plan_params pp = nm_plan_default_params();
        pp.device_memory_bytes = 100000; /* the budget's path too */
        st = nm_plan_make(shape(m), c, prof, &pp, &r, err);
        nm_plan_free(r);
        break;
    }
    case OP_PLAN_SAVE:
        st = nm_plan_save(plan, TMP("nomem.plan.json"), err);
        break;
    case OP_PLAN_LOAD: {
        nm_plan *r = NULL;
        st = nm_plan_load(TMP("a.plan.json"), shape(m), &r, err);
        nm_plan_free(r);
        break;
    }
    case OP_COUNT:
        break;
    }
    return st;
}

static void test_alloc_failures(const nm_model *m, const nm_calib *c) {
    nm_profile prof = make_profile(0.05, 0.001);
    nm_error err = {0};
    nm_plan *plan = make_plan(m, c, &prof, NULL);
    if (!plan) return;
    const char *names[OP_COUNT] = {"calib_new", "calib_save", "calib_load", "profile_load",
                                   "plan_make", "plan_save",  "plan_load"};
    for (int o = 0; o < OP_COUNT; o++) {
        int n_failed = 0;
        for (long n = 0; n < 100000; n++) {
            nm_alloc_fail_after(n);
            nm_status st = run_op((op)o, m, c, &prof, plan, &err);
            nm_alloc_fail_after(-1);
            if (st == NM_OK) break;
            if (st != NM_ERR_NOMEM)
                fprintf(stderr, "%s, allocation %ld failing: %s (%s)\n", names[o], n,
                        nm_status_str(st), err.msg);
            CHECK_INT_EQ(st, NM_ERR_NOMEM);
            n_failed++;
        }
        CHECK(n_failed >= 1);
        CHECK_INT_EQ(run_op((op)o, m, c, &prof, plan, &err), NM_OK);
    }
    nm_plan_free(plan);
}

/* ---- the whole path on the tiny model ---- */

static void test_end_to_end(nm_model *m) {
    enum { N_IDS = 100 };
    int32_t ids[N_IDS];
    for (int i = 0; i < N_IDS; i++)
        ids[i] = (int32_t)((i * 37 + 11) % 4000);
    const int n_vocab = m->hp.n_vocab;
    float *dense = malloc((size_t)N_IDS * n_vocab * sizeof(float));
    float *fast = malloc((size_t)N_IDS * n_vocab * sizeof(float));
    nm_error err = {0};
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = 256;
    sp.n_batch = T;
    sp.n_threads = 2;
    nm_session *s = NULL;
    nm_calib *c = NULL;
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
    CHECK_INT_EQ(nm_calib_new(shape(m), T, &c, &err), NM_OK);
    if (!s || !c || !dense || !fast) goto out;
    nm_session_set_load_fn(s, nm_calib_record, c);
    CHECK_INT_EQ(nm_session_eval(s, ids, N_IDS, dense, true, &err), NM_OK);
    nm_session_set_load_fn(s, NULL, NULL);
    CHECK_INT_EQ(c->n_chunks, (N_IDS + T - 1) / T);
    CHECK_INT_EQ(c->n_tokens, N_IDS);
    CHECK_INT_EQ(nm_calib_save(c, TMP("tiny.calib.json"), &err), NM_OK);

    nm_device *dev = NULL;
    nm_pool *pool = NULL;
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "cpu", .n_threads = 1}, &dev, &err),
                 NM_OK);
    CHECK_INT_EQ(nm_pool_new(2, &pool, &err), NM_OK);
    nm_profile prof = {0};
    const int32_t counts[] = {1, 2, 4}, caps[] = {1, 4, 16};
    if (dev && pool) {
        nm_status st = nm_device_profile(dev, &m->layers[0].experts, m->hp.n_embd, m->hp.n_ff_exp,
                                         counts, 3, caps, 3, 3, pool, NULL, NULL, &prof, &err);
        double step_ms = 0;
        int32_t loads[64];
        CHECK(m->hp.n_expert <= 64);
        if (st == NM_OK) st = nm_model_time_host_step(m, pool, T, 3, &step_ms, loads, &err);
        if (st == NM_OK) {
            CHECK(step_ms > 0 && step_ms < 1e3);
            int64_t rows = 0;
            for (int32_t e = 0; e < m->hp.n_expert; e++)
                rows += loads[e];
            CHECK_INT_EQ(rows, (int64_t)T * m->hp.n_expert_used);
            nm_profile_set_overhead(&prof, T, step_ms, loads, m->hp.n_expert);
        }
        if (st) fprintf(stderr, "profile: %s\n", err.msg);
        CHECK_INT_EQ(st, NM_OK);
        CHECK_INT_EQ(prof.chunk, T);
        CHECK(prof.host_overhead_ms >= 0 && prof.host_overhead_ms < 1e3);
    }
    if (prof.points) {
        CHECK_INT_EQ(nm_profile_save(&prof, TMP("cpu.profile.json"), &err), NM_OK);
        nm_profile loaded = {0};
        nm_calib *lc = NULL;
        CHECK_INT_EQ(nm_profile_load(TMP("cpu.profile.json"), &loaded, &err), NM_OK);
        CHECK_INT_EQ(nm_calib_load(TMP("tiny.calib.json"), &lc, &err), NM_OK);
        nm_plan *plan = NULL, *back = NULL;
        if (loaded.points && lc) plan = make_plan(m, lc, &loaded, NULL);
        if (plan) {
            CHECK(strcmp(plan->device, "cpu") == 0);
            CHECK_INT_EQ(nm_plan_save(plan, TMP("tiny.plan.json"), &err), NM_OK);
            CHECK_INT_EQ(nm_plan_load(TMP("tiny.plan.json"), shape(m), &back, &err), NM_OK);
        }
        /* the plan runs, and with spill it computes dense's logits */
        const nm_mode modes[] = {NM_MODE_NPUMOE, NM_MODE_GROUPED};
        for (int i = 0; back && i < 2; i++) {
            nm_session_params fp = sp;
            fp.mode = modes[i];
            fp.plan = back;
            fp.device = dev;
            nm_session *fs = NULL;
            CHECK_INT_EQ(nm_session_new(m, &fp, &fs, &err), NM_OK);
            if (!fs) {
                fprintf(stderr, "session: %s\n", err.msg);
                continue;
            }
            CHECK_INT_EQ(nm_session_eval(fs, ids, N_IDS, fast, true, &err), NM_OK);
            double worst = 0, scale = 0;
            for (size_t j = 0; j < (size_t)N_IDS * n_vocab; j++) {
                worst = fmax(worst, fabs((double)fast[j] - dense[j]));
                scale = fmax(scale, fabs((double)dense[j]));
            }
            CHECK(worst <= 1e-4 * scale);
            if (!(worst <= 1e-4 * scale))
                fprintf(stderr, "%s: max |diff| %g of %g\n", nm_mode_name(modes[i]), worst, scale);
            nm_session_free(fs);
        }
        /* a plan made for another device is refused, naming both */
        if (back) {
            snprintf(back->device, sizeof back->device, "vulkan");
            nm_session_params fp = sp;
            fp.mode = NM_MODE_NPUMOE;
            fp.plan = back;
            fp.device = dev;
            nm_session *fs = NULL;
            CHECK_INT_EQ(nm_session_new(m, &fp, &fs, &err), NM_ERR_INVALID_ARG);
            CHECK(fs == NULL && strstr(err.msg, "device 'vulkan', not for device 'cpu'") != NULL);
            fp.mode = NM_MODE_DENSE; /* dense uses no plan */
            CHECK_INT_EQ(nm_session_new(m, &fp, &fs, &err), NM_OK);
            nm_session_free(fs);
        }
        nm_plan_free(plan);
        nm_plan_free(back);
        nm_calib_free(lc);
        nm_profile_free(&loaded);
        nm_profile_free(&prof);
    }
    nm_pool_free(pool);
    nm_device_close(dev);
out:
    nm_calib_free(c);
    nm_session_free(s);
    free(dense);
    free(fast);
}

int main(void) {
    nm_model *tiny = load_model(TINY);
    if (!tiny) return nm_test_finish("test_plan");
    test_fingerprint(tiny);
    nm_model *other = load_model(TMP("f16.gguf"));

    static raw_loads raw;
    make_loads(&raw);
    nm_calib *c = calib_from(tiny, &raw);
    if (c) {
        test_calib_stats(tiny, &raw, c);
        test_predict_large(tiny);
        test_calib_files(tiny, c);
        test_profile_overhead();
        test_profile_files();
        test_planner_known(tiny);
        test_planner_refusals(tiny, other, c);
        test_planner_random(tiny, c);
        test_allocate_exhaustive(c);
        test_planner_budget(tiny, c);
        test_planner_granule(tiny, c);
        test_plan_files(tiny, other, c);
        test_malformed(tiny, other);
        test_alloc_failures(tiny, c);
    }
    nm_calib_free(c);
    test_end_to_end(tiny);
    nm_model_free(other);
    nm_model_free(tiny);
    return nm_test_finish("test_plan");
}
