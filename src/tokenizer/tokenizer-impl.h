/* Internals shared by the files of the tokenizer part (and its white-box
 * tests): the tokenizer's body, code point classes, UTF-8, the GPT-2 byte
 * alphabet, the pre-tokenizer and the BPE lookup tables. Callers outside
 * src/tokenizer/ use tokenizer.h only. */
#ifndef NM_TOKENIZER_IMPL_H
#define NM_TOKENIZER_IMPL_H

#include "tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- code point classes (unicode.c, unicode_tables.c) ---------------------- */

/* Class bits with llama.cpp's values (unicode_cpt_flags): a general
 * category's major class, or UNDEFINED for unassigned code points, plus the
 * White_Space property. Every code point has at least one bit, so 0 can
 * stand for "outside the text". */
enum {
    NM_UFLAG_UNDEFINED = 0x0001,
    NM_UFLAG_NUMBER = 0x0002,      /* \p{N} */
    NM_UFLAG_LETTER = 0x0004,      /* \p{L} */
    NM_UFLAG_SEPARATOR = 0x0008,   /* \p{Z} */
    NM_UFLAG_ACCENT_MARK = 0x0010, /* \p{M} */
    NM_UFLAG_PUNCTUATION = 0x0020, /* \p{P} */
    NM_UFLAG_SYMBOL = 0x0040,      /* \p{S} */
    NM_UFLAG_CONTROL = 0x0080,     /* \p{C} except unassigned */
    NM_UFLAG_WHITESPACE = 0x0100,  /* \s: the White_Space property */
};

/* Generated tables: range i is [start[i], start[i + 1]) (the last runs to
 * U+10FFFF) with class bits flags[i]. */
extern const uint32_t nm_unicode_n_ranges;
extern const uint32_t nm_unicode_range_start[];
extern const uint16_t nm_unicode_range_flags[];
extern const uint16_t nm_unicode_ascii_flags[128]; /* the same for U+0000..U+007F */

/* Class bits of a code point (cp <= 0x10FFFF). */
uint16_t nm_unicode_flags(uint32_t cp);

/* Checks that s[0..n) is UTF-8 as RFC 3629 defines it. On failure returns
 * false and sets *bad_offset to the first byte of the offending sequence and
 * *reason to a static description. */
bool nm_utf8_validate(const uint8_t *s, size_t n, size_t *bad_offset, const char **reason);

/* Decodes the code point at s[*pos] of text already validated, advancing
 * *pos past it. */
uint32_t nm_utf8_next(const uint8_t *s, size_t *pos);

/* Bytes of the UTF-8 form of cp (cp <= 0x10FFFF) written to out[0..4). */
int nm_utf8_encode(uint32_t cp, uint8_t out[4]);

/* The GPT-2 byte alphabet: every byte value is shown as a printable code
 * point (bytes that are printable Latin-1 stand for themselves, the others
 * become U+0100..U+0143 in order). */
uint32_t nm_gpt2_byte_to_cp(uint8_t byte);
/* The byte a code point stands for, or -1 if it is not in the alphabet. */
int nm_gpt2_cp_to_byte(uint32_t cp);

/* ---- pre-tokenizer (pretok.c) --------------------------------------------- */

/* llama.cpp's hand-written splitters for the Qwen2-family regex
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * LLAMA3 differs in \p{N}{1,3}; QWEN35 lets letter runs take \p{M} too.
 * GPT4O is o200k's (gpt-oss, llama4) as llama.cpp's std::regex matches it:
 * case-split letter runs with a trailing contraction (pretok.c). */
typedef enum nm_pretok_kind {
    NM_PRETOK_QWEN2,
    NM_PRETOK_QWEN35,
    NM_PRETOK_LLAMA3,
    NM_PRETOK_GPT4O,
} nm_pretok_kind;

/* One word of a fragment of n code points cpts[] with class bits flags[]:
 * returns the end (exclusive, > pos) of the word that starts at pos < n.
 * Calling it from 0 with each returned end walks the fragment's words. */
size_t nm_pretok_word_end(nm_pretok_kind kind, const uint32_t *cpts, const uint16_t *flags,
                          size_t n, size_t pos);

/* ---- token attributes ------------------------------------------------------ */

/* llama.cpp's llama_token_attr bits (a token may gain CONTROL at load). */
enum {
    NM_ATTR_UNDEFINED = 0,
    NM_ATTR_UNKNOWN = 1 << 0,
    NM_ATTR_UNUSED = 1 << 1,
    NM_ATTR_NORMAL = 1 << 2,
    NM_ATTR_CONTROL = 1 << 3,
    NM_ATTR_USER_DEFINED = 1 << 4,
    NM_ATTR_BYTE = 1 << 5,
    NM_ATTR_LSTRIP = 1 << 7,
    NM_ATTR_RSTRIP = 1 << 8,
};

/* ---- lookup tables (bpe.c) ------------------------------------------------- */

/* Token text -> id: open addressing over ids, linear probing. */
typedef struct nm_token_map {
    int32_t *slots; /* [mask + 1] token id, -1 = empty */
    uint64_t mask;
} nm_token_map;

