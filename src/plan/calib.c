/* Calibration: per layer and expert, the histogram of how many assignments
 * the expert received in each prefill chunk and the sums of its assignments'
 * routing weights ranked by weight within each chunk; their statistics
 * (quantiles, expected overflow at a capacity, in assignments and in
 * weight); and the *.calib.json file, whose sparse histogram and ranked sums
 * are the truth and whose summary numbers are checked against them on load.
 * Not here: running the model to collect loads (the engine calls
 * nm_calib_record through nm_load_fn). */
#include "plan-impl.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The quantiles written beside each histogram, for people. */
static const struct {
    const char *key;
    double q;
} summary_quantiles[] = {{"q50", 0.50}, {"q90", 0.90}, {"q95", 0.95}, {"q99", 0.99}};
enum { N_SUMMARY = sizeof summary_quantiles / sizeof summary_quantiles[0] };

static const int64_t *hist_row(const nm_calib *c, int32_t layer, int32_t expert) {
    NM_ASSERT(layer >= 0 && layer < c->n_layer && expert >= 0 && expert < c->n_expert);
    return c->hist +
           ((size_t)layer * (size_t)c->n_expert + (size_t)expert) * (size_t)(c->chunk + 1);
}

static double *ranked_row(const nm_calib *c, int32_t layer, int32_t expert) {
    NM_ASSERT(layer >= 0 && layer < c->n_layer && expert >= 0 && expert < c->n_expert);
    return c->ranked + ((size_t)layer * (size_t)c->n_expert + (size_t)expert) * (size_t)c->chunk;
}

/* A zeroed calibration of the given shape; the caller fills the rest. */
static nm_status calib_alloc(int32_t chunk, int32_t n_layer, int32_t n_expert, nm_calib **out,
                             nm_error *err) {
    *out = NULL;
    if (chunk < 1 || chunk > NM_PLAN_MAX_CHUNK)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "chunk %d is not in [1, %d]", chunk,
                         NM_PLAN_MAX_CHUNK);
    NM_ASSERT(n_layer >= 1 && n_expert >= 1);
    const int64_t cells = (int64_t)n_layer * n_expert * ((int64_t)chunk + 1);
    if (cells > NM_CALIB_MAX_CELLS)
        return nm_errorf(err, NM_ERR_CAPACITY,
                         "a calibration of %d layers x %d experts x %d loads is over the limit of "
                         "%lld histogram cells",
                         n_layer, n_expert, chunk + 1, (long long)NM_CALIB_MAX_CELLS);
    nm_calib *c = nm_calloc(1, sizeof *c);
    if (c) {
        c->hist = nm_calloc((size_t)cells, sizeof(int64_t));
        c->ranked = nm_calloc((size_t)n_layer * (size_t)n_expert * (size_t)chunk, sizeof(double));
        c->scratch = nm_malloc((size_t)chunk * sizeof(float));
    }
    if (!c || !c->hist || !c->ranked || !c->scratch) {
        nm_calib_free(c);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for a calibration (%lld cells)",
                         (long long)cells);
    }
    c->chunk = chunk;
    c->n_layer = n_layer;
    c->n_expert = n_expert;
    *out = c;
    return NM_OK;
}

nm_status nm_calib_new(const nm_moe_shape *shape, int32_t chunk, nm_calib **out, nm_error *err) {
    NM_ASSERT(shape && out);
    nm_status st = calib_alloc(chunk, shape->n_layer, shape->n_expert, out, err);
    if (st != NM_OK) return st;
    (*out)->fingerprint = shape->fingerprint;
    (*out)->k = shape->k;
    return NM_OK;
}

void nm_calib_free(nm_calib *calib) {
    if (!calib) return;
    nm_free(calib->hist);
    nm_free(calib->ranked);
    nm_free(calib->scratch);
    nm_free(calib);
}

static int by_weight_desc(const void *pa, const void *pb) {
    const float a = *(const float *)pa, b = *(const float *)pb;
    return (a < b) - (a > b);
}

