/* npumoe serve's slots and scheduler. Each slot is a session (its own KV
 * cache) and a sampler; requests wait in a bounded queue for a free one.
 * One thread, the scheduler, does all the model's work: it takes waiting
 * requests into free slots and prefills each (nm_session_eval of its
 * prompt, through the static path when the sessions have a plan), then runs
 * one decode step for every busy slot at once (nm_batch_decode: the
 * weights' matrix products over all their rows, attention per session), and
 * again, so that a new request's prefill runs between two decode steps of
 * the others (continuous batching). The connections' threads only wait on
 * their job's condition and read its text under the lock. */
#include "serve.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct slot {
    nm_session *session;
    nm_sampler *sampler;
    job *job;     /* NULL: free; changed by the scheduler thread only */
    int32_t next; /* the token the next decode step evaluates */
    bool pending; /* next is waiting for the step */
    double t_first;
} slot;

struct scheduler {
    const nm_model *model;
    int32_t n_vocab, n_ctx;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* a request came, a client left, or quit */
    job **queue;         /* a ring of q_cap + n_slots */
    int q_cap, q_ring, q_head, q_len;
    slot *slots;
    int n_slots;
    nm_batch *batch;
    float *logits; /* [n_slots][n_vocab] */
    nm_session **in;
    int32_t *ids;
    int *who;
    bool stopping, quit, static_metrics;
    metrics *m;
    pthread_t thread;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

job *job_new(const gen_request *g, json_t *body) {
    job *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->g = *g;
    q->body = body;
    q->refs = 1;
    q->t_arrival = now_s();
    pthread_cond_init(&q->changed, NULL);
    return q;
}

/* Under the lock. */
static void unref(job *q) {
    if (--q->refs > 0) return;
    json_decref(q->error);
    json_decref(q->body);
    free(q->g.ids);
    free(q->text);
    pthread_cond_destroy(&q->changed);
    free(q);
}

void job_release(scheduler *s, job *q) {
    pthread_mutex_lock(&s->lock);
    unref(q);
    pthread_mutex_unlock(&s->lock);
}

void job_cancel(scheduler *s, job *q) {
    pthread_mutex_lock(&s->lock);
    q->cancelled = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

void scheduler_lock(scheduler *s) { pthread_mutex_lock(&s->lock); }
void scheduler_unlock(scheduler *s) { pthread_mutex_unlock(&s->lock); }

void scheduler_wait(scheduler *s, job *q, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)timeout_ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&q->changed, &s->lock, &ts);
}

static int free_slots(const scheduler *s) {
    int n = 0;
    for (int i = 0; i < s->n_slots; i++)
        n += s->slots[i].job == NULL;
    return n;
}

/* Under the lock: the gauges of /metrics as the slots and queue are now. */
static void update_gauges(scheduler *s) {
    pthread_mutex_lock(&s->m->lock);
    s->m->slots_busy = s->n_slots - free_slots(s);
    s->m->queued = s->q_len;
    pthread_mutex_unlock(&s->m->lock);
}

bool scheduler_submit(scheduler *s, job *q) {
    pthread_mutex_lock(&s->lock);
    /* a free slot takes one without a queue; then q_cap may wait */
    const bool room = !s->stopping && s->q_len < s->q_cap + free_slots(s);
    if (room) {
        s->queue[(s->q_head + s->q_len++) % s->q_ring] = q;
        q->refs++;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->lock);
    return room;
}

/* Under the lock: the slot's job ends (its waiter wakes); the slot is free. */
static void end_job(scheduler *s, slot *sl, finish_kind kind) {
    job *q = sl->job;
    if (!q->finish) q->finish = kind == FINISH_LENGTH ? "length" : "stop";
    const double t = now_s();
    const double ttft = q->n_gen > 0 ? sl->t_first - q->t_arrival : -1;
    const double speed = q->n_gen > 1 && t > sl->t_first ? (q->n_gen - 1) / (t - sl->t_first) : -1;
    metrics_finished(s->m, kind, q->g.n_ids, q->n_gen, ttft, speed);
    sl->job = NULL;
    sl->pending = false;
    /* before the waiter wakes: a client that has its answer sees the slot free */
    update_gauges(s);
    pthread_cond_broadcast(&q->changed);
    unref(q);
}

/* Under the lock: a failure after the request was accepted. */
static void fail_job(scheduler *s, slot *sl, const nm_error *e) {
    sl->job->error = error_json("server_error", "generation_failed", "%s",
                                e->msg[0] ? e->msg : "generation failed");
    sl->job->error_status = 500;
    end_job(s, sl, FINISH_ERROR);
}

