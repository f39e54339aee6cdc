/* npumoe serve: an OpenAI-compatible HTTP server (libmicrohttpd for HTTP,
 * jansson for JSON). This file: the routes, the responses (whole and
 * streamed as server-sent events), the connections' side of a request
 * (waiting on its job, noticing a client that left) and the command. The
 * requests' parsing is serve_request.c, the slots and their batched decode
 * steps serve_slots.c, /metrics serve_metrics.c (serve.h). Built only when
 * both libraries are found (NM_SERVE, cmake/Serve.cmake). */
#include "cli.h"
#include "serve.h"

#include "npumoe.h"

#include <jansson.h>
#include <microhttpd.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum {
    BODY_LIMIT = 1 << 20, /* bytes of a request body; more is 413 */
    WAIT_MS = 100,             /* how often a waiting connection looks at its client */
    STOP_WAIT_S = 10,          /* at a stop signal, the longest wait for answers to go */
};

/* The routes, in metrics_route_names' order. */
enum { R_HEALTH, R_MODELS, R_CHAT, R_COMPLETIONS, R_METRICS, R_OTHER };

/* The server: the model, its slots' sessions, the scheduler, the metrics. */
typedef struct server {
    nm_model *model;
    const cli_options *o;
    request_env env;
    cli_session *slots;
    int n_slots;
    scheduler *sched;
    metrics m;
    pthread_mutex_t lock;
    uint64_t next_id;
    int live; /* completions being answered (under lock) */
    char model_id[256];
} server;

/* The status of the response this connection's thread queued last (one
 * thread per connection), for the requests counter. */
static _Thread_local unsigned sent_status;

/* ---- responses ---- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, char *body,
                                 const char *type, const char *allow) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (allow) MHD_add_response_header(r, "Allow", allow);
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    sent_status = status;
    return ret;
}

/* Sends j (stolen) as the body. */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j,
                                 const char *allow) {
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) return MHD_NO;
    return send_text(c, status, body, "application/json", allow);
}

/* ---- a request's answer ---- */

/* A connection's side of a completion: its job and what the answer has
 * sent. Every read of the job's text is under the scheduler's lock. */
typedef struct reply {
    server *s;
    job *q;
    int fd; /* the client's socket, to notice that it left; -1: unknown */
    char id[48];
    json_int_t created;
    size_t sent;  /* stream: bytes of text sent */
    int32_t seen; /* stream: tokens seen */
    char *out;    /* stream: pending bytes */
    size_t out_len, out_pos, out_cap;
    int phase; /* stream: 0 not started, 1 generating, 2 finished */
} reply;

/* Whether the client closed its connection (or it broke). */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    char b;
    const ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static json_t *usage_json(const job *q) {
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)q->g.n_ids,
                     "completion_tokens", (json_int_t)q->n_gen, "total_tokens",
                     (json_int_t)q->g.n_ids + q->n_gen);
}

/* A choice (chat: a message or delta; else text) of text[from, to). */
static json_t *choice_json(const job *q, size_t from, size_t to, bool delta, bool with_role,
                           const char *finish) {
    /* the text, invalid UTF-8 (a token ending inside a character) as U+FFFD */
    json_t *text = json_text(q->text ? q->text + from : "", to - from);
    if (!text) return NULL;
    json_t *c = json_pack("{s:i, s:o}", "index", 0, "finish_reason",
                          finish ? json_string(finish) : json_null());
    if (q->g.chat) {
        json_t *m = json_object();
        if (with_role || !delta) json_object_set_new(m, "role", json_string("assistant"));
        if (!delta || to > from || with_role)
            json_object_set_new(m, "content", json_incref(text));
        json_object_set_new(c, delta ? "delta" : "message", m);
    } else {
        json_object_set_new(c, "text", json_incref(text));
        json_object_set_new(c, "logprobs", json_null());
    }
    json_decref(text);
    return c;
}

