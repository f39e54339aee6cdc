/* npumoe serve: an OpenAI-compatible HTTP server (libmicrohttpd for HTTP,
 * jansson for JSON). One slot: one session serves the requests one at a
 * time (a request waits for the slot); parallel slots with continuous
 * batching are a later step. Built only when both libraries are found
 * (NM_SERVE, cmake/Serve.cmake). */
#include "cli.h"

#include "npumoe.h"

#include <jansson.h>
#include <microhttpd.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

enum {
    BODY_LIMIT = 1 << 20, /* bytes of a request body; more is 413 */
    MAX_STOPS = 4,        /* stop strings per request, as OpenAI */
    CONNECTION_LIMIT = 64,
    CONNECTION_TIMEOUT_S = 30, /* a client that sends its body slowly */
};

/* The server: the model, its one slot (a session, taken under busy). */
typedef struct server {
    nm_model *model;
    const cli_options *o;
    cli_session cs;
    int32_t n_ctx, n_vocab;
    char model_id[256];
    pthread_mutex_t lock;
    pthread_cond_t freed;
    bool busy;
    volatile sig_atomic_t stopping;
    uint64_t next_id;
} server;

/* ---- the slot ---- */

static void slot_acquire(server *s) {
    pthread_mutex_lock(&s->lock);
    while (s->busy)
        pthread_cond_wait(&s->freed, &s->lock);
    s->busy = true;
    pthread_mutex_unlock(&s->lock);
}

/* Any thread may release (a stream's end may run on another thread). */
static void slot_release(server *s) {
    pthread_mutex_lock(&s->lock);
    s->busy = false;
    pthread_cond_signal(&s->freed);
    pthread_mutex_unlock(&s->lock);
}

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

/* {"error":{"message":..,"type":..,"param":null,"code":..}} */
static json_t *error_json(const char *type, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static json_t *error_json(const char *type, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type", type, "param",
                     "code", code);
}

/* ---- requests ---- */

/* What a completion request asks for, read from its JSON. */
typedef struct gen_request {
    bool chat, stream, include_usage;
    int32_t max_tokens; /* -1: until the context is full */
    nm_sampler_params sp;
    const char *stops[MAX_STOPS];
    size_t n_stops;
    int32_t *ids;
    size_t n_ids;
} gen_request;

/* A 400 for a field of the wrong type or range; returns NULL for chaining. */
static json_t *bad_field(const char *field, const char *what) {
    return error_json("invalid_request_error", "invalid_type", "'%s' must be %s", field, what);
}

static json_t *read_number(json_t *body, const char *key, double lo, double hi, float *out) {
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return NULL;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!isfinite(x) || x < lo || x > hi) {
        char what[64];
        snprintf(what, sizeof what, "a number in [%g, %g]", lo, hi);
        return bad_field(key, what);
    }
    *out = (float)x;
    return NULL;
}

static json_t *read_int(json_t *body, const char *key, json_int_t lo, json_int_t hi,
                        json_int_t *out) {
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return NULL;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        char what[80];
        snprintf(what, sizeof what,
                 "an integer in [%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT "]", lo, hi);
        return bad_field(key, what);
    }
    *out = json_integer_value(v);
    return NULL;
}

/* A message's content: a string, or an array of {"type":"text","text":..}
 * parts (joined); NULL when neither. Caller frees. */
static char *message_content(json_t *content) {
    if (json_is_string(content)) return strdup(json_string_value(content));
    if (!json_is_array(content)) return NULL;
    size_t len = 0, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) return NULL;
        len += json_string_length(t);
    }
    char *out = malloc(len + 1);
    if (!out) return NULL;
    len = 0;
    json_array_foreach(content, i, part) {
        json_t *t = json_object_get(part, "text");
        memcpy(out + len, json_string_value(t), json_string_length(t));
        len += json_string_length(t);
    }
    out[len] = '\0';
    return out;
}

/* The prompt text: the messages through the chat template, or "prompt".
 * Returns an error object, or NULL with *text set (nm_free it). */
