/* The per-layer tap (nm_session_set_tap) on tiny-qwen3moe (F32) and
 * tiny-phimoe (LayerNorm and biases, as trained; an F16 head): a tap does not change the
 * logits (bit for bit); every batch reports each layer's tensors once, in
 * order, with the batch's real rows and each tensor's width, then the
 * output's for the rows whose logits were asked for (padding rows of a
 * static chunk never); the last layer's l_out through the final norm and
 * head, computed here in double from the model's weights, gives the logits
 * (relative 1e-5 of the row's largest); a tap returning false stops the
 * evaluation with NM_ERR_INVALID_ARG naming where, keeps the batches before,
 * and the session goes on to the same logits as one never stopped. */
#include "harness.h"

#include "engine/engine.h"
#include "model/model.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_IDS = 512, MAX_EVENTS = 4096, N_NAMES = 10 };

static const char *const layer_names[N_NAMES] = {
    "attn_norm", "Qcur",     "Kcur",           "Vcur",        "kqv_out",
    "ffn_inp",   "ffn_norm", "ffn_moe_logits", "ffn_moe_out", "l_out"};

/* What a tap saw: each call's layer, name and shape, the last layer's l_out
 * rows and the result tensors. stop_layer/stop_name: where to answer false
 * (stop_at calls into the evaluation, or never when stop_name is NULL). */
typedef struct recorder {
    int n;
    int32_t layer[MAX_EVENTS];
    const char *name[MAX_EVENTS];
    int32_t rows[MAX_EVENTS];
    int64_t cols[MAX_EVENTS];
    int32_t last_layer;
    float *l_out;         /* [rows][n_embd] of the last layer, latest batch */
    float *result_norm;   /* [rows][n_embd], latest batch */
    float *result_output; /* [rows][n_vocab], latest batch */
    int32_t stop_layer;
    const char *stop_name;
    int stop_skip; /* matching calls to let pass before stopping */
} recorder;

static bool record(void *ctx, int32_t layer, const char *name, const float *values, int32_t n_rows,
                   int64_t n_cols) {
    recorder *r = ctx;
    if (r->n < MAX_EVENTS) {
        r->layer[r->n] = layer;
        r->name[r->n] = name;
        r->rows[r->n] = n_rows;
        r->cols[r->n] = n_cols;
        r->n++;
    }
    const size_t bytes = (size_t)n_rows * (size_t)n_cols * sizeof(float);
    if (layer == r->last_layer && strcmp(name, "l_out") == 0) memcpy(r->l_out, values, bytes);
    if (layer == -1 && strcmp(name, "result_norm") == 0) memcpy(r->result_norm, values, bytes);
    if (layer == -1 && strcmp(name, "result_output") == 0) memcpy(r->result_output, values, bytes);
    if (r->stop_name && layer == r->stop_layer && strcmp(name, r->stop_name) == 0)
        return r->stop_skip-- > 0;
    return true;
}

static void recorder_init(recorder *r, const nm_model *m) {
    memset(r, 0, sizeof *r);
    r->last_layer = m->hp.n_layer - 1;
    const size_t d = (size_t)m->hp.n_embd, nv = (size_t)m->hp.n_vocab;
    r->l_out = malloc(MAX_IDS * d * sizeof(float));
    r->result_norm = malloc(MAX_IDS * d * sizeof(float));
    r->result_output = malloc(MAX_IDS * nv * sizeof(float));
}

static void recorder_free(recorder *r) {
    free(r->l_out);
    free(r->result_norm);
    free(r->result_output);
}

static int64_t layer_cols(const nm_hparams *hp, int i) {
    const int64_t q = (int64_t)hp->n_head * hp->head_dim,
                  kv = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t cols[N_NAMES] = {hp->n_embd, q,          kv,           kv,         q,
                                   hp->n_embd, hp->n_embd, hp->n_expert, hp->n_embd, hp->n_embd};
    return cols[i];
}

