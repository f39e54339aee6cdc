/* The tokenizer against llama.cpp: every golden line of the Qwen3 vocab and
 * of the tiny models' 4k vocab must give llama.cpp's ids, and their pieces
 * must give the text back. Then what the goldens do not reach: the word
 * splitter of each pre-tokenizer, merge order on hand-made vocabularies,
 * special-token rules, invalid UTF-8, the count-then-fill protocol, hostile
 * vocabularies and allocation failures; and the public nm_tokenize's
 * add_special, which adds BOS only where the vocabulary asks for it, and
 * nm_model_meta_str. */
#include "harness.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer-impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------------- */

/* Encodes s and compares with want[0..n_want). */
static void check_encoding(const nm_tokenizer *tok, const char *s, bool parse_special,
                           const int32_t *want, size_t n_want) {
    int32_t got[64];
    long n = nm_test_encode(tok, s, strlen(s), false, parse_special, got, 64);
    nm_test_checks++;
    if (n != (long)n_want || memcmp(got, want, n_want * sizeof *want) != 0) {
        nm_test_failures++;
        fprintf(stderr, "encoding mismatch:\n");
        nm_test_print_text("text", s, strlen(s));
        nm_test_print_ids("want", want, n_want);
        if (n >= 0) nm_test_print_ids("got ", got, (size_t)n);
    }
}

