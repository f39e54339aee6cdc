/* The gpt-4o (o200k) pre-tokenizer against ik_llama.cpp (tests/vectors/
 * gpt4o-tokenizer/): the word boundaries of ik's own splitter on every
 * golden string, then the token ids llama-tokenize gave with a 4k BPE
 * vocabulary whose tokenizer.ggml.pre is "gpt-4o", and the pieces of those
 * ids giving the text back. Then a few splits worked out by hand from the
 * regex, so that a failure names the rule. */
#include "harness.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer-impl.h"

#include <stdlib.h>
#include <string.h>

#define DIR NM_SOURCE_DIR "/tests/vectors/gpt4o-tokenizer"

/* The byte lengths of the gpt-4o words of s[0..n), written to words (at
 * most cap); returns how many, or (size_t)-1 if there are more than cap. */
static size_t split_gpt4o(const char *s, size_t n, size_t *words, size_t cap) {
    uint32_t *cpts = malloc((n + 1) * sizeof *cpts);
    uint16_t *flags = malloc((n + 1) * sizeof *flags);
    size_t n_cp = 0, n_words = 0;
    NM_ASSERT(cpts && flags);
    for (size_t pos = 0; pos < n; n_cp++) {
        cpts[n_cp] = nm_utf8_next((const uint8_t *)s, &pos);
        flags[n_cp] = nm_unicode_flags(cpts[n_cp]);
    }
    for (size_t cp = 0; cp < n_cp && n_words != (size_t)-1;) {
        const size_t end = nm_pretok_word_end(NM_PRETOK_GPT4O, cpts, flags, n_cp, cp);
        size_t len = 0;
        for (size_t i = cp; i < end; i++) {
            uint8_t u[4];
            len += (size_t)nm_utf8_encode(cpts[i], u);
        }
        if (n_words == cap)
            n_words = (size_t)-1;
        else
            words[n_words++] = len;
        cp = end;
    }
    free(cpts);
    free(flags);
    return n_words;
}

/* Every line of split.tsv: the text, a TAB, ik's word lengths in bytes. */
static int check_split_goldens(const char *path) {
    size_t n_file = 0;
    char *file = (char *)nm_test_read_file(path, &n_file);
    CHECK(file != NULL);
    if (!file) return 0;
    char *text = malloc(n_file + 1);
    size_t *want = malloc((n_file + 1) * sizeof *want), *got = malloc((n_file + 1) * sizeof *got);
    int line = 0;
    for (char *p = file; *p; line++) {
        char *eol = strchr(p, '\n');
        if (eol) *eol = '\0';
        const char *q = p;
        const long n_text = nm_test_parse_json_string(&q, text);
        CHECK(n_text >= 0 && *q == '\t');
        if (n_text < 0 || *q != '\t') break;
        size_t n_want = 0;
        for (q++; *q;) {
            char *end;
            want[n_want++] = strtoul(q, &end, 10);
            if (end == q) break;
            q = *end == ' ' ? end + 1 : end;
        }
        const size_t n_got = split_gpt4o(text, (size_t)n_text, got, n_file + 1);
        nm_test_checks++;
        if (n_got != n_want || memcmp(got, want, n_want * sizeof *want) != 0) {
            nm_test_failures++;
            fprintf(stderr, "%s line %d: words differ from ik_llama.cpp's\n", path, line + 1);
            nm_test_print_text("text", text, (size_t)n_text);
            fprintf(stderr, "  ik    ");
            for (size_t i = 0; i < n_want; i++)
                fprintf(stderr, " %zu", want[i]);
            fprintf(stderr, "\n  npumoe");
            for (size_t i = 0; n_got != (size_t)-1 && i < n_got; i++)
                fprintf(stderr, " %zu", got[i]);
            fputc('\n', stderr);
        }
        if (!eol) break;
        p = eol + 1;
    }
    free(text);
    free(want);
    free(got);
    free(file);
    return line;
}

/* s split by hand: the words' texts, NULL-terminated. */
static void check_split(const char *s, const char *const *want) {
    size_t got[64], n_want = 0;
    const size_t n = split_gpt4o(s, strlen(s), got, 64);
    bool same = true;
    size_t byte = 0;
    for (size_t i = 0; i < n && same; i++) {
        same = want[i] && strlen(want[i]) == got[i] && memcmp(want[i], s + byte, got[i]) == 0;
        byte += got[i];
    }
    while (want[n_want])
        n_want++;
    nm_test_checks++;
    if (!same || n != n_want) {
        nm_test_failures++;
        fprintf(stderr, "gpt-4o split of \"%s\":", s);
        for (size_t i = 0, b = 0; n != (size_t)-1 && i < n; b += got[i++])
            fprintf(stderr, " [%.*s]", (int)got[i], s + b);
        fprintf(stderr, "; want");
        for (size_t i = 0; want[i]; i++)
            fprintf(stderr, " [%s]", want[i]);
        fputc('\n', stderr);
    }
}

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void check_rules(void) {
    /* a word: optional lead, capitals, then lower case, then a contraction
     * in any case; contractions stay with their word */
    check_split("HelloWorld don't DON'T", WORDS("Hello", "World", " don't", " DON'T"));
    check_split("XMLHttpRequest", WORDS("XMLHttp", "Request"));
    check_split("'s a'LL", WORDS("'s", " a'LL"));
    /* case is ASCII only: a non-ASCII letter is both, so the backtracking
     * ends the word after the last one when only capitals follow */
    check_split("\xC3\x89"
                "ABC",
                WORDS("\xC3\x89", "ABC"));
    check_split("\xC3\x89"
                "ABCdef",
                WORDS("\xC3\x89"
                      "ABCdef"));
    check_split("AB\xC3\x89"
                "CD",
                WORDS("AB\xC3\x89", "CD"));
    /* combining marks (U+0301) belong to no word: one leads the next */
    check_split("e\xCC\x81x", WORDS("e", "\xCC\x81x"));
    /* up to three digits */
    check_split("1234567", WORDS("123", "456", "7"));
    /* punctuation takes a space before, and CR, LF and '/' after */
    check_split("a ?!\n/b", WORDS("a", " ?!\n/", "b"));
    /* whitespace as qwen2: a run's last space goes with the next word */
    check_split("a   b\r\n", WORDS("a", "  ", " b", "\r\n"));
    check_split("a \n\n  b", WORDS("a", " \n\n", " ", " b"));
}

int main(void) {
    check_rules();

    nm_error err = {0};
    nm_gguf *gguf = NULL;
    nm_tokenizer *tok = NULL;
    nm_status st = nm_gguf_open(DIR "/vocab.gguf", &gguf, &err);
    if (st == NM_OK) st = nm_tokenizer_load(gguf, &tok, &err);
    CHECK(st == NM_OK);
    if (st != NM_OK) fprintf(stderr, "%s\n", err.msg);
    if (tok) {
        CHECK(tok->pretok == NM_PRETOK_GPT4O);
        CHECK(!tok->ignore_merges);
        CHECK(!nm_tokenizer_add_bos(tok));
        CHECK_INT_EQ(check_split_goldens(DIR "/split.tsv"), 482);
        int exact = 0;
        CHECK_INT_EQ(nm_test_check_tokenize_tsv(tok, DIR "/tokenize.tsv", nm_test_decode, &exact),
                     482);
        printf("gpt-4o: %d lines tokenized as ik_llama.cpp does\n", exact);
    }
    nm_tokenizer_free(tok);
    nm_gguf_close(gguf);
    return nm_test_finish("test_tokenizer_gpt4o");
}
