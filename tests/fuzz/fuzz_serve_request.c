/* libFuzzer target: arbitrary bytes through npumoe serve's request parsing
 * (tools/cli/serve_request.c, parse_request), the function that turns a
 * request body into the prompt's tokens and the generation settings. The
 * first input byte picks the route (bit 0: chat, else completions) and the
 * context (64 + the other bits: 64..191 positions); the rest is the body,
 * parsed by jansson as the server does. Checks, independent of the parser:
 * - a refusal is an OpenAI-shaped error object (error.message, .type and
 *   .code strings, param null) with status 400 or 404, and serialises;
 * - an accepted request has 1 .. n_ctx-1 prompt tokens, each a vocabulary
 *   id, and 1 <= max_tokens <= the room after them (max_tokens as given
 *   when the body has an integer one); temperature, top_p, min_p, top_k in
 *   their ranges (the sampler takes them); at most 4 stop strings, each
 *   non-empty and one of the body's "stop"; stream as the body says.
 * And utf8_whole_len (serve.c's streams, error_json's cut messages) on the
 * body's bytes, where they are UTF-8 up to a character cut short: it cuts
 * exactly that character (a forward decoder here says where it starts).
 * The vocabulary and chat template are the shipped model's (loaded once, as
 * vocab_only). */
#include "../../tools/cli/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NM_SOURCE_DIR
#define NM_SOURCE_DIR "."
#endif

static nm_model *model;
static int32_t n_vocab;

static void fail(const char *what) {
    fprintf(stderr, "fuzz_serve_request: %s\n", what);
    abort();
}

static void load_once(void) {
    if (model) return;
    nm_model_params p = nm_model_default_params();
    p.vocab_only = true;
    nm_error err = {0};
    if (nm_model_load(NM_SOURCE_DIR "/models/npumoe-tiny-moe.gguf", &p, &model, &err) != NM_OK) {
        fprintf(stderr, "fuzz_serve_request: %s\n", err.msg);
        abort();
    }
    nm_model_info info;
    nm_model_get_info(model, &info);
    n_vocab = info.n_vocab;
}

static bool is_error(json_t *e) {
    json_t *o = json_object_get(e, "error");
    return json_is_object(o) && json_is_string(json_object_get(o, "message")) &&
           json_is_string(json_object_get(o, "type")) &&
           json_is_string(json_object_get(o, "code")) && json_is_null(json_object_get(o, "param"));
}

/* Whether s is the body's "stop" string or one of its array. */
static bool from_body(json_t *body, const char *s) {
    json_t *stop = json_object_get(body, "stop");
    if (json_is_string(stop)) return strcmp(json_string_value(stop), s) == 0;
    size_t i;
    json_t *one;
    json_array_foreach(stop, i, one) {
        if (json_is_string(one) && strcmp(json_string_value(one), s) == 0) return true;
    }
    return false;
}

/* Where the bytes s[0, n) stop being whole UTF-8 characters, decoding
 * forward: n when they all are; the start of a last character cut short
 * (its lead and only continuation bytes after it); -1 when anything else
 * is wrong. Overlong forms and surrogates are not looked for. */
static long utf8_cut_at(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const uint8_t c = s[i];
        const size_t want = c < 0x80                ? 1
                            : c >= 0xc0 && c < 0xe0 ? 2
                            : c >= 0xe0 && c < 0xf0 ? 3
                            : c >= 0xf0 && c < 0xf8 ? 4
                                                    : 0;
        if (want == 0) return -1;
        size_t k = 1;
        while (k < want && i + k < n && (s[i + k] & 0xc0) == 0x80)
            k++;
        if (k < want) return i + k == n ? (long)i : -1;
        i += want;
    }
    return (long)n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    load_once();
    const long cut = utf8_cut_at(data + 1, size - 1);
    if (cut >= 0 && utf8_whole_len((const char *)data + 1, 0, size - 1) != (size_t)cut)
        fail("utf8_whole_len does not cut the last character cut short");
    json_t *body = json_loadb((const char *)data + 1, size - 1, 0, NULL);
    if (!body) return 0;
    const request_env env = {.model = model,
                             .chat_template = "chatml",
                             .model_id = "npumoe-tiny-moe.gguf",
                             .n_ctx = 64 + (data[0] >> 1)};
    gen_request g = {.chat = data[0] & 1};
    unsigned status = 0;
    json_t *err = parse_request(&env, body, &g, &status);
    if (err) {
        if (!is_error(err)) fail("a refusal that is not an OpenAI-shaped error");
        if (status != 400 && status != 404) fail("a refusal's status is not 400 or 404");
        char *text = json_dumps(err, JSON_COMPACT);
        if (!text) fail("an error that does not serialise");
        free(text);
        json_decref(err);
    } else {
        if (g.n_ids < 1 || g.n_ids >= (size_t)env.n_ctx) fail("prompt length out of range");
        for (size_t i = 0; i < g.n_ids; i++)
            if (g.ids[i] < 0 || g.ids[i] >= n_vocab) fail("a token id outside the vocabulary");
        const int32_t room = env.n_ctx - (int32_t)g.n_ids;
        if (g.max_tokens < 1 || g.max_tokens > room) fail("max_tokens out of range");
        json_t *mt = json_object_get(body, "max_tokens");
        if (json_is_integer(mt) && json_integer_value(mt) != g.max_tokens)
            fail("max_tokens differs from the body's");
        const nm_sampler_params *sp = &g.sp;
        if (!(sp->temperature >= 0 && sp->temperature <= 100) ||
            !(sp->top_p > 0 && sp->top_p <= 1) || !(sp->min_p >= 0 && sp->min_p <= 1) ||
            sp->top_k < 0)
            fail("a sampling setting out of range");
        nm_sampler *s = NULL;
        nm_error e = {0};
        if (nm_sampler_new(sp, n_vocab, &s, &e) != NM_OK) fail("the sampler refuses the settings");
        nm_sampler_free(s);
        if (g.n_stops > MAX_STOPS) fail("more than 4 stop strings");
        for (size_t k = 0; k < g.n_stops; k++)
            if (!g.stops[k][0] || !from_body(body, g.stops[k])) fail("a stop string not asked for");
        if (g.stream != json_is_true(json_object_get(body, "stream"))) fail("stream differs");
    }
    free(g.ids);
    json_decref(body);
    return 0;
}
