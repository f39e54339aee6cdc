/* Loading a vocabulary from GGUF metadata and the decisions llama.cpp makes
 * about it at load time (llama_vocab::impl::load): token types, which
 * tokens are special, the "control-looking" tokens it re-types CONTROL,
 * end-of-generation ids, and the order special texts are matched in. Also
 * the piece of a token for decoding. Not here: encoding (encode.c, bpe.c,
 * pretok.c). */
#include "tokenizer-impl.h"

#include "base/base.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Token texts longer than this are refused: no real vocabulary comes close,
 * and it bounds the size of any piece (see decode_byte_level). */
#define MAX_TOKEN_BYTES 16384

/* ---- small helpers ------------------------------------------------------------ */

static int32_t find_text(const nm_tokenizer *tok, const char *s) {
    return nm_token_map_find2(tok, (const uint8_t *)s, strlen(s), NULL, 0);
}

static bool text_is(const nm_tokenizer *tok, int32_t id, const char *s) {
    return nm_gguf_str_eq(tok->text[id], s);
}

/* ---- vocabulary type ------------------------------------------------------------ */

/* tokenizer.ggml.pre values and how llama.cpp treats them; every other
 * pre-tokenizer (including a missing key, which llama.cpp reads as
 * "default") is refused. */
static const struct {
    const char *name;
    nm_pretok_kind kind;
} pretok_names[] = {
    {"qwen2", NM_PRETOK_QWEN2},     {"deepseek-r1-qwen", NM_PRETOK_QWEN2},
    {"qwen35", NM_PRETOK_QWEN35},   {"llama3", NM_PRETOK_LLAMA3},
    {"llama-v3", NM_PRETOK_LLAMA3}, {"llama-bpe", NM_PRETOK_LLAMA3},
    {"gpt-4o", NM_PRETOK_GPT4O},    {"llama4", NM_PRETOK_GPT4O},
    {"kanana2", NM_PRETOK_GPT4O},
};