static nm_tokenizer *load_vocab(const char *path, nm_gguf **gguf) {
    nm_error err = {0};
    nm_status st = nm_gguf_open(path, gguf, &err);
    CHECK(st == NM_OK);
    if (st != NM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    nm_tokenizer *tok = NULL;
    int64_t t0 = nm_time_ns();
    st = nm_tokenizer_load(*gguf, &tok, &err);
    int64_t t1 = nm_time_ns();
    CHECK(st == NM_OK);
    if (st != NM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    printf("loaded %s: %d tokens in %.1f ms\n", path, nm_tokenizer_n_vocab(tok),
           (double)(t1 - t0) / 1e6);
    return tok;
}

/* ---- the Qwen3 vocabulary beyond the goldens ----------------------------------------- */

static void check_qwen3_rules(const nm_tokenizer *tok) {
    CHECK_INT_EQ(nm_tokenizer_n_vocab(tok), 151936);
    CHECK_INT_EQ(nm_tokenizer_bos(tok), 151643);
    CHECK_INT_EQ(nm_tokenizer_eos(tok), 151645);
    CHECK(!nm_tokenizer_add_bos(tok));
    CHECK(!nm_tokenizer_add_eos(tok));

    /* end of generation, as llama.cpp lists them for Qwen3: eos, the two
     * end texts, </s> (re-typed), and the FIM pad/repo/file-separator */
    const int32_t eog[] = {151643, 151645, 128247, 151662, 151663, 151664};
    for (size_t i = 0; i < sizeof eog / sizeof eog[0]; i++)
        CHECK(nm_tokenizer_is_eog(tok, eog[i]));
    CHECK(!nm_tokenizer_is_eog(tok, 151644)); /* <|im_start|> */
    CHECK(!nm_tokenizer_is_eog(tok, 151667)); /* <think> */
    CHECK(!nm_tokenizer_is_eog(tok, 0));
    CHECK(!nm_tokenizer_is_eog(tok, -1));
    CHECK(!nm_tokenizer_is_eog(tok, 151936));

    /* without special parsing, CONTROL texts are plain text but
     * USER_DEFINED ones are still matched (llama.cpp, like HF) */
    int32_t ids[64];
    long n = nm_test_encode(tok, "<|im_start|>", 12, false, false, ids, 64);
    CHECK(n > 1);
    n = nm_test_encode(tok, "<think>", 7, false, false, ids, 64);
    CHECK_INT_EQ(n, 1);
    CHECK_INT_EQ(ids[0], 151667);
    n = nm_test_encode(tok, "a</s>b", 6, false, true, ids, 64);
    CHECK_INT_EQ(n, 3);
    CHECK_INT_EQ(ids[1], 128247);

    /* BOS when asked, whatever the file's flag */
    n = nm_test_encode(tok, "Hi", 2, true, false, ids, 64);
    CHECK_INT_EQ(n, 2);
    CHECK_INT_EQ(ids[0], 151643);
    n = nm_test_encode(tok, NULL, 0, false, true, ids, 64);
    CHECK_INT_EQ(n, 0);

    /* pieces: CONTROL renders only on request, USER_DEFINED always; the
     * re-typed </s> counts as CONTROL; [PADn] fillers (UNUSED) are empty */
    char buf[64];
    CHECK_INT_EQ(nm_tokenizer_piece(tok, 151645, false, buf, sizeof buf), 0);
    CHECK_INT_EQ(nm_tokenizer_piece(tok, 151645, true, buf, sizeof buf), 10);
    CHECK(memcmp(buf, "<|im_end|>", 10) == 0);
    CHECK_INT_EQ(nm_tokenizer_piece(tok, 151667, false, buf, sizeof buf), 7);
    CHECK_INT_EQ(nm_tokenizer_piece(tok, 128247, false, buf, sizeof buf), 0);
    CHECK_INT_EQ(nm_tokenizer_piece(tok, 151935, true, buf, sizeof buf), 0);
    CHECK_INT_EQ(nm_tokenizer_piece(tok, -1, true, buf, sizeof buf), -1);
    CHECK_INT_EQ(nm_tokenizer_piece(tok, 151936, true, buf, sizeof buf), -1);
    /* a piece longer than the buffer: full length back, nothing past cap */
    memset(buf, '#', sizeof buf);
    CHECK_INT_EQ(nm_tokenizer_piece(tok, 151645, true, buf, 4), 10);
    CHECK(memcmp(buf, "<|im#", 5) == 0);
    /* byte 0x0A is 'Ċ' (U+010A) in the alphabet, token 198 */
    CHECK_INT_EQ(nm_tokenizer_piece(tok, 198, false, buf, sizeof buf), 1);
    CHECK_INT_EQ(buf[0], '\n');
}

/* Count, then fill: NULL/0 counts, a short buffer gets a prefix. */
static void check_count_then_fill(const nm_tokenizer *tok) {
    const char *s = "Hello, world! <|im_start|>user\n12345";
    int32_t full[64], part[64];
    long n = nm_test_encode(tok, s, strlen(s), false, true, full, 64);
    CHECK(n > 4);
    size_t n_out = 12345;
    nm_error err = {0};
    nm_status st = nm_tokenizer_encode(tok, s, strlen(s), false, true, NULL, 0, &n_out, &err);
    CHECK_INT_EQ(st, NM_ERR_CAPACITY);
    CHECK_INT_EQ(n_out, n);
    CHECK(strstr(err.msg, "needs") != NULL);
    for (int i = 0; i < 64; i++)
        part[i] = -7;
    st = nm_tokenizer_encode(tok, s, strlen(s), false, true, part, (size_t)n - 1, &n_out, &err);
    CHECK_INT_EQ(st, NM_ERR_CAPACITY);
    CHECK_INT_EQ(n_out, n);
    CHECK(memcmp(part, full, (size_t)(n - 1) * sizeof *part) == 0);
    CHECK_INT_EQ(part[n - 1], -7);
    st = nm_tokenizer_encode(tok, s, strlen(s), false, true, part, (size_t)n, &n_out, &err);
    CHECK_INT_EQ(st, NM_OK);
    CHECK_INT_EQ(n_out, n);
    CHECK(memcmp(part, full, (size_t)n * sizeof *part) == 0);
}

/* Every kind of invalid UTF-8 is refused with the offset of the bad byte. */
static void check_invalid_utf8(const nm_tokenizer *tok) {
    static const struct {
        const char *bytes;
        size_t n;
        size_t offset;
        const char *reason;
    } cases[] = {
        {"ab\x80", 3, 2, "stray continuation"},
        {"\xBF", 1, 0, "stray continuation"},
        {"x\xC0\xAF", 3, 1, "overlong"}, /* '/' in two bytes */
        {"\xC1\xBF", 2, 0, "overlong"},
        {"\xE0\x80\xAF", 3, 0, "overlong"},     /* '/' in three bytes */
        {"\xF0\x82\x82\xAC", 4, 0, "overlong"}, /* U+20AC in four bytes */
        {"ok\xED\xA0\x80", 5, 2, "surrogate"},  /* U+D800 */
        {"\xED\xBF\xBF", 3, 0, "surrogate"},    /* U+DFFF */
        {"\xF4\x90\x80\x80", 4, 0, "above U+10FFFF"},
        {"\xF5\x80\x80\x80", 4, 0, "U+10FFFF"},
        {"\xFF", 1, 0, "U+10FFFF"},
        {"abc\xE2\x82", 5, 3, "truncated"}, /* cut euro sign */
        {"\xF0\x9F\x98", 3, 0, "truncated"},
        {"\xC3", 1, 0, "truncated"},
        {"\xC3(", 2, 0, "missing continuation"},
        {"\xE2\x28\xA1", 3, 0, "missing continuation"},
        {"\xF0\x9F\x98\x41", 4, 0, "missing continuation"},
        {"<|im_start|>\xC3\x28", 14, 12, "missing continuation"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t ids[16];
        size_t n_out = 99;
        nm_error err = {0};
        nm_status st = nm_tokenizer_encode(tok, cases[i].bytes, cases[i].n, false, true, ids, 16,
                                           &n_out, &err);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu ", cases[i].offset);
        nm_test_checks++;
        if (st != NM_ERR_FORMAT || !strstr(err.msg, want) || !strstr(err.msg, cases[i].reason) ||
            n_out != 0) {
            nm_test_failures++;
            fprintf(stderr, "invalid UTF-8 case %zu: status %s, message '%s'\n", i,
                    nm_status_str(st), err.msg);
        }
    }
    /* the largest and smallest of each length are fine */
    const char *ok = "\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"
                     "\xED\x9F\xBF\xEE\x80\x80";
    int32_t ids[64];
    long n = nm_test_encode(tok, ok, strlen(ok), false, true, ids, 64);
    CHECK(n > 0);
    char back[64];
    if (n > 0) {
        size_t n_back = nm_test_decode(tok, ids, (size_t)n, back, sizeof back);
        CHECK(n_back == strlen(ok) && memcmp(back, ok, n_back) == 0);
    }
}

/* ---- the word splitter ------------------------------------------------------------------ */

/* Splits s with kind and compares with the words in want (NULL-terminated).
 * The expected words are worked out by hand from the regexes in
 * tokenizer-impl.h, with llama.cpp's code for the corner cases. */
static void check_split(nm_pretok_kind kind, const char *s, const char *const *want) {
    uint32_t cpts[128];
    uint16_t flags[128];
    size_t n = 0, n_bytes = strlen(s);
    for (size_t pos = 0; pos < n_bytes; n++) {
        cpts[n] = nm_utf8_next((const uint8_t *)s, &pos);
        flags[n] = nm_unicode_flags(cpts[n]);
    }
    bool same = true;
    size_t w = 0, byte = 0;
    char got[512];
    size_t n_got = 0;
    for (size_t cp = 0; cp < n; w++) {
        size_t end = nm_pretok_word_end(kind, cpts, flags, n, cp), len = 0;
        for (size_t i = cp; i < end; i++) {
            uint8_t u[4];
            len += (size_t)nm_utf8_encode(cpts[i], u);
        }
        if (!want[w] || strlen(want[w]) != len || memcmp(want[w], s + byte, len) != 0) same = false;
        n_got += (size_t)snprintf(got + n_got, sizeof got - n_got, "[%.*s]", (int)len, s + byte);
        byte += len;
        cp = end;
    }
    if (want[w]) same = false;
    nm_test_checks++;
    if (!same) {
        nm_test_failures++;
        fprintf(stderr, "split (kind %d) of \"%s\" gave %s; want", (int)kind, s, got);
        for (size_t i = 0; want[i]; i++)
            fprintf(stderr, " [%s]", want[i]);
        fputc('\n', stderr);
    }
}

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void check_splitter(void) {
    const nm_pretok_kind Q2 = NM_PRETOK_QWEN2, Q35 = NM_PRETOK_QWEN35, L3 = NM_PRETOK_LLAMA3;
    check_split(Q2, "Hello world", WORDS("Hello", " world"));
    check_split(Q2, "don't DON'T we'Ve", WORDS("don", "'t", " DON", "'T", " we", "'Ve"));
    check_split(Q2, "'lL 'x", WORDS("'lL", " '", "x"));
    /* digits: one at a time for qwen2, up to three for llama3 */
    check_split(Q2, "12345", WORDS("1", "2", "3", "4", "5"));
    check_split(L3, "12345 x1", WORDS("123", "45", " x", "1"));
    /* a letter run takes one leading non-letter, non-digit, non-newline */
    check_split(Q2, "_x.y", WORDS("_x", ".y"));
    check_split(Q2, "a\nb", WORDS("a", "\n", "b"));
    /* punctuation runs take one leading space and trailing newlines */
    check_split(Q2, "x ...\n\ny", WORDS("x", " ...\n\n", "y"));
    /* whitespace: the last space of a run before a word goes with it */
    check_split(Q2, "a   b", WORDS("a", "  ", " b"));
    check_split(Q2, "a   ", WORDS("a", "   "));
    check_split(Q2, "a \n b", WORDS("a", " \n", " b"));
    check_split(Q2, " \n \n\t x", WORDS(" \n \n", "\t", " x"));
    check_split(Q2, "a  1", WORDS("a", " ", " ", "1"));
    /* U+3000 (ideographic space) is whitespace; U+200B (zero width space)
     * is a format control, so it leads the next letter run */
    check_split(Q2,
                "a\xE3\x80\x80"
                "b",
                WORDS("a", "\xE3\x80\x80"
                           "b"));
    check_split(Q2,
                "a\xE2\x80\x8B"
                "b",
                WORDS("a", "\xE2\x80\x8B"
                           "b"));
    /* combining marks: qwen2 cuts before them, qwen35 keeps them in the word */
    check_split(Q2, "e\xCC\x81x y", WORDS("e", "\xCC\x81x", " y"));
    check_split(Q35, "e\xCC\x81x y", WORDS("e\xCC\x81x", " y"));
    check_split(Q35, "!\xCC\x81", WORDS("!\xCC\x81"));
    check_split(Q2, "!\xCC\x81", WORDS("!\xCC\x81"));
}

/* ---- hand-made vocabularies ---------------------------------------------------------------- */

typedef struct vocab_spec {
    const char *model, *pre;   /* NULL = key absent */
    const char *const *tokens; /* NULL-terminated */
    const char *const *merges; /* NULL-terminated; NULL = key absent */
    const int32_t *types;      /* NULL = key absent */
    uint64_t n_types;
    int64_t bos; /* < 0 = key absent */
    int add_bos; /* -1 = key absent */
    const char *name;
} vocab_spec;

static size_t count(const char *const *list) {
    size_t n = 0;
    while (list[n])
        n++;
    return n;
}

/* Writes the spec as a GGUF in memory and loads it. *mem is the file. */
static nm_status load_spec(const vocab_spec *v, nm_gguf **gguf, uint8_t **mem, nm_tokenizer **tok,
                           nm_error *err) {
    *gguf = NULL;
    *mem = NULL;
    *tok = NULL;
    nm_gguf_writer *w = nm_gguf_writer_new();
    if (!w) return NM_ERR_NOMEM;
    if (v->model) nm_gguf_writer_set_str(w, "tokenizer.ggml.model", v->model);
    if (v->pre) nm_gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre);
    if (v->name) nm_gguf_writer_set_str(w, "general.name", v->name);
    nm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, count(v->tokens));
    if (v->merges)
        nm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", v->merges, count(v->merges));
    if (v->types)
        nm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", NM_GGUF_INT32, v->types, v->n_types);
    if (v->bos >= 0) nm_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (v->add_bos >= 0) nm_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    size_t n_mem = 0;
    nm_status st = nm_gguf_writer_to_memory(w, mem, &n_mem, err);
    nm_gguf_writer_free(w);
    if (st != NM_OK) return st;
    if ((st = nm_gguf_open_memory(*mem, n_mem, gguf, err)) != NM_OK) return st;
    return nm_tokenizer_load(*gguf, tok, err);
}

static void unload(nm_gguf *gguf, uint8_t *mem, nm_tokenizer *tok) {
    nm_tokenizer_free(tok);
    nm_gguf_close(gguf);
    nm_free(mem);
}

/* "Ġ" is the alphabet's space (U+0120). */
static const char *const small_tokens[] = {"a",
                                           "b",
                                           "c",
                                           "\xC4\xA0",
                                           "ab",
                                           "bc",
                                           "aa",
                                           "\xC4\xA0"
                                           "a",
                                           "<|x|>",
                                           "<u>",
                                           "</s>",
                                           "ca",
                                           NULL};

static void check_hostile(const char *what, vocab_spec v, nm_status want, const char *needle) {
    nm_gguf *gguf;
    uint8_t *mem;
    nm_tokenizer *tok;
    nm_error err = {0};
    nm_status st = load_spec(&v, &gguf, &mem, &tok, &err);
    nm_test_checks++;
    if (st != want || !strstr(err.msg, needle)) {
        nm_test_failures++;
        fprintf(stderr, "%s: want %s with '%s', got %s: '%s'\n", what, nm_status_str(want), needle,
                nm_status_str(st), err.msg);
    }
    CHECK(tok == NULL);
    unload(gguf, mem, tok);
}

static void check_small_vocabs(void) {
    const int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 1, 3, 4, 1, 1};
    const vocab_spec base = {
        "gpt2",       "qwen2",
        small_tokens, (const char *const[]){"b c", "a b", "a a", "\xC4\xA0 a", NULL},
        types,        12,
        -1,           -1,
        NULL};
    nm_gguf *gguf;
    uint8_t *mem;
    nm_tokenizer *tok;
    nm_error err = {0};
    nm_status st = load_spec(&base, &gguf, &mem, &tok, &err);
    CHECK_INT_EQ(st, NM_OK);
    if (st != NM_OK) {
        fprintf(stderr, "small vocab: %s\n", err.msg);
        unload(gguf, mem, tok);
        return;
    }
    check_encoding(tok, "ca", true, (const int32_t[]){2, 0}, 2);
    /* lower rank first: "b c" (0) before "a b" (1) */
    check_encoding(tok, "abc", true, (const int32_t[]){0, 5}, 2);
    /* equal ranks: the leftmost pair first */
    check_encoding(tok, "aaa", true, (const int32_t[]){6, 0}, 2);
    check_encoding(tok, "aaaa", true, (const int32_t[]){6, 6}, 2);
    /* a space and a letter merge across the word start */
    check_encoding(tok, "ab a", true, (const int32_t[]){4, 7}, 2);
    /* bytes with no token (here 'd', and U+00E9's two bytes) are dropped,
     * as llama.cpp drops them */
    check_encoding(tok, "adb", true, (const int32_t[]){0, 1}, 2);
    check_encoding(tok, "\xC3\xA9", true, (const int32_t[]){0}, 0);
    /* CONTROL only with special parsing; USER_DEFINED always; </s> is
     * re-typed CONTROL and ends generation */
    check_encoding(tok, "a<|x|>b", true, (const int32_t[]){0, 8, 1}, 3);
    check_encoding(tok, "<u>b", false, (const int32_t[]){9, 1}, 2);
    check_encoding(tok, "</s>", true, (const int32_t[]){10}, 1);
    CHECK(nm_tokenizer_is_eog(tok, 10));
    CHECK(!nm_tokenizer_is_eog(tok, 8));
    CHECK_INT_EQ(nm_tokenizer_bos(tok), -1);
    unload(gguf, mem, tok);

    /* a Phi-3 name makes llama.cpp eat the whitespace after special tokens */
    vocab_spec phi = base;
    phi.name = "Phi-3 test";
    st = load_spec(&phi, &gguf, &mem, &tok, &err);
    CHECK_INT_EQ(st, NM_OK);
    if (st == NM_OK) check_encoding(tok, "<|x|> a", true, (const int32_t[]){8, 0}, 2);
    unload(gguf, mem, tok);

    /* llama3: a word that is a token skips the merges, BOS by default */
    vocab_spec l3 = base;
    l3.pre = "llama3";
    l3.bos = 0;
    st = load_spec(&l3, &gguf, &mem, &tok, &err);
    CHECK_INT_EQ(st, NM_OK);
    if (st == NM_OK) {
        CHECK(nm_tokenizer_add_bos(tok));
        check_encoding(tok, "abc", true, (const int32_t[]){0, 5}, 2);
        /* "ca" has no merge, but is a token */
        check_encoding(tok, "ca", true, (const int32_t[]){11}, 1);
    }
    unload(gguf, mem, tok);

    /* hostile and unsupported files */
    vocab_spec v = base;
    v.model = "bert";
    check_hostile("model bert", v, NM_ERR_UNSUPPORTED, "'bert'");
    v = base;
    v.model = "llama"; /* SentencePiece needs its scores (test_spm.c has real vocabularies) */
    check_hostile("llama without scores", v, NM_ERR_NOT_FOUND, "tokenizer.ggml.scores");
    v = base;
    v.pre = "gpt-2";
    check_hostile("pre gpt-2", v, NM_ERR_UNSUPPORTED, "'gpt-2'");
    v = base;
    v.pre = NULL;
    check_hostile("no pre", v, NM_ERR_UNSUPPORTED, "'default'");
    v = base;
    v.merges = (const char *const[]){"a b", "a d", NULL};
    check_hostile("merge of a missing token", v, NM_ERR_FORMAT, "merge 1 'a d'");
    v.merges = (const char *const[]){"a c", NULL};
    check_hostile("merge into a missing token", v, NM_ERR_FORMAT, "merged text");
    v.merges = (const char *const[]){"a b", "ab", NULL};
    check_hostile("merge without a space", v, NM_ERR_FORMAT, "merge 1 'ab'");
    v.merges = (const char *const[]){"a ", NULL};
    check_hostile("merge with an empty part", v, NM_ERR_FORMAT, "right part");
    v.merges = NULL;
    check_hostile("no merges", v, NM_ERR_NOT_FOUND, "tokenizer.ggml.merges");
    v = base;
    v.n_types = 11;
    check_hostile("token_type count", v, NM_ERR_FORMAT, "11 entries for 12 tokens");
    v = base;
    v.bos = 12;
    check_hostile("bos out of range", v, NM_ERR_FORMAT, "bos_token_id = 12");
    v = base;
    v.add_bos = 1;
    check_hostile("add_bos without bos", v, NM_ERR_FORMAT, "no BOS");
    v = base;
    v.tokens = (const char *const[]){"a", "b", "ab", "a", NULL};
    v.types = NULL;
    v.merges = (const char *const[]){"a b", NULL};
    check_hostile("duplicate token", v, NM_ERR_FORMAT, "tokens 0 and 3");
}

