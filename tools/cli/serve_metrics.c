/* npumoe serve's GET /metrics: counters kept since the start (requests by
 * route and status, tokens, how requests ended), histograms of the time to
 * the first token and of the decode speed, the slots and queue, and the
 * static path's counters when a plan is loaded, in Prometheus's text
 * exposition format (version 0.0.4). */
#include "serve.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const metrics_route_names[ROUTE_COUNT] = {
    "/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/metrics", "other"};

/* Upper bounds of the buckets (the last one, +Inf, is implied). */
static const double ttft_bounds[TTFT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                 0.5,   1,    2.5,   5,    10,  30};
static const double speed_bounds[SPEED_BUCKETS] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000};
static const char *const finish_names[4] = {"stop", "length", "cancelled", "error"};

void metrics_init(metrics *m, int slots) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
    m->slots = slots;
}

void metrics_destroy(metrics *m) { pthread_mutex_destroy(&m->lock); }

void metrics_request(metrics *m, int route, unsigned status) {
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < STATUS_SLOTS; i++) {
        if (m->requests[i].n && (m->requests[i].route != route || m->requests[i].status != status))
            continue;
        m->requests[i].route = route;
        m->requests[i].status = status;
        m->requests[i].n++;
        break; /* more pairs than slots (never with these routes): not counted */
    }
    pthread_mutex_unlock(&m->lock);
}

static void observe(uint64_t *buckets, const double *bounds, int n, double v) {
    int i = 0;
    while (i < n && v > bounds[i])
        i++;
    buckets[i]++;
}

void metrics_finished(metrics *m, finish_kind kind, size_t prompt, int32_t generated, double ttft_s,
                      double tokens_per_s) {
    pthread_mutex_lock(&m->lock);
    m->finished[kind]++;
    m->prompt_tokens += prompt;
    m->generated_tokens += (uint64_t)(generated > 0 ? generated : 0);
    if (ttft_s >= 0) {
        observe(m->ttft, ttft_bounds, TTFT_BUCKETS, ttft_s);
        m->ttft_sum += ttft_s;
        m->ttft_n++;
    }
    if (tokens_per_s >= 0) {
        observe(m->speed, speed_bounds, SPEED_BUCKETS, tokens_per_s);
        m->speed_sum += tokens_per_s;
        m->speed_n++;
    }
    pthread_mutex_unlock(&m->lock);
}

void metrics_step(metrics *m, int rows) {
    pthread_mutex_lock(&m->lock);
    m->decode_steps++;
    m->decode_rows += (uint64_t)rows;
    pthread_mutex_unlock(&m->lock);
}

/* printf onto a growing string; false when out of memory. */
typedef struct text {
    char *s;
    size_t len, cap;
    bool failed;
} text;

static void put(text *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    for (int pass = 0; pass < 2 && !t->failed; pass++) {
        va_start(ap, fmt);
        const int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
        } else if (t->s && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        } else {
            const size_t cap = (t->cap + (size_t)n + 1) * 2;
            char *p = realloc(t->s, cap);
            if (!p) t->failed = true;
            t->s = p ? p : t->s;
            t->cap = p ? cap : t->cap;
        }
    }
}

static void histogram(text *t, const char *name, const char *help, const uint64_t *buckets,
                      const double *bounds, int n, double sum, uint64_t count) {
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < n; i++) {
        cum += buckets[i];
        put(t, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
    }
    cum += buckets[n];
    put(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
        (unsigned long long)cum, name, sum, name, (unsigned long long)count);
}

static void scalar(text *t, const char *type, const char *name, const char *help, double v) {
    put(t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *metrics_text(metrics *m) {
    text t = {0};
    pthread_mutex_lock(&m->lock);
    put(&t, "# HELP npumoe_requests_total HTTP requests answered, by route and status.\n"
            "# TYPE npumoe_requests_total counter\n");
    for (int i = 0; i < STATUS_SLOTS && m->requests[i].n; i++)
        put(&t, "npumoe_requests_total{route=\"%s\",status=\"%u\"} %llu\n",
            metrics_route_names[m->requests[i].route], m->requests[i].status,
            (unsigned long long)m->requests[i].n);
    put(&t, "# HELP npumoe_completions_total Completion requests that ended, by how.\n"
            "# TYPE npumoe_completions_total counter\n");
    for (int i = 0; i < 4; i++)
        put(&t, "npumoe_completions_total{finish=\"%s\"} %llu\n", finish_names[i],
            (unsigned long long)m->finished[i]);
    scalar(&t, "counter", "npumoe_prompt_tokens_total", "Prompt tokens of ended completions.",
           (double)m->prompt_tokens);
    scalar(&t, "counter", "npumoe_generated_tokens_total", "Tokens generated (sampled).",
           (double)m->generated_tokens);
    scalar(&t, "counter", "npumoe_decode_steps_total",
           "Decode steps, each one batch over the busy slots.", (double)m->decode_steps);
    scalar(&t, "counter", "npumoe_decode_rows_total",
           "Rows of the decode steps (their mean batch is rows / steps).", (double)m->decode_rows);
    histogram(&t, "npumoe_time_to_first_token_seconds",
              "From a request's arrival to its first generated token (queue and prefill).", m->ttft,
              ttft_bounds, TTFT_BUCKETS, m->ttft_sum, m->ttft_n);
    histogram(&t, "npumoe_generation_tokens_per_second",
              "Per request: tokens after the first, per second of decoding.", m->speed,
              speed_bounds, SPEED_BUCKETS, m->speed_sum, m->speed_n);
    scalar(&t, "gauge", "npumoe_slots", "Slots (sessions, each with its KV cache).", m->slots);
    scalar(&t, "gauge", "npumoe_slots_busy", "Slots generating now.", m->slots_busy);
    scalar(&t, "gauge", "npumoe_queue_length", "Requests waiting for a slot.", m->queued);
    if (m->have_static) {
        const nm_moe_layer_metrics *s = &m->moe;
        scalar(&t, "counter", "npumoe_static_chunks_total",
               "Static prefill chunks, summed over layers.", (double)s->chunks);
        scalar(&t, "counter", "npumoe_static_assignments_total",
               "Token-expert assignments routed in prefills.", (double)s->assignments);
        scalar(&t, "counter", "npumoe_static_dropped_total",
               "Assignments dropped past an expert's capacity.", (double)s->dropped);
        scalar(&t, "counter", "npumoe_static_spilled_total",
               "Assignments past capacity computed on the host.", (double)s->spilled);
        scalar(&t, "counter", "npumoe_static_device_rows_total", "Rows filled in device graphs.",
               (double)s->device_rows);
        scalar(&t, "counter", "npumoe_static_host_rows_total", "Rows computed on the host.",
               (double)s->host_rows);
        scalar(&t, "counter", "npumoe_static_dispatches_total", "Device graph dispatches.",
               (double)s->dispatches);
        scalar(&t, "counter", "npumoe_static_moe_seconds_total", "Time in the MoE blocks.",
               (double)s->moe_ns * 1e-9);
        scalar(&t, "counter", "npumoe_static_wait_seconds_total", "Time waiting for the device.",
               (double)s->wait_ns * 1e-9);
        scalar(&t, "gauge", "npumoe_device_bytes", "Weight and buffer bytes the graphs hold.",
               (double)m->device.device_bytes);
    }
    pthread_mutex_unlock(&m->lock);
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    return t.s;
}
