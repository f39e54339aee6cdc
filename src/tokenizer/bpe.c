/* Byte-level BPE: the token text -> id map, the merge table keyed by token
 * ids, and the merge loop over one pre-tokenized word. The loop is
 * llama.cpp's (llm_tokenizer_bpe_session): repeatedly merge the adjacent
 * pair with the lowest merge rank, the leftmost one on ties, through a
 * priority queue with lazy deletion. Because load checks that both parts
 * and the result of every merge are tokens, symbols are token ids and pairs
 * are looked up by id, never by text. Not here: splitting text into words
 * (pretok.c), special tokens (encode.c). */
#include "tokenizer-impl.h"

#include "base/base.h"

#include <inttypes.h>
#include <string.h>

/* ---- hashing ---------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* FNV-1a over a then b, finished by a mixer so that the low bits (the
 * table index) depend on every byte. */
static uint64_t hash_text2(const uint8_t *a, size_t n_a, const uint8_t *b, size_t n_b) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n_a; i++)
        h = (h ^ a[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < n_b; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return mix64(h);
}

/* Smallest power of two >= n (n <= 2^62). */
static uint64_t pow2_at_least(uint64_t n) {
    uint64_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

/* ---- token text -> id ------------------------------------------------------- */

static bool text_equals2(nm_gguf_str t, const uint8_t *a, size_t n_a, const uint8_t *b,
                         size_t n_b) {
    return t.len == n_a + n_b && (n_a == 0 || memcmp(t.ptr, a, n_a) == 0) &&
           (n_b == 0 || memcmp(t.ptr + n_a, b, n_b) == 0);
}

nm_status nm_token_map_build(nm_tokenizer *tok, nm_error *err) {
    uint64_t n_slots = pow2_at_least(2 * (uint64_t)tok->n_vocab);
    size_t n_bytes;
    if (!nm_mul_size((size_t)n_slots, sizeof(int32_t), &n_bytes) ||
        !(tok->tokens.slots = nm_malloc(n_bytes)))
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the token table (%d tokens)",
                         tok->n_vocab);
    memset(tok->tokens.slots, 0xFF, n_bytes); /* all -1 */
    tok->tokens.mask = n_slots - 1;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const nm_gguf_str t = tok->text[id];
        if (t.len == 0) continue;
        const uint8_t *p = (const uint8_t *)t.ptr;
        uint64_t i = hash_text2(p, t.len, NULL, 0) & tok->tokens.mask;
        for (;; i = (i + 1) & tok->tokens.mask) {
            const int32_t other = tok->tokens.slots[i];
            if (other < 0) {
                tok->tokens.slots[i] = id;
                break;
            }
            if (text_equals2(tok->text[other], p, t.len, NULL, 0))
                return nm_errorf(err, NM_ERR_FORMAT, "tokens %d and %d have the same text '%.*s'",
                                 other, id, (int)(t.len > 64 ? 64 : t.len), t.ptr);
        }
    }
    return NM_OK;
}

int32_t nm_token_map_find2(const nm_tokenizer *tok, const uint8_t *a, size_t n_a, const uint8_t *b,
                           size_t n_b) {
    if (n_a + n_b == 0) return -1;
    uint64_t i = hash_text2(a, n_a, b, n_b) & tok->tokens.mask;
    for (;; i = (i + 1) & tok->tokens.mask) {
        const int32_t id = tok->tokens.slots[i];
        if (id < 0) return -1;
        if (text_equals2(tok->text[id], a, n_a, b, n_b)) return id;
    }
}

/* ---- merges ------------------------------------------------------------------ */

#define MERGE_EMPTY UINT64_MAX