/* Every allocation of load and encode may fail: each failure is reported
 * as NM_ERR_NOMEM and nothing leaks (AddressSanitizer checks the latter). */
static void check_allocation_failures(void) {
    const vocab_spec base = {
        "gpt2", "qwen2", small_tokens, (const char *const[]){"b c", "a b", "a a", NULL}, NULL, 0,
        -1,     -1,      NULL};
    int n_nomem = 0;
    for (long k = 0; k < 200; k++) {
        nm_gguf *gguf;
        uint8_t *mem;
        nm_tokenizer *tok;
        nm_error err = {0};
        /* build the file with allocation working, then fail the k-th
         * allocation of the tokenizer's load or of one encode */
        nm_gguf_writer *w = nm_gguf_writer_new();
        nm_gguf_writer_set_str(w, "tokenizer.ggml.model", base.model);
        nm_gguf_writer_set_str(w, "tokenizer.ggml.pre", base.pre);
        nm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", base.tokens, count(base.tokens));
        nm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", base.merges, count(base.merges));
        size_t n_mem = 0;
        nm_status st = nm_gguf_writer_to_memory(w, &mem, &n_mem, &err);
        nm_gguf_writer_free(w);
        CHECK_INT_EQ(st, NM_OK);
        st = nm_gguf_open_memory(mem, n_mem, &gguf, &err);
        CHECK_INT_EQ(st, NM_OK);
        nm_alloc_fail_after(k);
        st = nm_tokenizer_load(gguf, &tok, &err);
        if (st == NM_OK) {
            int32_t ids[16];
            size_t n_out;
            st = nm_tokenizer_encode(tok, "aab bca <|x|> aaaa", 18, false, true, ids, 16, &n_out,
                                     &err);
        }
        nm_alloc_fail_after(-1);
        CHECK(st == NM_OK || st == NM_ERR_NOMEM);
        if (st == NM_ERR_NOMEM) n_nomem++;
        nm_tokenizer_free(tok);
        nm_gguf_close(gguf);
        nm_free(mem);
        if (st == NM_OK) break;
    }
    CHECK(n_nomem >= 8);
}

