/* SentencePiece encoding of one text fragment as llama.cpp's
 * llm_tokenizer_spm_session does it (Llama-2, Mistral/Mixtral, Phi-3
 * vocabularies): greedy merging of adjacent symbols by the score of the
 * token they form, byte fallback for what stays unknown. Loading and
 * special tokens are tokenizer.c's; fragments come from encode.c. */
#include "tokenizer-impl.h"

#include "base/base.h"

#include <string.h>

/* A candidate merge of symbols left and right (adjacent when queued). */
typedef struct bigram {
    float score;
    int32_t left, right;
    int32_t size; /* bytes of left + right when queued: stale if it changed */
} bigram;

/* Higher score first; equal scores: the leftmost first. */
static bool before(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(bigram *h, size_t *n, bigram b) {
    size_t i = (*n)++;
    h[i] = b;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&h[i], &h[parent])) break;
        bigram t = h[i];
        h[i] = h[parent];
        h[parent] = t;
        i = parent;
    }
}

static bigram heap_pop(bigram *h, size_t *n) {
    bigram top = h[0];
    h[0] = h[--*n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        if (l < *n && before(&h[l], &h[best])) best = l;
        if (r < *n && before(&h[r], &h[best])) best = r;
        if (best == i) break;
        bigram t = h[i];
        h[i] = h[best];
        h[best] = t;
        i = best;
    }
    return top;
}

void nm_spm_scratch_free(nm_spm_scratch *s) {
    nm_free(s->text);
    nm_free(s->sym_off);
    nm_free(s->sym_len);
    nm_free(s->sym_prev);
    nm_free(s->sym_next);
    nm_free(s->heap);
    memset(s, 0, sizeof *s);
}

static nm_status reserve(nm_spm_scratch *w, size_t n_text, nm_error *err) {
    if (n_text <= w->text_cap) return NM_OK;
    nm_spm_scratch_free(w);
    size_t heap_bytes;
    if (!nm_mul_size(n_text, 3 * sizeof(bigram), &heap_bytes))
        return nm_errorf(err, NM_ERR_NOMEM, "text of %zu bytes is too long", n_text);
    w->text = nm_malloc(n_text);
    w->sym_off = nm_malloc(n_text * sizeof(int32_t));
    w->sym_len = nm_malloc(n_text * sizeof(int32_t));
    w->sym_prev = nm_malloc(n_text * sizeof(int32_t));
    w->sym_next = nm_malloc(n_text * sizeof(int32_t));
    w->heap = nm_malloc(heap_bytes);
    if (!w->text || !w->sym_off || !w->sym_len || !w->sym_prev || !w->sym_next || !w->heap) {
        nm_spm_scratch_free(w);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory encoding %zu bytes of text", n_text);
    }
    w->text_cap = w->sym_cap = n_text;
    return NM_OK;
}

/* Queues the merge of symbols l and r if their text is a token. */
static void try_bigram(const nm_tokenizer *tok, const nm_spm_scratch *w, bigram *heap, size_t *n,
                       int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const int32_t id = nm_token_map_find2(tok, w->text + w->sym_off[l], (size_t)w->sym_len[l],
                                          w->text + w->sym_off[r], (size_t)w->sym_len[r]);
    if (id < 0) return;
    heap_push(heap, n, (bigram){tok->scores[id], l, r, w->sym_len[l] + w->sym_len[r]});
}

static size_t utf8_char_len(uint8_t lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

nm_status nm_spm_encode_fragment(const nm_tokenizer *tok, const uint8_t *s, size_t n,
                                 bool space_prefix, nm_spm_scratch *w, nm_id_sink *sink,
                                 nm_error *err) {
    static const uint8_t lower_one_eighth_block[3] = {0xE2, 0x96, 0x81}; /* U+2581 */
    size_t cap;
    if (!nm_mul_size(n + 1, 3, &cap) || cap > INT32_MAX)
        return nm_errorf(err, NM_ERR_NOMEM, "text of %zu bytes is too long", n);
    nm_status st = reserve(w, cap, err);
    if (st != NM_OK) return st;
    size_t len = 0;
    if (space_prefix) {
        memcpy(w->text, lower_one_eighth_block, 3);
        len = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->text + len, lower_one_eighth_block, 3);
            len += 3;
        } else {
            w->text[len++] = s[i];
        }
    }
    int32_t n_sym = 0;
    for (size_t off = 0; off < len; n_sym++) {
        size_t k = utf8_char_len(w->text[off]);
        if (k > len - off) k = len - off;
        w->sym_off[n_sym] = (int32_t)off;
        w->sym_len[n_sym] = (int32_t)k;
        w->sym_prev[n_sym] = n_sym - 1;
        w->sym_next[n_sym] = off + k < len ? n_sym + 1 : -1;
        off += k;
    }
    bigram *heap = w->heap;
    size_t n_heap = 0;
    for (int32_t i = 1; i < n_sym; i++)
        try_bigram(tok, w, heap, &n_heap, i - 1, i);
    while (n_heap > 0) {
        const bigram b = heap_pop(heap, &n_heap);
        const int32_t l = b.left, r = b.right;
        /* one side already merged into something else */
        if (w->sym_len[l] == 0 || w->sym_len[r] == 0 || w->sym_len[l] + w->sym_len[r] != b.size)
            continue;
        w->sym_len[l] += w->sym_len[r];
        w->sym_len[r] = 0;
        w->sym_next[l] = w->sym_next[r];
        if (w->sym_next[r] >= 0) w->sym_prev[w->sym_next[r]] = l;
        try_bigram(tok, w, heap, &n_heap, w->sym_prev[l], l);
        try_bigram(tok, w, heap, &n_heap, l, w->sym_next[l]);
    }
    /* Every merged symbol is a token; a single character may not be. */
    for (int32_t i = 0; i >= 0 && n_sym > 0; i = w->sym_next[i]) {
        const uint8_t *t = w->text + w->sym_off[i];
        const int32_t id = nm_token_map_find2(tok, t, (size_t)w->sym_len[i], NULL, 0);
        if (id >= 0) {
            nm_id_sink_push(sink, id);
            continue;
        }
        for (int32_t k = 0; k < w->sym_len[i]; k++) {
            const int32_t b = tok->spm_byte[t[k]];
            if (b < 0 && tok->unk < 0)
                return nm_errorf(err, NM_ERR_FORMAT,
                                 "the vocabulary has no token for byte 0x%02X and no unknown token",
                                 t[k]);
            nm_id_sink_push(sink, b >= 0 ? b : tok->unk);
        }
    }
    return NM_OK;
}
