/* The pre-tokenizer: cuts a text fragment into the words BPE merges within.
 * It reproduces what llama.cpp runs, not the regex a tokenizer.json states:
 * its hand-written splitters for qwen2, qwen35 and llama3 (unicode.cpp,
 * unicode_regex_split_custom_*), and for gpt-4o its std::regex over a text
 * in which each non-ASCII code point is collapsed to one byte per class.
 * Where either differs from the stated regex, llama.cpp wins; the
 * differences are commented.
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

/* ---- gpt-4o ------------------------------------------------------------------ */

/* o200k's regex as llama.cpp states it for std::regex (llama-vocab.cpp,
 * LLAMA_VOCAB_PRE_TYPE_GPT4O; the tokenizer.json form uses \p{Lu}..\p{M}):
 *   [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+C?
 *   |[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*C?
 *   |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with C = '[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]. It is
 * matched (ECMAScript: first alternative that matches, greedy backtracking)
 * on a collapsed text: ASCII stays itself, a non-ASCII code point becomes
 * \v if White_Space, else one byte for "letter", one for "number", and
 * bytes no class above names for marks, punctuation, symbols and the rest.
 * So case is ASCII-only: a non-ASCII letter is both "upper" ([^a-z]) and
 * "lower" ([^A-Z]), marks belong to no word, and \s is \t \n \v \f \r,
 * space and the non-ASCII White_Space (ASCII's other controls, 0x1C-0x1F
 * among them, are "the rest"). */
enum {
    G_UPPER = 1,    /* a letter matching [^a-z]: A-Z, any non-ASCII letter */
    G_LOWER = 2,    /* a letter matching [^A-Z]: a-z, any non-ASCII letter */
    G_NUMBER = 4,   /* \p{N} */
    G_SPACE = 8,    /* \s */
    G_NEWLINE = 16, /* \r or \n (also G_SPACE) */
    G_PAST = 32,    /* past the fragment: matches no class */
};
/* 0 is the rest: [^\s\p{L}\p{N}] */

typedef struct fragment {
    const uint32_t *cpts;  /* [n] */
    const uint16_t *flags; /* [n] */
    size_t n;
} fragment;

static unsigned gpt4o_class(const fragment *f, size_t i) {
    if (i >= f->n) return G_PAST;
    const uint32_t cp = f->cpts[i];
    if (cp < 0x80) {
        if (cp >= 'A' && cp <= 'Z') return G_UPPER;
        if (cp >= 'a' && cp <= 'z') return G_LOWER;
        if (cp >= '0' && cp <= '9') return G_NUMBER;
        if (cp == '\r' || cp == '\n') return G_SPACE | G_NEWLINE;
        return cp == ' ' || (cp >= '\t' && cp <= '\f') ? G_SPACE : 0; /* \t \v \f */
    }
    if (f->flags[i] & NM_UFLAG_WHITESPACE) return G_SPACE;
    if (f->flags[i] & NM_UFLAG_LETTER) return G_UPPER | G_LOWER;
    if (f->flags[i] & NM_UFLAG_NUMBER) return G_NUMBER;
    return 0;
}

/* The length of C at pos (0 if none): ASCII letters in either case. */
static size_t contraction_len(const fragment *f, size_t pos) {
    if (pos + 1 >= f->n || f->cpts[pos] != '\'') return 0;
    const uint32_t c1 = fold_ascii(f->cpts[pos + 1]);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (pos + 2 >= f->n) return 0;
    const uint32_t c2 = fold_ascii(f->cpts[pos + 2]);
    return (c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l') ? 3 : 0;
}

static size_t gpt4o_word_end(const fragment *f, size_t pos) {
    const unsigned c = gpt4o_class(f, pos), letter = G_UPPER | G_LOWER;

    /* the two letter alternatives; the optional lead is taken whenever a
     * letter follows it (without it the word could not start) */
    size_t s = pos;
    if (!(c & (letter | G_NUMBER | G_NEWLINE)) && (gpt4o_class(f, pos + 1) & letter)) s = pos + 1;
    if (gpt4o_class(f, s) & letter) {
        size_t k = s; /* the greedy "upper" run [s, k) */
        while (gpt4o_class(f, k) & G_UPPER)
            k++;
        size_t end = k;
        if (gpt4o_class(f, k) & G_LOWER) {
            /* a-z follows: the "lower" run from there */
            while (gpt4o_class(f, end) & G_LOWER)
                end++;
        } else {
            /* backtracking gives the "lower" part the run's last letter
             * that is both (non-ASCII) and ends the word after it; with
             * none (all-caps ASCII) the second alternative takes the run */
            while (end > s && !(gpt4o_class(f, end - 1) & G_LOWER))
                end--;
            if (end == s) end = k;
        }
        return end + contraction_len(f, end);
    }

    /* \p{N}{1,3} */
    if (c & G_NUMBER) {
        size_t end = pos + 1;
        while (end < pos + 3 && (gpt4o_class(f, end) & G_NUMBER))
            end++;
        return end;
    }

    /* ' ?[^\s\p{L}\p{N}]+[\r\n/]*' */
    if (c == 0 || (f->cpts[pos] == ' ' && gpt4o_class(f, pos + 1) == 0)) {
        size_t end = pos + 1;
        while (gpt4o_class(f, end) == 0)
            end++;
        while (end < f->n && (f->cpts[end] == '\r' || f->cpts[end] == '\n' || f->cpts[end] == '/'))
            end++;
        return end;
    }

    /* the whitespace run at pos: \s*[\r\n]+ up to its last CR/LF, else
     * \s+(?!\S): all of it at the fragment's end, all but its last code
     * point before anything else, else (one space before a non-space) \s+ */
    NM_ASSERT(c & G_SPACE);
    size_t end = pos, newline_end = 0;
    while (gpt4o_class(f, end) & G_SPACE) {
        if (gpt4o_class(f, end) & G_NEWLINE) newline_end = end + 1;
        end++;
    }
    if (newline_end) return newline_end;
    return end == f->n || end - pos == 1 ? end : end - 1;
}

/* ---- qwen2, qwen35, llama3 -------------------------------------------------------- */

size_t nm_pretok_word_end(nm_pretok_kind kind, const uint32_t *cpts, const uint16_t *flags,
                          size_t n, size_t pos) {
    NM_ASSERT(pos < n);
    if (kind == NM_PRETOK_GPT4O) {
        const fragment f = {cpts, flags, n};
        return gpt4o_word_end(&f, pos);
    }
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