/* nm_tokenize(add_special): BOS first exactly when the file says to add it;
 * false never adds one. */
static void check_add_special(const char *path, bool want_bos) {
    nm_model_params mp = nm_model_default_params();
    mp.vocab_only = true;
    nm_model *model = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_model_load(path, &mp, &model, &err), NM_OK);
    if (!model) return;
    nm_model_info info;
    nm_model_get_info(model, &info);
    CHECK_INT_EQ(info.add_bos, want_bos);
    int32_t with[16], without[16];
    size_t n_with = 0, n_without = 0;
    CHECK_INT_EQ(nm_tokenize(model, "Hello world", 11, true, false, with, 16, &n_with, &err),
                 NM_OK);
    CHECK_INT_EQ(nm_tokenize(model, "Hello world", 11, false, false, without, 16, &n_without, &err),
                 NM_OK);
    CHECK_INT_EQ(n_with, n_without + (want_bos ? 1 : 0));
    if (want_bos) CHECK_INT_EQ(with[0], info.bos_id);
    CHECK(memcmp(with + (want_bos ? 1 : 0), without, n_without * sizeof *without) == 0);
    /* the file's keys as text: a string (whole, asked for, cut), a bool, an
     * integer, an array, an absent key */
    char buf[64];
    const char *tok_model = want_bos ? "llama" : "gpt2";
    CHECK_INT_EQ(nm_model_meta_str(model, "tokenizer.ggml.model", buf, sizeof buf),
                 (int32_t)strlen(tok_model));
    CHECK(strcmp(buf, tok_model) == 0);
    CHECK_INT_EQ(nm_model_meta_str(model, "tokenizer.ggml.model", NULL, 0),
                 (int32_t)strlen(tok_model));
    CHECK_INT_EQ(nm_model_meta_str(model, "tokenizer.ggml.model", buf, 3),
                 (int32_t)strlen(tok_model));
    CHECK(strlen(buf) == 2 && memcmp(buf, tok_model, 2) == 0);
    if (want_bos) {
        CHECK(nm_model_meta_str(model, "tokenizer.ggml.add_bos_token", buf, sizeof buf) == 4);
        CHECK(strcmp(buf, "true") == 0);
        char want[16];
        snprintf(want, sizeof want, "%d", info.bos_id);
        CHECK(nm_model_meta_str(model, "tokenizer.ggml.bos_token_id", buf, sizeof buf) > 0);
        CHECK(strcmp(buf, want) == 0);
    }
    char want_arr[32];
    snprintf(want_arr, sizeof want_arr, "[%d x str]", info.n_vocab);
    CHECK(nm_model_meta_str(model, "tokenizer.ggml.tokens", buf, sizeof buf) > 0);
    CHECK(strcmp(buf, want_arr) == 0);
    CHECK_INT_EQ(nm_model_meta_str(model, "no.such.key", buf, sizeof buf), -1);
    nm_model_free(model);
}