void nm_calib_record(void *ctx, int32_t layer, const int32_t *loads, int32_t n_expert,
                     const float *weights) {
    nm_calib *c = ctx;
    NM_ASSERT(c && loads && weights && n_expert == c->n_expert && layer >= 0 && layer < c->n_layer);
    int64_t sum = 0;
    for (int32_t e = 0; e < n_expert; e++) {
        NM_ASSERT(loads[e] >= 0 && loads[e] <= c->chunk);
        sum += loads[e];
    }
    NM_ASSERT(sum % c->k == 0 && sum <= (int64_t)c->chunk * c->k);
    const float *w = weights;
    for (int32_t e = 0; e < n_expert; e++) {
        c->hist[((size_t)layer * (size_t)n_expert + (size_t)e) * (size_t)(c->chunk + 1) +
                (size_t)loads[e]]++;
        for (int32_t r = 0; r < loads[e]; r++) {
            NM_ASSERT(isfinite(w[r]) && w[r] >= 0.0f);
            c->scratch[r] = w[r];
        }
        qsort(c->scratch, (size_t)loads[e], sizeof(float), by_weight_desc);
        double *rk = ranked_row(c, layer, e);
        for (int32_t r = 0; r < loads[e]; r++)
            rk[r] += (double)c->scratch[r];
        w += loads[e];
    }
    if (layer == 0) {
        c->n_chunks++;
        c->n_tokens += sum / c->k;
    }
}

/* Chunks in the expert's histogram (n_chunks when the calibration is whole). */
static int64_t row_total(const nm_calib *c, const int64_t *h) {
    int64_t n = 0;
    for (int32_t x = 0; x <= c->chunk; x++)
        n += h[x];
    return n;
}

int32_t nm_calib_quantile(const nm_calib *calib, int32_t layer, int32_t expert, double q) {
    NM_ASSERT(q >= 0.0 && q <= 1.0);
    const int64_t *h = hist_row(calib, layer, expert);
    const int64_t n = row_total(calib, h);
    if (n == 0) return 0;
    const double need = q * (double)n;
    int64_t cum = 0;
    for (int32_t x = 0; x <= calib->chunk; x++) {
        cum += h[x];
        if ((double)cum >= need) return x;
    }
    return calib->chunk; /* unreachable: cum reaches n >= need */
}

double nm_calib_mean(const nm_calib *calib, int32_t layer, int32_t expert) {
    const int64_t *h = hist_row(calib, layer, expert);
    double sum = 0, n = 0;
    for (int32_t x = 0; x <= calib->chunk; x++) {
        sum += (double)x * (double)h[x];
        n += (double)h[x];
    }
    return n > 0 ? sum / n : 0.0;
}

int32_t nm_calib_max(const nm_calib *calib, int32_t layer, int32_t expert) {
    const int64_t *h = hist_row(calib, layer, expert);
    for (int32_t x = calib->chunk; x > 0; x--)
        if (h[x]) return x;
    return 0;
}

double nm_calib_overflow(const nm_calib *calib, int32_t layer, int32_t expert, int32_t capacity) {
    NM_ASSERT(capacity >= 0);
    const int64_t *h = hist_row(calib, layer, expert);
    double over = 0, n = 0;
    for (int32_t x = 0; x <= calib->chunk; x++) {
        n += (double)h[x];
        if (x > capacity) over += (double)(x - capacity) * (double)h[x];
    }
    return n > 0 ? over / n : 0.0;
}

double nm_calib_overflow_weight(const nm_calib *calib, int32_t layer, int32_t expert,
                                int32_t capacity) {
    NM_ASSERT(capacity >= 0);
    const double *rk = ranked_row(calib, layer, expert);
    const double n = (double)row_total(calib, hist_row(calib, layer, expert));
    double over = 0;
    for (int32_t r = calib->chunk - 1; r >= capacity; r--) /* small terms first */
        over += rk[r];
    return n > 0 ? over / n : 0.0;
}