/* (left id, right id) -> merge rank and the id of the merged token. */
typedef struct nm_merge_slot {
    uint64_t key;   /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;   /* index of the merge line: lower merges first */
    int32_t result; /* token id of left's text followed by right's */
} nm_merge_slot;

typedef struct nm_merge_map {
    nm_merge_slot *slots; /* [mask + 1] */
    uint64_t mask;
} nm_merge_map;

struct nm_tokenizer {
    int32_t n_vocab;
    const nm_gguf_str *text; /* [n_vocab] token texts, owned by the gguf */
    uint16_t *attr;          /* [n_vocab] NM_ATTR_* bits */
    nm_token_map tokens;
    nm_merge_map merges;
    int32_t n_merges;

    bool spm;              /* SentencePiece ("llama"): scores, no merges, no pre-tokenizer */
    bool add_space_prefix; /* SPM: a space before the first text fragment and after specials */
    float *scores;         /* [n_vocab] SPM piece scores (owned copy), NULL for BPE */
    int32_t spm_byte[256]; /* SPM: the token of each byte, "<0xHH>" or the byte itself, -1 = none */
    nm_pretok_kind pretok;
    bool ignore_merges; /* a word that is itself a token is not merged (llama3) */

    int32_t byte_token[256];       /* id of each byte's alphabet text, -1 if none */
    int32_t byte_fallback[256][2]; /* llama.cpp's last resort for those, -1 = none */

    int32_t bos, eos, eot, eom, unk, sep, pad;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    bool add_bos, add_eos;

    int32_t *special; /* [n_special] CONTROL/USER_DEFINED/UNKNOWN ids, longest first */
    int32_t n_special;
    int32_t *eog; /* [n_eog] end-of-generation ids, ascending */
    int32_t n_eog;
};

/* Builds the text -> id map; NM_ERR_FORMAT names a duplicate text. Empty
 * texts are left out (no text can match them). */
nm_status nm_token_map_build(nm_tokenizer *tok, nm_error *err);
/* The id of the token whose text is a followed by b (either may be empty),
 * or -1. */
int32_t nm_token_map_find2(const nm_tokenizer *tok, const uint8_t *a, size_t n_a, const uint8_t *b,
                           size_t n_b);

/* Reads and checks the merge lines (tokenizer.ggml.merges). */
nm_status nm_merge_map_build(nm_tokenizer *tok, const nm_gguf_value *merges, nm_error *err);
/* The merge of two adjacent tokens, or NULL. */
const nm_merge_slot *nm_merge_map_find(const nm_tokenizer *tok, int32_t left, int32_t right);

void nm_tokenizer_maps_free(nm_tokenizer *tok);

/* ---- encoding (encode.c, bpe.c) -------------------------------------------- */

/* Where ids go: the first cap are stored, all are counted. */
typedef struct nm_id_sink {
    int32_t *ids;
    size_t cap;
    size_t n;
} nm_id_sink;

static inline void nm_id_sink_push(nm_id_sink *sink, int32_t id) {
    if (sink->n < sink->cap) sink->ids[sink->n] = id;
    sink->n++;
}

/* Reusable working memory of the BPE merge loop, grown on demand. */
typedef struct nm_bpe_scratch {
    int32_t *sym_id;   /* [cap] token of each symbol, -1 = not a token, -2 = merged away */
    int32_t *sym_prev; /* [cap] */
    int32_t *sym_next; /* [cap] */
    void *heap;        /* [3 cap] pending merges */
    size_t cap;
    uint8_t *text; /* [text_cap] a word in the byte alphabet (ignore_merges) */
    size_t text_cap;
} nm_bpe_scratch;

void nm_bpe_scratch_free(nm_bpe_scratch *s);

/* Appends the ids of one pre-tokenized word (its raw bytes, n >= 1). */
nm_status nm_bpe_encode_word(const nm_tokenizer *tok, const uint8_t *word, size_t n,
                             nm_bpe_scratch *s, nm_id_sink *sink, nm_error *err);

/* ---- SentencePiece (spm.c) ------------------------------------------------- */

/* Working memory of one SPM fragment, grown on demand. */
typedef struct nm_spm_scratch {
    uint8_t *text; /* [text_cap] the escaped fragment */
    size_t text_cap;
    int32_t *sym_off, *sym_len, *sym_prev, *sym_next; /* [sym_cap] */
    void *heap;                                       /* [3 sym_cap] candidate bigrams */
    size_t sym_cap;
} nm_spm_scratch;

void nm_spm_scratch_free(nm_spm_scratch *s);

/* Appends the ids of one raw text fragment (n >= 1 bytes of valid UTF-8) the
 * way llama.cpp's llm_tokenizer_spm does: spaces become U+2581 (with one
 * prepended when space_prefix), every character starts as a symbol, the
 * adjacent pair whose concatenation is the vocabulary's highest-scoring
 * token merges first (ties: the leftmost), and a final symbol that is not
 * a token is written as its bytes' <0xHH> tokens. */
nm_status nm_spm_encode_fragment(const nm_tokenizer *tok, const uint8_t *s, size_t n,
                                 bool space_prefix, nm_spm_scratch *w, nm_id_sink *sink,
                                 nm_error *err);

#endif /* NM_TOKENIZER_IMPL_H */