static json_t *prompt_text(server *s, json_t *body, bool chat, char **text, size_t *n) {
    if (!chat) {
        json_t *p = json_object_get(body, "prompt");
        if (!json_is_string(p)) return bad_field("prompt", "a string");
        *n = json_string_length(p);
        *text = malloc(*n + 1);
        if (!*text) return error_json("server_error", "out_of_memory", "out of memory");
        memcpy(*text, json_string_value(p), *n + 1);
        return NULL;
    }
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return bad_field("messages", "a non-empty array of messages");
    size_t count = json_array_size(msgs);
    nm_chat_message *m = calloc(count, sizeof *m);
    char **contents = calloc(count, sizeof *contents);
    json_t *err =
        m && contents ? NULL : error_json("server_error", "out_of_memory", "out of memory");
    for (size_t i = 0; !err && i < count; i++) {
        json_t *msg = json_array_get(msgs, i);
        json_t *role = json_object_get(msg, "role");
        contents[i] = message_content(json_object_get(msg, "content"));
        if (!json_is_string(role) || !contents[i])
            err = error_json("invalid_request_error", "invalid_type",
                             "messages[%zu] must have a string 'role' and a string (or text "
                             "parts) 'content'",
                             i);
        else
            m[i] = (nm_chat_message){json_string_value(role), contents[i]};
    }
    nm_error e = {0};
    if (!err &&
        nm_chat_apply_template(s->model, s->o->chat_template, m, count, true, text, n, &e) != NM_OK)
        err = error_json("invalid_request_error", "chat_template", "%s", e.msg);
    for (size_t i = 0; contents && i < count; i++)
        free(contents[i]);
    free(contents);
    free(m);
    return err;
}

static void free_text(char *text, bool chat) {
    if (chat)
        nm_free(text);
    else
        free(text);
}

/* Reads the request; NULL on success, else the error (status in *status). */
static json_t *parse_request(server *s, json_t *body, gen_request *g, unsigned *status) {
    *status = MHD_HTTP_BAD_REQUEST;
    if (!json_is_object(body)) return bad_field("the request body", "a JSON object");
    json_t *model = json_object_get(body, "model");
    if (model && !json_is_null(model) && !json_is_string(model))
        return bad_field("model", "a string");
    if (json_is_string(model) && strcmp(json_string_value(model), s->model_id) != 0) {
        *status = MHD_HTTP_NOT_FOUND;
        return error_json("invalid_request_error", "model_not_found",
                          "The model '%s' does not exist (this server has '%s')",
                          json_string_value(model), s->model_id);
    }
    g->sp = nm_sampler_default_params();
    json_t *e = NULL;
    json_int_t v = -1;
    if ((e = read_number(body, "temperature", 0, 100, &g->sp.temperature)) ||
        (e = read_number(body, "top_p", 1e-9, 1, &g->sp.top_p)) ||
        (e = read_number(body, "min_p", 0, 1, &g->sp.min_p)))
        return e;
    json_int_t top_k = g->sp.top_k;
    if ((e = read_int(body, "top_k", 0, INT32_MAX, &top_k))) return e;
    g->sp.top_k = (int32_t)top_k;
    json_t *seed = json_object_get(body, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return bad_field("seed", "an integer");
        g->sp.seed = (uint64_t)json_integer_value(seed); /* a negative one wraps, as in C */
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g->sp.seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
    }
    if ((e = read_int(body, "max_tokens", 1, INT32_MAX, &v))) return e;
    if (v < 0 && (e = read_int(body, "max_completion_tokens", 1, INT32_MAX, &v))) return e;
    g->max_tokens = (int32_t)v;
    json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream))
        return bad_field("stream", "a boolean");
    g->stream = json_is_true(stream);
    json_t *so = json_object_get(body, "stream_options");
    g->include_usage = json_is_true(json_object_get(so, "include_usage"));
    json_t *stop = json_object_get(body, "stop");
    if (json_is_string(stop)) {
        if (json_string_length(stop)) g->stops[g->n_stops++] = json_string_value(stop);
    } else if (json_is_array(stop)) {
        size_t i;
        json_t *one;
        if (json_array_size(stop) > MAX_STOPS)
            return bad_field("stop", "a string or an array of at most 4 strings");
        json_array_foreach(stop, i, one) {
            if (!json_is_string(one)) return bad_field("stop", "a string or an array of strings");
            if (json_string_length(one)) g->stops[g->n_stops++] = json_string_value(one);
        }
    } else if (stop && !json_is_null(stop)) {
        return bad_field("stop", "a string or an array of strings");
    }
    char *text = NULL;
    size_t n_bytes = 0;
    if ((e = prompt_text(s, body, g->chat, &text, &n_bytes))) return e;
    nm_error err = {0};
    size_t n = 0;
    nm_status st = nm_tokenize(s->model, text, n_bytes, true, true, NULL, 0, &n, &err);
    if (st == NM_OK || st == NM_ERR_CAPACITY) {
        g->ids = malloc((n ? n : 1) * sizeof *g->ids);
        st = g->ids ? nm_tokenize(s->model, text, n_bytes, true, true, g->ids, n, &n, &err)
                    : NM_ERR_NOMEM;
    }
    free_text(text, g->chat);
    if (st != NM_OK) return bad_field("prompt", "text the tokenizer takes");
    g->n_ids = n;
    if (n == 0) return bad_field(g->chat ? "messages" : "prompt", "not empty");
    if (n >= (size_t)s->n_ctx)
        return error_json("invalid_request_error", "context_length_exceeded",
                          "This model's maximum context length is %d tokens. However, your "
                          "prompt has %zu tokens (-c N gives the server a larger context)",
                          s->n_ctx, n);
    const int32_t room = s->n_ctx - (int32_t)n;
    if (g->max_tokens > room)
        return error_json("invalid_request_error", "context_length_exceeded",
                          "This model's maximum context length is %d tokens. However, you "
                          "requested %zu tokens (%zu in the prompt, %d in the completion)",
                          s->n_ctx, n + (size_t)g->max_tokens, n, g->max_tokens);
    if (g->max_tokens < 0) g->max_tokens = room;
    return NULL;
}

