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
    int n = nm_test_check_tokenize_tsv(tok, tsv_path, decode_spm, n_exact);
    nm_tokenizer_free(tok);
    nm_gguf_close(gguf);
    return n;
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