static nm_status read_kind(nm_tokenizer *tok, const nm_gguf *gguf, nm_error *err) {
    nm_gguf_str model, pre;
    nm_status st = nm_gguf_get_str(gguf, "tokenizer.ggml.model", &model, err);
    if (st != NM_OK) return st;
    if (nm_gguf_str_eq(model, "llama")) {
        /* SentencePiece: llama.cpp's defaults are BOS added and a space
         * prefix; the keys read later may say otherwise */
        tok->spm = tok->add_bos = tok->add_space_prefix = true;
        return NM_OK;
    }
    if (!nm_gguf_str_eq(model, "gpt2"))
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "tokenizer.ggml.model '%.*s' is not supported (supported: gpt2, llama)",
                         (int)(model.len > 64 ? 64 : model.len), model.ptr);
    if (!nm_gguf_find(gguf, "tokenizer.ggml.pre"))
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "the file has no tokenizer.ggml.pre; llama.cpp would use its 'default' "
                         "BPE pre-tokenizer, which is not supported (supported: qwen2, qwen35, "
                         "llama3, gpt-4o)");
    if ((st = nm_gguf_get_str(gguf, "tokenizer.ggml.pre", &pre, err)) != NM_OK) return st;
    for (size_t i = 0; i < sizeof pretok_names / sizeof pretok_names[0]; i++) {
        if (nm_gguf_str_eq(pre, pretok_names[i].name)) {
            tok->pretok = pretok_names[i].kind;
            /* llama3: whole words found in the vocabulary skip the merges,
             * and BOS is added unless the file says otherwise; not so for
             * the others (gpt-4o included) */
            tok->ignore_merges = tok->add_bos = tok->pretok == NM_PRETOK_LLAMA3;
            return NM_OK;
        }
    }
    return nm_errorf(err, NM_ERR_UNSUPPORTED,
                     "pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported (supported: "
                     "qwen2, deepseek-r1-qwen, qwen35, llama3, llama-v3, llama-bpe, gpt-4o, "
                     "llama4, kanana2)",
                     (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
}

/* GGUF token types (llama_token_type) to attribute bits. */
static uint16_t attr_of_type(int64_t type) {
    switch (type) {
    case 1:
        return NM_ATTR_NORMAL;
    case 2:
        return NM_ATTR_UNKNOWN;
    case 3:
        return NM_ATTR_CONTROL;
    case 4:
        return NM_ATTR_USER_DEFINED;
    case 5:
        return NM_ATTR_UNUSED;
    case 6:
        return NM_ATTR_BYTE;
    default:
        return NM_ATTR_UNDEFINED; /* 0 and values llama.cpp does not know */
    }
}

static nm_status read_tokens(nm_tokenizer *tok, const nm_gguf *gguf, nm_error *err) {
    const nm_gguf_value *tokens, *types;
    nm_status st = nm_gguf_get_arr(gguf, "tokenizer.ggml.tokens", NM_GGUF_STRING, &tokens, err);
    if (st != NM_OK) return st;
    const uint64_t n = tokens->v.arr.n;
    if (n == 0 || n > INT32_MAX)
        return nm_errorf(err, NM_ERR_FORMAT, "tokenizer.ggml.tokens has %" PRIu64 " tokens", n);
    tok->n_vocab = (int32_t)n;
    tok->text = tokens->v.arr.data;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if (tok->text[id].len > MAX_TOKEN_BYTES)
            return nm_errorf(err, NM_ERR_FORMAT, "token %d is %" PRIu64 " bytes long (limit %d)",
                             id, tok->text[id].len, MAX_TOKEN_BYTES);

    if (!(tok->attr = nm_malloc(n * sizeof *tok->attr)))
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for %" PRIu64 " token types", n);
    if (nm_gguf_find(gguf, "tokenizer.ggml.token_type")) {
        st = nm_gguf_get_arr(gguf, "tokenizer.ggml.token_type", NM_GGUF_INT32, &types, err);
        if (st != NM_OK) return st;
        if (types->v.arr.n != n)
            return nm_errorf(err, NM_ERR_FORMAT,
                             "tokenizer.ggml.token_type has %" PRIu64 " entries for %" PRIu64
                             " tokens",
                             types->v.arr.n, n);
        for (int32_t id = 0; id < tok->n_vocab; id++)
            tok->attr[id] = attr_of_type(nm_gguf_arr_i64(types, (uint64_t)id));
    } else {
        for (int32_t id = 0; id < tok->n_vocab; id++)
            tok->attr[id] = NM_ATTR_NORMAL;
    }
    return nm_token_map_build(tok, err);
}

/* The token of each byte's alphabet text, and llama.cpp's fallback when a
 * vocabulary lacks one: the tokens whose text is a single byte of it. */
static void map_bytes(nm_tokenizer *tok) {
    for (int b = 0; b < 256; b++) {
        uint8_t utf8[4];
        const int n = nm_utf8_encode(nm_gpt2_byte_to_cp((uint8_t)b), utf8);
        tok->byte_token[b] = nm_token_map_find2(tok, utf8, (size_t)n, NULL, 0);
        tok->byte_fallback[b][0] = tok->byte_fallback[b][1] = -1;
        if (tok->byte_token[b] >= 0) continue;
        for (int k = 0; k < n; k++)
            tok->byte_fallback[b][k] = nm_token_map_find2(tok, &utf8[k], 1, NULL, 0);
    }
}

/* ---- special token ids ------------------------------------------------------------ */

static nm_status read_special_ids(nm_tokenizer *tok, const nm_gguf *gguf, nm_error *err) {
    const struct {
        const char *key;
        int32_t *id;
    } keys[] = {
        {"tokenizer.ggml.bos_token_id", &tok->bos},
        {"tokenizer.ggml.eos_token_id", &tok->eos},
        {"tokenizer.ggml.eot_token_id", &tok->eot},
        {"tokenizer.ggml.eom_token_id", &tok->eom},
        {"tokenizer.ggml.unknown_token_id", &tok->unk},
        {"tokenizer.ggml.seperator_token_id", &tok->sep}, /* sic, as llama.cpp spells it */
        {"tokenizer.ggml.padding_token_id", &tok->pad},
        {"tokenizer.ggml.fim_pre_token_id", &tok->fim_pre},
        {"tokenizer.ggml.fim_suf_token_id", &tok->fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &tok->fim_mid},
        {"tokenizer.ggml.fim_pad_token_id", &tok->fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &tok->fim_rep},
        {"tokenizer.ggml.fim_sep_token_id", &tok->fim_sep},
        /* deprecated names, read after the new ones as llama.cpp does */
        {"tokenizer.ggml.prefix_token_id", &tok->fim_pre},
        {"tokenizer.ggml.suffix_token_id", &tok->fim_suf},
        {"tokenizer.ggml.middle_token_id", &tok->fim_mid},
    };
    /* Absent ids are -1. (llama.cpp defaults a gpt2 vocabulary's BOS and EOS
     * to token 11, which is punctuation in most of them; we do not.) */
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        *keys[i].id = -1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (!nm_gguf_find(gguf, keys[i].key)) continue;
        uint32_t v;
        nm_status st = nm_gguf_get_u32(gguf, keys[i].key, &v, err);
        if (st != NM_OK) return st;
        if (v >= (uint32_t)tok->n_vocab)
            return nm_errorf(err, NM_ERR_FORMAT, "%s = %" PRIu32 " is not a token id (%d tokens)",
                             keys[i].key, v, tok->n_vocab);
        *keys[i].id = (int32_t)v;
    }
    const struct {
        const char *key;
        bool *flag;
    } flags[] = {
        {"tokenizer.ggml.add_bos_token", &tok->add_bos},
        {"tokenizer.ggml.add_eos_token", &tok->add_eos},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (!nm_gguf_find(gguf, flags[i].key)) continue;
        nm_status st = nm_gguf_get_bool(gguf, flags[i].key, flags[i].flag, err);
        if (st != NM_OK) return st;
    }
    if (tok->add_bos && tok->bos < 0)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "tokenizer.ggml.add_bos_token is true but there is no BOS id");
    if (tok->add_eos && tok->eos < 0)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "tokenizer.ggml.add_eos_token is true but there is no EOS id");
    return NM_OK;
}