/* The events of one eval of batches rows[0..n_batches), each reporting
 * every layer and then, when out_rows[b] > 0, the result tensors. */
static void check_events(const recorder *r, const nm_hparams *hp, const int32_t *rows,
                         const int32_t *out_rows, int n_batches, const char *what) {
    int e = 0, bad = 0;
    for (int b = 0; b < n_batches; b++) {
        for (int32_t l = 0; l < hp->n_layer; l++)
            for (int i = 0; i < N_NAMES; i++, e++)
                bad += e >= r->n || r->layer[e] != l || strcmp(r->name[e], layer_names[i]) != 0 ||
                       r->rows[e] != rows[b] || r->cols[e] != layer_cols(hp, i);
        if (out_rows[b] == 0) continue;
        bad += e >= r->n || r->layer[e] != -1 || strcmp(r->name[e], "result_norm") != 0 ||
               r->rows[e] != out_rows[b] || r->cols[e] != hp->n_embd;
        e++;
        bad += e >= r->n || r->layer[e] != -1 || strcmp(r->name[e], "result_output") != 0 ||
               r->rows[e] != out_rows[b] || r->cols[e] != hp->n_vocab;
        e++;
    }
    printf("%s: %d tap calls, %d expected, %d wrong\n", what, r->n, e, bad);
    CHECK_INT_EQ(r->n, e);
    CHECK_INT_EQ(bad, 0);
}

/* The final norm and head in double from the model's weights (the head's
 * rows widened to F32 by the tensor part): RMSNorm
 * or LayerNorm (mean removed, biased variance) times the weight plus the
 * bias, then the output rows plus their bias. */
static void reference_head(const nm_model *m, const float *x, double *norm, double *logits) {
    const nm_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd;
    double mean = 0, sq = 0;
    if (hp->norm == NM_NORM_LAYER) {
        for (int64_t i = 0; i < d; i++)
            mean += x[i];
        mean /= (double)d;
    }
    for (int64_t i = 0; i < d; i++)
        sq += (x[i] - mean) * (x[i] - mean);
    const double scale = 1.0 / sqrt(sq / (double)d + hp->rms_eps);
    for (int64_t i = 0; i < d; i++)
        norm[i] = (x[i] - mean) * scale * m->output_norm[i] +
                  (m->output_norm_b ? m->output_norm_b[i] : 0.0);
    float *w = malloc((size_t)d * sizeof(float));
    for (int32_t j = 0; j < hp->n_vocab; j++) {
        nm_dequantize_row((nm_dtype)m->output.type,
                          (const uint8_t *)m->output.data + (size_t)j * m->output.row_bytes, w, d);
        double s = m->output_b ? m->output_b[j] : 0.0;
        for (int64_t i = 0; i < d; i++)
            s += norm[i] * w[i];
        logits[j] = s;
    }
    free(w);
}

/* max |got - want| / max |want| over n values. */
static double rel_err_d(const float *got, const double *want, int64_t n) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(got[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    return worst / scale;
}

static nm_session *session(nm_model *m, int32_t n_batch, nm_kv_type kv, nm_mode mode,
                           const nm_plan *plan, nm_device *dev) {
    nm_session_params sp = nm_session_default_params();
    sp.n_ctx = MAX_IDS;
    sp.n_batch = n_batch;
    sp.n_threads = 2;
    sp.kv_type = kv;
    sp.mode = mode;
    sp.plan = plan;
    sp.device = dev;
    nm_session *s = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_session_new(m, &sp, &s, &err), NM_OK);
    return s;
}

/* Taps change nothing and report every batch: n tokens in batches of 16,
 * all logits, then one decode step asking for the last row only. */