/* ---- generation ---- */

/* Bytes of text as valid UTF-8: bytes that are not become U+FFFD (caller
 * frees). */
static char *utf8_clean(const char *text, size_t n, size_t *out_n) {
    char *out = malloc(3 * n + 1);
    if (!out) return NULL;
    const unsigned char *s = (const unsigned char *)text;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
        uint32_t cp = len == 4 ? c & 7 : len == 3 ? c & 15 : len == 2 ? c & 31 : c;
        bool ok = len >= 1 && c <= 0xf4 && i + len <= n;
        for (size_t j = 1; ok && j < len; j++) {
            ok = (s[i + j] & 0xc0) == 0x80;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        const uint32_t min = len == 4 ? 0x10000 : len == 3 ? 0x800 : 0;
        if (ok && cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff)) {
            memcpy(out + o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    *out_n = o;
    return out;
}

/* One request's generation on the slot. */
typedef struct gen {
    server *s;
    gen_request g;
    json_t *body;  /* the request (the stop strings point into it) */
    json_t *error; /* a failure after the request was accepted */
    nm_sampler *sampler;
    float *logits;
    char *text; /* generated bytes, cut at a stop string */
    size_t len, cap, sent;
    int32_t n_gen;
    const char *finish; /* NULL while generating; "stop" or "length" */
    bool holding;       /* the slot */
    char id[48];
    json_int_t created;
    /* a stream's pending bytes */
    char *out;
    size_t out_len, out_pos;
    int phase; /* stream: 0 not started, 1 generating, 2 finished */
} gen;

static void gen_fail(gen *q, const nm_error *e) {
    q->error = error_json("server_error", "generation_failed", "%s", e->msg[0] ? e->msg : "failed");
    q->finish = "stop";
}

static void gen_start(gen *q) {
    server *s = q->s;
    slot_acquire(s);
    q->holding = true;
    nm_error e = {0};
    nm_session_reset(s->cs.session);
    q->logits = malloc((size_t)s->n_vocab * sizeof(float));
    nm_status st = q->logits ? nm_sampler_new(&q->g.sp, s->n_vocab, &q->sampler, &e)
                             : nm_errorf(&e, NM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == NM_OK && i < q->g.n_ids; i++)
        nm_sampler_accept(q->sampler, q->g.ids[i]);
    if (st == NM_OK)
        st = nm_session_eval(s->cs.session, q->g.ids, (int32_t)q->g.n_ids, q->logits, false, &e);
    if (st != NM_OK) gen_fail(q, &e);
}

static void gen_end(gen *q) {
    nm_sampler_free(q->sampler);
    q->sampler = NULL;
    free(q->logits);
    q->logits = NULL;
    if (q->holding) slot_release(q->s);
    q->holding = false;
}

static bool append(char **buf, size_t *len, size_t *cap, const char *bytes, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t bigger = (*cap + n + 1) * 2;
        char *p = realloc(*buf, bigger);
        if (!p) return false;
        *buf = p;
        *cap = bigger;
    }
    memcpy(*buf + *len, bytes, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* Cuts the text at the first stop string that ends in the bytes from
 * `from` on; true when one did. */
static bool cut_at_stop(gen *q, size_t from) {
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

/* One token: sample, append its text, stop or evaluate it. */
static void gen_step(gen *q) {
    server *s = q->s;
    nm_error e = {0};
    const int32_t next = nm_sampler_sample(q->sampler, q->logits);
    nm_sampler_accept(q->sampler, next);
    q->n_gen++;
    char piece[256];
    int32_t n = nm_token_to_piece(s->model, next, false, piece, sizeof piece);
    if (n > (int32_t)sizeof piece) n = 0;
    const size_t before = q->len;
    if (n > 0 && !append(&q->text, &q->len, &q->cap, piece, (size_t)n)) {
        gen_fail(q, &(nm_error){.msg = "out of memory"});
        return;
    }
    if (nm_token_is_eog(s->model, next) || cut_at_stop(q, before)) {
        q->finish = "stop";
        return;
    }
    if (q->n_gen >= q->g.max_tokens || s->stopping) {
        q->finish = "length";
        return;
    }
    nm_status st = nm_session_eval(s->cs.session, &next, 1, q->logits, false, &e);
    if (st == NM_ERR_CAPACITY)
        q->finish = "length";
    else if (st != NM_OK)
        gen_fail(q, &e);
}

static json_t *usage_json(const gen *q) {
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)q->g.n_ids,
                     "completion_tokens", (json_int_t)q->n_gen, "total_tokens",
                     (json_int_t)q->g.n_ids + q->n_gen);
}

/* A choice (chat: a message or delta; else text) of text[from, to). */
static json_t *choice_json(const gen *q, size_t from, size_t to, bool delta, bool with_role,
                           const char *finish) {
    size_t n = 0;
    char *clean = utf8_clean(q->text ? q->text + from : "", to - from, &n);
    if (!clean) return NULL;
    json_t *c = json_pack("{s:i, s:o}", "index", 0, "finish_reason",
                          finish ? json_string(finish) : json_null());
    if (q->g.chat) {
        json_t *m = json_object();
        if (with_role || !delta) json_object_set_new(m, "role", json_string("assistant"));
        if (!delta || to > from || with_role)
            json_object_set_new(m, "content", json_stringn(clean, n));
        json_object_set_new(c, delta ? "delta" : "message", m);
    } else {
        json_object_set_new(c, "text", json_stringn(clean, n));
        json_object_set_new(c, "logprobs", json_null());
    }
    free(clean);
    return c;
}

static json_t *envelope(const gen *q, bool chunk, json_t *choice) {
    const char *object =
        q->g.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    json_t *choices = json_array();
    if (choice) json_array_append_new(choices, choice);
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", q->id, "object", object, "created",
                     q->created, "model", q->s->model_id, "choices", choices);
}

/* Bytes of the text a stream may send now: not the start of a stop string
 * that may yet complete, nor an unfinished UTF-8 character. */
static size_t stream_safe(const gen *q) {
    size_t safe = q->len;
    if (q->finish) return safe;
    for (size_t k = 0; k < q->g.n_stops; k++) {
        const size_t sl = strlen(q->g.stops[k]);
        for (size_t p = sl - 1; p > 0; p--)
            if (p <= q->len - q->sent && memcmp(q->text + q->len - p, q->g.stops[k], p) == 0) {
                if (q->len - p < safe) safe = q->len - p;
                break;
            }
    }
    /* back to the start of the last character when it may be unfinished */
    size_t lead = safe;
    while (lead > q->sent && safe - lead < 4 && ((unsigned char)q->text[lead - 1] & 0xc0) == 0x80)
        lead--;
    if (lead > q->sent) {
        const unsigned c = (unsigned char)q->text[lead - 1];
        const size_t want = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        if (c >= 0xc0 && lead - 1 + want > safe) safe = lead - 1;
    }
    return safe;
}

/* Appends "data: J\n\n" (J stolen) to the stream's pending bytes. */
static void emit(gen *q, json_t *j) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    size_t cap = q->out_len + 1;
    if (text) {
        append(&q->out, &q->out_len, &cap, "data: ", 6);
        append(&q->out, &q->out_len, &cap, text, strlen(text));
        append(&q->out, &q->out_len, &cap, "\n\n", 2);
    }
    free(text);
}

