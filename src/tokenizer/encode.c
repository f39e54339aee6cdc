/* Encoding a text: UTF-8 validation, special-token matching (llama.cpp's
 * tokenizer_st_partition), then pre-tokenization and BPE of each remaining
 * text fragment. Working memory is allocated per call and sized by the text;
 * ids go to the caller's buffer (count-then-fill). Not here: the word
 * splitter (pretok.c), merges (bpe.c), loading (tokenizer.c). */
#include "tokenizer-impl.h"

#include "base/base.h"

#include <string.h>

/* A piece of the input after special-token matching: a special token, or
 * raw text to pre-tokenize. */
typedef struct fragment {
    size_t off, len; /* bytes of the input */
    int32_t token;   /* the special token, or -1 for raw text */
} fragment;

typedef struct fragment_list {
    fragment *items; /* [cap] */
    size_t n, cap;
} fragment_list;

/* Everything one encode call allocates. */
typedef struct encode_work {
    fragment_list frags, next;
    uint32_t *cpts;  /* [cap_cpts] code points of one fragment */
    uint16_t *flags; /* [cap_cpts] their classes */
    size_t cap_cpts;
    nm_bpe_scratch bpe;
    nm_spm_scratch spm;
} encode_work;

static void work_free(encode_work *w) {
    nm_free(w->frags.items);
    nm_free(w->next.items);
    nm_free(w->cpts);
    nm_free(w->flags);
    nm_bpe_scratch_free(&w->bpe);
    nm_spm_scratch_free(&w->spm);
}

static nm_status push_fragment(fragment_list *list, size_t off, size_t len, int32_t token,
                               nm_error *err) {
    if (list->n == list->cap) {
        size_t cap = list->cap ? 2 * list->cap : 16, n_bytes;
        fragment *p =
            nm_mul_size(cap, sizeof *p, &n_bytes) ? nm_realloc(list->items, n_bytes) : NULL;
        if (!p) return nm_errorf(err, NM_ERR_NOMEM, "out of memory splitting special tokens");
        list->items = p;
        list->cap = cap;
    }
    list->items[list->n++] = (fragment){off, len, token};
    return NM_OK;
}

/* First occurrence of needle (m >= 1 bytes) in hay[0..n), or NULL. */
static const uint8_t *find_bytes(const uint8_t *hay, size_t n, const uint8_t *needle, size_t m) {
    if (m > n) return NULL;
    const uint8_t *p = hay, *last = hay + (n - m);
    while (p <= last) {
        p = memchr(p, needle[0], (size_t)(last - p) + 1);
        if (!p) return NULL;
        if (memcmp(p + 1, needle + 1, m - 1) == 0) return p;
        p++;
    }
    return NULL;
}

/* isspace() in the C locale, which is what llama.cpp's LSTRIP/RSTRIP use. */
static bool is_c_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Cuts one special token out of every raw fragment of w->frags, leftmost
 * occurrence first, into w->next, then swaps the lists. */
static nm_status cut_special(const nm_tokenizer *tok, const uint8_t *text, int32_t id,
                             encode_work *w, nm_error *err) {
    const uint8_t *needle = (const uint8_t *)tok->text[id].ptr;
    const size_t m = tok->text[id].len;
    const uint16_t attr = tok->attr[id];
    nm_status st;
    w->next.n = 0;
    for (size_t i = 0; i < w->frags.n; i++) {
        const fragment f = w->frags.items[i];
        if (f.token >= 0) {
            if ((st = push_fragment(&w->next, f.off, f.len, f.token, err)) != NM_OK) return st;
            continue;
        }
        size_t base = f.off;
        const size_t end = f.off + f.len;
        for (;;) {
            const uint8_t *hit = find_bytes(text + base, end - base, needle, m);
            if (!hit) {
                if (end > base &&
                    (st = push_fragment(&w->next, base, end - base, -1, err)) != NM_OK)
                    return st;
                break;
            }
            const size_t at = (size_t)(hit - text);
            size_t n_left = at - base;
            if (attr & NM_ATTR_LSTRIP)
                while (n_left > 0 && is_c_space(text[base + n_left - 1]))
                    n_left--;
            if (n_left && (st = push_fragment(&w->next, base, n_left, -1, err)) != NM_OK) return st;
            if ((st = push_fragment(&w->next, at, m, id, err)) != NM_OK) return st;
            base = at + m;
            if (attr & NM_ATTR_RSTRIP)
                while (base < end && is_c_space(text[base]))
                    base++;
        }
    }
    const fragment_list t = w->frags;
    w->frags = w->next;
    w->next = t;
    return NM_OK;
}