void nm_calib_predict_overflow(const nm_calib *calib, int32_t layer, int32_t expert, bool by_weight,
                               double *out) {
    const int32_t T = calib->chunk;
    const int64_t *h = hist_row(calib, layer, expert);
    const double *rk = ranked_row(calib, layer, expert);
    const double n = (double)row_total(calib, h);
    /* out[r] first holds P(load >= r) under the Poisson mixture, r = 0..T
     * (a load is at most T: the tail beyond folds into T) */
    for (int32_t r = 0; r <= T; r++)
        out[r] = 0;
    for (int32_t x = 0; n > 0 && x <= T; x++) {
        if (!h[x]) continue;
        const double share = (double)h[x] / n, log_x = log((double)x);
        double cdf = 0; /* P(Poisson(x) < r) */
        for (int32_t r = 0; r <= T; r++) {
            const double tail = fmax(0.0, 1.0 - cdf);
            if (r > x && tail < 1e-17) break; /* the rest adds nothing a double keeps */
            out[r] += share * tail;
            /* in logs: exp(-x) underflows for loads past 745 */
            cdf += x == 0 ? (r == 0) : exp((double)r * log_x - (double)x - lgamma((double)r + 1));
        }
    }
    /* out[r] becomes what rank r (1-based) loses when dropped: P(load >= r)
     * times, by weight, the mean weight of the r-th heaviest assignment over
     * the chunks that reach rank r, never above the rank before's; past the
     * largest load, the last rank's */
    double w = INFINITY, n_ge = n;
    for (int32_t r = 1; r <= T; r++) {
        n_ge -= (double)h[r - 1]; /* chunks with load >= r */
        if (by_weight && n_ge > 0) w = fmin(w, rk[r - 1] / n_ge);
        out[r] *= by_weight ? (isfinite(w) ? w : 0.0) : 1.0;
    }
    /* out[c] = the sum over the ranks beyond c */
    double beyond = 0;
    for (int32_t c = T; c >= 0; c--) {
        const double loss = c >= 1 ? out[c] : 0.0;
        out[c] = beyond;
        beyond += loss;
    }
}

double nm_calib_p_active(const nm_calib *calib, int32_t layer, int32_t expert) {
    const int64_t *h = hist_row(calib, layer, expert);
    const int64_t n = row_total(calib, h);
    return n > 0 ? (double)(n - h[0]) / (double)n : 0.0;
}