/* ---- llama.cpp's load-time decisions ------------------------------------------------ */

/* Texts by which llama.cpp finds special ids a file does not name. Each list
 * ends with NULL. The lowest id whose text is listed wins (llama.cpp takes
 * the first in its hash map's order, which no vocabulary we know depends
 * on), and it becomes CONTROL if it was not. */
static const char *const eot_texts[] = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>",    "<EOT>",      "_<EOT>",  "[EOT]",         "<｜end▁of▁sentence｜>",
    "<end_of_utterance>", NULL,
};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {
    "<|fim_prefix|>",  "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",   NULL,
};
static const char *const fim_suf_texts[] = {
    "<|fim_suffix|>",  "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",   NULL,
};
static const char *const fim_mid_texts[] = {
    "<|fim_middle|>",  "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",   NULL,
};
static const char *const fim_pad_texts[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL,
};
static const char *const fim_rep_texts[] = {
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL,
};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};

/* Every token with one of these texts ends generation (and becomes CONTROL:
 * this is how Qwen3's ordinary token '</s>' comes to be matched as a special
 * token). */
static const char *const eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<eos>",
    "<turn|>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<|tool_response>",
    "[e~[",
    "<｜end▁of▁sentence｜>",
    NULL,
};

static void detect_id(nm_tokenizer *tok, int32_t *id, const char *const *texts) {
    if (*id >= 0) return;
    for (size_t i = 0; texts[i]; i++) {
        const int32_t t = find_text(tok, texts[i]);
        if (t >= 0 && (*id < 0 || t < *id)) *id = t;
    }
    if (*id >= 0) tok->attr[*id] |= NM_ATTR_CONTROL;
}

static bool contains(nm_gguf_str s, const char *what) {
    const size_t m = strlen(what);
    for (uint64_t i = 0; i + m <= s.len; i++)
        if (memcmp(s.ptr + i, what, m) == 0) return true;
    return false;
}