static uint64_t merge_key(int32_t left, int32_t right) {
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

nm_status nm_merge_map_build(nm_tokenizer *tok, const nm_gguf_value *merges, nm_error *err) {
    const uint64_t n = merges->v.arr.n;
    if (n > INT32_MAX)
        return nm_errorf(err, NM_ERR_FORMAT, "tokenizer.ggml.merges has %" PRIu64 " lines", n);
    const uint64_t n_slots = pow2_at_least(n + n / 2);
    size_t n_bytes;
    if (!nm_mul_size((size_t)n_slots, sizeof(nm_merge_slot), &n_bytes) ||
        !(tok->merges.slots = nm_malloc(n_bytes)))
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory for %" PRIu64 " merges", n);
    for (uint64_t i = 0; i < n_slots; i++)
        tok->merges.slots[i].key = MERGE_EMPTY;
    tok->merges.mask = n_slots - 1;
    tok->n_merges = (int32_t)n;

    for (uint64_t rank = 0; rank < n; rank++) {
        const nm_gguf_str line = nm_gguf_arr_str(merges, rank);
        const uint8_t *p = (const uint8_t *)line.ptr;
        const int shown = (int)(line.len > 64 ? 64 : line.len);
        /* "left right", split at the first space after the first byte (as
         * llama.cpp does, so a left part may itself start with a space) */
        const uint8_t *space = line.len >= 2 ? memchr(p + 1, ' ', line.len - 1) : NULL;
        if (!space)
            return nm_errorf(err, NM_ERR_FORMAT,
                             "merge %" PRIu64 " '%.*s' is not two tokens separated by a space",
                             rank, shown, line.ptr);
        const size_t n_left = (size_t)(space - p), n_right = line.len - n_left - 1;
        const int32_t left = nm_token_map_find2(tok, p, n_left, NULL, 0);
        const int32_t right = nm_token_map_find2(tok, space + 1, n_right, NULL, 0);
        const int32_t result = nm_token_map_find2(tok, p, n_left, space + 1, n_right);
        if (left < 0 || right < 0 || result < 0) {
            const char *what = left < 0    ? "its left part"
                               : right < 0 ? "its right part"
                                           : "the merged text";
            return nm_errorf(err, NM_ERR_FORMAT, "merge %" PRIu64 " '%.*s': %s is not a token",
                             rank, shown, line.ptr, what);
        }
        const uint64_t key = merge_key(left, right);
        uint64_t i = mix64(key) & tok->merges.mask;
        while (tok->merges.slots[i].key != MERGE_EMPTY && tok->merges.slots[i].key != key)
            i = (i + 1) & tok->merges.mask;
        /* a repeated pair keeps its first (lowest) rank, as in llama.cpp */
        if (tok->merges.slots[i].key == MERGE_EMPTY)
            tok->merges.slots[i] = (nm_merge_slot){key, (int32_t)rank, result};
    }
    return NM_OK;
}

const nm_merge_slot *nm_merge_map_find(const nm_tokenizer *tok, int32_t left, int32_t right) {
    const uint64_t key = merge_key(left, right);
    for (uint64_t i = mix64(key) & tok->merges.mask;; i = (i + 1) & tok->merges.mask) {
        const nm_merge_slot *s = &tok->merges.slots[i];
        if (s->key == key) return s;
        if (s->key == MERGE_EMPTY) return NULL;
    }
}

void nm_tokenizer_maps_free(nm_tokenizer *tok) {
    nm_free(tok->tokens.slots);
    nm_free(tok->merges.slots);
    tok->tokens.slots = NULL;
    tok->merges.slots = NULL;
}

/* ---- the merge loop ----------------------------------------------------------- */

/* A candidate merge of symbols left and right, valid while both still hold
 * the tokens they held when it was queued (a symbol's token only ever gets
 * longer, so an id seen again is the same symbol state). */
typedef struct pending_merge {
    int32_t rank;
    int32_t left, right;       /* symbol indices */
    int32_t left_id, right_id; /* their tokens when queued */
    int32_t result;
} pending_merge;

static bool merge_before(const pending_merge *a, const pending_merge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(pending_merge *heap, size_t *n, pending_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!merge_before(&m, &heap[parent])) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = m;
}

static pending_merge heap_pop(pending_merge *heap, size_t *n) {
    pending_merge top = heap[0];
    pending_merge last = heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && merge_before(&heap[child + 1], &heap[child])) child++;
        if (!merge_before(&heap[child], &last)) break;
        heap[i] = heap[child];
        i = child;
    }
    if (*n > 0) heap[i] = last;
    return top;
}

static void queue_pair(const nm_tokenizer *tok, const nm_bpe_scratch *s, pending_merge *heap,
                       size_t *n_heap, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t left_id = s->sym_id[left], right_id = s->sym_id[right];
    if (left_id < 0 || right_id < 0) return;
    const nm_merge_slot *m = nm_merge_map_find(tok, left_id, right_id);
    if (m)
        heap_push(heap, n_heap,
                  (pending_merge){m->rank, left, right, left_id, right_id, m->result});
}

static nm_status resize(void **p, size_t n, size_t elem_bytes, nm_error *err) {
    size_t n_bytes;
    void *q = nm_mul_size(n, elem_bytes, &n_bytes) ? nm_realloc(*p, n_bytes) : NULL;
    if (!q) return nm_errorf(err, NM_ERR_NOMEM, "out of memory encoding a %zu-byte word", n);
    *p = q;
    return NM_OK;
}