/* Cuts the text at the first stop string that ends in the bytes from
 * `from` on; true when one did. */
static bool cut_at_stop(job *q, size_t from) {
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < q->g.n_stops; k++) {
        const size_t sl = strlen(q->g.stops[k]);
        size_t start = from + 1 >= sl ? from + 1 - sl : 0;
        for (size_t i = start; i + sl <= q->len && i < best; i++)
            if (memcmp(q->text + i, q->g.stops[k], sl) == 0) {
                best = i;
                break;
            }
    }
    if (best == SIZE_MAX) return false;
    q->len = best;
    q->text[best] = '\0';
    return true;
}

/* A token from the slot's logits: sampled, its text appended, then the
 * job ends or the token waits for the next decode step. */
static void take_token(scheduler *s, slot *sl, const float *logits) {
    const int32_t next = nm_sampler_sample(sl->sampler, logits);
    nm_sampler_accept(sl->sampler, next);
    char piece[256];
    int32_t n = nm_token_to_piece(s->model, next, false, piece, sizeof piece);
    if (n > (int32_t)sizeof piece) n = 0;
    const bool eog = nm_token_is_eog(s->model, next);
    pthread_mutex_lock(&s->lock);
    job *q = sl->job;
    if (q->n_gen++ == 0) sl->t_first = now_s();
    const size_t before = q->len;
    if (n > 0 && !text_append(&q->text, &q->len, &q->cap, piece, (size_t)n))
        fail_job(s, sl, &(nm_error){.msg = "out of memory"});
    else if (eog || cut_at_stop(q, before))
        end_job(s, sl, FINISH_STOP);
    else if (q->n_gen >= q->g.max_tokens || s->stopping ||
             nm_session_n_past(sl->session) >= s->n_ctx)
        end_job(s, sl, FINISH_LENGTH);
    else {
        sl->next = next;
        sl->pending = true;
        pthread_cond_broadcast(&q->changed);
    }
    pthread_mutex_unlock(&s->lock);
}

/* The static path's counters, summed over the slots, into the metrics. */
static void static_snapshot(scheduler *s) {
    nm_moe_layer_metrics sum = {0};
    nm_device_stats dev = {0};
    for (int i = 0; i < s->n_slots; i++) {
        nm_session_metrics sm;
        nm_session_get_metrics(s->slots[i].session, &sm);
        const nm_moe_layer_metrics *t = &sm.total;
        sum.chunks += t->chunks;
        sum.assignments += t->assignments;
        sum.dropped += t->dropped;
        sum.spilled += t->spilled;
        sum.host_rows += t->host_rows;
        sum.device_rows += t->device_rows;
        sum.dispatches += t->dispatches;
        sum.moe_ns += t->moe_ns;
        sum.wait_ns += t->wait_ns;
        dev.device_bytes += sm.device.device_bytes;
    }
    pthread_mutex_lock(&s->m->lock);
    s->m->have_static = true;
    s->m->moe = sum;
    s->m->device = dev;
    pthread_mutex_unlock(&s->m->lock);
}

/* The new job of the slot: its prompt into the slot's cache, its first
 * token. Outside the lock. */
static void prefill(scheduler *s, slot *sl, float *logits) {
    job *q = sl->job;
    nm_error e = {0};
    nm_session_reset(sl->session);
    nm_sampler_free(sl->sampler);
    sl->sampler = NULL;
    nm_status st = nm_sampler_new(&q->g.sp, s->n_vocab, &sl->sampler, &e);
    for (size_t i = 0; st == NM_OK && i < q->g.n_ids; i++)
        nm_sampler_accept(sl->sampler, q->g.ids[i]);
    if (st == NM_OK)
        st = nm_session_eval(sl->session, q->g.ids, (int32_t)q->g.n_ids, logits, false, &e);
    if (s->static_metrics) static_snapshot(s);
    if (st == NM_OK) {
        take_token(s, sl, logits);
        return;
    }
    pthread_mutex_lock(&s->lock);
    fail_job(s, sl, &e);
    pthread_mutex_unlock(&s->lock);
}

/* Under the lock: frees the slots of clients that left, answers the
 * waiting requests when stopping, fills free slots from the queue
 * (admitted[] gets their indices); the count admitted. */
