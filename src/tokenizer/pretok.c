/* The pre-tokenizer: cuts a text fragment into the words BPE merges within.
 * It reproduces llama.cpp's hand-written splitters (unicode.cpp,
 * unicode_regex_split_custom_qwen2 / _qwen35 / _llama3), not the regex they
 * stand for, because the vocabularies' goldens come from those splitters.
 * Where the two differ, the splitter wins; the differences are commented.
 * Not here: special tokens (encode.c), byte mapping and merges (bpe.c). */
#include "tokenizer-impl.h"

#include "base/base.h"

/* Positions past the fragment have no class and no code point: every class
 * test there fails, exactly as llama.cpp's out-of-range lookups do. */
static uint16_t flags_at(const uint16_t *flags, size_t n, size_t pos) {
    return pos < n ? flags[pos] : 0;
}

static bool is_newline_at(const uint32_t *cpts, size_t n, size_t pos) {
    return pos < n && (cpts[pos] == '\r' || cpts[pos] == '\n');
}

/* The (?i:...) of the contraction rule only ever compares with ASCII
 * letters, and no other code point lowercases to one of them (checked by
 * tools/gen_unicode_tables.py), so ASCII folding is exact. */
static uint32_t fold_ascii(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp; }

size_t nm_pretok_word_end(nm_pretok_kind kind, const uint32_t *cpts, const uint16_t *flags,
                          size_t n, size_t pos) {
    NM_ASSERT(pos < n);
    const uint32_t cp = cpts[pos];
    const uint16_t f = flags[pos];
    /* what a "letter run" may contain; qwen35 adds combining marks */
    const uint16_t word = NM_UFLAG_LETTER | (kind == NM_PRETOK_QWEN35 ? NM_UFLAG_ACCENT_MARK : 0);

    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (cp == '\'' && pos + 1 < n) {
        const uint32_t c1 = fold_ascii(cpts[pos + 1]);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
        if (pos + 2 < n) {
            const uint32_t c2 = fold_ascii(cpts[pos + 2]);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
                return pos + 3;
        }
    }

    /* [^\r\n\p{L}\p{N}]?\p{L}+ : the optional lead is any code point that is
     * not CR, LF or a number (a letter included: it simply starts the run) */
    if (!(cp == '\r' || cp == '\n' || (f & NM_UFLAG_NUMBER))) {
        if ((f & word) || (flags_at(flags, n, pos + 1) & word)) {
            size_t end = pos + 1;
            while (flags_at(flags, n, end) & word)
                end++;
            return end;
        }
    }

    /* \p{N}, or \p{N}{1,3} for llama3 */
    if (f & NM_UFLAG_NUMBER) {
        size_t end = pos + 1;
        if (kind == NM_PRETOK_LLAMA3)
            while (end < pos + 3 && (flags_at(flags, n, end) & NM_UFLAG_NUMBER))
                end++;
        return end;
    }

    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*'. As in llama.cpp, a space is taken even when
     * nothing follows it in the fragment (the regex would leave it to \s+;
     * the word is the same). */
    const uint16_t stop = NM_UFLAG_WHITESPACE | NM_UFLAG_LETTER | NM_UFLAG_NUMBER |
                          (kind == NM_PRETOK_QWEN35 ? NM_UFLAG_ACCENT_MARK : 0);
    size_t end = pos + (cp == ' ');
    uint16_t f2 = flags_at(flags, n, end);
    if (!(f2 & stop)) {
        while (f2 && !(f2 & stop))
            f2 = flags_at(flags, n, ++end);
        while (is_newline_at(cpts, n, end))
            end++;
        return end;
    }

    /* \s*[\r\n]+ | \s+(?!\S) | \s+ over the whitespace run at pos */
    size_t n_ws = 0, newline_end = 0;
    while (flags_at(flags, n, pos + n_ws) & NM_UFLAG_WHITESPACE) {
        if (cpts[pos + n_ws] == '\r' || cpts[pos + n_ws] == '\n') newline_end = pos + n_ws + 1;
        n_ws++;
    }
    /* up to the run's last CR/LF, even if more whitespace follows it */
    if (newline_end) return newline_end;
    /* a run before a non-space leaves its last code point to the next word */
    if (n_ws > 1 && pos + n_ws < n) return pos + n_ws - 1;
    if (n_ws) return pos + n_ws;
    return pos + 1;
}