int main(void) {
    check_add_special(NM_VECTORS_DIR "/qwen3-vocab.gguf", false);
    check_add_special(NM_VECTORS_DIR "/mistral-vocab.gguf", true);
    check_splitter();
    check_small_vocabs();
    check_allocation_failures();

    nm_gguf *gguf = NULL;
    nm_tokenizer *tok = load_vocab(NM_VECTORS_DIR "/qwen3-vocab.gguf", &gguf);
    if (tok) {
        int n = nm_test_check_tokenize_tsv(tok, NM_VECTORS_DIR "/qwen3-tokenize.tsv",
                                           nm_test_decode, NULL);
        CHECK_INT_EQ(n, 80);
        check_qwen3_rules(tok);
        check_count_then_fill(tok);
        check_invalid_utf8(tok);
    }
    nm_tokenizer_free(tok);
    nm_gguf_close(gguf);

    tok = load_vocab(NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf", &gguf);
    if (tok) {
        int n = nm_test_check_tokenize_tsv(tok, NM_VECTORS_DIR "/qwen3-4k-tokenize.tsv",
                                           nm_test_decode, NULL);
        CHECK_INT_EQ(n, 80);
        CHECK_INT_EQ(nm_tokenizer_n_vocab(tok), 4099);
        CHECK(nm_tokenizer_is_eog(tok, 4096) && nm_tokenizer_is_eog(tok, 4098));
        CHECK(!nm_tokenizer_is_eog(tok, 4097));
    }
    nm_tokenizer_free(tok);
    nm_gguf_close(gguf);
    return nm_test_finish("test_tokenizer");
}