static int schedule(scheduler *s, int *admitted) {
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].job && s->slots[i].job->cancelled)
            end_job(s, &s->slots[i], FINISH_CANCELLED);
    int n = 0;
    while (s->q_len > 0) {
        int i = 0;
        while (i < s->n_slots && s->slots[i].job)
            i++;
        if (i == s->n_slots && !s->stopping) break;
        job *q = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_ring;
        s->q_len--;
        if (q->cancelled || s->stopping) {
            if (!q->cancelled) {
                q->error = error_json("server_error", "server_stopping", "the server is stopping");
                q->error_status = 503;
            }
            q->finish = "stop";
            metrics_finished(s->m, q->cancelled ? FINISH_CANCELLED : FINISH_ERROR, 0, 0, -1, -1);
            pthread_cond_broadcast(&q->changed);
            unref(q);
            continue;
        }
        s->slots[i].job = q;
        admitted[n++] = i;
    }
    update_gauges(s);
    return n;
}

static void *scheduler_main(void *arg) {
    scheduler *s = arg;
    int *admitted = s->who + s->n_slots;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        const int n_new = schedule(s, admitted);
        if (n_new == 0 && free_slots(s) == s->n_slots) {
            if (s->quit) break;
            pthread_cond_wait(&s->wake, &s->lock);
            continue;
        }
        pthread_mutex_unlock(&s->lock);
        for (int k = 0; k < n_new; k++)
            prefill(s, &s->slots[admitted[k]], s->logits + (size_t)admitted[k] * s->n_vocab);
        int n = 0;
        for (int i = 0; i < s->n_slots; i++)
            if (s->slots[i].job && s->slots[i].pending) {
                s->in[n] = s->slots[i].session;
                s->ids[n] = s->slots[i].next;
                s->who[n++] = i;
            }
        nm_error e = {0};
        const nm_status st = n ? nm_batch_decode(s->batch, s->in, s->ids, n, s->logits, &e) : NM_OK;
        if (n) metrics_step(s->m, n);
        for (int r = 0; r < n; r++) {
            slot *sl = &s->slots[s->who[r]];
            sl->pending = false;
            if (st == NM_OK) {
                take_token(s, sl, s->logits + (size_t)r * s->n_vocab);
            } else {
                pthread_mutex_lock(&s->lock);
                fail_job(s, sl, &e);
                pthread_mutex_unlock(&s->lock);
            }
        }
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

nm_status scheduler_start(const nm_model *model, nm_session *const *sessions, int n_slots,
                          int queue, int n_threads, bool static_metrics, metrics *m,
                          scheduler **out, nm_error *err) {
    *out = NULL;
    scheduler *s = calloc(1, sizeof *s);
    if (!s) return nm_errorf(err, NM_ERR_NOMEM, "out of memory");
    s->model = model;
    s->n_vocab = nm_session_n_vocab(sessions[0]);
    s->n_ctx = nm_session_n_ctx(sessions[0]);
    s->n_slots = n_slots;
    s->q_cap = queue;
    s->q_ring = queue + n_slots;
    s->static_metrics = static_metrics;
    s->m = m;
    s->queue = calloc((size_t)s->q_ring, sizeof *s->queue);
    s->slots = calloc((size_t)n_slots, sizeof *s->slots);
    s->logits = malloc((size_t)n_slots * (size_t)s->n_vocab * sizeof *s->logits);
    s->in = calloc((size_t)n_slots, sizeof *s->in);
    s->ids = calloc((size_t)n_slots, sizeof *s->ids);
    s->who = calloc(2 * (size_t)n_slots, sizeof *s->who);
    nm_status st = s->queue && s->slots && s->logits && s->in && s->ids && s->who
                       ? nm_batch_new(model, n_slots, s->n_ctx, n_threads, &s->batch, err)
                       : nm_errorf(err, NM_ERR_NOMEM, "out of memory for %d slots", n_slots);
    for (int i = 0; st == NM_OK && i < n_slots; i++)
        s->slots[i].session = sessions[i];
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    const int rc = st == NM_OK ? pthread_create(&s->thread, NULL, scheduler_main, s) : 0;
    if (rc != 0)
        st = nm_errorf(err, NM_ERR_NOMEM, "cannot start the scheduler thread: %s", strerror(rc));
    if (st != NM_OK) {
        s->quit = true;
        scheduler_free(s);
        return st;
    }
    *out = s;
    return NM_OK;
}

void scheduler_stopping(scheduler *s) {
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

void scheduler_free(scheduler *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    const bool running = !s->quit;
    s->quit = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    if (running) pthread_join(s->thread, NULL);
    for (int i = 0; s->slots && i < s->n_slots; i++)
        nm_sampler_free(s->slots[i].sampler);
    nm_batch_free(s->batch);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s->queue);
    free(s->slots);
    free(s->logits);
    free(s->in);
    free(s->ids);
    free(s->who);
    free(s);
}