typedef struct id_list {
    int32_t *ids; /* [cap] */
    int32_t n, cap;
} id_list;

static nm_status add_id(id_list *l, int32_t id, nm_error *err) {
    for (int32_t i = 0; i < l->n; i++)
        if (l->ids[i] == id) return NM_OK;
    if (l->n == l->cap) {
        int32_t cap = l->cap ? 2 * l->cap : 16;
        int32_t *p = nm_realloc(l->ids, (size_t)cap * sizeof *p);
        if (!p) return nm_errorf(err, NM_ERR_NOMEM, "out of memory listing special tokens");
        l->ids = p;
        l->cap = cap;
    }
    l->ids[l->n++] = id;
    return NM_OK;
}

static void remove_id(id_list *l, int32_t id) {
    for (int32_t i = 0; i < l->n; i++)
        if (l->ids[i] == id) l->ids[i] = l->ids[--l->n];
}

static int32_t eog_with_text(const nm_tokenizer *tok, const id_list *eog, const char *s) {
    for (int32_t i = 0; i < eog->n; i++)
        if (text_is(tok, eog->ids[i], s)) return eog->ids[i];
    return -1;
}

static int compare_ids(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static nm_status decide_eog(nm_tokenizer *tok, nm_error *err) {
    id_list eog = {0};
    nm_status st = NM_OK;
    const int32_t fixed[] = {tok->fim_pad, tok->fim_rep, tok->fim_sep};
    for (size_t i = 0; i < 3 && st == NM_OK; i++)
        if (fixed[i] >= 0) st = add_id(&eog, fixed[i], err);
    for (size_t i = 0; eog_texts[i] && st == NM_OK; i++) {
        const int32_t id = find_text(tok, eog_texts[i]);
        if (id < 0) continue;
        tok->attr[id] |= NM_ATTR_CONTROL;
        st = add_id(&eog, id, err);
    }
    /* llama.cpp's gpt-oss hack: these always render as text */
    static const char *const rendered[] = {"<|channel|>", "<|message|>", "<|start|>",
                                           "<|constrain|>"};
    for (size_t i = 0; i < 4; i++) {
        const int32_t id = find_text(tok, rendered[i]);
        if (id >= 0) tok->attr[id] = NM_ATTR_USER_DEFINED;
    }
    const int32_t named[] = {tok->eos, tok->eot, tok->eom};
    for (size_t i = 0; i < 3 && st == NM_OK; i++)
        if (named[i] >= 0) st = add_id(&eog, named[i], err);
    if (st != NM_OK) {
        nm_free(eog.ids);
        return st;
    }
    /* o200k_harmony and solar-open: <|end|> does not end generation there */
    const int32_t end = eog_with_text(tok, &eog, "<|end|>");
    const bool has_call =
        eog_with_text(tok, &eog, "<|call|>") >= 0 || eog_with_text(tok, &eog, "<|calls|>") >= 0;
    if (end >= 0 && has_call &&
        (eog_with_text(tok, &eog, "<|return|>") >= 0 ||
         eog_with_text(tok, &eog, "<|flush|>") >= 0)) {
        remove_id(&eog, end);
        tok->attr[end] = NM_ATTR_USER_DEFINED;
    }
    /* gemma4 and paddleocr: </s> does not either */
    const int32_t s_end = eog_with_text(tok, &eog, "</s>");
    if (s_end >= 0 && eog_with_text(tok, &eog, "<|tool_response>") >= 0) {
        remove_id(&eog, s_end);
        tok->attr[s_end] = NM_ATTR_NORMAL;
    }
    if (eog.n) qsort(eog.ids, (size_t)eog.n, sizeof *eog.ids, compare_ids);
    tok->eog = eog.ids;
    tok->n_eog = eog.n;
    return NM_OK;
}

/* Special texts are matched longest first; equal lengths by id (llama.cpp's
 * std::sort leaves their order unspecified; it only matters for two
 * different texts of one length that overlap in the input). */
typedef struct special_key {
    uint64_t len;
    int32_t id;
} special_key;

static int compare_special(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static nm_status list_special(nm_tokenizer *tok, nm_error *err) {
    const uint16_t special = NM_ATTR_CONTROL | NM_ATTR_USER_DEFINED | NM_ATTR_UNKNOWN;
    int32_t n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if ((tok->attr[id] & special) && tok->text[id].len) n++;
    if (n == 0) return NM_OK;
    special_key *keys = nm_malloc((size_t)n * sizeof *keys);
    tok->special = nm_malloc((size_t)n * sizeof *tok->special);
    if (!keys || !tok->special) {
        nm_free(keys);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory listing %d special tokens", n);
    }
    int32_t k = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if ((tok->attr[id] & special) && tok->text[id].len)
            keys[k++] = (special_key){tok->text[id].len, id};
    qsort(keys, (size_t)n, sizeof *keys, compare_special);
    for (int32_t i = 0; i < n; i++)
        tok->special[i] = keys[i].id;
    tok->n_special = n;
    nm_free(keys);
    return NM_OK;
}

/* llama.cpp strips the whitespace after every special token of a model
 * whose general.name says Phi-3 (its added tokens are rstrip in HF). */
static void strip_rules(nm_tokenizer *tok, const nm_gguf *gguf) {
    const nm_gguf_value *name = nm_gguf_find(gguf, "general.name");
    if (!name || name->type != NM_GGUF_STRING) return;
    char lower[256];
    const size_t n = name->v.str.len < sizeof lower - 1 ? name->v.str.len : sizeof lower - 1;
    for (size_t i = 0; i < n; i++) {
        const char c = name->v.str.ptr[i];
        lower[i] = c >= 'A' && c <= 'Z' ? (char)(c + ('a' - 'A')) : c;
    }
    lower[n] = '\0';
    if (!strstr(lower, "phi-3") && !strstr(lower, "phi3")) return;
    for (int32_t i = 0; i < tok->n_special; i++)
        tok->attr[tok->special[i]] |= NM_ATTR_RSTRIP;
    const int32_t s_end = find_text(tok, "</s>");
    if (s_end >= 0) tok->attr[s_end] |= NM_ATTR_RSTRIP;
    static const char *const kept[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t i = 0; i < 3; i++) {
        const int32_t id = find_text(tok, kept[i]);
        if (id >= 0) tok->attr[id] &= (uint16_t)~NM_ATTR_RSTRIP;
    }
}

/* SentencePiece: the scores, the space-prefix flag and the byte tokens
 * (llama.cpp's byte_to_token: "<0xHH>", else the one-byte text). */
static nm_status read_spm(nm_tokenizer *tok, const nm_gguf *gguf, nm_error *err) {
    const nm_gguf_value *scores;
    nm_status st = nm_gguf_get_arr(gguf, "tokenizer.ggml.scores", NM_GGUF_FLOAT32, &scores, err);
    if (st != NM_OK) return st;
    if (scores->v.arr.n != (uint64_t)tok->n_vocab)
        return nm_errorf(err, NM_ERR_FORMAT,
                         "tokenizer.ggml.scores has %" PRIu64 " entries for %d tokens",
                         scores->v.arr.n, tok->n_vocab);
    if (!(tok->scores = nm_malloc((size_t)tok->n_vocab * sizeof *tok->scores)))
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for %d scores", tok->n_vocab);
    memcpy(tok->scores, scores->v.arr.data, (size_t)tok->n_vocab * sizeof *tok->scores);
    if (nm_gguf_find(gguf, "tokenizer.ggml.add_space_prefix") &&
        (st = nm_gguf_get_bool(gguf, "tokenizer.ggml.add_space_prefix", &tok->add_space_prefix,
                               err)) != NM_OK)
        return st;
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        tok->spm_byte[b] = find_text(tok, hex);
        if (tok->spm_byte[b] < 0) {
            const uint8_t byte = (uint8_t)b;
            tok->spm_byte[b] = nm_token_map_find2(tok, &byte, 1, NULL, 0);
        }
    }
    return NM_OK;
}

static nm_status load_into(nm_tokenizer *tok, const nm_gguf *gguf, nm_error *err) {
    nm_status st;
    const nm_gguf_value *merges;
    if ((st = read_kind(tok, gguf, err)) != NM_OK) return st;
    if ((st = read_tokens(tok, gguf, err)) != NM_OK) return st;
    if (tok->spm) {
        if ((st = read_spm(tok, gguf, err)) != NM_OK) return st;
    } else {
        st = nm_gguf_get_arr(gguf, "tokenizer.ggml.merges", NM_GGUF_STRING, &merges, err);
        if (st != NM_OK) return st;
        if ((st = nm_merge_map_build(tok, merges, err)) != NM_OK) return st;
        map_bytes(tok);
    }
    if ((st = read_special_ids(tok, gguf, err)) != NM_OK) return st;

    /* the order of llama.cpp's load: find unnamed ids by text, mark unused
     * control tokens, then the end-of-generation set */
    detect_id(tok, &tok->eot, eot_texts);
    detect_id(tok, &tok->eom, eom_texts);
    detect_id(tok, &tok->fim_pre, fim_pre_texts);
    detect_id(tok, &tok->fim_suf, fim_suf_texts);
    detect_id(tok, &tok->fim_mid, fim_mid_texts);
    detect_id(tok, &tok->fim_pad, fim_pad_texts);
    detect_id(tok, &tok->fim_rep, fim_rep_texts);
    detect_id(tok, &tok->fim_sep, fim_sep_texts);
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if ((tok->attr[id] & NM_ATTR_CONTROL) && contains(tok->text[id], "unused"))
            tok->attr[id] |= NM_ATTR_UNUSED;
    if ((st = decide_eog(tok, err)) != NM_OK) return st;
    if ((st = list_special(tok, err)) != NM_OK) return st;
    strip_rules(tok, gguf);
    return NM_OK;
}

nm_status nm_tokenizer_load(const nm_gguf *gguf, nm_tokenizer **out, nm_error *err) {
    NM_ASSERT(gguf && out);
    *out = NULL;
    nm_tokenizer *tok = nm_calloc(1, sizeof *tok);
    if (!tok) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the tokenizer");
    nm_status st = load_into(tok, gguf, err);
    if (st != NM_OK) {
        nm_tokenizer_free(tok);
        return nm_error_prefix(err, "tokenizer");
    }
    *out = tok;
    return NM_OK;
}

void nm_tokenizer_free(nm_tokenizer *tok) {
    if (!tok) return;
    nm_tokenizer_maps_free(tok);
    nm_free(tok->attr);
    nm_free(tok->scores);
    nm_free(tok->special);
    nm_free(tok->eog);
    nm_free(tok);
}

/* ---- accessors ------------------------------------------------------------------------- */

int32_t nm_tokenizer_n_vocab(const nm_tokenizer *tok) { return tok->n_vocab; }
int32_t nm_tokenizer_bos(const nm_tokenizer *tok) { return tok->bos; }
int32_t nm_tokenizer_eos(const nm_tokenizer *tok) { return tok->eos; }
bool nm_tokenizer_add_bos(const nm_tokenizer *tok) { return tok->add_bos; }
bool nm_tokenizer_add_eos(const nm_tokenizer *tok) { return tok->add_eos; }

bool nm_tokenizer_is_eog(const nm_tokenizer *tok, int32_t id) {
    int32_t lo = 0, hi = tok->n_eog;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (tok->eog[mid] == id) return true;
        if (tok->eog[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* ---- pieces ------------------------------------------------------------------------------ */

/* Bytes written up to cap, all of them counted. */
typedef struct piece_out {
    char *buf;
    size_t cap, n;
} piece_out;

static void put(piece_out *o, const void *p, size_t k) {
    if (o->n < o->cap) {
        const size_t room = o->cap - o->n;
        memcpy(o->buf + o->n, p, k < room ? k : room);
    }
    o->n += k;
}

/* llama.cpp's lenient UTF-8 reading of token texts (unicode_cpt_from_utf8):
 * the lead byte's length, continuation bytes checked, no overlong or range
 * check; a bad lead or continuation gives U+FFFD and one byte. */
static uint32_t lenient_next(const uint8_t *s, size_t n, size_t *pos) {
    const size_t i = *pos;
    const uint8_t b = s[i];
    size_t len = b < 0x80 ? 1 : b < 0xC0 ? 0 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : b < 0xF8 ? 4 : 0;
    for (size_t k = 1; len && k < len; k++)
        if (i + k >= n || (s[i + k] & 0xC0) != 0x80) len = 0;
    if (!len) {
        *pos = i + 1;
        return 0xFFFD;
    }
    *pos = i + len;
    if (len == 1) return b;
    uint32_t cp = b & (0x7F >> len);
    for (size_t k = 1; k < len; k++)
        cp = cp << 6 | (s[i + k] & 0x3F);
    return cp;
}

/* A NORMAL token's text through the byte alphabet back to bytes. A code
 * point outside the alphabet becomes what llama.cpp writes for it,
 * "[UNK_BYTE_0x<its UTF-8 in hex><the whole token text>]". */
static void decode_byte_level(nm_gguf_str text, piece_out *o) {
    const uint8_t *s = (const uint8_t *)text.ptr;
    for (size_t pos = 0; pos < text.len;) {
        const size_t start = pos;
        const uint32_t cp = lenient_next(s, text.len, &pos);
        const int byte = nm_gpt2_cp_to_byte(cp);
        if (byte >= 0) {
            const uint8_t b = (uint8_t)byte;
            put(o, &b, 1);
            continue;
        }
        uint8_t utf8[4];
        /* beyond U+10FFFF (a lead byte F5..F7) there is no UTF-8 form: show
         * the bytes read */
        const size_t n = cp <= 0x10FFFF ? (size_t)nm_utf8_encode(cp, utf8) : pos - start;
        const uint8_t *shown = cp <= 0x10FFFF ? utf8 : s + start;
        static const char hex[] = "0123456789abcdef";
        put(o, "[UNK_BYTE_0x", 12);
        for (size_t k = 0; k < n; k++) {
            const char h[2] = {hex[shown[k] >> 4], hex[shown[k] & 15]};
            put(o, h, 2);
        }
        put(o, text.ptr, text.len);
        put(o, "]", 1);
    }
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int32_t nm_tokenizer_piece(const nm_tokenizer *tok, int32_t id, bool render_special, char *buf,
                           size_t cap) {
    NM_ASSERT(tok);
    NM_ASSERT(buf || cap == 0);
    if (id < 0 || id >= tok->n_vocab) return -1;
    const uint16_t attr = tok->attr[id];
    const nm_gguf_str text = tok->text[id];
    piece_out o = {buf, cap, 0};
    if (attr & (NM_ATTR_UNKNOWN | NM_ATTR_CONTROL)) {
        if (render_special) put(&o, text.ptr, text.len);
    } else if (attr & NM_ATTR_USER_DEFINED) {
        put(&o, text.ptr, text.len);
    } else if ((attr & NM_ATTR_NORMAL) && tok->spm) {
        /* U+2581 stands for a space */
        for (size_t i = 0; i < text.len;) {
            if (i + 3 <= text.len && memcmp(text.ptr + i, "\xE2\x96\x81", 3) == 0) {
                put(&o, " ", 1);
                i += 3;
            } else {
                put(&o, text.ptr + i, 1);
                i++;
            }
        }
    } else if (attr & NM_ATTR_NORMAL) {
        decode_byte_level(text, &o);
    } else if (attr & NM_ATTR_BYTE) {
        /* "<0xHH>"; anything else gives no bytes */
        if (text.len == 6 && memcmp(text.ptr, "<0x", 3) == 0 && text.ptr[5] == '>' &&
            hex_digit(text.ptr[3]) >= 0 && hex_digit(text.ptr[4]) >= 0) {
            const uint8_t b = (uint8_t)(hex_digit(text.ptr[3]) * 16 + hex_digit(text.ptr[4]));
            put(&o, &b, 1);
        }
    }
    /* UNUSED and UNDEFINED tokens render as nothing, as in llama.cpp */
    return (int32_t)o.n;
}
