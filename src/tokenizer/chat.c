/* The chat formats of Qwen3, Phi-3.5, Mixtral, DeepSeek-V2 and gpt-oss, written
 * out in C from the templates those models ship (gpt-oss: as llama.cpp renders
 * its harmony format; see tokenizer.h), and their recognition. */
#include "tokenizer.h"

#include "base/base.h"

#include <string.h>

static const char *const format_names[NM_CHAT_COUNT] = {
    [NM_CHAT_CHATML] = "chatml",
    [NM_CHAT_PHI3] = "phi3",
    [NM_CHAT_MISTRAL] = "mistral",
    [NM_CHAT_DEEPSEEK2] = "deepseek2",
    [NM_CHAT_HARMONY] = "harmony",
};
_Static_assert(sizeof format_names / sizeof format_names[0] == NM_CHAT_COUNT,
               "one name per chat format");

#define FALLBACK                                                                                   \
    "choose one with --chat-template chatml|phi3|mistral|deepseek2|harmony, or drop --chat and "   \
    "give the prompt already formatted"

const char *nm_chat_format_name(nm_chat_format f) {
    return f >= 0 && f < NM_CHAT_COUNT ? format_names[f] : "?";
}

nm_status nm_chat_format_parse(const char *name, nm_chat_format *out, nm_error *err) {
    for (int f = 0; f < NM_CHAT_COUNT; f++)
        if (name && strcmp(name, format_names[f]) == 0) {
            *out = (nm_chat_format)f;
            return NM_OK;
        }
    if (name && (strcmp(name, "qwen3") == 0 || strcmp(name, "gpt-oss") == 0)) {
        *out = strcmp(name, "qwen3") == 0 ? NM_CHAT_CHATML : NM_CHAT_HARMONY;
        return NM_OK;
    }
    return nm_errorf(err, NM_ERR_INVALID_ARG,
                     "unknown chat template '%s' (known: chatml (qwen3), phi3, mistral, "
                     "deepseek2, harmony (gpt-oss))",
                     name ? name : "(null)");
}

static bool has(nm_gguf_str s, const char *what) {
    const size_t m = strlen(what);
    for (size_t i = 0; i + m <= s.len; i++)
        if (memcmp(s.ptr + i, what, m) == 0) return true;
    return false;
}

nm_status nm_chat_detect(const nm_gguf *gguf, nm_chat_format *out, nm_error *err) {
    if (!nm_gguf_find(gguf, "tokenizer.chat_template"))
        return nm_errorf(err, NM_ERR_NOT_FOUND,
                         "the model has no tokenizer.chat_template; " FALLBACK);
    nm_gguf_str t;
    nm_status st = nm_gguf_get_str(gguf, "tokenizer.chat_template", &t, err);
    if (st != NM_OK) return st;
    if (has(t, "<|im_start|>") && has(t, "<|im_end|>"))
        *out = NM_CHAT_CHATML;
    else if (has(t, "<|user|>") && has(t, "<|assistant|>") && has(t, "<|end|>"))
        *out = NM_CHAT_PHI3;
    else if (has(t, "[INST]") && has(t, "[/INST]"))
        *out = NM_CHAT_MISTRAL;
    else if (has(t, "'Assistant: ' + message['content'] + eos_token")) /* as llama.cpp tells it */
        *out = NM_CHAT_DEEPSEEK2;
    else if (has(t, "<|start|>") && has(t, "<|channel|>"))
        *out = NM_CHAT_HARMONY;
    else
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "the model's chat template (\"%.*s...\") is not one npumoe knows "
                         "(Qwen3/ChatML, Phi-3.5, Mixtral, DeepSeek-V2, gpt-oss/harmony); " FALLBACK,
                         (int)(t.len < 40 ? t.len : 40), t.ptr);
    return NM_OK;
}

/* Appends strings to a growing buffer; *ok turns false on out-of-memory. */
typedef struct text_buf {
    char *p;
    size_t n, cap;
    bool ok;
} text_buf;