static json_t *envelope(const reply *p, bool chunk, json_t *choice) {
    const char *object =
        p->q->g.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    json_t *choices = json_array();
    if (choice) json_array_append_new(choices, choice);
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", p->id, "object", object, "created",
                     p->created, "model", p->s->model_id, "choices", choices);
}

/* Bytes of the text a stream may send now: not the start of a stop string
 * that may yet complete, nor an unfinished UTF-8 character. */
static size_t stream_safe(const reply *p) {
    const job *q = p->q;
    size_t safe = q->len;
    if (q->finish) return safe;
    for (size_t k = 0; k < q->g.n_stops; k++) {
        const size_t sl = strlen(q->g.stops[k]);
        for (size_t n = sl - 1; n > 0; n--)
            if (n <= q->len - p->sent && memcmp(q->text + q->len - n, q->g.stops[k], n) == 0) {
                if (q->len - n < safe) safe = q->len - n;
                break;
            }
    }
    return utf8_whole_len(q->text, p->sent, safe);
}

static void out_append(reply *p, const char *bytes, size_t n) {
    /* out of memory: the chunk is lost; the stream goes on */
    (void)text_append(&p->out, &p->out_len, &p->out_cap, bytes, n);
}

/* Appends "data: J\n\n" (J stolen) to the stream's pending bytes. */
static void emit(reply *p, json_t *j) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (text) {
        out_append(p, "data: ", 6);
        out_append(p, text, strlen(text));
        out_append(p, "\n\n", 2);
    }
    free(text);
}

/* Fills the stream's pending bytes with what comes next: waits for a new
 * token or the end, or notices that the client left (then the job is
 * cancelled and the stream ends). */