nm_status nm_calib_check_shape(const nm_calib *calib, const nm_moe_shape *shape, nm_error *err) {
    if (strcmp(shape->fingerprint.hex, calib->fingerprint.hex) != 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the calibration was made on another model (fingerprint %s; this model "
                         "is %s)",
                         calib->fingerprint.hex, shape->fingerprint.hex);
    if (calib->n_layer != shape->n_layer || calib->n_expert != shape->n_expert ||
        calib->k != shape->k)
        return nm_errorf(err, NM_ERR_INVALID_ARG,
                         "the calibration has %d layers of %d experts top-%d, the model %d of %d "
                         "top-%d",
                         calib->n_layer, calib->n_expert, calib->k, shape->n_layer, shape->n_expert,
                         shape->k);
    return NM_OK;
}

/* ---- the file ---- */

/* One expert's object: its summaries, its sparse histogram as [load,
 * count] pairs, its ranked sums; NULL when memory ran out. */
static json_t *expert_object(const nm_calib *calib, int32_t l, int32_t e) {
    json_t *o = json_object(), *hist = json_array(), *ranked = json_array();
    bool ok = nm_json_put(o, "mean", nm_json_num(nm_calib_mean(calib, l, e))) &&
              nm_json_put(o, "max", json_integer(nm_calib_max(calib, l, e)));
    for (int i = 0; ok && i < N_SUMMARY; i++)
        ok = nm_json_put(o, summary_quantiles[i].key,
                         json_integer(nm_calib_quantile(calib, l, e, summary_quantiles[i].q)));
    ok = nm_json_put(o, "hist", hist) && ok;
    ok = nm_json_put(o, "ranked", ranked) && ok;
    const int64_t *h = hist_row(calib, l, e);
    for (int32_t x = 0; ok && x <= calib->chunk; x++)
        if (h[x]) ok = nm_json_push(hist, json_pack("[iI]", (int)x, (json_int_t)h[x]));
    const double *rk = ranked_row(calib, l, e);
    for (int32_t r = 0; ok && r < nm_calib_max(calib, l, e); r++)
        ok = nm_json_push(ranked, nm_json_num(rk[r]));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

nm_status nm_calib_save_memory(const nm_calib *calib, char **text, size_t *n_bytes, nm_error *err) {
    NM_ASSERT(calib && text && n_bytes);
    *text = NULL;
    for (int32_t l = 0; l < calib->n_layer; l++)
        for (int32_t e = 0; e < calib->n_expert; e++) {
            const int64_t n = row_total(calib, hist_row(calib, l, e));
            if (n != calib->n_chunks)
                return nm_errorf(err, NM_ERR_INVALID_ARG,
                                 "layer %d expert %d recorded %lld chunks, layer 0 %lld: the "
                                 "calibration stopped inside a forward pass",
                                 l, e, (long long)n, (long long)calib->n_chunks);
        }
    /* each container is attached before it is filled, so that freeing
     * root frees everything whatever failed */
    json_t *root = json_object(), *layers = json_array();
    bool ok = nm_json_put(root, "format", json_string(NM_CALIB_FORMAT)) &&
              nm_json_put(root, "version", json_integer(NM_CALIB_FILE_VERSION)) &&
              nm_json_put(root, "fingerprint", json_string(calib->fingerprint.hex)) &&
              nm_json_put(root, "chunk", json_integer(calib->chunk)) &&
              nm_json_put(root, "k", json_integer(calib->k)) &&
              nm_json_put(root, "n_layer", json_integer(calib->n_layer)) &&
              nm_json_put(root, "n_expert", json_integer(calib->n_expert)) &&
              nm_json_put(root, "n_chunks", json_integer(calib->n_chunks)) &&
              nm_json_put(root, "n_tokens", json_integer(calib->n_tokens));
    ok = nm_json_put(root, "layers", layers) && ok;
    for (int32_t l = 0; ok && l < calib->n_layer; l++) {
        json_t *lo = json_object(), *experts = json_array();
        ok = nm_json_put(lo, "experts", experts);
        ok = nm_json_push(layers, lo) && ok;
        for (int32_t e = 0; ok && e < calib->n_expert; e++)
            ok = nm_json_push(experts, expert_object(calib, l, e));
    }
    return nm_json_print(root, ok, "calibration", text, n_bytes, err);
}

nm_status nm_calib_save(const nm_calib *calib, const char *path, nm_error *err) {
    NM_ASSERT(path);
    char *text = NULL;
    size_t n_bytes = 0;
    nm_status st = nm_calib_save_memory(calib, &text, &n_bytes, err);
    return nm_plan_save_text(path, st, text, n_bytes, err);
}

/* One expert's histogram from its object; checks the summaries. */
static nm_status read_expert(const json_t *obj, nm_calib *c, int32_t l, int32_t e,
                             uint64_t *assignments, nm_error *err) {
    char where[64];
    snprintf(where, sizeof where, "layers[%d].experts[%d]", l, e);
    const json_t *hist;
    nm_status st = nm_json_get_arr(obj, "hist", &hist, where, err);
    if (st != NM_OK) return st;
    int64_t *h = c->hist + ((size_t)l * (size_t)c->n_expert + (size_t)e) * (size_t)(c->chunk + 1);
    int64_t total = 0, prev = -1;
    for (size_t i = 0; i < json_array_size(hist); i++) {
        const json_t *pair = json_array_get(hist, i);
        char at[112];
        snprintf(at, sizeof at, "%s.hist[%zu]", where, i);
        if (!json_is_array(pair) || json_array_size(pair) != 2)
            return nm_errorf(err, NM_ERR_FORMAT, "%s: expected a pair [load, count]", at);
        int64_t load, count;
        if ((st = nm_json_as_int(json_array_get(pair, 0), 0, c->chunk, &load, at, err)) ||
            (st = nm_json_as_int(json_array_get(pair, 1), 1, NM_CALIB_MAX_CHUNKS, &count, at, err)))
            return st;
        if (load <= prev)
            return nm_errorf(err, NM_ERR_FORMAT,
                             "%s: load %lld after load %lld; loads must be strictly ascending", at,
                             (long long)load, (long long)prev);
        prev = load;
        total += count;
        if (total > c->n_chunks) break; /* reported below; keeps the sums small */
        h[load] = count;
        *assignments += (uint64_t)load * (uint64_t)count;
    }
    if (total != c->n_chunks)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "layer %d expert %d: the histogram counts %s%lld chunks, n_chunks is %lld",
                         l, e, total > c->n_chunks ? "at least " : "", (long long)total,
                         (long long)c->n_chunks);

    /* ranked[r]: the sum over chunks of the (r+1)-th heaviest weight, one
     * per rank up to the largest load; it cannot grow with r, since each
     * chunk's weights are sorted and fewer chunks reach a higher rank (the
     * tolerance covers the rounding of sums over different chunks) */
    const json_t *ranked;
    if ((st = nm_json_get_arr(obj, "ranked", &ranked, where, err))) return st;
    const int32_t max = nm_calib_max(c, l, e);
    if (json_array_size(ranked) != (size_t)max)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "%s.ranked: %zu entries, expected one per rank up to the largest load, %d",
                         where, json_array_size(ranked), max);
    double *rk = ranked_row(c, l, e);
    for (int32_t r = 0; r < max; r++) {
        char at[112];
        snprintf(at, sizeof at, "%s.ranked[%d]", where, r);
        if ((st = nm_json_as_num(json_array_get(ranked, (size_t)r), 0, 1e18, &rk[r], at, err)))
            return st;
        if (r > 0 && rk[r] > rk[r - 1] * (1 + 1e-9) + 1e-12)
            return nm_errorf(err, NM_ERR_FORMAT,
                             "%s: %.17g after %.17g; the weights ranked by weight cannot grow", at,
                             rk[r], rk[r - 1]);
    }

    double mean;
    int64_t v;
    if ((st = nm_json_get_num(obj, "mean", 0, c->chunk, &mean, where, err))) return st;
    if (!nm_plan_close(mean, nm_calib_mean(c, l, e)))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "layer %d expert %d: mean %.17g disagrees with the histogram's %.17g", l,
                         e, mean, nm_calib_mean(c, l, e));
    if ((st = nm_json_get_int(obj, "max", 0, c->chunk, &v, where, err))) return st;
    if (v != nm_calib_max(c, l, e))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "layer %d expert %d: max %lld disagrees with the histogram's %d", l, e,
                         (long long)v, nm_calib_max(c, l, e));
    for (int i = 0; i < N_SUMMARY; i++) {
        if ((st = nm_json_get_int(obj, summary_quantiles[i].key, 0, c->chunk, &v, where, err)))
            return st;
        const int32_t want = nm_calib_quantile(c, l, e, summary_quantiles[i].q);
        if (v != want)
            return nm_errorf(err, NM_ERR_FORMAT,
                             "layer %d expert %d: %s %lld disagrees with the histogram's %d", l, e,
                             summary_quantiles[i].key, (long long)v, want);
    }
    return NM_OK;
}

