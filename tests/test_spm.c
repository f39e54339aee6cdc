/* The SentencePiece tokenizer against llama.cpp: every line of the Llama-2 /
 * Phi-3.5 and Mistral goldens (vectors/llama2-tokenize.tsv,
 * mistral-tokenize.tsv) must give llama.cpp's ids exactly, with special
 * parsing on and BOS as the file says; and the pieces of those ids must give
 * the text back once the one space the leading-space rule put before each
 * text fragment (at the start and after a special token) is taken off.
 * (The TSV helpers repeat test_tokenizer.c's: each test is one program.) */
#include "harness.h"

#include "gguf/gguf.h"
#include "tokenizer/tokenizer-impl.h"

#include <stdlib.h>
#include <string.h>

/* Encodes with a buffer of the right size; returns the count or -1. */
static long encode(const nm_tokenizer *tok, const char *s, size_t n, bool add_bos,
                   bool parse_special, int32_t *ids, size_t cap) {
    size_t n_out = 0;
    nm_error err = {0};
    nm_status st = nm_tokenizer_encode(tok, s, n, add_bos, parse_special, ids, cap, &n_out, &err);
    if (st != NM_OK) {
        fprintf(stderr, "  encode failed: %s: %s\n", nm_status_str(st), err.msg);
        return -1;
    }
    return (long)n_out;
}

/* ---- the TSV format ---- */

/* The pieces of ids, dropping the first space of the first piece after the
 * start or a special token (the space the encoder prefixed). */
static size_t decode_spm(const nm_tokenizer *tok, const int32_t *ids, size_t n, char *out,
                         size_t cap) {
    size_t len = 0;
    bool after_special = true;
    for (size_t i = 0; i < n; i++) {
        char piece[256];
        int32_t k = nm_tokenizer_piece(tok, ids[i], true, piece, sizeof piece);
        if (k < 0 || (size_t)k > sizeof piece || len + (size_t)k > cap) return (size_t)-1;
        const bool special =
            (tok->attr[ids[i]] & (NM_ATTR_CONTROL | NM_ATTR_USER_DEFINED | NM_ATTR_UNKNOWN)) != 0;
        size_t skip = !special && after_special && k > 0 && piece[0] == ' ' ? 1 : 0;
        memcpy(out + len, piece + skip, (size_t)k - skip);
        len += (size_t)k - skip;
        after_special = special;
    }
    return len;
}

static int check_golden_file(const char *vocab, const char *tsv_path, int *n_exact) {
    nm_gguf *gguf = NULL;
    nm_error err = {0};
    nm_status st = nm_gguf_open(vocab, &gguf, &err);
    CHECK_INT_EQ(st, NM_OK);
    if (st != NM_OK) return 0;
    nm_tokenizer *tok = NULL;
    st = nm_tokenizer_load(gguf, &tok, &err);
    if (st != NM_OK) fprintf(stderr, "%s: %s\n", vocab, err.msg);
    CHECK_INT_EQ(st, NM_OK);
    if (!tok) {
        nm_gguf_close(gguf);
        return 0;
    }
    size_t n_file = 0;
    char *file = (char *)nm_test_read_file(tsv_path, &n_file);
    CHECK(file != NULL);
    char *text = malloc(n_file + 1), *decoded = malloc(4 * n_file + 64);
    int32_t *want = malloc((n_file + 1) * sizeof *want), *got = malloc((n_file + 1) * sizeof *got);
    int line = 0;
    *n_exact = 0;
    for (char *p = file; p && *p; line++) {
        char *eol = strchr(p, '\n');
        if (eol) *eol = '\0';
        const char *q = p;
        long n_text = nm_test_parse_json_string(&q, text);
        CHECK(n_text >= 0 && *q == '\t');
        if (n_text < 0 || *q != '\t') break;
        size_t n_want = 0;
        for (q++; *q;) {
            char *end;
            long id = strtol(q, &end, 10);
            if (end == q) break;
            want[n_want++] = (int32_t)id;
            q = *end == ' ' ? end + 1 : end;
        }
        long n_got =
            encode(tok, text, (size_t)n_text, nm_tokenizer_add_bos(tok), true, got, n_file + 1);
        nm_test_checks++;
        if (n_got != (long)n_want || memcmp(got, want, n_want * sizeof *want) != 0) {
            nm_test_failures++;
            fprintf(stderr, "%s line %d: ids differ from llama.cpp's\n", tsv_path, line + 1);
            nm_test_print_text("text", text, (size_t)n_text);
            nm_test_print_ids("llama.cpp", want, n_want);
            if (n_got >= 0) nm_test_print_ids("npumoe   ", got, (size_t)n_got);
        } else {
            (*n_exact)++;
        }
        const size_t skip_bos = nm_tokenizer_add_bos(tok) && n_want > 0 ? 1 : 0;
        size_t n_dec =
            decode_spm(tok, want + skip_bos, n_want - skip_bos, decoded, 4 * n_file + 64);
        nm_test_checks++;
        if (n_dec != (size_t)n_text || memcmp(decoded, text, (size_t)n_text) != 0) {
            nm_test_failures++;
            fprintf(stderr, "%s line %d: decoding llama.cpp's ids does not give the text\n",
                    tsv_path, line + 1);
            nm_test_print_text("text   ", text, (size_t)n_text);
            if (n_dec != (size_t)-1) nm_test_print_text("decoded", decoded, n_dec);
        }
        if (!eol) break;
        p = eol + 1;
    }
    free(text);
    free(decoded);
    free(want);
    free(got);
    free(file);
    nm_tokenizer_free(tok);
    nm_gguf_close(gguf);
    return line;
}

int main(void) {
    int exact = 0;
    int n = check_golden_file(NM_VECTORS_DIR "/llama2-vocab.gguf",
                              NM_VECTORS_DIR "/llama2-tokenize.tsv", &exact);
    printf("llama2/phi-3.5: %d of %d lines identical to llama.cpp\n", exact, n);
    CHECK_INT_EQ(n, 80);
    n = check_golden_file(NM_VECTORS_DIR "/mistral-vocab.gguf",
                          NM_VECTORS_DIR "/mistral-tokenize.tsv", &exact);
    printf("mistral: %d of %d lines identical to llama.cpp\n", exact, n);
    CHECK_INT_EQ(n, 80);
    return nm_test_finish("test_spm");
}