/* Fills the stream's pending bytes with what comes next. */
static void stream_produce(gen *q) {
    q->out_len = q->out_pos = 0;
    if (q->phase == 0) {
        q->phase = 1;
        gen_start(q);
        if (q->g.chat && !q->error)
            emit(q, envelope(q, true, choice_json(q, 0, 0, true, true, NULL)));
        return;
    }
    if (!q->finish) gen_step(q);
    const size_t safe = stream_safe(q);
    if (safe > q->sent && !q->error) {
        emit(q, envelope(q, true, choice_json(q, q->sent, safe, true, false, NULL)));
        q->sent = safe;
    }
    if (!q->finish) return;
    if (q->error) {
        emit(q, q->error);
        q->error = NULL;
    } else {
        emit(q, envelope(q, true, choice_json(q, q->sent, q->sent, true, false, q->finish)));
        if (q->g.include_usage) {
            json_t *u = envelope(q, true, NULL);
            json_object_set_new(u, "usage", usage_json(q));
            emit(q, u);
        }
    }
    size_t cap = q->out_len + 1;
    append(&q->out, &q->out_len, &cap, "data: [DONE]\n\n", 14);
    gen_end(q);
    q->phase = 2;
}

static void gen_free(gen *q) {
    gen_end(q);
    json_decref(q->error);
    json_decref(q->body);
    free(q->g.ids);
    free(q->text);
    free(q->out);
    free(q);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    gen *q = cls;
    (void)pos;
    while (q->out_pos == q->out_len) {
        if (q->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        stream_produce(q);
    }
    size_t n = q->out_len - q->out_pos < max ? q->out_len - q->out_pos : max;
    memcpy(buf, q->out + q->out_pos, n);
    q->out_pos += n;
    return (ssize_t)n;
}

/* Called when the stream ends or its client goes (a write to its closed
 * connection fails, a token or two after it left): the slot is freed. */
static void stream_free(void *cls) { gen_free(cls); }

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
    gen *q = calloc(1, sizeof *q);
    if (!q) {
        json_decref(j);
        return MHD_NO;
    }
    q->s = s;
    q->body = j;
    q->g.chat = chat;
    unsigned status = 0;
    json_t *err = parse_request(s, j, &q->g, &status);
    if (err) {
        gen_free(q);
        return send_json(c, status, err, NULL);
    }
    pthread_mutex_lock(&s->lock);
    const uint64_t id = ++s->next_id;
    pthread_mutex_unlock(&s->lock);
    snprintf(q->id, sizeof q->id, "%s-%" PRIu64, chat ? "chatcmpl" : "cmpl", id);
    q->created = (json_int_t)time(NULL);
    if (q->g.stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, q, stream_free);
        if (!r) {
            gen_free(q);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return ret;
    }
    gen_start(q);
    while (!q->finish)
        gen_step(q);
    gen_end(q);
    json_t *out;
    if (q->error) {
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        out = q->error;
        q->error = NULL;
    } else {
        status = MHD_HTTP_OK;
        out = envelope(q, false, choice_json(q, 0, q->len, false, false, q->finish));
        json_object_set_new(out, "usage", usage_json(q));
    }
    gen_free(q);
    return send_json(c, status, out, NULL);
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

static enum MHD_Result route(server *s, struct MHD_Connection *c, const char *url,
                             const char *method, const char *body, size_t len) {
    static const struct {
        const char *path, *method;
    } routes[] = {{"/health", "GET"},
                  {"/v1/models", "GET"},
                  {"/v1/chat/completions", "POST"},
                  {"/v1/completions", "POST"}};
    size_t r = 0;
    while (r < sizeof routes / sizeof routes[0] && strcmp(url, routes[r].path) != 0)
        r++;
    if (r != 0 && !authorized(s, c))
        return send_json(c, MHD_HTTP_UNAUTHORIZED,
                         error_json("invalid_request_error", "invalid_api_key",
                                    "a missing or incorrect API key: send the header "
                                    "'Authorization: Bearer KEY'"),
                         NULL);
    if (r == sizeof routes / sizeof routes[0])
        return send_json(
            c, MHD_HTTP_NOT_FOUND,
            error_json("invalid_request_error", "unknown_url", "no route %s %s", method, url),
            NULL);
    if (strcmp(method, routes[r].method) != 0)
        return send_json(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                         error_json("invalid_request_error", "method_not_allowed",
                                    "%s takes %s, not %s", url, routes[r].method, method),
                         routes[r].method);
    switch (r) {
    case 0:
        return send_json(c, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"), NULL);
    case 1:
        return send_json(c, MHD_HTTP_OK,
                         json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data",
                                   "id", s->model_id, "object", "model", "created",
                                   (json_int_t)time(NULL), "owned_by", "npumoe"),
                         NULL);
    default:
        return completion(s, c, body, len, r == 2);
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
    request_body *b = *con_cls;
    if (!b) {
        b = calloc(1, sizeof *b);
        *con_cls = b;
        return b ? MHD_YES : MHD_NO;
    }
    if (*upload_data_size) { /* the rest of an over-long body is read and dropped */
        if (!b->too_large && b->len + *upload_data_size <= BODY_LIMIT)
            b->too_large = !append(&b->bytes, &b->len, &b->cap, upload_data, *upload_data_size);
        else
            b->too_large = true;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (b->too_large)
        return send_json(c, MHD_HTTP_CONTENT_TOO_LARGE,
                         error_json("invalid_request_error", "request_too_large",
                                    "the request body is larger than %d bytes", BODY_LIMIT),
                         NULL);
    return route(cls, c, url, method, b->bytes, b->len);
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
    pthread_cond_init(&s.freed, NULL);
    nm_error err = {0};
    int rc = 0;
    if (open_session(model, o, false, &s.cs, &err) != NM_OK) {
        freeaddrinfo(ai);
        return fail_err(&err);
    }
    s.n_ctx = nm_session_n_ctx(s.cs.session);
    nm_model_info info;
    nm_model_get_info(model, &info);
    s.n_vocab = info.n_vocab;
    const char *base = strrchr(o->model, '/');
    snprintf(s.model_id, sizeof s.model_id, "%s", base ? base + 1 : o->model);
    /* the chat format is known now, not at the first request */
    char *probe = NULL;
    size_t probe_n = 0;
    const nm_chat_message hello = {"user", "hello"};
    if (nm_chat_apply_template(model, o->chat_template, &hello, 1, true, &probe, &probe_n, &err) !=
        NM_OK) {
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
                         MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
        d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, &s,
                             MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
                             (unsigned)CONNECTION_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT,
                             (unsigned)CONNECTION_LIMIT, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
                             NULL, MHD_OPTION_END);
        if (!d) rc = fail("cannot listen on %s port %s (in use? see the line above)", host, port);
    }
    freeaddrinfo(ai);
    if (d) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        fprintf(stderr,
                "npumoe: serving %s on http://%s:%u (context %d tokens, one request at a time; "
                "Ctrl-C stops)\n",
                s.model_id, host, di ? (unsigned)di->port : (unsigned)o->port, s.n_ctx);
        fflush(stderr);
        int sig = 0;
        sigwait(&stop_signals, &sig);
        s.stopping = 1; /* generations end at their next token */
        fprintf(stderr, "npumoe: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        MHD_stop_daemon(d);
    }
    close_session(&s.cs);
    pthread_cond_destroy(&s.freed);
    pthread_mutex_destroy(&s.lock);
    return rc;
}