static void put(text_buf *b, const char *s) {
    const size_t k = strlen(s);
    if (!b->ok) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = 2 * (b->n + k + 1);
        char *p = nm_realloc(b->p, cap);
        if (!p) {
            b->ok = false;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = '\0';
}

/* Whether role is one of the three; a system message only first. */
static nm_status check_messages(const nm_chat_message *m, size_t n, nm_error *err) {
    if (n == 0) return nm_errorf(err, NM_ERR_INVALID_ARG, "no chat messages");
    for (size_t i = 0; i < n; i++) {
        const char *r = m[i].role;
        if (!r || !m[i].content)
            return nm_errorf(err, NM_ERR_INVALID_ARG, "chat message %zu has no %s", i,
                             r ? "content" : "role");
        if (strcmp(r, "system") == 0 ? i != 0
                                     : strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0)
            return nm_errorf(err, NM_ERR_INVALID_ARG,
                             "chat message %zu: role '%s' (system first only, then user and "
                             "assistant)",
                             i, r);
    }
    return NM_OK;
}

/* ChatML and Phi-3: every message as "<open>role\ncontent<close>\n"; an
 * empty system message is skipped (Phi-3.5's template; Qwen3's writes none
 * by default). */
static void put_tagged(text_buf *b, nm_chat_format f, const nm_chat_message *m, size_t n,
                       bool add_gen) {
    const bool chatml = f == NM_CHAT_CHATML;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "system") == 0 && !*m[i].content) continue;
        put(b, chatml ? "<|im_start|>" : "<|");
        put(b, m[i].role);
        put(b, chatml ? "\n" : "|>\n");
        put(b, m[i].content);
        put(b, chatml ? "<|im_end|>\n" : "<|end|>\n");
    }
    if (add_gen) put(b, chatml ? "<|im_start|>assistant\n" : "<|assistant|>\n");
}

/* Mixtral-8x7B-Instruct-v0.1: bos_token, then per user message "[INST] " +
 * content + " [/INST]" and per answer content + eos_token; its template has
 * no system role, so the system text leads the first user message, as
 * llama.cpp's mistral-v1 does. The generation prompt is empty. */
static void put_mistral(text_buf *b, const nm_chat_message *m, size_t n) {
    const char *system = NULL;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "system") == 0) {
            system = *m[i].content ? m[i].content : NULL;
        } else if (strcmp(m[i].role, "user") == 0) {
            put(b, "[INST] ");
            if (system) {
                put(b, system);
                put(b, "\n\n");
                system = NULL;
            }
            put(b, m[i].content);
            put(b, " [/INST]");
        } else {
            put(b, m[i].content);
            put(b, "</s>");
        }
    }
}

/* DeepSeek-V2-Chat's template (bos_token is the tokenizer's): a system
 * message as its text + "\n\n", "User: " + content + "\n\n", answers
 * "Assistant: " + content + its eos_token; the generation prompt
 * "Assistant:". */
static void put_deepseek2(text_buf *b, const nm_chat_message *m, size_t n, bool add_gen) {
    for (size_t i = 0; i < n; i++) {
        const bool user = strcmp(m[i].role, "user") == 0, system = strcmp(m[i].role, "system") == 0;
        put(b, user ? "User: " : system ? "" : "Assistant: ");
        put(b, m[i].content);
        put(b, user || system ? "\n\n"
                              : "<\xef\xbd\x9c"
                                "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    }
    if (add_gen) put(b, "Assistant:");
}

/* gpt-oss's harmony as llama.cpp renders it: every message, an empty
 * system one included, as <|start|>role<|message|>content, closed by
 * <|return|> (an answer) or <|end|>; the generation prompt
 * <|start|>assistant. */
static void put_harmony(text_buf *b, const nm_chat_message *m, size_t n, bool add_gen) {
    for (size_t i = 0; i < n; i++) {
        put(b, "<|start|>");
        put(b, m[i].role);
        put(b, "<|message|>");
        put(b, m[i].content);
        put(b, strcmp(m[i].role, "assistant") == 0 ? "<|return|>" : "<|end|>");
    }
    if (add_gen) put(b, "<|start|>assistant");
}

nm_status nm_chat_render(nm_chat_format f, const nm_chat_message *messages, size_t n_messages,
                         bool add_generation_prompt, char **out, size_t *n_out, nm_error *err) {
    *out = NULL;
    *n_out = 0;
    nm_status st = check_messages(messages, n_messages, err);
    if (st != NM_OK) return st;
    if (f < 0 || f >= NM_CHAT_COUNT)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "chat format %d is not known", (int)f);
    text_buf b = {NULL, 0, 0, true};
    put(&b, "");
    if (f == NM_CHAT_MISTRAL)
        put_mistral(&b, messages, n_messages);
    else if (f == NM_CHAT_DEEPSEEK2)
        put_deepseek2(&b, messages, n_messages, add_generation_prompt);
    else if (f == NM_CHAT_HARMONY)
        put_harmony(&b, messages, n_messages, add_generation_prompt);
    else
        put_tagged(&b, f, messages, n_messages, add_generation_prompt);
    if (!b.ok) {
        nm_free(b.p);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the chat prompt");
    }
    *out = b.p;
    *n_out = b.n;
    return NM_OK;
}

nm_status nm_chat_apply(nm_chat_format f, const char *system, const char *user, char **out,
                        size_t *n_out, nm_error *err) {
    *out = NULL;
    *n_out = 0;
    if (!user) return nm_errorf(err, NM_ERR_INVALID_ARG, "no user message");
    const nm_chat_message m[2] = {{"system", system ? system : ""}, {"user", user}};
    return nm_chat_render(f, m + !system, system ? 2 : 1, true, out, n_out, err);
}