static void test_reports(nm_model *m, const int32_t *ids, int n, nm_kv_type kv, nm_mode mode,
                         const nm_plan *plan, nm_device *dev, const char *what) {
    const int nv = m->hp.n_vocab;
    float *plain = malloc((size_t)(n + 1) * nv * sizeof(float));
    float *tapped = malloc((size_t)(n + 1) * nv * sizeof(float));
    nm_error err = {0};
    nm_session *a = session(m, 16, kv, mode, plan, dev), *b = session(m, 16, kv, mode, plan, dev);
    if (!a || !b) return;
    CHECK_INT_EQ(nm_session_eval(a, ids, n, plain, true, &err), NM_OK);
    CHECK_INT_EQ(nm_session_eval(a, ids + n, 1, plain + (size_t)n * nv, false, &err), NM_OK);

    static recorder r;
    recorder_init(&r, m);
    nm_session_set_tap(b, record, &r);
    CHECK_INT_EQ(nm_session_eval(b, ids, n, tapped, true, &err), NM_OK);
    int32_t rows[MAX_IDS / 16 + 1], out_rows[MAX_IDS / 16 + 1];
    int nb = 0;
    for (int done = 0; done < n; done += rows[nb++])
        out_rows[nb] = rows[nb] = n - done < 16 ? n - done : 16;
    check_events(&r, &m->hp, rows, out_rows, nb, what);
    /* the last batch's l_out through the head gives its logits */
    const int32_t last = rows[nb - 1];
    double *norm = malloc((size_t)m->hp.n_embd * sizeof(double));
    double *want = malloc((size_t)nv * sizeof(double));
    double worst_logits = 0, worst_norm = 0, worst_tap = 0;
    for (int32_t t = 0; t < last; t++) {
        reference_head(m, r.l_out + (size_t)t * m->hp.n_embd, norm, want);
        const float *got = tapped + (size_t)(n - last + t) * nv;
        worst_logits = fmax(worst_logits, rel_err_d(got, want, nv));
        worst_norm = fmax(worst_norm,
                          rel_err_d(r.result_norm + (size_t)t * m->hp.n_embd, norm, m->hp.n_embd));
        worst_tap = fmax(worst_tap, memcmp(r.result_output + (size_t)t * nv, got,
                                           (size_t)nv * sizeof(float)) != 0);
    }
    printf("%s: l_out through the head vs logits %.3g, result_norm %.3g\n", what, worst_logits,
           worst_norm);
    CHECK(worst_logits < 1e-5);
    CHECK(worst_norm < 1e-5);
    CHECK(worst_tap == 0); /* result_output is the logits returned */

    r.n = 0;
    CHECK_INT_EQ(nm_session_eval(b, ids + n, 1, tapped + (size_t)n * nv, false, &err), NM_OK);
    const int32_t one = 1;
    check_events(&r, &m->hp, &one, &one, 1, "  decode step");
    CHECK(memcmp(plain, tapped, (size_t)(n + 1) * nv * sizeof(float)) == 0);

    /* no logits asked for: the layers only */
    nm_session_reset(b);
    r.n = 0;
    CHECK_INT_EQ(nm_session_eval(b, ids, 5, NULL, false, &err), NM_OK);
    const int32_t five = 5, none = 0;
    check_events(&r, &m->hp, &five, &none, 1, "  no logits");
    /* none set again: no more calls */
    nm_session_set_tap(b, NULL, NULL);
    r.n = 0;
    CHECK_INT_EQ(nm_session_eval(b, ids + 5, 3, NULL, false, &err), NM_OK);
    CHECK_INT_EQ(r.n, 0);
    free(norm);
    free(want);
    recorder_free(&r);
    nm_session_free(a);
    nm_session_free(b);
    free(plain);
    free(tapped);
}

/* A tap answering false in the second batch: an error naming the place,
 * the first batch kept, and the session then goes on to the logits of one
 * never stopped. */