static size_t utf8_len(uint32_t cp) {
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* Pre-tokenizes one raw fragment and BPE-encodes each of its words. */
static nm_status encode_fragment(const nm_tokenizer *tok, const uint8_t *s, size_t n,
                                 encode_work *w, nm_id_sink *sink, nm_error *err) {
    if (n > w->cap_cpts) {
        size_t n_cp_bytes, n_flag_bytes;
        uint32_t *cpts =
            nm_mul_size(n, sizeof *cpts, &n_cp_bytes) ? nm_realloc(w->cpts, n_cp_bytes) : NULL;
        if (cpts) w->cpts = cpts;
        uint16_t *flags = cpts && nm_mul_size(n, sizeof *flags, &n_flag_bytes)
                              ? nm_realloc(w->flags, n_flag_bytes)
                              : NULL;
        if (flags) w->flags = flags;
        if (!cpts || !flags)
            return nm_errorf(err, NM_ERR_NOMEM, "out of memory encoding %zu bytes of text", n);
        w->cap_cpts = n;
    }
    size_t n_cp = 0;
    for (size_t pos = 0; pos < n; n_cp++) {
        w->cpts[n_cp] = nm_utf8_next(s, &pos);
        w->flags[n_cp] = nm_unicode_flags(w->cpts[n_cp]);
    }
    size_t byte = 0;
    for (size_t cp = 0; cp < n_cp;) {
        const size_t end = nm_pretok_word_end(tok->pretok, w->cpts, w->flags, n_cp, cp);
        size_t n_word = 0;
        for (size_t i = cp; i < end; i++)
            n_word += utf8_len(w->cpts[i]);
        nm_status st = nm_bpe_encode_word(tok, s + byte, n_word, &w->bpe, sink, err);
        if (st != NM_OK) return st;
        byte += n_word;
        cp = end;
    }
    return NM_OK;
}

static nm_status encode_all(const nm_tokenizer *tok, const uint8_t *s, size_t n, bool parse_special,
                            encode_work *w, nm_id_sink *sink, nm_error *err) {
    nm_status st;
    if (n == 0) return NM_OK;
    if ((st = push_fragment(&w->frags, 0, n, -1, err)) != NM_OK) return st;
    for (int32_t k = 0; k < tok->n_special; k++) {
        const int32_t id = tok->special[k];
        /* user-defined tokens are matched even without parse_special */
        if (!parse_special && (tok->attr[id] & (NM_ATTR_CONTROL | NM_ATTR_UNKNOWN))) continue;
        if ((st = cut_special(tok, s, id, w, err)) != NM_OK) return st;
    }
    /* SPM: llama.cpp prefixes a space to the first text fragment and to
     * every one that follows a special token */
    bool after_special = true;
    for (size_t i = 0; i < w->frags.n; i++) {
        const fragment f = w->frags.items[i];
        st = NM_OK;
        if (f.token >= 0)
            nm_id_sink_push(sink, f.token);
        else if (tok->spm)
            st = nm_spm_encode_fragment(tok, s + f.off, f.len,
                                        tok->add_space_prefix && after_special, &w->spm, sink, err);
        else
            st = encode_fragment(tok, s + f.off, f.len, w, sink, err);
        if (st != NM_OK) return st;
        after_special = f.token >= 0;
    }
    return NM_OK;
}

nm_status nm_tokenizer_encode(const nm_tokenizer *tok, const char *text, size_t n_bytes,
                              bool add_bos, bool parse_special, int32_t *ids, size_t cap,
                              size_t *n_out, nm_error *err) {
    NM_ASSERT(tok && n_out);
    NM_ASSERT(text || n_bytes == 0);
    NM_ASSERT(ids || cap == 0);
    *n_out = 0;
    const uint8_t *s = (const uint8_t *)text;
    size_t bad;
    const char *why;
    if (n_bytes && !nm_utf8_validate(s, n_bytes, &bad, &why))
        return nm_errorf(err, NM_ERR_FORMAT,
                         "text is not valid UTF-8: %s at byte offset %zu (byte 0x%02X)", why, bad,
                         s[bad]);

    nm_id_sink sink = {ids, cap, 0};
    if (add_bos && tok->bos >= 0) nm_id_sink_push(&sink, tok->bos);
    encode_work w = {0};
    nm_status st = encode_all(tok, s, n_bytes, parse_special, &w, &sink, err);
    work_free(&w);
    if (st != NM_OK) return st;
    *n_out = sink.n;
    if (sink.n > cap)
        return nm_errorf(err, NM_ERR_CAPACITY, "the text needs %zu token ids, room for %zu", sink.n,
                         cap);
    return NM_OK;
}