/* Shape first (so nothing is allocated for a file that lies about it),
 * then every histogram. */
static nm_status read_calib(const json_t *root, void *ctx, nm_error *err) {
    nm_calib **out = ctx;
    nm_status st = nm_plan_json_header(root, NM_CALIB_FORMAT, NM_CALIB_FILE_VERSION,
                                       "recalibrate with `npumoe calibrate` (the planner needs "
                                       "the routing weights that newer calibrations record)",
                                       err);
    if (st != NM_OK) return st;
    nm_fingerprint fp;
    int64_t chunk, k, n_layer, n_expert, n_chunks, n_tokens;
    const json_t *layers;
    if ((st = nm_plan_json_fingerprint(root, &fp, err)) ||
        (st = nm_json_get_int(root, "chunk", 1, NM_PLAN_MAX_CHUNK, &chunk, NULL, err)) ||
        (st = nm_json_get_int(root, "n_layer", 1, NM_PLAN_MAX_LAYERS, &n_layer, NULL, err)) ||
        (st = nm_json_get_int(root, "n_expert", 1, NM_PLAN_MAX_EXPERTS, &n_expert, NULL, err)) ||
        (st = nm_json_get_int(root, "k", 1, n_expert, &k, NULL, err)) ||
        (st = nm_json_get_int(root, "n_chunks", 0, NM_CALIB_MAX_CHUNKS, &n_chunks, NULL, err)) ||
        (st =
             nm_json_get_int(root, "n_tokens", n_chunks, n_chunks * chunk, &n_tokens, NULL, err)) ||
        (st = nm_json_get_arr(root, "layers", &layers, NULL, err)))
        return st;
    if (json_array_size(layers) != (size_t)n_layer)
        return nm_errorf(err, NM_ERR_FORMAT, "layers: %zu entries, n_layer is %lld",
                         json_array_size(layers), (long long)n_layer);
    for (int32_t l = 0; l < n_layer; l++) {
        char where[32];
        snprintf(where, sizeof where, "layers[%d]", l);
        const json_t *experts;
        if ((st = nm_json_get_arr(json_array_get(layers, (size_t)l), "experts", &experts, where, err)))
            return st;
        if (json_array_size(experts) != (size_t)n_expert)
            return nm_errorf(err, NM_ERR_FORMAT, "%s.experts: %zu entries, n_expert is %lld", where,
                             json_array_size(experts), (long long)n_expert);
        for (int32_t e = 0; e < n_expert; e++)
            if (!json_is_object(json_array_get(experts, (size_t)e)))
                return nm_errorf(err, NM_ERR_FORMAT, "%s.experts[%d]: expected an object", where,
                                 e);
    }

    nm_calib *c = NULL;
    if ((st = calib_alloc((int32_t)chunk, (int32_t)n_layer, (int32_t)n_expert, &c, err))) return st;
    c->fingerprint = fp;
    c->k = (int32_t)k;
    c->n_chunks = n_chunks;
    c->n_tokens = n_tokens;
    for (int32_t l = 0; l < c->n_layer && st == NM_OK; l++) {
        const json_t *experts = json_object_get(json_array_get(layers, (size_t)l), "experts");
        uint64_t assignments = 0;
        for (int32_t e = 0; e < c->n_expert && st == NM_OK; e++)
            st = read_expert(json_array_get(experts, (size_t)e), c, l, e, &assignments, err);
        /* n_tokens * k <= 2^31 * 2^16 * 2^16: no overflow in uint64 */
        if (st == NM_OK && assignments != (uint64_t)n_tokens * (uint64_t)k)
            st = nm_errorf(err, NM_ERR_FORMAT,
                           "layer %d: the experts received %llu assignments in all, but n_tokens "
                           "%lld x k %lld = %llu",
                           l, (unsigned long long)assignments, (long long)n_tokens, (long long)k,
                           (unsigned long long)((uint64_t)n_tokens * (uint64_t)k));
    }
    if (st != NM_OK) {
        nm_calib_free(c);
        return st;
    }
    *out = c;
    return NM_OK;
}

nm_status nm_calib_load(const char *path, nm_calib **out, nm_error *err) {
    NM_ASSERT(path && out);
    *out = NULL;
    return nm_plan_read_file(path, read_calib, out, err);
}

nm_status nm_calib_load_memory(const char *text, size_t n_bytes, const char *name, nm_calib **out,
                               nm_error *err) {
    NM_ASSERT(out);
    *out = NULL;
    return nm_plan_read_memory(text, n_bytes, name, read_calib, out, err);
}