static void stream_produce(reply *p) {
    job *q = p->q;
    scheduler *sched = p->s->sched;
    p->out_len = p->out_pos = 0;
    scheduler_lock(sched);
    if (p->phase == 0) {
        p->phase = 1;
        if (q->g.chat) emit(p, envelope(p, true, choice_json(q, 0, 0, true, true, NULL)));
        scheduler_unlock(sched);
        return;
    }
    bool gone = false;
    while (!q->finish && q->n_gen == p->seen && !(gone = client_gone(p->fd)))
        scheduler_wait(sched, q, WAIT_MS);
    p->seen = q->n_gen;
    if (gone) {
        scheduler_unlock(sched);
        job_cancel(sched, q);
        p->phase = 2;
        return;
    }
    const size_t safe = stream_safe(p);
    if (safe > p->sent && !q->error) {
        emit(p, envelope(p, true, choice_json(q, p->sent, safe, true, false, NULL)));
        p->sent = safe;
    }
    if (q->finish) {
        if (q->error) {
            emit(p, json_incref(q->error));
        } else {
            emit(p, envelope(p, true, choice_json(q, p->sent, p->sent, true, false, q->finish)));
            if (q->g.include_usage) {
                json_t *u = envelope(p, true, NULL);
                json_object_set_new(u, "usage", usage_json(q));
                emit(p, u);
            }
        }
        out_append(p, "data: [DONE]\n\n", 14);
        p->phase = 2;
    }
    scheduler_unlock(sched);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    reply *p = cls;
    (void)pos;
    while (p->out_pos == p->out_len) {
        if (p->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        stream_produce(p);
    }
    size_t n = p->out_len - p->out_pos < max ? p->out_len - p->out_pos : max;
    memcpy(buf, p->out + p->out_pos, n);
    p->out_pos += n;
    return (ssize_t)n;
}

/* The stream ended, or its client went (a write to its closed connection
 * failed): an unfinished job is cancelled, its slot freed at the
 * scheduler's next step. */
static void reply_free(reply *p) {
    server *s = p->s;
    job_release(s->sched, p->q);
    free(p->out);
    free(p);
    pthread_mutex_lock(&s->lock);
    s->live--;
    pthread_mutex_unlock(&s->lock);
}

static void stream_free(void *cls) {
    reply *p = cls;
    job_cancel(p->s->sched, p->q);
    reply_free(p);
}

/* ---- routes ---- */

static enum MHD_Result completion(server *s, struct MHD_Connection *c, const char *body, size_t len,
                                  bool chat) {
    json_error_t jerr;
    json_t *j = json_loadb(body ? body : "", len, 0, &jerr);
    if (!j)
        return send_json(c, MHD_HTTP_BAD_REQUEST,
                         error_json("invalid_request_error", "invalid_json",
                                    "the body is not valid JSON: %s (line %d, column %d)",
                                    jerr.text, jerr.line, jerr.column),
                         NULL);
    gen_request g = {.chat = chat};
    unsigned status = 0;
    json_t *err = parse_request(&s->env, j, &g, &status);
    if (err) {
        free(g.ids);
        json_decref(j);
        return send_json(c, status, err, NULL);
    }
    reply *p = calloc(1, sizeof *p);
    job *q = p ? job_new(&g, j) : NULL;
    if (!q) {
        free(p);
        free(g.ids);
        json_decref(j);
        return send_json(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
                         error_json("server_error", "out_of_memory", "out of memory"), NULL);
    }
    p->s = s;
    p->q = q;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    p->fd = ci ? ci->connect_fd : -1;
    pthread_mutex_lock(&s->lock);
    const uint64_t id = ++s->next_id;
    s->live++;
    pthread_mutex_unlock(&s->lock);
    snprintf(p->id, sizeof p->id, "%s-%" PRIu64, chat ? "chatcmpl" : "cmpl", id);
    p->created = (json_int_t)time(NULL);
    if (!scheduler_submit(s->sched, q)) {
        reply_free(p);
        return send_json(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                         error_json("server_error", "server_busy",
                                    "every slot is busy and %d requests are waiting (the "
                                    "server's --queue): try again later",
                                    s->o->queue),
                         NULL);
    }
    if (g.stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, p, stream_free);
        if (!r) {
            stream_free(p);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        sent_status = MHD_HTTP_OK;
        return ret;
    }
    scheduler_lock(s->sched);
    bool gone = false;
    while (!q->finish && !(gone = client_gone(p->fd)))
        scheduler_wait(s->sched, q, WAIT_MS);
    json_t *out = NULL;
    if (gone) {
        status = 0;
    } else if (q->error) {
        status = q->error_status ? q->error_status : MHD_HTTP_INTERNAL_SERVER_ERROR;
        out = json_incref(q->error);
    } else {
        status = MHD_HTTP_OK;
        out = envelope(p, false, choice_json(q, 0, q->len, false, false, q->finish));
        json_object_set_new(out, "usage", usage_json(q));
    }
    scheduler_unlock(s->sched);
    if (gone) job_cancel(s->sched, q);
    reply_free(p);
    return gone ? MHD_NO : send_json(c, status, out, NULL);
}

/* Whether the request carries "Authorization: Bearer KEY": every byte is
 * compared, whatever differs, so that the time says nothing of the key. */
static bool authorized(const server *s, struct MHD_Connection *c) {
    const char *key = s->o->api_key;
    if (!key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    const size_t hn = strlen(h), kn = strlen(key);
    unsigned diff = hn != kn;
    for (size_t i = 0; i < kn; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < hn ? h[i] : 0);
    return diff == 0;
}

static int route_index(const char *url) {
    int r = 0;
    while (r < R_OTHER && strcmp(url, metrics_route_names[r]) != 0)
        r++;
    return r;
}

static enum MHD_Result route(server *s, struct MHD_Connection *c, const char *url,
                             const char *method, const char *body, size_t len) {
    static const char *const methods[R_OTHER] = {"GET", "GET", "POST", "POST", "GET"};
    const int r = route_index(url);
    if (r != R_HEALTH && !authorized(s, c))
        return send_json(c, MHD_HTTP_UNAUTHORIZED,
                         error_json("invalid_request_error", "invalid_api_key",
                                    "a missing or incorrect API key: send the header "
                                    "'Authorization: Bearer KEY'"),
                         NULL);
    if (r == R_OTHER)
        return send_json(
            c, MHD_HTTP_NOT_FOUND,
            error_json("invalid_request_error", "unknown_url", "no route %s %s", method, url),
            NULL);
    if (strcmp(method, methods[r]) != 0)
        return send_json(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                         error_json("invalid_request_error", "method_not_allowed",
                                    "%s takes %s, not %s", url, methods[r], method),
                         methods[r]);
    switch (r) {
    case R_HEALTH:
        return send_json(c, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"), NULL);
    case R_MODELS:
        return send_json(c, MHD_HTTP_OK,
                         json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data",
                                   "id", s->model_id, "object", "model", "created",
                                   (json_int_t)time(NULL), "owned_by", "npumoe"),
                         NULL);
    case R_METRICS: {
        /* this request is counted before the text is made */
        metrics_request(&s->m, R_METRICS, MHD_HTTP_OK);
        char *text = metrics_text(&s->m);
        return text ? send_text(c, MHD_HTTP_OK, text, "text/plain; version=0.0.4; charset=utf-8",
                                NULL)
                    : MHD_NO;
    }
    default:
        return completion(s, c, body, len, r == R_CHAT);
    }
}

/* A connection's request body, gathered up to BODY_LIMIT. */
typedef struct request_body {
    char *bytes;
    size_t len, cap;
    bool too_large;
} request_body;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    server *s = cls;
    request_body *b = *con_cls;
    if (!b) {
        b = calloc(1, sizeof *b);
        *con_cls = b;
        return b ? MHD_YES : MHD_NO;
    }
    if (*upload_data_size) { /* the rest of an over-long body is read and dropped */
        if (!b->too_large && b->len + *upload_data_size <= BODY_LIMIT)
            b->too_large =
                !text_append(&b->bytes, &b->len, &b->cap, upload_data, *upload_data_size);
        else
            b->too_large = true;
        *upload_data_size = 0;
        return MHD_YES;
    }
    sent_status = 0;
    enum MHD_Result ret;
    if (b->too_large)
        ret = send_json(c, MHD_HTTP_CONTENT_TOO_LARGE,
                        error_json("invalid_request_error", "request_too_large",
                                   "the request body is larger than %d bytes", BODY_LIMIT),
                        NULL);
    else
        ret = route(s, c, url, method, b->bytes, b->len);
    const int r = route_index(url);
    if (sent_status && !(r == R_METRICS && sent_status == MHD_HTTP_OK))
        metrics_request(&s->m, r, sent_status);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    request_body *b = *con_cls;
    if (b) free(b->bytes);
    free(b);
    *con_cls = NULL;
}

/* ---- the command ---- */

static bool is_loopback(const struct sockaddr *a) {
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(x);
    }
    return false;
}