static void test_stop(nm_model *m, const int32_t *ids, int n) {
    const int nv = m->hp.n_vocab;
    float *want = malloc((size_t)nv * sizeof(float)), *got = malloc((size_t)nv * sizeof(float));
    nm_error err = {0};
    nm_session *a = session(m, 16, NM_KV_F32, NM_MODE_DENSE, NULL, NULL);
    nm_session *b = session(m, 16, NM_KV_F32, NM_MODE_DENSE, NULL, NULL);
    if (!a || !b) return;
    CHECK_INT_EQ(nm_session_eval(a, ids, n, want, false, &err), NM_OK);
    static recorder r;
    recorder_init(&r, m);
    r.stop_layer = 1;
    r.stop_name = "ffn_moe_logits";
    r.stop_skip = 1; /* the first batch passes */
    nm_session_set_tap(b, record, &r);
    CHECK_INT_EQ(nm_session_eval(b, ids, n, got, false, &err), NM_ERR_INVALID_ARG);
    printf("stopped: %s\n", err.msg);
    CHECK(strstr(err.msg, "layer 1") != NULL && strstr(err.msg, "ffn_moe_logits") != NULL);
    CHECK_INT_EQ(nm_session_n_past(b), 16);
    /* the stopped batch's calls: layer 0, then layer 1 up to the logits */
    CHECK_INT_EQ(r.n, N_NAMES * m->hp.n_layer + N_NAMES + 8);
    nm_session_set_tap(b, NULL, NULL);
    CHECK_INT_EQ(nm_session_eval(b, ids + 16, n - 16, got, false, &err), NM_OK);
    CHECK(memcmp(want, got, (size_t)nv * sizeof(float)) == 0);
    recorder_free(&r);
    nm_session_free(a);
    nm_session_free(b);
    free(want);
    free(got);
}

static nm_model *load(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/model.gguf", NM_VECTORS_DIR, name);
    nm_model *m = NULL;
    nm_error err = {0};
    nm_status st = nm_model_load(path, NULL, &m, &err);
    if (st != NM_OK) fprintf(stderr, "%s: %s\n", path, err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return m;
}

int main(void) {
    int32_t ids[MAX_IDS];
    const int n = nm_test_read_ints(NM_VECTORS_DIR "/tiny-qwen3moe/prompts.txt", 3, ids, MAX_IDS);
    CHECK_INT_EQ(n, 100); /* 6 batches of 16 and one of 4 */
    nm_model *m = load("tiny-qwen3moe");
    if (!m || n != 100) return nm_test_finish("test_tap");
    test_reports(m, ids, n - 1, NM_KV_F32, NM_MODE_DENSE, NULL, NULL, "qwen3moe dense f32");
    test_reports(m, ids, n - 1, NM_KV_F16, NM_MODE_DENSE, NULL, NULL, "qwen3moe dense f16");
    /* a static chunk pads the last batch to 16 rows: the tap sees 3 */
    nm_device *dev = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "cpu", .n_threads = 1}, &dev, &err), NM_OK);
    static nm_test_plan full;
    nm_test_parity_plan(&full, 16, m->hp.n_layer, m->hp.n_expert, 16, true, NM_OVERFLOW_DROP,
                        NM_SALIENCE_ROUTER);
    if (dev)
        test_reports(m, ids, n - 1, NM_KV_F32, NM_MODE_GROUPED, &full.plan, dev,
                     "qwen3moe grouped");
    test_stop(m, ids, n);
    nm_device_close(dev);
    nm_model_free(m);

    m = load("tiny-phimoe");
    if (m) {
        const int np =
            nm_test_read_ints(NM_VECTORS_DIR "/tiny-phimoe/prompts.txt", 2, ids, MAX_IDS);
        CHECK_INT_EQ(np, 32); /* batches of 16 and 15, then a decode step */
        if (np == 32) test_reports(m, ids, np - 1, NM_KV_F32, NM_MODE_DENSE, NULL, NULL, "phimoe");
        nm_model_free(m);
    }
    return nm_test_finish("test_tap");
}
