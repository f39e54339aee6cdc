/* npumoe serve's requests: a completion request's JSON into the prompt's
 * tokens and the generation settings (serve.h, parse_request), with
 * OpenAI-shaped errors for whatever is wrong. Also the fuzz target's
 * subject (tests/fuzz/fuzz_serve_request.c). */
#include "serve.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HTTP_BAD_REQUEST = 400, HTTP_NOT_FOUND = 404 };

/* {"error":{"message":..,"type":..,"param":null,"code":..}} */
json_t *error_json(const char *type, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* a message cut short (a long model name in it) may end inside a UTF-8
     * sequence, which jansson refuses: NULL here would read as no error */
    if (n >= (int)sizeof msg) msg[utf8_whole_len(msg, 0, strlen(msg))] = '\0';
    json_t *e = json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type", type,
                          "param", "code", code);
    if (!e) /* still not text jansson takes: the error without its details */
        e = json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", "the request was refused",
                      "type", type, "param", "code", code);
    return e;
}

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
static json_t *prompt_text(const request_env *env, json_t *body, bool chat, char **text,
                           size_t *n) {
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
    if (!err && nm_chat_apply_template(env->model, env->chat_template, m, count, true, text, n,
                                       &e) != NM_OK)
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
json_t *parse_request(const request_env *env, json_t *body, gen_request *g, unsigned *status) {
    *status = HTTP_BAD_REQUEST;
    if (!json_is_object(body)) return bad_field("the request body", "a JSON object");
    json_t *model = json_object_get(body, "model");
    if (model && !json_is_null(model) && !json_is_string(model))
        return bad_field("model", "a string");
    if (json_is_string(model) && strcmp(json_string_value(model), env->model_id) != 0) {
        *status = HTTP_NOT_FOUND;
        return error_json("invalid_request_error", "model_not_found",
                          "The model '%s' does not exist (this server has '%s')",
                          json_string_value(model), env->model_id);
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
    if ((e = prompt_text(env, body, g->chat, &text, &n_bytes))) return e;
    nm_error err = {0};
    size_t n = 0;
    nm_status st = nm_tokenize(env->model, text, n_bytes, true, true, NULL, 0, &n, &err);
    if (st == NM_OK || st == NM_ERR_CAPACITY) {
        g->ids = malloc((n ? n : 1) * sizeof *g->ids);
        st = g->ids ? nm_tokenize(env->model, text, n_bytes, true, true, g->ids, n, &n, &err)
                    : NM_ERR_NOMEM;
    }
    free_text(text, g->chat);
    if (st != NM_OK) return bad_field("prompt", "text the tokenizer takes");
    g->n_ids = n;
    if (n == 0) return bad_field(g->chat ? "messages" : "prompt", "not empty");
    if (n >= (size_t)env->n_ctx)
        return error_json("invalid_request_error", "context_length_exceeded",
                          "This model's maximum context length is %d tokens. However, your "
                          "prompt has %zu tokens (-c N gives the server a larger context)",
                          env->n_ctx, n);
    const int32_t room = env->n_ctx - (int32_t)n;
    if (g->max_tokens > room)
        return error_json("invalid_request_error", "context_length_exceeded",
                          "This model's maximum context length is %d tokens. However, you "
                          "requested %zu tokens (%zu in the prompt, %d in the completion)",
                          env->n_ctx, n + (size_t)g->max_tokens, n, g->max_tokens);
    if (g->max_tokens < 0) g->max_tokens = room;
    return NULL;
}

size_t utf8_whole_len(const char *s, size_t from, size_t len) {
    /* back over at most three continuation bytes to the character's lead */
    size_t lead = len;
    while (lead > from && len - lead < 3 && ((unsigned char)s[lead - 1] & 0xc0) == 0x80)
        lead--;
    if (lead == from) return len;
    const unsigned c = (unsigned char)s[lead - 1];
    const size_t want = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    return c >= 0xc0 && lead - 1 + want > len ? lead - 1 : len;
}

bool text_append(char **buf, size_t *len, size_t *cap, const char *bytes, size_t n) {
    if (*len + n + 1 > *cap) {
        const size_t bigger = (*cap + n + 1) * 2;
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