/* The slots' sessions (with --plan, each prefills through the static
 * path) and the scheduler over them. */
static int open_slots(server *s) {
    const cli_options *o = s->o;
    nm_session **sessions = calloc((size_t)o->parallel, sizeof *sessions);
    s->slots = calloc((size_t)o->parallel, sizeof *s->slots);
    if (!sessions || !s->slots) {
        free(sessions);
        return fail("out of memory for the slots%s%s", "", "");
    }
    nm_error err = {0};
    nm_status st = NM_OK;
    for (int i = 0; st == NM_OK && i < o->parallel; i++) {
        st = open_session(s->model, o, o->plan || o->mode, &s->slots[i], &err);
        if (st == NM_OK) s->n_slots++;
        if (st == NM_OK) sessions[i] = s->slots[i].session;
    }
    if (st == NM_OK) {
        nm_session_metrics sm;
        nm_session_get_metrics(sessions[0], &sm);
        st = scheduler_start(s->model, sessions, s->n_slots, o->queue, o->threads,
                             sm.mode != NM_MODE_DENSE, &s->m, &s->sched, &err);
    }
    free(sessions);
    return st == NM_OK ? 0 : fail_err(&err);
}

static void close_slots(server *s) {
    scheduler_free(s->sched);
    for (int i = 0; i < s->n_slots; i++)
        close_session(&s->slots[i]);
    free(s->slots);
}

