/* Chat prompts: the tokenizer.chat_template of the models npumoe runs,
 * recognised and rendered in C for a conversation (an optional system
 * message, then user messages and earlier answers) with or without the
 * generation prompt. Not a Jinja engine: a template
 * that is none of the known ones is an error that names the fallback
 * (choose a format by name, or give the prompt already formatted). */
#ifndef NM_CHAT_H
#define NM_CHAT_H

#include "npumoe.h"
#include "gguf/gguf.h"

#include <stddef.h>

typedef enum nm_chat_format {
    NM_CHAT_CHATML,  /* Qwen3 (and Qwen2): <|im_start|>role\n...<|im_end|>\n */
    NM_CHAT_PHI3,    /* Phi-3 / Phi-3.5(-MoE): <|user|>\n...<|end|>\n<|assistant|>\n */
    NM_CHAT_MISTRAL, /* Mixtral / Mistral v0.1 and Llama-2: [INST] ... [/INST] */
    NM_CHAT_COUNT
} nm_chat_format;

/* "chatml" (alias "qwen3"), "phi3", "mistral"; anything else is
 * NM_ERR_INVALID_ARG listing the names. */
nm_status nm_chat_format_parse(const char *name, nm_chat_format *out, nm_error *err);
const char *nm_chat_format_name(nm_chat_format f);

/* Recognises the file's tokenizer.chat_template by the markers its
 * rendering writes. NM_ERR_NOT_FOUND if the file has none,
 * NM_ERR_UNSUPPORTED if it is not one of the known formats; both messages
 * name the fallback. */
nm_status nm_chat_detect(const nm_gguf *gguf, nm_chat_format *out, nm_error *err);

/* Renders [system (may be NULL or empty)] + user + the generation prompt as
 * the format's template does with add_generation_prompt. BOS is not part
 * of the text (the tokenizer adds it where the vocabulary says so).
 * *out is allocated with nm_malloc (NUL-terminated, *n_out bytes before it);
 * free it with nm_free. */
nm_status nm_chat_apply(nm_chat_format f, const char *system, const char *user, char **out,
                        size_t *n_out, nm_error *err);

/* Renders a conversation (nm_chat_apply_template, npumoe.h, says the rules)
 * in format f; with add_generation_prompt, what opens the answer. *out as
 * for nm_chat_apply. */
nm_status nm_chat_render(nm_chat_format f, const nm_chat_message *messages, size_t n_messages,
                         bool add_generation_prompt, char **out, size_t *n_out, nm_error *err);

#endif /* NM_CHAT_H */