/* Room for the symbols of an n-byte word; capacity at least doubles, so a
 * text of growing words reallocates O(log n) times. */
static nm_status reserve_symbols(nm_bpe_scratch *s, size_t n, nm_error *err) {
    if (n <= s->cap) return NM_OK;
    const size_t cap = n > 2 * s->cap ? n : 2 * s->cap;
    nm_status st;
    if ((st = resize((void **)&s->sym_id, cap, sizeof(int32_t), err)) != NM_OK ||
        (st = resize((void **)&s->sym_prev, cap, sizeof(int32_t), err)) != NM_OK ||
        (st = resize((void **)&s->sym_next, cap, sizeof(int32_t), err)) != NM_OK ||
        /* each merge queues at most two pairs: (n - 1) + 2 (n - 1) entries */
        (st = resize(&s->heap, 3 * cap, sizeof(pending_merge), err)) != NM_OK)
        return st;
    s->cap = cap;
    return NM_OK;
}

void nm_bpe_scratch_free(nm_bpe_scratch *s) {
    nm_free(s->sym_id);
    nm_free(s->sym_prev);
    nm_free(s->sym_next);
    nm_free(s->heap);
    nm_free(s->text);
    memset(s, 0, sizeof *s);
}

/* A symbol's id, or for a byte whose alphabet text is no token, what
 * llama.cpp falls back to: the tokens (if any) whose text is one byte of
 * that alphabet text. */
static void emit_symbol(const nm_tokenizer *tok, int32_t id, uint8_t byte, nm_id_sink *sink) {
    if (id >= 0) {
        nm_id_sink_push(sink, id);
        return;
    }
    for (int k = 0; k < 2; k++)
        if (tok->byte_fallback[byte][k] >= 0) nm_id_sink_push(sink, tok->byte_fallback[byte][k]);
}

nm_status nm_bpe_encode_word(const nm_tokenizer *tok, const uint8_t *word, size_t n,
                             nm_bpe_scratch *s, nm_id_sink *sink, nm_error *err) {
    NM_ASSERT(n >= 1);
    if (n > INT32_MAX / 4)
        return nm_errorf(err, NM_ERR_CAPACITY, "a %zu-byte word is too long to encode", n);
    nm_status st;
    if (tok->ignore_merges) {
        /* a word that is a token as a whole is not merged (llama3) */
        if (2 * n > s->text_cap) {
            if ((st = resize((void **)&s->text, 2 * n, 1, err)) != NM_OK) return st;
            s->text_cap = 2 * n;
        }
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += (size_t)nm_utf8_encode(nm_gpt2_byte_to_cp(word[i]), s->text + m);
        const int32_t id = nm_token_map_find2(tok, s->text, m, NULL, 0);
        if (id >= 0) {
            nm_id_sink_push(sink, id);
            return NM_OK;
        }
    }
    if (n == 1) {
        emit_symbol(tok, tok->byte_token[word[0]], word[0], sink);
        return NM_OK;
    }
    if ((st = reserve_symbols(s, n, err)) != NM_OK) return st;
    const int32_t n_sym = (int32_t)n;
    for (int32_t i = 0; i < n_sym; i++) {
        s->sym_id[i] = tok->byte_token[word[i]];
        s->sym_prev[i] = i - 1;
        s->sym_next[i] = i + 1 < n_sym ? i + 1 : -1;
    }
    pending_merge *heap = s->heap;
    size_t n_heap = 0;
    for (int32_t i = 1; i < n_sym; i++)
        queue_pair(tok, s, heap, &n_heap, i - 1, i);

    while (n_heap > 0) {
        const pending_merge m = heap_pop(heap, &n_heap);
        if (s->sym_id[m.left] != m.left_id || s->sym_id[m.right] != m.right_id ||
            s->sym_next[m.left] != m.right)
            continue; /* outdated: one side has merged since */
        s->sym_id[m.left] = m.result;
        s->sym_id[m.right] = -2;
        const int32_t after = s->sym_next[m.right];
        s->sym_next[m.left] = after;
        if (after >= 0) s->sym_prev[after] = m.left;
        queue_pair(tok, s, heap, &n_heap, s->sym_prev[m.left], m.left);
        queue_pair(tok, s, heap, &n_heap, m.left, after);
    }
    /* symbol 0 is never merged away: it only ever absorbs its right side */
    for (int32_t i = 0; i >= 0; i = s->sym_next[i])
        emit_symbol(tok, s->sym_id[i], word[i], sink);
    return NM_OK;
}
