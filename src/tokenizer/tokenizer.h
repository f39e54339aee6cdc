/* Text <-> token ids for the vocabularies GGUF files carry, reproducing
 * llama.cpp's tokenizer (its goldens are our tests): GPT-2 byte-level BPE
 * (tokenizer.ggml.model "gpt2") with the qwen2, qwen35 and llama3
 * pre-tokenizers, SentencePiece ("llama": Llama-2, Mistral/Mixtral, Phi-3
 * vocabularies, with scores, byte fallback and the leading-space rule),
 * special-token matching, pieces for decoding, and chat templates.
 * Not here: detokenizer space clean-up. */
#ifndef NM_TOKENIZER_H
#define NM_TOKENIZER_H

#include "npumoe.h"
#include "gguf/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A loaded tokenizer is read-only: encode and piece may run on it from
 * several threads at once. */
typedef struct nm_tokenizer nm_tokenizer;

/* Reads tokenizer.ggml.* from an open GGUF (model, pre, tokens, token_type,
 * merges, bos/eos/eot/eom/unk/sep/pad/fim ids, add_bos_token/add_eos_token).
 * The tokenizer keeps pointers to the token texts inside the gguf, which
 * must outlive it; everything else it needs (types, lookup tables) it owns.
 * Failures:
 *   NM_ERR_UNSUPPORTED  a tokenizer.ggml.model other than "gpt2" or "llama", or a
 *                       pre-tokenizer other than qwen2/qwen35/llama3 (and
 *                       their aliases); the message names them;
 *   NM_ERR_FORMAT       malformed vocabulary: duplicate or missing token
 *                       texts, a merge line without a space or naming a
 *                       token (or producing one) not in the vocabulary,
 *                       token_type count or type mismatch, a special id out
 *                       of range, add_bos_token without a BOS id;
 *   NM_ERR_NOT_FOUND    tokenizer.ggml.tokens or .merges absent;
 *   NM_ERR_NOMEM. */
nm_status nm_tokenizer_load(const nm_gguf *gguf, nm_tokenizer **out, nm_error *err);
void nm_tokenizer_free(nm_tokenizer *tok);

int32_t nm_tokenizer_n_vocab(const nm_tokenizer *tok);
int32_t nm_tokenizer_bos(const nm_tokenizer *tok); /* -1 if none */
int32_t nm_tokenizer_eos(const nm_tokenizer *tok); /* -1 if none */
/* The file's add_bos_token / add_eos_token (llama3 vocabularies default to
 * adding BOS, the others to not). encode never appends EOS by itself. */
bool nm_tokenizer_add_bos(const nm_tokenizer *tok);
bool nm_tokenizer_add_eos(const nm_tokenizer *tok);

/* End of generation, decided as llama.cpp does: eos, eot, eom, the FIM
 * pad/repo/file-separator tokens, and every token whose text is one of the
 * end markers it knows (<|im_end|>, <|endoftext|>, <|eot_id|>, </s>, ...).
 * false for ids out of range. */
bool nm_tokenizer_is_eog(const nm_tokenizer *tok, int32_t id);

/* Encodes n_bytes of UTF-8 text (need not be NUL-terminated; may be NULL
 * when n_bytes is 0). Text that is not valid UTF-8 (overlong forms,
 * surrogates, code points above U+10FFFF, truncated sequences, stray
 * continuation bytes) is NM_ERR_FORMAT naming the byte offset. With add_bos
 * and a vocabulary that has a BOS id, the first id is BOS. With
 * parse_special, the texts of CONTROL tokens become their ids (USER_DEFINED
 * ones always do), longest first, as llama.cpp's tokenizer_st_partition
 * does. SentencePiece vocabularies (unless add_space_prefix is false) put
 * a space before the first text fragment and before each one that follows
 * a special token, as llama.cpp does. Up to cap ids are written to ids (which may be NULL with cap
 * 0 to count); *n_out receives the number of ids the text needs, and if that is more than cap the
 * result is NM_ERR_CAPACITY (ids[0..cap) then hold the first cap ids). */
nm_status nm_tokenizer_encode(const nm_tokenizer *tok, const char *text, size_t n_bytes,
                              bool add_bos, bool parse_special, int32_t *ids, size_t cap,
                              size_t *n_out, nm_error *err);

/* The bytes of one token, written to buf (at most cap of them; buf may be
 * NULL with cap 0). Byte-level BPE tokens are mapped back through the GPT-2
 * byte alphabet; USER_DEFINED tokens give their text; CONTROL and UNKNOWN
 * tokens give their text only with render_special, else 0 bytes; UNUSED
 * and UNDEFINED tokens give 0 bytes. Returns the piece's full length (which
 * may exceed cap: nothing past cap is written) or -1 for an id out of
 * range. SentencePiece NORMAL tokens show U+2581 as a space. Concatenating
 * the pieces (render_special on) of the ids encode gives for valid UTF-8
 * returns that text exactly (for SPM, with the prefixed spaces). */
int32_t nm_tokenizer_piece(const nm_tokenizer *tok, int32_t id, bool render_special, char *buf,
                           size_t cap);

/* ---- chat prompts (chat.c) ----
 * The tokenizer.chat_template of the models npumoe runs, recognised and
 * rendered in C for a conversation (an optional system message, then user
 * messages and earlier answers) with or without the generation prompt. Not
 * a Jinja engine: a template that is none of the known ones is an error that
 * names the fallback (choose a format by name, or give the prompt already
 * formatted). */

typedef enum nm_chat_format {
    NM_CHAT_CHATML,  /* Qwen3 (and Qwen2): <|im_start|>role\n...<|im_end|>\n */
    NM_CHAT_PHI3,    /* Phi-3 / Phi-3.5(-MoE): <|user|>\n...<|end|>\n<|assistant|>\n */
    NM_CHAT_MISTRAL, /* Mixtral / Mistral v0.1 and Llama-2: [INST] ... [/INST] */
    NM_CHAT_DEEPSEEK2, /* DeepSeek-V2(-Lite)-Chat: User: ...\n\nAssistant: */
    /* gpt-oss's harmony, as llama.cpp's built-in rendering (ik_llama.cpp's
     * llama_chat_apply_template): <|start|>role<|message|>...<|end|>, an
     * answer closed by <|return|>, the prompt <|start|>assistant; not the
     * full jinja template (no default system preamble, no channels) */
    NM_CHAT_HARMONY,
    NM_CHAT_COUNT
} nm_chat_format;

/* "chatml" (alias "qwen3"), "phi3", "mistral", "deepseek2", "harmony" (alias
 * "gpt-oss");
 * anything else is
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

#endif /* NM_TOKENIZER_H */