int cmd_serve(nm_model *model, const cli_options *o) {
    const char *host = o->host ? o->host : "127.0.0.1";
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0) return fail("--host '%s': %s", host, gai_strerror(gai));
    if (!o->api_key && !o->insecure && !is_loopback(ai->ai_addr)) {
        freeaddrinfo(ai);
        return fail("--host '%s' is reachable from other machines: give --api-key KEY, or "
                    "--insecure to serve it without one%s",
                    host, "");
    }
    server s = {.model = model, .o = o};
    pthread_mutex_init(&s.lock, NULL);
    metrics_init(&s.m, o->parallel);
    int rc = open_slots(&s);
    nm_model_info info;
    nm_model_get_info(model, &info);
    /* the file's name, its bytes that are not UTF-8 as U+FFFD (jansson
     * refuses such strings, so every response would fail), cut short on a
     * whole character */
    const char *base = strrchr(o->model, '/'), *file = base ? base + 1 : o->model;
    json_t *name = json_text(file, strlen(file));
    snprintf(s.model_id, sizeof s.model_id, "%s", name ? json_string_value(name) : "model");
    s.model_id[utf8_whole_len(s.model_id, 0, strlen(s.model_id))] = '\0';
    json_decref(name);
    s.env = (request_env){.model = model,
                          .chat_template = o->chat_template,
                          .model_id = s.model_id,
                          .n_ctx = s.n_slots ? nm_session_n_ctx(s.slots[0].session) : 0};
    /* the chat format is known now, not at the first request */
    char *probe = NULL;
    size_t probe_n = 0;
    const nm_chat_message hello = {"user", "hello"};
    nm_error err = {0};
    if (rc == 0 && nm_chat_apply_template(model, o->chat_template, &hello, 1, true, &probe,
                                          &probe_n, &err) != NM_OK) {
        if (o->chat_template)
            rc = fail_err(&err);
        else
            fprintf(stderr,
                    "npumoe: warning: /v1/chat/completions will fail unless the server is "
                    "started with --chat-template NAME: %s\n",
                    err.msg);
    }
    nm_free(probe);
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    /* the server's threads inherit the mask: the signals come to sigwait */
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct MHD_Daemon *d = NULL;
    if (rc == 0) {
        unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                         MHD_USE_ERROR_LOG | MHD_USE_ITC |
                         (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
        d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, &s,
                             MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
                             (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                             (unsigned)o->max_connections, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
                             NULL, MHD_OPTION_END);
        if (!d) rc = fail("cannot listen on %s port %s (in use? see the line above)", host, port);
    }
    freeaddrinfo(ai);
    if (d) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        fprintf(stderr,
                "npumoe: serving %s on http://%s:%u (context %d tokens, %d slot%s, queue %d%s; "
                "Ctrl-C stops)\n",
                s.model_id, host, di ? (unsigned)di->port : (unsigned)o->port, s.env.n_ctx,
                s.n_slots, s.n_slots == 1 ? "" : "s", o->queue,
                o->plan ? ", prefill through the plan" : "");
        fflush(stderr);
        int sig = 0;
        sigwait(&stop_signals, &sig);
        /* no new connections; generations end at their next token, waiting
         * requests get 503; their answers are sent (at most STOP_WAIT_S) */
        const MHD_socket listener = MHD_quiesce_daemon(d);
        scheduler_stopping(s.sched);
        fprintf(stderr, "npumoe: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        for (int i = 0; i < STOP_WAIT_S * 20; i++) {
            pthread_mutex_lock(&s.lock);
            const int live = s.live;
            pthread_mutex_unlock(&s.lock);
            if (live == 0) break;
            nanosleep(&(struct timespec){.tv_nsec = 50000000L}, NULL);
        }
        MHD_stop_daemon(d);
        if (listener != MHD_INVALID_SOCKET) close(listener);
    }
    close_slots(&s);
    metrics_destroy(&s.m);
    pthread_mutex_destroy(&s.lock);
    return rc;
}
